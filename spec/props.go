package spec

import (
	"fmt"
	"strings"
	"time"

	"github.com/tether-run/tether/core"
)

// Properties beyond the Checker's invariants. They need facts only a world
// knows — the workers' configured reconnect delays, what a worker said in its
// Hello — so the Checker cannot hold them; the simulator and the explorer
// both check them, with this code, after every orchestrator batch.
const (
	// PropGraceWindow: a step triaged for a grace expiry spent at least the
	// recovery window (2 × the worker's maximum reconnect delay, SPEC §4)
	// recovering. A shorter window fails steps whose worker was still within
	// its backoff schedule.
	PropGraceWindow = "GraceWindow"
	// PropInFlightHonoured: a lease a reconnecting worker reported in its
	// Hello, current at that moment, is never triaged as lost.
	PropInFlightHonoured = "InFlightHonoured"
	// PropOnlyReportedReclaimed: a reconnect Hello reclaims (recovering →
	// running) only leases the worker reported in it. A worker restarted
	// with its saved identity reports nothing (its processes died with the
	// old process, SPEC §9): reclaiming its steps would hold them, running,
	// on processes that do not exist.
	PropOnlyReportedReclaimed = "OnlyReportedReclaimed"
)

// The event messages the properties read (SPEC §4).
const (
	graceExpiryMsg = "did not reconnect within the recovery window"
	lostMsg        = "its execution was lost"
)

// HeldReported lists, for an input that is a reconnect Hello, the leases it
// reports that are current in o right before o handles it: none of those
// may be triaged as lost by the batch. Any other input gives nil.
func HeldReported(o *core.Orchestrator, in core.Input) map[core.StepID]core.LeaseID {
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
		if o.Fence(h.Worker, ref.Lease) == nil {
			held[ref.Step] = ref.Lease
		}
	}
	return held
}

// RecoveryChanges lists the steps a batch sent into recovering and those it
// took out of it, in batch order. A world keeps, per recovering step, when
// it went recovering: it adds the entered steps before CheckProps and
// forgets the left ones after.
func RecoveryChanges(rd core.Ready) (entered, left []core.StepID) {
	for _, t := range rd.Transitions {
		switch {
		case t.Event == core.EvRecover:
			entered = append(entered, t.Step)
		case t.From == core.StateRecovering:
			left = append(left, t.Step)
		}
	}
	return entered, left
}

// CheckProps checks one orchestrator batch, made at now, against the three
// properties. grace is the recovery window; recoverAt says when each
// recovering step went recovering (the steps this batch sent there
// included); held is HeldReported of the batch's input.
func CheckProps(rd core.Ready, now time.Time, grace time.Duration, recoverAt map[core.StepID]time.Time, held map[core.StepID]core.LeaseID) *Violation {
	if held != nil { // a reconnect Hello
		for _, t := range rd.Transitions {
			if _, ok := held[t.Step]; t.From == core.StateRecovering && t.To == core.StateRunning && !ok {
				return &Violation{Invariant: PropOnlyReportedReclaimed, Detail: fmt.Sprintf(
					"step %s was reclaimed by a reconnect hello that did not report it", t.Step)}
			}
		}
	}
	for _, ev := range rd.Events {
		if ev.Step == "" {
			continue
		}
		if strings.Contains(ev.Message, graceExpiryMsg) && (ev.Kind == "step-failed" || ev.Kind == "step-requeued") {
			if at, ok := recoverAt[ev.Step]; ok {
				if d := now.Sub(at); d < grace {
					return &Violation{Invariant: PropGraceWindow, Detail: fmt.Sprintf(
						"step %s was triaged for a grace expiry after only %s recovering; the window is 2 × %s = %s",
						ev.Step, d, grace/2, grace)}
				}
			}
		}
		if l, ok := held[ev.Step]; ok && strings.Contains(ev.Message, lostMsg) {
			return &Violation{Invariant: PropInFlightHonoured, Detail: fmt.Sprintf(
				"the worker reported %s@%d, current, in its hello, yet the step was triaged as lost", ev.Step, l)}
		}
	}
	return nil
}

// CheckNoWriteFailures is invariant 9's safety half, checked as it happens:
// a no-write step is never failed for a lost worker (disconnect,
// stale-worker, revoked) — it is re-dispatched instead. A terminal state
// never changes, so this is what NoWriteStepsSurviveWorkerLoss finds at the
// end of a run, found at the batch that did it. o is the orchestrator after
// the batch rd.
func CheckNoWriteFailures(o *core.Orchestrator, rd core.Ready) *Violation {
	for _, t := range rd.Transitions {
		if t.To != core.StateFailed {
			continue
		}
		if sp, ok := o.StepSpecOf(t.Step); !ok || sp.Writes {
			continue
		}
		st, ok := o.StepByID(t.Step)
		if !ok {
			continue
		}
		if workerLost(st.Class) {
			return &Violation{Invariant: "NoWriteStepsSurviveWorkerLoss", Detail: fmt.Sprintf(
				"no-write step %s failed with class %s after %d attempts: %s", t.Step, st.Class, st.Attempts, st.Message)}
		}
	}
	return nil
}

// workerLost says whether a failure class blames a lost or stopped worker
// (disconnect, stale-worker, revoked, worker-stopped) rather than the step
// itself.
func workerLost(c core.FailureClass) bool {
	return c == core.ClassDisconnect || c == core.ClassStaleWorker || c == core.ClassRevoked || c == core.ClassWorkerStopped
}
