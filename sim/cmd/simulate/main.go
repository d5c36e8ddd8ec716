// Command simulate runs the deterministic simulator over many seeds, with a
// live progress line, and saves the seeds that fail. A seed whose
// linearizability check is inconclusive (a step's history over
// spec.MaxStepOps) is neither a failure nor a pass: it is counted and saved
// apart, marked INCONCLUSIVE. No verdict depends on the machine's speed.
//
//	go run ./sim/cmd/simulate -seeds 100000
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tether-run/tether/sim"
)

func main() {
	seeds := flag.Uint64("seeds", 1000, "number of seeds to run; 0 runs until interrupted")
	first := flag.Uint64("first", 1, "first seed")
	par := flag.Int("parallel", runtime.GOMAXPROCS(0), "seeds simulated at once")
	out := flag.String("failures", "sim-failures.txt", "file the failing seeds are appended to")
	canary := flag.Bool("canary", false, "enable the canary (fails 1 seed in 100)")
	maxStep := flag.Int("maxstepops", 0, "operations of one step's history the linearizability check takes on (0: spec.MaxStepOps); a step over it makes the seed inconclusive")
	flag.Parse()
	debug.SetGCPercent(sim.GCPercent)
	debug.SetMemoryLimit(sim.MemoryLimit)

	var done, events, failed, inconclusive atomic.Uint64
	var mu sync.Mutex
	start := time.Now()
	next := *first
	var wg sync.WaitGroup
	for range *par {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				seed := next
				next++
				mu.Unlock()
				if *seeds != 0 && seed >= *first+*seeds {
					return
				}
				r := sim.Simulate(seed, sim.Swarm(seed), sim.Config{Canary: *canary, VizDir: os.TempDir(), MaxStepOps: *maxStep})
				done.Add(1)
				events.Add(r.Events)
				if r.Failure != nil {
					failed.Add(1)
					mu.Lock()
					fmt.Fprintf(os.Stderr, "\n%s", r.Failure)
					if f, err := os.OpenFile(*out, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
						fmt.Fprintf(f, "%#x %s %s\n", seed, r.Failure.Invariant, r.Failure.ReplayCommand())
						f.Close()
					}
					mu.Unlock()
				} else if r.Inconclusive != "" {
					inconclusive.Add(1)
					mu.Lock()
					fmt.Fprintf(os.Stderr, "\nseed %#x INCONCLUSIVE (not a violation, not a pass): %s\n", seed, r.Inconclusive)
					if f, err := os.OpenFile(*out, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
						fmt.Fprintf(f, "%#x INCONCLUSIVE %s\n", seed, r.Inconclusive)
						f.Close()
					}
					mu.Unlock()
				}
			}
		}()
	}
	stop := make(chan struct{})
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				el := time.Since(start).Seconds()
				fmt.Fprintf(os.Stderr, "\r%d seeds  %.1f seeds/s  %.0f events/s  %d failures  %d inconclusive   ",
					done.Load(), float64(done.Load())/el, float64(events.Load())/el, failed.Load(), inconclusive.Load())
			}
		}
	}()
	wg.Wait()
	close(stop)
	el := time.Since(start).Seconds()
	fmt.Fprintf(os.Stderr, "\r%d seeds  %.1f seeds/s  %.0f events/s  %d failures  %d inconclusive\n",
		done.Load(), float64(done.Load())/el, float64(events.Load())/el, failed.Load(), inconclusive.Load())
	if failed.Load() > 0 || inconclusive.Load() > 0 {
		fmt.Fprintf(os.Stderr, "failing and inconclusive seeds appended to %s\n", *out)
		os.Exit(1)
	}
}
