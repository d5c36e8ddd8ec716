package core

import (
	"fmt"
	"strings"
)

// ReusedStep is a step of a rerun created already succeeded (REUSE, SPEC
// §1, §2): Step is its instance name in the run ("build", "test[2]"),
// Outcome the success it takes over from the run it reruns.
type ReusedStep struct {
	Step    string
	Outcome Outcome
}

// checkReuse refuses a Reuse list that names a step the run does not have,
// names one twice, or gives an outcome other than success.
func checkReuse(in Submit) error {
	if len(in.Reuse) == 0 {
		return nil
	}
	if in.RerunOf == "" {
		return invalid("steps to reuse without the run they come from")
	}
	if len(in.Reuse) > MaxStepsPerRun {
		return invalid("%d steps to reuse, at most %d", len(in.Reuse), MaxStepsPerRun)
	}
	names := map[string]bool{}
	for i := range in.Spec.Steps {
		for _, id := range instanceIDs("", &in.Spec.Steps[i]) {
			names[strings.TrimPrefix(string(id), "/")] = true
		}
	}
	seen := map[string]bool{}
	for _, u := range in.Reuse {
		switch {
		case !names[u.Step]:
			return invalid("step to reuse %s is not a step of the run", Quote(u.Step))
		case seen[u.Step]:
			return invalid("step to reuse %s is named twice", Quote(u.Step))
		case u.Outcome.Status != OutcomeSuccess:
			return invalid("step to reuse %s did not succeed", Quote(u.Step))
		}
		seen[u.Step] = true
	}
	return nil
}

// reuse creates the rerun's reused steps succeeded (pending --REUSE-->
// success, SPEC §1): they never run, and their dependents proceed as after
// any success. Called before the run's steps are promoted.
//
// A success promotes its dependents (afterTerminal), so a reused step is
// made to succeed only after its reused dependents: none of them is
// promoted out of pending before its own REUSE.
func (o *Orchestrator) reuse(r *RunRecord, list []ReusedStep) {
	outcome := make(map[StepID]Outcome, len(list))
	for _, u := range list {
		outcome[StepID(string(r.ID)+"/"+u.Step)] = u.Outcome
	}
	var visit func(id StepID)
	visit = func(id StepID) {
		s := o.steps[id]
		out, ok := outcome[id]
		if !ok || s.State != StatePending {
			return
		}
		delete(outcome, id) // visited
		for _, d := range o.dependents[id] {
			visit(d)
		}
		s.Outcome = &out
		s.ReusedFrom = StepID(string(r.RerunOf) + strings.TrimPrefix(string(id), string(r.ID)))
		s.Message = fmt.Sprintf("reused the success of %s", s.ReusedFrom)
		o.event(r.ID, s.ID, "step-reused", s.Message)
		o.transition(s, EvReuse)
	}
	for _, u := range list {
		visit(StepID(string(r.ID) + "/" + u.Step))
	}
}

// ReusePlan lists, for `run rerun --failed-only` (SPEC §2), the steps of
// run (its step records, in the run's order, live or from its history)
// that succeeded: the rerun creates them succeeded with the same outcome.
// A step that itself reused a success passes it on.
func ReusePlan(run RunRecord, steps []StepRecord) []ReusedStep {
	var out []ReusedStep
	prefix := string(run.ID) + "/"
	for _, s := range steps {
		if s.State != StateSuccess || s.Outcome == nil || !strings.HasPrefix(string(s.ID), prefix) {
			continue
		}
		out = append(out, ReusedStep{Step: strings.TrimPrefix(string(s.ID), prefix), Outcome: *s.Outcome})
	}
	return out
}
