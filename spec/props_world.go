package spec

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/tether-run/tether/core"
)

// Properties judged from a world's own view of the pool: what each worker
// declared in its Hello, which connections the orchestrator holds (a
// Welcome sent on them, no Close since, no Disconnected for them), when it
// last heard from each worker, which leases it granted to whom (its
// Dispatches) and which of those ended (the typed causes of its events,
// terminal transitions, retries). None of them asks the core whom it thinks active,
// which worker it thinks matches, or which lease it thinks current.
const (
	// PropUnmatchedVerdict (SPEC §5, §8): a step failed with cause
	// unmatched was queued and unleased for the unmatched timeout, and no
	// active worker matched it (target, labels, platform, tags ⊆ the
	// worker's tags, as the worker declared them); and a step that has been
	// queued, unleased, with no matching worker that may still be active,
	// is failed by the first sweep past the unmatched timeout: it does not
	// wait for workers that are gone.
	PropUnmatchedVerdict = "UnmatchedVerdict"
	// PropScalerNoGrace (SPEC §4): a scaler-managed worker has no grace
	// window. In the batch its connection drops, every lease it held ends
	// (never started → requeued, started no-write → RECOVER then REQUEUE,
	// started write-bearing → failed, cancelling → forced), and no step is
	// ever left recovering on a scaler's lease when a batch ends.
	PropScalerNoGrace = "ScalerNoGrace"
	// PropWelcomeCancel (SPEC §4): the Welcome answering a reconnect Hello
	// lists in Cancel every reported lease that is not the worker's own
	// current lease, and none that is — except a lease whose report was
	// answered COMMITTED, which is not listed (the worker re-sends the
	// report and gets COMMITTED again).
	PropWelcomeCancel = "WelcomeCancel"
)

// poolWorker is what a world knows of one worker instance.
type poolWorker struct {
	hello   core.Hello // the enrolling Hello: its declarations
	name    string     // the declared name, or the token's name (§9)
	token   string     // the enrollment token's name
	conn    core.ConnID
	heard   time.Time // the last message the orchestrator received from it
	alive   time.Time // the last Welcome-answered Hello or heartbeat on its connection
	revoked bool
}

// grace is the worker's recovery window: none for a scaler-managed one.
func (w *poolWorker) grace() time.Duration {
	if w.hello.Scaler {
		return 0
	}
	return 2 * w.hello.MaxDelay
}

type leaseInfo struct {
	step   core.StepID
	worker core.WorkerID
}

// leaseView is the leases granted and not ended, as the batches showed them.
type leaseView struct {
	live      map[core.LeaseID]leaseInfo
	byStep    map[core.StepID]core.LeaseID
	committed map[core.LeaseID]core.WorkerID // leases whose report was answered COMMITTED
}

func newLeaseView() *leaseView {
	return &leaseView{live: map[core.LeaseID]leaseInfo{}, byStep: map[core.StepID]core.LeaseID{}, committed: map[core.LeaseID]core.WorkerID{}}
}

func (v *leaseView) clone() *leaseView {
	return &leaseView{live: maps.Clone(v.live), byStep: maps.Clone(v.byStep), committed: maps.Clone(v.committed)}
}

func (v *leaseView) end(id core.LeaseID) {
	if l, ok := v.live[id]; ok {
		delete(v.live, id)
		if v.byStep[l.step] == id {
			delete(v.byStep, l.step)
		}
	}
}

// leaseOp is one change a batch made to the leases.
type leaseOp struct {
	grant     bool
	commit    bool
	lease     core.LeaseID
	step      core.StepID
	worker    core.WorkerID
	endOfStep bool // end whatever lease step holds
}

func (v *leaseView) apply(ops []leaseOp) {
	for _, op := range ops {
		switch {
		case op.grant:
			if old, ok := v.byStep[op.step]; ok {
				v.end(old)
			}
			v.live[op.lease] = leaseInfo{step: op.step, worker: op.worker}
			v.byStep[op.step] = op.lease
		case op.commit:
			v.committed[op.lease] = op.worker
		case op.endOfStep:
			if l, ok := v.byStep[op.step]; ok {
				v.end(l)
			}
		default:
			v.end(op.lease)
		}
	}
}

// leaseEnding says whether an event with this cause ends the lease it
// names: every cause that requeues, fails or settles a step's lease; not
// those that hold it (disconnected, orchestrator-restarted) or reclaim it.
func leaseEnding(c core.Cause) bool {
	switch c {
	case core.CauseGraceExpired, core.CauseNoGrace, core.CauseStaleWorker, core.CauseRevoked, core.CauseLost,
		core.CauseDispatchMissed, core.CauseDispatchRejected, core.CauseWorkerStopped, core.CauseStepTimeout:
		return true
	}
	return false
}

// Pool is a world's own view of the pool and the leases, fed every batch
// the orchestrator makes (Check), every batch made durable (Persisted), its
// crashes and restores; it checks PropUnmatchedVerdict, PropScalerNoGrace
// and PropWelcomeCancel.
type Pool struct {
	cfg      core.Config
	workers  map[core.WorkerID]*poolWorker
	conns    map[core.ConnID]core.WorkerID // connections the orchestrator holds
	leases   *leaseView                    // as of the last batch
	durable  *leaseView                    // as of the last durable batch
	pending  [][]leaseOp                   // batches stepped, not yet durable
	ready    map[core.StepID]time.Time     // queued, unleased steps → since when
	stuck    map[core.StepID]time.Time     // ready steps no worker that may be active matches → since when
	restored time.Time
}

// NewPool returns an empty view.
func NewPool() *Pool {
	return &Pool{workers: map[core.WorkerID]*poolWorker{}, conns: map[core.ConnID]core.WorkerID{},
		leases: newLeaseView(), durable: newLeaseView(), ready: map[core.StepID]time.Time{}, stuck: map[core.StepID]time.Time{}}
}

// Persisted says the oldest batch not yet durable is now durable.
func (p *Pool) Persisted() {
	if len(p.pending) == 0 {
		return
	}
	p.durable.apply(p.pending[0])
	p.pending = p.pending[1:]
}

// Crash says the orchestrator died: its connections, and every batch not
// durable, are gone.
func (p *Pool) Crash() {
	clear(p.conns)
	for _, w := range p.workers {
		w.conn = 0
	}
	p.pending = nil
	p.leases = p.durable.clone()
}

// Restored says the orchestrator was restored at now (its batch is then
// checked as any other, with a nil input): every worker starts without a
// connection and with fresh heartbeat clocks and grace windows (SPEC §7),
// and the waits for unmatched steps start over.
func (p *Pool) Restored(now time.Time) {
	p.Crash()
	p.restored = now
	clear(p.stuck)
}

// Woke says the orchestrator process woke from a pause at now (the
// simulator's failover fault, when no standby took over): frozen, it could
// sweep nothing, so a wait that ran out while it was is due at now, its
// first batch awake — as Timeouts.Woke does for the timeouts.
func (p *Pool) Woke(now time.Time) {
	limit := p.cfg.UnmatchedTimeout + p.cfg.SweepInterval + TimeoutSlack
	for id, since := range p.stuck {
		if now.Sub(since) > limit {
			p.stuck[id] = now.Add(-limit)
		}
	}
}

// definitelyActive: the orchestrator holds the worker's connection, it was
// revoked by no one, and its last Hello or heartbeat is younger than the
// heartbeat timeout (so no stale-worker sweep can have found it).
func (p *Pool) definitelyActive(w *poolWorker, now time.Time) bool {
	return w.conn != 0 && !w.revoked && now.Sub(w.alive) < p.cfg.HeartbeatTimeout
}

// maybeActive: not surely out of the pool. A worker is surely out once it
// is revoked, or once nothing was heard from it (nor the orchestrator
// restarted) for the heartbeat timeout and a sweep interval (a connected
// worker is stale by then) plus its grace window (a disconnected one is
// deregistered by then; a scaler-managed one has none).
func (p *Pool) maybeActive(w *poolWorker, now time.Time) bool {
	if w.revoked {
		return false
	}
	last := latest(w.heard, p.restored)
	return now.Sub(last) < p.cfg.HeartbeatTimeout+p.cfg.SweepInterval+w.grace()
}

// workerMatches is SPEC §8's match (Matches, with SpecRequiredTags) from
// what the worker declared. A step whose type the table does not know
// matches no worker (the core refuses it at submit).
func workerMatches(w *poolWorker, sp core.StepSpec) bool {
	req, ok := SpecRequiredTags(sp)
	if !ok {
		return false
	}
	m, _ := Matches(sp, req, WorkerTraits{Name: w.name, Tags: w.hello.Tags, Labels: w.hello.Labels, Platform: w.hello.Platform})
	return m
}

func (p *Pool) sortedWorkers() []core.WorkerID {
	ids := make([]core.WorkerID, 0, len(p.workers))
	for id := range p.workers {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids
}

// activeMatches lists the workers surely active at now that match step.
func (p *Pool) activeMatches(o View, step core.StepID, now time.Time) map[core.WorkerID]bool {
	sp, ok := o.StepSpecOf(step)
	if !ok {
		return nil
	}
	m := map[core.WorkerID]bool{}
	for _, id := range p.sortedWorkers() {
		if w := p.workers[id]; p.definitelyActive(w, now) && workerMatches(w, sp) {
			m[id] = true
		}
	}
	return m
}

// Check checks batch rd, made at now by o (o as the batch left it) for
// input in (nil for a restore's batch), and learns from it.
func (p *Pool) Check(o View, now time.Time, in core.Input, rd core.Ready) *Violation {
	p.cfg = o.Config() // its settings with defaults filled in
	// Before the batch: unmatched steps that waited too long.
	if v := p.checkStuck(now); v != nil {
		return v
	}
	// What the view said before the batch, for the checks after it.
	unmatched := map[core.StepID]map[core.WorkerID]bool{}
	for _, ev := range rd.Events {
		if ev.Cause == core.CauseUnmatched && ev.Step != "" {
			since, ok := p.ready[ev.Step]
			if !ok || now.Sub(since) < p.cfg.UnmatchedTimeout {
				return &Violation{Invariant: PropUnmatchedVerdict, Detail: fmt.Sprintf(
					"step %s was failed unmatched at %s, but it was not queued and unleased for the unmatched timeout of %s (since %s)",
					ev.Step, now.Format(time.RFC3339Nano), p.cfg.UnmatchedTimeout, fmtSince(since, ok))}
			}
			unmatched[ev.Step] = p.activeMatches(o, ev.Step, now)
		}
	}
	hello, helloConn, reconnect := helloOf(in)
	var before *leaseView
	if reconnect {
		before = p.leases.clone()
	}
	scalerDropped := p.learn(now, in, rd)
	// After it.
	for _, step := range sortedKeys(unmatched) {
		after := p.activeMatches(o, step, now)
		for _, id := range sortedKeys(unmatched[step]) {
			if after[id] {
				return &Violation{Invariant: PropUnmatchedVerdict, Detail: fmt.Sprintf(
					"step %s was failed unmatched, yet worker %s matches it and was active (connected, heard from within the heartbeat timeout, not revoked) before and after the batch",
					step, id)}
			}
		}
	}
	if in != nil {
		if v := p.checkScaler(o, scalerDropped); v != nil {
			return v
		}
	}
	if reconnect {
		if v := p.checkWelcome(hello, helloConn, before, rd); v != nil {
			return v
		}
	}
	p.track(o, now)
	return nil
}

func fmtSince(t time.Time, ok bool) string {
	if !ok {
		return "never"
	}
	return t.Format(time.RFC3339Nano)
}

func sortedKeys[K ~string | ~int64 | ~uint64, V any](m map[K]V) []K {
	ks := make([]K, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// helloOf returns the reconnect Hello input in carries.
func helloOf(in core.Input) (core.Hello, core.ConnID, bool) {
	r, ok := in.(core.Received)
	if !ok {
		return core.Hello{}, 0, false
	}
	h, ok := r.Msg.(core.Hello)
	if !ok || h.Credential == "" {
		return core.Hello{}, 0, false
	}
	return h, r.Conn, true
}

// learn applies the input and the batch to the view; it returns the
// scaler-managed workers whose connection the batch dropped.
func (p *Pool) learn(now time.Time, in core.Input, rd core.Ready) []core.WorkerID {
	var dropped []core.WorkerID
	drop := func(c core.ConnID) {
		if id, ok := p.conns[c]; ok {
			delete(p.conns, c)
			if w := p.workers[id]; w != nil && w.conn == c {
				w.conn = 0
				if w.hello.Scaler {
					dropped = append(dropped, id)
				}
			}
		}
	}
	var hello *core.Hello
	var helloConn core.ConnID
	switch in := in.(type) {
	case core.Received:
		if h, ok := in.Msg.(core.Hello); ok {
			hello, helloConn = &h, in.Conn
		} else if id, ok := p.conns[in.Conn]; ok {
			w := p.workers[id]
			w.heard = now
			if _, ok := in.Msg.(core.Heartbeat); ok {
				w.alive = now
			}
		}
	case core.Disconnected:
		drop(in.Conn)
	case core.RevokeToken:
		for _, id := range p.sortedWorkers() {
			if w := p.workers[id]; w.token == in.Name {
				w.revoked = true
			}
		}
	}
	var ops []leaseOp
	for _, e := range rd.Messages {
		switch m := e.Msg.(type) {
		case core.Welcome:
			if hello == nil || e.Conn != helloConn {
				continue
			}
			w := p.workers[m.Worker]
			if w == nil {
				if hello.Token == "" {
					continue
				}
				tok, _, _ := strings.Cut(hello.Token, ".")
				w = &poolWorker{hello: *hello, name: hello.Name, token: tok}
				w.hello.Tags = slices.Clone(hello.Tags)
				if w.name == "" {
					w.name = tok
				}
				p.workers[m.Worker] = w
			}
			if w.conn != 0 && w.conn != e.Conn {
				drop(w.conn) // superseded
			}
			w.conn, w.heard, w.alive = e.Conn, now, now
			p.conns[e.Conn] = m.Worker
		case core.Close:
			drop(e.Conn)
		case core.Dispatch:
			if id, ok := p.conns[e.Conn]; ok {
				ops = append(ops, leaseOp{grant: true, lease: m.Lease, step: m.Step, worker: id})
			}
		case core.Answer:
			if m.Verdict == core.Committed {
				if l, ok := p.leases.live[m.Lease]; ok {
					ops = append(ops, leaseOp{commit: true, lease: m.Lease, worker: l.worker})
				}
			}
		}
	}
	// Ends first: a batch's dispatches come last (SPEC §8).
	var ends []leaseOp
	for _, ev := range rd.Events {
		if ev.Step != "" && ev.Lease != 0 && leaseEnding(ev.Cause) {
			ends = append(ends, leaseOp{lease: ev.Lease})
		}
	}
	for _, t := range rd.Transitions {
		if t.To.Terminal() || t.Event == core.EvRetry { // a retry ends its try's lease (SPEC §1)
			ends = append(ends, leaseOp{endOfStep: true, step: t.Step})
		}
	}
	ops = append(ends, ops...)
	p.leases.apply(ops)
	p.pending = append(p.pending, ops)
	return dropped
}

// checkScaler: after the batch, no lease of a scaler whose connection it
// dropped is left, and no step is recovering on a scaler's lease.
func (p *Pool) checkScaler(o View, dropped []core.WorkerID) *Violation {
	scalers := false
	for _, w := range p.workers {
		scalers = scalers || w.hello.Scaler
	}
	if !scalers { // no lease can be a scaler-managed worker's
		return nil
	}
	gone := map[core.WorkerID]bool{}
	for _, id := range dropped {
		gone[id] = true
	}
	// The smallest lease id found wanting, as a scan in sorted order would
	// report first, without sorting every live lease each batch.
	var first core.LeaseID
	var found *Violation
	for l, info := range p.leases.live {
		if found != nil && l > first {
			continue
		}
		w := p.workers[info.worker]
		if w == nil || !w.hello.Scaler {
			continue
		}
		if gone[info.worker] {
			first, found = l, &Violation{Invariant: PropScalerNoGrace, Detail: fmt.Sprintf(
				"scaler-managed worker %s's connection dropped, yet its lease %s@%d did not end in that batch (no grace window, SPEC §4)",
				info.worker, info.step, l)}
		} else if st, ok := o.StepByID(info.step); ok && st.State == core.StateRecovering {
			first, found = l, &Violation{Invariant: PropScalerNoGrace, Detail: fmt.Sprintf(
				"step %s is recovering on scaler-managed worker %s's lease %d after a batch (no grace window, SPEC §4)",
				info.step, info.worker, l)}
		}
	}
	return found
}

// checkWelcome checks the Welcome answering a reconnect Hello against the
// leases as the view held them before the batch. A lease that the batch
// ended may have ended before the Hello (a timer due before now) or after
// it: it is judged neither way.
func (p *Pool) checkWelcome(h core.Hello, c core.ConnID, before *leaseView, rd core.Ready) *Violation {
	var wel *core.Welcome
	for _, e := range rd.Messages {
		if m, ok := e.Msg.(core.Welcome); ok && e.Conn == c {
			wel = &m
		}
	}
	if wel == nil {
		return nil
	}
	return welcomeCancel(h, wel, before, p.leases)
}

// welcomeCancel checks Welcome wel answering reconnect Hello h, with the
// leases before the batch and after it.
func welcomeCancel(h core.Hello, wel *core.Welcome, before, after *leaseView) *Violation {
	cancel := map[core.LeaseID]bool{}
	for _, l := range wel.Cancel {
		cancel[l] = true
	}
	for _, ref := range h.InFlight {
		info, live := before.live[ref.Lease]
		current := live && info.worker == h.Worker && info.step == ref.Step
		if _, still := after.live[ref.Lease]; current && !still {
			continue // ended in this batch: before or after the Hello
		}
		committed := before.committed[ref.Lease] == h.Worker
		switch {
		case current && cancel[ref.Lease]:
			return &Violation{Invariant: PropWelcomeCancel, Detail: fmt.Sprintf(
				"worker %s reported %s@%d, its current lease, yet the Welcome lists it in cancel", h.Worker, ref.Step, ref.Lease)}
		case !current && committed && cancel[ref.Lease]:
			return &Violation{Invariant: PropWelcomeCancel, Detail: fmt.Sprintf(
				"worker %s reported %s@%d, whose report was answered COMMITTED, yet the Welcome lists it in cancel", h.Worker, ref.Step, ref.Lease)}
		case !current && !committed && !cancel[ref.Lease]:
			return &Violation{Invariant: PropWelcomeCancel, Detail: fmt.Sprintf(
				"worker %s reported %s@%d, not its current lease, yet the Welcome does not list it in cancel", h.Worker, ref.Step, ref.Lease)}
		}
	}
	return nil
}

// track learns, after a batch, which steps are queued and unleased, and
// which of those no worker that may be active matches.
func (p *Pool) track(o View, now time.Time) {
	ready := map[core.StepID]bool{}
	for _, id := range o.Orchestrator.StepIDsIn(core.StateQueued) { // a queued step is live: only finished runs are archived
		if _, leased := p.leases.byStep[id]; leased {
			continue
		}
		sp, ok := o.StepSpecOf(id)
		if !ok || sp.Type == "task" || sp.Workflow != nil {
			continue
		}
		ready[id] = true
		if _, ok := p.ready[id]; !ok {
			p.ready[id] = now
		}
		any := false
		for _, w := range p.workers { // whether any does: the order is immaterial
			if p.maybeActive(w, now) && workerMatches(w, sp) {
				any = true
				break
			}
		}
		if any {
			delete(p.stuck, id)
		} else if _, ok := p.stuck[id]; !ok {
			p.stuck[id] = now
		}
	}
	for id := range p.ready {
		if !ready[id] {
			delete(p.ready, id)
			delete(p.stuck, id)
		}
	}
}

// checkStuck: a step queued and unleased, with no matching worker that may
// be active, since t is failed by the first sweep at or after t + the
// unmatched timeout, at most a sweep interval later.
func (p *Pool) checkStuck(now time.Time) *Violation {
	// The smallest such id, as a scan in sorted order would report first.
	limit := p.cfg.UnmatchedTimeout + p.cfg.SweepInterval + TimeoutSlack
	var id core.StepID
	var since time.Time
	found := false
	for k, s := range p.stuck {
		if now.Sub(s) > limit && (!found || k < id) {
			id, since, found = k, s, true
		}
	}
	if !found {
		return nil
	}
	d := now.Sub(since)
	return &Violation{Invariant: PropUnmatchedVerdict, Detail: fmt.Sprintf(
		"step %s has been queued and unleased with no matching worker that may still be active for %s (since %s), yet no sweep failed it unmatched (unmatched timeout %s, sweep interval %s)",
		id, d, since.Format(time.RFC3339Nano), p.cfg.UnmatchedTimeout, p.cfg.SweepInterval)}
}

// ---- the explorer's form: from the orchestrator's records ----

// PreBatch is what the explorer's per-batch check keeps from right before a
// batch: HeldReported of its input, the input, and the orchestrator as it
// was (the explorer's search never steps a machine in place, so keeping it
// costs nothing; a completion does, and keeps a copy: BeforeCopy). The explorer cannot afford a Pool per state; it checks
// PropUnmatchedVerdict's first half, PropScalerNoGrace and
// PropWelcomeCancel against the worker and lease records before and after
// the batch, with this file's own matching (workerMatches) over what the
// workers declared.
type PreBatch struct {
	Held map[core.StepID]core.LeaseID
	o    preOrch
	in   core.Input
}

// preOrch is what CheckRecords reads of the orchestrator before a batch.
type preOrch interface {
	StepByID(core.StepID) (core.StepRecord, bool)
	Workers() []core.WorkerView
	Leases() []core.LeaseRecord
}

// Before records what CheckRecords needs from o, about to handle in; o must
// not be stepped in place afterwards (see BeforeCopy).
func Before(o View, in core.Input) *PreBatch {
	return &PreBatch{Held: HeldReported(o.Orchestrator, in), o: o, in: in}
}

// BeforeCopy is Before for an orchestrator about to be stepped in place (an
// explorer completion's own copy): it keeps a copy of the step, worker and
// lease records CheckRecords reads instead of o itself.
func BeforeCopy(o View, in core.Input) *PreBatch {
	snap := &preSnapshot{steps: map[core.StepID]core.StepRecord{}, workers: o.Workers(), leases: o.Leases()}
	for _, st := range o.Steps() {
		snap.steps[st.ID] = st
	}
	return &PreBatch{Held: HeldReported(o.Orchestrator, in), o: snap, in: in}
}

// preSnapshot is the records of an orchestrator as they were (BeforeCopy).
type preSnapshot struct {
	steps   map[core.StepID]core.StepRecord
	workers []core.WorkerView
	leases  []core.LeaseRecord
}

func (p *preSnapshot) StepByID(id core.StepID) (core.StepRecord, bool) {
	st, ok := p.steps[id]
	return st, ok
}
func (p *preSnapshot) Workers() []core.WorkerView { return p.workers }
func (p *preSnapshot) Leases() []core.LeaseRecord { return p.leases }

// HeldOf is pre's Held (nil for a nil pre: a restore's batch).
func (pre *PreBatch) HeldOf() map[core.StepID]core.LeaseID {
	if pre == nil {
		return nil
	}
	return pre.Held
}

// declared is a worker record's declarations, as this file's matching reads them.
func declared(w core.WorkerRecord) *poolWorker {
	return &poolWorker{hello: core.Hello{Tags: w.Tags, Labels: w.Labels, Platform: w.Platform, Scaler: w.Scaler}, name: w.Name}
}

func activeMatchesOf(o preOrch, sp core.StepSpec) map[core.WorkerID]bool {
	m := map[core.WorkerID]bool{}
	for _, w := range o.Workers() {
		if w.Active && !w.Revoked && workerMatches(declared(w.WorkerRecord), sp) {
			m[w.ID] = true
		}
	}
	return m
}

func leaseMap(o preOrch) map[core.LeaseID]core.LeaseRecord {
	m := map[core.LeaseID]core.LeaseRecord{}
	for _, l := range o.Leases() {
		m[l.ID] = l
	}
	return m
}

// CheckUnmatchedRecords is PropUnmatchedVerdict read from the
// orchestrator's own worker records, for a checker that keeps no copy of
// the state before each batch (the simulator): a step failed unmatched by
// batch rd, which took the orchestrator to o, while a worker the batch
// wrote no record of is active, not revoked and matches it after the batch
// (so was before it too: a worker's Active and Revoked live in its record,
// and any change to them is written in the batch that makes it) is a
// violation. The world's view (Pool.Check) counts only workers it knows to
// be connected as surely active; this reads the orchestrator's own word
// for the rest, e.g. a worker inside its grace window (SPEC §5, §8).
func CheckUnmatchedRecords(o View, rd core.Ready) *Violation {
	var failed []core.StepID
	for _, ev := range rd.Events {
		if ev.Cause == core.CauseUnmatched && ev.Step != "" {
			failed = append(failed, ev.Step)
		}
	}
	if len(failed) == 0 {
		return nil
	}
	written := map[string]bool{}
	for _, r := range rd.Records {
		written[r.Key] = true
	}
	workers := o.Workers()
	for _, step := range failed {
		sp, ok := o.StepSpecOf(step)
		if !ok {
			continue
		}
		for _, w := range workers {
			if !w.Active || w.Revoked || written[core.KindWorker+"/"+string(w.ID)] {
				continue
			}
			if workerMatches(declared(w.WorkerRecord), sp) {
				return &Violation{Invariant: PropUnmatchedVerdict, Detail: fmt.Sprintf(
					"step %s was failed unmatched, yet worker %s matches it and is active in the orchestrator's records before and after the batch (connected %v)",
					step, w.ID, w.Connected)}
			}
		}
	}
	return nil
}

// CheckRecords checks batch rd, made at now, that took pre.o to o (a nil
// pre is a restore's batch: nothing to compare with).
func CheckRecords(pre *PreBatch, o View, now time.Time, rd core.Ready) *Violation {
	if pre == nil {
		return nil
	}
	cfg := o.Config()
	for _, ev := range rd.Events {
		if ev.Cause != core.CauseUnmatched || ev.Step == "" {
			continue
		}
		st, ok := pre.o.StepByID(ev.Step)
		if !ok || st.State != core.StateQueued || st.Lease != 0 || now.Sub(st.QueuedAt) < cfg.UnmatchedTimeout {
			return &Violation{Invariant: PropUnmatchedVerdict, Detail: fmt.Sprintf(
				"step %s was failed unmatched, but before the batch it was not queued and unleased for the unmatched timeout of %s (state %s, lease %d, queued at %s)",
				ev.Step, cfg.UnmatchedTimeout, st.State, st.Lease, st.QueuedAt.Format(time.RFC3339Nano))}
		}
		sp, _ := o.StepSpecOf(ev.Step)
		before, after := activeMatchesOf(pre.o, sp), activeMatchesOf(o, sp)
		for _, id := range sortedKeys(before) {
			if after[id] {
				return &Violation{Invariant: PropUnmatchedVerdict, Detail: fmt.Sprintf(
					"step %s was failed unmatched, yet worker %s matches it and was active before and after the batch", ev.Step, id)}
			}
		}
	}
	// Scaler-managed workers: no step entered recovering on a scaler's
	// lease and stayed there; a scaler whose connection the batch dropped
	// holds no lease after it.
	var scalers map[core.WorkerID]core.WorkerView
	scalerOf := func(id core.WorkerID) (core.WorkerView, bool) {
		if scalers == nil {
			scalers = map[core.WorkerID]core.WorkerView{}
			for _, w := range o.Workers() {
				if w.Scaler {
					scalers[w.ID] = w
				}
			}
		}
		w, ok := scalers[id]
		return w, ok
	}
	entered, _ := RecoveryChanges(rd)
	for _, id := range entered {
		st, ok := o.StepByID(id)
		if !ok || st.State != core.StateRecovering {
			continue
		}
		for _, l := range o.Leases() {
			if l.ID != st.Lease {
				continue
			}
			if _, ok := scalerOf(l.Worker); ok {
				return &Violation{Invariant: PropScalerNoGrace, Detail: fmt.Sprintf(
					"step %s is recovering on scaler-managed worker %s's lease %d after a batch (no grace window, SPEC §4)", id, l.Worker, l.ID)}
			}
		}
	}
	dropped := false
	if _, ok := pre.in.(core.Disconnected); ok {
		dropped = true
	}
	for _, e := range rd.Messages {
		if _, ok := e.Msg.(core.Close); ok {
			dropped = true
		}
	}
	if dropped {
		was := map[core.WorkerID]bool{}
		for _, w := range pre.o.Workers() {
			if w.Scaler && w.Connected {
				was[w.ID] = true
			}
		}
		if len(was) > 0 {
			after := leaseMap(o)
			for _, l := range pre.o.Leases() {
				if !l.Current || !was[l.Worker] {
					continue
				}
				if w, ok := scalerOf(l.Worker); ok && !w.Connected && after[l.ID].Current {
					return &Violation{Invariant: PropScalerNoGrace, Detail: fmt.Sprintf(
						"scaler-managed worker %s's connection dropped, yet its lease %s@%d did not end in that batch (no grace window, SPEC §4)",
						l.Worker, l.Step, l.ID)}
				}
			}
		}
	}
	// Welcome.
	if h, c, ok := helloOf(pre.in); ok {
		var wel *core.Welcome
		for _, e := range rd.Messages {
			if m, ok := e.Msg.(core.Welcome); ok && e.Conn == c {
				wel = &m
			}
		}
		if wel != nil {
			before, after := leaseMap(pre.o), leaseMap(o)
			v := newLeaseView()
			for _, l := range before {
				if l.Current {
					v.live[l.ID] = leaseInfo{step: l.Step, worker: l.Worker}
				}
				if l.Committed {
					v.committed[l.ID] = l.Worker
				}
			}
			now := newLeaseView()
			for _, l := range after {
				if l.Current {
					now.live[l.ID] = leaseInfo{step: l.Step, worker: l.Worker}
				}
			}
			return welcomeCancel(h, wel, v, now)
		}
	}
	return nil
}
