package core

import (
	"fmt"
	"testing"
	"time"
)

// benchThroughput pushes steps no-op steps through the pure core: submit one
// run of independent steps, then answer every Dispatch with Start and a
// success Report, until all steps are done. It measures the core alone: no
// disk, no sockets.
func benchThroughput(b *testing.B, steps, workers, slots int) {
	for i := 0; i < b.N; i++ {
		o := NewOrchestrator(Config{})
		now := t0
		var sec [16]byte
		conns := map[ConnID]WorkerID{}
		var queue []Envelope
		for w := 1; w <= workers; w++ {
			rd := o.Step(now, CreateToken{Call: CallID(w), Name: fmt.Sprintf("t%d", w), TTL: time.Hour, Secret: sec})
			c := ConnID(w)
			conns[c] = WorkerID(fmt.Sprintf("w%d", w))
			rd = o.Step(now, Received{Conn: c, Msg: Hello{Version: ProtocolVersion, Token: rd.Answers[0].Token,
				Worker: conns[c], Slots: slots, MaxDelay: time.Minute}})
			queue = append(queue, rd.Messages...)
		}
		spec := RunSpec{Name: "bench"}
		for s := 0; s < steps; s++ {
			spec.Steps = append(spec.Steps, StepSpec{Name: fmt.Sprintf("s%d", s), Command: "true"})
		}
		rd := o.Step(now, Submit{Call: 1000, Spec: spec})
		queue = append(queue, rd.Messages...)
		done := 0
		var req uint64
		for len(queue) > 0 {
			e := queue[0]
			queue = queue[1:]
			d, ok := e.Msg.(Dispatch)
			if !ok {
				continue
			}
			req++
			queue = append(queue, o.Step(now, Received{Conn: e.Conn, Msg: Start{Lease: d.Lease, Request: req}}).Messages...)
			req++
			rd := o.Step(now, Received{Conn: e.Conn, Msg: Report{Step: d.Step, Lease: d.Lease, Request: req, Outcome: Outcome{Status: OutcomeSuccess}}})
			queue = append(queue, rd.Messages...)
			done++
		}
		if done != steps {
			b.Fatalf("%d of %d steps done", done, steps)
		}
	}
	b.ReportMetric(float64(steps*b.N)/b.Elapsed().Seconds(), "steps/s")
}

func BenchmarkCoreThroughput2000x4x16(b *testing.B) { benchThroughput(b, 2000, 4, 16) }
func BenchmarkCoreThroughput2000x4x1(b *testing.B)  { benchThroughput(b, 2000, 4, 1) }
