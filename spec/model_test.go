package spec

import (
	"math"
	"strings"
	"testing"

	"github.com/anishathalye/porcupine"
	"github.com/tether-run/tether/core"
)

// hist builds histories: each op has a call and a return time.
type hist struct{ ops []porcupine.Operation }

const step1 core.StepID = "run-1/a"

var (
	okOut   = core.Outcome{Status: core.OutcomeSuccess}
	failOut = core.Outcome{Status: core.OutcomeFailure, ExitCode: 3}
)

func (h *hist) add(client int, call, ret int64, in StepInput, out StepOutput) *hist {
	if out.Unknown {
		ret = math.MaxInt64
	}
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret})
	return h
}

func (h *hist) submit(call, ret int64) *hist {
	return h.add(0, call, ret, StepInput{Kind: OpSubmit, Step: step1}, StepOutput{})
}

func (h *hist) report(client int, call, ret int64, l core.LeaseID, req uint64, o core.Outcome, v core.Verdict) *hist {
	return h.add(client, call, ret, StepInput{Kind: OpReport, Step: step1, Lease: l, Request: req, Outcome: o}, StepOutput{Verdict: v})
}

func (h *hist) reportUnknown(client int, call int64, l core.LeaseID, req uint64, o core.Outcome) *hist {
	return h.add(client, call, 0, StepInput{Kind: OpReport, Step: step1, Lease: l, Request: req, Outcome: o}, StepOutput{Unknown: true})
}

func (h *hist) query(client int, call, ret int64, st core.State, o *core.Outcome) *hist {
	return h.add(client, call, ret, StepInput{Kind: OpQuery, Step: step1}, StepOutput{State: st, Outcome: o})
}

func (h *hist) cancel(client int, call, ret int64, err string) *hist {
	return h.add(client, call, ret, StepInput{Kind: OpCancel, Step: step1}, StepOutput{Err: err})
}

func check(t *testing.T, h *hist, want porcupine.CheckResult) {
	t.Helper()
	res := porcupine.Ok
	switch c := CheckSteps(h.ops, MaxStepOps); c.Verdict {
	case NotLinearizable:
		res = porcupine.Illegal
	case Inconclusive:
		res = porcupine.Unknown
	}
	if res != want {
		var b strings.Builder
		for _, op := range h.ops {
			b.WriteString("\n  " + StepModel.DescribeOperation(op.Input, op.Output))
		}
		t.Fatalf("history is %s, want %s:%s", res, want, b.String())
	}
}

func TestModelAcceptsSequentialHistory(t *testing.T) {
	h := (&hist{}).submit(0, 1).
		query(1, 2, 3, core.StateQueued, nil).
		report(2, 4, 5, 1, 1, failOut, core.Rejected). // e.g. a write-bearing step reported before START
		report(2, 6, 7, 2, 1, okOut, core.Cancelled).  // lease 2 superseded
		report(2, 8, 9, 3, 1, okOut, core.Committed).
		query(1, 10, 11, core.StateSuccess, &okOut).
		report(2, 12, 13, 3, 1, okOut, core.Committed).  // exact repeat
		report(2, 14, 15, 3, 2, failOut, core.Rejected). // a different completion
		report(2, 16, 17, 2, 1, okOut, core.Cancelled).  // repeat of an answered stale report
		cancel(1, 18, 19, "run run-1 already finished (success)").
		query(1, 20, 21, core.StateSuccess, &okOut)
	check(t, h, porcupine.Ok)
}

func TestModelAcceptsConcurrentHistory(t *testing.T) {
	// Two leases' reports overlap; whichever linearizes first commits. A
	// query overlapping the commit may see either side of it.
	h := (&hist{}).submit(0, 1).
		report(1, 10, 30, 1, 1, failOut, core.Cancelled).
		report(2, 12, 25, 2, 1, okOut, core.Committed).
		query(3, 11, 26, core.StateRunning, nil).
		query(4, 20, 40, core.StateSuccess, &okOut).
		query(3, 41, 42, core.StateSuccess, &okOut)
	check(t, h, porcupine.Ok)

	// A cancel that races a cleanup-failed report: the failure commits.
	h = (&hist{}).submit(0, 1).
		cancel(1, 10, 20, "").
		report(2, 15, 30, 1, 5, core.Outcome{Status: core.OutcomeCleanupFailed}, core.Committed).
		query(3, 31, 32, core.StateFailed, &core.Outcome{Status: core.OutcomeCleanupFailed})
	check(t, h, porcupine.Ok)

	// A cancel overlapping a success: the success linearizes first.
	h = (&hist{}).submit(0, 1).
		cancel(1, 10, 20, "").
		report(2, 5, 15, 1, 1, okOut, core.Committed).
		query(3, 21, 22, core.StateSuccess, &okOut)
	check(t, h, porcupine.Ok)
}

func TestModelAcceptsUnknownOutputs(t *testing.T) {
	// The commit's answer was lost; the retry of the same request is
	// answered COMMITTED, and queries may see it.
	h := (&hist{}).submit(0, 1).
		reportUnknown(1, 2, 1, 1, okOut).
		query(2, 5, 6, core.StateSuccess, &okOut).
		report(1, 7, 8, 1, 1, okOut, core.Committed)
	check(t, h, porcupine.Ok)
	// Or the lost call never took effect, and another lease commits.
	h = (&hist{}).submit(0, 1).
		reportUnknown(1, 2, 1, 1, okOut).
		query(2, 5, 6, core.StateRunning, nil).
		report(3, 7, 8, 2, 1, failOut, core.Committed).
		query(2, 9, 10, core.StateFailed, &failOut)
	check(t, h, porcupine.Ok)
	// A cancel that timed out may or may not have taken effect.
	h = (&hist{}).submit(0, 1).
		add(1, 2, 0, StepInput{Kind: OpCancel, Step: step1}, StepOutput{Unknown: true}).
		report(2, 5, 6, 1, 1, okOut, core.Committed)
	check(t, h, porcupine.Ok)
	// A history without a submit is checked as if the step existed.
	h = (&hist{}).report(1, 1, 2, 1, 1, okOut, core.Committed).query(2, 3, 4, core.StateSuccess, &okOut)
	check(t, h, porcupine.Ok)
}

func TestModelRejectsDoubleCommit(t *testing.T) {
	h := (&hist{}).submit(0, 1).
		report(1, 2, 3, 1, 1, okOut, core.Committed).
		report(2, 4, 5, 2, 1, failOut, core.Committed) // lease 1 committed, then lease 2 too
	check(t, h, porcupine.Illegal)
	// Concurrent: both overlap, both COMMITTED — still one too many.
	h = (&hist{}).submit(0, 1).
		report(1, 2, 10, 1, 1, okOut, core.Committed).
		report(2, 3, 9, 2, 1, okOut, core.Committed)
	check(t, h, porcupine.Illegal)
	// Same lease, a different completion, COMMITTED.
	h = (&hist{}).submit(0, 1).
		report(1, 2, 3, 1, 1, okOut, core.Committed).
		report(1, 4, 5, 1, 2, failOut, core.Committed)
	check(t, h, porcupine.Illegal)
}

func TestModelRejectsCommitAfterCancel(t *testing.T) {
	h := (&hist{}).submit(0, 1).
		cancel(1, 2, 3, "").
		report(2, 4, 5, 1, 1, okOut, core.Committed)
	check(t, h, porcupine.Illegal)
	// After a cancel, an uncommitted step does not show running.
	h = (&hist{}).submit(0, 1).
		cancel(1, 2, 3, "").
		query(2, 4, 5, core.StateRunning, nil)
	check(t, h, porcupine.Illegal)
}

func TestModelRejectsSupersededCommit(t *testing.T) {
	// Lease 2 was shown to exist (its report was CANCELLED), so lease 1 had
	// been superseded: its report cannot commit afterwards.
	h := (&hist{}).submit(0, 1).
		report(1, 2, 3, 2, 1, okOut, core.Cancelled).
		report(2, 4, 5, 1, 1, okOut, core.Committed)
	check(t, h, porcupine.Illegal)
	// The query shows lease 2's outcome, but lease 1 got COMMITTED.
	h = (&hist{}).submit(0, 1).
		report(1, 2, 3, 1, 1, okOut, core.Committed).
		query(2, 4, 5, core.StateFailed, &failOut)
	check(t, h, porcupine.Illegal)
}

func TestModelRejectsLostCommit(t *testing.T) {
	// COMMITTED was answered; after a restart the query shows no outcome.
	h := (&hist{}).submit(0, 1).
		report(1, 2, 3, 1, 1, okOut, core.Committed).
		query(2, 10, 11, core.StateRecovering, nil)
	check(t, h, porcupine.Illegal)
	// The exact repeat of the committed report is not answered COMMITTED.
	h = (&hist{}).submit(0, 1).
		report(1, 2, 3, 1, 1, okOut, core.Committed).
		report(1, 4, 5, 1, 1, okOut, core.Cancelled)
	check(t, h, porcupine.Illegal)
	// An outcome nobody committed.
	h = (&hist{}).submit(0, 1).
		query(2, 4, 5, core.StateSuccess, &okOut)
	check(t, h, porcupine.Illegal)
}

func TestModelTellsWorkersApart(t *testing.T) {
	rep := func(w core.WorkerID, l core.LeaseID, req uint64, o core.Outcome) StepInput {
		return StepInput{Kind: OpReport, Step: step1, Worker: w, Lease: l, Request: req, Outcome: o}
	}
	// Another worker sends the very report the lease's worker will send
	// (request ids are per worker, so they collide): it is REJECTED, and the
	// real one still commits; after the commit the other worker's copy is
	// REJECTED again, not a repeat of the commit.
	h := (&hist{}).submit(0, 1)
	h.add(2, 2, 3, rep("rogue", 1, 1, okOut), StepOutput{Verdict: core.Rejected})
	h.add(1, 4, 5, rep("w1", 1, 1, okOut), StepOutput{Verdict: core.Committed})
	h.add(2, 6, 7, rep("rogue", 1, 1, okOut), StepOutput{Verdict: core.Rejected})
	h.add(1, 8, 9, rep("w1", 1, 1, okOut), StepOutput{Verdict: core.Committed})
	check(t, h, porcupine.Ok)
	// Within one worker the repeat rule still binds.
	h = (&hist{}).submit(0, 1)
	h.add(1, 2, 3, rep("w1", 1, 1, okOut), StepOutput{Verdict: core.Rejected})
	h.add(1, 4, 5, rep("w1", 1, 1, okOut), StepOutput{Verdict: core.Committed})
	check(t, h, porcupine.Illegal)
	// And a second worker's commit after the first's is one too many.
	h = (&hist{}).submit(0, 1)
	h.add(1, 2, 3, rep("w1", 1, 1, okOut), StepOutput{Verdict: core.Committed})
	h.add(2, 4, 5, rep("rogue", 1, 1, okOut), StepOutput{Verdict: core.Committed})
	check(t, h, porcupine.Illegal)
}

func TestModelPartitionsBySteps(t *testing.T) {
	// Two steps each commit once: fine, they are different registers.
	h := &hist{}
	h.add(0, 1, 2, StepInput{Kind: OpReport, Step: "run-1/a", Lease: 1, Request: 1, Outcome: okOut}, StepOutput{Verdict: core.Committed})
	h.add(0, 3, 4, StepInput{Kind: OpReport, Step: "run-1/b", Lease: 2, Request: 1, Outcome: okOut}, StepOutput{Verdict: core.Committed})
	check(t, h, porcupine.Ok)
	if got := len(partitionByStep(h.ops)); got != 2 {
		t.Fatalf("%d partitions", got)
	}
}

// TestModelAcceptsTheRealCore records a history from a real orchestrator
// driven through reports, cancels, queries and a restart, and checks it; then
// doctors one answer and checks that the model objects.
func TestModelAcceptsTheRealCore(t *testing.T) {
	r := newRig(t)
	var ops []porcupine.Operation
	clock := int64(0)
	rec := func(in StepInput, out StepOutput) {
		clock += 2
		ops = append(ops, porcupine.Operation{Input: in, Call: clock - 1, Output: out, Return: clock})
	}
	query := func(s core.StepID) {
		st, _ := r.c.View(r.o).StepByID(s)
		rec(StepInput{Kind: OpQuery, Step: s}, StepOutput{State: st.State, Outcome: st.Outcome})
	}
	r.enroll("w1", 2)
	r.enroll("w2", 1)
	run := r.submit(noWrite("a"), noWrite("b"), writeStep("c"))
	steps := []core.StepID{sid(run, "a"), sid(run, "b"), sid(run, "c")}
	for _, s := range steps {
		rec(StepInput{Kind: OpSubmit, Step: s}, StepOutput{})
		query(s)
	}
	report := func(w core.WorkerID, l core.LeaseID, o core.OutcomeStatus) core.Answer {
		in := r.reportIn(w, l, o)
		rep := in.Msg.(core.Report)
		r.step(in)
		a := r.answers[l]
		rec(StepInput{Kind: OpReport, Step: rep.Step, Lease: l, Request: rep.Request, Outcome: rep.Outcome}, StepOutput{Verdict: a.Verdict})
		return a
	}
	la := r.leaseOf(steps[0])
	if a := report(r.holder[la], la, core.OutcomeSuccess); a.Verdict != core.Committed {
		t.Fatalf("a: %v", a)
	}
	if a := report(r.holder[la], la, core.OutcomeFailure); a.Verdict != core.Rejected { // a different completion
		t.Fatalf("a again: %v", a)
	}
	lc := r.leaseOf(steps[2])
	if a := report(r.holder[lc], lc, core.OutcomeFailure); a.Verdict != core.Rejected { // write-bearing without START
		t.Fatalf("c: %v", a)
	}
	r.crash()
	for _, s := range steps {
		query(s)
	}
	r.step(core.CancelRun{Call: r.nextCall(), Run: run})
	for _, s := range steps {
		rec(StepInput{Kind: OpCancel, Step: s}, StepOutput{})
		query(s)
	}
	lb := r.leaseOf(steps[1])
	r.reconnect(r.holder[lb], lb)                                                        // it still holds lb: its run is archived, the closed-lease table answers (SPEC §7a)
	if a := report(r.holder[lb], lb, core.OutcomeSuccess); a.Verdict != core.Cancelled { // stale
		t.Fatalf("b: %v", a)
	}
	for _, s := range steps {
		query(s)
	}
	if c := CheckSteps(ops, MaxStepOps); c.Verdict != Linearizable {
		t.Fatalf("the real core's history is %s", c.Verdict)
	}
	// Doctor: the stale report of b claims COMMITTED.
	bad := append([]porcupine.Operation(nil), ops...)
	for i, op := range bad {
		if in := op.Input.(StepInput); in.Kind == OpReport && in.Step == steps[1] {
			bad[i].Output = StepOutput{Verdict: core.Committed}
		}
	}
	if c := CheckSteps(bad, MaxStepOps); c.Verdict != NotLinearizable {
		t.Fatalf("a doctored history is %s", c.Verdict)
	}
}

// onStep moves a history's operations to another step.
func onStep(h *hist, step core.StepID) []porcupine.Operation {
	ops := make([]porcupine.Operation, len(h.ops))
	for i, op := range h.ops {
		in := op.Input.(StepInput)
		in.Step = step
		op.Input = in
		ops[i] = op
	}
	return ops
}

// TestCheckStepsOversizedInconclusive: a step whose history is over
// MaxStepOps is not checked, and the verdict is inconclusive — neither a
// pass nor a violation — even when that history is linearizable, or when it
// is not; the steps within the bound are still checked.
func TestCheckStepsOversizedInconclusive(t *testing.T) {
	long := (&hist{}).submit(0, 1).report(1, 2, 3, 1, 1, okOut, core.Committed)
	for i := int64(0); len(long.ops) <= MaxStepOps; i++ {
		long.query(2, 10+2*i, 11+2*i, core.StateSuccess, &okOut)
	}
	small := (&hist{}).submit(0, 1).report(1, 2, 3, 1, 1, okOut, core.Committed)
	ops := append(onStep(long, "run-1/long"), onStep(small, "run-1/small")...)
	c := CheckSteps(ops, MaxStepOps)
	if c.Verdict != Inconclusive {
		t.Fatalf("a history with a step of %d operations is %s, want inconclusive", len(long.ops), c.Verdict)
	}
	if len(c.Unchecked) != 1 || c.Unchecked[0] != (UncheckedStep{Step: "run-1/long", Ops: len(long.ops)}) || c.Checked != len(small.ops) {
		t.Fatalf("unchecked %v, checked %d: want run-1/long unchecked and run-1/small's %d operations checked", c.Unchecked, c.Checked, len(small.ops))
	}
	if why := c.Why(); !strings.Contains(why, "run-1/long") {
		t.Fatalf("Why() does not name the unchecked step: %q", why)
	}
	// The oversized step committed twice: still inconclusive, never illegal
	// (it was not checked).
	long.report(3, 1000, 1001, 2, 1, okOut, core.Committed)
	if c := CheckSteps(onStep(long, "run-1/long"), MaxStepOps); c.Verdict != Inconclusive {
		t.Fatalf("an unchecked step's history was judged %s", c.Verdict)
	}
	// Within a larger bound the same history is checked, and is illegal.
	if c := CheckSteps(onStep(long, "run-1/long"), len(long.ops)); c.Verdict != NotLinearizable {
		t.Fatalf("checked within its bound, a double commit was judged %s", c.Verdict)
	}
}

// TestCheckStepsCatchesIllegal: without a timeout an illegal history is
// still caught, also beside a step that went unchecked (a violation is a
// violation, whatever was not checked).
func TestCheckStepsCatchesIllegal(t *testing.T) {
	bad := (&hist{}).submit(0, 1).
		report(1, 2, 10, 1, 1, okOut, core.Committed).
		report(2, 3, 9, 2, 1, okOut, core.Committed)
	if c := CheckSteps(bad.ops, MaxStepOps); c.Verdict != NotLinearizable || len(c.Unchecked) != 0 {
		t.Fatalf("a double commit was judged %s (unchecked %v)", c.Verdict, c.Unchecked)
	}
	long := &hist{}
	for i := int64(0); len(long.ops) <= 3; i++ {
		long.query(2, 10+2*i, 11+2*i, core.StateQueued, nil)
	}
	ops := append(onStep(long, "run-1/long"), onStep(bad, "run-1/bad")...)
	if c := CheckSteps(ops, 3); c.Verdict != NotLinearizable || len(c.Unchecked) != 1 {
		t.Fatalf("a double commit beside an unchecked step was judged %s (unchecked %v)", c.Verdict, c.Unchecked)
	}
	good := (&hist{}).submit(0, 1).report(1, 2, 3, 1, 1, okOut, core.Committed).query(2, 4, 5, core.StateSuccess, &okOut)
	if c := CheckSteps(good.ops, MaxStepOps); c.Verdict != Linearizable || c.Checked != len(good.ops) {
		t.Fatalf("a linearizable history was judged %s (%d checked)", c.Verdict, c.Checked)
	}
}

// A step with retry: {attempts: 1} (SPEC §1 RETRY) may commit once per try:
// a committed failure, then a committed success under a later lease; a
// repeat of the first commit still gets COMMITTED. A second failure ends
// it; a third commit is one too many, and so is any retry of a step
// without a policy.
func TestModelRetries(t *testing.T) {
	submit := func(retries int) *hist {
		return (&hist{}).add(0, 0, 1, StepInput{Kind: OpSubmit, Step: step1, Retries: retries}, StepOutput{})
	}
	h := submit(1).
		report(1, 2, 3, 1, 1, failOut, core.Committed).
		query(2, 4, 5, core.StateWaiting, nil).
		report(1, 6, 7, 2, 1, okOut, core.Committed).
		report(1, 8, 9, 1, 1, failOut, core.Committed). // repeat of try 1's commit
		query(2, 10, 11, core.StateSuccess, &okOut)
	check(t, h, porcupine.Ok)
	h = submit(1).
		report(1, 2, 3, 1, 1, failOut, core.Committed).
		report(1, 4, 5, 2, 1, failOut, core.Committed).
		report(1, 6, 7, 3, 1, okOut, core.Committed) // a third try
	check(t, h, porcupine.Illegal)
	h = submit(0).
		report(1, 2, 3, 1, 1, failOut, core.Committed).
		report(1, 4, 5, 2, 1, okOut, core.Committed)
	check(t, h, porcupine.Illegal)
	// A success is never retried.
	h = submit(2).
		report(1, 2, 3, 1, 1, okOut, core.Committed).
		report(1, 4, 5, 2, 1, okOut, core.Committed)
	check(t, h, porcupine.Illegal)
}
