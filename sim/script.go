package sim

// Scripted runs: an explorer counterexample (spec.Script) re-executed in the
// simulator's own world — its network, its write-ahead driver pipeline, its
// worker nodes and step processes — rather than in the explorer's.
//
// The world is built as the explorer built its initial state: the same
// orchestrator and worker configurations, the same tokens, the same run, the
// same workers booted in the same order, every worker clock exact. Nothing
// random happens: no fault fires by itself, no delay is drawn for a message
// or a dial (the network holds each until the script completes it), and
// events are not popped by time. Each script step instead picks the pending
// event it names — a delivery on the connection the script's connect opened,
// a notice, a dial's outcome, a due timer — and runs it at the step's time;
// the world's faults (a reset, a crash, a restart), the operator (cancel,
// revoke) and the step processes' own behaviour (exit, output) are the
// simulator's own functions called directly. What the explorer folds into
// the action that caused it runs at once after each step: an fsync
// completing (the batch is persisted, then sent, as adapters/commit does),
// a write-bearing process's external write. The Checker is consulted after
// every event, as in a seeded run.
//
// A step the simulator's world cannot take (no such event is pending, or the
// next message on the connection is another) ends the run with a
// Divergence naming the step and listing what was pending: the two worlds
// differ there, and the script says no more about the simulator. Known
// differences (TestReplayWalks): the simulator's network is FIFO (no
// reordering), duplicates only towards the orchestrator, and loses a message
// only with its connection; and it loses what a worker sent just before it
// closed its connection or died, which the explorer may still deliver.

import (
	"cmp"
	"container/heap"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tether-run/tether/core"
	"github.com/tether-run/tether/spec"
)

// scriptHold is how long a scripted network holds a message: it arrives when
// the script delivers it, so it is scheduled later than anything the script
// does meanwhile, and the network's own "was the connection broken before it
// arrived" tests treat a break while it waits as its loss (as the explorer
// does).
const scriptHold = 100 * 365 * 24 * time.Hour

// scriptRun is a scripted run's state.
type scriptRun struct {
	sc     *spec.Script
	conns  map[core.ConnID]core.ConnID // the script's (explorer's) connection → the simulator's
	nodes  map[core.WorkerID]*workerNode
	tokens map[string]string // token name → the token the orchestrator issued
	run    core.RunID
	trace  []string
}

// ScriptResult is what a scripted run did.
type ScriptResult struct {
	Script    string // the script's scope
	Steps     int    // script steps taken (the setup's enrollment included)
	Events    uint64
	TraceHash uint64
	// Failure is the property the simulator saw broken (nil: none), at
	// script step Steps.
	Failure *Failure
	// Diverged is the step the simulator's world could not take (nil: it
	// took every step it reached).
	Diverged *Divergence
	Trace    []string // every event run, each after the script step that ran it
}

// Divergence is a script step the simulator's world could not take.
type Divergence struct {
	Step    int    // 1-based index into Script.Steps
	Label   string // the explorer's label for it
	Reason  string
	Pending []string // the live pending events then
}

func (d *Divergence) Error() string {
	s := fmt.Sprintf("script step %d (%s) diverges: %s", d.Step, d.Label, d.Reason)
	if len(d.Pending) == 0 {
		return s + "; nothing was pending"
	}
	return s + "; pending:\n  " + strings.Join(d.Pending, "\n  ")
}

func (r ScriptResult) String() string {
	var b strings.Builder
	switch {
	case r.Failure != nil:
		fmt.Fprintf(&b, "script %s: the simulator saw %s broken at step %d: %s\n", r.Script, r.Failure.Invariant, r.Steps, r.Failure.Detail)
	case r.Diverged != nil:
		fmt.Fprintf(&b, "script %s: %s\n", r.Script, r.Diverged.Error())
	default:
		fmt.Fprintf(&b, "script %s: %d steps, %d events, no property broken\n", r.Script, r.Steps, r.Events)
	}
	b.WriteString("trace:\n")
	for _, l := range r.Trace {
		b.WriteString("  " + l + "\n")
	}
	return b.String()
}

// RunScript re-executes a script in the simulator's world; mutate, if set,
// plants a bug in the orchestrator's driver (as spec.Scope.Mutate does in
// the explorer's). A scripted run is a pure function of its script and
// mutate. If cfg.Trace is set, every event is written there as it runs.
func RunScript(sc *spec.Script, mutate func(rd *core.Ready), cfg Config) (res ScriptResult) {
	bmax := sc.Worker.BackoffMax
	if bmax <= 0 {
		bmax = 60 * time.Second // the worker's default, as the explorer's grace window assumes
	}
	// DupProb 1: the network offers a trailing copy of every message (not a
	// Hello); only a dup-to-orch step delivers one.
	opt := Options{MaxDelayWork: bmax, DupProb: 1, Mutate: mutate}
	w := newWorld(0, opt, cfg)
	w.orchCfg = sc.Config
	w.script = &scriptRun{sc: sc, conns: map[core.ConnID]core.ConnID{}, nodes: map[core.WorkerID]*workerNode{},
		tokens: map[string]string{}}
	w.orch = &orchNode{o: core.NewOrchestrator(w.coreConfig()), up: true, disk: newSimDisk()}
	res.Script = sc.Scope
	defer func() {
		res.Events, res.TraceHash, res.Trace = w.events, w.hash.Sum64(), w.script.trace
		res.Failure = w.failure
		if f := res.Failure; f != nil {
			f.Script, f.Options = sc.Scope, "scripted: "+sc.Scope
		}
	}()

	w.direct(evOperator, -1, "setup: the tokens, the run", w.scriptSubmit)
	w.settle() // the answers come once their batches are durable
	if w.failure == nil {
		w.direct(evOperator, -1, "setup: the workers boot", w.scriptWorkers)
		w.settle()
	}
	if w.failure != nil {
		return res
	}
	if d := w.script.checkSetup(); d != "" {
		res.Diverged = &Divergence{Step: 0, Label: "setup", Reason: d, Pending: w.pending()}
		return res
	}
	for i, st := range sc.Steps {
		at := t0.Add(st.At)
		if at.Before(w.now) {
			res.Diverged = w.diverge(i, st, fmt.Sprintf("time goes back from +%s", w.now.Sub(t0)))
			return res
		}
		w.now = at
		line := fmt.Sprintf("step %d: %s", i+1, st.Label)
		w.script.trace = append(w.script.trace, line)
		if cfg.Trace != nil {
			fmt.Fprintln(cfg.Trace, line)
		}
		if d := w.scriptStep(st); d != "" {
			res.Diverged = w.diverge(i, st, d)
			return res
		}
		w.settle()
		res.Steps = i + 1
		if w.failure != nil {
			return res
		}
	}
	return res
}

// scriptSubmit and scriptWorkers build the explorer's initial world: tokens
// created, the run submitted, then every worker booted.
func (w *world) scriptSubmit() {
	s := w.script
	for _, t := range s.sc.Tokens {
		w.call(func(id core.CallID) core.Input {
			return core.CreateToken{Call: id, Name: t.Name, TTL: t.TTL, Secret: t.Secret}
		}, func(a core.APIAnswer) {
			if a.Err == "" {
				s.tokens[t.Name] = a.Token
			}
		})
	}
	w.call(func(id core.CallID) core.Input { return core.Submit{Call: id, Spec: s.sc.Run} }, func(a core.APIAnswer) {
		if a.Err == "" {
			s.run = a.Run
			w.hist.runs = append(w.hist.runs, a.Run)
			w.hist.submitted(a.Run, s.sc.Run)
		}
	})
}

func (w *world) scriptWorkers() {
	for _, sw := range w.script.sc.Workers {
		w.scriptBoot(sw.ID, sw.Token, sw.Seed)
	}
}

func (s *scriptRun) checkSetup() string {
	for _, t := range s.sc.Tokens {
		if s.tokens[t.Name] == "" {
			return "token " + t.Name + " was not created"
		}
	}
	if s.run == "" {
		return "the run was not submitted"
	}
	for _, sw := range s.sc.Workers {
		if s.nodes[sw.ID] == nil {
			return "worker " + string(sw.ID) + " did not boot"
		}
	}
	return ""
}

// scriptBoot boots worker id with a token created at the start.
func (w *world) scriptBoot(id core.WorkerID, token string, seed uint64) {
	tok, ok := w.script.tokens[token]
	if !ok {
		w.fail("script", fmt.Sprintf("worker %s boots with token %s, which the setup did not create", id, token))
		return
	}
	wn := &workerNode{idx: len(w.workers), id: id, alive: true, procs: map[core.LeaseID]*proc{}, link: link{scale: 1}}
	w.script.nodes[id] = wn
	w.bootWorker(wn, w.script.sc.WorkerConfig(id, tok, seed))
}

// direct runs fn as an event now (a fault, the operator, a process's own
// behaviour: the script's choice rather than something pending).
func (w *world) direct(kind evKind, node int, note string, fn func()) {
	w.seq++
	w.take(&event{at: w.now, seq: w.seq, kind: kind, node: node, note: note, fn: fn})
}

// take runs an event now: a pending one leaves the queue.
func (w *world) take(e *event) {
	if i := slices.Index(w.q, e); i >= 0 {
		heap.Remove(&w.q, i)
	}
	e.at = w.now
	w.script.trace = append(w.script.trace, "  "+w.describe(e))
	w.step(e) // (which writes it to cfg.Trace)
}

// settle runs what the explorer folds into the action that caused it: fsyncs
// completing (persist, then send) and write-bearing processes' external
// writes, in the order they were scheduled.
func (w *world) settle() {
	for w.failure == nil {
		var next *event
		for _, e := range w.q {
			if e.fold && w.isLive(e) && (next == nil || e.seq < next.seq) {
				next = e
			}
		}
		if next == nil {
			return
		}
		w.take(next)
	}
}

func (w *world) isLive(e *event) bool { return e.live == nil || e.live() }

// find returns the live pending events that satisfy ok, in the order the
// network would deliver them (time, then scheduling order).
func (w *world) find(ok func(e *event) bool) []*event {
	var out []*event
	for _, e := range w.q {
		if ok(e) && w.isLive(e) {
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b *event) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return cmp.Compare(a.seq, b.seq)
	})
	return out
}

// pending lists the live pending events, for a divergence.
func (w *world) pending() []string {
	var out []string
	for _, e := range w.find(func(*event) bool { return true }) {
		s := w.eventText(e)
		if e.conn != 0 {
			s += fmt.Sprintf(" (simulator connection %d)", e.conn)
		}
		switch e.kind {
		case evOrchTick, evWorkerTick:
			s += fmt.Sprintf(" due at +%s", e.at.Sub(t0))
		}
		out = append(out, s)
	}
	return out
}

func (w *world) diverge(i int, st spec.ScriptStep, reason string) *Divergence {
	return &Divergence{Step: i + 1, Label: st.Label, Reason: reason, Pending: w.pending()}
}

// scriptStep takes one script step, or says why the simulator cannot.
func (w *world) scriptStep(st spec.ScriptStep) string {
	s := w.script
	node := func() (*workerNode, string) {
		wn := s.nodes[st.Worker]
		if wn == nil {
			return nil, fmt.Sprintf("the simulator has no worker %s", st.Worker)
		}
		return wn, ""
	}
	connOf := func() (*conn, string) {
		id, ok := s.conns[st.Conn]
		if !ok || w.conns[id] == nil {
			return nil, fmt.Sprintf("the script's connection c%d was never opened in the simulator", st.Conn)
		}
		return w.conns[id], ""
	}
	proc := func() (*workerNode, *proc, string) {
		wn, why := node()
		if wn == nil {
			return nil, nil, why
		}
		p := wn.procs[st.Lease]
		if p == nil || p.done || !wn.alive {
			return nil, nil, fmt.Sprintf("worker %s runs no process for lease %d", st.Worker, st.Lease)
		}
		return wn, p, ""
	}
	// deliver takes the next message the network delivers on c in one
	// direction: it must be the script's.
	deliver := func(c *conn, kind evKind, dir string) string {
		next := w.find(func(e *event) bool { return e.kind == kind && e.conn == c.id && e.note == "" })
		if len(next) == 0 {
			return fmt.Sprintf("nothing is in flight %s on %s's connection", dir, st.Worker)
		}
		if got := core.DescribeMsg(next[0].msg); got != st.Msg {
			return fmt.Sprintf("the next message %s on %s's connection is %s, not %s", dir, st.Worker, got, st.Msg)
		}
		w.take(next[0])
		return ""
	}
	switch st.Kind {
	case spec.ScriptDeliverToOrch, spec.ScriptDeliverToWorker:
		c, why := connOf()
		if c == nil {
			return why
		}
		if st.Kind == spec.ScriptDeliverToOrch {
			return deliver(c, evToOrch, "to the orchestrator")
		}
		return deliver(c, evToWorker, "to the worker")
	case spec.ScriptDupToOrch:
		c, why := connOf()
		if c == nil {
			return why
		}
		dup := w.find(func(e *event) bool {
			return e.kind == evToOrch && e.conn == c.id && e.note == "duplicate" && core.DescribeMsg(e.msg) == st.Msg
		})
		if len(dup) == 0 {
			return "the network offers no copy of " + st.Msg
		}
		w.take(dup[0])
	case spec.ScriptDupToWorker, spec.ScriptDropToOrch, spec.ScriptDropToWorker:
		return "the simulator's network has no equivalent (it duplicates only towards the orchestrator, and a loss resets the connection)"
	case spec.ScriptReset:
		c, why := connOf()
		if c == nil {
			return why
		}
		w.direct(evFault, c.worker, "socket-drop", func() { w.breakConn(c, true) })
	case spec.ScriptOrchNotices, spec.ScriptWorkerNotices:
		c, why := connOf()
		if c == nil {
			return why
		}
		kind, who := evOrchNotice, "the orchestrator"
		if st.Kind == spec.ScriptWorkerNotices {
			kind, who = evWorkerNotice, string(st.Worker)
		}
		n := w.find(func(e *event) bool { return e.kind == kind && e.conn == c.id })
		if len(n) == 0 {
			return fmt.Sprintf("%s has no closed connection of %s to notice", who, st.Worker)
		}
		w.take(n[0])
	case spec.ScriptConnect, spec.ScriptDialFail:
		wn, why := node()
		if wn == nil {
			return why
		}
		want := st.Kind == spec.ScriptConnect
		if want != w.orch.up {
			return fmt.Sprintf("worker %s's dial cannot %s: the orchestrator is %s", st.Worker, map[bool]string{true: "connect", false: "fail"}[want], map[bool]string{true: "up", false: "down"}[w.orch.up])
		}
		d := w.find(func(e *event) bool { return e.kind == evDial && e.node == wn.idx })
		if len(d) == 0 {
			return fmt.Sprintf("worker %s is not dialing", st.Worker)
		}
		w.take(d[len(d)-1]) // its latest dial: an abandoned one is never completed
		if want {
			if wn.conn == 0 {
				return fmt.Sprintf("worker %s's dial did not connect", st.Worker)
			}
			s.conns[st.Conn] = wn.conn
		}
	case spec.ScriptTickOrch, spec.ScriptTickWorker:
		kind, idx, who := evOrchTick, -1, "the orchestrator"
		if st.Kind == spec.ScriptTickWorker {
			wn, why := node()
			if wn == nil {
				return why
			}
			kind, idx, who = evWorkerTick, wn.idx, string(st.Worker)
		}
		t := w.find(func(e *event) bool { return e.kind == kind && e.node == idx && e.note == "" })
		if len(t) == 0 {
			return fmt.Sprintf("%s has no timer set", who)
		}
		if t[0].at.After(w.now) {
			return fmt.Sprintf("%s's timer is due at +%s, later than the script fires it", who, t[0].at.Sub(t0))
		}
		w.take(t[0])
	case spec.ScriptExit:
		wn, p, why := proc()
		if p == nil {
			return why
		}
		if st.Code == 143 {
			if !p.termed {
				return fmt.Sprintf("the process of lease %d on %s exits on SIGTERM, but was never sent one", st.Lease, st.Worker)
			}
			w.direct(evProc, wn.idx, "exits on SIGTERM", func() { w.procExit(wn, p, 143, true) })
			break
		}
		w.direct(evProc, wn.idx, fmt.Sprintf("exits code=%d", st.Code), func() { w.procExit(wn, p, st.Code, false) })
	case spec.ScriptOutput:
		wn, p, why := proc()
		if p == nil {
			return why
		}
		w.direct(evProc, wn.idx, "output", func() { w.procOutput(wn, p, st.Text) })
	case spec.ScriptCrashOrch:
		if !w.orch.up {
			return "the orchestrator is already down"
		}
		w.direct(evFault, -1, "orchestrator crash", w.crashOrch)
	case spec.ScriptRestartOrch:
		if w.orch.up {
			return "the orchestrator is up"
		}
		w.direct(evFault, -1, "orchestrator restarts", w.restartOrch)
	case spec.ScriptCrashWorker:
		wn, why := node()
		if wn == nil {
			return why
		}
		if !wn.alive {
			return fmt.Sprintf("worker %s is already dead", st.Worker)
		}
		w.direct(evFault, wn.idx, "crash", func() {
			w.fault("worker-crash")
			w.exitWorker(wn, "crash")
		})
	case spec.ScriptRestartWorker:
		if s.nodes[st.Worker] != nil {
			return fmt.Sprintf("worker %s already exists", st.Worker)
		}
		w.direct(evFault, -1, "replacement "+string(st.Worker), func() { w.scriptBoot(st.Worker, st.Token, st.Seed) })
	case spec.ScriptRestartSameWorker:
		wn, why := node()
		if wn == nil {
			return why
		}
		if !wn.alive || wn.m.Credential() == "" {
			return fmt.Sprintf("worker %s is dead or has no credential to keep", st.Worker)
		}
		if seed := wn.m.Config().Seed; seed != st.Seed {
			return fmt.Sprintf("worker %s has seed %d, not %d", st.Worker, seed, st.Seed)
		}
		w.direct(evFault, wn.idx, "restart keeping its identity", func() {
			w.fault("worker-restart")
			cfg := w.savedIdentity(wn)
			w.killWorker(wn)
			w.rebootWorker(wn, cfg)
		})
	case spec.ScriptCancel:
		if !w.orch.up {
			return "the orchestrator is down"
		}
		w.direct(evOperator, -1, "cancel "+string(s.run), func() { w.cancelRun(s.run) })
	case spec.ScriptRevoke:
		wn, why := node()
		if wn == nil {
			return why
		}
		if got := tokenName(wn.m.Config().Token); got != st.Token {
			return fmt.Sprintf("worker %s enrolled with token %s, not %s", st.Worker, got, st.Token)
		}
		if !w.orch.up {
			return "the orchestrator is down"
		}
		w.direct(evOperator, -1, "revoke "+st.Token, func() { w.revoke(wn) })
	default:
		return fmt.Sprintf("unknown script step kind %q", st.Kind)
	}
	return ""
}
