package spec

import (
	"fmt"
	"strings"

	"github.com/tether-run/tether/core"
)

// PropReuseOnlySuccesses (SPEC §1 REUSE, §2): a rerun's step created
// succeeded (pending --REUSE--> success) names, in ReusedFrom, the step of
// the same name in the run its run reruns; that step succeeded, and the
// reused step shows its outcome. Judged after every batch from the view
// (the old run live or archived).
const PropReuseOnlySuccesses = "ReuseOnlySuccesses"

// CheckReuse checks PropReuseOnlySuccesses over batch rd; v is the
// orchestrator as the batch left it.
func CheckReuse(v View, rd core.Ready) *Violation {
	for _, t := range rd.Transitions {
		if t.Event != core.EvReuse {
			continue
		}
		fail := func(format string, args ...any) *Violation {
			return &Violation{Invariant: PropReuseOnlySuccesses, Detail: fmt.Sprintf("step %s was reused: ", t.Step) + fmt.Sprintf(format, args...)}
		}
		st, ok := v.StepByID(t.Step)
		if !ok {
			return fail("it is nowhere")
		}
		r, _, ok := v.Run(st.Run)
		if !ok || r.RerunOf == "" {
			return fail("its run %s reruns no run", st.Run)
		}
		if want := core.StepID(string(r.RerunOf) + strings.TrimPrefix(string(st.ID), string(st.Run))); st.ReusedFrom != want {
			return fail("it names %s, not %s", st.ReusedFrom, want)
		}
		old, ok := v.StepByID(st.ReusedFrom)
		switch {
		case !ok:
			return fail("%s is nowhere", st.ReusedFrom)
		case old.State != core.StateSuccess || old.Outcome == nil:
			return fail("%s is %s, not succeeded", old.ID, old.State)
		case st.Outcome == nil || *st.Outcome != *old.Outcome:
			return fail("it shows outcome %v, %s's was %v", st.Outcome, old.ID, *old.Outcome)
		}
	}
	return nil
}
