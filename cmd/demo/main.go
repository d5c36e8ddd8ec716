// Command demo runs Tether for real on loopback: an orchestrator with a bbolt
// file in a fresh temp dir, three workers that enroll with tokens over the
// WebSocket control plane and run their steps as `sh -c` processes, and one
// example workflow. It prints each step as it finishes and the run's status,
// then shuts everything down. It exits 1 if the run did not succeed.
//
//	go run ./cmd/demo [-v]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/tether-run/tether/adapters/logging"
	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/adapters/worker"
	"github.com/tether-run/tether/core"
)

const (
	demoTimeout  = 45 * time.Second
	pollInterval = 20 * time.Millisecond
	workers      = 3
)

// workflow is the example run: fetch, a forEach build fan-out over four
// targets (two at a time), a write-bearing publish after the builds, and an
// independent lint.
var workflow = core.RunSpec{
	Name: "release",
	Env:  map[string]string{"RELEASE": "v1.4.2"},
	Steps: []core.StepSpec{
		{Name: "fetch", Command: `echo "fetched sources for $RELEASE"; sleep 0.2`},
		{Name: "build", DependsOn: []string{"fetch"}, Concurrency: 2,
			ForEach: []string{"linux-amd64", "linux-arm64", "darwin-arm64", "windows-amd64"},
			Command: `echo "building $TETHER_ITEM"; sleep 0.2`},
		{Name: "publish", DependsOn: []string{"build"}, Writes: true,
			Command: `echo "published $RELEASE (4 artifacts)"; sleep 0.2`},
		{Name: "lint", Command: `echo "lint: 0 findings"; sleep 0.3`},
	},
}

func main() { os.Exit(run()) }

func run() int {
	verbose := flag.Bool("v", false, "log at info level (default: warnings only)")
	flag.Parse()
	level := "warn"
	if *verbose {
		level = "info"
	}
	log, err := logging.New(os.Stderr, "text", level)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, demoTimeout)
	defer cancel()
	if err := demo(ctx, os.Stdout, log); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	return 0
}

func demo(ctx context.Context, out io.Writer, log *slog.Logger) (err error) {
	dir, err := os.MkdirTemp("", "tether-demo-")
	if err != nil {
		return fmt.Errorf("temp dir: %w", err)
	}
	defer os.RemoveAll(dir)
	orch, err := orchestrator.Start(orchestrator.Options{
		Addr:      "127.0.0.1:0",
		StorePath: filepath.Join(dir, "tether.db"),
		Config:    core.Config{Env: orchestrator.ShipEnv(nil)}, // none of this process's environment, as serve (SPEC §8)
		Logger:    log.With("side", "orchestrator"),
	})
	if err != nil {
		return err
	}
	defer func() {
		if cerr := orch.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close orchestrator: %w", cerr)
		}
	}()
	fmt.Fprintf(out, "orchestrator listening at %s, store %s\n", orch.URL(), filepath.Join(dir, "tether.db"))

	wctx, stopWorkers := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		stopWorkers()
		wg.Wait()
	}()
	for i := 1; i <= workers; i++ {
		name := fmt.Sprintf("worker-%d", i)
		tok, err := orch.CreateToken(ctx, name, 10*time.Minute)
		if err != nil {
			return err
		}
		w, err := worker.New(worker.Options{URL: orch.URL(), Config: core.WorkerConfig{Name: name, Token: tok},
			Logger: log.With("side", "worker")})
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if code, err := w.Run(wctx); err == nil {
				log.Error("worker exited", "worker", name, "code", code)
			}
		}()
	}
	fmt.Fprintf(out, "started %d workers, each enrolling with its own one-time token\n", workers)

	submitted := time.Now()
	runID, err := orch.Submit(ctx, workflow)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "submitted %s %q: fetch -> build[0..3] (forEach, concurrency 2) -> publish (writes); lint\n\n", runID, workflow.Name)
	fmt.Fprintf(out, "%8s  %-20s %-9s %-9s %s\n", "t", "step", "state", "worker", "attempt  output")

	printed := map[core.StepID]bool{}
	var status string
	for {
		var lines []string
		done, live := false, false
		err := orch.Snapshot(ctx, func(o *core.Orchestrator) {
			r, st, ok := o.Run(runID)
			if !ok {
				return // finished: the run left the core for the history (SPEC §7a)
			}
			live = true
			names := workerNames(o)
			for _, id := range r.Steps {
				s, _ := o.StepByID(id)
				if !s.State.Terminal() || printed[id] {
					continue
				}
				printed[id] = true
				lines = append(lines, describeStep(s, s.FinishedAt.Sub(submitted), lastWorker(o.Leases(), s.ID, names), o.StepLogs(s.ID)))
			}
			done, status = r.Finished, st
		})
		if err != nil {
			return err
		}
		if !live {
			// The run finished and is in the store's history: print the
			// steps not printed yet from there.
			hist, err := orch.History().History(runID)
			if err != nil {
				return fmt.Errorf("run %s: %w", runID, err)
			}
			var names map[core.WorkerID]string
			orch.Snapshot(ctx, func(o *core.Orchestrator) { names = workerNames(o) })
			for _, s := range hist.Steps {
				if printed[s.ID] {
					continue
				}
				printed[s.ID] = true
				var leases []core.LeaseID
				for _, l := range hist.Leases {
					if l.Step == s.ID {
						leases = append(leases, l.ID)
					}
				}
				logs, _, _ := orch.History().HistoryLogs(leases, "", 1)
				lines = append(lines, describeStep(s, s.FinishedAt.Sub(submitted), lastWorker(hist.Leases, s.ID, names), logs))
			}
			done, status = true, hist.Status
		}
		for _, l := range lines {
			fmt.Fprintln(out, l)
		}
		if done {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("run %s did not finish: %w", runID, ctx.Err())
		case <-time.After(pollInterval):
		}
	}
	fmt.Fprintf(out, "\nrun %s finished: %s in %.2fs\n", runID, status, time.Since(submitted).Seconds())
	if status != "success" {
		return errors.New("run " + string(runID) + " " + status)
	}
	return nil
}

func workerNames(o *core.Orchestrator) map[core.WorkerID]string {
	names := map[core.WorkerID]string{}
	for _, w := range o.Workers() {
		names[w.ID] = w.Name
	}
	return names
}

// lastWorker names the worker of the step's last lease (the one that ran
// it), or "-".
func lastWorker(leases []core.LeaseRecord, step core.StepID, names map[core.WorkerID]string) string {
	name := "-"
	for _, l := range leases { // sorted by id: the last one wins
		if l.Step == step {
			name = names[l.Worker]
		}
	}
	return name
}

// describeStep is one line: time since submit, step, state, worker, attempt,
// and the first line of its output.
func describeStep(s core.StepRecord, at time.Duration, workerName string, logs []core.StepLogLine) string {
	first := ""
	if len(logs) > 0 {
		first = fmt.Sprintf("%q", logs[0].Line.Text)
	}
	if s.Message != "" {
		first += " " + s.Message
	}
	return fmt.Sprintf("%7.2fs  %-20s %-9s %-9s %-8d %s", at.Seconds(), s.ID, s.State, workerName, s.Attempts, first)
}
