package spec

import (
	"fmt"

	"github.com/tether-run/tether/core"
)

// PropFencedWrites names the data plane's fencing property (SPEC §14): a
// data-plane write the core admits was made under a lease that is current
// and held by the writing worker, and the worker is active and not
// revoked, at that moment; so nothing stored came from a zombie. A
// write-bearing step's lease also has its START recorded (a StartAck{ok}
// produced for it): its process cannot have started before, so a write
// under it would be the output of no run of the step.
const PropFencedWrites = "FencedWrites"

// LeaseHeldBy reports, from the Checker's own view of the orchestrator (the
// leases and workers its records say, never a query of the core), whether
// lease l is current, held by worker w, and w is an active, unrevoked
// worker: whether a write by w under l may be stored now (SPEC §14). It
// reads the state after the last recorded batch.
func (c *Checker) LeaseHeldBy(w core.WorkerID, l core.LeaseID) bool {
	ow, cur := c.current[l]
	info, ok := c.workers[w]
	return cur && ow.worker == w && ok && info.active && !info.revoked
}

// LeaseStarted reports, from the Checker's own view, whether lease l may
// carry writes as far as its start goes: its step is no-write, or a
// StartAck{ok} was produced for it (its START recorded, SPEC §4, §14).
func (c *Checker) LeaseStarted(l core.LeaseID) bool {
	m := c.leases[l]
	return !m.writes || m.ack >= ackProduced
}

// LeaseStep is the step of current lease l, by the Checker's view.
func (c *Checker) LeaseStep(l core.LeaseID) (core.StepID, bool) {
	ow, ok := c.current[l]
	return ow.step, ok
}

// OutputDeclared reports whether data id is among a step's declared
// outputs (SPEC §14, declared writes): an id equal to one, or starting
// with one that ends in '*'. A step that declares none writes anywhere.
// Written apart from the core's matcher, so that the property does not
// check the core against itself.
func OutputDeclared(outputs []string, id string) bool {
	if len(outputs) == 0 {
		return true
	}
	for _, o := range outputs {
		n := len(o)
		switch {
		case n > 0 && o[n-1] == '*' && len(id) >= n-1 && id[:n-1] == o[:n-1]:
			return true
		case o == id:
			return true
		}
	}
	return false
}

// WriteDecided checks the core's answer to a data-plane write by worker w
// under lease l, called right after the batch that answered it was
// recorded (Batch): an admitted write must be one LeaseHeldBy allows,
// under a lease LeaseStarted says may write. The
// core decides a write after every timer due by then has fired, and
// nothing after the decision in its batch ends a lease, so the state after
// the batch is the state the decision was made in.
func (c *Checker) WriteDecided(w core.WorkerID, l core.LeaseID, a core.DataAnswer) *Violation {
	c.checks++
	if a.Refusal != core.WriteAdmitted {
		return nil
	}
	if c.LeaseHeldBy(w, l) {
		if c.LeaseStarted(l) {
			return nil
		}
		return &Violation{Invariant: PropFencedWrites, Detail: fmt.Sprintf("a data-plane write by worker %s under lease %d was admitted, but the lease's step %s is write-bearing and its START is not recorded under it", w, l, c.leases[l].step)}
	}
	ow, cur := c.current[l]
	info, known := c.workers[w]
	var why string
	switch {
	case !cur:
		why = fmt.Sprintf("lease %d is not current", l)
	case ow.worker != w:
		why = fmt.Sprintf("lease %d (step %s) is held by worker %s", l, ow.step, ow.worker)
	case !known:
		why = fmt.Sprintf("worker %s is not enrolled", w)
	case info.revoked:
		why = fmt.Sprintf("worker %s is revoked", w)
	default:
		why = fmt.Sprintf("worker %s is not active", w)
	}
	return &Violation{Invariant: PropFencedWrites, Detail: fmt.Sprintf("a data-plane write by worker %s under lease %d was admitted, but %s", w, l, why)}
}
