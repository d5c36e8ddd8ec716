package sim

import (
	"fmt"
	"strings"
	"time"

	"github.com/tether-run/tether/core"
)

// Properties the simulator checks itself, beyond spec's invariants, because
// they need facts only the simulated world has (the workers' configured
// reconnect delays, what a worker actually said in its Hello).

// props tracks what the properties need across batches.
type props struct {
	recoverAt map[core.StepID]time.Time // when each recovering step went recovering
}

func newProps() *props { return &props{recoverAt: map[core.StepID]time.Time{}} }

// graceMsg is the triage message of a grace expiry (SPEC §4).
const graceMsg = "did not reconnect within the recovery window"

// heldReported lists, for a reconnect Hello, the reported leases that are
// current right before the orchestrator handles it: none of those may be
// triaged as lost.
func (w *world) heldReported(in core.Input) map[core.StepID]core.LeaseID {
	r, ok := in.(core.Received)
	if !ok {
		return nil
	}
	h, ok := r.Msg.(core.Hello)
	if !ok || h.Credential == "" {
		return nil
	}
	held := map[core.StepID]core.LeaseID{}
	for _, ref := range h.InFlight {
		if w.orch.o.Fence(h.Worker, ref.Lease) == nil {
			held[ref.Step] = ref.Lease
		}
	}
	return held
}

// checkBatch runs the simulator's properties over one batch.
func (w *world) checkBatch(held map[core.StepID]core.LeaseID, rd core.Ready) {
	p := w.props
	for _, t := range rd.Transitions {
		switch {
		case t.Event == core.EvRecover:
			p.recoverAt[t.Step] = w.now
		case t.From == core.StateRecovering:
			defer delete(p.recoverAt, t.Step)
		}
	}
	for _, ev := range rd.Events {
		if ev.Step == "" {
			continue
		}
		if strings.Contains(ev.Message, graceMsg) && (ev.Kind == "step-failed" || ev.Kind == "step-requeued") {
			w.checkGraceWindow(ev.Step)
		}
		if l, ok := held[ev.Step]; ok && strings.Contains(ev.Message, "its execution was lost") {
			w.fail("inflight-honoured", fmt.Sprintf(
				"the worker reported %s@%d, current, in its hello, yet the step was triaged as lost", ev.Step, l))
		}
	}
}

// checkGraceWindow: the recovery window is 2 × the worker's maximum
// reconnect delay (§3.3), so a step triaged for a grace expiry spent at
// least that long recovering. A shorter window fails steps whose worker was
// still within its backoff schedule.
func (w *world) checkGraceWindow(step core.StepID) {
	since, ok := w.props.recoverAt[step]
	if !ok {
		return
	}
	grace := 2 * w.opt.MaxDelayWork
	if held := w.now.Sub(since); held < grace {
		w.fail("grace-window", fmt.Sprintf("step %s was triaged for a grace expiry after only %s recovering; the window is 2 × %s = %s",
			step, held, w.opt.MaxDelayWork, grace))
	}
}
