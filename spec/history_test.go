package spec

import (
	"math"
	"testing"

	"github.com/tether-run/tether/core"
)

// A report whose answer never came is unknown and returns after every other
// operation; a second answer to a report does not move its first return;
// Ops is a copy, so a later answer still lands.
func TestHistoryRecords(t *testing.T) {
	var h History
	rep := StepInput{Kind: OpReport, Step: "run-1/a", Worker: "w1", Lease: 1, Request: 1}
	a := h.Begin(1, rep, 10)
	b := h.Begin(0, StepInput{Kind: OpQuery, Step: "run-1/a"}, 20)
	h.End(b, StepOutput{State: core.StateRunning}, 30)
	if h.Len() != 2 || h.Pending() != 1 || !h.Open(a) || h.Open(b) || h.Input(a) != rep {
		t.Fatalf("len %d pending %d open %v %v", h.Len(), h.Pending(), h.Open(a), h.Open(b))
	}
	ops := h.Ops()
	if out, ok := ops[a].Output.(StepOutput); !ok || !out.Unknown || ops[a].Return != math.MaxInt64 || ops[a].Call != 10 {
		t.Fatalf("the open report: %+v", ops[a])
	}
	if ops[b].Return != 30 || ops[b].Output.(StepOutput).State != core.StateRunning {
		t.Fatalf("the query: %+v", ops[b])
	}
	h.End(a, StepOutput{Verdict: core.Committed}, 40)
	h.End(a, StepOutput{Verdict: core.Rejected}, 50)
	ops = h.Ops()
	if ops[a].Return != 40 || ops[a].Output.(StepOutput).Verdict != core.Committed || h.Pending() != 0 {
		t.Fatalf("the answered report: %+v (pending %d)", ops[a], h.Pending())
	}
}
