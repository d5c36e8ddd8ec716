package spec_test

// Property-based suites (pgregory.net/rapid) for the lease register.
//
// A real core.Orchestrator is driven by random actions — small DAGs of
// write-bearing and no-write steps, enrollments, reconnects with in-flight
// lists, disconnects, Start, RejectDispatch, reports with random outcomes,
// request ids and leases (duplicates, conflicting duplicates, stale leases,
// other workers' leases, unknown leases), heartbeats, refreshes, run
// cancellation, token revocation, time passing (random amounts and exactly to
// the batch's Deadline), and restarts by core.Restore from the records of
// every batch so far. Alongside runs refModel: a small reference model of the
// step register and the lease table written here, from SPEC §1-4, without
// calling any of core's logic. It predicts every answer to a report and every
// StartAck; it derives lease ends from the transitions the batch lists
// (entering a terminal state or REQUEUE ends the step's lease) and from the
// actions' own rules (revocation, a no-grace disconnect, a lease a
// reconnecting worker did not report, a rejected dispatch); it learns other
// ends only from batches in which a timer could fire. After every action the
// orchestrator's observable answers — its Answers, StartAcks, Welcome.Cancel
// lists, lease and step records, Leases(), StepByID() and Fence() — must agree
// with the model, and a spec.Checker fed like a driver must stay quiet.
//
// A failing case is shrunk and persisted by rapid under
// spec/testdata/rapid/<TestName>/, and every file there is replayed by plain
// `go test ./spec` before any new case is generated.

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/tether-run/tether/core"
	"github.com/tether-run/tether/spec"
)

var rapidT0 = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)

// TestRapidLeaseRegister runs the suite with the default configuration.
func TestRapidLeaseRegister(t *testing.T) {
	runRapid(t, core.Config{})
}

// TestRapidLeaseRegisterTight runs it with short timers and a 2-grant cap, so
// that dispatch-ack expiry, stale workers, unmatched steps, forced cancels,
// credential expiry and attempts-exhausted happen within few actions.
func TestRapidLeaseRegisterTight(t *testing.T) {
	runRapid(t, core.Config{
		HeartbeatTimeout: 40 * time.Second,
		SweepInterval:    20 * time.Second,
		UnmatchedTimeout: 10 * time.Second,
		DispatchAck:      4 * time.Second,
		ForceCancel:      15 * time.Second,
		KillGrace:        5 * time.Second,
		CredentialTTL:    3 * time.Minute,
		MaxAttempts:      2,
	})
}

// runRapid checks the property and reports, across every generated case,
// how often each kind of answer and event was seen (so that a tame generator
// is noticed).
func runRapid(t *testing.T, cfg core.Config) {
	stats := &rapidStats{n: map[string]int{}}
	rapid.Check(t, func(rt *rapid.T) {
		h := newHarness(rt, cfg, stats)
		h.setup()
		h.run(rt)
	})
	t.Logf("rapid: %s", stats)
	if stats.get("actions") >= 2000 {
		for _, k := range []string{"answer COMMITTED", "answer CANCELLED", "answer REJECTED",
			"duplicate answered COMMITTED again", "restart", "grant", "lease ended by a timer",
			"StartAck ok", "welcome with cancels", "revoke", "run cancelled"} {
			if stats.get(k) == 0 {
				t.Errorf("the generated cases never saw %q: the generator is too tame", k)
			}
		}
	}
}

type rapidStats struct {
	mu sync.Mutex
	n  map[string]int
}

func (s *rapidStats) add(k string) { s.mu.Lock(); s.n[k]++; s.mu.Unlock() }
func (s *rapidStats) get(k string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n[k]
}
func (s *rapidStats) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(s.n)) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, s.n[k]))
	}
	return strings.Join(parts, " ")
}

// ---- the reference model ----

// refModel is the step register and lease table as SPEC §1-4 define them.
type refModel struct {
	cfg        core.Config
	steps      map[core.StepID]*mStep
	leases     map[core.LeaseID]*mLease
	maxLease   core.LeaseID
	restoredAt time.Time // the last restart (SPEC §7a: the closed-lease table's time bound)
}

type mStep struct {
	id          core.StepID
	run         core.RunID
	writes      bool
	deps        []core.StepID
	state       core.State
	lease       core.LeaseID // the current lease, 0 when none
	grants      int
	everStarted bool          // START was recorded from queued
	outcome     *core.Outcome // the committed outcome
}

type mLease struct {
	id        core.LeaseID
	step      core.StepID
	worker    core.WorkerID
	current   bool
	started   bool
	committed bool
	answers   []mAnswer // answers the orchestrator must remember
	// mustEndBy: the lease may not be current at or after this instant
	// (dispatch-ack deadline, recovery deadline, force-cancel deadline).
	mustEndBy time.Time
	// holdUntil: a recovering lease whose worker is away keeps its authority
	// until then (its grace window): no timer may end it earlier.
	holdUntil time.Time
	// Archival (SPEC §7a): the lease's run left the core; its entry in the
	// closed-lease table answers for it until dropped. held: the worker
	// showed it held the lease (a START, a report, a listing).
	archived, held, dropped bool
	closedAt                time.Time
}

// firstAnswer is the answer the closed-lease table keeps of an archived
// lease (SPEC §7a): the committed one when it committed, else the first.
func (l *mLease) firstAnswer() *mAnswer {
	var first *mAnswer
	for i := range l.answers {
		if first == nil || (l.committed && l.answers[i].verdict == core.Committed) {
			first = &l.answers[i]
		}
	}
	return first
}

type mAnswer struct {
	request uint64
	outcome core.Outcome
	verdict core.Verdict
}

func newRefModel(cfg core.Config) *refModel {
	return &refModel{cfg: cfg, steps: map[core.StepID]*mStep{}, leases: map[core.LeaseID]*mLease{}}
}

// reportPrediction is what the model says a report must get.
type reportPrediction struct {
	verdict core.Verdict
	record  bool // the orchestrator must remember this answer
	commit  bool
	// after: the state the step must be in once the batch is done
	// (meaningful when commit, or when a cancelling step's cancel completes).
	after    core.State
	hasAfter bool
	why      string
}

// predictReport is SPEC §3's answer to report r from worker w.
func (m *refModel) predictReport(w core.WorkerID, r core.Report) reportPrediction {
	if r.Request == 0 || r.Outcome.Status.String() == "invalid" {
		return reportPrediction{verdict: core.Rejected, why: "malformed"}
	}
	l := m.leases[r.Lease]
	switch {
	case l == nil:
		return reportPrediction{verdict: core.Rejected, why: "unknown lease"}
	case l.dropped:
		return reportPrediction{verdict: core.Rejected, why: "unknown lease (dropped from the closed-lease table)"}
	case l.worker != w:
		return reportPrediction{verdict: core.Rejected, why: "another worker's lease"}
	case l.step != r.Step:
		return reportPrediction{verdict: core.Rejected, why: "a lease of another step"}
	}
	if l.archived {
		// SPEC §7a: as §3 answers it, from the one report the table keeps;
		// nothing more is recorded.
		if a := l.firstAnswer(); a != nil && a.request == r.Request {
			if a.outcome == r.Outcome {
				return reportPrediction{verdict: a.verdict, why: "exact duplicate (archived)"}
			}
			return reportPrediction{verdict: core.Rejected, why: "conflicting duplicate (archived)"}
		}
		if l.committed {
			return reportPrediction{verdict: core.Rejected, why: "a different completion after the commit (archived)"}
		}
		return reportPrediction{verdict: core.Cancelled, why: "lease lost authority (archived)"}
	}
	for _, a := range l.answers {
		if a.request == r.Request {
			if a.outcome == r.Outcome {
				return reportPrediction{verdict: a.verdict, why: "exact duplicate"}
			}
			return reportPrediction{verdict: core.Rejected, why: "conflicting duplicate"}
		}
	}
	if l.committed {
		return reportPrediction{verdict: core.Rejected, why: "a different completion after the commit"}
	}
	if !l.current {
		return reportPrediction{verdict: core.Cancelled, record: len(l.answers) < core.MaxAnswersPerLease, why: "lease lost authority"}
	}
	s := m.steps[l.step]
	switch {
	case s.state == core.StateCancelling && r.Outcome.Status == core.OutcomeCleanupFailed:
		return reportPrediction{verdict: core.Committed, record: true, commit: true, after: core.StateFailed, hasAfter: true, why: "cleanup failed while cancelling"}
	case s.state == core.StateCancelling:
		return reportPrediction{verdict: core.Cancelled, record: true, after: core.StateCancelled, hasAfter: true, why: "the report completes the cancel"}
	case s.state == core.StateQueued && s.writes:
		return reportPrediction{verdict: core.Rejected, record: true, why: "write-bearing step without a recorded START"}
	case spec.Terminal(s.state):
		// Cannot happen: a terminal step holds no current lease.
		return reportPrediction{verdict: core.Cancelled, why: "terminal step with a current lease (model bug)"}
	}
	after := core.StateFailed
	if r.Outcome.Status == core.OutcomeSuccess {
		after = core.StateSuccess
	}
	return reportPrediction{verdict: core.Committed, record: true, commit: true, after: after, hasAfter: true, why: "current lease"}
}

// startOK is SPEC §4's start handshake: a Start gets StartAck{ok} iff the
// lease is the worker's, current, and its step is not being cancelled.
func (m *refModel) startOK(w core.WorkerID, l core.LeaseID) bool {
	ml := m.leases[l]
	return ml != nil && ml.worker == w && ml.current && m.steps[ml.step].state != core.StateCancelling
}

// leasesOf lists worker w's current leases, ascending.
func (m *refModel) leasesOf(w core.WorkerID) []core.LeaseID {
	var ls []core.LeaseID
	for id, l := range m.leases {
		if l.current && l.worker == w {
			ls = append(ls, id)
		}
	}
	slices.Sort(ls)
	return ls
}

func (m *refModel) end(id core.LeaseID) {
	l := m.leases[id]
	if l == nil || !l.current {
		return
	}
	l.current = false
	l.mustEndBy, l.holdUntil = time.Time{}, time.Time{}
	if s := m.steps[l.step]; s.lease == id {
		s.lease = 0
	}
}

// ---- the harness: a driver, a few workers, the model ----

type hWorker struct {
	id      core.WorkerID
	token   string // token name
	cred    string
	conn    core.ConnID
	scaler  bool
	grace   time.Duration
	slots   int
	tags    []string
	held    map[core.LeaseID]bool // the worker's own view of what it holds
	proc    map[core.LeaseID]bool // processes running
	stop    map[core.LeaseID]bool // a Cancel arrived: the process is being stopped
	credLB  time.Time             // the credential is certainly valid before this
	revoked bool
}

type hToken struct {
	name, str         string
	consumed, revoked bool
	worker            *hWorker
}

type sentReport struct {
	w *hWorker
	r core.Report
}

type harness struct {
	t     *rapid.T
	cfg   core.Config
	stats *rapidStats

	o        *core.Orchestrator
	chk      *spec.Checker
	now      time.Time
	disk     core.Disk
	deadline time.Time // the last batch's Deadline
	call     core.CallID
	conn     core.ConnID
	secret   byte
	req      uint64
	action   string

	ws     []*hWorker
	byConn map[core.ConnID]*hWorker
	tokens []*hToken
	runs   []core.RunID
	sent   []sentReport
	leases []core.LeaseID // every lease ever dispatched, ascending
	disp   map[core.LeaseID]core.Dispatch

	m *refModel
}

func newHarness(rt *rapid.T, cfg core.Config, stats *rapidStats) *harness {
	o := core.NewOrchestrator(cfg)
	h := &harness{t: rt, cfg: o.Config(), stats: stats, o: o, chk: spec.NewChecker(), now: rapidT0,
		disk: core.Disk{}, byConn: map[core.ConnID]*hWorker{}, disp: map[core.LeaseID]core.Dispatch{}}
	h.chk.Verify = true
	h.m = newRefModel(h.cfg)
	return h
}

func (h *harness) fatalf(format string, args ...any) {
	h.t.Helper()
	h.t.Fatalf("[%s at +%s] %s", h.action, h.now.Sub(rapidT0), fmt.Sprintf(format, args...))
}

// setup gives every case a worker and a run to start from, so that the
// random actions are spent on the register rather than on getting there.
func (h *harness) setup() {
	h.action = "setup"
	h.enroll(h.t, false)
	h.submit(h.t)
}

// action is one kind of random action and its weight in the mix.
type action struct {
	name   string
	weight int
	do     func(*rapid.T)
}

func (h *harness) actions() []action {
	return []action{
		// The first is what shrinking tends to: the most harmless.
		{"Heartbeat", 4, h.heartbeat},
		{"Submit", 4, h.submit},
		{"Enroll", 3, func(t *rapid.T) { h.enroll(t, true) }},
		{"EnrollReplay", 1, h.enrollReplay},
		{"Reconnect", 10, h.reconnect},
		{"Disconnect", 3, h.disconnect},
		{"Start", 8, h.start},
		{"RejectDispatch", 2, h.reject},
		{"ReportOwn", 10, h.reportOwn},
		{"ReportAny", 4, h.reportAny},
		{"ReportDuplicate", 4, h.reportDup},
		{"ReportConflicting", 3, h.reportConflict},
		{"Refresh", 1, h.refresh},
		{"CancelRun", 2, h.cancelRun},
		{"RevokeToken", 1, h.revoke},
		{"Advance", 5, h.advance},
		{"AdvanceToDeadline", 3, h.advanceToDeadline},
		{"Restart", 2, h.restart},
	}
}

// maxActions bounds one generated case (after the setup).
const maxActions = 400

// run draws a sequence of weighted actions and checks everything after each.
// An action that does not apply (no connected worker, nothing sent yet)
// does nothing; shrinking removes it.
func (h *harness) run(t *rapid.T) {
	acts := h.actions()
	var names []string
	byName := map[string]func(*rapid.T){}
	for _, a := range acts {
		byName[a.name] = a.do
		for i := 0; i < a.weight; i++ {
			names = append(names, a.name)
		}
	}
	gen := rapid.SampledFrom(names)
	n := rapid.IntRange(1, maxActions).Draw(t, "actions")
	for i := 0; i < n; i++ {
		h.action = gen.Draw(t, "action")
		h.stats.add("actions")
		byName[h.action](t)
		h.check(t)
	}
}

// expect is what an action's batch must do to the lease table.
type expect struct {
	end   []core.LeaseID // must have lost authority after the batch
	stay  []core.LeaseID // must still be current after the batch
	learn bool           // timers may fire: other ends are learned, not judged
	// listing: the in-flight list of an accepted Hello or heartbeat, which
	// drops the worker's closed-lease entries it does not list (SPEC §7a).
	listing *listing
}

// timersDue reports whether a timer is due at now, so that a batch stepped
// now may fire it after its input.
func (h *harness) timersDue() bool { return !h.deadline.IsZero() && !h.deadline.After(h.now) }

// step runs one input the way a driver does: Input, Step, Batch, persist
// (the records go to the disk map), Persisted; then the model observes the
// batch and its messages are delivered.
func (h *harness) step(in core.Input, ex expect) core.Ready {
	h.t.Helper()
	return h.land(h.produce(in), ex)
}

// produce steps the input and makes its batch durable.
func (h *harness) produce(in core.Input) core.Ready {
	h.chk.Input(h.now, in)
	rd := h.o.Step(h.now, in)
	h.chk.Batch(h.now, h.o, rd)
	h.persist(rd)
	return rd
}

// land has the model observe a durable batch, then delivers its messages.
func (h *harness) land(rd core.Ready, ex expect) core.Ready {
	h.t.Helper()
	ex.learn = ex.learn || h.timersDue()
	h.observe(rd, ex)
	h.deliver(rd)
	h.deadline = rd.Deadline
	return rd
}

func (h *harness) persist(rd core.Ready) {
	h.disk.Apply(rd.Records)
	h.chk.Persisted(h.now, rd)
}

// observe updates the model from a batch and judges the batch against it.
func (h *harness) observe(rd core.Ready, ex expect) {
	h.t.Helper()
	m := h.m
	// 1. Transitions: the step register follows them; entering a terminal
	// state or REQUEUE ends the step's lease (SPEC §1, §4).
	for _, tr := range rd.Transitions {
		s := m.steps[tr.Step]
		switch {
		case s == nil:
			h.fatalf("transition %s %s→%s of a step the model never saw submitted", tr.Step, tr.From, tr.To)
		case spec.Terminal(s.state):
			h.fatalf("terminal step %s (%s) changed: %s %s→%s", s.id, s.state, tr.Event, tr.From, tr.To)
		case s.state != tr.From:
			h.fatalf("step %s is %s in the model, but a transition %s starts from %s", s.id, s.state, tr.Event, tr.From)
		}
		s.state = tr.To
		h.stats.add("→" + tr.To.String())
		if tr.To == core.StateFailed {
			if st, ok := h.chk.View(h.o).StepByID(tr.Step); ok {
				h.stats.add("failed " + string(st.Class))
			}
		}
		l := m.leases[s.lease]
		switch {
		case tr.Event == core.EvStart && tr.From == core.StateQueued:
			s.everStarted = true
			if l != nil {
				l.started, l.mustEndBy = true, time.Time{}
			}
		case tr.Event == core.EvStart && l != nil:
			l.mustEndBy, l.holdUntil = time.Time{}, time.Time{}
		case tr.Event == core.EvRecover && l != nil:
			g := h.graceOf(l.worker)
			l.holdUntil, l.mustEndBy = h.now.Add(g), h.now.Add(g)
		case tr.To == core.StateCancelling && l != nil:
			l.mustEndBy, l.holdUntil = h.now.Add(m.cfg.ForceCancel), time.Time{}
		}
		if spec.Terminal(tr.To) || tr.Event == core.EvRequeue {
			m.end(s.lease)
		}
	}
	// 2. Ends the action itself implies.
	for _, id := range ex.end {
		m.end(id)
	}
	// 3. Lease records: ends the model did not derive are learned only when
	// a timer could have fired; anything else is a lease lost for no reason.
	recs := map[core.LeaseID]core.LeaseRecord{}
	for _, r := range rd.Records {
		if !strings.HasPrefix(r.Key, core.KindLease+"/") {
			continue
		}
		var lr core.LeaseRecord
		if r.Delete {
			// Only archival deletes a lease (SPEC §7a): its last state is
			// in its run's history record, written by the same batch.
			var id core.LeaseID
			fmt.Sscanf(strings.TrimPrefix(r.Key, core.KindLease+"/"), "%d", &id)
			al, ok := h.chk.Archive().Lease(id)
			if !ok {
				h.fatalf("lease record %s was deleted, and no history record of the batch holds it", r.Key)
			}
			lr = al
		} else {
			v, err := core.DecodeRecord(r)
			if err != nil {
				h.fatalf("lease record %s does not decode: %v", r.Key, err)
			}
			lr = *v.(*core.LeaseRecord)
		}
		recs[lr.ID] = lr
		if ml := m.leases[lr.ID]; ml != nil && ml.current && !lr.Current {
			if !ex.learn {
				h.fatalf("lease %d (step %s, worker %s) lost its authority (%q) in a batch with no cause to end it", lr.ID, lr.Step, lr.Worker, lr.EndReason)
			}
			m.end(lr.ID)
			h.stats.add("lease ended by a timer")
		}
	}
	// 4. Grants: every Dispatch is a new lease with a strictly greater id, to
	// a connected, unrevoked worker with a free slot, for a queued step that
	// holds no other current lease and, if write-bearing, never started.
	for _, e := range rd.Messages {
		d, ok := e.Msg.(core.Dispatch)
		if !ok {
			continue
		}
		h.stats.add("grant")
		w := h.byConn[e.Conn]
		s := m.steps[d.Step]
		switch {
		case d.Lease <= m.maxLease:
			h.fatalf("lease %d granted after lease %d: lease ids must strictly increase", d.Lease, m.maxLease)
		case w == nil:
			h.fatalf("lease %d dispatched on connection %d, which no connected worker holds", d.Lease, e.Conn)
		case w.revoked:
			h.fatalf("lease %d granted to revoked worker %s", d.Lease, w.id)
		case s == nil:
			h.fatalf("lease %d granted for unknown step %s", d.Lease, d.Step)
		case s.state != core.StateQueued:
			h.fatalf("lease %d granted for step %s in state %s", d.Lease, s.id, s.state)
		case s.lease != 0:
			h.fatalf("lease %d granted for step %s, which still holds current lease %d: at most one current lease per step", d.Lease, s.id, s.lease)
		case s.writes && s.everStarted:
			h.fatalf("lease %d granted for write-bearing step %s, which already started", d.Lease, s.id)
		case s.grants >= m.cfg.MaxAttempts:
			h.fatalf("lease %d is grant %d of step %s, over the cap of %d", d.Lease, s.grants+1, s.id, m.cfg.MaxAttempts)
		case d.Writes != s.writes:
			h.fatalf("lease %d of step %s says writes=%v, the run declared %v", d.Lease, s.id, d.Writes, s.writes)
		case len(m.leasesOf(w.id)) >= w.slots:
			h.fatalf("lease %d granted to worker %s, which holds %v with %d slots", d.Lease, w.id, m.leasesOf(w.id), w.slots)
		}
		m.maxLease = d.Lease
		s.grants++
		s.lease = d.Lease
		m.leases[d.Lease] = &mLease{id: d.Lease, step: d.Step, worker: w.id, current: true,
			mustEndBy: h.now.Add(m.cfg.DispatchAck)}
		h.leases = append(h.leases, d.Lease)
		h.disp[d.Lease] = d
	}
	// 5. Every lease record of the batch agrees with the model.
	for _, id := range slices.Sorted(maps.Keys(recs)) {
		lr, ml := recs[id], m.leases[id]
		switch {
		case ml == nil:
			h.fatalf("lease record %d (step %s) appeared without a Dispatch", id, lr.Step)
		case lr.Current && !ml.current:
			h.fatalf("lease %d of step %s is current again: leases never resurrect", id, lr.Step)
		case !lr.Current && ml.current:
			h.fatalf("lease %d of step %s ended (%q), the model holds it current", id, lr.Step, lr.EndReason)
		case lr.Worker != ml.worker || lr.Step != ml.step:
			h.fatalf("lease %d is recorded as (%s, %s), granted as (%s, %s)", id, lr.Step, lr.Worker, ml.step, ml.worker)
		}
	}
	// 6. Leases the action must leave alone.
	if !ex.learn {
		for _, id := range ex.stay {
			if !m.leases[id].current {
				h.fatalf("lease %d lost its authority, but this action must leave it current", id)
			}
		}
	}
	h.observeClosed(rd, ex)
}

// observeClosed follows archival and the closed-lease table (SPEC §7a): a
// history record's leases enter the table; every drop the table's log
// records is one a rule allows (a Hello of the worker not listing the lease,
// a heartbeat not listing a lease it showed it held, in a batch where the
// sweep may run: its worker revoked or the time bound past), and the
// listing's drops all happen.
func (h *harness) observeClosed(rd core.Ready, ex expect) {
	m := h.m
	now := map[core.LeaseID]bool{} // archived by this batch: after its input was handled
	for _, r := range rd.Records {
		if !core.IsHistoryKey(r.Key) || r.Delete {
			continue
		}
		v, err := core.DecodeRecord(r)
		hist, ok := v.(*core.RunHistory)
		if err != nil || !ok {
			h.fatalf("history record %s does not decode: %v", r.Key, err)
		}
		h.stats.add("run archived")
		for _, l := range hist.Leases {
			ml := m.leases[l.ID]
			if ml == nil || ml.current || ml.archived {
				h.fatalf("run %s archived lease %d, which the model holds as %+v", hist.Run.ID, l.ID, ml)
			}
			ml.archived, ml.held, ml.closedAt = true, ml.started || len(ml.answers) > 0, h.now
			now[l.ID] = true
		}
	}
	listed := map[core.LeaseID]bool{}
	if ex.listing != nil {
		for _, r := range ex.listing.inflight {
			listed[r.Lease] = true
		}
	}
	for _, r := range rd.Records {
		if !strings.HasPrefix(r.Key, core.KindClosed+"/") || r.Delete {
			continue
		}
		v, err := core.DecodeRecord(r)
		ch, ok := v.(*core.ClosedChunk)
		if err != nil || !ok {
			h.fatalf("closed-lease record %s does not decode: %v", r.Key, err)
		}
		for _, id := range ch.Drops {
			ml := m.leases[id]
			if ml == nil || !ml.archived || ml.dropped {
				h.fatalf("the closed-lease table dropped lease %d, which the model holds as %+v", id, ml)
			}
			byListing := ex.listing != nil && ex.listing.worker == ml.worker && !listed[id] && (ex.listing.fresh || ml.held)
			var w *hWorker
			for _, hw := range h.ws {
				if hw.id == ml.worker {
					w = hw
				}
			}
			from := time.Unix(max(ml.closedAt.Unix(), m.restoredAt.Unix()), 0)
			bySweep := ex.learn && (w == nil || w.revoked || h.action == "RevokeToken" ||
				!h.now.Before(from.Add(h.cfg.CredentialTTL+h.cfg.HeartbeatTimeout+h.graceOf(ml.worker))))
			if !byListing && !bySweep {
				h.fatalf("the closed-lease table dropped lease %d of worker %s (held=%v), which no rule of SPEC §7a allows now", id, ml.worker, ml.held)
			}
			ml.dropped = true
			h.stats.add("closed-lease entry dropped")
		}
	}
	if ex.listing == nil {
		return
	}
	for _, id := range slices.Sorted(maps.Keys(m.leases)) {
		ml := m.leases[id]
		if !ml.archived || ml.dropped || ml.worker != ex.listing.worker || now[id] {
			continue
		}
		switch {
		case listed[id]:
			ml.held = true
		case ex.listing.fresh || ml.held:
			h.fatalf("worker %s's %s does not list lease %d (held=%v), yet its closed-lease entry was kept", ml.worker, ex.listing.kind(), id, ml.held)
		}
	}
}

// listing is a Hello (fresh) or heartbeat's in-flight list.
type listing struct {
	worker   core.WorkerID
	inflight []core.LeaseRef
	fresh    bool
}

func (l *listing) kind() string {
	if l.fresh {
		return "Hello"
	}
	return "heartbeat"
}

func (h *harness) graceOf(id core.WorkerID) time.Duration {
	for _, w := range h.ws {
		if w.id == id {
			return w.grace
		}
	}
	return 0
}

// deliver hands the batch's messages to the workers whose connections are
// open, telling the checker first (a worker acts on a message only after it
// arrived), and plays the workers' side: a no-write process starts at
// Dispatch, a write-bearing one at StartAck{ok}; any answer or cancel ends
// the worker's hold on a lease.
func (h *harness) deliver(rd core.Ready) {
	for _, e := range rd.Messages {
		w := h.byConn[e.Conn]
		if w == nil {
			continue
		}
		h.chk.Delivered(h.now, w.id, e.Msg)
		switch m := e.Msg.(type) {
		case core.Welcome:
			if m.Credential != "" { // enrollment: a reconnect does not slide the expiry
				w.cred = m.Credential
				w.credLB = h.now.Add(m.CredentialTTL)
			}
			for _, l := range m.Cancel {
				h.drop(w, l)
			}
		case core.Refreshed:
			w.credLB = h.now.Add(m.TTL)
		case core.Dispatch:
			w.held[m.Lease] = true
			if !m.Writes {
				w.proc[m.Lease] = true
				h.chk.ProcessStarted(h.now, w.id, m.Lease, m.Step, false)
			}
		case core.StartAck:
			d := h.disp[m.Lease]
			switch {
			case !w.held[m.Lease]:
			case !m.OK:
				h.drop(w, m.Lease)
			case d.Writes && !w.proc[m.Lease]:
				w.proc[m.Lease] = true
				h.chk.ProcessStarted(h.now, w.id, m.Lease, d.Step, true)
				h.chk.ExternalWrite(h.now, w.id, m.Lease, d.Step)
			}
		case core.Answer:
			h.drop(w, m.Lease)
		case core.Cancel:
			// The worker stops the process and will report how it ended.
			if w.held[m.Lease] {
				w.stop[m.Lease] = true
			}
		case core.Close, core.Refused:
			delete(h.byConn, e.Conn)
			if w.conn == e.Conn {
				w.conn = 0
			}
		}
	}
}

func (h *harness) drop(w *hWorker, l core.LeaseID) {
	delete(w.held, l)
	delete(w.stop, l)
	if w.proc[l] {
		delete(w.proc, l)
		h.chk.ProcessStopped(h.now, w.id, l)
	}
}

// check runs after every action: the checker, then the whole orchestrator
// against the model.
func (h *harness) check(t *rapid.T) {
	if v := h.chk.Check(); v != nil {
		h.fatalf("spec.Checker: %v", v)
	}
	m := h.m
	perStep := map[core.StepID]core.LeaseID{}
	seen := 0
	v := h.chk.View(h.o) // live and archived (SPEC §7a): the model keeps every lease and step
	for _, l := range v.Leases() {
		ml := m.leases[l.ID]
		if ml == nil {
			h.fatalf("the orchestrator holds lease %d (step %s), which was never dispatched", l.ID, l.Step)
		}
		seen++
		if l.Current != ml.current || l.Worker != ml.worker || l.Step != ml.step || l.Committed != ml.committed {
			h.fatalf("lease %d: orchestrator says current=%v committed=%v (%s, %s), model says current=%v committed=%v (%s, %s)",
				l.ID, l.Current, l.Committed, l.Step, l.Worker, ml.current, ml.committed, ml.step, ml.worker)
		}
		if l.Current {
			if other, dup := perStep[l.Step]; dup {
				h.fatalf("step %s holds two current leases, %d and %d", l.Step, other, l.ID)
			}
			perStep[l.Step] = l.ID
		}
	}
	if seen != len(m.leases) {
		h.fatalf("the orchestrator holds %d leases, %d were dispatched", seen, len(m.leases))
	}
	for _, id := range slices.Sorted(maps.Keys(m.steps)) {
		ms := m.steps[id]
		s, ok := v.StepByID(id)
		switch {
		case !ok:
			h.fatalf("step %s vanished", id)
		case s.State != ms.state:
			h.fatalf("step %s is %s, its transitions lead to %s", id, s.State, ms.state)
		case s.Lease != ms.lease:
			h.fatalf("step %s names lease %d as current, the model %d", id, s.Lease, ms.lease)
		case s.Attempts != ms.grants:
			h.fatalf("step %s counts %d attempts, %d leases were dispatched", id, s.Attempts, ms.grants)
		case ms.outcome == nil && s.Outcome != nil:
			h.fatalf("step %s shows outcome %+v that was never answered COMMITTED", id, *s.Outcome)
		case ms.outcome != nil && (s.Outcome == nil || *s.Outcome != *ms.outcome):
			h.fatalf("step %s lost or changed its committed outcome %+v (shows %v)", id, *ms.outcome, s.Outcome)
		case ms.outcome != nil && s.State != core.StateSuccess && s.State != core.StateFailed:
			h.fatalf("step %s committed %+v but is %s", id, *ms.outcome, s.State)
		}
	}
	// The cascade and the cross-level ready queue (SPEC §2): a pending step
	// has no dependency that ended other than success, and is promoted the
	// moment every dependency succeeded (these runs have no gates).
	for _, id := range slices.Sorted(maps.Keys(m.steps)) {
		ms := m.steps[id]
		if ms.state != core.StatePending {
			continue
		}
		ready := true
		for _, d := range ms.deps {
			ds := m.steps[d].state
			if spec.Terminal(ds) && ds != core.StateSuccess {
				h.fatalf("step %s is still pending although its dependency %s is %s: it must be skipped", id, d, ds)
			}
			ready = ready && ds == core.StateSuccess
		}
		if ready {
			h.fatalf("step %s is still pending although every dependency succeeded", id)
		}
	}
	// Fence: only a current lease of its own, unrevoked worker may write.
	// Each lease is asked for by its owner and by one other worker.
	for i, l := range h.leases {
		ml := m.leases[l]
		for k, w := range h.ws {
			if w.id != ml.worker && k != i%len(h.ws) {
				continue
			}
			want := ml.current && ml.worker == w.id && !w.revoked
			if err := h.o.Fence(w.id, l); (err == nil) != want {
				h.fatalf("Fence(%s, %d) = %v, the model says allowed=%v", w.id, l, err, want)
			}
		}
	}
}

// ---- actions ----

func (h *harness) nextCall() core.CallID { h.call++; return h.call }
func (h *harness) nextReq() uint64       { h.req++; return h.req }

func (h *harness) newConn(w *hWorker) core.ConnID {
	h.conn++
	w.conn = h.conn
	h.byConn[h.conn] = w
	return h.conn
}

func (h *harness) connected() []*hWorker {
	var ws []*hWorker
	for _, w := range h.ws {
		if w.conn != 0 {
			ws = append(ws, w)
		}
	}
	return ws
}

// pickConnected draws a connected worker, or nil when none is.
func (h *harness) pickConnected(t *rapid.T) *hWorker {
	ws := h.connected()
	if len(ws) == 0 {
		h.stats.add("no connected worker")
		return nil
	}
	return ws[rapid.IntRange(0, len(ws)-1).Draw(t, "worker")]
}

// pickHolder draws a connected worker that holds a lease, or nil.
func (h *harness) pickHolder(t *rapid.T) *hWorker {
	var ws []*hWorker
	for _, w := range h.connected() {
		if len(w.held) > 0 {
			ws = append(ws, w)
		}
	}
	if len(ws) == 0 {
		return nil
	}
	return ws[rapid.IntRange(0, len(ws)-1).Draw(t, "worker")]
}

// pickLease draws a lease: usually one the worker holds, else one it was
// ever granted, any lease ever dispatched, or a lease id nobody was granted.
func (h *harness) pickLease(t *rapid.T, w *hWorker) core.LeaseID {
	held := slices.Sorted(maps.Keys(w.held))
	var mine []core.LeaseID
	for _, l := range h.leases {
		if h.m.leases[l].worker == w.id {
			mine = append(mine, l)
		}
	}
	switch k := rapid.IntRange(0, 9).Draw(t, "lease kind"); {
	case k < 5 && len(held) > 0:
		return held[rapid.IntRange(0, len(held)-1).Draw(t, "held lease")]
	case k < 7 && len(mine) > 0:
		return mine[rapid.IntRange(0, len(mine)-1).Draw(t, "own lease")]
	case k < 9 && len(h.leases) > 0:
		return h.leases[rapid.IntRange(0, len(h.leases)-1).Draw(t, "any lease")]
	}
	return h.m.maxLease + core.LeaseID(rapid.IntRange(1, 3).Draw(t, "unknown lease"))
}

func (h *harness) stepOf(l core.LeaseID) core.StepID {
	if d, ok := h.disp[l]; ok {
		return d.Step
	}
	return core.StepID(fmt.Sprintf("run-1/ghost%d", l))
}

var stepNames = []string{"a", "b", "c", "d"}

// submit submits a small DAG; now and then an invalid one, which must be
// refused and create nothing.
func (h *harness) submit(t *rapid.T) {
	n := rapid.IntRange(1, 3).Draw(t, "steps")
	var specs []core.StepSpec
	for i := 0; i < n; i++ {
		s := core.StepSpec{Name: stepNames[i], Command: "run " + stepNames[i], Writes: rapid.Bool().Draw(t, "writes")}
		for j := 0; j < i; j++ {
			if rapid.IntRange(0, 2).Draw(t, "dep") == 0 {
				s.DependsOn = append(s.DependsOn, stepNames[j])
			}
		}
		if rapid.IntRange(0, 7).Draw(t, "gpu") == 7 {
			s.Tags = []string{"gpu"}
		}
		specs = append(specs, s)
	}
	invalid := rapid.IntRange(0, 9).Draw(t, "invalid") == 9
	if invalid {
		specs = append(specs, core.StepSpec{Name: specs[0].Name, Command: "again"})
	}
	h.t.Logf("submit %s", describeSpecs(specs))
	before := len(h.chk.View(h.o).RunIDs()) // live and archived: a due timer may archive a run in the batch
	// Runs are numbered in submission order (SPEC §2): the model knows the
	// id, and so the steps, before the batch.
	run := core.RunID(fmt.Sprintf("run-%d", len(h.runs)+1))
	if !invalid {
		for _, s := range specs {
			id := core.StepID(string(run) + "/" + s.Name)
			ms := &mStep{id: id, run: run, writes: s.Writes, state: core.StatePending}
			for _, d := range s.DependsOn {
				ms.deps = append(ms.deps, core.StepID(string(run)+"/"+d))
			}
			h.m.steps[id] = ms
		}
	}
	rd := h.step(core.Submit{Call: h.nextCall(), Spec: core.RunSpec{Name: "r", Steps: specs}}, expect{})
	if len(rd.Answers) != 1 {
		h.fatalf("submit got %d answers", len(rd.Answers))
	}
	a := rd.Answers[0]
	if invalid {
		if a.Err == "" || a.Run != "" || len(h.chk.View(h.o).RunIDs()) != before {
			h.fatalf("an invalid run was accepted: %+v", a)
		}
		return
	}
	if a.Err != "" || a.Run != run {
		h.fatalf("a valid run was answered %+v, want run %s", a, run)
	}
	h.runs = append(h.runs, run)
}

func describeSpecs(specs []core.StepSpec) string {
	var parts []string
	for _, s := range specs {
		d := s.Name
		if s.Writes {
			d += "(w)"
		}
		if len(s.DependsOn) > 0 {
			d += "<-" + strings.Join(s.DependsOn, ",")
		}
		if len(s.Tags) > 0 {
			d += "[" + strings.Join(s.Tags, ",") + "]"
		}
		parts = append(parts, d)
	}
	return strings.Join(parts, " ")
}

// enroll creates a token and enrolls a new worker instance with it.
func (h *harness) enroll(t *rapid.T, draw bool) {
	if len(h.ws) >= 8 {
		return
	}
	w := &hWorker{id: core.WorkerID(fmt.Sprintf("w%d", len(h.ws)+1)), slots: 1, grace: 120 * time.Second,
		held: map[core.LeaseID]bool{}, proc: map[core.LeaseID]bool{}, stop: map[core.LeaseID]bool{}}
	if draw {
		w.slots = rapid.IntRange(1, 2).Draw(t, "slots")
		switch rapid.IntRange(0, 5).Draw(t, "kind") {
		case 3:
			w.scaler, w.grace = true, 0
		case 4:
			w.grace = 0 // --no-reconnect
		case 5:
			w.grace = 20 * time.Second
		}
		if rapid.IntRange(0, 3).Draw(t, "gpu worker") == 3 {
			w.tags = []string{"gpu"}
		}
	}
	h.secret++
	tok := &hToken{name: "tok" + string(w.id)}
	rd := h.step(core.CreateToken{Call: h.nextCall(), Name: tok.name, TTL: time.Hour, Secret: [16]byte{h.secret}}, expect{})
	if len(rd.Answers) != 1 || rd.Answers[0].Err != "" {
		h.fatalf("CreateToken: %+v", rd.Answers)
	}
	tok.str = rd.Answers[0].Token
	h.tokens = append(h.tokens, tok)
	h.ws = append(h.ws, w)
	w.token = tok.name
	h.t.Logf("enroll %s slots=%d scaler=%v grace=%s tags=%v", w.id, w.slots, w.scaler, w.grace, w.tags)
	c := h.newConn(w)
	hello := core.Hello{Version: core.ProtocolVersion, Token: tok.str, Worker: w.id, Name: string(w.id),
		Tags: w.tags, Slots: w.slots, Scaler: w.scaler, MaxDelay: w.grace / 2}
	rd = h.step(core.Received{Conn: c, Msg: hello, Entropy: [16]byte{byte(c), 0xee}}, expect{})
	if w.cred == "" {
		h.fatalf("a fresh token did not enroll worker %s: %v", w.id, describeMsgs(rd))
	}
	tok.consumed, tok.worker = true, w
}

// enrollReplay tries to enroll a new instance with a consumed or revoked
// token (or a forged one): it must be refused and change nothing.
func (h *harness) enrollReplay(t *rapid.T) {
	tok := h.tokens[rapid.IntRange(0, len(h.tokens)-1).Draw(t, "token")]
	str := tok.str
	if rapid.Bool().Draw(t, "forged") {
		str = tok.name + "." + strings.Repeat("0", 32)
	} else if !tok.consumed && !tok.revoked {
		return
	}
	w := &hWorker{id: core.WorkerID(fmt.Sprintf("x%d", h.conn+1)), held: map[core.LeaseID]bool{}, proc: map[core.LeaseID]bool{}, stop: map[core.LeaseID]bool{}}
	h.t.Logf("enroll %s with used/revoked/forged token %s", w.id, tok.name)
	c := h.newConn(w)
	due := h.timersDue()
	rd := h.produce(core.Received{Conn: c, Msg: core.Hello{Version: core.ProtocolVersion, Token: str, Worker: w.id, Slots: 1, MaxDelay: time.Minute}})
	refused := false
	for _, e := range rd.Messages {
		if r, ok := e.Msg.(core.Refused); ok && e.Conn == c && r.Fatal {
			refused = true
		}
	}
	if !refused || (len(rd.Records) > 0 && !due) {
		h.fatalf("a consumed, revoked or forged token enrolled %s (or changed state): %v", w.id, describeMsgs(rd))
	}
	h.land(rd, expect{})
	delete(h.byConn, c)
}

// reconnect dials a known worker again with its credential and an in-flight
// list: a random subset of what it holds, perhaps with a lease it does not.
func (h *harness) reconnect(t *rapid.T) {
	var back []*hWorker
	for _, w := range h.ws {
		if w.conn == 0 && !w.revoked && !w.scaler {
			back = append(back, w)
		}
	}
	w := h.ws[rapid.IntRange(0, len(h.ws)-1).Draw(t, "worker")]
	if len(back) > 0 && rapid.IntRange(0, 4).Draw(t, "any worker") < 4 {
		w = back[rapid.IntRange(0, len(back)-1).Draw(t, "returning worker")]
	}
	var inflight []core.LeaseRef
	for _, l := range slices.Sorted(maps.Keys(w.held)) {
		if rapid.IntRange(0, 4).Draw(t, "forget held") < 4 {
			inflight = append(inflight, core.LeaseRef{Step: h.stepOf(l), Lease: l})
		}
	}
	if len(h.leases) > 0 && rapid.IntRange(0, 3).Draw(t, "stray") == 3 {
		l := h.leases[rapid.IntRange(0, len(h.leases)-1).Draw(t, "stray lease")]
		if !slices.ContainsFunc(inflight, func(r core.LeaseRef) bool { return r.Lease == l }) {
			inflight = append(inflight, core.LeaseRef{Step: h.stepOf(l), Lease: l})
		}
	}
	wasConnected := w.conn != 0
	h.t.Logf("reconnect %s (connected=%v) in-flight %v", w.id, wasConnected, inflight)

	// The model's prediction, against the state before the batch.
	m := h.m
	// A Hello listing more than the worker's slots + ahead (none here) is
	// refused (SPEC §12): a real worker never holds more.
	overListed := len(inflight) > w.slots
	mustWelcome := !w.revoked && !w.scaler && h.now.Before(w.credLB) && w.cred != "" && !overListed
	var ex expect
	if wasConnected && w.grace == 0 {
		// The old connection is superseded: a no-grace disconnect first.
		ex.end = append(ex.end, m.leasesOf(w.id)...)
	}
	gone := map[core.LeaseID]bool{}
	for _, l := range ex.end {
		gone[l] = true
	}
	var wantCancel []core.LeaseID
	reported := map[core.LeaseID]bool{}
	for _, r := range inflight {
		ml := m.leases[r.Lease]
		if ml != nil && ml.committed && !ml.dropped && ml.worker == w.id && ml.step == r.Step {
			continue // its answer was lost: the re-sent report gets COMMITTED again
		}
		if ml == nil || ml.dropped || ml.worker != w.id || ml.step != r.Step || !ml.current || gone[r.Lease] {
			wantCancel = append(wantCancel, r.Lease)
			continue
		}
		reported[r.Lease] = true
	}
	slices.Sort(wantCancel)
	var lost, stay []core.LeaseID
	for _, l := range m.leasesOf(w.id) {
		if gone[l] {
			continue
		}
		if reported[l] {
			stay = append(stay, l)
		} else {
			lost = append(lost, l)
		}
	}
	preState := map[core.LeaseID]core.State{}
	for _, l := range stay {
		preState[l] = m.steps[m.leases[l].step].state
	}

	old := w.conn
	c := h.newConn(w)
	hello := core.Hello{Version: core.ProtocolVersion, Credential: w.cred, Worker: w.id, Name: string(w.id),
		Tags: w.tags, Slots: w.slots, Scaler: w.scaler, MaxDelay: w.grace / 2, InFlight: inflight}
	due := h.timersDue() // a timer due now fires after the Hello, in the same batch
	rd := h.produce(core.Received{Conn: c, Msg: hello})
	var welcome *core.Welcome
	for _, e := range rd.Messages {
		if wm, ok := e.Msg.(core.Welcome); ok && e.Conn == c {
			welcome = &wm
		}
	}
	if welcome == nil {
		// Refused: the lease table must not change, and the old connection,
		// if any, stays.
		h.land(rd, expect{stay: m.currentLeases()})
		if mustWelcome {
			h.fatalf("worker %s with a valid credential was not welcomed back: %v", w.id, describeMsgs(rd))
		}
		if old != 0 {
			w.conn = old
		}
		return
	}
	if overListed {
		h.fatalf("worker %s (%d slots) was welcomed back with %d leases in flight: %v", w.id, w.slots, len(inflight), describeMsgs(rd))
	}
	// Welcomed: a no-grace supersede and the leases it did not report end;
	// the reported current ones stay.
	h.land(rd, expect{end: append(ex.end, lost...), stay: stay, listing: &listing{worker: w.id, inflight: inflight, fresh: true}})
	if w.revoked || w.scaler {
		h.fatalf("worker %s (revoked=%v scaler=%v) was welcomed back", w.id, w.revoked, w.scaler)
	}
	if due {
		return
	}
	if !slices.Equal(welcome.Cancel, wantCancel) {
		h.fatalf("Welcome.Cancel = %v, the model says the reported leases that are not current (and not committed to it) are %v", welcome.Cancel, wantCancel)
	}
	if len(welcome.Cancel) > 0 {
		h.stats.add("welcome with cancels")
	}
	for _, l := range stay {
		s := m.steps[m.leases[l].step]
		if preState[l] == core.StateRecovering && s.state != core.StateRunning {
			h.fatalf("reported lease %d of recovering step %s was not reclaimed (step is %s)", l, s.id, s.state)
		}
	}
}

func (h *harness) disconnect(t *rapid.T) {
	w := h.pickConnected(t)
	if w == nil {
		return
	}
	h.t.Logf("disconnect %s", w.id)
	c := w.conn
	var ex expect
	if w.scaler || w.grace == 0 {
		ex.end = h.m.leasesOf(w.id) // no grace: triaged at once
	} else {
		ex.stay = h.m.leasesOf(w.id) // held for the grace window
	}
	delete(h.byConn, c)
	w.conn = 0
	h.step(core.Disconnected{Conn: c}, ex)
}

func (h *harness) start(t *rapid.T) {
	w := h.pickHolder(t)
	if w == nil {
		w = h.pickConnected(t)
	}
	if w == nil {
		return
	}
	h.startLease(w, h.pickLease(t, w))
}

// startLease sends Start for lease l from w and judges the StartAck.
func (h *harness) startLease(w *hWorker, l core.LeaseID) {
	req := h.nextReq()
	want := h.m.startOK(w.id, l)
	h.t.Logf("%s: Start lease %d request %d", w.id, l, req)
	rd := h.step(core.Received{Conn: w.conn, Msg: core.Start{Lease: l, Request: req}}, expect{})
	got := h.findStartAck(rd, w, l, req)
	if got == nil {
		h.fatalf("Start of lease %d got no StartAck", l)
	}
	if got.OK != want {
		h.fatalf("Start of lease %d by %s: StartAck ok=%v (%q), the model says %v", l, w.id, got.OK, got.Reason, want)
	}
	if ml := h.m.leases[l]; ml != nil && ml.archived && !ml.dropped && ml.worker == w.id {
		ml.held = true
	}
	if got.OK {
		h.stats.add("StartAck ok")
		if ml := h.m.leases[l]; !ml.started {
			h.fatalf("StartAck{ok} for lease %d, but no START was recorded under it", l)
		}
	}
}

func (h *harness) findStartAck(rd core.Ready, w *hWorker, l core.LeaseID, req uint64) *core.StartAck {
	for _, e := range rd.Messages {
		if a, ok := e.Msg.(core.StartAck); ok && a.Lease == l && a.Request == req {
			if e.Conn != w.conn && w.conn != 0 {
				h.fatalf("StartAck for lease %d went to connection %d, not %d", l, e.Conn, w.conn)
			}
			return &a
		}
	}
	return nil
}

func (h *harness) reject(t *rapid.T) {
	w := h.pickConnected(t)
	if w == nil {
		return
	}
	l := h.pickLease(t, w)
	ml := h.m.leases[l]
	var ex expect
	if ml != nil && ml.current && ml.worker == w.id && h.m.steps[ml.step].state == core.StateQueued {
		ex.end = []core.LeaseID{l}
	} else if ml != nil && ml.current {
		ex.stay = []core.LeaseID{l}
	}
	h.t.Logf("%s: RejectDispatch lease %d (ends=%v)", w.id, l, len(ex.end) > 0)
	h.drop(w, l)
	h.step(core.Received{Conn: w.conn, Msg: core.RejectDispatch{Lease: l, Reason: "busy"}}, ex)
}

var outcomes = []core.Outcome{
	{Status: core.OutcomeSuccess},
	{Status: core.OutcomeSuccess},
	{Status: core.OutcomeFailure, ExitCode: 2, Message: "boom"},
	{Status: core.OutcomeCancelled, ExitCode: 143},
	{Status: core.OutcomeCleanupFailed, Message: "rm failed"},
	{Status: core.OutcomeTimedOut, ExitCode: 143, Message: "stopped at its timeout"},
}

// reportOwn reports one of the worker's own leases with a fresh request id.
func (h *harness) reportOwn(t *rapid.T) {
	w := h.pickHolder(t)
	if w == nil {
		return
	}
	held := slices.Sorted(maps.Keys(w.held))
	l := held[rapid.IntRange(0, len(held)-1).Draw(t, "held lease")]
	if stopped := slices.Sorted(maps.Keys(w.stop)); len(stopped) > 0 && rapid.Bool().Draw(t, "a stopped one") {
		l = stopped[rapid.IntRange(0, len(stopped)-1).Draw(t, "stopped lease")]
	}
	if !w.proc[l] && !w.stop[l] && rapid.IntRange(0, 3).Draw(t, "start first") > 0 {
		// A well-behaved worker runs the start handshake before reporting.
		h.startLease(w, l)
		return
	}
	oc := outcomes[rapid.IntRange(0, len(outcomes)-1).Draw(t, "outcome")]
	if w.stop[l] && rapid.IntRange(0, 3).Draw(t, "stopped") > 0 {
		// Stopped by the Cancel, its cleanup failed, or it finished first.
		oc = outcomes[rapid.SampledFrom([]int{3, 4, 0}).Draw(t, "stop outcome")]
	}
	h.report(w, core.Report{Step: h.stepOf(l), Lease: l, Request: h.nextReq(), Outcome: oc})
}

// reportAny is an adversarial report: any lease (another worker's, a dead
// one, an unknown id), sometimes naming another step, sometimes malformed.
func (h *harness) reportAny(t *rapid.T) {
	w := h.pickConnected(t)
	if w == nil {
		return
	}
	l := h.pickLease(t, w)
	r := core.Report{Step: h.stepOf(l), Lease: l, Request: h.nextReq(),
		Outcome: outcomes[rapid.IntRange(0, len(outcomes)-1).Draw(t, "outcome")]}
	switch rapid.IntRange(0, 9).Draw(t, "twist") {
	case 7:
		r.Request = 0
	case 8:
		// Out of range whatever statuses are added at the end of the list.
		r.Outcome.Status = core.OutcomeStatus(rapid.SampledFrom([]int{0, 100, 200}).Draw(t, "bad status"))
	case 9:
		if len(h.leases) > 0 {
			r.Step = h.stepOf(h.leases[rapid.IntRange(0, len(h.leases)-1).Draw(t, "other step")])
		}
	}
	h.report(w, r)
}

// reportDup re-sends an earlier report exactly (a network duplicate or a
// retry), from the worker that sent it — after restarts too.
func (h *harness) reportDup(t *rapid.T) {
	if len(h.sent) == 0 {
		return
	}
	s := h.sent[rapid.IntRange(0, len(h.sent)-1).Draw(t, "earlier report")]
	if s.w.conn == 0 {
		return
	}
	h.report(s.w, s.r)
}

// reportConflict re-uses an earlier report's lease with another outcome,
// under the same request id or a fresh one.
func (h *harness) reportConflict(t *rapid.T) {
	if len(h.sent) == 0 {
		return
	}
	s := h.sent[rapid.IntRange(0, len(h.sent)-1).Draw(t, "earlier report")]
	if s.w.conn == 0 {
		return
	}
	r := s.r
	oc := outcomes[rapid.IntRange(0, len(outcomes)-1).Draw(t, "outcome")]
	if oc == r.Outcome {
		oc.ExitCode++
	}
	r.Outcome = oc
	if rapid.Bool().Draw(t, "fresh request") {
		r.Request = h.nextReq()
	}
	h.report(s.w, r)
}

// report sends r from w and judges its one answer against the model.
func (h *harness) report(w *hWorker, r core.Report) {
	h.t.Helper()
	m := h.m
	p := m.predictReport(w.id, r)
	var prevAnswer *mAnswer
	if ml := m.leases[r.Lease]; ml != nil && ml.worker == w.id && ml.step == r.Step {
		for i := range ml.answers {
			if ml.answers[i].request == r.Request && ml.answers[i].outcome == r.Outcome {
				prevAnswer = &ml.answers[i]
			}
		}
	}
	h.t.Logf("%s: Report lease %d step %s request %d %s/%d → model: %s (%s)", w.id, r.Lease, r.Step, r.Request,
		r.Outcome.Status, r.Outcome.ExitCode, p.verdict, p.why)
	var ex expect
	if ml := m.leases[r.Lease]; ml != nil && ml.current && !p.commit && !p.hasAfter {
		ex.stay = []core.LeaseID{r.Lease}
	}
	conn := w.conn
	rd := h.step(core.Received{Conn: conn, Msg: r}, ex)
	var got []core.Answer
	for _, e := range rd.Messages {
		if a, ok := e.Msg.(core.Answer); ok && a.Lease == r.Lease && a.Request == r.Request {
			if e.Conn != conn {
				h.fatalf("the answer to a report on connection %d went to connection %d", conn, e.Conn)
			}
			got = append(got, a)
		}
	}
	if len(got) != 1 {
		h.fatalf("report got %d answers, exactly one is due: %v", len(got), got)
	}
	a := got[0]
	h.stats.add("answer " + a.Verdict.String())
	h.stats.add("answer " + a.Verdict.String() + ": " + p.why)
	if a.Verdict != p.verdict {
		h.fatalf("report (lease %d, request %d, %s) answered %s (%q); the model says %s (%s)",
			r.Lease, r.Request, r.Outcome.Status, a.Verdict, a.Reason, p.verdict, p.why)
	}
	if prevAnswer != nil && prevAnswer.verdict == core.Committed {
		h.stats.add("duplicate answered COMMITTED again")
	}
	h.sent = append(h.sent, sentReport{w: w, r: r})
	ml := m.leases[r.Lease]
	if ml != nil && ml.archived && !ml.dropped && ml.worker == w.id && ml.step == r.Step && p.why != "malformed" {
		ml.held = true
		h.stats.add("report answered from the closed-lease table: " + a.Verdict.String())
	}
	if p.record {
		ml.answers = append(ml.answers, mAnswer{request: r.Request, outcome: r.Outcome, verdict: a.Verdict})
	}
	if p.commit {
		s := m.steps[ml.step]
		if s.outcome != nil {
			h.fatalf("step %s committed twice: %+v, then %+v", s.id, *s.outcome, r.Outcome)
		}
		oc := r.Outcome
		s.outcome = &oc
		ml.committed = true
		if ml.current {
			h.fatalf("lease %d committed but is still current", r.Lease)
		}
	}
	if p.hasAfter {
		if s := m.steps[ml.step]; s.state != p.after {
			h.fatalf("after answering %s, step %s is %s; the model says %s", a.Verdict, s.id, s.state, p.after)
		}
	}
}

// heartbeat lists what the worker holds (and perhaps a lease it does not):
// every listed lease that is not its current lease is answered with a
// Cancel, and nothing changes.
func (h *harness) heartbeat(t *rapid.T) {
	w := h.pickConnected(t)
	if w == nil {
		return
	}
	var stray []core.LeaseID
	if len(h.leases) > 0 && rapid.IntRange(0, 2).Draw(t, "stray") == 2 {
		stray = append(stray, h.leases[rapid.IntRange(0, len(h.leases)-1).Draw(t, "stray lease")])
	}
	h.beat(w, stray)
}

// beat sends w's heartbeat listing what it holds plus stray leases.
func (h *harness) beat(w *hWorker, stray []core.LeaseID) {
	var refs []core.LeaseRef
	for _, l := range slices.Sorted(maps.Keys(w.held)) {
		refs = append(refs, core.LeaseRef{Step: h.stepOf(l), Lease: l})
	}
	for _, l := range stray {
		if !w.held[l] {
			refs = append(refs, core.LeaseRef{Step: h.stepOf(l), Lease: l})
		}
	}
	var want []core.LeaseID
	for _, r := range refs {
		if ml := h.m.leases[r.Lease]; ml != nil && ml.committed && !ml.dropped && ml.worker == w.id && ml.step == r.Step {
			continue // its answer is on its way, or will be again
		} else if ml == nil || ml.dropped || ml.worker != w.id || !ml.current {
			want = append(want, r.Lease)
		}
	}
	h.t.Logf("%s: Heartbeat %v", w.id, refs)
	conn := w.conn
	due := h.timersDue()
	rd := h.step(core.Received{Conn: conn, Msg: core.Heartbeat{InFlight: refs}}, expect{stay: h.m.leasesOf(w.id),
		listing: &listing{worker: w.id, inflight: refs}})
	if due {
		return
	}
	var got []core.LeaseID
	for _, e := range rd.Messages {
		if c, ok := e.Msg.(core.Cancel); ok && e.Conn == conn {
			got = append(got, c.Lease)
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		h.fatalf("heartbeat listing %v got cancels for %v; the model says %v", refs, got, want)
	}
}

func (h *harness) refresh(t *rapid.T) {
	if w := h.pickConnected(t); w != nil {
		h.refreshOf(w)
	}
}

func (h *harness) refreshOf(w *hWorker) {
	h.t.Logf("%s: Refresh", w.id)
	h.step(core.Received{Conn: w.conn, Msg: core.Refresh{Request: h.nextReq()}}, expect{stay: h.m.leasesOf(w.id)})
}

// cancelRun cancels a run: every step that was not terminal ends cancelled,
// except a running step whose worker is connected, which goes cancelling.
func (h *harness) cancelRun(t *rapid.T) {
	if len(h.runs) == 0 {
		return
	}
	m := h.m
	run := h.runs[rapid.IntRange(0, len(h.runs)-1).Draw(t, "run")]
	var busy []core.RunID // runs with a running step: the cancel is graceful
	for _, id := range h.runs {
		for _, s := range m.steps {
			if s.run == id && s.state == core.StateRunning {
				busy = append(busy, id)
				break
			}
		}
	}
	if len(busy) > 0 && rapid.IntRange(0, 3).Draw(t, "busy run") > 0 {
		run = busy[rapid.IntRange(0, len(busy)-1).Draw(t, "which busy run")]
	}
	pre := map[core.StepID]core.State{}
	finished := true
	for id, s := range m.steps {
		if s.run == run {
			pre[id] = s.state
			finished = finished && spec.Terminal(s.state)
		}
	}
	connected := map[core.WorkerID]bool{}
	for _, w := range h.connected() {
		connected[w.id] = true
	}
	holder := map[core.StepID]core.WorkerID{}
	for id, s := range m.steps {
		if s.lease != 0 {
			holder[id] = m.leases[s.lease].worker
		}
	}
	h.t.Logf("cancel %s", run)
	due := h.timersDue()
	rd := h.step(core.CancelRun{Call: h.nextCall(), Run: run}, expect{})
	if len(rd.Answers) != 1 {
		h.fatalf("CancelRun got %d answers", len(rd.Answers))
	}
	if finished {
		if rd.Answers[0].Err == "" {
			h.fatalf("cancelling finished run %s was not an error", run)
		}
		return
	}
	if rd.Answers[0].Err != "" {
		h.fatalf("CancelRun %s: %s", run, rd.Answers[0].Err)
	}
	h.stats.add("run cancelled")
	if due {
		return
	}
	for id, st := range pre {
		if spec.Terminal(st) {
			continue
		}
		want := core.StateCancelled
		if st == core.StateCancelling || (st == core.StateRunning && connected[holder[id]]) {
			want = core.StateCancelling
		}
		got := m.steps[id].state
		if st == core.StatePending && got == core.StateSkipped {
			continue // a cancelled dependency skips it first (SPEC §2 cascade)
		}
		if got != want {
			h.fatalf("after cancelling %s, step %s (was %s) is %s; the model says %s", run, id, st, got, want)
		}
	}
}

// revoke revokes a token: its worker, if any, is closed and loses every
// lease at once, and is never welcomed back.
func (h *harness) revoke(t *rapid.T) {
	tok := h.tokens[rapid.IntRange(0, len(h.tokens)-1).Draw(t, "token")]
	var ex expect
	w := tok.worker
	if w != nil && !w.revoked {
		ex.end = h.m.leasesOf(w.id)
	}
	h.t.Logf("revoke %s (worker %v)", tok.name, w != nil)
	rd := h.step(core.RevokeToken{Call: h.nextCall(), Name: tok.name}, ex)
	if len(rd.Answers) != 1 || rd.Answers[0].Err != "" {
		h.fatalf("RevokeToken %s: %+v", tok.name, rd.Answers)
	}
	tok.revoked = true
	h.stats.add("revoke")
	if w != nil {
		w.revoked = true
		if w.conn != 0 {
			h.fatalf("revoked worker %s is still connected", w.id)
		}
	}
}

// advances are the time steps drawn, small ones more often: the deadlines
// that matter are seconds to minutes apart, and long silences make every
// queued step fail unmatched.
var advances = []time.Duration{time.Second, time.Second, time.Second, 2 * time.Second, 3 * time.Second,
	5 * time.Second, 9 * time.Second, 11 * time.Second, 11 * time.Second, 21 * time.Second, 30 * time.Second,
	61 * time.Second, 2 * time.Minute, 5 * time.Minute, 16 * time.Minute}

func (h *harness) advance(t *rapid.T) {
	d := rapid.SampledFrom(advances).Draw(t, "by")
	if rapid.IntRange(0, 3).Draw(t, "jitter") == 3 {
		d += time.Duration(rapid.IntRange(1, 999).Draw(t, "ms")) * time.Millisecond
	}
	if rapid.IntRange(0, 3).Draw(t, "silent") < 3 {
		// Live workers heartbeat (and refresh) as time passes; a silent
		// world lets them go stale and their credentials lapse.
		for _, w := range h.connected() {
			h.beat(w, nil)
			if w.conn != 0 && !h.now.Add(d).Before(w.credLB.Add(-h.cfg.CredentialTTL/3)) {
				h.refreshOf(w)
			}
		}
	}
	h.tick(d)
}

// advanceToDeadline moves time exactly to the last batch's Deadline (the
// instant a timer is due), or one nanosecond short of it.
func (h *harness) advanceToDeadline(t *rapid.T) {
	if h.deadline.IsZero() {
		return
	}
	d := h.deadline.Sub(h.now)
	if d > 0 && rapid.IntRange(0, 3).Draw(t, "just short") == 3 {
		d -= time.Nanosecond
	}
	h.tick(max(d, 0))
}

// tick advances time and steps a Tick: timers fire. Ends are learned, but a
// lease past its deadline must be gone and a recovering lease inside its
// grace window must not be.
func (h *harness) tick(d time.Duration) {
	h.t.Helper()
	h.now = h.now.Add(d)
	hold := map[core.LeaseID]time.Time{}
	for id, l := range h.m.leases {
		if l.current && !l.holdUntil.IsZero() && h.now.Before(l.holdUntil) &&
			h.m.steps[l.step].state == core.StateRecovering {
			hold[id] = l.holdUntil
		}
	}
	h.t.Logf("advance %s to +%s", d, h.now.Sub(rapidT0))
	h.step(core.Tick{}, expect{learn: true})
	for _, id := range slices.Sorted(maps.Keys(h.m.leases)) {
		l := h.m.leases[id]
		if l.current && !l.mustEndBy.IsZero() && !h.now.Before(l.mustEndBy) {
			h.fatalf("lease %d (step %s, %s) is still current at +%s, past its deadline +%s",
				id, l.step, h.m.steps[l.step].state, h.now.Sub(rapidT0), l.mustEndBy.Sub(rapidT0))
		}
	}
	for _, id := range slices.Sorted(maps.Keys(hold)) {
		if l := h.m.leases[id]; !l.current {
			h.fatalf("lease %d of recovering step %s ended at +%s, before its grace window closed at +%s",
				id, l.step, h.now.Sub(rapidT0), hold[id].Sub(rapidT0))
		}
	}
}

// restart is a crash and core.Restore from every record persisted so far.
// Nothing is lost: the same leases are current, committed outcomes and
// remembered answers survive, every worker is disconnected.
func (h *harness) restart(t *rapid.T) {
	h.t.Logf("restart")
	h.stats.add("restart")
	h.chk.Crash(h.now)
	o, rd, err := core.Restore(h.cfg, h.now, h.disk.Records())
	if err != nil {
		h.fatalf("Restore: %v", err)
	}
	h.o = o
	h.m.restoredAt = h.now
	for _, w := range h.ws {
		w.conn = 0
	}
	clear(h.byConn)
	h.chk.Restored(h.now, o, rd)
	h.persist(rd)
	// Every lease stays as it was: a restart ends nothing.
	h.observe(rd, expect{stay: h.m.currentLeases()})
	h.deadline = rd.Deadline
	// The restart's fresh deadlines (SPEC §7).
	for _, l := range h.m.leases {
		if !l.current {
			continue
		}
		g := h.graceOf(l.worker)
		switch h.m.steps[l.step].state {
		case core.StateCancelling:
			l.mustEndBy, l.holdUntil = h.now.Add(h.cfg.ForceCancel), time.Time{}
		case core.StateRecovering:
			l.mustEndBy, l.holdUntil = h.now.Add(g), h.now.Add(g)
		default:
			l.mustEndBy, l.holdUntil = h.now.Add(g), time.Time{}
		}
	}
}

func (m *refModel) currentLeases() []core.LeaseID {
	var ls []core.LeaseID
	for id, l := range m.leases {
		if l.current {
			ls = append(ls, id)
		}
	}
	slices.Sort(ls)
	return ls
}

func describeMsgs(rd core.Ready) string {
	var parts []string
	for _, e := range rd.Messages {
		parts = append(parts, fmt.Sprintf("%d:%s", e.Conn, core.DescribeMsg(e.Msg)))
	}
	return "[" + strings.Join(parts, "; ") + "]"
}
