package spec

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/tether-run/tether/core"
)

// Each invariant gets a story of correct behaviour that the checker must
// pass, and planted bugs (a doctored batch, a false fact) that the named
// invariant must catch.

func TestInvariantsAreTheSevenInOrder(t *testing.T) {
	want := []string{"AtMostOneCommit", "WriteStepRunsOnce", "NoStaleCommit", "TransitionsFollowTable",
		"CancelledNeverCommitted", "SlotsAndMatching", "TokensAndRevocation"}
	if len(Invariants) != len(want) {
		t.Fatalf("%d invariants, want %d", len(Invariants), len(want))
	}
	for i, inv := range Invariants {
		if inv.Name != want[i] || invNames[i] != want[i] {
			t.Errorf("invariant %d is %s (%s), want %s", i, inv.Name, invNames[i], want[i])
		}
	}
	c := NewChecker()
	// The seven, then ArchivedWhenDone (SPEC §7a).
	if c.Check() != nil || c.Checks() != uint64(len(want))+1 {
		t.Fatalf("an empty checker: %v, %d checks", c.Check(), c.Checks())
	}
}

// ---- 1. AtMostOneCommit ----

func TestAtMostOneCommitHolds(t *testing.T) {
	r := newRig(t)
	r.enroll("w1", 1)
	run := r.submit(noWrite("a"), noWrite("b", "a"))
	l := r.leaseOf(sid(run, "a"))
	if a := r.report("w1", l, core.OutcomeSuccess); a.Verdict != core.Committed {
		t.Fatalf("answer %v", a)
	}
	// The exact repeat is answered COMMITTED again: allowed.
	r.req--
	if a := r.report("w1", l, core.OutcomeSuccess); a.Verdict != core.Committed {
		t.Fatalf("repeat answer %v", a)
	}
	// A restart keeps the committed outcome.
	r.crash()
	r.quiet()
	if r.state(sid(run, "a")) != core.StateSuccess {
		t.Fatal("commit lost")
	}
	if r.c.ChecksOf("AtMostOneCommit") == 0 {
		t.Fatal("no evaluation counted")
	}
}

func TestAtMostOneCommitCatchesSecondCommit(t *testing.T) {
	r := newRig(t)
	r.enroll("w1", 1)
	r.enroll("w2", 1)
	run := r.submit(noWrite("a"))
	s := sid(run, "a")
	l1 := r.leaseOf(s)
	w1 := r.holder[l1]
	w2 := core.WorkerID("w2")
	if w1 == w2 {
		w2 = "w1"
	}
	r.step(r.msg(w1, core.RejectDispatch{Lease: l1, Reason: "busy"}))
	l2 := r.leaseOf(s)
	if l2 == l1 || r.holder[l2] != w2 {
		t.Fatalf("step not re-dispatched to the other worker: %d %v", l2, r.holder)
	}
	if a := r.report(w2, l2, core.OutcomeSuccess); a.Verdict != core.Committed {
		t.Fatalf("answer %v", a)
	}
	// Plant: w1's stale report under lease 1 is answered COMMITTED too.
	r.c.Verify = false
	in := r.reportIn(w1, l1, core.OutcomeFailure)
	rd := r.produce(in)
	rd.Messages = append(rd.Messages, core.Envelope{Conn: r.conn[w1], Msg: core.Answer{Lease: l1, Request: r.req, Verdict: core.Committed}})
	r.land(rd)
	expectFirst(t, r.c, "AtMostOneCommit")
}

func TestAtMostOneCommitCatchesCommitLostByRestart(t *testing.T) {
	r := newRig(t)
	r.enroll("w1", 1)
	// A second step keeps the run live: a finished run leaves the core
	// (SPEC §7a), and the plant is a lost step record, not a lost history.
	run := r.submit(noWrite("a"), noWrite("b"))
	s := sid(run, "a")
	before := r.disk["step/"+string(s)]
	l := r.leaseOf(s)
	r.report("w1", l, core.OutcomeSuccess)
	// Plant: the store loses the step's committed record.
	r.c.Verify = false
	r.disk["step/"+string(s)] = before
	r.crash()
	expectFirst(t, r.c, "AtMostOneCommit")
}

func TestAtMostOneCommitCatchesAnswerSentBeforePersist(t *testing.T) {
	r := newRig(t)
	r.enroll("w1", 1)
	run := r.submit(noWrite("a"))
	l := r.leaseOf(sid(run, "a"))
	rd := r.produce(r.reportIn("w1", l, core.OutcomeSuccess))
	r.c.Batch(r.now, r.o, rd)
	r.deliver(rd) // plant: delivered before Persisted
	r.persist(rd)
	expectFirst(t, r.c, "AtMostOneCommit")
}

// A batch lost in a crash takes its commit with it: the report that is
// answered again after the restart is a first commit, not a second.
func TestLostBatchForgetsItsCommit(t *testing.T) {
	r := newRig(t)
	r.enroll("w1", 1)
	run := r.submit(noWrite("a"))
	s := sid(run, "a")
	l := r.leaseOf(s)
	in := r.reportIn("w1", l, core.OutcomeFailure)
	rd := r.produce(in)
	r.c.Batch(r.now, r.o, rd) // produced, never persisted
	r.quiet()
	r.crash()
	r.quiet()
	if st := r.state(s); st != core.StateQueued {
		t.Fatalf("after the restart the step is %s", st)
	}
	r.reconnect("w1", l)
	// A different outcome under the same lease now commits (recording START
	// first): the first commit never left the dead process.
	if a := r.report("w1", l, core.OutcomeSuccess); a.Verdict != core.Committed {
		t.Fatalf("answer %v", a)
	}
	r.crash()
	r.quiet()
}

// ---- 2. WriteStepRunsOnce ----

// startWrite dispatches a write-bearing step to w1 and runs the handshake to
// the process start.
func startWrite(r *rig) (core.StepID, core.LeaseID) {
	r.t.Helper()
	r.enroll("w1", 1)
	r.enroll("w2", 1)
	run := r.submit(writeStep("deploy"))
	s := sid(run, "deploy")
	l := r.leaseOf(s)
	w := r.holder[l]
	rd := r.step(r.msg(w, core.Start{Lease: l, Request: 1}))
	ok := false
	for _, e := range rd.Messages {
		if a, is := e.Msg.(core.StartAck); is && a.Lease == l && a.OK {
			ok = true
		}
	}
	if !ok {
		r.t.Fatal("no StartAck{ok}")
	}
	r.c.ProcessStarted(r.now, w, l, s, true)
	r.quiet()
	return s, l
}

func TestWriteStepRunsOnceHolds(t *testing.T) {
	r := newRig(t)
	s, l := startWrite(r)
	w := r.holder[l]
	r.c.ExternalWrite(r.now, w, l, s)
	r.c.ExternalWrite(r.now, w, l, s)
	r.quiet()
	// The worker is lost past its grace: the step fails, never re-dispatched.
	r.disconnect(w)
	r.advance(3 * time.Minute)
	if st := r.state(s); st != core.StateFailed {
		t.Fatalf("step is %s", st)
	}
	r.c.ProcessStopped(r.now, w, l)
	r.advance(time.Minute)
	if r.c.ChecksOf("WriteStepRunsOnce") == 0 {
		t.Fatal("no evaluation counted")
	}
}

func TestWriteStepRunsOnceCatchesSecondProcess(t *testing.T) {
	r := newRig(t)
	s, l := startWrite(r)
	other := core.WorkerID("w2")
	if r.holder[l] == other {
		other = "w1"
	}
	r.c.ProcessStarted(r.now, other, l+7, s, true)
	expectFirst(t, r.c, "WriteStepRunsOnce")
}

func TestWriteStepRunsOnceCatchesRedispatch(t *testing.T) {
	r := newRig(t)
	s, l := startWrite(r)
	other := core.WorkerID("w2")
	if r.holder[l] == other {
		other = "w1"
	}
	r.c.Verify = false
	rd := r.produce(core.Tick{})
	rd.Messages = append(rd.Messages, core.Envelope{Conn: r.conn[other], Msg: core.Dispatch{Lease: l + 1, Step: s, Writes: true}})
	r.land(rd)
	expectFirst(t, r.c, "WriteStepRunsOnce")
}

func TestWriteStepRunsOnceCatchesStartWithoutAck(t *testing.T) {
	r := newRig(t)
	r.enroll("w1", 1)
	run := r.submit(writeStep("deploy"))
	s := sid(run, "deploy")
	l := r.leaseOf(s)
	r.c.ProcessStarted(r.now, "w1", l, s, true) // plant: no handshake
	expectFirst(t, r.c, "WriteStepRunsOnce")
}

func TestWriteStepRunsOnceCatchesTwoWriters(t *testing.T) {
	r := newRig(t)
	s, l := startWrite(r)
	r.c.ExternalWrite(r.now, r.holder[l], l, s)
	r.c.ExternalWrite(r.now, "w2", l+1, s)
	expectFirst(t, r.c, "WriteStepRunsOnce")
}

// ---- 3. NoStaleCommit ----

// supersede leases a step to one worker, lets its dispatch-ack deadline pass
// so it is requeued and leased to the other: lease 1 is stale.
func supersede(r *rig) (s core.StepID, l1, l2 core.LeaseID, w1, w2 core.WorkerID) {
	r.t.Helper()
	r.enroll("w1", 1)
	r.enroll("w2", 1)
	run := r.submit(noWrite("a"))
	s = sid(run, "a")
	l1 = r.leaseOf(s)
	w1 = r.holder[l1]
	r.disconnect(w1) // within grace; the dispatch-ack deadline still runs
	r.advance(11 * time.Second)
	l2 = r.leaseOf(s)
	w2 = r.holder[l2]
	if l2 == l1 || w1 == w2 {
		r.t.Fatalf("not superseded: leases %d %d on %s %s", l1, l2, w1, w2)
	}
	r.reconnect(w1, l1)
	return
}

func TestNoStaleCommitHolds(t *testing.T) {
	r := newRig(t)
	_, l1, l2, w1, w2 := supersede(r)
	if a := r.report(w1, l1, core.OutcomeSuccess); a.Verdict != core.Cancelled {
		t.Fatalf("stale report answered %v", a)
	}
	if a := r.report(w2, l2, core.OutcomeSuccess); a.Verdict != core.Committed {
		t.Fatalf("answer %v", a)
	}
	if r.c.ChecksOf("NoStaleCommit") == 0 {
		t.Fatal("no evaluation counted")
	}
}

func TestNoStaleCommitCatchesStaleCommit(t *testing.T) {
	r := newRig(t)
	_, l1, _, w1, _ := supersede(r)
	r.c.Verify = false
	rd := r.produce(r.reportIn(w1, l1, core.OutcomeSuccess))
	for i, e := range rd.Messages {
		if a, ok := e.Msg.(core.Answer); ok && a.Lease == l1 {
			a.Verdict = core.Committed // plant: the stale report commits
			rd.Messages[i].Msg = a
		}
	}
	r.land(rd)
	// The orchestrator did not record the outcome, so invariant 1 sees the
	// commit vanish too; invariant 3 names the stale lease.
	expect(t, r.c, "NoStaleCommit")
}

func leaseRecord(t testing.TB, l core.LeaseRecord) core.Record {
	b, err := json.Marshal(l)
	if err != nil {
		t.Fatal(err)
	}
	return core.Record{Key: fmt.Sprintf("lease/%020d", l.ID), Value: b}
}

func TestNoStaleCommitCatchesResurrectedLease(t *testing.T) {
	r := newRig(t)
	s, l1, _, w1, _ := supersede(r)
	r.c.Verify = false
	rd := r.produce(core.Tick{})
	rd.Records = append(rd.Records, leaseRecord(t, core.LeaseRecord{ID: l1, Step: s, Worker: w1, Current: true}))
	r.land(rd)
	expectFirst(t, r.c, "NoStaleCommit")
}

func TestNoStaleCommitCatchesResurrectionByRestore(t *testing.T) {
	r := newRig(t)
	s, l1, _, w1, _ := supersede(r)
	r.c.Verify = false
	// Plant: the store brings the superseded lease back as current.
	r.disk[fmt.Sprintf("lease/%020d", l1)] = leaseRecord(t, core.LeaseRecord{ID: l1, Step: s, Worker: w1, Current: true}).Value
	r.crash()
	expectFirst(t, r.c, "NoStaleCommit")
}

// ---- 4. TransitionsFollowTable ----

func TestTransitionsFollowTableHolds(t *testing.T) {
	r := newRig(t)
	r.enroll("w1", 2)
	gate := core.StepSpec{Name: "gate", Command: "true", Hold: true}
	wait := core.StepSpec{Name: "wait", Command: "true", Wait: 20 * time.Second, DependsOn: []string{"gate"}}
	run := r.submit(noWrite("a"), gate, wait, noWrite("c", "a"), core.StepSpec{Name: "t", Type: "task", DependsOn: []string{"a"}})
	r.step(core.Approve{Call: r.nextCall(), Step: sid(run, "gate")})
	l := r.leaseOf(sid(run, "a"))
	r.step(r.msg("w1", core.Start{Lease: l, Request: 1}))
	r.disconnect("w1")
	r.reconnect("w1", l)
	r.report("w1", l, core.OutcomeSuccess)
	r.advance(30 * time.Second)
	r.crash()
	r.reconnect("w1")
	r.step(core.CancelRun{Call: r.nextCall(), Run: run})
	r.advance(time.Minute)
	if r.c.ChecksOf("TransitionsFollowTable") < 10 {
		t.Fatalf("only %d evaluations", r.c.ChecksOf("TransitionsFollowTable"))
	}
}

func TestTransitionsFollowTableCatchesRowNotInTable(t *testing.T) {
	r := newRig(t)
	run := r.submit(noWrite("a"))
	r.c.Verify = false
	rd := r.produce(core.Tick{})
	rd.Transitions = append(rd.Transitions, core.StepTransition{Step: sid(run, "a"), From: core.StateQueued, Event: core.EvSucceed, To: core.StateSuccess})
	r.land(rd)
	expectFirst(t, r.c, "TransitionsFollowTable")
}

func TestTransitionsFollowTableCatchesTerminalChange(t *testing.T) {
	r := newRig(t)
	r.enroll("w1", 1)
	run := r.submit(noWrite("a"))
	s := sid(run, "a")
	r.report("w1", r.leaseOf(s), core.OutcomeFailure)
	r.c.Verify = false
	rd := r.produce(core.Tick{})
	// A real row, but from a terminal state the step is in.
	rd.Transitions = append(rd.Transitions, core.StepTransition{Step: s, From: core.StateRunning, Event: core.EvSucceed, To: core.StateSuccess})
	r.land(rd)
	expectFirst(t, r.c, "TransitionsFollowTable")
}

func TestTransitionsFollowTableCatchesBrokenChain(t *testing.T) {
	r := newRig(t)
	run := r.submit(noWrite("a"))
	r.c.Verify = false
	rd := r.produce(core.Tick{})
	rd.Transitions = append(rd.Transitions, core.StepTransition{Step: sid(run, "a"), From: core.StateRecovering, Event: core.EvRequeue, To: core.StateQueued})
	r.land(rd)
	expectFirst(t, r.c, "TransitionsFollowTable")
}

// ---- 5. CancelledNeverCommitted ----

func cancelling(r *rig) (core.StepID, core.LeaseID) {
	r.t.Helper()
	r.enroll("w1", 1)
	run := r.submit(noWrite("a"))
	s := sid(run, "a")
	l := r.leaseOf(s)
	r.step(r.msg("w1", core.Start{Lease: l, Request: 1}))
	r.step(core.CancelRun{Call: r.nextCall(), Run: run})
	if st := r.state(s); st != core.StateCancelling {
		r.t.Fatalf("step is %s", st)
	}
	return s, l
}

func TestCancelledNeverCommittedHolds(t *testing.T) {
	r := newRig(t)
	s, l := cancelling(r)
	// The cleanup-failed report commits a failure: allowed.
	if a := r.report("w1", l, core.OutcomeCleanupFailed); a.Verdict != core.Committed {
		t.Fatalf("answer %v", a)
	}
	if st := r.state(s); st != core.StateFailed {
		t.Fatalf("step is %s", st)
	}
	r2 := newRig(t)
	_, l2 := cancelling(r2)
	if a := r2.report("w1", l2, core.OutcomeSuccess); a.Verdict != core.Cancelled {
		t.Fatalf("answer %v", a)
	}
	if r.c.ChecksOf("CancelledNeverCommitted") == 0 {
		t.Fatal("no evaluation counted")
	}
}

func TestCancelledNeverCommittedCatchesCommitAfterCancel(t *testing.T) {
	r := newRig(t)
	_, l := cancelling(r)
	r.c.Verify = false
	rd := r.produce(r.reportIn("w1", l, core.OutcomeSuccess))
	for i, e := range rd.Messages {
		if a, ok := e.Msg.(core.Answer); ok {
			a.Verdict = core.Committed // plant: the success that raced the cancel wins
			rd.Messages[i].Msg = a
		}
	}
	r.land(rd)
	expect(t, r.c, "CancelledNeverCommitted")
}

// ---- 6. SlotsAndMatching ----

func TestSlotsAndMatchingHolds(t *testing.T) {
	r := newRig(t)
	r.enroll("w1", 1)
	r.enroll("w2", 2, "docker")
	docker := core.StepSpec{Name: "d", Command: "build", Type: "docker"}
	run := r.submit(noWrite("a"), docker, noWrite("e"))
	if r.holder[r.leaseOf(sid(run, "d"))] != "w2" {
		t.Fatal("docker step not on the docker worker")
	}
	for _, w := range r.o.Workers() {
		if w.Leases > w.Slots || w.Leases == 0 {
			t.Fatalf("worker %s holds %d leases, %d slots", w.ID, w.Leases, w.Slots)
		}
	}
	if r.c.ChecksOf("SlotsAndMatching") < 3 {
		t.Fatal("grants not evaluated")
	}
}

// plantGrant fabricates a grant of step s to worker w, with its Dispatch.
func plantGrant(r *rig, s core.StepID, w core.WorkerID) {
	r.t.Helper()
	var max core.LeaseID
	for _, l := range r.c.View(r.o).Leases() {
		max = l.ID
	}
	rd := r.produce(core.Tick{})
	rd.Records = append(rd.Records, leaseRecord(r.t, core.LeaseRecord{ID: max + 1, Step: s, Worker: w, Current: true}))
	rd.Messages = append(rd.Messages, core.Envelope{Conn: r.conn[w], Msg: core.Dispatch{Lease: max + 1, Step: s}})
	r.land(rd)
}

func TestSlotsAndMatchingCatchesOverSlots(t *testing.T) {
	r := newRig(t)
	r.enroll("w1", 1)
	run := r.submit(noWrite("a"), noWrite("b"))
	if r.state(sid(run, "b")) != core.StateQueued {
		t.Fatal("b should wait for a slot")
	}
	r.c.Verify = false
	plantGrant(r, sid(run, "b"), "w1")
	expectFirst(t, r.c, "SlotsAndMatching")
}

// enrollAhead enrolls w with slots and a lease-ahead (SPEC §3).
func enrollAhead(r *rig, w core.WorkerID, slots, ahead int) {
	r.t.Helper()
	in := r.hello(w, slots)
	h := in.Msg.(core.Hello)
	h.Token, h.Ahead = r.createToken("tok-"+string(w), time.Hour), ahead
	in.Msg = h
	r.step(in)
}

// A worker with one slot and one ahead holds two leases, one started: the
// worker's Report of the first before its Start of the held one keeps it
// within its slot; a Start of the held lease while the first still runs is
// two started leases on one slot (SPEC §3), which the orchestrator records
// as the worker says, and the checker catches.
func TestSlotsAndMatchingAhead(t *testing.T) {
	for _, bad := range []bool{false, true} {
		r := newRig(t)
		enrollAhead(r, "w1", 1, 1)
		run := r.submit(noWrite("a"), noWrite("b"))
		la, lb := r.leaseOf(sid(run, "a")), r.leaseOf(sid(run, "b"))
		if r.holder[la] != "w1" || r.holder[lb] != "w1" {
			t.Fatalf("want a and b on w1 (one slot, one ahead): leases %d %d", la, lb)
		}
		r.step(r.msg("w1", core.Start{Lease: la, Request: 1}))
		r.step(r.msg("w1", core.Held{Lease: lb}))
		if bad {
			r.c.Verify = false
			r.land(r.produce(r.msg("w1", core.Start{Lease: lb, Request: 2})))
			expectFirst(t, r.c, "SlotsAndMatching")
			continue
		}
		r.report("w1", la, core.OutcomeSuccess)
		r.step(r.msg("w1", core.Start{Lease: lb, Request: 2}))
		if v := r.c.Check(); v != nil {
			t.Fatalf("report, then start of the held lease: %v", v)
		}
	}
}

func TestSlotsAndMatchingCatchesMismatch(t *testing.T) {
	r := newRig(t)
	r.enroll("w1", 2, "script")
	run := r.submit(core.StepSpec{Name: "d", Command: "build", Type: "docker"})
	r.c.Verify = false
	plantGrant(r, sid(run, "d"), "w1")
	expectFirst(t, r.c, "SlotsAndMatching")
}

// ---- 7. TokensAndRevocation ----

func TestTokensAndRevocationHolds(t *testing.T) {
	r := newRig(t)
	r.enroll("w1", 1)
	r.enroll("w2", 1)
	run := r.submit(noWrite("a"), writeStep("b"))
	// A replayed token is refused.
	in := r.hello("w3", 1)
	h := in.Msg.(core.Hello)
	h.Token = r.tokens["tok-w1"]
	in.Msg = h
	r.step(in)
	// Revoking a worker's token takes its leases away.
	lb := r.leaseOf(sid(run, "b"))
	r.step(core.RevokeToken{Call: r.nextCall(), Name: "tok-" + string(r.holder[lb])})
	r.advance(time.Second)
	if r.c.ChecksOf("TokensAndRevocation") < 3 {
		t.Fatal("not evaluated")
	}
}

// plantWelcome replaces a Refused answer to a Hello by a Welcome with a
// credential.
func plantWelcome(r *rig, in core.Received) {
	r.t.Helper()
	rd := r.produce(in)
	for i, e := range rd.Messages {
		if _, ok := e.Msg.(core.Refused); ok {
			rd.Messages[i].Msg = core.Welcome{Worker: in.Msg.(core.Hello).Worker, Credential: "x.y"}
		}
	}
	r.land(rd)
}

func TestTokensAndRevocationCatchesConsumedToken(t *testing.T) {
	r := newRig(t)
	r.enroll("w1", 1)
	r.c.Verify = false
	in := r.hello("w2", 1)
	h := in.Msg.(core.Hello)
	h.Token = r.tokens["tok-w1"]
	in.Msg = h
	plantWelcome(r, in)
	expectFirst(t, r.c, "TokensAndRevocation")
}

func TestTokensAndRevocationCatchesExpiredToken(t *testing.T) {
	r := newRig(t)
	tok := r.createToken("short", time.Minute)
	r.advance(2 * time.Minute)
	r.c.Verify = false
	in := r.hello("w1", 1)
	h := in.Msg.(core.Hello)
	h.Token = tok
	in.Msg = h
	plantWelcome(r, in)
	expectFirst(t, r.c, "TokensAndRevocation")
}

func TestTokensAndRevocationCatchesRevokedWorkerWithLease(t *testing.T) {
	r := newRig(t)
	r.enroll("w1", 1)
	r.submit(noWrite("a"))
	r.c.Verify = false
	rd := r.produce(core.RevokeToken{Call: r.nextCall(), Name: "tok-w1"})
	kept := rd.Records[:0]
	for _, rec := range rd.Records {
		if _, isLease := leaseKeyID(rec.Key); !isLease {
			kept = append(kept, rec) // plant: the lease is not ended
		}
	}
	rd.Records = kept
	r.land(rd)
	expectFirst(t, r.c, "TokensAndRevocation")
}

// ---- liveness ----

func TestLiveness(t *testing.T) {
	r := newRig(t)
	r.enroll("w1", 1)
	run := r.submit(noWrite("a"), writeStep("b", "a"))
	if v := r.c.CheckLiveness(r.c.View(r.o)); v == nil || v.Invariant != "RunsFinish" {
		t.Fatalf("an unfinished run passed: %v", v)
	}
	if v := NoWriteStepsSurviveWorkerLoss(r.c.View(r.o)); v == nil {
		t.Fatal("a running no-write step passed invariant 9")
	}
	// The worker keeps dying: the no-write step is re-dispatched, then the
	// write-bearing one fails when its started worker is lost.
	la := r.leaseOf(sid(run, "a"))
	r.step(r.msg("w1", core.Start{Lease: la, Request: 1}))
	r.disconnect("w1")
	r.advance(3 * time.Minute)
	r.reconnect("w1")
	la2 := r.leaseOf(sid(run, "a"))
	if la2 == la {
		t.Fatal("no-write step not re-dispatched")
	}
	r.report("w1", la2, core.OutcomeSuccess)
	lb := r.leaseOf(sid(run, "b"))
	r.step(r.msg("w1", core.Start{Lease: lb, Request: 2}))
	r.disconnect("w1")
	r.advance(3 * time.Minute)
	if v := r.c.CheckLiveness(r.c.View(r.o)); v != nil {
		t.Fatalf("liveness: %v", v)
	}
	if st, _ := r.c.View(r.o).StepByID(sid(run, "b")); st.Class != core.ClassDisconnect {
		t.Fatalf("write step: %s %s", st.State, st.Class)
	}
}

// A worker whose labels and tags spell the record's own field names must not
// fool the checker's fast path for heartbeat records.
func TestWorkerFlagsReadRobustly(t *testing.T) {
	r := newRig(t)
	tok := r.createToken("tok-w1", time.Hour)
	in := r.hello("w1", 1, "Active", "Revoked")
	h := in.Msg.(core.Hello)
	h.Token = tok
	h.Labels = map[string]string{"Active": "true", "Revoked": "false"}
	h.Name = `"Revoked":false`
	in.Msg = h
	r.step(in)
	r.step(r.msg("w1", core.Heartbeat{}))
	run := r.submit(noWrite("a"))
	r.step(r.msg("w1", core.Heartbeat{}))
	if !r.c.workers["w1"].active || r.c.workers["w1"].revoked {
		t.Fatalf("checker sees %+v", r.c.workers["w1"])
	}
	r.step(core.RevokeToken{Call: r.nextCall(), Name: "tok-w1"})
	if w := r.c.workers["w1"]; !w.revoked || w.active {
		t.Fatalf("checker missed the revocation: %+v", w)
	}
	if st := r.state(sid(run, "a")); st != core.StateQueued {
		t.Fatalf("step is %s", st)
	}
}

// Clone branches the checker: a planted bug in one branch does not show in
// the other.
func TestCloneBranches(t *testing.T) {
	r := newRig(t)
	r.enroll("w1", 1)
	run := r.submit(noWrite("a"))
	c2 := r.c.Clone()
	r.c.Verify = false
	rd := r.produce(core.Tick{})
	rd.Transitions = append(rd.Transitions, core.StepTransition{Step: sid(run, "a"), From: core.StateQueued, Event: core.EvSucceed, To: core.StateSuccess})
	r.land(rd)
	expectFirst(t, r.c, "TransitionsFollowTable")
	if v := c2.Check(); v != nil {
		t.Fatalf("the clone saw the other branch: %v", v)
	}
	if c2.steps[sid(run, "a")] != core.StateQueued {
		t.Fatal("the clone's state moved")
	}
}

// A driver that merges batches (group commit) and persists the merge makes
// every batch so far durable; persisting a batch twice changes nothing.
func TestGroupCommit(t *testing.T) {
	r := newRig(t)
	r.enroll("w1", 1)
	run := r.submit(noWrite("a"))
	l := r.leaseOf(sid(run, "a"))
	rd1 := r.produce(r.reportIn("w1", l, core.OutcomeSuccess))
	r.c.Batch(r.now, r.o, rd1)
	rd2 := r.produce(core.Tick{})
	r.c.Batch(r.now, r.o, rd2)
	merged := core.Ready{Records: append(append([]core.Record(nil), rd1.Records...), rd2.Records...),
		Messages: append(append([]core.Envelope(nil), rd1.Messages...), rd2.Messages...)}
	r.persist(merged)
	r.persist(merged)
	r.deliver(merged)
	r.quiet()
	r.crash()
	r.quiet()
	if r.state(sid(run, "a")) != core.StateSuccess {
		t.Fatal("the merged batch was not restored")
	}
}
