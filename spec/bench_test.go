package spec

import (
	"flag"
	"testing"
)

var flagBenchDepth = flag.Int("explore.benchdepth", 8, "BenchmarkExplore's depth bound over the large scope")

// BenchmarkCheckerWorld runs a random world (orchestrator, checker, Check
// after every event) and reports the cost per event; compare with
// -cpuprofile to see the checker's share.
func BenchmarkCheckerWorld(b *testing.B) {
	events := 0
	for i := 0; i < b.N; i++ {
		w := newWorld(b, uint64(i%16)+1)
		w.c.Verify = false
		for j := 0; j < 1000; j++ {
			w.randomEvent()
			events++
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(events), "ns/event")
}

// BenchmarkExplore explores the large scope (`make explore`'s: 2 workers,
// 2 disconnects, an orchestrator and a worker crash, a cancel, a
// revocation; depth-first) to depth -explore.benchdepth (default 8), with
// no state or time budget: every state within that depth, a fixed set.
// states/s is the states reached over the wall time; the search uses
// Scope.Parallel goroutines, GOMAXPROCS by default (-cpu 1,2).
func BenchmarkExplore(b *testing.B) {
	sc := LargeScope()
	sc.MaxDepth = *flagBenchDepth
	sc.MaxStates, sc.MaxTime = 0, 0
	states := 0
	for i := 0; i < b.N; i++ {
		res := Explore(sc)
		if res.Violation != nil || res.Truncated {
			b.Fatalf("%s", res.Summary())
		}
		states += res.States
		if i == 0 {
			b.Log(res.Summary())
		}
	}
	b.ReportMetric(float64(states)/b.Elapsed().Seconds(), "states/s")
	b.ReportMetric(float64(states)/float64(b.N), "states")
}
