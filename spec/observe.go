package spec

// The checker's internals: the journal that forgets lost batches, and the
// processing of one batch (messages, records, transitions, then the checks
// that need the whole batch applied).

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tether-run/tether/core"
)

// ---- the journal: undoing what lost batches did ----

type undoKind uint8

const (
	uStep undoKind = iota
	uCancel
	uCommit
	uLease
	uMax
	uWorker
	uToken
	uArch
)

type undo struct {
	kind   undoKind
	had    bool
	step   core.StepID
	lease  core.LeaseID
	name   string
	state  core.State
	commit commitFact
	owner  leaseOwner
	worker workerInfo
	token  tokenInfo
	arch   *Archive
}

type pendingBatch struct {
	id      batchID
	journal int // where this batch's journal entries start
	commits []core.LeaseID
	acks    []core.LeaseID
}

// batchID identifies a Ready by the backing arrays of its slices, which every
// copy of the Ready shares.
type batchID struct {
	rec *core.Record
	msg *core.Envelope
	ans *core.APIAnswer
	tr  *core.StepTransition
}

func idOf(rd core.Ready) batchID {
	var b batchID
	if len(rd.Records) > 0 {
		b.rec = &rd.Records[0]
	}
	if len(rd.Messages) > 0 {
		b.msg = &rd.Messages[0]
	}
	if len(rd.Answers) > 0 {
		b.ans = &rd.Answers[0]
	}
	if len(rd.Transitions) > 0 {
		b.tr = &rd.Transitions[0]
	}
	return b
}

func (b batchID) empty() bool { return b == batchID{} }

func (b batchID) same(o batchID) bool {
	return (b.rec != nil && b.rec == o.rec) || (b.msg != nil && b.msg == o.msg) ||
		(b.ans != nil && b.ans == o.ans) || (b.tr != nil && b.tr == o.tr)
}

func (c *Checker) setStep(s core.StepID, st core.State) {
	old, had := c.steps[s]
	c.journal = append(c.journal, undo{kind: uStep, step: s, had: had, state: old})
	c.steps[s] = st
}

func (c *Checker) setCancel(s core.StepID) {
	if c.cancel[s] {
		return
	}
	c.journal = append(c.journal, undo{kind: uCancel, step: s})
	c.cancel[s] = true
}

func (c *Checker) setCommit(s core.StepID, f commitFact) {
	old, had := c.commits[s]
	c.journal = append(c.journal, undo{kind: uCommit, step: s, had: had, commit: old, lease: f.lease})
	c.commits[s] = f
	c.byLease[f.lease] = s
}

// setCurrent makes a lease current (with its owner) or not, keeping the
// per-worker counts.
func (c *Checker) setCurrent(l core.LeaseID, ow leaseOwner, current bool) {
	old, had := c.current[l]
	if !had && !current {
		return
	}
	c.journal = append(c.journal, undo{kind: uLease, lease: l, had: had, owner: old})
	c.putCurrent(l, ow, current)
}

func (c *Checker) putCurrent(l core.LeaseID, ow leaseOwner, current bool) {
	if old, had := c.current[l]; had {
		c.held[old.worker]--
		if c.held[old.worker] <= 0 {
			delete(c.held, old.worker)
		}
		delete(c.current, l)
	}
	if current {
		c.current[l] = ow
		c.held[ow.worker]++
	}
}

func (c *Checker) setMax(l core.LeaseID) {
	c.journal = append(c.journal, undo{kind: uMax, lease: c.maxLease})
	c.maxLease = l
}

func (c *Checker) setWorker(id core.WorkerID, w workerInfo) {
	old, had := c.workers[id]
	c.journal = append(c.journal, undo{kind: uWorker, name: string(id), had: had, worker: old})
	c.workers[id] = w
}

func (c *Checker) setToken(name string, t tokenInfo) {
	old, had := c.tokens[name]
	c.journal = append(c.journal, undo{kind: uToken, name: name, had: had, token: old})
	c.tokens[name] = t
}

// setArch replaces the archive (journaled: an Archive is immutable, so the
// old pointer is the undo).
func (c *Checker) setArch(a *Archive) {
	c.journal = append(c.journal, undo{kind: uArch, arch: c.arch})
	c.arch = a
}

func (c *Checker) rollback() {
	for i := len(c.journal) - 1; i >= 0; i-- {
		u := &c.journal[i]
		switch u.kind {
		case uArch:
			c.arch = u.arch
		case uStep:
			if u.had {
				c.steps[u.step] = u.state
			} else {
				delete(c.steps, u.step)
			}
		case uCancel:
			delete(c.cancel, u.step)
		case uCommit:
			if u.had {
				c.commits[u.step] = u.commit
			} else {
				delete(c.commits, u.step)
			}
			if !u.had || u.commit.lease != u.lease {
				delete(c.byLease, u.lease)
			}
		case uLease:
			c.putCurrent(u.lease, u.owner, u.had)
		case uMax:
			c.maxLease = u.lease
		case uWorker:
			if u.had {
				c.workers[core.WorkerID(u.name)] = u.worker
			} else {
				delete(c.workers, core.WorkerID(u.name))
			}
		case uToken:
			if u.had {
				c.tokens[u.name] = u.token
			} else {
				delete(c.tokens, u.name)
			}
		}
	}
	c.journal = c.journal[:0]
	for _, pb := range c.pending {
		for _, l := range pb.acks {
			if m, ok := c.leases[l]; ok && m.ack == ackProduced {
				m.ack = ackNone
				c.leases[l] = m
			}
		}
	}
	c.pending = c.pending[:0]
}

// ---- one batch ----

// batchScratch collects what one batch touched, for the checks that run once
// the whole batch is applied. It is reused from batch to batch.
type batchScratch struct {
	touched    map[core.StepID]bool
	workers    map[core.WorkerID]bool
	steps      []core.StepID   // touched, in first-touch order (deterministic details)
	wlist      []core.WorkerID // workers, likewise
	grants     []leaseRec
	dispatches []dispatchAt
	history    []core.Record // the batch's history records (SPEC §7a)
	ended      []core.StepID // steps of leases the batch's records made not current
}

func (b *batchScratch) touch(s core.StepID) {
	if !b.touched[s] {
		b.touched[s] = true
		b.steps = append(b.steps, s)
	}
}

func (b *batchScratch) touchWorker(w core.WorkerID) {
	if !b.workers[w] {
		b.workers[w] = true
		b.wlist = append(b.wlist, w)
	}
}

type dispatchAt struct {
	conn  core.ConnID
	lease core.LeaseID
	step  core.StepID
}

func (b *batchScratch) reset() {
	if b.touched == nil {
		b.touched = map[core.StepID]bool{}
		b.workers = map[core.WorkerID]bool{}
	}
	clear(b.touched)
	clear(b.workers)
	b.steps = b.steps[:0]
	b.wlist = b.wlist[:0]
	b.grants = b.grants[:0]
	b.dispatches = b.dispatches[:0]
	b.history = b.history[:0]
	b.ended = b.ended[:0]
}

// The fields of the records the checker reads (json ignores the rest).
type (
	leaseRec struct {
		ID      core.LeaseID
		Step    core.StepID
		Worker  core.WorkerID
		Current bool
	}
	workerRec struct {
		ID       core.WorkerID
		Name     string
		Tags     []string
		Labels   map[string]string
		Platform string
		Slots    int
		Ahead    int
		Active   bool
		Revoked  bool
	}
	tokenRec struct {
		Name      string
		ExpiresAt time.Time
		Consumed  bool
		Revoked   bool
	}
)

func leaseKeyID(key string) (core.LeaseID, bool) {
	kind, id, ok := strings.Cut(key, "/")
	if !ok || kind != core.KindLease {
		return 0, false
	}
	var n uint64
	for _, ch := range id {
		if ch < '0' || ch > '9' {
			return 0, false
		}
		n = n*10 + uint64(ch-'0')
	}
	return core.LeaseID(n), true
}

func (c *Checker) batch(o *core.Orchestrator, rd core.Ready) {
	c.live++
	b := &c.b
	b.reset()
	pb := pendingBatch{id: idOf(rd), journal: len(c.journal)}
	for _, a := range rd.Answers {
		if a.Token != "" && a.Err == "" {
			name, _, _ := strings.Cut(a.Token, ".")
			c.issued[name] = a.Token
		}
	}
	// Messages first: answers are judged against the state before the batch.
	for _, e := range rd.Messages {
		switch m := e.Msg.(type) {
		case core.Welcome:
			c.observeWelcome(o, e.Conn, m)
			c.conns[e.Conn] = m.Worker
		case core.Close, core.Refused:
			delete(c.conns, e.Conn)
		case core.Answer:
			if m.Verdict == core.Committed {
				c.observeCommitted(e.Conn, m, &pb)
			}
		case core.Dispatch:
			c.observeDispatch(e.Conn, m)
		case core.StartAck:
			if m.OK {
				meta := c.leases[m.Lease]
				if meta.ack < ackProduced {
					meta.ack = ackProduced
					c.leases[m.Lease] = meta
					pb.acks = append(pb.acks, m.Lease)
				}
			}
		}
	}
	for _, r := range rd.Records {
		kind, id, _ := strings.Cut(r.Key, "/")
		switch kind {
		case core.KindLease:
			c.applyLease(r)
		case core.KindWorker:
			c.applyWorker(r)
		case core.KindToken:
			c.applyToken(r)
		case core.KindStep:
			b.touch(core.StepID(id))
		case core.KindHistory:
			b.history = append(b.history, r)
		}
	}
	for _, t := range rd.Transitions {
		c.observeTransition(t)
	}
	for _, r := range b.history {
		c.observeHistory(r)
	}
	c.afterBatch(o)
	c.checkArchived(o)
	if !pb.id.empty() {
		c.pending = append(c.pending, pb)
	}
}

func describeOutcome(o core.Outcome) string {
	s := o.Status.String()
	if o.Status == core.OutcomeFailure {
		s += fmt.Sprintf(" exit %d", o.ExitCode)
	}
	if o.Message != "" {
		s += fmt.Sprintf(" %q", o.Message)
	}
	return s
}

func (f commitFact) String() string {
	s := fmt.Sprintf("lease %d request %d", f.lease, f.request)
	if f.hasOutcome {
		s += " (" + describeOutcome(f.outcome) + ")"
	}
	return s
}

// observeCommitted judges one COMMITTED answer (invariants 1, 3 and 5)
// against the state before its batch, and records the commit.
func (c *Checker) observeCommitted(conn core.ConnID, a core.Answer, pb *pendingBatch) {
	var rep *core.Report
	if rcv, ok := c.in.(core.Received); ok && rcv.Conn == conn {
		if r, ok := rcv.Msg.(core.Report); ok && r.Lease == a.Lease && r.Request == a.Request {
			rep = &r
		}
	}
	step := c.leases[a.Lease].step
	c.eval(invCommit)
	switch {
	case rep != nil && step == "":
		step = rep.Step
	case rep != nil && rep.Step != step:
		c.fail(invCommit, "lease %d of step %s answered COMMITTED to a report naming step %s", a.Lease, step, rep.Step)
	case step == "":
		c.fail(invCommit, "COMMITTED answer for lease %d request %d, a lease never granted", a.Lease, a.Request)
		return
	}
	key := tryKey(step, c.leases[a.Lease].try)
	f, committed := c.commits[key]
	repeat := committed && f.lease == a.Lease && f.request == a.Request &&
		(rep == nil || !f.hasOutcome || f.outcome == rep.Outcome)
	now := commitFact{lease: a.Lease, request: a.Request}
	if rep != nil {
		now.outcome, now.hasOutcome = rep.Outcome, true
	}
	if committed && !repeat {
		c.fail(invCommit, "step %s committed twice: %s, then %s", step, f, now)
	}
	c.eval(invStale)
	if _, cur := c.current[a.Lease]; !cur && !repeat {
		c.fail(invStale, "report of step %s under lease %d request %d answered COMMITTED, but the lease was not current before the batch", step, a.Lease, a.Request)
	}
	c.eval(invCancelled)
	if c.cancel[step] && !repeat {
		status := core.OutcomeStatus(0)
		if rep != nil {
			status = rep.Outcome.Status
		} else if st, ok := c.view().StepByID(step); ok && st.Outcome != nil {
			status = st.Outcome.Status // no report seen: the core's own record
		}
		cleanup := status == core.OutcomeCleanupFailed && c.steps[step] == core.StateCancelling
		if !cleanup {
			c.fail(invCancelled, "step %s was cancelled (it is %s) and then %s was answered COMMITTED", step, c.steps[step], now)
		}
	}
	if !committed {
		c.setCommit(key, now)
		pb.commits = append(pb.commits, a.Lease)
	}
	c.b.touch(step)
}

// observeDispatch judges a Dispatch against the ground truth of invariant 2
// and learns the lease.
func (c *Checker) observeDispatch(conn core.ConnID, m core.Dispatch) {
	c.eval(invWriteOnce)
	// The try the lease belongs to is the step's as the batch left it: a
	// grant is the batch's last act, after any RETRY and its backoff timer.
	meta := leaseMeta{step: m.Step, worker: c.conns[conn], writes: m.Writes}
	if st, ok := c.o.StepByID(m.Step); ok {
		meta.try = st.Tries
	}
	if sp, ok := c.o.StepSpecOf(m.Step); ok {
		meta.idem = sp.Writes && sp.Idempotent
	}
	c.leases[m.Lease] = meta
	if p, ok := c.wstarted[c.writeKey(m.Step, m.Lease)]; ok && p.lease != m.Lease {
		c.fail(invWriteOnce, "write-bearing step %s, whose process started under lease %d on worker %s, was dispatched again under lease %d", m.Step, p.lease, p.worker, m.Lease)
	}
	c.b.dispatches = append(c.b.dispatches, dispatchAt{conn: conn, lease: m.Lease, step: m.Step})
}

// observeWelcome judges a Welcome (invariant 7): a credential is issued only
// to the enrollment hello of the same batch, with a token that was issued,
// unconsumed, unrevoked and unexpired before it; a revoked worker is never
// welcomed back.
func (c *Checker) observeWelcome(o *core.Orchestrator, conn core.ConnID, m core.Welcome) {
	c.eval(invTokens)
	if m.Credential == "" {
		if w, ok := c.workers[m.Worker]; ok && w.revoked {
			c.fail(invTokens, "revoked worker %s was welcomed back on connection %d", m.Worker, conn)
		}
		return
	}
	rcv, _ := c.in.(core.Received)
	h, isHello := rcv.Msg.(core.Hello)
	if !isHello || rcv.Conn != conn || h.Token == "" {
		c.fail(invTokens, "worker %s was issued a credential on connection %d without an enrollment hello on it", m.Worker, conn)
		return
	}
	name, _, _ := strings.Cut(h.Token, ".")
	t, known := c.tokens[name]
	now := o.Now()
	_, enrolled := c.workers[m.Worker]
	switch {
	case !known || c.issued[name] != h.Token:
		c.fail(invTokens, "worker %s enrolled on connection %d with token %q, which the API never issued", m.Worker, conn, name)
	case t.consumed:
		c.fail(invTokens, "worker %s enrolled on connection %d with token %s, which was already consumed", m.Worker, conn, name)
	case t.revoked:
		c.fail(invTokens, "worker %s enrolled on connection %d with token %s, which was revoked", m.Worker, conn, name)
	case !now.Before(t.expires):
		c.fail(invTokens, "worker %s enrolled on connection %d with token %s at %s, which expired at %s", m.Worker, conn, name, now.Format(time.RFC3339Nano), t.expires.Format(time.RFC3339Nano))
	case h.Worker != m.Worker:
		c.fail(invTokens, "hello of worker %s with token %s was welcomed as worker %s", h.Worker, name, m.Worker)
	case enrolled:
		c.fail(invTokens, "worker %s enrolled a second time, with token %s", m.Worker, name)
	}
}

// applyLease applies one lease record (invariant 3: a lease that becomes
// current is a new grant with a greater id than any before).
func (c *Checker) applyLease(r core.Record) {
	c.eval(invStale)
	id, ok := leaseKeyID(r.Key)
	var lr leaseRec
	switch {
	case !ok:
		c.fail(invStale, "record key %q is not a lease key", r.Key)
		return
	case r.Delete:
		lr.ID = id
	default:
		if err := decodeLeaseRec(r.Value, &lr); err != nil || lr.ID != id {
			c.fail(invStale, "lease record %s does not decode (%v)", r.Key, err)
			return
		}
		m := c.leases[id]
		m.step, m.worker = lr.Step, lr.Worker
		c.leases[id] = m
	}
	old, was := c.current[id]
	switch {
	case lr.Current && !was && id <= c.maxLease:
		c.fail(invStale, "lease %d of step %s became current again (the greatest lease granted so far is %d): a lease resurrected", id, lr.Step, c.maxLease)
	case lr.Current && !was:
		c.setMax(id)
		c.b.grants = append(c.b.grants, lr)
	case lr.Current && (old.step != lr.Step || old.worker != lr.Worker):
		c.fail(invStale, "current lease %d changed hands: step %s on worker %s became step %s on worker %s", id, old.step, old.worker, lr.Step, lr.Worker)
	}
	if was {
		c.b.touchWorker(old.worker)
	}
	if lr.Current {
		c.b.touchWorker(lr.Worker)
	}
	if was && !lr.Current {
		c.b.ended = append(c.b.ended, old.step)
	}
	if was != lr.Current || old.step != lr.Step || old.worker != lr.Worker {
		c.setCurrent(id, leaseOwner{lr.Step, lr.Worker}, lr.Current)
	}
}

// decodeLeaseRec decodes a lease record's fields the checker reads, as
// json.Unmarshal into a leaseRec does: through core's decoder when the
// whole record decodes (then those fields decode alike), else through
// encoding/json.
func decodeLeaseRec(b []byte, lr *leaseRec) error {
	var full core.LeaseRecord
	if core.DecodeLease(b, &full) == nil {
		*lr = leaseRec{ID: full.ID, Step: full.Step, Worker: full.Worker, Current: full.Current}
		return nil
	}
	return json.Unmarshal(b, lr)
}

// decodeWorkerRec and decodeTokenRec decode a worker's or a token's
// record as json.Unmarshal into a workerRec or a tokenRec does, as
// decodeLeaseRec does a lease's.
func decodeWorkerRec(b []byte, wr *workerRec) error {
	var full core.WorkerRecord
	if core.DecodeWorker(b, &full) == nil {
		*wr = workerRec{ID: full.ID, Name: full.Name, Tags: full.Tags, Labels: full.Labels, Platform: full.Platform,
			Slots: full.Slots, Ahead: full.Ahead, Active: full.Active, Revoked: full.Revoked}
		return nil
	}
	return json.Unmarshal(b, wr)
}

func decodeTokenRec(b []byte, tr *tokenRec) error {
	var full core.TokenRecord
	if core.DecodeToken(b, &full) == nil {
		*tr = tokenRec{Name: full.Name, ExpiresAt: full.ExpiresAt, Consumed: full.Consumed, Revoked: full.Revoked}
		return nil
	}
	return json.Unmarshal(b, tr)
}

func (c *Checker) applyWorker(r core.Record) {
	if r.Delete {
		c.eval(invSlots)
		c.fail(invSlots, "worker record %s was deleted", r.Key)
		return
	}
	_, id, _ := strings.Cut(r.Key, "/")
	if old, had := c.workers[core.WorkerID(id)]; had {
		// Most worker records are heartbeats: read the two flags that can
		// change without decoding the record.
		active, ok1 := jsonBool(r.Value, `"Active":`)
		revoked, ok2 := jsonBool(r.Value, `"Revoked":`)
		if ok1 && ok2 && old.active == active && old.revoked == revoked {
			return
		}
	}
	var wr workerRec
	if err := decodeWorkerRec(r.Value, &wr); err != nil {
		c.eval(invSlots)
		c.fail(invSlots, "worker record %s does not decode (%v)", r.Key, err)
		return
	}
	old, had := c.workers[wr.ID]
	if had && old.active == wr.Active && old.revoked == wr.Revoked && old.slots == wr.Slots && old.ahead == wr.Ahead {
		return // a heartbeat: nothing the invariants look at changed
	}
	c.setWorker(wr.ID, workerInfo{
		WorkerTraits: WorkerTraits{Name: wr.Name, Tags: wr.Tags, Labels: wr.Labels, Platform: wr.Platform},
		slots:        wr.Slots, ahead: wr.Ahead, active: wr.Active, revoked: wr.Revoked,
	})
	c.b.touchWorker(wr.ID)
}

func (c *Checker) applyToken(r core.Record) {
	if r.Delete {
		_, name, _ := strings.Cut(r.Key, "/")
		if _, had := c.tokens[name]; had {
			c.eval(invTokens)
			c.fail(invTokens, "token record %s was deleted", r.Key)
		}
		return
	}
	var tr tokenRec
	if err := decodeTokenRec(r.Value, &tr); err != nil {
		c.eval(invTokens)
		c.fail(invTokens, "token record %s does not decode (%v)", r.Key, err)
		return
	}
	c.setToken(tr.Name, tokenInfo{expires: tr.ExpiresAt, consumed: tr.Consumed, revoked: tr.Revoked})
}

// observeTransition judges one applied transition (invariant 4) and notes
// cancellations (invariant 5).
func (c *Checker) observeTransition(t core.StepTransition) {
	c.eval(invTable)
	if !InTable(t.From, t.Event, t.To) {
		c.fail(invTable, "step %s: %s --%s--> %s is not a row of the transition table", t.Step, t.From, t.Event, t.To)
	}
	cur, known := c.steps[t.Step]
	if !known {
		cur = core.StatePending // every step is born pending
	}
	switch {
	case cur == t.From:
	case Terminal(cur):
		c.fail(invTable, "terminal step %s (%s) changed: %s --%s--> %s", t.Step, cur, t.From, t.Event, t.To)
	default:
		c.fail(invTable, "step %s is %s but its next transition starts from %s (%s --%s--> %s)", t.Step, cur, t.From, t.From, t.Event, t.To)
	}
	c.setStep(t.Step, t.To)
	if t.To == core.StateCancelling || t.To == core.StateCancelled {
		c.setCancel(t.Step)
	}
	c.b.touch(t.Step)
}

// afterBatch runs the checks that need the whole batch applied: touched
// steps against the live orchestrator (1, 4), grants (3, 6), worker loads
// (6, 7).
func (c *Checker) afterBatch(o *core.Orchestrator) {
	b := &c.b
	for _, s := range b.steps {
		c.eval(invTable)
		st, ok := o.StepByID(s)
		cur, known := c.steps[s]
		switch {
		case !ok:
			// A step leaves the core only into its run's history record,
			// in the state its transitions led to (SPEC §7a).
			a, archived := c.arch.Step(s)
			switch {
			case known && !archived:
				c.fail(invTable, "step %s (%s) vanished: it is neither live nor in a history record", s, cur)
			case known && a.State != cur:
				c.fail(invTable, "step %s (%s) was archived as %s", s, cur, a.State)
			}
			if f, ok := c.commits[tryKey(s, a.Tries)]; ok && archived {
				c.eval(invCommit)
				c.checkShown(s, f, a, "in its run's history record")
			}
			continue
		case !known:
			if st.State != core.StatePending {
				c.fail(invTable, "step %s appeared as %s, not pending, without a transition", s, st.State)
			}
			c.setStep(s, st.State)
		case cur != st.State:
			c.fail(invTable, "step %s is %s but its transitions lead to %s: a state change without a transition", s, st.State, cur)
		}
		if f, ok := c.commits[tryKey(s, st.Tries)]; ok {
			c.eval(invCommit)
			c.checkShown(s, f, st, "")
		}
	}
	for _, g := range b.grants {
		c.checkGrant(o, g)
	}
	for _, d := range b.dispatches {
		c.eval(invStale)
		granted := false
		for _, g := range b.grants {
			if g.ID == d.lease {
				granted = true
			}
		}
		if !granted {
			c.fail(invStale, "Dispatch of lease %d (step %s) on connection %d, a lease not granted in this batch", d.lease, d.step, d.conn)
		}
	}
	for _, w := range b.wlist {
		info, ok := c.workers[w]
		n := c.held[w]
		c.eval(invSlots)
		switch {
		case n > 0 && !ok:
			c.fail(invSlots, "worker %s holds %d current leases but is not enrolled", w, n)
		case n > info.slots+info.ahead:
			c.fail(invSlots, "worker %s holds %d current leases %v with %d slots and %d ahead", w, n, c.leasesOf(w), info.slots, info.ahead)
		case n > info.slots:
			// Only a worker holding leases ahead can have more current
			// leases than slots: at most its slots of them started.
			if started := c.startedOf(w); len(started) > info.slots {
				c.fail(invSlots, "worker %s holds %d started leases %v with %d slots", w, len(started), started, info.slots)
			}
		}
		c.eval(invTokens)
		if info.revoked && n > 0 {
			c.fail(invTokens, "revoked worker %s holds %d current leases %v", w, n, c.leasesOf(w))
		}
	}
}

// startedOf lists a worker's current leases whose step is running,
// recovering or cancelling (SPEC §3: at most its slots).
func (c *Checker) startedOf(w core.WorkerID) []core.LeaseID {
	var ls []core.LeaseID
	for l, ow := range c.current {
		if ow.worker != w {
			continue
		}
		switch c.steps[ow.step] {
		case core.StateRunning, core.StateRecovering, core.StateCancelling:
			ls = append(ls, l)
		}
	}
	slices.Sort(ls)
	return ls
}

// leasesOf lists a worker's current leases (for a violation's detail only).
func (c *Checker) leasesOf(w core.WorkerID) []core.LeaseID {
	var ls []core.LeaseID
	for l, ow := range c.current {
		if ow.worker == w {
			ls = append(ls, l)
		}
	}
	slices.Sort(ls)
	return ls
}

// checkShown checks that a step shows its committed outcome and the terminal
// state it implies (invariant 1).
func (c *Checker) checkShown(s core.StepID, f commitFact, st core.StepRecord, when string) {
	if when != "" {
		when = " " + when
	}
	want := core.StateFailed
	switch {
	case f.hasOutcome && f.outcome.Status == core.OutcomeSuccess,
		!f.hasOutcome && st.Outcome != nil && st.Outcome.Status == core.OutcomeSuccess:
		want = core.StateSuccess
	}
	switch {
	case st.Outcome == nil:
		c.fail(invCommit, "step %s committed %s but shows no outcome%s (it is %s)", s, f, when, st.State)
	case f.hasOutcome && *st.Outcome != f.outcome:
		c.fail(invCommit, "step %s committed %s but shows outcome %s%s", s, f, describeOutcome(*st.Outcome), when)
	case st.State != want:
		c.fail(invCommit, "step %s committed %s but is %s%s, not %s", s, f, st.State, when, want)
	}
}

// checkGrant judges one new lease (invariants 3 and 6): sent to a connected,
// active, unrevoked worker that matches the step, the step's only current
// lease.
func (c *Checker) checkGrant(o *core.Orchestrator, g leaseRec) {
	c.eval(invStale)
	var other core.LeaseID
	for l, ow := range c.current {
		if ow.step == g.Step && l != g.ID && (other == 0 || l < other) {
			other = l
		}
	}
	if other != 0 {
		c.fail(invStale, "step %s holds two current leases, %d and %d", g.Step, other, g.ID)
	}
	c.eval(invSlots)
	var d *dispatchAt
	for i := range c.b.dispatches {
		if c.b.dispatches[i].lease == g.ID {
			d = &c.b.dispatches[i]
		}
	}
	switch {
	case d == nil:
		c.fail(invSlots, "lease %d of step %s was granted to worker %s without a Dispatch: the worker is not connected", g.ID, g.Step, g.Worker)
	case c.conns[d.conn] != g.Worker:
		c.fail(invSlots, "Dispatch of lease %d went to connection %d (worker %q), but the lease names worker %s", g.ID, d.conn, c.conns[d.conn], g.Worker)
	case d.step != g.Step:
		c.fail(invSlots, "Dispatch of lease %d names step %s, but the lease is of step %s", g.ID, d.step, g.Step)
	}
	w, ok := c.workers[g.Worker]
	if !ok {
		c.fail(invSlots, "lease %d of step %s was granted to worker %s, which is not enrolled", g.ID, g.Step, g.Worker)
		return
	}
	if !w.active || w.revoked {
		c.fail(invSlots, "lease %d of step %s was granted to worker %s, which is inactive or revoked (active=%v revoked=%v)", g.ID, g.Step, g.Worker, w.active, w.revoked)
	}
	sp, ok := o.StepSpecOf(g.Step)
	st, _ := o.StepByID(g.Step)
	if !ok {
		c.fail(invSlots, "lease %d was granted for step %s, which does not exist", g.ID, g.Step)
		return
	}
	if sp.Type == "task" {
		c.fail(invSlots, "lease %d was granted for task step %s, which runs on the orchestrator", g.ID, g.Step)
		return
	}
	if sp.Workflow != nil {
		c.fail(invSlots, "lease %d was granted for workflow step %s, which runs as a child run (SPEC §2)", g.ID, g.Step)
		return
	}
	if cur := c.steps[g.Step]; cur != core.StateQueued {
		c.fail(invSlots, "lease %d was granted for step %s, which is %s, not queued", g.ID, g.Step, cur)
	}
	req, known := SpecRequiredTags(sp)
	if !known {
		c.fail(invSlots, "lease %d was granted for step %s of type %q runner %q, which SPEC §8 does not know", g.ID, g.Step, sp.Type, sp.Runner)
		return
	}
	if !equalStrings(req, st.RequiredTags) {
		c.fail(invSlots, "step %s needs tags %v by SPEC §8, but the core derived %v", g.Step, req, st.RequiredTags)
	}
	if ok, why := Matches(sp, req, w.WorkerTraits); !ok {
		c.fail(invSlots, "lease %d of step %s was granted to worker %s, which does not match: %s", g.ID, g.Step, g.Worker, why)
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// jsonBool finds a boolean field in encoding/json output: the field name
// followed by true or false (a label key or a tag of the same name is
// followed by a string, a comma or a bracket instead).
func jsonBool(b []byte, field string) (value, ok bool) {
	for {
		i := bytes.Index(b, []byte(field))
		if i < 0 {
			return false, false
		}
		b = b[i+len(field):]
		switch {
		case bytes.HasPrefix(b, []byte("true")):
			return true, true
		case bytes.HasPrefix(b, []byte("false")):
			return false, true
		}
	}
}
