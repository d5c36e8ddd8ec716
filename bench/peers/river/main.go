// Command river is River (github.com/riverqueue/river, on pgx) in the
// shape of Tether's end-to-end benchmark (adapters/orchestrator,
// BenchmarkEndToEnd): N no-op jobs inserted at once (InsertMany), worked by
// W concurrent workers on one queue, against the PostgreSQL database at
// -dsn (run `rivermigrate` up first, so any empty database will do).
//
//	go run ./river -dsn postgres://… [-jobs 20000] [-batch 200 | -batch 1 -inserters N] [-workers 64]
//
// River's defaults are tightened as the comparison asks: FetchCooldown 1 ms
// (default 100 ms); FetchPollInterval is left at its default (1 s) unless
// -poll sets it: new jobs reach the producers through LISTEN/NOTIFY, and a
// producer that fetched a full batch fetches again after the cooldown.
//
// Throughput: from the first call of InsertMany to the last job's
// completion event (River emits it once the completion is committed); the
// jobs go in with one InsertMany, or -batch at a time, one call after the
// other, as Tether's benchmark submits its runs (100 runs of 200 steps);
// or, with -batch 1, one Insert (one transaction) per job, by -inserters
// goroutines at once, each inserting one job after the other. Latency: on the idle
// client, one job at a time (the next once the one before completed; River
// commits completions in batches, every 250 ms when idle): insert→start is from calling Insert to the
// worker's Work being called, insert→done to its completion event.
//
// It prints one line:
//
//	river: 20000 jobs (InsertMany of 200), 64 workers, 1580 jobs/s (12.66 s); idle (100 samples): insert→start p50 1.20 ms p99 3.40 ms, insert→done p50 250.10 ms p99 251.00 ms
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// noopArgs is the job: it does nothing.
type noopArgs struct{}

func (noopArgs) Kind() string { return "noop" }

// noopWorker records when each job starts, for the idle latency.
type noopWorker struct {
	river.WorkerDefaults[noopArgs]
	mu      sync.Mutex
	started map[int64]time.Time
}

func (w *noopWorker) Work(ctx context.Context, job *river.Job[noopArgs]) error {
	now := time.Now()
	w.mu.Lock()
	if w.started != nil {
		w.started[job.ID] = now
	}
	w.mu.Unlock()
	return nil
}

func main() {
	dsn := flag.String("dsn", os.Getenv("DATABASE_URL"), "the PostgreSQL database (default $DATABASE_URL)")
	jobs := flag.Int("jobs", 20000, "no-op jobs for the throughput run")
	batch := flag.Int("batch", 0, "jobs per InsertMany, one call after the other (0: all in one; 1: one Insert per job)")
	inserters := flag.Int("inserters", 1, "with -batch 1: goroutines calling Insert at once, each one job after the other")
	workers := flag.Int("workers", 64, "MaxWorkers of the one queue")
	samples := flag.Int("latency", 100, "single jobs, one at a time, for the idle latency (0: none)")
	cooldown := flag.Duration("cooldown", time.Millisecond, "FetchCooldown")
	poll := flag.Duration("poll", 0, "FetchPollInterval (0: River's default, 1s)")
	flag.Parse()
	if err := run(*dsn, *jobs, *batch, *inserters, *workers, *samples, *cooldown, *poll); err != nil {
		fmt.Fprintln(os.Stderr, "river:", err)
		os.Exit(1)
	}
}

func run(dsn string, jobs, batch, inserters, workers, samples int, cooldown, poll time.Duration) error {
	if dsn == "" {
		return fmt.Errorf("no -dsn")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return err
	}
	cfg.MaxConns = 32 // River's producer, completer and notifier share it
	// Durable as Tether's store is, whatever the server's default: a
	// commit answers once its WAL is flushed.
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	driver := riverpgxv5.New(pool)
	mig, err := rivermigrate.New(driver, nil)
	if err != nil {
		return err
	}
	if _, err := mig.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("rivermigrate up: %w", err)
	}
	w := &noopWorker{}
	reg := river.NewWorkers()
	river.AddWorker(reg, w)
	client, err := river.NewClient(driver, &river.Config{
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: workers}},
		Workers:           reg,
		FetchCooldown:     cooldown,
		FetchPollInterval: poll, // 0: the default
		Logger:            slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return err
	}
	// Every completion is counted: the channel holds them all, so none is dropped.
	events, unsubscribe := client.SubscribeConfig(&river.SubscribeConfig{
		Kinds: []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed}, ChanSize: jobs + samples + 1,
	})
	defer unsubscribe()
	if err := client.Start(ctx); err != nil {
		return err
	}
	defer client.Stop(context.Background())

	// Throughput.
	if batch <= 0 || batch > jobs {
		batch = jobs
	}
	params := make([]river.InsertManyParams, batch)
	for i := range params {
		params[i] = river.InsertManyParams{Args: noopArgs{}}
	}
	shape := fmt.Sprintf("InsertMany of %d", batch)
	t0 := time.Now()
	insertErr := make(chan error, max(inserters, 1))
	if batch == 1 {
		// One Insert per job, each its own transaction: inserters goroutines
		// at once, taking the jobs one by one.
		inserters = max(inserters, 1)
		shape = fmt.Sprintf("one Insert per job, %d at once", inserters)
		var next atomic.Int64
		for range inserters {
			go func() {
				for next.Add(1) <= int64(jobs) {
					if _, err := client.Insert(ctx, noopArgs{}, nil); err != nil {
						insertErr <- fmt.Errorf("Insert: %w", err)
						return
					}
				}
			}()
		}
	} else {
		go func() { // the workers start on the first batch while the rest go in
			for n := 0; n < jobs; n += batch {
				if _, err := client.InsertMany(ctx, params[:min(batch, jobs-n)]); err != nil {
					insertErr <- fmt.Errorf("InsertMany: %w", err)
					return
				}
			}
		}()
	}
	var t1 time.Time
	for done := 0; done < jobs; {
		select {
		case ev := <-events:
			if ev.Kind != river.EventKindJobCompleted {
				return fmt.Errorf("job %d: %s", ev.Job.ID, ev.Kind)
			}
			done++
			t1 = time.Now()
		case err := <-insertErr:
			return err
		case <-ctx.Done():
			return fmt.Errorf("%d of %d jobs completed: %w", done, jobs, ctx.Err())
		}
	}
	elapsed := t1.Sub(t0)
	line := fmt.Sprintf("river: %d jobs (%s), %d workers, %.0f jobs/s (%.2f s)",
		jobs, shape, workers, float64(jobs)/elapsed.Seconds(), elapsed.Seconds())

	// Idle latency.
	if samples > 0 {
		w.mu.Lock()
		w.started = map[int64]time.Time{}
		w.mu.Unlock()
		var start, done []time.Duration
		for range samples {
			t0 := time.Now()
			res, err := client.Insert(ctx, noopArgs{}, nil)
			if err != nil {
				return fmt.Errorf("Insert: %w", err)
			}
			select {
			case ev := <-events:
				if ev.Kind != river.EventKindJobCompleted || ev.Job.ID != res.Job.ID {
					return fmt.Errorf("job %d: %s (waiting for job %d)", ev.Job.ID, ev.Kind, res.Job.ID)
				}
				done = append(done, time.Since(t0))
			case <-ctx.Done():
				return fmt.Errorf("a single job did not complete: %w", ctx.Err())
			}
			w.mu.Lock()
			s, ok := w.started[res.Job.ID]
			w.mu.Unlock()
			if !ok {
				return fmt.Errorf("job %d completed without starting", res.Job.ID)
			}
			start = append(start, s.Sub(t0))
		}
		line += fmt.Sprintf("; idle (%d samples): insert→start p50 %.2f ms p99 %.2f ms, insert→done p50 %.2f ms p99 %.2f ms",
			samples, ms(percentile(start, 50)), ms(percentile(start, 99)), ms(percentile(done, 50)), ms(percentile(done, 99)))
	}
	fmt.Println(line)
	return nil
}

// percentile is the nearest-rank percentile, as the Tether benchmark's.
func percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(p/100*float64(len(s)) + 0.5)
	return s[min(max(i-1, 0), len(s)-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
