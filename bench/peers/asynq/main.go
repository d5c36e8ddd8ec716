// Command asynq is asynq (github.com/hibiken/asynq, on Redis) in the shape
// of Tether's end-to-end benchmark (adapters/orchestrator,
// BenchmarkEndToEnd): N no-op tasks enqueued, worked by a server of W
// concurrency on one queue, against the Redis server at -redis (an empty
// one: the program reads asynq's cumulative counter of processed tasks).
//
//	go run ./asynq -redis 127.0.0.1:6379 [-jobs 20000] [-enqueuers 200] [-workers 64]
//
// asynq has no batch enqueue: each Enqueue is one Redis script call. The
// tasks go in from -enqueuers goroutines at once (200: Tether's run of 200
// steps), each enqueueing one after the other, so the enqueue is
// concurrent, not batched. TaskCheckInterval, how long an idle processor
// sleeps before it polls the queues again (asynq's default 1 s; it sleeps
// between half and one and a half of it), is tightened to -poll (1 ms), as
// River's fetch cooldown is.
//
// Throughput: from the first Enqueue to asynq's counter of processed tasks
// reaching N (asynq acknowledges a task in Redis after its handler
// returns, and counts it in the same script; the program reads the counter
// once the last handler has returned, as fast as Redis answers). Latency:
// on the idle server, one task at a time: enqueue→start is from calling
// Enqueue to the handler being called, enqueue→done to the counter
// counting it.
//
// It prints one line, in the form of bench/peers/river's:
//
//	asynq: 20000 jobs (200 enqueuers), 64 workers, 4300 jobs/s (4.65 s); idle (100 samples): insert→start p50 1.20 ms p99 3.40 ms, insert→done p50 1.50 ms p99 4.00 ms
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

const (
	queue     = "default"
	taskType  = "noop"
	processed = "asynq:{" + queue + "}:processed" // asynq's cumulative counter of the queue's processed tasks
)

// noopHandler counts the tasks it saw, for the throughput, and tells
// when each starts, for the idle latency.
type noopHandler struct {
	all      chan struct{} // closed when `want` tasks have returned
	returned atomic.Int64
	want     int64
	idle     atomic.Bool
	started  chan time.Time // once idle: each task's start
}

func (h *noopHandler) ProcessTask(ctx context.Context, t *asynq.Task) error {
	now := time.Now()
	if h.idle.Load() {
		h.started <- now
		return nil
	}
	if h.returned.Add(1) == h.want {
		close(h.all)
	}
	return nil
}

func main() {
	addr := flag.String("redis", "127.0.0.1:6379", "the Redis server's address")
	jobs := flag.Int("jobs", 20000, "no-op tasks for the throughput run")
	enqueuers := flag.Int("enqueuers", 200, "goroutines enqueueing at once")
	workers := flag.Int("workers", 64, "the server's Concurrency")
	samples := flag.Int("latency", 100, "single tasks, one at a time, for the idle latency (0: none)")
	poll := flag.Duration("poll", time.Millisecond, "TaskCheckInterval (0: asynq's default, 1s)")
	flag.Parse()
	if err := run(*addr, *jobs, *enqueuers, *workers, *samples, *poll); err != nil {
		fmt.Fprintln(os.Stderr, "asynq:", err)
		os.Exit(1)
	}
}

func run(addr string, jobs, enqueuers, workers, samples int, poll time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	opt := asynq.RedisClientOpt{Addr: addr, PoolSize: max(enqueuers, 10)}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	count := func() (int, error) {
		n, err := rdb.Get(ctx, processed).Int()
		if err == redis.Nil {
			return 0, nil
		}
		return n, err
	}
	if n, err := count(); err != nil || n != 0 {
		return fmt.Errorf("the Redis server must be empty: %d processed tasks, %v", n, err)
	}
	h := &noopHandler{all: make(chan struct{}), want: int64(jobs), started: make(chan time.Time, 1)}
	srv := asynq.NewServer(opt, asynq.Config{
		Concurrency:       workers,
		Queues:            map[string]int{queue: 1},
		TaskCheckInterval: poll, // 0: the default
		LogLevel:          asynq.WarnLevel,
	})
	if err := srv.Start(h); err != nil {
		return err
	}
	defer srv.Shutdown()
	client := asynq.NewClient(opt)
	defer client.Close()
	task := asynq.NewTask(taskType, nil)
	// waitCounted waits until asynq's counter reaches n.
	waitCounted := func(n int) (time.Time, error) {
		for {
			c, err := count()
			if err != nil {
				return time.Time{}, err
			}
			if c >= n {
				return time.Now(), nil
			}
			if ctx.Err() != nil {
				return time.Time{}, fmt.Errorf("%d of %d tasks processed: %w", c, n, ctx.Err())
			}
		}
	}

	// Throughput.
	enqueuers = max(1, min(enqueuers, jobs))
	t0 := time.Now()
	enqErr := make(chan error, enqueuers)
	var next atomic.Int64
	for range enqueuers {
		go func() {
			for next.Add(1) <= int64(jobs) {
				if _, err := client.EnqueueContext(ctx, task, asynq.Queue(queue)); err != nil {
					enqErr <- fmt.Errorf("Enqueue: %w", err)
					return
				}
			}
		}()
	}
	select {
	case <-h.all:
	case err := <-enqErr:
		return err
	case <-ctx.Done():
		return fmt.Errorf("%d of %d tasks returned: %w", h.returned.Load(), jobs, ctx.Err())
	}
	t1, err := waitCounted(jobs)
	if err != nil {
		return err
	}
	elapsed := t1.Sub(t0)
	line := fmt.Sprintf("asynq: %d jobs (%d enqueuers), %d workers, %.0f jobs/s (%.2f s)",
		jobs, enqueuers, workers, float64(jobs)/elapsed.Seconds(), elapsed.Seconds())

	// Idle latency.
	if samples > 0 {
		h.idle.Store(true)
		var start, done []time.Duration
		for i := range samples {
			t0 := time.Now()
			if _, err := client.EnqueueContext(ctx, task, asynq.Queue(queue)); err != nil {
				return fmt.Errorf("Enqueue: %w", err)
			}
			var s time.Time
			select {
			case s = <-h.started:
			case <-ctx.Done():
				return fmt.Errorf("a single task did not start: %w", ctx.Err())
			}
			t1, err := waitCounted(jobs + i + 1)
			if err != nil {
				return err
			}
			start = append(start, s.Sub(t0))
			done = append(done, t1.Sub(t0))
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
