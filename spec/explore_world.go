package spec

// The explorer's world: the real core machines, an abstract network, abstract
// time, simulated step processes, crashes and an operator.
//
// # The model, and why it is sound
//
// A state is the orchestrator (or, while it is down, the crashed machine,
// whose emitted records are exactly the durable store), every worker
// machine, the driver's view of each connection and the messages in flight
// on it, the step processes, the Checker's monitor state, the simulator
// properties' state, the budgets spent, and the clock. Two paths that reach
// the same state (the same 64-bit hash of all of it, explore_hash.go) have
// the same futures and the same future verdicts, so the second is not
// expanded. An action is one step of one machine, or one choice of the
// environment; labels name them one per line in a counterexample.
//
//   - Persistence is atomic with the step: a batch is shown to the Checker
//     (Batch), made durable (Persisted), and only then are its messages put on
//     the network. A real driver can crash between Step and fsync; that
//     loses the batch, which nobody outside the process saw: the same world
//     as crashing just before the input (the crash resets the connection the
//     input came on, so its message is lost either way, and the worker
//     re-sends it as after any reset). A crash after the fsync and before the
//     send is the atomic step followed by a crash whose connections close
//     abruptly (below): its messages may never arrive. Group commit is an
//     interleaving of such steps. So no behaviour is lost.
//   - Network: see NetworkModel. In NetFIFO a "drop" is a reset of the whole
//     connection, which is what TCP does with a loss it cannot recover; each
//     end notices the reset in its own action (the orchestrator gets
//     Disconnected, the worker WDisconnected), in either order, with other
//     actions between. A connection closed by its peer's choice (Close,
//     Refused, the worker's Close) is noticed only after the messages sent
//     before the close (FIN ordering); one closed by a process's death
//     (orchestrator or worker crash) may be noticed at any point, losing what
//     had not arrived (the kernel's FIN or RST). Messages to a dead or closed
//     orchestrator are lost.
//   - Time is one clock for every machine (skew and drift are the simulator's
//     business). It moves only by a tick: the machine whose deadline is the
//     earliest (ties: each of them, in any order) is stepped with a Tick at
//     that deadline, so every timer fires on time (a driver arranges a Tick
//     no later than the Deadline), and an input and a timer at the same
//     instant are explored in both orders. Time passing while a message
//     could be delivered is a network slower than a timer: each such tick
//     spends one unit of MaxDelays (time passing over an idle network — a
//     slow process, a worker backing off or dialing, a drop nobody noticed
//     yet — is free). No timer fires after start+Horizon. The default scopes
//     push heartbeats, retransmits and dial timeouts past the horizon; the
//     faults scope keeps them.
//   - Step processes: a started process may exit 0 or 1 at any time, print a
//     line (MaxLogLines) and, once SIGTERMed, exit 143; a SIGKILL ends it at
//     once (the kill and the exit it causes are one action); it dies with its
//     worker. A write-bearing process writes to the external system as it
//     starts (ExternalWrite): the earliest, hence most dangerous, write.
//   - Connection ids are the smallest id no live connection uses, so paths
//     that opened connections in another order can meet. Received.Entropy is
//     a function of the enrolling instance, for the same reason.
//   - The operator (cancel, revoke), crashes, restarts, resets, duplicates,
//     drops and delays are budgeted (Scope); the budget spent is part of the
//     state.
//   - Mutate doctors the Ready the driver gets: the Checker and the network
//     see the doctored batch, the durable store keeps what the core emitted.
//
// # What is not reduced
//
// No partial-order reduction: every machine reads the one clock, so a
// delivery and a tick never commute, and the Checker observes nearly every
// action. No symmetry reduction over workers either: the worker's and the
// orchestrator's fingerprints embed the worker id, so sorting worker states
// is a no-op, and the orchestrator is not symmetric in its workers anyway
// (dispatch ties go to the smaller worker id, sweeps and triage iterate in
// id order), so two states that differ by swapping two workers do not have
// swapped futures and identifying them would be unsound.

import (
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tether-run/tether/core"
)

var exploreT0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

type explorer struct {
	sc       Scope
	cfg      core.Config
	end      time.Time // no tick after this
	grace    time.Duration
	writes   map[string]bool // step name → write-bearing
	tokNames []string        // one per worker slot, then the spares for restarts
	tokens   []string        // the token strings the API issued, same order
	run      core.RunID
	hits     uint32
	start    time.Time
	memo     *orchMemo
	// setupSteps are the initial state's own actions (enrollment) as script
	// steps, set by initial.
	setupSteps []ScriptStep
	workers    *internTable[*core.Worker]
	packs      *internTable[*checkerPack]
	// done holds the states whose completion (explore_complete.go) ended
	// without a violation; completions and completeActs count them.
	done                        *doneSet
	completions, completionActs atomic.Int64
	wantExpiry                  bool // the scope requires SomeCredentialExpired (a costly look)
}

func newExplorer(sc Scope) *explorer {
	if sc.Workers <= 0 {
		sc.Workers = 1
	}
	if sc.Workers > 16 {
		sc.Workers = 16
	}
	if sc.Slots <= 0 {
		sc.Slots = 1
	}
	if sc.Name == "" {
		sc.Name = "custom"
	}
	x := &explorer{sc: sc, cfg: sc.Config, end: exploreT0.Add(sc.Horizon), writes: map[string]bool{}, memo: newOrchMemo(1 << 15),
		workers: newInternTable[*core.Worker](1 << 16), packs: newInternTable[*checkerPack](1 << 16), done: newDoneSet()}
	bmax := sc.Worker.BackoffMax
	if bmax <= 0 {
		bmax = 60 * time.Second
	}
	x.grace = 2 * bmax
	var learn func(steps []core.StepSpec)
	learn = func(steps []core.StepSpec) {
		for _, st := range steps {
			x.writes[st.Name] = st.Writes
			if st.Workflow != nil {
				learn(st.Workflow.Steps) // a child run's steps (ChildScope)
			}
		}
	}
	learn(sc.Steps)
	x.wantExpiry = slices.Contains(sc.Require, SomeCredentialExpired)
	for i := range sc.Workers {
		x.tokNames = append(x.tokNames, fmt.Sprintf("tok-w%d", i+1))
	}
	for i := range sc.MaxWorkerRestarts {
		x.tokNames = append(x.tokNames, fmt.Sprintf("tok-spare%d", i+1))
	}
	return x
}

// writesOf says whether a step id ("run-1/a", "run-1/a[0]") is write-bearing.
func (x *explorer) writesOf(id core.StepID) bool {
	_, name, _ := strings.Cut(string(id), "/")
	name, _, _ = strings.Cut(name, "[")
	return x.writes[name]
}

// ---- state ----

type xmsg struct {
	m core.Msg
	h uint64
}

type xconn struct {
	id         core.ConnID
	w          int           // worker slot
	owner      core.WorkerID // the instance that opened it (labels only: not part of the state)
	toO, toW   []xmsg
	orchOpen   bool // the orchestrator's driver reads it and owes it a Disconnected
	workerOpen bool // it is the worker's current connection
	broken     bool // reset: nothing more gets through either way
	wClosed    bool // the worker closed it: the orchestrator notices after toO
	oClosed    bool // the orchestrator closed it or died: the worker notices after toW
	abrupt     bool // closed by a process's death: the other end may notice before the rest arrives
}

type xworker struct {
	m        *core.Worker // nil when dead
	fp       uint64       // m.Fingerprint(), kept up to date by the builder
	alive    bool
	inst     int // instance number in this slot (restarts)
	tok      int // index into tokNames
	id       core.WorkerID
	conn     core.ConnID // the driver's view of the current connection
	dialing  bool        // a Dial is outstanding
	deadline time.Time
}

type xproc struct {
	w      int
	lease  core.LeaseID
	step   core.StepID
	writes bool
	termed bool
	lines  int
}

type budget struct {
	resets, orchCrashes, workerCrashes, restarts, cancels, revokes, dups, drops, delays uint8
	// identityRestarts is hashed with the revoked set: pack is full.
	identityRestarts uint8
}

func (b budget) pack() uint64 {
	return uint64(b.resets) | uint64(b.orchCrashes)<<7 | uint64(b.workerCrashes)<<14 | uint64(b.restarts)<<21 |
		uint64(b.cancels)<<28 | uint64(b.revokes)<<35 | uint64(b.dups)<<42 | uint64(b.drops)<<49 | uint64(b.delays)<<56
}

type xstate struct {
	now       time.Time
	o         *core.Orchestrator // nil while down
	oDL       time.Time          // the orchestrator's Deadline
	dead      *core.Orchestrator // while down: the crashed machine, whose emitted records are the disk
	diskHash  uint64             // while down: its fingerprint (finer than the disk alone)
	ws        []xworker
	conns     []*xconn // sorted by id
	procs     []xproc  // sorted by (worker, lease)
	chk       *Checker
	pchk      *checkerPack              // the checker at rest in the BFS frontier (chk is then nil)
	chkHash   uint64                    // chk.stateHash(), kept up to date by the builder
	recoverAt map[core.StepID]time.Time // simulator property: when each recovering step went recovering
	grants    *Grants                   // grants, credentials and tags (props_grants.go); shared, copied on change
	idem      *Idempotency              // PropIdempotentReport's memory of answered reports
	// A completion (explore_complete.go) discards each state once it has
	// stepped it: the machines it copied for a state are its own, and the
	// next step may change them in place. cOwnO, cOwnChk and cOwnW (a bit
	// per worker) say which; a state the search keeps has none.
	cOwnO, cOwnChk bool
	cOwnW          uint64
	used           budget
	revoked        uint32 // token indexes revoked
	// archRestart: the orchestrator was restored after a run was archived
	// (SomeReportAfterArchiveRestart).
	archRestart bool
}

// ---- actions ----

type actKind uint8

const (
	aDeliverO actKind = iota
	aDeliverW
	aDupO
	aDupW
	aDropO
	aDropW
	aReset
	aNoticeO
	aNoticeW
	aConnect
	aDialFail
	aTickO
	aTickW
	aExit0
	aExit1
	aTermExit
	aLine
	aCrashO
	aRestartO
	aCrashW
	aRestartW
	aReplayW
	aRestartSameW
	aCancel
	aRevoke
)

type action struct {
	k    actKind
	i, j int
}

func (x *explorer) actions(s *xstate) []action {
	var as []action
	multi := x.sc.Network == NetMultiset
	msgActs := func(q []xmsg, ci int, deliver, dup, drop actKind, toOrch bool) {
		n := len(q)
		if n == 0 {
			return
		}
		if !multi {
			n = 1
		}
		for j := 0; j < n; j++ {
			if multi && slices.ContainsFunc(q[:j], func(m xmsg) bool { return m.h == q[j].h }) {
				continue // an identical message earlier in the multiset: same successors
			}
			as = append(as, action{deliver, ci, j})
			_, hello := q[j].m.(core.Hello)
			if int(s.used.dups) < x.sc.MaxDups && !(toOrch && hello) {
				as = append(as, action{dup, ci, j})
			}
			if multi && int(s.used.drops) < x.sc.MaxDrops {
				as = append(as, action{drop, ci, j})
			}
		}
	}
	for ci, c := range s.conns {
		if s.o != nil && c.orchOpen && !c.broken {
			msgActs(c.toO, ci, aDeliverO, aDupO, aDropO, true)
		}
		if s.o != nil && c.orchOpen && (c.broken || (c.wClosed && (len(c.toO) == 0 || multi || c.abrupt))) {
			as = append(as, action{aNoticeO, ci, 0})
		}
		if c.workerOpen && !c.broken {
			msgActs(c.toW, ci, aDeliverW, aDupW, aDropW, false)
		}
		if c.workerOpen && (c.broken || (c.oClosed && (len(c.toW) == 0 || multi || c.abrupt))) {
			as = append(as, action{aNoticeW, ci, 0})
		}
		if !c.broken && (c.orchOpen || c.workerOpen) && int(s.used.resets) < x.sc.MaxDisconnects {
			as = append(as, action{aReset, ci, 0})
		}
	}
	for i, w := range s.ws {
		if w.alive && w.dialing {
			if s.o != nil {
				as = append(as, action{aConnect, i, 0})
			} else {
				as = append(as, action{aDialFail, i, 0})
			}
		}
	}
	// Time: the earliest deadline (or any deadline already due) may fire.
	var first time.Time
	due := func(t time.Time) {
		if !t.IsZero() && (first.IsZero() || t.Before(first)) {
			first = t
		}
	}
	if s.o != nil {
		due(s.oDL)
	}
	for _, w := range s.ws {
		if w.alive {
			due(w.deadline)
		}
	}
	limit := first
	if limit.Before(s.now) {
		limit = s.now
	}
	fires := func(t time.Time) bool { return !t.IsZero() && !t.After(limit) && !t.After(x.end) }
	if x.sc.MaxDelays >= 0 && int(s.used.delays) >= x.sc.MaxDelays && x.inFlight(s) {
		// Time may not pass over a deliverable message: the delay budget is spent.
		fires = func(t time.Time) bool { return !t.IsZero() && !t.After(s.now) }
	}
	if s.o != nil && fires(s.oDL) {
		as = append(as, action{aTickO, 0, 0})
	}
	for i, w := range s.ws {
		if w.alive && fires(w.deadline) {
			as = append(as, action{aTickW, i, 0})
		}
	}
	for pi, p := range s.procs {
		as = append(as, action{aExit0, pi, 0}, action{aExit1, pi, 0})
		if p.termed {
			as = append(as, action{aTermExit, pi, 0})
		}
		if p.lines < x.sc.MaxLogLines {
			as = append(as, action{aLine, pi, 0})
		}
	}
	if s.o != nil {
		if int(s.used.orchCrashes) < x.sc.MaxOrchCrashes {
			as = append(as, action{aCrashO, 0, 0})
		}
		if int(s.used.cancels) < x.sc.MaxCancels {
			if r, _, ok := s.o.Run(x.run); ok && !r.Finished {
				as = append(as, action{aCancel, 0, 0})
			}
		}
		if int(s.used.revokes) < x.sc.MaxRevokes {
			for i, w := range s.ws {
				if s.revoked&(1<<w.tok) == 0 { // a dead worker's token too: its leases are triaged at once
					as = append(as, action{aRevoke, i, 0})
				}
			}
		}
	} else {
		as = append(as, action{aRestartO, 0, 0})
	}
	for i, w := range s.ws {
		switch {
		case w.alive && int(s.used.workerCrashes) < x.sc.MaxWorkerCrashes:
			as = append(as, action{aCrashW, i, 0})
		case !w.alive && int(s.used.restarts) < x.sc.MaxWorkerRestarts:
			as = append(as, action{aRestartW, i, 0}, action{aReplayW, i, 0})
		}
		// Only an enrolled worker has an identity to keep.
		if w.alive && int(s.used.identityRestarts) < x.sc.MaxIdentityRestarts && w.m.Credential() != "" {
			as = append(as, action{aRestartSameW, i, 0})
		}
	}
	return as
}

// ---- successors ----

type xsucc struct {
	s      *xstate
	hash   uint64
	label  string
	step   ScriptStep // the action as a script step (counterexamples only)
	sim    string     // the action as a simulator event (counterexamples only)
	fault  string     // the simulator option the action needs (counterexamples only)
	viol   *Violation
	tail   []action // a completion's actions after this one up to viol (explore_complete.go)
	pruned bool
	hits   uint32
}

// builder makes one successor: a shallow copy of the parent whose parts are
// copied on first write (machines are cloned only when stepped).
type builder struct {
	want                                      bool // compute the action's label (counterexamples only)
	x                                         *explorer
	s                                         *xstate
	ownChk, ownWs, ownNet, ownProcs, ownRecov bool
	ownIdem                                   bool
	ownW                                      uint64
	label, sim, fault                         string
	steps                                     []ScriptStep // every action's script step (counterexamples only)
	viol                                      *Violation
	hits                                      uint32
	completing                                bool          // a completion's step: see xstate.cOwnO
	in                                        core.Input    // the orchestrator's input being observed (nil: a restore)
	heldStart                                 bool          // that input is a Start of a lease held ahead (SomeHeldStarted)
	from                                      core.WorkerID // the worker whose connection the delivered message came on
	late                                      bool          // the input is a report of a lease in the closed-lease table (SPEC §7a)
}

func (b *builder) mutChk() {
	if !b.ownChk {
		if !b.completing || !b.s.cOwnChk {
			b.s.chk = b.s.chk.Clone()
			b.s.cOwnChk = b.completing
		}
		b.ownChk = true
	}
}

func (b *builder) mutWs() {
	if !b.ownWs {
		b.s.ws = slices.Clone(b.s.ws)
		b.ownWs = true
	}
}

func (b *builder) mutW(i int) *xworker {
	b.mutWs()
	w := &b.s.ws[i]
	if b.ownW&(1<<i) == 0 {
		if w.m != nil && (!b.completing || b.s.cOwnW&(1<<i) == 0) {
			w.m = w.m.Clone()
			if b.completing {
				b.s.cOwnW |= 1 << i
			}
		}
		b.ownW |= 1 << i
	}
	return w
}

func (b *builder) mutNet() {
	if b.ownNet {
		return
	}
	cs := make([]*xconn, len(b.s.conns))
	for i, c := range b.s.conns {
		n := *c
		n.toO = slices.Clone(c.toO)
		n.toW = slices.Clone(c.toW)
		cs[i] = &n
	}
	b.s.conns = cs
	b.ownNet = true
}

func (b *builder) mutProcs() {
	if !b.ownProcs {
		b.s.procs = slices.Clone(b.s.procs)
		b.ownProcs = true
	}
}

func (b *builder) mutRecov() {
	if !b.ownRecov {
		m := make(map[core.StepID]time.Time, len(b.s.recoverAt)+1)
		for k, v := range b.s.recoverAt {
			m[k] = v
		}
		b.s.recoverAt = m
		b.ownRecov = true
	}
}

func (b *builder) mutIdem() {
	if !b.ownIdem {
		b.s.idem = b.s.idem.Clone()
		b.ownIdem = true
	}
}

func (b *builder) conn(id core.ConnID) *xconn {
	for _, c := range b.s.conns {
		if c.id == id {
			return c
		}
	}
	return nil
}

func (b *builder) fail(inv, format string, args ...any) {
	if b.viol == nil {
		b.viol = &Violation{Invariant: inv, Detail: fmt.Sprintf(format, args...)}
	}
}

func (b *builder) hit(name string) { b.hits |= sometimesBit(name) }

// apply computes the successor of s by a (with its label if want).
func (x *explorer) apply(parent *xstate, a action, want bool) (out *xsucc) {
	return x.applyWith(parent, a, want, false)
}

// completeStep is apply for a completion, which discards parent once it is
// stepped: what parent's completion copies already own is changed in place.
func (x *explorer) completeStep(parent *xstate, a action) *xsucc {
	return x.applyWith(parent, a, false, true)
}

func (x *explorer) applyWith(parent *xstate, a action, want, completing bool) (out *xsucc) {
	ns := *parent
	b := &builder{x: x, s: &ns, want: want, completing: completing}
	defer func() {
		if r := recover(); r != nil {
			out = &xsucc{s: &ns, label: b.label, step: b.lastStep(), sim: b.sim, fault: b.fault, viol: &Violation{Invariant: "Panic", Detail: fmt.Sprint(r)}, hits: b.hits}
		}
	}()
	b.do(a)
	b.gc()
	// Machines stepped here are final: share them with equal ones (not a
	// completion's, which it changes in place).
	for i := range ns.ws {
		if w := &ns.ws[i]; !completing && b.ownW&(1<<i) != 0 && w.m != nil {
			w.m = x.workers.intern(w.fp, w.m)
		}
	}
	if b.viol == nil {
		if v := ns.chk.Check(); v != nil {
			b.viol = v
		}
	}
	out = &xsucc{s: &ns, label: b.label, step: b.lastStep(), sim: b.sim, fault: b.fault, viol: b.viol, hits: b.hits}
	if b.ownChk {
		ns.chkHash = ns.chk.stateHash()
	}
	out.hash = x.hash(&ns)
	out.pruned = x.pruned(&ns)
	return out
}

func (x *explorer) pruned(s *xstate) bool {
	if x.sc.MaxLease > 0 && s.chk.maxLease > x.sc.MaxLease {
		return true
	}
	if x.sc.MaxInFlight > 0 {
		for _, c := range s.conns {
			if len(c.toO) > x.sc.MaxInFlight || len(c.toW) > x.sc.MaxInFlight {
				return true
			}
		}
	}
	return false
}

// gc forgets connections neither end holds any more.
func (b *builder) gc() {
	if !b.ownNet {
		return
	}
	b.s.conns = slices.DeleteFunc(b.s.conns, func(c *xconn) bool { return !c.orchOpen && !c.workerOpen })
}

func (b *builder) at() string { return "+" + b.s.now.Sub(exploreT0).String() }

func (b *builder) wname(i int) string { return string(b.s.ws[i].id) }

// note records, for a counterexample, the action's label, the action as a
// script step (explore_script.go), the same event in the simulator's
// vocabulary (sim/world.go), and the simulator fault or option it needs, if
// any.
func (b *builder) note(st ScriptStep, sim, fault, format string, args ...any) {
	b.label = b.at() + " " + fmt.Sprintf(format, args...)
	st.At, st.Label = b.s.now.Sub(exploreT0), b.label
	b.steps = append(b.steps, st)
	b.sim = b.at() + " " + sim
	b.fault = fault
}

// lastStep is the script step of the action just applied.
func (b *builder) lastStep() ScriptStep {
	if len(b.steps) == 0 {
		return ScriptStep{}
	}
	return b.steps[len(b.steps)-1]
}

func (b *builder) do(a action) {
	s := b.s
	switch a.k {
	case aDeliverO, aDupO, aDropO:
		b.mutNet()
		c := s.conns[a.i]
		m := c.toO[a.j]
		if b.want {
			d := core.DescribeMsg(m.m)
			st := ScriptStep{Worker: c.owner, Conn: c.id, Msg: d}
			switch a.k {
			case aDeliverO:
				st.Kind = ScriptDeliverToOrch
				b.note(st, "→orch "+string(c.owner)+" "+d, "", "deliver %s→orch c%d: %s", string(c.owner), c.id, d)
			case aDupO:
				st.Kind = ScriptDupToOrch
				b.note(st, "→orch "+string(c.owner)+" "+d+" duplicate", "DupProb>0 (a duplicated delivery)", "dup %s→orch c%d: %s", string(c.owner), c.id, d)
			default:
				st.Kind = ScriptDropToOrch
				b.note(st, "(lost) "+d, "a lone message loss (no simulator equivalent: its loss resets the connection)", "drop %s→orch c%d: %s", string(c.owner), c.id, d)
			}
		}
		switch a.k {
		case aDupO:
			s.used.dups++
		case aDropO:
			s.used.drops++
			c.toO = slices.Delete(c.toO, a.j, a.j+1)
			return
		default:
			c.toO = slices.Delete(c.toO, a.j, a.j+1)
		}
		if _, ok := m.m.(core.RejectDispatch); ok {
			b.hit(SomeDispatchRejected)
		}
		b.from = c.owner
		b.orch(core.Received{Conn: c.id, Msg: m.m, Entropy: entropyFor(m.m)})
		b.from = ""
	case aDeliverW, aDupW, aDropW:
		b.mutNet()
		c := s.conns[a.i]
		m := c.toW[a.j]
		if b.want {
			d := core.DescribeMsg(m.m)
			st := ScriptStep{Worker: c.owner, Conn: c.id, Msg: d}
			switch a.k {
			case aDeliverW:
				st.Kind = ScriptDeliverToWorker
				b.note(st, "→worker "+string(c.owner)+" "+d, "", "deliver orch→%s c%d: %s", string(c.owner), c.id, d)
			case aDupW:
				st.Kind = ScriptDupToWorker
				b.note(st, "→worker "+string(c.owner)+" "+d+" (twice)", "a duplicated delivery to a worker (the simulator duplicates only →orch)", "dup orch→%s c%d: %s", string(c.owner), c.id, d)
			default:
				st.Kind = ScriptDropToWorker
				b.note(st, "(lost) "+d, "a lone message loss (no simulator equivalent: its loss resets the connection)", "drop orch→%s c%d: %s", string(c.owner), c.id, d)
			}
		}
		switch a.k {
		case aDupW:
			s.used.dups++
		case aDropW:
			s.used.drops++
			c.toW = slices.Delete(c.toW, a.j, a.j+1)
			return
		default:
			c.toW = slices.Delete(c.toW, a.j, a.j+1)
		}
		switch m.m.(type) {
		case core.Answer, core.StartAck:
			b.mutChk()
		}
		s.chk.Delivered(s.now, s.ws[c.w].id, m.m)
		b.worker(c.w, core.WReceived{Msg: m.m})
	case aReset:
		b.mutNet()
		c := s.conns[a.i]
		if b.want {
			b.note(ScriptStep{Kind: ScriptReset, Worker: c.owner, Conn: c.id}, "fault socket-drop "+string(c.owner), "LossProb>0 or a partition (a connection reset)",
				"reset c%d (%s): %d→orch and %d→worker messages lost", c.id, string(c.owner), len(c.toO), len(c.toW))
		}
		s.used.resets++
		c.broken = true
		c.toO, c.toW = nil, nil
	case aNoticeO:
		b.mutNet()
		c := s.conns[a.i]
		if b.want {
			b.note(ScriptStep{Kind: ScriptOrchNotices, Worker: c.owner, Conn: c.id}, "orch-notices-drop "+string(c.owner), "", "notice orch: c%d (%s) closed", c.id, string(c.owner))
		}
		c.orchOpen = false
		c.toO = nil
		b.orch(core.Disconnected{Conn: c.id})
	case aNoticeW:
		b.mutNet()
		c := s.conns[a.i]
		if b.want {
			b.note(ScriptStep{Kind: ScriptWorkerNotices, Worker: c.owner, Conn: c.id}, "worker-notices-drop "+string(c.owner), "", "notice %s: c%d closed", string(c.owner), c.id)
		}
		c.workerOpen = false
		c.toW = nil
		b.mutWs()
		s.ws[c.w].conn = 0
		reason := "connection reset"
		if !c.broken {
			reason = "closed by orchestrator"
		}
		b.worker(c.w, core.WDisconnected{Reason: reason})
	case aConnect:
		b.mutNet()
		b.mutWs()
		id := core.ConnID(1)
		for slices.ContainsFunc(s.conns, func(c *xconn) bool { return c.id == id }) {
			id++
		}
		c := &xconn{id: id, w: a.i, owner: s.ws[a.i].id, orchOpen: true, workerOpen: true}
		k, _ := slices.BinarySearchFunc(s.conns, id, func(c *xconn, id core.ConnID) int { return int(c.id) - int(id) })
		s.conns = slices.Insert(s.conns, k, c)
		s.ws[a.i].conn, s.ws[a.i].dialing = id, false
		if b.want {
			b.note(ScriptStep{Kind: ScriptConnect, Worker: s.ws[a.i].id, Conn: id}, "dial "+b.wname(a.i)+" connected", "", "connect %s c%d", b.wname(a.i), id)
		}
		b.worker(a.i, core.WConnected{Conn: id})
	case aDialFail:
		b.mutWs()
		s.ws[a.i].dialing = false
		if b.want {
			b.note(ScriptStep{Kind: ScriptDialFail, Worker: s.ws[a.i].id}, "dial "+b.wname(a.i)+" dial failed", "", "dial-fail %s (orchestrator down)", b.wname(a.i))
		}
		b.worker(a.i, core.WDialFailed{Reason: "connection refused"})
	case aTickO:
		slow := false
		if s.oDL.After(s.now) {
			slow = b.delay()
			s.now = s.oDL
		}
		if b.want {
			b.note(ScriptStep{Kind: ScriptTickOrch}, "orch-tick", slowFault(slow), "tick orchestrator%s", slowNote(slow))
		}
		b.orch(core.Tick{})
	case aTickW:
		slow := false
		if d := s.ws[a.i].deadline; d.After(s.now) {
			slow = b.delay()
			s.now = d
		}
		if b.want {
			b.note(ScriptStep{Kind: ScriptTickWorker, Worker: s.ws[a.i].id}, "worker-tick "+b.wname(a.i), slowFault(slow), "tick %s%s", b.wname(a.i), slowNote(slow))
		}
		b.worker(a.i, core.WTick{})
	case aExit0, aExit1, aTermExit:
		p := s.procs[a.i]
		b.mutProcs()
		s.procs = slices.Delete(s.procs, a.i, a.i+1)
		b.mutChk()
		s.chk.ProcessStopped(s.now, s.ws[p.w].id, p.lease)
		x := core.WExecExited{Lease: p.lease}
		switch a.k {
		case aExit1:
			x.ExitCode = 1
		case aTermExit:
			x.ExitCode, x.Signaled = 143, true
		}
		if b.want {
			how := fmt.Sprintf("code=%d", x.ExitCode)
			if x.Signaled {
				how = "on SIGTERM (143)"
			}
			fault := ""
			if x.ExitCode == 1 {
				fault = "FailProb>0"
			}
			b.note(ScriptStep{Kind: ScriptExit, Worker: s.ws[p.w].id, Step: p.step, Lease: p.lease, Code: x.ExitCode},
				"process "+b.wname(p.w)+" exits", fault, "exit %s %s lease=%d %s", b.wname(p.w), p.step, p.lease, how)
		}
		b.worker(p.w, x)
	case aLine:
		b.mutProcs()
		p := &s.procs[a.i]
		p.lines++
		text := fmt.Sprintf("line %d", p.lines)
		if b.want {
			b.note(ScriptStep{Kind: ScriptOutput, Worker: s.ws[p.w].id, Step: p.step, Lease: p.lease, Text: text},
				"process "+b.wname(p.w)+" output", "LinesMax>0", "output %s %s lease=%d %q", b.wname(p.w), p.step, p.lease, text)
		}
		b.worker(p.w, core.WExecOutput{Lease: p.lease, Lines: []string{text}})
	case aCrashO:
		if b.want {
			b.note(ScriptStep{Kind: ScriptCrashOrch}, "fault orchestrator-crash", "OrchCrashEvery>0", "crash-orchestrator")
		}
		b.crashOrch()
	case aRestartO:
		if b.want {
			b.note(ScriptStep{Kind: ScriptRestartOrch}, "fault orchestrator restarts", "", "restart-orchestrator")
		}
		b.restartOrch()
	case aCrashW:
		if b.want {
			b.note(ScriptStep{Kind: ScriptCrashWorker, Worker: s.ws[a.i].id}, "fault worker-crash "+b.wname(a.i), "WorkerCrashEvery>0", "crash-worker %s", b.wname(a.i))
		}
		s.used.workerCrashes++
		b.killWorker(a.i)
	case aRestartW:
		s.used.restarts++
		b.bootWorker(a.i, s.ws[a.i].inst+1, b.x.sc.Workers+int(s.used.restarts)-1)
		if b.want {
			w := s.ws[a.i]
			b.note(ScriptStep{Kind: ScriptRestartWorker, Worker: w.id, Token: b.x.tokNames[w.tok], Seed: workerSeedFor(a.i, w.inst)},
				"fault replacement "+b.wname(a.i), "", "restart-worker slot %d as %s", a.i+1, b.wname(a.i))
		}
	case aReplayW:
		// A fresh instance boots with the dead one's token, already used if
		// that one enrolled: it must be refused.
		s.used.restarts++
		b.bootWorker(a.i, s.ws[a.i].inst+1, s.ws[a.i].tok)
		if b.want {
			w := s.ws[a.i]
			b.note(ScriptStep{Kind: ScriptRestartWorker, Worker: w.id, Token: b.x.tokNames[w.tok], Seed: workerSeedFor(a.i, w.inst)},
				"fault token-replay "+b.wname(a.i), "ReplayEvery>0", "replay-token slot %d as %s with %s", a.i+1, b.wname(a.i), b.x.tokNames[w.tok])
		}
	case aRestartSameW:
		s.used.identityRestarts++
		b.restartSameWorker(a.i)
		if b.want {
			w := s.ws[a.i]
			b.note(ScriptStep{Kind: ScriptRestartSameWorker, Worker: w.id, Token: b.x.tokNames[w.tok], Seed: workerSeedFor(a.i, w.inst)},
				"fault worker-restart "+b.wname(a.i), "WorkerRestartEvery>0", "restart-same-worker %s", b.wname(a.i))
		}
	case aCancel:
		s.used.cancels++
		if b.want {
			b.note(ScriptStep{Kind: ScriptCancel}, "operator cancel "+string(b.x.run), "CancelEvery>0", "cancel-run %s", b.x.run)
		}
		b.orch(core.CancelRun{Call: 1000, Run: b.x.run})
	case aRevoke:
		w := s.ws[a.i]
		s.used.revokes++
		s.revoked |= 1 << w.tok
		name := b.x.tokNames[w.tok]
		if b.want {
			b.note(ScriptStep{Kind: ScriptRevoke, Worker: w.id, Token: name}, "operator revoke "+name, "RevokeEvery>0", "revoke %s (%s)", name, w.id)
		}
		b.orch(core.RevokeToken{Call: 1001, Name: name})
	default:
		panic(fmt.Sprintf("spec: explorer: unknown action %d", a.k))
	}
}

func slowFault(slow bool) string {
	if slow {
		return "TailProb>0 or a clog/partition (a message in flight longer than a timer)"
	}
	return ""
}

func slowNote(slow bool) string {
	if slow {
		return " (a message still in flight: a delay)"
	}
	return ""
}

// inFlight says whether some message could be delivered now.
func (x *explorer) inFlight(s *xstate) bool {
	for _, c := range s.conns {
		if c.broken {
			continue
		}
		if (s.o != nil && c.orchOpen && len(c.toO) > 0) || (c.workerOpen && len(c.toW) > 0) {
			return true
		}
	}
	return false
}

// delay charges the delay budget when time passes over a deliverable
// message, and says whether it did.
func (b *builder) delay() bool {
	if b.x.inFlight(b.s) {
		b.s.used.delays++
		return true
	}
	return false
}

// entropyFor is the driver's entropy for a Received: a function of the
// enrolling instance, so that enrolling by another path gives the same
// credential (and the same state).
func entropyFor(m core.Msg) [16]byte {
	var e [16]byte
	if h, ok := m.(core.Hello); ok {
		f := fnv.New128a()
		f.Write([]byte(h.Worker))
		copy(e[:], f.Sum(nil))
	}
	return e
}

func secretFor(name string) [16]byte {
	var e [16]byte
	f := fnv.New128a()
	f.Write([]byte("secret/" + name))
	copy(e[:], f.Sum(nil))
	return e
}

// msgHash identifies a message by every field (the frequent kinds by hand,
// the rest through fmt, which prints maps sorted).
func msgHash(m core.Msg) uint64 {
	var h hz
	refs := func(rs []core.LeaseRef) {
		h.u(uint64(len(rs)))
		for _, r := range rs {
			h.s(string(r.Step))
			h.u(uint64(r.Lease))
		}
	}
	outcome := func(o core.Outcome) {
		h.u(uint64(o.Status), uint64(int64(o.ExitCode)))
		h.s(o.Message)
	}
	lines := func(ls []core.LogLine) {
		h.u(uint64(len(ls)))
		for _, l := range ls {
			h.u(l.Seq)
			h.t(l.At)
			h.s(l.Text)
		}
	}
	switch m := m.(type) {
	case core.Heartbeat:
		h.u(1)
		refs(m.InFlight)
	case core.Start:
		h.u(2, uint64(m.Lease), m.Request)
	case core.Report:
		h.u(3, uint64(m.Lease), m.Request)
		h.s(string(m.Step))
		outcome(m.Outcome)
	case core.Logs:
		h.u(4, uint64(m.Lease))
		lines(m.Lines)
	case core.Events:
		h.u(5, uint64(m.Lease))
		lines(m.Events)
	case core.StartAck:
		h.u(6, uint64(m.Lease), m.Request)
		h.b(m.OK)
		h.s(m.Reason)
	case core.Answer:
		h.u(7, uint64(m.Lease), m.Request, uint64(m.Verdict))
		h.s(m.Reason)
	case core.Cancel:
		h.u(8, uint64(m.Lease))
		h.s(m.Reason)
	case core.RejectDispatch:
		h.u(9, uint64(m.Lease))
		h.s(m.Reason)
	case core.Close:
		h.u(10)
		h.s(m.Reason)
	default:
		f := fnv.New64a()
		fmt.Fprintf(f, "%T %+v", m, m)
		h.u(11, f.Sum64())
	}
	return h.v
}

// ---- the orchestrator side of the driver ----

// orch steps the orchestrator with one input and handles its batch the way
// core/doc.go says: record, persist, then send.
func (b *builder) orch(in core.Input) core.Ready {
	s := b.s
	b.mutChk()
	held := b.heldReported(in)
	b.late, b.heldStart = false, false
	if r, ok := in.(core.Received); ok {
		if m, ok := r.Msg.(core.Start); ok {
			l, ok := s.o.Lease(m.Lease)
			b.heldStart = ok && l.Current && l.Held
		}
		if m, ok := r.Msg.(core.Report); ok {
			_, b.late = s.o.ClosedLease(b.from, m.Lease)
		}
		switch r.Msg.(type) {
		case core.Hello, core.Heartbeat:
			if b.from != "" {
				b.mutIdem()
				arch := s.chk.Archive()
				s.idem.Listing(in, b.from, func(l core.LeaseID) bool { _, ok := arch.Lease(l); return ok })
			}
		}
	}
	s.chk.Input(s.now, in)
	// The orchestrator is a deterministic function of (state, now, input):
	// a transition already computed from an equal orchestrator is reused,
	// the result shared (and never written to again: every orchestrator a
	// state holds is shared, and is cloned before it is stepped).
	var rd core.Ready
	key := memoKey{fp: s.o.Fingerprint(), now: s.now.UnixNano(), in: inputHash(in)}
	if b.completing {
		// A completion takes a transition the search (or another
		// completion's start) already computed from the memo; else it
		// steps its own copy in place, and does not share it: filling the
		// memo with every completion's machines costs more in collection
		// than their reuse saves.
		if v, ok := b.x.memo.get(key); ok {
			s.o, rd, s.cOwnO = v.o, readyCopy(v.rd), false // shared from here on
			return b.handle(in, rd, held)
		}
		if !s.cOwnO {
			s.o, s.cOwnO = s.o.Clone(), true
		}
		rd = s.o.Step(s.now, in)
		return b.handle(in, rd, held)
	}
	if v, ok := b.x.memo.get(key); ok {
		s.o, rd = v.o, readyCopy(v.rd)
	} else {
		s.o = s.o.Clone()
		rd = s.o.Step(s.now, in)
		// Settle its lazily hashed records before other goroutines can
		// see it: Fingerprint on a settled machine only reads.
		b.x.memo.put(key, memoVal{o: s.o, rd: readyCopy(rd), fp: s.o.Fingerprint()})
	}
	return b.handle(in, rd, held)
}

// handle does what orch does with a batch once it is computed.
func (b *builder) handle(in core.Input, rd core.Ready, held *PreBatch) core.Ready {
	s := b.s
	if b.x.sc.Mutate != nil {
		b.x.sc.Mutate(&rd)
	}
	s.chk.Batch(s.now, s.o, rd)
	s.chk.Persisted(s.now, rd) // durable before anything leaves
	s.oDL = rd.Deadline
	b.in = in
	b.observe(rd, held)
	b.in = nil
	b.sendW(rd.Messages)
	return rd
}

func (b *builder) sendW(msgs []core.Envelope) {
	for _, e := range msgs {
		b.mutNet()
		c := b.conn(e.Conn)
		if c == nil || !c.orchOpen {
			continue
		}
		if !c.broken {
			c.toW = append(c.toW, xmsg{e.Msg, msgHash(e.Msg)})
		}
		switch e.Msg.(type) {
		case core.Close, core.Refused:
			// The driver closes the connection after the message and owes
			// no Disconnected for it.
			c.orchOpen, c.oClosed = false, true
			c.toO = nil
		}
	}
}

func (b *builder) crashOrch() {
	s := b.s
	s.used.orchCrashes++
	// The durable store is every record emitted so far; the crashed
	// machine (immutable from here on) stands for it until the restart.
	s.dead, s.diskHash = s.o, s.o.Fingerprint()
	s.o, s.oDL, s.cOwnO = nil, time.Time{}, false
	b.mutChk()
	s.chk.Crash(s.now)
	b.mutNet()
	for _, c := range s.conns {
		if c.orchOpen {
			c.orchOpen, c.oClosed, c.abrupt = false, true, true
		}
		c.toO = nil
	}
}

func (b *builder) restartOrch() {
	s := b.s
	// What a store holding every batch so far holds: the records as emitted
	// (a Clone is rebuilt from exactly those).
	key := memoKey{fp: s.diskHash, now: s.now.UnixNano(), in: 0x7265}
	var o *core.Orchestrator
	var rd core.Ready
	if v, ok := b.x.memo.get(key); ok {
		o, rd = v.o, readyCopy(v.rd)
	} else {
		var err error
		o, rd, err = core.Restore(b.x.cfg, s.now, s.dead.Clone().Records())
		if err != nil {
			b.fail("Restore", "core.Restore failed on the durable records: %v", err)
			return
		}
		// Settled before it is shared (see orch).
		b.x.memo.put(key, memoVal{o: o, rd: readyCopy(rd), fp: o.Fingerprint()})
	}
	if b.x.sc.Mutate != nil {
		b.x.sc.Mutate(&rd)
	}
	s.o, s.cOwnO = o, false // shared through the memo
	s.dead, s.diskHash = nil, 0
	b.mutChk()
	s.chk.Restored(s.now, o, rd)
	s.chk.Persisted(s.now, rd)
	if s.chk.Archive().Len() > 0 {
		s.archRestart = true
	}
	s.oDL = rd.Deadline
	b.hit(SomeOrchestratorRestored)
	b.observe(rd, nil)
	b.sendW(rd.Messages)
}

// heldReported keeps what the per-batch check needs from right before the
// orchestrator handles in: for a reconnect Hello the reported leases then
// current (PropInFlightHonoured), and the orchestrator itself (CheckRecords).
func (b *builder) heldReported(in core.Input) *PreBatch {
	if b.completing && b.s.cOwnO {
		return BeforeCopy(b.s.chk.View(b.s.o), in) // stepped in place next
	}
	return Before(b.s.chk.View(b.s.o), in)
}

// observe runs the simulator's extra properties over a batch (nil pre: a
// restore's) and notes the sometimes properties it shows.
func (b *builder) observe(rd core.Ready, pre *PreBatch) {
	held := pre.HeldOf()
	s := b.s
	ov := s.chk.View(s.o) // the batch's history is in the checker's archive already
	entered, left := RecoveryChanges(rd)
	if len(entered) > 0 {
		b.mutRecov()
		for _, id := range entered {
			s.recoverAt[id] = s.now
		}
	}
	_, disconnected := b.in.(core.Disconnected)
	recovered := map[core.StepID]bool{}
	for _, t := range rd.Transitions {
		if t.From == core.StateRecovering && t.To == core.StateRunning {
			b.hit(SomeStepReclaimed)
		}
		if t.Event == core.EvRecover {
			recovered[t.Step] = true
		}
		if disconnected && t.From == core.StateRecovering && t.To != core.StateRunning && recovered[t.Step] {
			// Into recovering and out again in the batch of the
			// disconnect: the no-grace triage of a scaler-managed worker.
			b.hit(SomeScalerLeaseTriaged)
		}
		if t.Event == core.EvSkip {
			b.hit(SomeCascadeSkip)
		}
		if t.To == core.StateFailed {
			if st, ok := ov.StepByID(t.Step); ok {
				switch st.Class {
				case core.ClassUnmatched:
					b.hit(SomeStepFailedUnmatched)
				case core.ClassStaleWorker:
					b.hit(SomeStaleWorker)
				}
			}
		}
		if t.Event == core.EvCancelForce {
			b.hit(SomeCancelForced)
		}
		if t.To == core.StateFailed && b.x.writesOf(t.Step) {
			if st, ok := ov.StepByID(t.Step); ok && st.EverStarted {
				if workerLost(st.Class) {
					b.hit(SomeWriteStepFailedByTriage)
				}
			}
		}
	}
	if runSucceeded(ov, rd) {
		b.hit(SomeRunSucceeded)
	}
	for _, r := range rd.Records {
		if core.IsHistoryKey(r.Key) {
			b.hit(SomeRunArchived)
		}
	}
	for _, ev := range rd.Events {
		if ev.Kind == "child-run-finished" {
			b.hit(SomeChildRunFinished)
		}
	}
	if b.late && b.in != nil {
		b.hit(SomeReportAfterArchive)
		if s.archRestart {
			b.hit(SomeReportAfterArchiveRestart)
		}
	}
	if _, tick := b.in.(core.Tick); tick && b.x.wantExpiry {
		for _, w := range s.o.Workers() {
			if !w.Revoked && !w.CredExpiry.IsZero() && !s.now.Before(w.CredExpiry) {
				b.hit(SomeCredentialExpired)
			}
		}
	}
	if v := CheckProps(rd, s.now, b.x.grace, s.recoverAt, held); v != nil {
		b.fail(v.Invariant, "%s", v.Detail)
	}
	if v := CheckNoWriteFailures(ov, rd); v != nil {
		b.fail(v.Invariant, "%s", v.Detail)
	}
	if b.heldStart {
		for _, t := range rd.Transitions {
			if t.Event == core.EvStart {
				b.hit(SomeHeldStarted)
			}
		}
	}
	if scopeHasGroups(b.x.sc) {
		if v := CheckGroupCaps(s.o); v != nil {
			b.fail(v.Invariant, "%s", v.Detail)
		}
		if stepGroupWaits(s.o) {
			b.hit(SomeStepGroupWait)
		}
	}
	b.checkGrants(rd)
	if v := CheckChildRuns(ov, rd); v != nil {
		b.fail(v.Invariant, "%s", v.Detail)
	}
	if v := CheckRecords(pre, ov, s.now, rd); v != nil {
		b.fail(v.Invariant, "%s", v.Detail)
	}
	if r, ok := b.in.(core.Received); ok {
		if _, ok := r.Msg.(core.Report); ok {
			b.mutIdem()
			dup, v := s.idem.Check(b.in, b.from, rd)
			if dup {
				b.hit(SomeDuplicateReport)
			}
			if v != nil {
				b.fail(v.Invariant, "%s", v.Detail)
			}
		}
	}
	if len(left) > 0 {
		b.mutRecov()
		for _, id := range left {
			delete(s.recoverAt, id)
		}
	}
	for _, e := range rd.Messages {
		switch m := e.Msg.(type) {
		case core.Answer:
			if m.Verdict == core.Cancelled {
				b.hit(SomeReportCancelled)
			}
		case core.Dispatch:
			if !m.Writes {
				if st, ok := ov.StepByID(m.Step); ok && st.EverStarted {
					b.hit(SomeNoWriteStepRedispatched)
				}
			}
		case core.Refused:
			b.hit(SomeWorkerRefused)
		case core.Refreshed:
			b.hit(SomeCredentialRefreshed)
		case core.Welcome:
			if len(m.Cancel) > 0 {
				b.hit(SomeLeaseCancelledOnWelcome)
			}
		}
	}
}

// ---- the worker side of the driver ----

func (b *builder) worker(i int, in core.WorkerInput) {
	w := b.mutW(i)
	if !w.alive || w.m == nil {
		return
	}
	rd := w.m.Step(b.s.now, in)
	b.applyW(i, rd)
	if w := &b.s.ws[i]; w.m != nil {
		w.fp = w.m.Fingerprint()
	}
}

// applyW does what a WorkerReady says, in the order core/doc.go gives: send,
// close, dial, exec; exit last.
func (b *builder) applyW(i int, rd core.WorkerReady) {
	s := b.s
	b.mutWs()
	w := &s.ws[i]
	for _, m := range rd.Send {
		b.sendO(w.conn, m)
	}
	if rd.Close {
		if w.conn != 0 {
			b.closeByWorker(i)
		} else {
			w.dialing = false // abandon the pending dial
		}
	}
	if rd.Dial {
		w.dialing = true
	}
	var follow []core.WorkerInput
	for _, x := range rd.Exec {
		switch x.Op {
		case core.ExecStart:
			b.startProc(i, x)
		case core.ExecTerm:
			if k := b.proc(i, x.Lease); k >= 0 {
				b.mutProcs()
				s.procs[k].termed = true
			}
		case core.ExecKill:
			if k := b.proc(i, x.Lease); k >= 0 {
				b.mutProcs()
				s.procs = slices.Delete(s.procs, k, k+1)
				b.mutChk()
				s.chk.ProcessStopped(s.now, w.id, x.Lease)
				if rd.Exit == nil {
					follow = append(follow, core.WExecExited{Lease: x.Lease, ExitCode: 137, Signaled: true})
				}
			}
		}
	}
	if rd.Exit != nil {
		b.killWorker(i)
		return
	}
	w.deadline = rd.Deadline
	for _, f := range follow {
		b.worker(i, f)
	}
}

func (b *builder) sendO(id core.ConnID, m core.Msg) {
	if id == 0 {
		return
	}
	b.mutNet()
	c := b.conn(id)
	if c == nil || c.broken || !c.orchOpen {
		return // lost with its connection
	}
	c.toO = append(c.toO, xmsg{m, msgHash(m)})
}

func (b *builder) closeByWorker(i int) {
	s := b.s
	b.mutNet()
	if c := b.conn(s.ws[i].conn); c != nil {
		c.workerOpen, c.wClosed = false, true
		c.toW = nil
	}
	s.ws[i].conn = 0
}

func (b *builder) proc(i int, l core.LeaseID) int {
	for k, p := range b.s.procs {
		if p.w == i && p.lease == l {
			return k
		}
	}
	return -1
}

func (b *builder) startProc(i int, x core.ExecCommand) {
	s := b.s
	w := &s.ws[i]
	if b.proc(i, x.Lease) >= 0 {
		b.fail("ExecutorDoubleStart", "worker %s started lease %d twice", w.id, x.Lease)
		return
	}
	p := xproc{w: i, lease: x.Lease, step: x.Step, writes: b.x.writesOf(x.Step)}
	b.mutProcs()
	k, _ := slices.BinarySearchFunc(s.procs, p, func(a, t xproc) int {
		if a.w != t.w {
			return a.w - t.w
		}
		return int(a.lease) - int(t.lease)
	})
	s.procs = slices.Insert(s.procs, k, p)
	b.mutChk()
	s.chk.ProcessStarted(s.now, w.id, x.Lease, x.Step, p.writes)
	if p.writes {
		s.chk.ExternalWrite(s.now, w.id, x.Lease, x.Step)
	}
}

// killWorker ends a worker process: its step processes die with it, its
// connection is closed by the kernel.
func (b *builder) killWorker(i int) {
	s := b.s
	b.mutWs()
	w := &s.ws[i]
	if w.conn != 0 {
		b.mutNet()
		if c := b.conn(w.conn); c != nil {
			c.abrupt = true
		}
		b.closeByWorker(i)
	}
	w.alive, w.m, w.dialing, w.deadline = false, nil, false, time.Time{}
	b.ownW |= 1 << i
	for k := len(s.procs) - 1; k >= 0; k-- {
		if s.procs[k].w == i {
			b.mutChk()
			s.chk.ProcessStopped(s.now, w.id, s.procs[k].lease)
			b.mutProcs()
			s.procs = slices.Delete(s.procs, k, k+1)
		}
	}
}

// restartSameWorker kills the worker process in slot i (its step processes
// die with it) and boots it again at once with its saved identity (SPEC §9):
// the same id, token and seed, and the session credential it was issued.
// It reconnects with nothing in flight.
func (b *builder) restartSameWorker(i int) {
	old := b.s.ws[i]
	cfg := old.m.Config()
	cfg.Credential = old.m.Credential()
	b.killWorker(i)
	w := &b.s.ws[i]
	*w = xworker{m: core.NewWorker(cfg), alive: true, inst: old.inst, tok: old.tok, id: old.id}
	b.ownW |= 1 << i
	b.worker(i, core.WBoot{})
}

// bootWorker starts instance inst in slot i with token tok.
func (b *builder) bootWorker(i, inst, tok int) {
	b.mutWs()
	w := &b.s.ws[i]
	id := workerIDFor(i, inst)
	cfg := b.x.sc.Worker
	cfg.ID, cfg.Name, cfg.Token, cfg.Slots = id, string(id), b.x.tokens[tok], b.x.sc.Slots
	cfg.Seed = workerSeedFor(i, inst)
	if i < len(b.x.sc.WorkerTags) {
		cfg.Tags = b.x.sc.WorkerTags[i]
	}
	cfg.Scaler = b.x.sc.ScalerWorker == i+1
	*w = xworker{m: core.NewWorker(cfg), alive: true, inst: inst, tok: tok, id: id}
	b.ownW |= 1 << i
	b.worker(i, core.WBoot{})
}

// workerIDFor names instance inst of worker slot i: w1, then w1-1, w1-2, …
func workerIDFor(i, inst int) core.WorkerID {
	if inst > 0 {
		return core.WorkerID(fmt.Sprintf("w%d-%d", i+1, inst))
	}
	return core.WorkerID(fmt.Sprintf("w%d", i+1))
}

// workerSeedFor is the WorkerConfig.Seed of instance inst in slot i.
func workerSeedFor(i, inst int) uint64 { return uint64(i+1)<<8 | uint64(inst) }

// exploreTokenTTL is the validity of the tokens created at the start.
const exploreTokenTTL = time.Hour

// runSpec is the one run submitted at the start.
func (x *explorer) runSpec() core.RunSpec { return core.RunSpec{Name: "explore", Steps: x.sc.Steps} }

// ---- the initial state ----

// initial builds the start: tokens created, the run submitted, every worker
// booted (and, with Enrolled, connected and welcomed).
func (x *explorer) initial() (s *xstate, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("setup panicked: %v", r)
		}
	}()
	s = &xstate{now: exploreT0, chk: NewChecker(), o: core.NewOrchestrator(x.cfg), ws: make([]xworker, x.sc.Workers), idem: NewIdempotency()}
	s.chk.Verify = x.sc.Verify
	b := &builder{x: x, s: s, want: true, ownChk: true, ownWs: true, ownNet: true, ownProcs: true, ownRecov: true, ownIdem: true, ownW: ^uint64(0)}
	x.tokens = make([]string, len(x.tokNames))
	for k, name := range x.tokNames {
		rd := b.orch(core.CreateToken{Call: core.CallID(k + 1), Name: name, TTL: exploreTokenTTL, Secret: secretFor(name)})
		if len(rd.Answers) != 1 || rd.Answers[0].Err != "" {
			return nil, fmt.Errorf("creating token %s: %+v", name, rd.Answers)
		}
		x.tokens[k] = rd.Answers[0].Token
	}
	rd := b.orch(core.Submit{Call: 100, Spec: x.runSpec()})
	if len(rd.Answers) != 1 || rd.Answers[0].Err != "" {
		return nil, fmt.Errorf("submitting the run: %+v", rd.Answers)
	}
	x.run = rd.Answers[0].Run
	for i := range s.ws {
		b.bootWorker(i, 0, i)
	}
	if x.sc.Enrolled {
		for i := range s.ws {
			b.do(action{aConnect, i, 0})
			ci := slices.IndexFunc(s.conns, func(c *xconn) bool { return c.id == s.ws[i].conn })
			if ci < 0 || len(s.conns[ci].toO) == 0 {
				return nil, errors.New("enrolling: no hello")
			}
			b.do(action{aDeliverO, ci, 0})
			if len(s.conns[ci].toW) == 0 {
				return nil, errors.New("enrolling: no welcome")
			}
			b.do(action{aDeliverW, ci, 0})
		}
	}
	b.gc()
	x.setupSteps = b.steps
	s.chkHash = s.chk.stateHash()
	x.hits |= b.hits
	if b.viol != nil {
		return nil, fmt.Errorf("setup: %s", b.viol.Error())
	}
	if v := s.chk.Check(); v != nil {
		return nil, fmt.Errorf("setup: %s", v.Error())
	}
	return s, nil
}
