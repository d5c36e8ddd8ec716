package spec

import (
	"testing"
)

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
