package core

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"iter"
	"math"
	"math/rand/v2"
	"sort"
	"time"
)

// Worker defaults (DESIGN §5, seeds 000 and 003).
const (
	defaultWorkerSlots    = 1
	defaultBackoffBase    = time.Second
	defaultBackoffFactor  = 1.5
	defaultBackoffMax     = 60 * time.Second
	defaultBackoffJitter  = 0.2
	defaultEventBuffer    = 5000
	defaultLogBuffer      = 10000
	defaultRequestTimeout = 10 * time.Second
	defaultRequestRetries = 5
	defaultKillGrace      = 10 * time.Second
	defaultDialTimeout    = 10 * time.Second
	defaultHeartbeat      = 30 * time.Second
)

// Worker limits: every queue, counter and timer the worker keeps is bounded.
const (
	maxWorkerSlots     = 1024    // WorkerConfig.Slots is clamped to this
	maxRingLen         = 1 << 20 // EventBuffer and LogBuffer are clamped to this
	maxRequestRetries  = 100     // RequestRetries is clamped to this
	maxBackoffAttempts = 100     // the attempt counter stops here (the delay is long capped by then)
	maxReplayBatch     = 1000    // buffered items per Logs or Events message on replay
	minTimerInterval   = time.Second
)

// Exit codes of a worker process.
const (
	WorkerExitDisconnected = 2 // lost the orchestrator with --no-reconnect, or scaler-managed
	WorkerExitRefused      = 3 // the orchestrator refused this worker for good
)

// WorkerConfig configures a Worker. Zero values take the defaults.
type WorkerConfig struct {
	ID          WorkerID // instance UUID
	Name        string
	Token       string // enrollment token "<name>.<secret>"
	Tags        []string
	Labels      map[string]string
	Platform    string
	Slots       int  // default 1, at most maxWorkerSlots
	Scaler      bool // scaler-managed: single-use, never reconnects
	NoReconnect bool // --no-reconnect: exit on disconnect
	Seed        uint64

	BackoffBase   time.Duration // default 1s
	BackoffFactor float64       // default 1.5; at least 1
	BackoffMax    time.Duration // default 60s
	// BackoffJitter multiplies each delay by uniform[1-j, 1+j] (then capped at
	// BackoffMax). Default 0.2; a negative value disables jitter; at most 1.
	BackoffJitter float64

	EventBuffer int // default 5000
	LogBuffer   int // default 10000

	RequestTimeout time.Duration // default 10s: retransmit an unanswered Start/Report/Refresh after this
	RequestRetries int           // default 5 per request and connection; then the connection is closed
	KillGrace      time.Duration // default 10s: SIGTERM, then SIGKILL after this
	DialTimeout    time.Duration // default 10s: a dial or Hello unanswered this long is a failed attempt
}

func (c WorkerConfig) withDefaults() WorkerConfig {
	c.Tags = append([]string(nil), c.Tags...)
	c.Labels = copyMap(c.Labels)
	c.Slots = clampInt(c.Slots, defaultWorkerSlots, maxWorkerSlots)
	c.EventBuffer = clampInt(c.EventBuffer, defaultEventBuffer, maxRingLen)
	c.LogBuffer = clampInt(c.LogBuffer, defaultLogBuffer, maxRingLen)
	c.RequestRetries = clampInt(c.RequestRetries, defaultRequestRetries, maxRequestRetries)
	orDefault := func(d *time.Duration, def time.Duration) {
		if *d <= 0 {
			*d = def
		}
	}
	orDefault(&c.BackoffBase, defaultBackoffBase)
	orDefault(&c.BackoffMax, defaultBackoffMax)
	orDefault(&c.RequestTimeout, defaultRequestTimeout)
	orDefault(&c.KillGrace, defaultKillGrace)
	orDefault(&c.DialTimeout, defaultDialTimeout)
	switch {
	case c.BackoffFactor == 0:
		c.BackoffFactor = defaultBackoffFactor
	case c.BackoffFactor < 1 || math.IsNaN(c.BackoffFactor):
		c.BackoffFactor = 1
	}
	switch {
	case c.BackoffJitter == 0:
		c.BackoffJitter = defaultBackoffJitter
	case c.BackoffJitter < 0 || math.IsNaN(c.BackoffJitter):
		c.BackoffJitter = 0
	case c.BackoffJitter > 1:
		c.BackoffJitter = 1
	}
	return c
}

// clampInt returns def for v <= 0 and at most hi otherwise.
func clampInt(v, def, hi int) int {
	if v <= 0 {
		return def
	}
	return min(v, hi)
}

// WorkerInput is one input to Worker.Step.
type WorkerInput interface{ isWorkerInput() }

type (
	// WBoot starts the process: the worker begins dialing.
	WBoot struct{}
	// WConnected says the transport asked for by Dial is up; the worker sends Hello.
	WConnected struct{ Conn ConnID }
	// WDialFailed says the dial asked for by Dial failed.
	WDialFailed struct{ Reason string }
	// WDisconnected says the current connection dropped.
	WDisconnected struct{ Reason string }
	// WReceived delivers a message from the orchestrator on the current connection.
	WReceived struct{ Msg Msg }
	// WExecOutput is one line of stdout/stderr of a step's process.
	WExecOutput struct {
		Lease LeaseID
		Text  string
	}
	// WExecEvent is one protocol event of a step (e.g. a capability call).
	WExecEvent struct {
		Lease LeaseID
		Text  string
	}
	// WExecExited says a step's process ended; Err says it failed to start.
	WExecExited struct {
		Lease    LeaseID
		ExitCode int
		Signaled bool
		Err      string
	}
	// WTick says time passed: the Deadline of an earlier WorkerReady is reached.
	// Timers fire only on WTick, never on other inputs.
	WTick struct{}
)

func (WBoot) isWorkerInput()         {}
func (WConnected) isWorkerInput()    {}
func (WDialFailed) isWorkerInput()   {}
func (WDisconnected) isWorkerInput() {}
func (WReceived) isWorkerInput()     {}
func (WExecOutput) isWorkerInput()   {}
func (WExecEvent) isWorkerInput()    {}
func (WExecExited) isWorkerInput()   {}
func (WTick) isWorkerInput()         {}

// WorkerReady is what one Step asks of the driver. The driver applies it in
// this order: Send, Close, Dial, Exec; then Logs, and Exit last.
type WorkerReady struct {
	Send []Msg // to the orchestrator over the current connection, in order
	// Close: the driver must close the current connection, or abandon the
	// pending dial, and must not report WDisconnected/WConnected/WDialFailed
	// for it. The worker has already treated it as gone.
	Close bool
	// Dial: the driver must open a new connection and answer with WConnected
	// or WDialFailed.
	Dial     bool
	Exec     []ExecCommand // executor commands, in order
	Logs     []string      // the worker's own log lines, one fact each
	Exit     *WorkerExit   // the process must exit with this code; Step is inert afterwards
	Deadline time.Time     // earliest local time the worker wants a WTick; zero = none
}

// ExecOp is an executor operation.
type ExecOp uint8

const (
	ExecStart ExecOp = iota + 1 // start the step's process in its own process group
	ExecTerm                    // SIGTERM the process group
	ExecKill                    // SIGKILL the process group
)

func (o ExecOp) String() string {
	switch o {
	case ExecStart:
		return "start"
	case ExecTerm:
		return "term"
	case ExecKill:
		return "kill"
	}
	return fmt.Sprintf("exec-op(%d)", uint8(o))
}

// ExecCommand is one executor command. Step, Command and Env are set for
// ExecStart only.
type ExecCommand struct {
	Op      ExecOp
	Lease   LeaseID
	Step    StepID
	Command string
	Env     map[string]string
}

// WorkerExit tells the worker process to exit.
type WorkerExit struct {
	Code   int
	Reason string
}

// connPhase is where the worker is in its connection life cycle.
type connPhase uint8

const (
	phaseOff     connPhase = iota // not booted
	phaseBackoff                  // waiting until dialAt to dial again
	phaseDialing                  // Dial emitted; waiting for WConnected/WDialFailed until connDeadline
	phaseHello                    // Hello sent; waiting for Welcome/Refused until connDeadline
	phaseReady                    // welcomed: messages flow
)

// procState is the state of a lease's process.
type procState uint8

const (
	procNone    procState = iota // not started: a write-bearing step awaiting StartAck, or cancelled before it
	procRunning                  // ExecStart emitted, no WExecExited yet
	procExited                   // WExecExited received
)

// execution is one lease this worker holds, or held and still has to reap.
type execution struct {
	ref     LeaseRef
	command string
	env     map[string]string // never mutated after Dispatch
	writes  bool
	// released: the lease is finished (answered, refused at start, or
	// cancelled by a Welcome). Nothing more is ever emitted for it, it holds no
	// slot and no request, and the record lives only until its process is gone.
	released  bool
	proc      procState
	cancelled bool      // a Cancel arrived: the exit is reported as cancelled
	termed    bool      // ExecTerm was emitted
	killAt    time.Time // non-zero while an ExecKill is due at this time
	logSeq    uint64    // Seq of the last log line; lines are numbered from 1
	eventSeq  uint64    // Seq of the last event; events are numbered from 1
	// Ring bookkeeping while offline: items of this lease in the rings and
	// items dropped by overflow since the last gap marker.
	bufLines, bufEvents         int
	droppedLines, droppedEvents int

	// timeout is the dispatched step timeout (0: none). The worker enforces
	// it (§10): at timeoutAt (process start + timeout) it stops the process
	// and sets timedOut, and the exit is reported as timed out.
	timeout   time.Duration
	timeoutAt time.Time
	timedOut  bool
}

// reqKind is the kind of a request that expects an answer.
type reqKind uint8

const (
	reqStart   reqKind = iota + 1 // Start, answered by StartAck
	reqReport                     // Report, answered by Answer
	reqRefresh                    // Refresh, answered by Refreshed
)

// request is an unanswered request. It is sent with the same id until it is
// answered or its lease is released; at most one per kind and lease.
type request struct {
	id      uint64
	kind    reqKind
	ref     LeaseRef // zero for reqRefresh
	outcome Outcome  // reqReport only
	// due is non-zero once the request went out on the current connection:
	// at due it is retransmitted, or the connection is given up when retries
	// already reached RequestRetries.
	due     time.Time
	retries int
}

func (r *request) msg() Msg {
	switch r.kind {
	case reqStart:
		return Start{Lease: r.ref.Lease, Request: r.id}
	case reqReport:
		return Report{Step: r.ref.Step, Lease: r.ref.Lease, Request: r.id, Outcome: r.outcome}
	case reqRefresh:
		return Refresh{Request: r.id}
	}
	panic(fmt.Sprintf("core.Worker: request %d has invalid kind %d", r.id, r.kind))
}

// Worker is the state machine inside every worker process (DESIGN §3.7, seed
// 004's worker contract). It is pure: time arrives with each input, jitter
// comes from WorkerConfig.Seed, and all effects are returned as a WorkerReady.
type Worker struct {
	cfg WorkerConfig
	pcg rand.PCG // jitter source, advanced only when jitter is on

	exited bool // an Exit was emitted: Step does nothing from then on

	phase        connPhase // where the connection life cycle is
	conn         ConnID    // the current connection in phaseHello and phaseReady, else zero
	connDeadline time.Time // phaseDialing, phaseHello: the attempt fails at this time
	dialAt       time.Time // phaseBackoff: dial at this time
	// attempt counts failed attempts since the last Welcome: the n-th waits
	// min(max, base×factor^(n-1)) with jitter. It stops growing once that
	// reaches BackoffMax (or maxBackoffAttempts).
	attempt      int
	welcomed     bool      // some Welcome was received: the worker has been connected
	offlineSince time.Time // when phaseReady was last left; meaningful if welcomed and not ready

	credential  string        // session credential, from the first Welcome
	credTTL     time.Duration // zero: the credential is neither refreshed nor expired locally
	credExpiry  time.Time     // phaseReady, credTTL > 0: the credential lapses here unless refreshed
	refreshAt   time.Time     // phaseReady, credTTL > 0, no Refresh pending: next Refresh
	heartbeat   time.Duration // Heartbeat interval from the last Welcome
	heartbeatAt time.Time     // phaseReady: next Heartbeat

	nextRequest uint64    // id of the next request; ids start at 1 and only grow
	requests    []request // unanswered requests, sorted by id
	// maxLease is the greatest lease ever dispatched here. Lease ids grow, and
	// one connection is ordered, so a Dispatch at or below it is a duplicate.
	maxLease LeaseID
	// leases holds every held lease (at most Slots), plus released ones whose
	// process is still being stopped (each until its exit or its SIGKILL).
	leases map[LeaseID]*execution

	logRing, eventRing ring // items produced while not ready, oldest first

	now time.Time   // of the current Step
	out WorkerReady // accumulated by the current Step
}

// NewWorker returns a worker that has not booted yet.
func NewWorker(cfg WorkerConfig) *Worker {
	cfg = cfg.withDefaults()
	return &Worker{
		cfg:         cfg,
		pcg:         *rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15),
		nextRequest: 1,
		leases:      map[LeaseID]*execution{},
		logRing:     ring{limit: cfg.LogBuffer},
		eventRing:   ring{limit: cfg.EventBuffer},
	}
}

// Config returns the configuration with defaults filled in.
func (w *Worker) Config() WorkerConfig {
	c := w.cfg
	c.Tags = append([]string(nil), c.Tags...)
	c.Labels = copyMap(c.Labels)
	return c
}

// Credential returns the session credential from the enrollment Welcome,
// empty before it. The data plane takes it as a bearer credential.
func (w *Worker) Credential() string { return w.credential }

// Connected reports whether the worker is welcomed on a connection.
func (w *Worker) Connected() bool { return w.phase == phaseReady && !w.exited }

// Exited reports whether the worker emitted an Exit.
func (w *Worker) Exited() bool { return w.exited }

// InFlight returns the leases the worker holds, sorted by lease id: dispatched
// and not yet answered, refused or cancelled by a Welcome.
func (w *Worker) InFlight() []LeaseRef {
	refs := []LeaseRef{}
	for _, e := range w.leases {
		if !e.released {
			refs = append(refs, e.ref)
		}
	}
	sort.Slice(refs, func(i, j int) bool { return refs[i].Lease < refs[j].Lease })
	return refs
}

// heldCount is len(w.InFlight()), without building it.
func (w *Worker) heldCount() int {
	n := 0
	for _, e := range w.leases {
		if !e.released {
			n++
		}
	}
	return n
}

// Buffered returns how many events and log lines wait in the rings.
func (w *Worker) Buffered() (events, lines int) { return w.eventRing.len(), w.logRing.len() }

// Pending returns the ids of the unanswered requests, ascending.
func (w *Worker) Pending() []uint64 {
	ids := make([]uint64, len(w.requests))
	for i := range w.requests {
		ids[i] = w.requests[i].id
	}
	return ids
}

// Step applies one input at the worker's local time now. Inputs that make no
// sense in the current state (a WConnected with no dial pending, a message
// with no connection, output of an unknown lease) are ignored.
func (w *Worker) Step(now time.Time, in WorkerInput) WorkerReady {
	if w.exited {
		return WorkerReady{}
	}
	w.now = now
	switch in := in.(type) {
	case WBoot:
		if w.phase == phaseOff {
			w.dial()
		}
	case WConnected:
		if w.phase == phaseDialing {
			w.phase, w.conn = phaseHello, in.Conn
			w.connDeadline = now.Add(w.cfg.DialTimeout)
			w.send(w.hello())
		}
	case WDialFailed:
		if w.phase == phaseDialing {
			w.logf("dial failed: %s", in.Reason)
			w.connLost(false)
		}
	case WDisconnected:
		if w.phase == phaseHello || w.phase == phaseReady {
			w.logf("connection lost: %s", in.Reason)
			w.connLost(false)
		}
	case WReceived:
		w.receive(in.Msg)
	case WExecOutput:
		w.output(in.Lease, in.Text, false)
	case WExecEvent:
		w.output(in.Lease, in.Text, true)
	case WExecExited:
		w.procExited(in)
	case WTick:
		w.tick()
	default:
		panic(fmt.Sprintf("core.Worker: unknown input %T", in))
	}
	rd := w.out
	w.out = WorkerReady{}
	if !w.exited {
		rd.Deadline = w.deadline()
		w.check()
	}
	return rd
}

func (w *Worker) send(m Msg) {
	if w.phase != phaseReady && w.phase != phaseHello {
		panic(fmt.Sprintf("core.Worker: send %s without a connection", m.Kind()))
	}
	w.out.Send = append(w.out.Send, m)
}

func (w *Worker) exec(op ExecOp, e *execution) {
	c := ExecCommand{Op: op, Lease: e.ref.Lease}
	if op == ExecStart {
		c.Step, c.Command, c.Env = e.ref.Step, e.command, copyMap(e.env)
	}
	w.out.Exec = append(w.out.Exec, c)
}

func (w *Worker) logf(format string, args ...any) {
	w.out.Logs = append(w.out.Logs, fmt.Sprintf(format, args...))
}

func (w *Worker) hello() Hello {
	h := Hello{
		Version:  ProtocolVersion,
		Worker:   w.cfg.ID,
		Name:     w.cfg.Name,
		Tags:     append([]string(nil), w.cfg.Tags...),
		Labels:   copyMap(w.cfg.Labels),
		Platform: w.cfg.Platform,
		Slots:    w.cfg.Slots,
		Scaler:   w.cfg.Scaler,
		MaxDelay: w.cfg.BackoffMax,
		InFlight: w.InFlight(),
	}
	if w.cfg.NoReconnect {
		// The orchestrator derives grace = 2 × MaxDelay: a worker that will
		// not reconnect asks for none, so its steps are triaged at once.
		h.MaxDelay = 0
	}
	if w.credential != "" {
		h.Credential = w.credential
	} else {
		h.Token = w.cfg.Token
	}
	h.Buffered = w.logRing.len() + w.eventRing.len()
	return h
}

// --- connection life cycle ---

func (w *Worker) dial() {
	w.phase = phaseDialing
	w.dialAt = time.Time{}
	w.connDeadline = w.now.Add(w.cfg.DialTimeout)
	w.out.Dial = true
}

// connLost ends the current connection or attempt; closeIt asks the driver to
// close it. A scaler-managed or --no-reconnect worker exits; others back off.
func (w *Worker) connLost(closeIt bool) {
	if closeIt {
		w.out.Close = true
	}
	if w.phase == phaseReady {
		w.offlineSince = w.now
		w.heartbeatAt, w.refreshAt, w.credExpiry = time.Time{}, time.Time{}, time.Time{}
		// A Refresh belongs to its session: the next Welcome restarts the
		// credential's clock. Start and Report survive and are re-sent.
		w.dropRequests(func(r *request) bool { return r.kind == reqRefresh })
		for i := range w.requests {
			w.requests[i].due, w.requests[i].retries = time.Time{}, 0
		}
	}
	w.conn, w.connDeadline = 0, time.Time{}
	if w.cfg.Scaler || w.cfg.NoReconnect {
		w.exit(WorkerExitDisconnected, w.noReconnectReason())
		return
	}
	if w.attempt == 0 || (w.attempt < maxBackoffAttempts && w.rawBackoff(w.attempt) < w.cfg.BackoffMax) {
		w.attempt++
	}
	d := w.backoff(w.attempt)
	w.phase, w.dialAt = phaseBackoff, w.now.Add(d)
	w.logf("next dial in %v (attempt %d)", d, w.attempt)
}

func (w *Worker) noReconnectReason() string {
	switch {
	case w.cfg.Scaler && w.welcomed:
		return "scaler-managed worker disconnected; single use"
	case w.cfg.Scaler:
		return "scaler-managed worker could not connect; single use"
	case w.welcomed:
		return "disconnected from orchestrator and --no-reconnect is set"
	}
	return "could not connect to orchestrator and --no-reconnect is set"
}

// rawBackoff is min(max, base × factor^(n-1)) for attempt n ≥ 1.
func (w *Worker) rawBackoff(n int) time.Duration {
	d := float64(w.cfg.BackoffBase) * math.Pow(w.cfg.BackoffFactor, float64(n-1))
	return time.Duration(min(d, float64(w.cfg.BackoffMax)))
}

// backoff is rawBackoff(n) × uniform[1-j, 1+j], capped at BackoffMax.
func (w *Worker) backoff(n int) time.Duration {
	d := w.rawBackoff(n)
	if j := w.cfg.BackoffJitter; j > 0 {
		f := 1 - j + 2*j*rand.New(&w.pcg).Float64()
		d = min(time.Duration(float64(d)*f), w.cfg.BackoffMax)
	}
	return d
}

// exit kills every running process and stops the worker for good.
func (w *Worker) exit(code int, reason string) {
	for _, e := range w.sortedExecutions() {
		if e.proc == procRunning {
			w.exec(ExecKill, e)
		}
	}
	w.out.Exit = &WorkerExit{Code: code, Reason: reason}
	w.exited = true
}

// --- messages from the orchestrator ---

func (w *Worker) receive(m Msg) {
	if w.phase == phaseHello {
		// Before Welcome the orchestrator says nothing else.
		switch m := m.(type) {
		case Welcome:
			w.welcome(m)
		case Refused:
			w.refused(m)
		case Close:
			w.closed(m)
		}
		return
	}
	if w.phase != phaseReady {
		return // no connection: a late delivery from a dead one
	}
	switch m := m.(type) {
	case Dispatch:
		w.dispatch(m)
	case StartAck:
		w.startAck(m)
	case Cancel:
		w.cancel(m)
	case Answer:
		w.answer(m)
	case Refreshed:
		w.refreshed(m)
	case Refused:
		w.refused(m)
	case Close:
		w.closed(m)
	}
}

func (w *Worker) welcome(m Welcome) {
	wasOffline, offline := w.welcomed, w.now.Sub(w.offlineSince)
	w.phase, w.connDeadline = phaseReady, time.Time{}
	w.welcomed, w.attempt = true, 0
	if w.credential == "" {
		w.credential = m.Credential
	}
	w.logf("connected to orchestrator")
	w.heartbeat = max(m.Heartbeat, minTimerInterval)
	if m.Heartbeat <= 0 {
		w.heartbeat = defaultHeartbeat
	}
	w.heartbeatAt = w.now.Add(w.heartbeat)
	w.credTTL = max(m.CredentialTTL, 0)
	if w.credTTL > 0 {
		w.credExpiry = w.now.Add(w.credTTL)
		w.refreshAt = w.now.Add(w.refreshInterval())
	}
	cancel := append([]LeaseID(nil), m.Cancel...)
	sort.Slice(cancel, func(i, j int) bool { return cancel[i] < cancel[j] })
	for _, l := range cancel {
		if e := w.held(l); e != nil {
			w.logf("lease %d is no longer current; stopping it", l)
			w.release(e)
		}
	}
	for i := range w.requests {
		w.transmit(&w.requests[i])
	}
	if wasOffline {
		w.replay(offline)
	} else if w.logRing.len()+w.eventRing.len() > 0 {
		panic("core.Worker: buffered output before the first Welcome")
	}
}

func (w *Worker) refreshInterval() time.Duration { return max(w.credTTL/3, minTimerInterval) }

func (w *Worker) refused(m Refused) {
	if m.Fatal {
		w.logf("refused by orchestrator for good: %s", m.Reason)
		w.exit(WorkerExitRefused, "refused by orchestrator: "+m.Reason)
		return
	}
	w.logf("refused by orchestrator: %s", m.Reason)
	w.connLost(true)
}

func (w *Worker) closed(m Close) {
	w.logf("orchestrator closed the session: %s", m.Reason)
	w.connLost(true)
}

func (w *Worker) dispatch(m Dispatch) {
	if m.Lease <= w.maxLease {
		return // duplicate or stale
	}
	w.maxLease = m.Lease
	if held := w.heldCount(); held >= w.cfg.Slots {
		w.logf("rejecting lease %d: busy (%d of %d slots)", m.Lease, held, w.cfg.Slots)
		w.send(RejectDispatch{Lease: m.Lease, Reason: "busy"})
		return
	}
	e := &execution{
		ref:     LeaseRef{Step: m.Step, Lease: m.Lease},
		command: m.Command,
		env:     copyMap(m.Env),
		writes:  m.Writes,
		timeout: max(m.Timeout, 0),
	}
	w.leases[m.Lease] = e
	if !e.writes {
		w.startProc(e) // a no-write step may start before START is recorded
	}
	w.newRequest(reqStart, e.ref, Outcome{})
}

func (w *Worker) startAck(m StartAck) {
	e := w.held(m.Lease)
	if e == nil || !w.dropRequests(func(r *request) bool { return r.kind == reqStart && r.ref.Lease == m.Lease }) {
		return // unknown, finished, cancelled meanwhile, or a duplicate
	}
	if !m.OK {
		w.logf("start of lease %d refused: %s", m.Lease, m.Reason)
		w.release(e)
		return
	}
	if e.proc == procNone {
		w.startProc(e) // the start handshake is complete: START is durable
	}
}

func (w *Worker) cancel(m Cancel) {
	e := w.held(m.Lease)
	if e == nil || e.cancelled {
		return
	}
	e.cancelled = true
	w.logf("lease %d cancelled by orchestrator: %s", m.Lease, m.Reason)
	switch e.proc {
	case procRunning:
		w.stop(e)
	case procNone:
		// Never started: report it cancelled so the cancel completes.
		w.dropRequests(func(r *request) bool { return r.kind == reqStart && r.ref.Lease == m.Lease })
		w.newRequest(reqReport, e.ref, Outcome{Status: OutcomeCancelled})
	}
}

func (w *Worker) answer(m Answer) {
	e := w.held(m.Lease)
	if e == nil {
		return // late or duplicate: the lease is already finished
	}
	switch m.Verdict {
	case Committed, Cancelled:
	case Rejected:
		w.logf("report for lease %d rejected: %s", m.Lease, m.Reason)
	default:
		w.logf("ignoring answer for lease %d with invalid verdict %d", m.Lease, m.Verdict)
		return
	}
	w.release(e)
}

func (w *Worker) refreshed(m Refreshed) {
	if !w.dropRequests(func(r *request) bool { return r.kind == reqRefresh && r.id == m.Request }) {
		return // late or duplicate
	}
	if m.TTL > 0 {
		w.credTTL = m.TTL
	}
	if w.credTTL > 0 {
		w.credExpiry = w.now.Add(w.credTTL)
		w.refreshAt = w.now.Add(w.refreshInterval())
	}
	w.logf("credential refreshed; valid for %v", w.credTTL)
}

// --- executions ---

func (w *Worker) held(l LeaseID) *execution {
	if e := w.leases[l]; e != nil && !e.released {
		return e
	}
	return nil
}

func (w *Worker) startProc(e *execution) {
	e.proc = procRunning
	if e.timeout > 0 {
		e.timeoutAt = w.now.Add(e.timeout)
	}
	w.exec(ExecStart, e)
}

// stop sends SIGTERM once and schedules SIGKILL after the kill grace.
func (w *Worker) stop(e *execution) {
	e.timeoutAt = time.Time{} // a process being stopped times out no more
	if e.proc == procRunning && !e.termed {
		e.termed, e.killAt = true, w.now.Add(w.cfg.KillGrace)
		w.exec(ExecTerm, e)
	}
}

// release finishes a lease: it frees its slot, forgets its requests and
// buffered output, and stops its process if it still runs.
func (w *Worker) release(e *execution) {
	l := e.ref.Lease
	e.released = true
	w.dropRequests(func(r *request) bool { return r.ref.Lease == l && r.kind != reqRefresh })
	w.logRing.remove(l)
	w.eventRing.remove(l)
	e.bufLines, e.bufEvents, e.droppedLines, e.droppedEvents = 0, 0, 0, 0
	if e.proc == procRunning {
		w.stop(e)
	} else {
		delete(w.leases, l)
	}
}

func (w *Worker) output(l LeaseID, text string, event bool) {
	e := w.held(l)
	if e == nil || e.proc == procNone {
		return // finished leases emit nothing more
	}
	var line LogLine
	if event {
		e.eventSeq++
		line = LogLine{Seq: e.eventSeq, At: w.now, Text: text}
	} else {
		e.logSeq++
		line = LogLine{Seq: e.logSeq, At: w.now, Text: text}
	}
	switch {
	case w.phase == phaseReady && event:
		w.send(Events{Lease: l, Events: []LogLine{line}})
	case w.phase == phaseReady:
		w.send(Logs{Lease: l, Lines: []LogLine{line}})
	case event:
		e.bufEvents++
		if old, ok := w.eventRing.push(ringItem{lease: l, line: line}); ok {
			o := w.leases[old.lease]
			o.bufEvents--
			o.droppedEvents++
		}
	default:
		e.bufLines++
		if old, ok := w.logRing.push(ringItem{lease: l, line: line}); ok {
			o := w.leases[old.lease]
			o.bufLines--
			o.droppedLines++
		}
	}
}

func (w *Worker) procExited(x WExecExited) {
	e := w.leases[x.Lease]
	if e == nil || e.proc != procRunning {
		return
	}
	e.proc, e.killAt, e.timeoutAt = procExited, time.Time{}, time.Time{}
	if e.released {
		delete(w.leases, x.Lease)
		return
	}
	var o Outcome
	switch {
	case e.cancelled && x.Err != "":
		o = Outcome{Status: OutcomeCleanupFailed, ExitCode: x.ExitCode, Message: x.Err}
	case e.cancelled:
		o = Outcome{Status: OutcomeCancelled, ExitCode: x.ExitCode}
	case e.timedOut:
		o = Outcome{Status: OutcomeTimedOut, ExitCode: x.ExitCode, Message: fmt.Sprintf("stopped at its timeout of %v", e.timeout)}
	case x.Err != "":
		o = Outcome{Status: OutcomeFailure, ExitCode: x.ExitCode, Message: x.Err}
	case x.Signaled:
		o = Outcome{Status: OutcomeFailure, ExitCode: x.ExitCode, Message: "killed by signal"}
	case x.ExitCode == 0:
		o = Outcome{Status: OutcomeSuccess}
	default:
		o = Outcome{Status: OutcomeFailure, ExitCode: x.ExitCode, Message: fmt.Sprintf("exit status %d", x.ExitCode)}
	}
	w.newRequest(reqReport, e.ref, o)
}

// --- requests ---

// newRequest records a request and sends it when connected.
func (w *Worker) newRequest(k reqKind, ref LeaseRef, o Outcome) {
	w.requests = append(w.requests, request{id: w.nextRequest, kind: k, ref: ref, outcome: o})
	w.nextRequest++
	if w.phase == phaseReady {
		w.transmit(&w.requests[len(w.requests)-1])
	}
}

// transmit (re)sends r on the current connection.
func (w *Worker) transmit(r *request) {
	r.due = w.now.Add(w.cfg.RequestTimeout)
	w.send(r.msg())
}

// dropRequests removes the requests matching f and reports whether any did.
func (w *Worker) dropRequests(f func(*request) bool) bool {
	kept := w.requests[:0]
	for i := range w.requests {
		if !f(&w.requests[i]) {
			kept = append(kept, w.requests[i])
		}
	}
	dropped := len(kept) < len(w.requests)
	clear(w.requests[len(kept):])
	w.requests = kept
	return dropped
}

// --- timers ---

func (w *Worker) tick() {
	for _, e := range w.sortedExecutions() {
		if !e.timeoutAt.IsZero() && !w.now.Before(e.timeoutAt) {
			e.timeoutAt = time.Time{}
			if e.proc == procRunning && !e.released {
				e.timedOut = true
				w.logf("lease %d exceeded its timeout of %v; stopping it", e.ref.Lease, e.timeout)
				w.stop(e)
			}
		}
		if !e.killAt.IsZero() && !w.now.Before(e.killAt) {
			e.killAt = time.Time{}
			w.exec(ExecKill, e)
			if e.released {
				delete(w.leases, e.ref.Lease) // nothing is left to report
			}
		}
	}
	switch w.phase {
	case phaseBackoff:
		if !w.now.Before(w.dialAt) {
			w.dial()
		}
	case phaseDialing, phaseHello:
		if !w.now.Before(w.connDeadline) {
			what := "dial"
			if w.phase == phaseHello {
				what = "hello"
			}
			w.logf("%s timed out after %v", what, w.cfg.DialTimeout)
			w.connLost(true)
		}
	case phaseReady:
		w.readyTimers()
	}
}

func (w *Worker) readyTimers() {
	if w.credTTL > 0 && !w.now.Before(w.credExpiry) {
		w.logf("session credential expired; disconnecting")
		w.connLost(true)
		return
	}
	var due []*request
	for i := range w.requests {
		if r := &w.requests[i]; !w.now.Before(r.due) {
			due = append(due, r)
		}
	}
	for _, r := range due {
		if r.kind == reqRefresh {
			w.logf("credential refresh failed: no answer")
		}
	}
	for _, r := range due {
		if r.retries >= w.cfg.RequestRetries {
			w.logf("request %d unanswered after %d retries; closing connection", r.id, r.retries)
			w.connLost(true)
			return
		}
	}
	for _, r := range due {
		r.retries++
		w.transmit(r)
	}
	if !w.now.Before(w.heartbeatAt) {
		w.heartbeatAt = w.now.Add(w.heartbeat)
		w.send(Heartbeat{InFlight: w.InFlight()})
	}
	if !w.refreshAt.IsZero() && !w.now.Before(w.refreshAt) {
		w.refreshAt = time.Time{} // rescheduled by Refreshed
		w.newRequest(reqRefresh, LeaseRef{}, Outcome{})
	}
}

// deadline is the earliest time a timer is due.
func (w *Worker) deadline() time.Time {
	var d time.Time
	at := func(t time.Time) {
		if !t.IsZero() && (d.IsZero() || t.Before(d)) {
			d = t
		}
	}
	for _, e := range w.leases {
		at(e.killAt)
		at(e.timeoutAt)
	}
	switch w.phase {
	case phaseBackoff:
		at(w.dialAt)
	case phaseDialing, phaseHello:
		at(w.connDeadline)
	case phaseReady:
		at(w.heartbeatAt)
		at(w.refreshAt)
		if w.credTTL > 0 {
			at(w.credExpiry)
		}
		for i := range w.requests {
			at(w.requests[i].due)
		}
	}
	return d
}

// --- replay after reconnect ---

// replay sends, per lease in lease order, a gap marker, then the lease's
// buffered events, then its buffered lines, with their original stamps.
func (w *Worker) replay(offline time.Duration) {
	secs := max(int64(offline/time.Second), 0)
	lines, events := map[LeaseID][]LogLine{}, map[LeaseID][]LogLine{}
	w.logRing.each(func(it ringItem) { lines[it.lease] = append(lines[it.lease], it.line) })
	w.eventRing.each(func(it ringItem) { events[it.lease] = append(events[it.lease], it.line) })
	var nLeases, nEvents, nLines, nDropped, nDroppedEvents int
	for _, e := range w.sortedExecutions() {
		if e.released || e.bufLines+e.bufEvents+e.droppedLines+e.droppedEvents == 0 {
			continue
		}
		l := e.ref.Lease
		if len(lines[l]) != e.bufLines || len(events[l]) != e.bufEvents {
			panic(fmt.Sprintf("core.Worker: lease %d ring counts disagree with the rings", l))
		}
		marker := LogLine{Seq: 0, At: w.now, Text: GapMarker(secs, e.bufEvents, e.bufLines, e.droppedLines, e.droppedEvents)}
		w.send(Logs{Lease: l, Lines: []LogLine{marker}})
		for b := range batches(events[l]) {
			w.send(Events{Lease: l, Events: b})
		}
		for b := range batches(lines[l]) {
			w.send(Logs{Lease: l, Lines: b})
		}
		nLeases++
		nEvents += e.bufEvents
		nLines += e.bufLines
		nDropped += e.droppedLines
		nDroppedEvents += e.droppedEvents
		e.bufLines, e.bufEvents, e.droppedLines, e.droppedEvents = 0, 0, 0, 0
	}
	w.logRing.reset()
	w.eventRing.reset()
	if nLeases > 0 {
		w.logf("offline for %ds: replayed %d events and %d log lines of %d lease(s); %d log lines and %d events were dropped",
			secs, nEvents, nLines, nLeases, nDropped, nDroppedEvents)
	}
}

// GapMarker is the log line that precedes a lease's replayed output (seed 003).
func GapMarker(offlineSecs int64, events, lines, droppedLines, droppedEvents int) string {
	s := fmt.Sprintf("--- Orchestrator offline for %ds. Replaying %d buffered events and %d buffered log lines.", offlineSecs, events, lines)
	if droppedLines > 0 {
		s += fmt.Sprintf(" %d log lines dropped due to buffer overflow.", droppedLines)
	}
	if droppedEvents > 0 {
		s += fmt.Sprintf(" %d events dropped due to buffer overflow.", droppedEvents)
	}
	return s + " ---"
}

// batches yields s in chunks of at most maxReplayBatch (copies, so a message
// never aliases another).
func batches(s []LogLine) iter.Seq[[]LogLine] {
	return func(yield func([]LogLine) bool) {
		for len(s) > 0 {
			n := min(len(s), maxReplayBatch)
			if !yield(append([]LogLine(nil), s[:n]...)) {
				return
			}
			s = s[n:]
		}
	}
}

// --- ring ---

type ringItem struct {
	lease LeaseID
	line  LogLine
}

// ring is a FIFO of at most limit items that drops the oldest when full.
// items grows to limit; from then on head is the oldest item.
type ring struct {
	items []ringItem
	head  int
	limit int
}

func (r *ring) len() int { return len(r.items) }

// push appends it and returns the item it dropped, if any.
func (r *ring) push(it ringItem) (ringItem, bool) {
	if len(r.items) < r.limit {
		r.items = append(r.items, it)
		return ringItem{}, false
	}
	old := r.items[r.head]
	r.items[r.head] = it
	r.head = (r.head + 1) % r.limit
	return old, true
}

// each calls f on every item, oldest first.
func (r *ring) each(f func(ringItem)) {
	for i := range r.items {
		f(r.items[(r.head+i)%len(r.items)])
	}
}

// remove drops every item of lease l, keeping the order of the others.
func (r *ring) remove(l LeaseID) {
	kept := make([]ringItem, 0, len(r.items))
	r.each(func(it ringItem) {
		if it.lease != l {
			kept = append(kept, it)
		}
	})
	r.items, r.head = kept, 0
}

func (r *ring) reset() { r.items, r.head = nil, 0 }

func (r ring) clone() ring {
	r.items = append([]ringItem(nil), r.items...)
	return r
}

// --- cloning, fingerprint, invariants ---

// Clone returns a deep, independent copy.
func (w *Worker) Clone() *Worker {
	c := *w
	c.cfg = w.Config()
	state, err := w.pcg.MarshalBinary()
	if err != nil {
		panic(err)
	}
	if err := c.pcg.UnmarshalBinary(state); err != nil {
		panic(err)
	}
	c.requests = append([]request(nil), w.requests...)
	c.leases = make(map[LeaseID]*execution, len(w.leases))
	for l, e := range w.leases {
		ce := *e
		ce.env = copyMap(e.env)
		c.leases[l] = &ce
	}
	c.logRing, c.eventRing = w.logRing.clone(), w.eventRing.clone()
	c.out = WorkerReady{}
	return &c
}

// Fingerprint is FNV-1a 64 over a canonical encoding of the whole state:
// equal states give equal fingerprints whatever the map order or the rings'
// physical layout.
func (w *Worker) Fingerprint() uint64 {
	var e enc
	c := &w.cfg
	e.str(string(c.ID), c.Name, c.Token, c.Platform)
	e.u64(uint64(len(c.Tags)))
	e.str(c.Tags...)
	e.strMap(c.Labels)
	e.bool(c.Scaler, c.NoReconnect)
	e.int(c.Slots, c.EventBuffer, c.LogBuffer, c.RequestRetries)
	e.u64(c.Seed, math.Float64bits(c.BackoffFactor), math.Float64bits(c.BackoffJitter))
	e.dur(c.BackoffBase, c.BackoffMax, c.RequestTimeout, c.KillGrace, c.DialTimeout)
	pcg, _ := w.pcg.MarshalBinary()
	e.str(string(pcg))

	e.bool(w.exited, w.welcomed)
	e.u64(uint64(w.phase), uint64(w.conn), uint64(w.attempt), w.nextRequest, uint64(w.maxLease))
	e.time(w.connDeadline, w.dialAt, w.offlineSince, w.credExpiry, w.refreshAt, w.heartbeatAt)
	e.str(w.credential)
	e.dur(w.credTTL, w.heartbeat)

	e.u64(uint64(len(w.requests)))
	for _, r := range w.requests {
		e.u64(r.id, uint64(r.kind), uint64(r.ref.Lease))
		e.str(string(r.ref.Step), r.outcome.Message)
		e.int(int(r.outcome.Status), r.outcome.ExitCode, r.retries)
		e.time(r.due)
	}
	execs := w.sortedExecutions()
	e.u64(uint64(len(execs)))
	for _, x := range execs {
		e.u64(uint64(x.ref.Lease), uint64(x.proc), x.logSeq, x.eventSeq)
		e.str(string(x.ref.Step), x.command)
		e.strMap(x.env)
		e.bool(x.writes, x.released, x.cancelled, x.termed, x.timedOut)
		e.time(x.killAt, x.timeoutAt)
		e.dur(x.timeout)
		e.int(x.bufLines, x.bufEvents, x.droppedLines, x.droppedEvents)
	}
	for _, r := range []*ring{&w.logRing, &w.eventRing} {
		e.int(r.limit, r.len())
		r.each(func(it ringItem) {
			e.u64(uint64(it.lease), it.line.Seq)
			e.time(it.line.At)
			e.str(it.line.Text)
		})
	}
	h := fnv.New64a()
	h.Write(e.b)
	return h.Sum64()
}

// enc builds the canonical byte encoding: fixed-width integers and
// length-prefixed strings.
type enc struct{ b []byte }

func (e *enc) u64(vs ...uint64) {
	for _, v := range vs {
		e.b = binary.LittleEndian.AppendUint64(e.b, v)
	}
}

func (e *enc) int(vs ...int) {
	for _, v := range vs {
		e.u64(uint64(v))
	}
}

func (e *enc) dur(vs ...time.Duration) {
	for _, v := range vs {
		e.u64(uint64(v))
	}
}

func (e *enc) bool(vs ...bool) {
	for _, v := range vs {
		if v {
			e.b = append(e.b, 1)
		} else {
			e.b = append(e.b, 0)
		}
	}
}

func (e *enc) str(vs ...string) {
	for _, v := range vs {
		e.u64(uint64(len(v)))
		e.b = append(e.b, v...)
	}
}

func (e *enc) time(ts ...time.Time) {
	for _, t := range ts {
		e.u64(uint64(t.Unix()), uint64(t.Nanosecond()))
	}
}

func (e *enc) strMap(m map[string]string) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	e.u64(uint64(len(keys)))
	for _, k := range keys {
		e.str(k, m[k])
	}
}

func (w *Worker) sortedExecutions() []*execution {
	es := make([]*execution, 0, len(w.leases))
	for _, e := range w.leases {
		es = append(es, e)
	}
	sort.Slice(es, func(i, j int) bool { return es[i].ref.Lease < es[j].ref.Lease })
	return es
}

// check asserts cheap invariants after every Step.
func (w *Worker) check() {
	held, lines, events := 0, 0, 0
	for l, e := range w.leases {
		if e.ref.Lease != l || l > w.maxLease {
			panic(fmt.Sprintf("core.Worker: lease %d misfiled", l))
		}
		if e.released && e.proc != procRunning {
			panic(fmt.Sprintf("core.Worker: released lease %d kept without a process", l))
		}
		if !e.released {
			held++
		}
		lines += e.bufLines
		events += e.bufEvents
	}
	if held > w.cfg.Slots {
		panic(fmt.Sprintf("core.Worker: holds %d leases with %d slots", held, w.cfg.Slots))
	}
	if lines != w.logRing.len() || events != w.eventRing.len() ||
		w.logRing.len() > w.logRing.limit || w.eventRing.len() > w.eventRing.limit {
		panic("core.Worker: ring bookkeeping is off")
	}
	if len(w.requests) > 2*held+1 {
		panic(fmt.Sprintf("core.Worker: %d requests for %d leases", len(w.requests), held))
	}
	for i := range w.requests {
		r := &w.requests[i]
		if r.id >= w.nextRequest || (i > 0 && r.id <= w.requests[i-1].id) {
			panic(fmt.Sprintf("core.Worker: request %d out of order", r.id))
		}
		if r.kind != reqRefresh && w.held(r.ref.Lease) == nil {
			panic(fmt.Sprintf("core.Worker: request %d for lease %d that is not held", r.id, r.ref.Lease))
		}
		if (w.phase == phaseReady) == r.due.IsZero() {
			panic(fmt.Sprintf("core.Worker: request %d transmission state disagrees with the connection", r.id))
		}
	}
	if (w.phase == phaseReady && !w.welcomed) || (w.phase < phaseHello && w.conn != 0) {
		panic(fmt.Sprintf("core.Worker: connection state is off (phase %d)", w.phase))
	}
}
