package core

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"
)

// Read-only queries. They return copies; nothing a caller does to them changes
// the orchestrator.

// ErrNotCurrent is returned by Fence when a lease has lost its authority.
var ErrNotCurrent = errors.New("lease is not current")

// ErrNotStarted is returned (wrapped) when a data-plane write comes under
// the lease of a write-bearing step whose START is not recorded (SPEC §14).
var ErrNotStarted = errors.New("lease not started")

// ErrUnknownLease is returned by Fence for a lease that does not exist or
// belongs to another worker.
var ErrUnknownLease = errors.New("unknown lease")

// Fence answers "may lease L, held by worker W, write now?" for proxied writes
// (data-plane PUT and append, secret put). Only a current lease may write.
// It is the lease half of CheckWrite's decision (core/data.go).
func (o *Orchestrator) Fence(w WorkerID, l LeaseID) error {
	switch r, detail := o.fence(w, l); r {
	case RefusedUnknownLease:
		return fmt.Errorf("%w %d for worker %s", ErrUnknownLease, l, w)
	case RefusedLeaseNotCurrent:
		return fmt.Errorf("%w: lease %d: %s", ErrNotCurrent, l, detail)
	case RefusedWorkerRevoked:
		return fmt.Errorf("%w: worker %s is revoked", ErrNotCurrent, w)
	}
	return nil
}

// ErrBadCredential is returned by Authenticate when a session credential is
// malformed or matches no enrolled worker instance.
var ErrBadCredential = errors.New("invalid session credential")

// ErrCredentialExpired is returned by Authenticate when the credential's
// validity lapsed (it slides only while its worker is connected).
var ErrCredentialExpired = errors.New("session credential expired")

// ErrNotInPool is returned by Authenticate when the credential's worker was
// revoked or deregistered (inactive): it holds no lease and may not use the
// data plane until it reconnects (an inactive worker) or ever (revoked).
var ErrNotInPool = errors.New("worker is not in the pool")

// Authenticate answers "whose session credential is this, and may it use
// the data plane at now?" (SPEC §14: the data plane accepts only a valid session
// credential). It is valid while its worker is active, not revoked, and now
// is before the credential's expiry. It is the credential half of
// CheckWrite's decision (core/data.go).
func (o *Orchestrator) Authenticate(now time.Time, credential string) (WorkerID, error) {
	a := o.CheckWrite(now, credential, 0)
	if err := a.Err(); err != nil {
		return "", err
	}
	return a.Worker, nil
}

// RunIDs lists every run, in submission order.
func (o *Orchestrator) RunIDs() []RunID {
	return o.inSubmissionOrder(sortedKeys(o.runs))
}

// GroupRunIDs lists the runs whose spec names a run concurrency group
// (SPEC §8a), finished or not, in RunIDs' order: RunIDs without the runs a
// per-batch check of the groups (spec.CheckGroupCaps) passes over.
func (o *Orchestrator) GroupRunIDs() []RunID {
	var ids []RunID
	for id, r := range o.runs {
		if r.Spec.Group.Name != "" {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return o.inSubmissionOrder(ids)
}

// inSubmissionOrder sorts ids, sorted by id, by submission time, then
// length, stably.
func (o *Orchestrator) inSubmissionOrder(ids []RunID) []RunID {
	sort.SliceStable(ids, func(i, j int) bool {
		return o.runs[ids[i]].SubmittedAt.Before(o.runs[ids[j]].SubmittedAt) ||
			(o.runs[ids[i]].SubmittedAt.Equal(o.runs[ids[j]].SubmittedAt) && len(ids[i]) < len(ids[j]))
	})
	return ids
}

// Run returns a run and its derived status.
func (o *Orchestrator) Run(id RunID) (RunRecord, string, bool) {
	r := o.runs[id]
	if r == nil {
		return RunRecord{}, "", false
	}
	c := *r
	c.Steps = append([]StepID(nil), r.Steps...)
	c.Children = append([]RunID(nil), r.Children...)
	return c, o.runStatus(r), true
}

// LiveStatus is the derived status of a run that is not finished:
// cancelling, failing or running. A finished run leaves the core in the
// batch that finishes it (SPEC §7a); its status is in its RunHistory.
func (r RunRecord) LiveStatus() string {
	switch {
	case r.CancelReason != "":
		return "cancelling"
	case r.Failed:
		return "failing"
	case r.GroupWait:
		return "waiting" // for room in its concurrency group (SPEC §8a)
	}
	return "running"
}

// StepTimes returns a step's run and when it was queued and started,
// without copying the step: the driver reads it right after each Step for
// its latency histograms (SPEC §16).
func (o *Orchestrator) StepTimes(id StepID) (run RunID, queuedAt, startedAt time.Time, ok bool) {
	s := o.steps[id]
	if s == nil {
		return "", time.Time{}, time.Time{}, false
	}
	return s.Run, s.QueuedAt, s.StartedAt, true
}

// LeaseGrantedAt returns when a live lease was granted.
func (o *Orchestrator) LeaseGrantedAt(id LeaseID) (time.Time, bool) {
	l := o.leases[id]
	if l == nil {
		return time.Time{}, false
	}
	return l.GrantedAt, true
}

// StepByID returns a copy of a step.
func (o *Orchestrator) StepByID(id StepID) (StepRecord, bool) {
	s := o.steps[id]
	if s == nil {
		return StepRecord{}, false
	}
	return copyStep(s), true
}

// StepSpecOf returns the declaration a step was expanded from.
func (o *Orchestrator) StepSpecOf(id StepID) (StepSpec, bool) {
	sp := o.specOf[id]
	if sp == nil {
		return StepSpec{}, false
	}
	return *sp, true
}

func copyStep(s *StepRecord) StepRecord {
	c := *s
	c.Deps = append([]StepID(nil), s.Deps...)
	if s.Outcome != nil {
		oc := *s.Outcome
		c.Outcome = &oc
	}
	return c
}

// Steps returns every step, sorted by id.
func (o *Orchestrator) Steps() []StepRecord {
	out := make([]StepRecord, 0, len(o.steps))
	for _, id := range sortedKeys(o.steps) {
		out = append(out, copyStep(o.steps[id]))
	}
	return out
}

// Lease returns one lease record, if the core holds it (its answers shared:
// read only).
func (o *Orchestrator) Lease(id LeaseID) (LeaseRecord, bool) {
	l := o.leases[id]
	if l == nil {
		return LeaseRecord{}, false
	}
	return *l, true
}

// StepIDs returns every step's id, sorted.
func (o *Orchestrator) StepIDs() []StepID { return sortedKeys(o.steps) }

// StepIDsIn returns the ids of the steps in state st, sorted.
func (o *Orchestrator) StepIDsIn(st State) []StepID {
	var ids []StepID
	for id, s := range o.steps {
		if s.State == st {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// StepIDsLeased returns the ids of the steps holding a lease (Lease not
// zero), sorted: what a check per batch reads without copying every step.
func (o *Orchestrator) StepIDsLeased() []StepID {
	var ids []StepID
	for id, s := range o.steps {
		if s.Lease != 0 {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// Leases returns every lease, sorted by id.
func (o *Orchestrator) Leases() []LeaseRecord {
	out := make([]LeaseRecord, 0, len(o.leases))
	for _, id := range sortedKeys(o.leases) {
		l := *o.leases[id]
		l.Answers = append([]AnsweredReport(nil), l.Answers...)
		out = append(out, l)
	}
	return out
}

// Workers returns every worker, sorted by id, with whether it is connected.
func (o *Orchestrator) Workers() []WorkerView {
	out := make([]WorkerView, 0, len(o.workers))
	for _, id := range sortedKeys(o.workers) {
		w := *o.workers[id]
		w.LastHeartbeat = w.clock // the live clock, not the recorded one (§8)
		w.Tags = append([]string(nil), w.Tags...)
		w.Labels = copyMap(w.Labels)
		out = append(out, WorkerView{WorkerRecord: w, Connected: o.connected(id), Leases: len(o.workerLeases[id])})
	}
	return out
}

// WorkerClock returns a worker's heartbeat clock (§8), Workers'
// LastHeartbeat for it, without copying every worker.
func (o *Orchestrator) WorkerClock(id WorkerID) (time.Time, bool) {
	w := o.workers[id]
	if w == nil {
		return time.Time{}, false
	}
	return w.clock, true
}

// WorkerView is a worker with its live connection state.
type WorkerView struct {
	WorkerRecord
	Connected bool
	Leases    int // current leases
}

// Tokens returns every token, sorted by name.
func (o *Orchestrator) Tokens() []TokenRecord {
	out := make([]TokenRecord, 0, len(o.tokens))
	for _, n := range sortedKeys(o.tokens) {
		out = append(out, *o.tokens[n])
	}
	return out
}

// Events returns a run's server events in order.
func (o *Orchestrator) Events(run RunID) []ServerEvent {
	return append([]ServerEvent(nil), o.events[run]...)
}

// StepLogs returns the stored log lines of a step, lease by lease, each in
// arrival order.
func (o *Orchestrator) StepLogs(step StepID) []StepLogLine {
	var out []StepLogLine
	for _, id := range sortedKeys(o.leases) {
		if o.leases[id].Step == step {
			out = append(out, o.logs[id]...)
		}
	}
	return out
}

// LeaseLogsView returns lease id's stored log lines, in arrival order, of
// index from on (0: all): what a reader that has the first from lines still
// lacks (SPEC §17, a stream resumed). Unlike the other queries it copies
// nothing: the lines are shared with the orchestrator, which only ever
// appends to a lease's log (and drops the whole log at archive), never
// changing a line it stored, so the view stays as it was returned and may
// be read after the call, on another goroutine, while the orchestrator
// steps on. Its capacity is its length, so an append to it copies. The
// caller must not change its lines. So a reader of a long log costs the
// caller's goroutine its reading, and the orchestrator's none (SPEC §12).
func (o *Orchestrator) LeaseLogsView(id LeaseID, from int) []StepLogLine {
	ls := o.logs[id]
	i := sort.Search(len(ls), func(i int) bool { return ls[i].Index >= from })
	return ls[i:len(ls):len(ls)]
}

// ClosedLeases returns the closed-lease table (SPEC §7a), sorted by lease.
func (o *Orchestrator) ClosedLeases() []ClosedLease {
	return o.closedAll()
}

// ClosedLease returns worker w's entry of the closed-lease table for a lease.
func (o *Orchestrator) ClosedLease(w WorkerID, id LeaseID) (ClosedLease, bool) {
	if e := o.closedFind(w, id); e != nil {
		return e.public(w), true
	}
	return ClosedLease{}, false
}

// ConnWorker returns the worker a connection speaks for (after its Hello).
func (o *Orchestrator) ConnWorker(c ConnID) (WorkerID, bool) {
	w, ok := o.conns[c]
	return w, ok
}

// Gauges are counts of the live state, for the orchestrator's metrics (SPEC
// §16). Archived runs are not live, so they are not counted.
type Gauges struct {
	Runs  map[string]int // live runs by status (running, failing, cancelling, success, failed, cancelled)
	Steps [numStates]int // live steps by state, indexed by State
	// Queued is the queue depth: steps queued with no lease, waiting for a
	// worker.
	Queued int
	// WorkersConnected counts workers with a control connection;
	// WorkersRecovering those disconnected within their grace window (their
	// leases wait for them, SPEC §4).
	WorkersConnected, WorkersRecovering int
	// LeasesInGrace counts current leases of recovering steps.
	LeasesInGrace int
}

// Gauges counts the live state: O(live runs, steps and workers).
func (o *Orchestrator) Gauges() Gauges {
	g := Gauges{Runs: map[string]int{}, Queued: len(o.ready)}
	for _, r := range o.runs {
		g.Runs[o.runStatus(r)]++
	}
	for _, s := range o.steps {
		if s.State < numStates {
			g.Steps[s.State]++
		}
		if s.State == StateRecovering && s.Lease != 0 {
			g.LeasesInGrace++
		}
	}
	for id, w := range o.workers {
		switch {
		case o.connected(id):
			g.WorkersConnected++
		case w.Active && !w.GraceUntil.IsZero():
			g.WorkersRecovering++
		}
	}
	return g
}

// States lists every step state, in order (Gauges.Steps is indexed by it).
func States() []State {
	out := make([]State, numStates)
	for i := range out {
		out[i] = State(i)
	}
	return out
}

// SubmittedAt returns when a live run was submitted (it never changes).
func (o *Orchestrator) SubmittedAt(run RunID) (time.Time, bool) {
	r := o.runs[run]
	if r == nil {
		return time.Time{}, false
	}
	return r.SubmittedAt, true
}
