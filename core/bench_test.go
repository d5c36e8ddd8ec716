package core

import (
	"fmt"
	"testing"
	"time"
)

// benchThroughput pushes steps no-op steps through the pure core: submit
// runs of 500 independent steps (a run holds at most MaxStepsPerRun), then
// answer every Dispatch with Start and a
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
		for r := 0; r*benchRunSteps < steps; r++ {
			spec := RunSpec{Name: "bench"}
			for s := r * benchRunSteps; s < min(steps, (r+1)*benchRunSteps); s++ {
				spec.Steps = append(spec.Steps, StepSpec{Name: fmt.Sprintf("s%d", s), Command: "true"})
			}
			rd := o.Step(now, Submit{Call: CallID(1000 + r), Spec: spec})
			if len(rd.Answers) != 1 || rd.Answers[0].Err != "" {
				b.Fatalf("submit refused: %v", rd.Answers)
			}
			queue = append(queue, rd.Messages...)
		}
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

const benchRunSteps = 500

func BenchmarkCoreThroughput2000x4x16(b *testing.B) { benchThroughput(b, 2000, 4, 16) }
func BenchmarkCoreThroughput2000x4x1(b *testing.B)  { benchThroughput(b, 2000, 4, 1) }

// BenchmarkDataWriteDecision measures the core's side of one data-plane
// write (SPEC §14), which every append and PUT pays on the driver's loop:
// stepping a DataWrite (timers, the decision, dispatch, an empty batch),
// against asking the same decision as a query (CheckWrite), with 1,024
// current leases and 976 ready steps in the machine.
func BenchmarkDataWriteDecision(b *testing.B) {
	o := NewOrchestrator(Config{})
	now := t0
	var sec [16]byte
	rd := o.Step(now, CreateToken{Call: 1, Name: "t1", TTL: time.Hour, Secret: sec})
	rd = o.Step(now, Received{Conn: 1, Msg: Hello{Version: ProtocolVersion, Token: rd.Answers[0].Token, Worker: "w1", Slots: MaxWorkerSlots, MaxDelay: time.Minute}, Entropy: sec})
	cred := ""
	for _, e := range rd.Messages {
		if w, ok := e.Msg.(Welcome); ok {
			cred = w.Credential
		}
	}
	spec := RunSpec{Name: "bench"}
	for s := 0; s < 1000; s++ {
		spec.Steps = append(spec.Steps, StepSpec{Name: fmt.Sprintf("s%d", s), Command: "true"})
	}
	for c := CallID(2); c < 4; c++ {
		if rd := o.Step(now, Submit{Call: c, Spec: spec}); rd.Answers[0].Err != "" {
			b.Fatal(rd.Answers[0].Err)
		}
	}
	var lease LeaseID
	for _, l := range o.Leases() {
		lease = l.ID
	}
	if a := o.CheckWrite(now, cred, lease); lease == 0 || a.Refusal != WriteAdmitted {
		b.Fatalf("the bench's write is refused: %v", a.Err())
	}
	b.Run("step", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			rd := o.Step(now, DataWrite{Req: uint64(i), Credential: cred, Lease: lease})
			if len(rd.Records) != 0 || rd.Writes[0].Refusal != WriteAdmitted {
				b.Fatalf("%d records, %v", len(rd.Records), rd.Writes[0].Err())
			}
		}
	})
	b.Run("query", func(b *testing.B) {
		for b.Loop() {
			if a := o.CheckWrite(now, cred, lease); a.Refusal != WriteAdmitted {
				b.Fatal(a.Err())
			}
		}
	})
}
