package sim

import (
	"fmt"

	"github.com/tether-run/tether/core"
)

// Child runs (SPEC §2) in the workload: a share of the steps (ChildFrac)
// are workflow steps, each starting a small child run; the orchestrator,
// not the client, submits those.

// childStepsMax bounds a generated child workflow's steps.
const childStepsMax = 3

// childStep turns s into a workflow step of a small child workflow: it
// keeps s's name, dependencies and gate, and passes one input.
func (w *world) childStep(s core.StepSpec) core.StepSpec {
	n := 1 + w.r.IntN(childStepsMax)
	child := core.RunSpec{Name: "child-" + s.Name, Env: map[string]string{"IN": "default"}}
	for i := range n {
		cs := core.StepSpec{Name: fmt.Sprintf("c%d", i), Command: "work", Writes: w.chance(w.opt.WriteFrac)}
		if i > 0 && w.chance(0.5) {
			cs.DependsOn = []string{fmt.Sprintf("c%d", i-1)}
		}
		child.Steps = append(child.Steps, cs)
	}
	return core.StepSpec{Name: s.Name, DependsOn: s.DependsOn, Hold: s.Hold, HoldExpiry: s.HoldExpiry, Wait: s.Wait,
		Workflow: &child, With: map[string]string{"IN": s.Name}}
}

// persistedChildren records, for the linearizability check, one submit
// operation per step of each child run a durable batch created: the
// orchestrator submitted it, and none of its steps can be dispatched, nor
// reported on, before that batch is durable. The child runs join the runs
// the operator may cancel.
func (w *world) persistedChildren(rd core.Ready) {
	for _, ev := range rd.Events {
		if ev.Kind != "child-run-started" {
			continue
		}
		v := w.view()
		ps, ok := v.StepByID(ev.Step)
		if !ok || ps.Child == "" {
			continue
		}
		r, _, ok := v.Run(ps.Child)
		if !ok {
			continue
		}
		w.childRuns++
		w.hist.runs = append(w.hist.runs, r.ID)
		w.hist.submitted(r.ID, r.Spec)
		for _, s := range r.Steps {
			sp, _ := v.StepSpecOf(s)
			op := w.hist.begin(w.now, opClientOperator, spec2input(s, sp))
			w.hist.end(op, w.now, specOutputOK())
		}
	}
}
