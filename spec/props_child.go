package spec

import (
	"fmt"

	"github.com/tether-run/tether/core"
)

// PropChildOutcome (SPEC §2, §6): after every batch, a workflow step and its
// child run agree. A running workflow step names its child run, live and
// unfinished, whose Parent and ParentStep name it back; a cancelling one's
// child is unfinished and being cancelled; a workflow step that ended with
// a child took that child's outcome (success: the child succeeded; failed:
// it failed), or was cancelled, and then its child has finished, cancelled
// or failed; and a child run that finished in the batch finds its step
// ended. Only the steps and runs the batch touched are judged.
const PropChildOutcome = "ChildOutcome"

// CheckChildRuns checks batch rd against PropChildOutcome; o is the state
// the batch left, archived runs included.
func CheckChildRuns(o View, rd core.Ready) *Violation {
	fail := func(format string, args ...any) *Violation {
		return &Violation{Invariant: PropChildOutcome, Detail: fmt.Sprintf(format, args...)}
	}
	seen := map[core.StepID]bool{}
	var steps []core.StepID
	note := func(id core.StepID) {
		if !seen[id] {
			seen[id] = true
			steps = append(steps, id)
		}
	}
	for _, t := range rd.Transitions {
		note(t.Step)
	}
	for _, ev := range rd.Events {
		if ev.Kind != "run-finished" {
			continue
		}
		r, _, ok := o.Run(ev.Run)
		if ok && r.ParentStep != "" {
			note(r.ParentStep)
		}
	}
	for _, id := range steps {
		sp, ok := o.StepSpecOf(id)
		if !ok || sp.Workflow == nil {
			continue
		}
		s, _ := o.StepByID(id)
		if s.ReusedFrom != "" {
			continue // a rerun took over its old run's success (REUSE, SPEC §2): no child of its own
		}
		if s.Child == "" {
			if s.State == core.StateRunning || s.State == core.StateSuccess || s.State == core.StateFailed {
				return fail("workflow step %s is %s without a child run", id, s.State)
			}
			continue
		}
		c, status, ok := o.Run(s.Child)
		switch {
		case !ok:
			return fail("workflow step %s names child run %s, which does not exist", id, s.Child)
		case c.Parent != s.Run || c.ParentStep != id:
			return fail("child run %s of step %s names parent %s, step %s", c.ID, id, c.Parent, c.ParentStep)
		}
		switch s.State {
		case core.StateRunning:
			if c.Finished {
				return fail("workflow step %s is still running, but its child run %s finished %s", id, c.ID, status)
			}
		case core.StateSuccess:
			if status != "success" {
				return fail("workflow step %s succeeded, but its child run %s is %s", id, c.ID, status)
			}
		case core.StateFailed:
			if status != "failed" {
				return fail("workflow step %s failed, but its child run %s is %s", id, c.ID, status)
			}
		case core.StateCancelling:
			if c.Finished || c.CancelReason == "" {
				return fail("workflow step %s is cancelling, but its child run %s is %s, not being cancelled", id, c.ID, status)
			}
		case core.StateCancelled:
			if !c.Finished || status == "success" {
				return fail("workflow step %s was cancelled, but its child run %s is %s", id, c.ID, status)
			}
		default:
			return fail("workflow step %s is %s with child run %s", id, s.State, c.ID)
		}
	}
	return nil
}
