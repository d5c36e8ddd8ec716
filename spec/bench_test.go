package spec

import (
	"flag"
	"runtime"
	"runtime/metrics"
	"syscall"
	"testing"
	"time"
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
// The search runs Scope.Parallel = GOMAXPROCS goroutines (-cpu N, one N
// per go test: with -benchtime 1x and a list such as -cpu 1,2, go test
// reports for the first entry the probe run it made at the list's last
// GOMAXPROCS; procs says which ran). states/s is the states reached over
// the wall time; cpu-µs/state the process's CPU time (user and system) per
// state, which other load on the machine moves less than the wall time,
// and cores that CPU time over the wall time (what the machine gave: the
// goroutines of a search on an idle machine keep GOMAXPROCS cores busy);
// gc-% the garbage collector's share of the CPU the process used (the
// runtime's estimate), B/state the bytes allocated per state, idle-% the
// goroutines' time waiting for work over their wall time, handoffs the
// frames a goroutine handed to an idle one (explore_pdfs.go).
func BenchmarkExplore(b *testing.B) {
	sc := LargeScope()
	sc.MaxDepth = *flagBenchDepth
	sc.MaxStates, sc.MaxTime = 0, 0
	sc.Parallel = runtime.GOMAXPROCS(0)
	states, handoffs := 0, 0
	var idle, busy time.Duration
	cpu0, m0 := processCPU(b), readMetrics()
	for i := 0; i < b.N; i++ {
		res := Explore(sc)
		if res.Violation != nil || res.Truncated {
			b.Fatalf("%s", res.Summary())
		}
		states += res.States
		handoffs += res.Handoffs
		idle += res.Idle
		busy += time.Duration(res.Goroutines) * res.Duration
		if i == 0 {
			b.Log(res.Summary())
		}
	}
	cpu, m := processCPU(b)-cpu0, readMetrics()
	b.ReportMetric(float64(states)/b.Elapsed().Seconds(), "states/s")
	b.ReportMetric(float64(states)/float64(b.N), "states")
	b.ReportMetric(float64(sc.Parallel), "procs")
	b.ReportMetric(float64(cpu.Microseconds())/float64(states), "cpu-µs/state")
	b.ReportMetric(cpu.Seconds()/b.Elapsed().Seconds(), "cores")
	if d := (m[0] - m0[0]) - (m[1] - m0[1]); d > 0 {
		b.ReportMetric(100*(m[2]-m0[2])/d, "gc-%")
	}
	b.ReportMetric((m[3]-m0[3])/float64(states), "B/state")
	b.ReportMetric(100*idle.Seconds()/busy.Seconds(), "idle-%")
	b.ReportMetric(float64(handoffs)/float64(b.N), "handoffs")
}

// processCPU is the CPU time (user and system) the process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// readMetrics reads the runtime's CPU estimates (total, idle and the
// garbage collector's, in seconds) and the bytes allocated so far.
func readMetrics() [4]float64 {
	s := []metrics.Sample{{Name: "/cpu/classes/total:cpu-seconds"}, {Name: "/cpu/classes/idle:cpu-seconds"},
		{Name: "/cpu/classes/gc/total:cpu-seconds"}, {Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	var out [4]float64
	for i, v := range s {
		switch v.Value.Kind() {
		case metrics.KindFloat64:
			out[i] = v.Value.Float64()
		case metrics.KindUint64:
			out[i] = float64(v.Value.Uint64())
		}
	}
	return out
}
