package fuzz

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tether-run/tether/core"
	"github.com/tether-run/tether/spec"
)

// FuzzInputStream decodes a byte stream into a sequence of inputs to a real
// Orchestrator and real Workers, wired by an in-memory network that is FIFO
// per connection and direction, driven the way core/doc.go says (a batch's
// records are durable before any of its messages leave). The bytes are the
// choices: which event happens next (a message delivered either way, a
// process exiting or printing, time passing — by a drawn amount or exactly
// to the next deadline —, a network reset, a dial answered or failed, an
// orchestrator restart, a crash that loses an unpersisted batch, a worker
// crash, an operator call, a duplicated or forged report), which worker,
// which lease among those dispatched, how much time. A spec.Checker sees
// everything a driver and the world know and is asked after every event:
// any violation, and any panic, fails.
func FuzzInputStream(f *testing.F) {
	for _, s := range streamSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		s := newStream(t, in)
		s.run()
	})
}

// TestInputStreamReachesTheRegister runs pseudo-random streams and requires
// that they reach what FuzzInputStream is for — commits, cancels, rejections,
// restarts, lost batches, write-bearing processes — so that a change to the
// decoder that makes the streams tame is noticed.
func TestInputStreamReachesTheRegister(t *testing.T) {
	total := map[string]int{}
	n := 40
	if testing.Short() {
		n = 10
	}
	for seed := uint64(1); seed <= uint64(n); seed++ {
		r := rand.New(rand.NewPCG(seed, 7))
		in := make([]byte, 600)
		for i := range in {
			in[i] = byte(r.UintN(256))
		}
		s := newStream(t, in)
		s.run()
		for k, v := range s.stats {
			total[k] += v
		}
	}
	var keys []string
	for _, k := range slices.Sorted(maps.Keys(total)) {
		keys = append(keys, fmt.Sprintf("%s=%d", k, total[k]))
	}
	t.Logf("streams: %s", strings.Join(keys, " "))
	happy := newStream(t, streamSeeds()[0])
	happy.run()
	if n := happy.stats["answer COMMITTED"]; n < 5 {
		t.Errorf("the scripted happy-path seed committed %d reports, want at least 5: the decoder drifted from the script", n)
	}
	for _, k := range []string{"answer COMMITTED", "answer CANCELLED", "answer REJECTED", "restart", "lost batch",
		"write process", "dispatch", "welcome", "run finished"} {
		if total[k] == 0 {
			t.Errorf("the streams never reached %q", k)
		}
	}
}

// ---- the driver ----

var streamT0 = time.Date(2026, 5, 1, 9, 0, 0, 0, time.UTC)

// maxStreamOps bounds the events of one input (the rest is ignored), so
// that every execution stays fast.
const maxStreamOps = 500

// eof is queued behind a worker's last message when it closes its end: the
// orchestrator then sees Disconnected.
type eof struct{}

func (eof) Kind() string { return "eof" }

type sConn struct {
	id         core.ConnID
	w          *sWorker
	toOrch     []core.Msg
	toWorker   []core.Msg
	orchClosed bool // the orchestrator's end is closed: nothing more reaches it
	gone       bool // the worker's end is closed: nothing more reaches the worker
}

type sProc struct {
	lease  core.LeaseID
	step   core.StepID
	writes bool
	termed bool
	lines  int
}

type sWorker struct {
	id       core.WorkerID
	m        *core.Worker
	conn     *sConn
	dialing  bool
	deadline time.Time
	exited   bool
	procs    map[core.LeaseID]*sProc
	writes   map[core.LeaseID]bool
	steps    map[core.LeaseID]core.StepID
}

type stream struct {
	t   testing.TB
	in  []byte
	pos int

	now      time.Time
	cfg      core.Config
	o        *core.Orchestrator
	chk      *spec.Checker
	disk     core.Disk
	deadline time.Time // the orchestrator's last Deadline

	conns    map[core.ConnID]*sConn
	nextConn core.ConnID
	workers  []*sWorker
	spawned  int
	call     core.CallID
	secret   byte
	entropy  uint64
	runs     []core.RunID
	tokens   []string // token names, in creation order
	tokenStr map[string]string
	leases   []core.LeaseID // every lease dispatched, ascending
	disp     map[core.LeaseID]core.Dispatch
	sent     []sentMsg // worker → orchestrator messages delivered, for duplicates
	pending  []string  // tokens created for workers still to boot

	// records collects every record the orchestrator emitted (seeds for
	// the record fuzzers).
	records []core.Record
	stats   map[string]int
}

type sentMsg struct {
	conn core.ConnID
	msg  core.Msg
}

func newStream(t testing.TB, in []byte) *stream {
	s := &stream{t: t, in: in, now: streamT0, chk: spec.NewChecker(), disk: core.Disk{},
		conns: map[core.ConnID]*sConn{}, tokenStr: map[string]string{}, disp: map[core.LeaseID]core.Dispatch{},
		stats: map[string]int{}}
	// The first byte picks the configuration: default timers, or short
	// ones with a 2-grant cap so that deadlines are a few events away.
	if s.byte()%2 == 1 {
		s.cfg = core.Config{DispatchAck: 4 * time.Second, HeartbeatTimeout: 45 * time.Second,
			SweepInterval: 15 * time.Second, UnmatchedTimeout: 20 * time.Second, ForceCancel: 12 * time.Second,
			KillGrace: 4 * time.Second, CredentialTTL: 2 * time.Minute, MaxAttempts: 2}
	}
	s.o = core.NewOrchestrator(s.cfg)
	s.cfg = s.o.Config()
	s.chk.Verify = len(in) <= 300 // full cross-checks cost time proportional to history
	return s
}

// byte returns the next choice (zero once the input is used up).
func (s *stream) byte() byte {
	if s.pos >= len(s.in) {
		s.pos++
		return 0
	}
	b := s.in[s.pos]
	s.pos++
	return b
}

// pick draws a choice among n; it always consumes one byte, so that an
// event decodes the same number of bytes whatever the state.
func (s *stream) pick(n int) int {
	b := s.byte()
	if n <= 1 {
		return 0
	}
	return int(b) % n
}

func (s *stream) run() {
	s.setup()
	for ops := 0; s.pos < len(s.in) && ops < maxStreamOps; ops++ {
		s.event(s.byte())
		s.check()
	}
}

func (s *stream) check() {
	s.t.Helper()
	if v := s.chk.Check(); v != nil {
		s.t.Fatalf("after %d bytes at +%s: %v", s.pos, s.now.Sub(streamT0), v)
	}
}

// setup enrolls two workers and submits a run, both drawn from the input.
func (s *stream) setup() {
	for i := 0; i < 2; i++ {
		s.spawn()
	}
	s.submit()
	s.check()
}

// ---- the orchestrator side ----

// orch steps one input, persists its batch, then lets its messages go.
func (s *stream) orch(in core.Input) core.Ready {
	s.chk.Input(s.now, in)
	rd := s.o.Step(s.now, in)
	s.chk.Batch(s.now, s.o, rd)
	s.persist(rd)
	s.release(rd)
	return rd
}

func (s *stream) persist(rd core.Ready) {
	s.disk.Apply(rd.Records)
	s.records = append(s.records, rd.Records...)
	s.chk.Persisted(s.now, rd)
	s.deadline = rd.Deadline
}

// release sends a durable batch's messages and reads its answers.
func (s *stream) release(rd core.Ready) {
	for _, e := range rd.Messages {
		c := s.conns[e.Conn]
		if c == nil || c.orchClosed {
			continue
		}
		if !c.gone {
			c.toWorker = append(c.toWorker, e.Msg)
		}
		switch m := e.Msg.(type) {
		case core.Close, core.Refused:
			c.orchClosed = true // the driver closes the connection after sending
		case core.Dispatch:
			if _, seen := s.disp[m.Lease]; !seen {
				s.disp[m.Lease] = m
				s.leases = append(s.leases, m.Lease)
				s.stats["dispatch"]++
			}
		}
	}
	for _, a := range rd.Answers {
		if a.Token != "" {
			name, _, _ := strings.Cut(a.Token, ".")
			s.tokenStr[name] = a.Token
		}
		if a.Run != "" && !slices.Contains(s.runs, a.Run) {
			s.runs = append(s.runs, a.Run)
		}
	}
	for _, ev := range rd.Events {
		if ev.Kind == "run-finished" {
			s.stats["run finished"]++
		}
	}
}

func (s *stream) nextCall() core.CallID { s.call++; return s.call }

// restart crashes the orchestrator and restores it from the disk: every
// connection is gone.
func (s *stream) restart() {
	s.chk.Crash(s.now)
	o, rd, err := core.Restore(s.cfg, s.now, s.disk.Records())
	if err != nil {
		s.t.Fatalf("restore from the orchestrator's own records: %v", err)
	}
	s.o = o
	s.stats["restart"]++
	for _, id := range slices.Sorted(maps.Keys(s.conns)) {
		c := s.conns[id]
		c.orchClosed = true
		c.toOrch = nil
		if w := c.w; w.conn == c && !w.exited {
			c.gone, c.toWorker = true, nil
			w.conn = nil
			s.worker(w, core.WDisconnected{Reason: "orchestrator restarted"})
		}
	}
	s.chk.Restored(s.now, o, rd)
	s.persist(rd)
	s.release(rd)
}

// lostBatch steps one input and crashes before its batch is persisted:
// nothing of it leaves the process.
func (s *stream) lostBatch() {
	var in core.Input = core.Tick{}
	if c := s.pickConn(func(c *sConn) bool { return len(c.toOrch) > 0 && !c.orchClosed }); c != nil {
		if _, isEOF := c.toOrch[0].(eof); !isEOF {
			in = core.Received{Conn: c.id, Msg: c.toOrch[0], Entropy: s.nextEntropy()}
		}
		c.toOrch = c.toOrch[1:]
	}
	s.chk.Input(s.now, in)
	rd := s.o.Step(s.now, in)
	s.chk.Batch(s.now, s.o, rd)
	s.stats["lost batch"]++
	s.restart()
}

func (s *stream) nextEntropy() [16]byte {
	s.entropy++
	var e [16]byte
	for i := 0; i < 8; i++ {
		e[i] = byte(s.entropy >> (8 * i))
	}
	e[15] = 0xa5
	return e
}

// ---- the worker side ----

// spawn creates a token and boots a new worker instance with it.
func (s *stream) spawn() {
	if s.spawned >= 5 {
		return
	}
	s.spawned++
	id := core.WorkerID(fmt.Sprintf("w%d", s.spawned))
	name := "tok-" + string(id)
	s.secret++
	s.orch(core.CreateToken{Call: s.nextCall(), Name: name, TTL: time.Hour, Secret: [16]byte{s.secret, 0x5a}})
	s.tokens = append(s.tokens, name)
	b := s.byte()
	cfg := core.WorkerConfig{ID: id, Name: string(id), Token: s.tokenStr[name], Slots: 1 + int(b%2),
		Seed: uint64(s.spawned), BackoffMax: []time.Duration{10 * time.Second, 30 * time.Second, time.Minute, 60 * time.Second}[(b>>1)%4]}
	switch (b >> 3) % 8 {
	case 0:
		cfg.Scaler = true
	case 1:
		cfg.NoReconnect = true
	}
	if (b>>6)%3 == 0 {
		cfg.Tags = []string{"gpu"}
	}
	w := &sWorker{id: id, m: core.NewWorker(cfg), procs: map[core.LeaseID]*sProc{},
		writes: map[core.LeaseID]bool{}, steps: map[core.LeaseID]core.StepID{}}
	s.workers = append(s.workers, w)
	s.worker(w, core.WBoot{})
}

// worker steps one input through a worker and carries out what it asks:
// Send, Close, Dial, Exec, Exit (in that order).
func (s *stream) worker(w *sWorker, in core.WorkerInput) {
	if w.exited {
		return
	}
	rd := w.m.Step(s.now, in)
	if c := w.conn; c != nil && !c.gone {
		for _, m := range rd.Send {
			if !c.orchClosed {
				c.toOrch = append(c.toOrch, m)
			}
		}
	}
	if rd.Close && w.conn != nil {
		s.closeByWorker(w)
	}
	if rd.Dial {
		w.dialing = true
	}
	for _, x := range rd.Exec {
		switch x.Op {
		case core.ExecStart:
			if p := w.procs[x.Lease]; p != nil {
				s.t.Fatalf("worker %s started lease %d twice", w.id, x.Lease)
			}
			p := &sProc{lease: x.Lease, step: x.Step, writes: w.writes[x.Lease]}
			w.procs[x.Lease] = p
			s.chk.ProcessStarted(s.now, w.id, x.Lease, x.Step, p.writes)
			if p.writes {
				s.stats["write process"]++
			}
		case core.ExecTerm:
			if p := w.procs[x.Lease]; p != nil {
				p.termed = true
			}
		case core.ExecKill:
			if p := w.procs[x.Lease]; p != nil {
				defer s.exitProc(w, p, 137, true, "")
			}
		}
	}
	if rd.Exit != nil {
		s.stats["exit: "+rd.Exit.Reason]++
		s.crashWorker(w)
		return
	}
	w.deadline = rd.Deadline
}

// closeByWorker: the worker closed its connection; the orchestrator reads
// what was already sent, then sees the close.
func (s *stream) closeByWorker(w *sWorker) {
	c := w.conn
	c.gone, c.toWorker = true, nil
	if !c.orchClosed {
		c.toOrch = append(c.toOrch, eof{})
	}
	w.conn = nil
}

// crashWorker ends a worker process: its step processes die with it.
func (s *stream) crashWorker(w *sWorker) {
	if w.exited {
		return
	}
	w.exited = true
	for _, l := range slices.Sorted(maps.Keys(w.procs)) {
		s.chk.ProcessStopped(s.now, w.id, l)
		delete(w.procs, l)
	}
	if w.conn != nil {
		s.closeByWorker(w)
	}
	w.dialing = false
	s.stats["worker exit"]++
}

func (s *stream) exitProc(w *sWorker, p *sProc, code int, signaled bool, err string) {
	if w.procs[p.lease] != p || w.exited {
		return
	}
	delete(w.procs, p.lease)
	s.chk.ProcessStopped(s.now, w.id, p.lease)
	s.worker(w, core.WExecExited{Lease: p.lease, ExitCode: code, Signaled: signaled, Err: err})
}

// deliverToWorker hands the next message of connection c to its worker.
func (s *stream) deliverToWorker(c *sConn) {
	m := c.toWorker[0]
	c.toWorker = c.toWorker[1:]
	w := c.w
	if w.exited || w.conn != c {
		return
	}
	s.chk.Delivered(s.now, w.id, m)
	switch m := m.(type) {
	case core.Dispatch:
		w.writes[m.Lease] = m.Writes
		w.steps[m.Lease] = m.Step
	case core.Welcome:
		s.stats["welcome"]++
	case core.Answer:
		s.stats["answer "+m.Verdict.String()]++
	}
	s.worker(w, core.WReceived{Msg: m})
	if _, closing := m.(core.Close); closing && w.conn == c {
		s.closeByWorker(w)
	}
	if r, ok := m.(core.Refused); ok && !r.Fatal && w.conn == c {
		s.closeByWorker(w)
	}
}

// deliverToOrch hands the next message of connection c to the orchestrator.
func (s *stream) deliverToOrch(c *sConn) {
	m := c.toOrch[0]
	c.toOrch = c.toOrch[1:]
	if c.orchClosed {
		return
	}
	if _, ok := m.(eof); ok {
		c.orchClosed = true
		s.orch(core.Disconnected{Conn: c.id})
		return
	}
	s.sent = append(s.sent, sentMsg{conn: c.id, msg: m})
	s.orch(core.Received{Conn: c.id, Msg: m, Entropy: s.nextEntropy()})
}

// reset breaks a worker's connection both ways, losing what is in flight.
func (s *stream) reset(w *sWorker) {
	c := w.conn
	c.gone, c.toWorker, c.toOrch = true, nil, nil
	w.conn = nil
	if !c.orchClosed {
		c.orchClosed = true
		s.orch(core.Disconnected{Conn: c.id})
	}
	s.worker(w, core.WDisconnected{Reason: "connection reset"})
	s.stats["reset"]++
}

// ---- events ----

func (s *stream) pickConn(ok func(*sConn) bool) *sConn {
	var cs []*sConn
	for _, id := range slices.Sorted(maps.Keys(s.conns)) {
		if c := s.conns[id]; ok(c) {
			cs = append(cs, c)
		}
	}
	if len(cs) == 0 {
		return nil
	}
	return cs[s.pick(len(cs))]
}

// firstConn returns the lowest-numbered connection that satisfies ok.
func (s *stream) firstConn(ok func(*sConn) bool) *sConn {
	for _, id := range slices.Sorted(maps.Keys(s.conns)) {
		if c := s.conns[id]; ok(c) {
			return c
		}
	}
	return nil
}

func (s *stream) pickWorker(ok func(*sWorker) bool) *sWorker {
	var ws []*sWorker
	for _, w := range s.workers {
		if !w.exited && ok(w) {
			ws = append(ws, w)
		}
	}
	if len(ws) == 0 {
		return nil
	}
	return ws[s.pick(len(ws))]
}

func (s *stream) pickProc() (*sWorker, *sProc) {
	type wp struct {
		w *sWorker
		p *sProc
	}
	var all []wp
	for _, w := range s.workers {
		if w.exited {
			continue
		}
		for _, l := range slices.Sorted(maps.Keys(w.procs)) {
			all = append(all, wp{w, w.procs[l]})
		}
	}
	if len(all) == 0 {
		return nil, nil
	}
	x := all[s.pick(len(all))]
	return x.w, x.p
}

// streamAdvances are the time steps a byte can draw: mostly short, now and
// then long enough for a grace window, a stale worker or a lapsed credential.
var streamAdvances = []time.Duration{100 * time.Millisecond, time.Second, time.Second, 2 * time.Second,
	3 * time.Second, 5 * time.Second, 5 * time.Second, 10 * time.Second, 11 * time.Second, 15 * time.Second,
	30 * time.Second, 31 * time.Second, 61 * time.Second, 2 * time.Minute, 5 * time.Minute, 16 * time.Minute}

// Events, and how many of the 256 byte values decode to each.
const (
	opToOrch = iota
	opToWorker
	opExit
	opOutput
	opAdvance
	opToDeadline
	opDial
	opReset
	opRestart
	opLostBatch
	opOperator
	opForge
	opCrashWorker
	opWrite
	opSpawn
	opFlush
	numOps
)

var opWeights = [numOps]int{
	opToOrch: 44, opToWorker: 44, opFlush: 36, opExit: 20, opOutput: 8, opAdvance: 22, opToDeadline: 14, opDial: 23,
	opReset: 6, opRestart: 1, opLostBatch: 1, opOperator: 14, opForge: 12, opCrashWorker: 2, opWrite: 5, opSpawn: 4,
}

// opTable maps a byte to its event.
var opTable = func() (t [256]uint8) {
	i := 0
	for op, n := range opWeights {
		for k := 0; k < n; k++ {
			t[i] = uint8(op)
			i++
		}
	}
	if i != 256 {
		panic(fmt.Sprintf("fuzz: op weights add up to %d, want 256", i))
	}
	return t
}()

// event decodes and applies one event.
func (s *stream) event(b byte) {
	switch opTable[b] {
	case opToOrch: // a message reaches the orchestrator
		if c := s.pickConn(func(c *sConn) bool { return len(c.toOrch) > 0 }); c != nil {
			s.deliverToOrch(c)
		}
	case opToWorker: // a message reaches a worker
		if c := s.pickConn(func(c *sConn) bool { return len(c.toWorker) > 0 }); c != nil {
			s.deliverToWorker(c)
		}
	case opExit: // a process exits: success, failure, failure to start, or on SIGTERM
		if w, p := s.pickProc(); p != nil {
			switch k := s.pick(6); {
			case p.termed && k < 4:
				s.exitProc(w, p, 143, true, "")
			case k < 3:
				s.exitProc(w, p, 0, false, "")
			case k < 5:
				s.exitProc(w, p, 1+k, false, "")
			default:
				s.exitProc(w, p, 127, false, "exec: not found")
			}
		}
	case opOutput: // a process prints, or makes a capability call (an event)
		if w, p := s.pickProc(); p != nil {
			p.lines++
			if s.pick(3) == 0 {
				s.worker(w, core.WExecEvent{Lease: p.lease, Text: fmt.Sprintf("capability call %d", p.lines)})
			} else {
				s.worker(w, core.WExecOutput{Lease: p.lease, Lines: []string{fmt.Sprintf("line %d", p.lines)}})
			}
		}
	case opAdvance: // time passes
		d := streamAdvances[s.pick(len(streamAdvances))]
		s.advance(s.now.Add(d))
	case opToDeadline: // time passes exactly to the next deadline
		next := s.deadline
		for _, w := range s.workers {
			if !w.exited && !w.deadline.IsZero() && (next.IsZero() || w.deadline.Before(next)) {
				next = w.deadline
			}
		}
		if !next.IsZero() && next.After(s.now) {
			s.advance(next)
		} else {
			s.advance(s.now.Add(time.Second))
		}
	case opDial: // a dial completes or fails
		if w := s.pickWorker(func(w *sWorker) bool { return w.dialing }); w != nil {
			w.dialing = false
			if s.pick(8) == 0 {
				s.worker(w, core.WDialFailed{Reason: "connection refused"})
				return
			}
			s.nextConn++
			c := &sConn{id: s.nextConn, w: w}
			s.conns[c.id] = c
			w.conn = c
			s.worker(w, core.WConnected{Conn: c.id})
		}
	case opReset: // a network reset
		if w := s.pickWorker(func(w *sWorker) bool { return w.conn != nil }); w != nil {
			s.reset(w)
		}
	case opRestart: // the orchestrator restarts
		s.restart()
	case opLostBatch: // the orchestrator crashes before persisting a batch
		s.lostBatch()
	case opOperator: // an operator
		s.operator()
	case opForge: // the network duplicates a message, or a confused worker forges one
		s.forge()
	case opCrashWorker: // a worker process crashes
		if w := s.pickWorker(func(*sWorker) bool { return true }); w != nil {
			s.crashWorker(w)
		}
	case opWrite: // a write-bearing process writes to the outside world
		if w, p := s.pickProc(); p != nil && p.writes {
			s.chk.ExternalWrite(s.now, w.id, p.lease, p.step)
		}
	case opFlush: // the network delivers everything in flight, both ways
		for i := 0; i < 64; i++ {
			c := s.firstConn(func(c *sConn) bool { return len(c.toOrch) > 0 || len(c.toWorker) > 0 })
			if c == nil {
				break
			}
			if len(c.toOrch) > 0 {
				s.deliverToOrch(c)
			} else {
				s.deliverToWorker(c)
			}
		}
	case opSpawn: // a new worker instance boots (a replacement, or a new machine)
		s.spawn()
	}
}

// advance moves time to t: the orchestrator ticks if its deadline passed,
// then every worker whose deadline passed.
func (s *stream) advance(t time.Time) {
	s.now = t
	if !s.deadline.IsZero() && !s.deadline.After(s.now) {
		s.orch(core.Tick{})
	}
	for _, w := range s.workers {
		if !w.exited && !w.deadline.IsZero() && !w.deadline.After(s.now) {
			s.worker(w, core.WTick{})
		}
	}
}

// operator makes one API call: submit, cancel, approve, reject, revoke.
func (s *stream) operator() {
	switch s.pick(6) {
	case 0, 1:
		s.submit()
	case 2:
		if len(s.runs) > 0 {
			s.orch(core.CancelRun{Call: s.nextCall(), Run: s.runs[s.pick(len(s.runs))]})
		}
	case 3, 4:
		var held []core.StepID
		for _, st := range s.o.Steps() {
			if st.State == core.StateHeld {
				held = append(held, st.ID)
			}
		}
		if len(held) > 0 {
			id := held[s.pick(len(held))]
			if s.pick(4) == 0 {
				s.orch(core.RejectGate{Call: s.nextCall(), Step: id})
			} else {
				s.orch(core.Approve{Call: s.nextCall(), Step: id})
			}
		}
	case 5:
		if len(s.tokens) > 0 {
			s.orch(core.RevokeToken{Call: s.nextCall(), Name: s.tokens[s.pick(len(s.tokens))]})
		}
	}
}

// submit submits a small run drawn from the input: up to four steps, each
// write-bearing or not, with dependencies on earlier ones and now and then a
// gate, a fan-out, a timeout, a tag or a task step.
func (s *stream) submit() {
	if len(s.runs) >= 8 {
		return
	}
	n := 1 + s.pick(4)
	var steps []core.StepSpec
	for i := 0; i < n; i++ {
		b := s.byte()
		st := core.StepSpec{Name: fmt.Sprintf("s%d", i), Command: "work", Writes: b&1 == 1}
		for j := 0; j < i; j++ {
			if (b>>(1+j))&1 == 1 {
				st.DependsOn = append(st.DependsOn, fmt.Sprintf("s%d", j))
			}
		}
		switch s.pick(16) {
		case 0:
			st.Hold = true
		case 1:
			st.Hold, st.HoldExpiry = true, time.Minute
		case 2:
			st.Wait = 20 * time.Second
		case 3:
			st.ForEach, st.Concurrency = []string{"x", "y", "z"}, 1+s.pick(2)
		case 4:
			st.Timeout = 45 * time.Second
		case 5:
			st.Tags = []string{"gpu"}
		case 6:
			st.Type = "task"
		case 7:
			st.Env = map[string]string{"STAGE": "two", "PATH": "/denied"}
		}
		steps = append(steps, st)
	}
	spec := core.RunSpec{Name: "stream", Steps: steps}
	if s.pick(8) == 0 {
		spec.Timeout = 3 * time.Minute
	}
	s.orch(core.Submit{Call: s.nextCall(), Spec: spec})
}

// forge puts a message on a live connection that its worker's state machine
// did not send: a duplicate of something delivered before (the network
// repeated it), or a report, start, reject or heartbeat about a lease drawn
// from every lease ever dispatched (a confused or malicious worker); or it
// opens a connection that enrolls with a copied token.
func (s *stream) forge() {
	if len(s.tokens) > 0 && s.pick(6) == 0 {
		// Someone else dials in with a token they copied: unless it was
		// never used, never revoked and not expired, it must not enroll.
		s.nextConn++
		c := &sConn{id: s.nextConn, w: &sWorker{id: core.WorkerID(fmt.Sprintf("intruder%d", s.nextConn)), exited: true}}
		s.conns[c.id] = c
		c.toOrch = append(c.toOrch, core.Hello{Version: core.ProtocolVersion, Token: s.tokenStr[s.tokens[s.pick(len(s.tokens))]],
			Worker: c.w.id, Slots: 1, MaxDelay: time.Minute})
		s.stats["stolen token"]++
		return
	}
	c := s.pickConn(func(c *sConn) bool { return !c.orchClosed && !c.gone })
	if c == nil {
		return
	}
	if len(s.sent) > 0 && s.pick(2) == 0 {
		d := s.sent[s.pick(len(s.sent))]
		if d.conn == c.id {
			if _, isHello := d.msg.(core.Hello); !isHello {
				c.toOrch = append(c.toOrch, d.msg)
				s.stats["duplicate"]++
				return
			}
		}
	}
	var l core.LeaseID = 1
	if len(s.leases) > 0 {
		l = s.leases[s.pick(len(s.leases))]
	}
	step := s.disp[l].Step
	var m core.Msg
	switch s.pick(5) {
	case 0:
		m = core.Start{Lease: l, Request: uint64(1 + s.pick(40))}
	case 1:
		m = core.RejectDispatch{Lease: l, Reason: "busy"}
	case 2:
		m = core.Heartbeat{InFlight: []core.LeaseRef{{Step: step, Lease: l}}}
	default:
		st := core.OutcomeStatus(1 + s.pick(5)) // 5 is not a status
		m = core.Report{Step: step, Lease: l, Request: uint64(s.pick(40)), Outcome: core.Outcome{Status: st, ExitCode: s.pick(3)}}
	}
	c.toOrch = append(c.toOrch, m)
	s.stats["forged"]++
}

// streamSeeds are the starting corpus besides testdata: a few scripted
// streams (a happy path, restarts, resets) and pseudo-random ones.
func streamSeeds() [][]byte {
	op := func(o int) byte { // the first byte value that decodes to o
		for b, x := range opTable {
			if int(x) == o {
				return byte(b)
			}
		}
		panic("no such op")
	}
	// The setup: default config; two static workers with one slot, no
	// tags, 10s backoff; a run of two steps, s0 and write-bearing s1 after
	// it, no gates; no run timeout.
	happy := []byte{0, 0x50, 0x50, 1, 0x00, 15, 0x03, 15, 1}
	dial, flush := []byte{op(opDial), 0, 1}, []byte{op(opFlush)} // 1: the dial succeeds
	out, exit := []byte{op(opOutput), 0, 1}, []byte{op(opExit), 0, 0}
	tick := []byte{op(opAdvance), 3} // 2s
	happy = slices.Concat(happy, dial, dial, flush, flush)
	for i := 0; i < 25; i++ {
		happy = slices.Concat(happy, flush, out, flush, exit, flush, flush, tick, dial, dial)
		if i%5 == 4 {
			happy = slices.Concat(happy, []byte{op(opOperator), 0}, happy[3:9]) // another run
		}
	}
	restarts := slices.Clone(happy)
	for i := 60; i+1 < len(restarts); i += 71 {
		restarts[i] = op(opRestart)
	}
	resets := slices.Clone(happy)
	for i := 33; i+1 < len(resets); i += 47 {
		resets[i], resets[i+1] = op(opReset), 0
	}
	seeds := [][]byte{happy, restarts, resets}
	for seed := uint64(1); seed <= 3; seed++ {
		r := rand.New(rand.NewPCG(seed, 99))
		b := make([]byte, 400)
		for i := range b {
			b[i] = byte(r.UintN(256))
		}
		seeds = append(seeds, b)
	}
	return seeds
}
