package core

import (
	"context"
	"fmt"
	"runtime"
	"runtime/pprof"
	"testing"
	"time"
)

// BenchmarkRunEnds times the two largest single steps of the 64-slot load
// (SPEC §12, the loop's longest step): the Submit of a 200-step run and
// the Report that ends it, which archives the run (its history record, and
// 400 records deleted). Each iteration submits a run, starts and reports
// every step on one worker, and measures those two Steps alone: their
// time, bytes and allocations each. CPU profiles label them op=submit and
// op=runend (the other reports op=report):
//
//	go test ./core -run '^$' -bench RunEnds -cpuprofile cpu.out
//	go tool pprof -tagfocus op=runend core.test cpu.out
func BenchmarkRunEnds(b *testing.B) {
	const steps = 200
	o := NewOrchestrator(Config{NoStateCache: true}) // as the real driver's core
	now := t0
	var sec [16]byte
	rd := o.Step(now, CreateToken{Call: 1, Name: "t", TTL: time.Hour, Secret: sec})
	rd = o.Step(now, Received{Conn: 1, Msg: Hello{Version: ProtocolVersion, Token: rd.Answers[0].Token, Worker: "w", Slots: 64, MaxDelay: time.Minute}})
	spec := RunSpec{Name: "bench"}
	for s := 0; s < steps; s++ {
		spec.Steps = append(spec.Steps, StepSpec{Name: fmt.Sprintf("s%d", s), Command: "true"})
	}
	var submit, end time.Duration
	var submitBytes, submitAllocs, endBytes, endAllocs uint64
	var m0, m1 runtime.MemStats
	req := uint64(0)
	measure := func(op string, d *time.Duration, bytes, allocs *uint64, in Input) Ready {
		var rd Ready
		runtime.ReadMemStats(&m0)
		t := time.Now()
		pprof.Do(context.Background(), pprof.Labels("op", op), func(context.Context) { rd = o.Step(now, in) })
		*d += time.Since(t)
		runtime.ReadMemStats(&m1)
		*bytes += m1.TotalAlloc - m0.TotalAlloc
		*allocs += m1.Mallocs - m0.Mallocs
		return rd
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		rd = measure("submit", &submit, &submitBytes, &submitAllocs, Submit{Call: CallID(1000 + i), Spec: spec})
		if len(rd.Records) < steps {
			b.Fatalf("submit wrote %d records, want at least %d", len(rd.Records), steps)
		}
		queue, reports := rd.Messages, 0
		for len(queue) > 0 {
			d, ok := queue[0].Msg.(Dispatch)
			queue = queue[1:]
			if !ok {
				continue
			}
			req++
			queue = append(queue, o.Step(now, Received{Conn: 1, Msg: Start{Lease: d.Lease, Request: req}}).Messages...)
			req++
			reports++
			in := Received{Conn: 1, Msg: Report{Step: d.Step, Lease: d.Lease, Request: req, Outcome: Outcome{Status: OutcomeSuccess}}}
			if reports < steps {
				pprof.Do(context.Background(), pprof.Labels("op", "report"), func(context.Context) { rd = o.Step(now, in) })
			} else {
				rd = measure("runend", &end, &endBytes, &endAllocs, in)
				if len(rd.Records) < 2*steps {
					b.Fatalf("the run's last report wrote %d records, want at least %d (the run archived)", len(rd.Records), 2*steps)
				}
			}
			queue = append(queue, rd.Messages...)
		}
		if reports != steps {
			b.Fatalf("%d steps reported, want %d", reports, steps)
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(submit.Microseconds())/n, "submit-µs")
	b.ReportMetric(float64(submitBytes)/n/1024, "submit-KiB")
	b.ReportMetric(float64(submitAllocs)/n, "submit-allocs")
	b.ReportMetric(float64(end.Microseconds())/n, "runend-µs")
	b.ReportMetric(float64(endBytes)/n/1024, "runend-KiB")
	b.ReportMetric(float64(endAllocs)/n, "runend-allocs")
	b.ReportMetric(0, "ns/op")
}
