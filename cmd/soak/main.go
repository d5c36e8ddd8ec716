// Command soak measures the orchestrator over a long no-op load: the real
// orchestrator binary (`orchestrator serve`, a bbolt file in a temp dir, on
// loopback) and worker processes (`worker connect --executor noop`, which
// completes every step at once without starting a process), driven only
// through the operator HTTP API and the control plane, as an operator and a
// fleet would.
//
//	go run ./cmd/soak                      # what `make soak` runs
//	go run ./cmd/soak -steps 200000 -retain ''
//
// Three phases:
//
//   - Load: -steps no-op steps as runs of -runsize independent steps, at most
//     -inflight runs submitted and not yet finished at once (so memory
//     measures the orchestrator's state, not a backlog). Each run is read
//     back (GET /api/runs/{id}) until it finished, and must have succeeded
//     with every step. After every -every finished steps a line:
//     steps=N rss_mib=… peak_rss_mib=… store_mib=… steps_per_s=…
//     (RSS is VmRSS, peak VmHWM of the orchestrator's /proc/PID/status;
//     store is the bbolt file's size; steps/s over the interval).
//   - Restart (-restart): SIGTERM, then the same data directory served
//     again (SPEC §7: Restore). Printed: the time from starting the process
//     until the control plane answers a worker's Hello with a Welcome AND the
//     operator API answers, and the RSS once it does.
//   - Retention (-retain DURATION): a fresh orchestrator with serve --retain
//     under the same load for -retainfor, printing the store file's size
//     every -retainevery. A binary whose serve does not list --retain in its
//     help skips this phase and says so.
//
// Then a verdict, a PASS, FAIL or SKIP line per threshold: RSS at every
// line at most 100 MB, and flat (each line from a quarter of -steps on
// within 20 % of the one there: 250,000 of the default 1,000,000); the
// restart ready within 1 s with RSS at most 60 MB; the store no larger at
// the end of the retention phase than at its middle. MB is 10^6 bytes. The
// exit code is 0 when all hold, 1 on a FAIL, a failed run or an error, 2 on
// bad flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// config is the harness's flags.
type config struct {
	steps, runSize, every int
	workers, slots        int
	inFlight              int
	restart               bool
	retain                string // "" skips the retention phase
	pprof                 string // the load phase's orchestrator serves runtime profiles here
	retainFor             time.Duration
	retainEvery           time.Duration
	poll                  time.Duration // shortest wait between reads of an unfinished run
	keep                  bool
	binDir                string // prebuilt orchestrator and worker; "" builds them
	race                  bool   // build them with -race; a race they report is an error
	timeout               time.Duration
}

func defaultConfig() config {
	return config{
		steps: 1_000_000, runSize: 500, every: 100_000,
		// 16 slots a worker is what `make bench`'s throughput figure uses,
		// so steps/s here compare with it; 4 × 16 slots stay busy with 8
		// runs of 500 in flight.
		workers: 4, slots: 16, inFlight: 8,
		restart: true, retain: "1m", retainFor: 10 * time.Minute, retainEvery: 30 * time.Second,
		poll: 5 * time.Millisecond, timeout: 4 * time.Hour,
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "soak:", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	res, err := soak(ctx, cfg, stdout)
	if err != nil {
		fmt.Fprintln(stderr, "soak:", err)
		return 1
	}
	if res.failed {
		return 1
	}
	return 0
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	cfg := defaultConfig()
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&cfg.steps, "steps", cfg.steps, "finished no-op steps to run (a multiple of -runsize)")
	fs.IntVar(&cfg.runSize, "runsize", cfg.runSize, "independent steps per run")
	fs.IntVar(&cfg.every, "every", cfg.every, "print a line after every `N` finished steps")
	fs.IntVar(&cfg.workers, "workers", cfg.workers, "worker processes")
	fs.IntVar(&cfg.slots, "slots", cfg.slots, "slots per worker (1..1024)")
	fs.IntVar(&cfg.inFlight, "inflight", cfg.inFlight, "runs submitted and not yet finished, at most")
	fs.BoolVar(&cfg.restart, "restart", cfg.restart, "after the load, restart the orchestrator and measure the restart")
	fs.StringVar(&cfg.retain, "retain", cfg.retain, "run the retention phase with serve --retain `DURATION` ('' skips it)")
	fs.DurationVar(&cfg.retainFor, "retainfor", cfg.retainFor, "how long the retention phase's load runs")
	fs.DurationVar(&cfg.retainEvery, "retainevery", cfg.retainEvery, "print the store's size this often in the retention phase")
	fs.DurationVar(&cfg.poll, "poll", cfg.poll, "shortest wait between two reads of a run that has not finished")
	fs.StringVar(&cfg.pprof, "pprof", "", "the load phase's orchestrator serves runtime profiles (serve --pprof) on this loopback `address`")
	fs.BoolVar(&cfg.keep, "keep", false, "keep the temp dir (stores, logs, binaries) and print its path")
	fs.StringVar(&cfg.binDir, "bin", "", "`directory` holding prebuilt orchestrator and worker binaries (default: go build them)")
	fs.BoolVar(&cfg.race, "race", false, "build the binaries with the race detector (figures then mean little); a race they report is an error")
	fs.DurationVar(&cfg.timeout, "timeout", cfg.timeout, "give up after this long")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: soak [flags]   (go doc ./cmd/soak for what it measures)")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	switch {
	case fs.NArg() > 0:
		return cfg, fmt.Errorf("takes no arguments, got %q", fs.Args())
	case cfg.runSize < 1 || cfg.steps < cfg.runSize || cfg.steps%cfg.runSize != 0:
		return cfg, fmt.Errorf("-steps %d must be a positive multiple of -runsize %d", cfg.steps, cfg.runSize)
	case cfg.every < 1:
		return cfg, fmt.Errorf("-every %d must be positive", cfg.every)
	case cfg.workers < 1 || cfg.slots < 1 || cfg.slots > 1024 || cfg.inFlight < 1:
		return cfg, errors.New("-workers and -inflight must be positive, -slots 1..1024")
	case cfg.retain != "" && (cfg.retainFor <= 0 || cfg.retainEvery <= 0):
		return cfg, errors.New("-retainfor and -retainevery must be positive")
	case cfg.poll <= 0 || cfg.timeout <= 0:
		return cfg, errors.New("-poll and -timeout must be positive")
	}
	if cfg.retain != "" {
		if _, err := time.ParseDuration(cfg.retain); err != nil {
			return cfg, fmt.Errorf("-retain %q: %v", cfg.retain, err)
		}
	}
	return cfg, nil
}
