package spec

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/tether-run/tether/core"
)

// Violation is one broken invariant: its name (an Invariants entry, or
// RunsFinish / NoWriteStepSurvivesWorkerLoss for liveness) and one line of
// concrete ids saying what broke it.
type Violation struct {
	Invariant string
	Detail    string
}

func (v *Violation) Error() string { return "invariant " + v.Invariant + " violated: " + v.Detail }

// Invariant is a named safety predicate over what a Checker has recorded.
type Invariant struct {
	Name  string
	Check func(*Checker) *Violation
}

// Invariants are the seven safety invariants of SPEC §13, in order.
var Invariants = []Invariant{
	{"AtMostOneCommit", AtMostOneCommit},
	{"WriteStepRunsOnce", WriteStepRunsOnce},
	{"NoStaleCommit", NoStaleCommit},
	{"TransitionsFollowTable", TransitionsFollowTable},
	{"CancelledNeverCommitted", CancelledNeverCommitted},
	{"SlotsAndMatching", SlotsAndMatching},
	{"TokensAndRevocation", TokensAndRevocation},
}

// Indexes into Invariants (kept apart from it so that the predicates can name
// their own invariant without an initialization cycle).
const (
	invCommit = iota
	invWriteOnce
	invStale
	invTable
	invCancelled
	invSlots
	invTokens
	numInv
)

var invNames = [numInv]string{
	"AtMostOneCommit", "WriteStepRunsOnce", "NoStaleCommit", "TransitionsFollowTable",
	"CancelledNeverCommitted", "SlotsAndMatching", "TokensAndRevocation",
}

// Checker records what happens around one orchestrator — its inputs, its
// batches, what the driver made durable, crashes and restores, what reached
// the workers, and the ground truth of processes and external writes — and
// checks the safety invariants of SPEC §13 against it incrementally: each
// recorded event costs time proportional to its own size, never to history.
//
// # What the driver must call, in event order
//
//   - Input just before Orchestrator.Step is given that input;
//   - Batch right after Step returned (o is the state after the batch);
//   - Persisted once the driver made a batch durable (a write-ahead log
//     persists in order: a batch being durable makes every batch produced
//     before it durable too; a Ready the checker never saw, such as a
//     group-commit merge, makes every batch so far durable);
//   - Crash when the orchestrator process dies (batches not yet Persisted are
//     lost: the checker forgets what they did), then Restored with the
//     orchestrator core.Restore built and its Ready (which is then a batch
//     like any other and must be Persisted too);
//   - Delivered when a message reaches its worker — before that worker acts
//     on it, so that a StartAck is Delivered before the process it allows is
//     reported by ProcessStarted;
//   - ProcessStarted, ProcessStopped and ExternalWrite as the ground truth of
//     what step processes did.
//
// Check evaluates the seven invariants and returns the first violation (a
// violation, once found, is reported by every later Check). A Checker is not
// safe for concurrent use.
type Checker struct {
	// Verify adds costly cross-checks to every Check after a batch: the
	// incremental view is compared with full scans of the orchestrator
	// (leases, steps, workers, tokens, outcomes). For tests of the checker
	// and for short runs; its cost grows with history.
	Verify bool

	found   [numInv]*Violation
	counts  [numInv]uint64
	checks  uint64
	live    uint64 // batches seen; Verify runs once per batch
	checked [numInv]uint64

	o  *core.Orchestrator // after the last batch; nil after a crash
	in core.Input         // the input of the batch being produced

	// The orchestrator's durable-or-pending state as the checker sees it.
	// Every change is journaled while its batch is pending and undone at a
	// crash, so after Crash these hold exactly the durable state.
	steps    map[core.StepID]core.State
	cancel   map[core.StepID]bool         // a cancel took effect on the step
	commits  map[core.StepID]commitFact   // the step's COMMITTED report
	byLease  map[core.LeaseID]core.StepID // committed lease → its step
	current  map[core.LeaseID]leaseOwner  // current leases only
	held     map[core.WorkerID]int        // current leases per worker
	maxLease core.LeaseID                 // greatest lease id granted
	workers  map[core.WorkerID]workerInfo
	tokens   map[string]tokenInfo

	journal []undo
	pending []pendingBatch
	done    [8]batchID // the last batches made durable (a repeated Persisted is a no-op)
	doneAt  int

	// Not rolled back: facts about every lease ever seen, the token strings
	// the API handed out, and the live connections (none survive a crash).
	leases map[core.LeaseID]leaseMeta
	issued map[string]string
	conns  map[core.ConnID]core.WorkerID

	// Ground truth from the world.
	wstarted map[core.StepID]processFact // write-bearing step → its one process
	writer   map[core.StepID]core.LeaseID
	procs    map[core.LeaseID]core.WorkerID // processes running now

	// Archival (SPEC §7a): the history records of the batches seen
	// (journaled: a lost batch's history is forgotten with it), and
	// ArchivedWhenDone's verdict and count.
	arch      *Archive
	archFound *Violation
	archEvals uint64

	b batchScratch
}

type commitFact struct {
	lease      core.LeaseID
	request    uint64
	outcome    core.Outcome
	hasOutcome bool // the report was seen (always, unless a batch was doctored)
	durable    bool // its batch was persisted
	delivered  bool // the COMMITTED answer reached the worker
}

type leaseOwner struct {
	step   core.StepID
	worker core.WorkerID
}

// ack states of a lease's StartAck{ok}.
const (
	ackNone uint8 = iota
	ackProduced
	ackDurable
	ackDelivered
)

type leaseMeta struct {
	step   core.StepID
	worker core.WorkerID
	writes bool
	ack    uint8
	ackTo  core.WorkerID
	try    int  // the step's try the lease was granted in (SPEC §1 RETRY)
	idem   bool // its step is write-bearing and idempotent: may run once per try
}

// tryKey names one try of a step, for the facts kept per try (SPEC §1
// RETRY: each try may commit once): the step's id for its first try,
// "<step>/<n>" for try n+1. No step id holds a second '/', so the keys
// never meet a step's.
func tryKey(s core.StepID, try int) core.StepID {
	if try == 0 {
		return s
	}
	return core.StepID(fmt.Sprintf("%s/%d", s, try))
}

// baseStep is the step a tryKey names.
func baseStep(k core.StepID) core.StepID {
	if i := strings.IndexByte(string(k), '/'); i >= 0 {
		if j := strings.IndexByte(string(k[i+1:]), '/'); j >= 0 {
			return k[:i+1+j]
		}
	}
	return k
}

// writeKey is the key of invariant 2's facts for lease l of step s: the
// step, or its try when the step is idempotent (SPEC §1: an idempotent
// write-bearing step runs at most once per try).
func (c *Checker) writeKey(s core.StepID, l core.LeaseID) core.StepID {
	if m, ok := c.leases[l]; ok && m.idem {
		return tryKey(s, m.try)
	}
	return s
}

type workerInfo struct {
	WorkerTraits
	slots   int
	ahead   int // leases held ahead beyond the slots (SPEC §3)
	active  bool
	revoked bool
}

type tokenInfo struct {
	expires  time.Time
	consumed bool
	revoked  bool
}

type processFact struct {
	lease  core.LeaseID
	worker core.WorkerID
}

// NewChecker returns a Checker for a fresh orchestrator.
func NewChecker() *Checker {
	return &Checker{
		steps:    map[core.StepID]core.State{},
		cancel:   map[core.StepID]bool{},
		commits:  map[core.StepID]commitFact{},
		byLease:  map[core.LeaseID]core.StepID{},
		current:  map[core.LeaseID]leaseOwner{},
		held:     map[core.WorkerID]int{},
		workers:  map[core.WorkerID]workerInfo{},
		tokens:   map[string]tokenInfo{},
		leases:   map[core.LeaseID]leaseMeta{},
		issued:   map[string]string{},
		conns:    map[core.ConnID]core.WorkerID{},
		wstarted: map[core.StepID]processFact{},
		writer:   map[core.StepID]core.LeaseID{},
		procs:    map[core.LeaseID]core.WorkerID{},
	}
}

// Checks returns how many predicate evaluations were made so far: one per
// rule applied to one recorded fact (a transition against the table, an
// answer against the commit register, a grant against slots and matching…)
// plus one per invariant per Check.
func (c *Checker) Checks() uint64 { return c.checks }

// ChecksOf returns how many recorded facts one invariant (by name) was
// evaluated on, so a driver can show that none of them was vacuous (Check
// calls themselves are not counted here).
func (c *Checker) ChecksOf(name string) uint64 {
	if name == PropArchivedWhenDone {
		return c.archEvals
	}
	for i, n := range invNames {
		if n == name {
			return c.counts[i]
		}
	}
	return 0
}

// eval counts one evaluation of invariant i's rule on one recorded fact.
func (c *Checker) eval(i int) {
	c.counts[i]++
	c.checks++
}

// fail records a violation of invariant i (the first one stays).
func (c *Checker) fail(i int, format string, args ...any) {
	if c.found[i] == nil {
		c.found[i] = &Violation{Invariant: invNames[i], Detail: fmt.Sprintf(format, args...)}
	}
}

// Check evaluates every invariant now, then ArchivedWhenDone, and returns
// the first violation, or nil when all hold.
func (c *Checker) Check() *Violation {
	for _, inv := range Invariants {
		if v := inv.Check(c); v != nil {
			return v
		}
	}
	return ArchivedWhenDone(c)
}

// Archive returns the history records of the batches seen so far that a
// crash has not taken back (SPEC §7a).
func (c *Checker) Archive() *Archive { return c.arch }

// View merges o's live state with the checker's archive.
func (c *Checker) View(o *core.Orchestrator) View { return View{Orchestrator: o, A: c.arch} }

// view is the checker's own orchestrator merged with its archive.
func (c *Checker) view() View { return c.View(c.o) }

// verifyDue reports whether invariant i's Verify cross-check should run now
// (Verify is on, there is a live orchestrator, and a batch came since).
func (c *Checker) verifyDue(i int) bool {
	if !c.Verify || c.o == nil || c.checked[i] == c.live {
		return false
	}
	c.checked[i] = c.live
	return true
}

// ---- the recorder side ----

// Input records the input the orchestrator is about to be stepped with.
func (c *Checker) Input(now time.Time, in core.Input) {
	c.in = in
	if d, ok := in.(core.Disconnected); ok {
		delete(c.conns, d.Conn)
	}
}

// Batch records a batch right after Step produced it; o is the state after
// the batch. The batch is pending until Persisted.
func (c *Checker) Batch(now time.Time, o *core.Orchestrator, rd core.Ready) {
	c.o = o
	c.batch(o, rd)
	c.in = nil
}

// Persisted records that the driver made rd durable (and with it every batch
// produced before it).
func (c *Checker) Persisted(now time.Time, rd core.Ready) {
	id := idOf(rd)
	if id.empty() || len(c.pending) == 0 {
		return
	}
	for _, d := range c.done {
		if d.same(id) {
			return
		}
	}
	k := len(c.pending) - 1
	for i, pb := range c.pending {
		if pb.id.same(id) {
			k = i
			break
		}
	}
	c.done[c.doneAt%len(c.done)] = id
	c.doneAt++
	for _, pb := range c.pending[:k+1] {
		for _, l := range pb.commits {
			if s, ok := c.byLease[l]; ok {
				if f := c.commits[s]; f.lease == l {
					f.durable = true
					c.commits[s] = f
				}
			}
		}
		for _, l := range pb.acks {
			if m, ok := c.leases[l]; ok && m.ack == ackProduced {
				m.ack = ackDurable
				c.leases[l] = m
			}
		}
	}
	end := len(c.journal)
	if k+1 < len(c.pending) {
		end = c.pending[k+1].journal
	}
	c.journal = append(c.journal[:0], c.journal[end:]...)
	rest := append(c.pending[:0], c.pending[k+1:]...)
	for i := range rest {
		rest[i].journal -= end
	}
	c.pending = rest
}

// Crash records that the orchestrator process died: what its unpersisted
// batches did is forgotten, and every connection is gone.
func (c *Checker) Crash(now time.Time) {
	c.rollback()
	c.o = nil
	c.in = nil
	clear(c.conns)
}

// Restored records an orchestrator rebuilt by core.Restore from the durable
// records, and its Ready, which is then checked like any batch. The rebuilt
// state must be the durable state the checker kept: no lease current that
// was not, no step in another state, no committed outcome missing.
func (c *Checker) Restored(now time.Time, o *core.Orchestrator, rd core.Ready) {
	if len(c.pending) > 0 || c.o != nil {
		c.Crash(now) // a restore without a recorded crash still lost the process
	}
	c.o = o
	c.in = nil
	// The state as loaded, before the restore's own re-arming transitions.
	loaded := map[core.StepID]core.State{}
	for _, t := range rd.Transitions {
		if _, ok := loaded[t.Step]; !ok {
			loaded[t.Step] = t.From
		}
	}
	seen := make(map[core.StepID]bool, len(c.steps))
	for _, s := range o.Steps() {
		c.eval(invTable)
		if h, ok := c.arch.Run(s.Run); ok {
			c.failArch("restore: step %s of run %s is live again after the restore, but its run was archived (%s)", s.ID, s.Run, h.Status)
		}
		st, ok := loaded[s.ID]
		if !ok {
			st = s.State
			loaded[s.ID] = st
		}
		seen[s.ID] = true
		c.eval(invTable)
		if durable, known := c.steps[s.ID]; known && durable != st {
			c.fail(invTable, "restore: step %s was durably %s but was restored as %s", s.ID, durable, st)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(c.steps)) {
		if seen[id] {
			continue
		}
		if a, ok := c.arch.Step(id); ok {
			if a.State != c.steps[id] {
				c.fail(invTable, "restore: step %s was durably %s but its history record says %s", id, c.steps[id], a.State)
			}
			continue
		}
		c.fail(invTable, "restore: step %s (durably %s) is missing after the restore and from history", id, c.steps[id])
	}
	for _, id := range slices.Sorted(maps.Keys(c.commits)) {
		c.eval(invCommit)
		s, _ := c.View(o).StepByID(baseStep(id))
		if tryKey(s.ID, s.Tries) != id {
			continue // the commit of a try that was retried (SPEC §1 RETRY)
		}
		f := c.commits[id]
		when := "after a restore"
		if f.delivered {
			when += " (its COMMITTED answer had reached the worker)"
		}
		c.checkShown(id, f, s, when)
	}
	// Leases: every lease current in the loaded state was current durably
	// (after the rollback, c.current holds exactly the durable set).
	prev := make(map[core.LeaseID]leaseOwner, len(c.current))
	for l, ow := range c.current {
		prev[l] = ow
	}
	clear(c.current)
	clear(c.held)
	durableMax := c.maxLease
	granted := map[core.LeaseID]bool{} // grants of the restore batch itself
	for _, r := range rd.Records {
		if id, ok := leaseKeyID(r.Key); ok {
			granted[id] = true
		}
	}
	for _, l := range o.Leases() {
		m := c.leases[l.ID]
		m.step, m.worker = l.Step, l.Worker
		c.leases[l.ID] = m
		if !l.Current {
			continue
		}
		c.eval(invStale)
		if l.ID > durableMax {
			if !granted[l.ID] {
				c.fail(invStale, "restore: lease %d of step %s is current after the restore but the durable state granted leases only up to %d", l.ID, l.Step, durableMax)
			}
			continue
		}
		if _, ok := prev[l.ID]; !ok {
			c.fail(invStale, "restore: lease %d of step %s is current after the restore but was not durably current (resurrected)", l.ID, l.Step)
		}
		c.putCurrent(l.ID, leaseOwner{l.Step, l.Worker}, true)
	}
	// Steps, workers and tokens are taken as loaded (their differences were
	// judged above); the restore batch is then checked like any other.
	for id, st := range loaded {
		c.steps[id] = st
	}
	clear(c.workers)
	for _, w := range o.Workers() {
		c.workers[w.ID] = infoOf(w.WorkerRecord)
	}
	clear(c.tokens)
	for _, t := range o.Tokens() {
		c.tokens[t.Name] = tokenInfo{expires: t.ExpiresAt, consumed: t.Consumed, revoked: t.Revoked}
	}
	c.batch(o, rd)
	// Every run the restore left in the core is judged (a store written
	// before archival has its finished runs archived by this batch).
	c.judgeRuns(o, o.RunIDs())
}

func infoOf(w core.WorkerRecord) workerInfo {
	return workerInfo{
		WorkerTraits: WorkerTraits{Name: w.Name, Tags: w.Tags, Labels: w.Labels, Platform: w.Platform},
		slots:        w.Slots, ahead: w.Ahead, active: w.Active, revoked: w.Revoked,
	}
}

// ---- ground truth ----

// Delivered records that message m from the orchestrator reached worker w.
// A COMMITTED answer must be one the checker holds as durable (a commit that
// leaves before its batch is persisted can vanish in a crash); a StartAck{ok}
// of a write-bearing step likewise.
func (c *Checker) Delivered(now time.Time, w core.WorkerID, m core.Msg) {
	switch m := m.(type) {
	case core.Answer:
		if m.Verdict != core.Committed {
			return
		}
		c.eval(invCommit)
		s, ok := c.byLease[m.Lease]
		f := c.commits[s]
		switch {
		case !ok || f.request != m.Request:
			c.fail(invCommit, "COMMITTED answer for lease %d request %d reached worker %s, but no such commit survives (was its batch lost?)", m.Lease, m.Request, w)
		case !f.durable:
			c.fail(invCommit, "COMMITTED answer for lease %d request %d (step %s) reached worker %s before its batch was persisted", m.Lease, m.Request, s, w)
		default:
			f.delivered = true
			c.commits[s] = f
		}
	case core.StartAck:
		meta, ok := c.leases[m.Lease]
		if !m.OK || !ok || !meta.writes {
			return
		}
		c.eval(invWriteOnce)
		if meta.ack < ackDurable {
			c.fail(invWriteOnce, "StartAck{ok} for lease %d of write-bearing step %s reached worker %s before its START was persisted", m.Lease, meta.step, w)
		}
		meta.ack, meta.ackTo = ackDelivered, w
		c.leases[m.Lease] = meta
	}
}

// ProcessStarted records that a step's process started on worker w under
// lease l; writes says the step is write-bearing.
func (c *Checker) ProcessStarted(now time.Time, w core.WorkerID, l core.LeaseID, s core.StepID, writes bool) {
	c.procs[l] = w
	if !writes {
		return
	}
	c.eval(invWriteOnce)
	key := c.writeKey(s, l)
	if p, ok := c.wstarted[key]; !ok {
		c.wstarted[key] = processFact{lease: l, worker: w}
	} else if p.lease != l {
		c.fail(invWriteOnce, "write-bearing step %s ran twice: under lease %d on worker %s, then under lease %d on worker %s", s, p.lease, p.worker, l, w)
	}
	if m := c.leases[l]; m.ack != ackDelivered || m.ackTo != w {
		c.fail(invWriteOnce, "the process of write-bearing step %s started on worker %s under lease %d before a StartAck{ok} for that lease reached the worker", s, w, l)
	}
}

// ProcessStopped records that the process of lease l on worker w ended.
func (c *Checker) ProcessStopped(now time.Time, w core.WorkerID, l core.LeaseID) {
	delete(c.procs, l)
}

// ExternalWrite records that the process of write-bearing step s, lease l,
// wrote to the external system.
func (c *Checker) ExternalWrite(now time.Time, w core.WorkerID, l core.LeaseID, s core.StepID) {
	c.eval(invWriteOnce)
	key := c.writeKey(s, l)
	if p, ok := c.wstarted[key]; !ok || p.lease != l {
		c.fail(invWriteOnce, "write-bearing step %s wrote externally under lease %d on worker %s, which is not the lease its one process started under", s, l, w)
	}
	if prev, ok := c.writer[key]; ok && prev != l {
		c.fail(invWriteOnce, "write-bearing step %s wrote externally under two leases, %d and %d", s, prev, l)
	} else if !ok {
		c.writer[key] = l
	}
}

// ---- the seven predicates ----

// AtMostOneCommit is invariant 1: at most one COMMITTED outcome per step; a
// committed outcome never changes or vanishes, crash or not. A repeat of the
// very report that committed (same lease, request id and outcome) may be
// answered COMMITTED again; any other COMMITTED answer for a committed step
// breaks the rule. Once committed (and, after a crash, once durable), the
// step shows that outcome and the state it implies, success for ok and failed
// otherwise; a COMMITTED answer reaches a worker only after its batch was
// persisted.
func AtMostOneCommit(c *Checker) *Violation {
	c.checks++
	if c.verifyDue(invCommit) {
		v := c.view()
		for _, s := range v.Steps() {
			if s.Outcome == nil {
				continue
			}
			if sp, _ := v.StepSpecOf(s.ID); sp.Type == "task" || sp.Workflow != nil || s.ReusedFrom != "" {
				continue // a task step's outcome is the orchestrator's own, a workflow step's its child run's (PropChildOutcome), a reused one its old run's (REUSE)
			}
			if f, ok := c.commits[tryKey(s.ID, s.Tries)]; !ok {
				c.fail(invCommit, "step %s shows outcome %s that was never answered COMMITTED", s.ID, describeOutcome(*s.Outcome))
			} else {
				c.checkShown(s.ID, f, s, "")
			}
		}
		for _, id := range slices.Sorted(maps.Keys(c.commits)) {
			if _, ok := v.StepByID(baseStep(id)); !ok {
				c.fail(invCommit, "committed step %s vanished (neither live nor in history)", id)
			}
		}
	}
	return c.found[invCommit]
}

// WriteStepRunsOnce is invariant 2: a write-bearing step whose process ever
// started is never dispatched again and never runs on two workers. Its
// process starts only after a StartAck{ok} for its lease, sent after START
// was persisted, reached that worker; no Dispatch of the step under another
// lease follows; no second lease's process starts for it; and only one
// lease's process ever writes to the external system for it.
func WriteStepRunsOnce(c *Checker) *Violation {
	c.checks++
	if c.verifyDue(invWriteOnce) && len(c.wstarted) > 0 {
		for _, l := range c.view().Leases() {
			if p, ok := c.wstarted[c.writeKey(l.Step, l.ID)]; ok && l.ID > p.lease {
				c.fail(invWriteOnce, "write-bearing step %s, whose process started under lease %d, was granted lease %d", l.Step, p.lease, l.ID)
			}
		}
	}
	return c.found[invWriteOnce]
}

// NoStaleCommit is invariant 3: a report under a non-current lease is never
// COMMITTED, and leases never resurrect. A COMMITTED answer is for a lease
// that was current before its batch (or repeats the report that committed);
// every lease that becomes current is a new grant whose id is greater than
// every lease granted before, dispatched in its own batch, and its step's only
// current lease; a lease that lost its authority never gets it back, a
// restart included.
func NoStaleCommit(c *Checker) *Violation {
	c.checks++
	if c.verifyDue(invStale) {
		n := 0
		for _, l := range c.o.Leases() {
			if !l.Current {
				continue
			}
			n++
			if ow, ok := c.current[l.ID]; !ok || ow.step != l.Step || ow.worker != l.Worker {
				c.fail(invStale, "lease %d (step %s, worker %s) is current but no record said so", l.ID, l.Step, l.Worker)
			}
		}
		if n != len(c.current) {
			c.fail(invStale, "the orchestrator holds %d current leases, its records said %d", n, len(c.current))
		}
	}
	return c.found[invStale]
}

// TransitionsFollowTable is invariant 4: a terminal step never changes
// state, and every transition is in the table. Each applied transition is a
// row of SPEC §1's table (Table), starts from the state the step's previous
// transition led to (across batches and restarts), never starts from a
// terminal state, and a step's state changes only by transitions.
func TransitionsFollowTable(c *Checker) *Violation {
	c.checks++
	if c.verifyDue(invTable) {
		steps := c.view().Steps()
		for _, s := range steps {
			if cur, ok := c.steps[s.ID]; !ok || cur != s.State {
				c.fail(invTable, "step %s is %s, but its transitions lead to %s", s.ID, s.State, cur)
			}
		}
		if len(steps) != len(c.steps) {
			c.fail(invTable, "the orchestrator holds %d steps (live and archived), the checker saw %d", len(steps), len(c.steps))
		}
	}
	return c.found[invTable]
}

// CancelledNeverCommitted is invariant 5: a cancelled step is never later
// committed. Once a cancel took effect on a step (it went cancelling or
// cancelled), no report of it is answered COMMITTED, except the worker's
// report that its cleanup failed while the step is cancelling (SPEC §6:
// the step then fails) and exact repeats of that report.
func CancelledNeverCommitted(c *Checker) *Violation {
	c.checks++
	if c.verifyDue(invCancelled) {
		for _, s := range c.view().Steps() {
			if (s.State == core.StateCancelled || s.State == core.StateCancelling) && !c.cancel[s.ID] {
				c.fail(invCancelled, "step %s is %s but no transition cancelled it", s.ID, s.State)
			}
			if s.State == core.StateCancelled && s.Outcome != nil {
				c.fail(invCancelled, "cancelled step %s shows outcome %s", s.ID, describeOutcome(*s.Outcome))
			}
		}
	}
	return c.found[invCancelled]
}

// SlotsAndMatching is invariant 6: no worker holds more leases than its
// slots + ahead, nor more started ones than its slots (SPEC §3); leases only
// go to matching workers. After every batch each worker holds at most its
// slots + ahead in current leases, at most its slots of them with a step
// running, recovering or cancelling, and every new lease went, by a
// Dispatch on that worker's connection, to an enrolled, active, unrevoked
// worker matching the queued, non-task step by SPEC §8 (target, labels,
// platform, required tags ⊆ worker tags, the required tags derived by the
// spec's own table).
func SlotsAndMatching(c *Checker) *Violation {
	c.checks++
	if c.verifyDue(invSlots) {
		for _, w := range c.o.Workers() {
			if w.Leases > w.Slots+w.Ahead {
				c.fail(invSlots, "worker %s holds %d current leases with %d slots and %d ahead", w.ID, w.Leases, w.Slots, w.Ahead)
			}
			if w.Leases != c.held[w.ID] {
				c.fail(invSlots, "worker %s holds %d current leases, its records said %d", w.ID, w.Leases, c.held[w.ID])
			}
		}
	}
	return c.found[invSlots]
}

// TokensAndRevocation is invariant 7: a consumed or expired enrollment token
// never enrolls; a revoked worker holds no lease. A session credential is
// issued only in answer to an enrollment hello of the same batch whose token
// the API issued and which was unconsumed, unrevoked and unexpired before it,
// for an instance not enrolled yet; a revoked worker holds no current lease
// and is never welcomed back.
func TokensAndRevocation(c *Checker) *Violation {
	c.checks++
	if c.verifyDue(invTokens) {
		for _, w := range c.o.Workers() {
			if w.Revoked && w.Leases > 0 {
				c.fail(invTokens, "revoked worker %s holds %d current leases", w.ID, w.Leases)
			}
		}
		toks := c.o.Tokens()
		for _, t := range toks {
			got, ok := c.tokens[t.Name]
			if !ok || got.consumed != t.Consumed || got.revoked != t.Revoked || !got.expires.Equal(t.ExpiresAt) {
				c.fail(invTokens, "token %s is consumed=%v revoked=%v, its records said consumed=%v revoked=%v", t.Name, t.Consumed, t.Revoked, got.consumed, got.revoked)
			}
		}
		if len(toks) != len(c.tokens) {
			c.fail(invTokens, "the orchestrator holds %d tokens, its records said %d", len(toks), len(c.tokens))
		}
	}
	return c.found[invTokens]
}

// ---- liveness ----

// CheckLiveness checks invariants 8 and 9 once faults have stopped, the
// network has healed and time has passed: every run finished, and no
// no-write step was failed by a lost worker.
func (c *Checker) CheckLiveness(o View) *Violation {
	c.checks += 2
	if v := RunsFinish(o); v != nil {
		return v
	}
	return NoWriteStepsSurviveWorkerLoss(o)
}

// RunsFinish is invariant 8: every run reaches a terminal state within a
// bound derived from the timeouts (the caller allows the time; this checks
// that every run is finished).
func RunsFinish(o View) *Violation {
	if o.Orchestrator == nil {
		return nil
	}
	for _, id := range o.RunIDs() {
		r, status, _ := o.Run(id)
		if r.Finished {
			continue
		}
		detail := fmt.Sprintf("run %s is still %s", id, status)
		for _, sid := range r.Steps {
			if s, ok := o.StepByID(sid); ok && !Terminal(s.State) {
				detail += fmt.Sprintf(": step %s is %s (lease %d, %d attempts)", sid, s.State, s.Lease, s.Attempts)
				break
			}
		}
		return &Violation{Invariant: "RunsFinish", Detail: detail}
	}
	return nil
}

// NoWriteStepsSurviveWorkerLoss is invariant 9: a no-write step whose
// workers keep dying eventually succeeds or fails by the attempt cap. Every
// no-write step ends: success, or failed for a reason of its own (execution,
// step-timeout, attempts-exhausted, unmatched, …) but never for a lost worker
// (disconnect, stale-worker, revoked); cancelled and skipped are outcomes
// imposed from outside the step and are accepted.
func NoWriteStepsSurviveWorkerLoss(o View) *Violation {
	if o.Orchestrator == nil {
		return nil
	}
	for _, s := range o.Steps() {
		sp, _ := o.StepSpecOf(s.ID)
		if sp.Writes {
			continue
		}
		v := func(format string, args ...any) *Violation {
			return &Violation{Invariant: "NoWriteStepsSurviveWorkerLoss", Detail: fmt.Sprintf(format, args...)}
		}
		switch {
		case !Terminal(s.State):
			return v("no-write step %s is still %s (lease %d, %d attempts)", s.ID, s.State, s.Lease, s.Attempts)
		case s.State == core.StateFailed && workerLost(s.Class):
			return v("no-write step %s failed with class %s after %d attempts: %s", s.ID, s.Class, s.Attempts, s.Message)
		}
	}
	return nil
}

// Clone returns an independent copy of the checker, for explorers that
// branch an orchestrator with core's Clone and must branch its checker too.
// The live orchestrator is not copied: the copy refers to the same one until
// its next Batch or Restored.
func (c *Checker) Clone() *Checker {
	n := *c
	n.steps = maps.Clone(c.steps)
	n.cancel = maps.Clone(c.cancel)
	n.commits = maps.Clone(c.commits)
	n.byLease = maps.Clone(c.byLease)
	n.current = maps.Clone(c.current)
	n.held = maps.Clone(c.held)
	n.workers = maps.Clone(c.workers)
	n.tokens = maps.Clone(c.tokens)
	n.journal = slices.Clone(c.journal)
	n.pending = make([]pendingBatch, len(c.pending))
	for i, pb := range c.pending {
		pb.commits = slices.Clone(pb.commits)
		pb.acks = slices.Clone(pb.acks)
		n.pending[i] = pb
	}
	n.leases = maps.Clone(c.leases)
	n.issued = maps.Clone(c.issued)
	n.conns = maps.Clone(c.conns)
	n.wstarted = maps.Clone(c.wstarted)
	n.writer = maps.Clone(c.writer)
	n.procs = maps.Clone(c.procs)
	n.b = batchScratch{}
	return &n
}
