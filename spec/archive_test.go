package spec

import (
	"reflect"
	"slices"
	"testing"

	"github.com/tether-run/tether/core"
)

// TestStepsInIsStepsFiltered: View.StepsIn gives exactly View.Steps
// filtered to its states, in its order, live and archived steps alike.
func TestStepsInIsStepsFiltered(t *testing.T) {
	r := newRig(t)
	r.enroll("w1", 4)
	r.submit(noWrite("a"), noWrite("b"))
	for l := range r.leases {
		r.step(r.msg("w1", core.Start{Lease: l, Request: 1}))
		r.report("w1", l, core.OutcomeSuccess) // the run finishes: archived (SPEC §7a)
	}
	r.submit(noWrite("c"), noWrite("d"), noWrite("e"))
	for l, d := range r.leases {
		if s, _ := r.c.View(r.o).StepByID(d.Step); s.State == core.StateQueued || s.State == core.StateRunning && r.answers[l] == (core.Answer{}) {
			r.step(r.msg("w1", core.Start{Lease: l, Request: 1}))
		}
	}
	v := r.c.View(r.o)
	if v.A.Len() == 0 {
		t.Fatal("no run was archived")
	}
	counts := map[core.State]int{}
	for _, s := range v.Steps() {
		counts[s.State]++
	}
	if counts[core.StateRunning] < 2 || counts[core.StateSuccess] < 2 {
		t.Fatalf("steps by state %v: want two running and two succeeded at least", counts)
	}
	for _, states := range [][]core.State{{core.StateRunning}, {core.StateSuccess}, {core.StateRunning, core.StateSuccess}, {core.StateFailed}} {
		var want []core.StepRecord
		for _, s := range v.Steps() {
			if slices.Contains(states, s.State) {
				want = append(want, s)
			}
		}
		if got := v.StepsIn(states...); !reflect.DeepEqual(got, want) {
			t.Fatalf("StepsIn%v:\n%+v\nwant\n%+v", states, got, want)
		}
	}
}
