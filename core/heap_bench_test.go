package core

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// BenchmarkCoreSteadyHeap pushes 400,000 no-op steps through the pure core
// at 4,000 steps/s of its clock (runs of 500 steps, 8 in flight, 4 workers
// of 16 slots heartbeating every 30 s) and reports the live heap at the end
// and its largest sample (every 50,000 steps): what the core holds is live
// work plus about one heartbeat interval of closed leases (SPEC §7a), so
// both stay flat however many steps went through.
func BenchmarkCoreSteadyHeap(b *testing.B) {
	const steps = 400_000
	heap := func() float64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return float64(m.HeapAlloc) / (1 << 20)
	}
	var peak, last float64
	for i := 0; i < b.N; i++ {
		base := heap()
		o := noopLoad(b, Config{}, steps, 4000, func(o *Orchestrator, done int) {
			if done%50_000 == 0 {
				peak = max(peak, heap()-base)
			}
		})
		last = heap() - base
		runtime.KeepAlive(o)
	}
	b.ReportMetric(last, "heap-MiB")
	b.ReportMetric(peak, "peak-heap-MiB")
}

// TestTimerHeapBounded: under a steady load the timer heap holds about
// the live timers, not a dispatch-ack deadline's worth of every lease
// granted (timers.go: compactTimers). A stale entry leaves the heap when it
// reaches the top, but a valid timer due earlier (the sweep, every 5 s
// here) keeps the lease deadlines (30 s here) behind it from the top.
func TestTimerHeapBounded(t *testing.T) {
	const steps, rate = 60_000, 4000 // 15 s of the clock
	most := 0
	noopLoad(t, Config{SweepInterval: 5 * time.Second, DispatchAck: 30 * time.Second}, steps, rate, func(o *Orchestrator, done int) {
		most = max(most, len(o.timers))
	})
	if most > 1000 {
		t.Fatalf("the timer heap held %d entries under a load with at most 64 leases current", most)
	}
}

// noopLoad pushes steps no-op steps through a fresh core (cfg) at rate steps/s
// of its clock: runs of 500 steps, 8 in flight, 4 workers of 16 slots
// heartbeating every 30 s, each step STARTed and reported at once. each is
// called after every step with the number done.
func noopLoad(tb testing.TB, cfg Config, steps, rate int, each func(o *Orchestrator, done int)) *Orchestrator {
	const runSteps, inFlight, workers = 500, 8, 4
	o := NewOrchestrator(cfg)
	now := t0
	var sec [16]byte
	for w := 1; w <= workers; w++ {
		rd := o.Step(now, CreateToken{Call: CallID(w), Name: fmt.Sprintf("t%d", w), TTL: time.Hour, Secret: sec})
		o.Step(now, Received{Conn: ConnID(w), Msg: Hello{Version: ProtocolVersion, Token: rd.Answers[0].Token,
			Worker: WorkerID(fmt.Sprintf("w%d", w)), Slots: 16, MaxDelay: time.Minute}})
	}
	var queue []Envelope
	var req uint64
	lastBeat := now
	done, live, call := 0, 0, CallID(100)
	for done < steps {
		for ; live < inFlight; live++ {
			spec := RunSpec{Name: "heap"}
			for s := 0; s < runSteps; s++ {
				spec.Steps = append(spec.Steps, StepSpec{Name: fmt.Sprintf("s%d", s), Command: "true"})
			}
			call++
			queue = append(queue, o.Step(now, Submit{Call: call, Spec: spec}).Messages...)
		}
		if len(queue) == 0 {
			tb.Fatalf("nothing dispatched after %d steps", done)
		}
		e := queue[0]
		queue = queue[1:]
		d, ok := e.Msg.(Dispatch)
		if !ok {
			continue
		}
		now = now.Add(time.Second / time.Duration(rate))
		if now.Sub(lastBeat) >= 30*time.Second {
			lastBeat = now
			for w := 1; w <= workers; w++ {
				o.Step(now, Received{Conn: ConnID(w), Msg: Heartbeat{}})
			}
		}
		req++
		queue = append(queue, o.Step(now, Received{Conn: e.Conn, Msg: Start{Lease: d.Lease, Request: req}}).Messages...)
		req++
		rd := o.Step(now, Received{Conn: e.Conn, Msg: Report{Step: d.Step, Lease: d.Lease, Request: req, Outcome: Outcome{Status: OutcomeSuccess}}})
		queue = append(queue, rd.Messages...)
		for _, r := range rd.Records {
			if IsHistoryKey(r.Key) {
				live--
			}
		}
		done++
		each(o, done)
	}
	return o
}
