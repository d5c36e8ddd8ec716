package core

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"iter"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"time"
)

// Worker defaults (SPEC §10, §12).
const (
	defaultWorkerSlots    = 1
	defaultBackoffBase    = time.Second
	defaultBackoffFactor  = 1.5
	defaultBackoffMax     = 60 * time.Second
	defaultBackoffJitter  = 0.2
	defaultLogWindowLines = 1000
	defaultLogWindowBytes = 1 << 20
	defaultOutputCapBytes = 64 << 20
	defaultRequestTimeout = 10 * time.Second
	defaultRequestRetries = 5
	defaultKillGrace      = 10 * time.Second
	defaultDialTimeout    = 10 * time.Second
	defaultHeartbeat      = 30 * time.Second
	defaultDrainTimeout   = 10 * time.Minute
)

// Worker limits: every queue, counter and timer the worker keeps is bounded.
const (
	maxWorkerSlots    = 1024    // WorkerConfig.Slots is clamped to this
	maxLogWindowLines = 1 << 20 // LogWindowLines is clamped to this
	maxLogWindowBytes = 1 << 30 // LogWindowBytes is clamped to this
	// logHardBoundFactor × the window bounds a lease's unacknowledged lines
	// (and bytes) however the driver honours OutputPaused: output beyond it
	// is dropped and counted in the lease's gap marker, never silently.
	logHardBoundFactor = 4
	maxUnackedEvents   = 5000 // unacknowledged events per lease; beyond, dropped and counted
	maxRequestRetries  = 100  // RequestRetries is clamped to this
	maxBackoffAttempts = 100  // the attempt counter stops here (the delay is long capped by then)
	maxReplayBatch     = 1000 // lines or events per Logs or Events message
	minTimerInterval   = time.Second
)

// Exit codes of a worker process.
const (
	WorkerExitDrained      = 0 // drained: every lease finished and answered (§10)
	WorkerExitDisconnected = 2 // lost the orchestrator with --no-reconnect, or scaler-managed
	WorkerExitRefused      = 3 // the orchestrator refused this worker for good
)

// WorkerConfig configures a Worker. Zero values take the defaults.
type WorkerConfig struct {
	ID    WorkerID // instance UUID
	Name  string
	Token string // enrollment token "<name>.<secret>"
	// Credential is the session credential "<worker id>.<secret>" an earlier
	// process of this same instance saved (SPEC §9, §10): the worker boots
	// with it instead of Token, and its first Hello is a reconnect Hello
	// whose in-flight list is empty (the old process's step processes died
	// with it, so the orchestrator triages every lease it held as lost).
	// A refusal of it before any Welcome exits with CredentialRefused set.
	Credential string
	Tags       []string
	Labels     map[string]string
	Platform   string
	Slots      int // default 1, at most maxWorkerSlots
	// Ahead is how many dispatches beyond its slots the worker holds,
	// granted but not started, so that the next step is already here when
	// a slot frees (SPEC §3 lease-ahead, `worker connect --ahead`):
	// 0..MaxWorkerAhead whatever the slots, default 0.
	Ahead int
	// LinkLosesFrames says the link may lose a frame while the connection
	// stays up and later frames get through (the simulator's one-way
	// partition). Then every send of a Start under lease-ahead first re-sends
	// each older unanswered Report that went out at another instant (SPEC
	// §10). Over a WebSocket (TCP) a frame is lost only with its connection,
	// and after the next Welcome every unanswered request is re-sent in
	// request order, so an earlier send already precedes the Start: the
	// real worker leaves it false.
	LinkLosesFrames bool
	Scaler          bool // scaler-managed: single-use, never reconnects
	// SingleUse (`worker connect --single-use`, SPEC §10) makes the first
	// dispatch the worker accepts its last: it starts draining at once
	// (with no drain timeout: the step's own timeout bounds it) and exits 0
	// once that step is reported and answered. It implies Scaler.
	SingleUse   bool
	NoReconnect bool // --no-reconnect: exit on disconnect
	Seed        uint64

	BackoffBase   time.Duration // default 1s
	BackoffFactor float64       // default 1.5; at least 1
	BackoffMax    time.Duration // default 60s
	// BackoffJitter multiplies each delay by uniform[1-j, 1+j] (then capped at
	// BackoffMax). Default 0.2; a negative value disables jitter; at most 1.
	BackoffJitter float64

	// LogWindowLines and LogWindowBytes bound a lease's unacknowledged log
	// lines (SPEC §10): at either, OutputPaused reports the lease paused and
	// the driver stops reading its process's output until LogAcks free the
	// window. Defaults 1,000 lines and 1 MiB; a line counts len(text)+1 bytes.
	LogWindowLines int
	LogWindowBytes int
	// OutputCapBytes caps what a step's output may store (SPEC §10, §12):
	// the first line that would take the lease's output past it, and every
	// line after it, is dropped and counted; one gap marker before the
	// report gives the exact line and byte counts. Default 64 MiB.
	OutputCapBytes int64

	RequestTimeout time.Duration // default 10s: retransmit an unanswered Start/Report/Refresh after this
	RequestRetries int           // default 5 per request and connection; then the connection is closed
	KillGrace      time.Duration // default 10s: SIGTERM, then SIGKILL after this
	DialTimeout    time.Duration // default 10s: a dial or Hello unanswered this long is a failed attempt
	DrainTimeout   time.Duration // default 10m: a drain this long stops the leases still running (§10)
}

func (c WorkerConfig) withDefaults() WorkerConfig {
	c.Tags = append([]string(nil), c.Tags...)
	c.Labels = copyMap(c.Labels)
	c.Slots = clampInt(c.Slots, defaultWorkerSlots, maxWorkerSlots)
	if c.SingleUse {
		c.Scaler, c.Slots, c.Ahead = true, 1, 0
	}
	c.Ahead = max(0, min(c.Ahead, MaxWorkerAhead))
	c.LogWindowLines = clampInt(c.LogWindowLines, defaultLogWindowLines, maxLogWindowLines)
	c.LogWindowBytes = clampInt(c.LogWindowBytes, defaultLogWindowBytes, maxLogWindowBytes)
	if c.OutputCapBytes <= 0 {
		c.OutputCapBytes = defaultOutputCapBytes
	}
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
	orDefault(&c.DrainTimeout, defaultDrainTimeout)
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
	// WExecOutput is output of a step's process: the lines of stdout/stderr
	// the driver read at once, in order, without their newlines. A flood is
	// one input and one Logs message, not one per line.
	WExecOutput struct {
		Lease LeaseID
		Lines []string
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
	// WDrain asks the worker to drain (the process got SIGTERM or SIGINT):
	// it takes no new work, lets its steps finish, and exits with
	// WorkerExitDrained once it holds no lease and every report is answered.
	// A second WDrain, or DrainTimeout after the first, stops the steps
	// still running (§10).
	WDrain struct{}
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
func (WDrain) isWorkerInput()        {}
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
	Logs     []LogEntry    // the worker's own log lines, one fact each, with a level
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
	// Secrets to fetch before the process starts, and how to hand them
	// over (SPEC §14a).
	Secrets   []string
	SecretsAs string
}

// WorkerExit tells the worker process to exit.
type WorkerExit struct {
	Code   int
	Reason string
	// CredentialRefused: the orchestrator refused, for good and before any
	// Welcome, the saved credential the worker booted with
	// (WorkerConfig.Credential): that identity is gone, and only a new
	// enrollment (a new token, a new instance id) brings the worker back
	// (SPEC §9).
	CredentialRefused bool
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
	// secrets and secretsAs are the Dispatch's (never mutated).
	secrets   []string
	secretsAs string
	// released: the lease is finished (answered, refused at start, or
	// cancelled by a Welcome). Nothing more is ever emitted for it, it holds no
	// slot and no request, and the record lives only until its process is gone.
	released bool
	// ahead: held ahead, not started (SPEC §3): Held was sent, no Start;
	// it takes no slot until it starts (startAhead).
	ahead bool
	// reportSent: its Report went out once (so its output was all
	// acknowledged): it takes no slot from then on. Every later send of
	// it, after a reconnect too, precedes the Start of a lease started
	// after it (on a link that loses frames, every send of such a Start
	// also follows a send of it: resendReportsBefore), so the orchestrator
	// never sees more started leases than slots (§3).
	reportSent bool
	proc       procState
	cancelled  bool      // a Cancel arrived: the exit is reported as cancelled
	stopped    bool      // the worker stopped it (drain stop): the exit is reported as worker-stopped
	termed     bool      // ExecTerm was emitted
	killAt     time.Time // non-zero while an ExecKill is due at this time
	logSeq     uint64    // Seq of the last log line; lines are numbered from 1
	eventSeq   uint64    // Seq of the last event; events are numbered from 1
	// Unacknowledged output (SPEC §10), oldest first: sent on the current
	// connection, or not yet sent while offline. A LogAck drops the prefix it
	// covers; after a Welcome all of it is sent again (the orchestrator
	// deduplicates by sequence number). lineBytes is lines' size in bytes.
	lines, events []LogLine
	lineBytes     int
	// outDue: while connected with output unacknowledged, when it is all
	// sent again unless an ack made progress (like a request's retransmission).
	outDue time.Time
	// outBytes counts the bytes of output kept (toward OutputCapBytes);
	// capped: the cap was reached and every later line is dropped.
	outBytes int64
	capped   bool
	// Output dropped (over the cap, or beyond the hard bound), reported by
	// one gap marker before the lease's report.
	dropLines, dropBytes, dropEvents int64

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

// Worker is the state machine inside every worker process (SPEC §10; its
// answers are SPEC §3's). It is pure: time arrives with each input, jitter
// comes from WorkerConfig.Seed, and all effects are returned as a WorkerReady.
type Worker struct {
	cfg WorkerConfig
	pcg rand.PCG // jitter source, advanced only when jitter is on

	exited bool // an Exit was emitted: Step does nothing from then on

	// draining: a WDrain arrived (§10); no new work is taken and the worker
	// exits once it holds no lease. drainStopAt is when the running steps are
	// stopped (zero once they were); stopping says they were.
	draining    bool
	stopping    bool
	drainStopAt time.Time

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
	beatAnchor  time.Time     // an instant of the orchestrator's heartbeat grid, from the last Welcome (SPEC §10)
	letGo       int           // leases released since the last Heartbeat or Hello

	nextRequest uint64    // id of the next request; ids start at 1 and only grow
	requests    []request // unanswered requests, sorted by id
	// maxLease is the greatest lease ever dispatched here. Lease ids grow, and
	// one connection is ordered, so a Dispatch at or below it is a duplicate.
	maxLease LeaseID
	// leases holds every held lease (at most Slots + Ahead), plus released ones whose
	// process is still being stopped (each until its exit or its SIGKILL).
	leases map[LeaseID]*execution
	// order holds the same executions by lease id: what every walk over
	// them reads (a slice is walked in a fraction of a map's time, and
	// several walks follow each Step).
	order []*execution

	now time.Time   // of the current Step
	out WorkerReady // accumulated by the current Step
}

// NewWorker returns a worker that has not booted yet.
func NewWorker(cfg WorkerConfig) *Worker {
	cfg = cfg.withDefaults()
	return &Worker{
		cfg:         cfg,
		pcg:         *rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15),
		credential:  cfg.Credential,
		nextRequest: 1,
		leases:      map[LeaseID]*execution{},
	}
}

// Config returns the configuration with defaults filled in.
func (w *Worker) Config() WorkerConfig {
	c := w.cfg
	c.Tags = append([]string(nil), c.Tags...)
	c.Labels = copyMap(c.Labels)
	return c
}

// Credential returns the session credential: the saved one the worker booted
// with (WorkerConfig.Credential), else the one from the enrollment Welcome,
// empty before it. The data plane takes it as a bearer credential; a driver
// that keeps the worker's identity across restarts saves it before acting on
// anything else of the Ready that brought it (SPEC §9).
func (w *Worker) Credential() string { return w.credential }

// Connected reports whether the worker is welcomed on a connection.
func (w *Worker) Connected() bool { return w.phase == phaseReady && !w.exited }

// Exited reports whether the worker emitted an Exit.
func (w *Worker) Exited() bool { return w.exited }

// InFlight returns the leases the worker holds, sorted by lease id: dispatched
// and not yet answered, refused or cancelled by a Welcome.
func (w *Worker) InFlight() []LeaseRef {
	refs := []LeaseRef{}
	for _, e := range w.order {
		if !e.released {
			r := e.ref
			r.Held = e.ahead
			refs = append(refs, r)
		}
	}
	sort.Slice(refs, func(i, j int) bool { return refs[i].Lease < refs[j].Lease })
	return refs
}

// heldCount is len(w.InFlight()), without building it.
func (w *Worker) heldCount() int {
	n := 0
	for _, e := range w.order {
		if !e.released {
			n++
		}
	}
	return n
}

// busySlots counts the leases that take a slot: held, not ahead, and not
// yet reported (SPEC §3 lease-ahead).
func (w *Worker) busySlots() int {
	n := 0
	for _, e := range w.order {
		if !e.released && !e.ahead && !e.reportSent {
			n++
		}
	}
	return n
}

// oldestAhead returns the oldest lease held ahead that may still start
// (neither cancelled nor stopped), or nil.
func (w *Worker) oldestAhead() *execution {
	var o *execution
	for _, e := range w.order {
		if !e.released && e.ahead && !e.cancelled && !e.stopped && (o == nil || e.ref.Lease < o.ref.Lease) {
			o = e
		}
	}
	return o
}

// startAhead starts leases held ahead, oldest first, while a slot is free
// and the worker is connected (a Start is ordered after the Reports that
// freed the slots only on one connection); a draining worker gives them
// back instead (RejectDispatch draining, §4).
func (w *Worker) startAhead() {
	if w.cfg.Ahead == 0 || w.phase != phaseReady || w.exited {
		return
	}
	for {
		e := w.oldestAhead()
		if e == nil {
			return
		}
		if w.draining {
			w.leaseLog(LevelInfo, e.ref, "giving back lease %d held ahead: draining", e.ref.Lease)
			w.send(RejectDispatch{Lease: e.ref.Lease, Reason: "draining"})
			w.release(e)
			continue
		}
		if w.busySlots() >= w.cfg.Slots {
			return
		}
		e.ahead = false
		w.begin(e)
	}
}

// Buffered returns how many events and log lines of held leases wait for
// their LogAck.
func (w *Worker) Buffered() (events, lines int) {
	for _, e := range w.order {
		if !e.released {
			events += len(e.events)
			lines += len(e.lines)
		}
	}
	return events, lines
}

// OutputPaused reports whether the driver must stop reading the output of
// lease l's process (SPEC §10): its unacknowledged lines fill the window.
// The process then blocks on write, as under a slow terminal, until LogAcks
// free the window. A lease that is released, capped or unknown is never
// paused: its output is read and discarded or dropped and counted.
func (w *Worker) OutputPaused(l LeaseID) bool {
	e := w.held(l)
	if e == nil || e.capped {
		return false
	}
	return len(e.lines) >= w.cfg.LogWindowLines || e.lineBytes >= w.cfg.LogWindowBytes
}

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
			w.letGo = 0 // the Hello lists what it holds (SPEC §7a, rule 1)
			w.send(w.hello())
		}
	case WDialFailed:
		if w.phase == phaseDialing {
			w.warnf("dial failed: %s", in.Reason)
			w.connLost(false)
		}
	case WDisconnected:
		if w.phase == phaseHello || w.phase == phaseReady {
			w.warnf("connection lost: %s", in.Reason)
			w.connLost(false)
		}
	case WReceived:
		w.receive(in.Msg)
	case WExecOutput:
		w.output(in.Lease, in.Lines)
	case WExecEvent:
		w.event(in.Lease, in.Text)
	case WExecExited:
		w.procExited(in)
	case WDrain:
		w.drain()
	case WTick:
		w.tick()
	default:
		panic(fmt.Sprintf("core.Worker: unknown input %T", in))
	}
	w.startAhead()
	if w.phase == phaseReady && w.letGo >= heartbeatAfterReleases {
		w.sendHeartbeat()
	}
	if w.draining && !w.exited && len(w.leases) == 0 {
		w.logf("drained: no lease is held; exiting")
		w.exit(WorkerExitDrained, "drained")
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
		c.Secrets, c.SecretsAs = e.secrets, e.secretsAs
	}
	w.out.Exec = append(w.out.Exec, c)
}

// logf logs a routine fact at info; warnf a degraded but self-healing
// condition (a lost connection, an unanswered request, SPEC §10); errorf what
// an operator must look at (a REJECTED answer, SPEC §10).
func (w *Worker) logf(format string, args ...any)   { w.logAt(LevelInfo, format, args...) }
func (w *Worker) warnf(format string, args ...any)  { w.logAt(LevelWarn, format, args...) }
func (w *Worker) errorf(format string, args ...any) { w.logAt(LevelError, format, args...) }

func (w *Worker) logAt(level, format string, args ...any) {
	w.out.Logs = append(w.out.Logs, LogEntry{Level: level, Msg: fmt.Sprintf(format, args...)})
}

// leaseLog logs a line that concerns a lease with the fields "lease",
// "step" and "run" (SPEC §16); the step is looked up when ref does not
// name it and the worker holds the lease.
func (w *Worker) leaseLog(level string, ref LeaseRef, format string, args ...any) {
	if e := w.leases[ref.Lease]; ref.Step == "" && e != nil {
		ref.Step = e.ref.Step
	}
	fields := []Field{{FieldLease, fmt.Sprint(ref.Lease)}}
	if ref.Step != "" {
		fields = append(fields, Field{FieldStep, string(ref.Step)}, Field{FieldRun, string(ref.Step.Run())})
	}
	w.out.Logs = append(w.out.Logs, LogEntry{Level: level, Msg: fmt.Sprintf(format, args...), Fields: fields})
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
		Ahead:    w.cfg.Ahead,
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
	ev, ln := w.Buffered()
	h.Buffered = ev + ln
	h.Draining = w.draining
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
		w.heartbeatAt, w.beatAnchor, w.refreshAt, w.credExpiry = time.Time{}, time.Time{}, time.Time{}, time.Time{}
		// A Refresh belongs to its session: the next Welcome restarts the
		// credential's clock. Start and Report survive and are re-sent.
		w.dropRequests(func(r *request) bool { return r.kind == reqRefresh })
		for i := range w.requests {
			w.requests[i].due, w.requests[i].retries = time.Time{}, 0
		}
		for _, e := range w.order {
			e.outDue = time.Time{}
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
	case LogAck:
		w.logAck(m)
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
	w.beatAnchor = GridAnchor(w.now, m.HeartbeatPhase, w.heartbeat)
	w.heartbeatAt = NextHeartbeat(w.beatAnchor, w.now, w.heartbeat)
	w.credTTL = max(m.CredentialTTL, 0)
	if w.credTTL > 0 {
		w.credExpiry = w.now.Add(w.credTTL)
		w.refreshAt = w.now.Add(w.refreshInterval())
	}
	cancel := append([]LeaseID(nil), m.Cancel...)
	sort.Slice(cancel, func(i, j int) bool { return cancel[i] < cancel[j] })
	for _, l := range cancel {
		if e := w.held(l); e != nil {
			w.leaseLog(LevelWarn, LeaseRef{Lease: l}, "lease %d is no longer current; stopping it", l)
			w.release(e)
		}
	}
	// Output first, requests after: a Report never overtakes its lease's
	// lines (an Answer then proves they were all processed, §10).
	w.replay(wasOffline, offline)
	if w.draining {
		w.send(Drain{}) // the orchestrator may have missed it
	}
	for i := range w.requests {
		if r := &w.requests[i]; !w.waitsForAcks(r) {
			w.transmit(r)
		}
	}
}

func (w *Worker) refreshInterval() time.Duration { return max(w.credTTL/3, minTimerInterval) }

func (w *Worker) refused(m Refused) {
	if m.Fatal && !w.welcomed && w.cfg.Credential != "" {
		// The saved identity is refused (expired, revoked, unknown): say so,
		// and what brings the worker back (SPEC §9).
		w.warnf("saved session credential refused for good: %s; enroll a new instance with a new enrollment token", m.Reason)
		w.exit(WorkerExitRefused, "saved session credential refused: "+m.Reason)
		w.out.Exit.CredentialRefused = true
		return
	}
	if m.Fatal {
		w.errorf("refused by orchestrator for good: %s", m.Reason)
		w.exit(WorkerExitRefused, "refused by orchestrator: "+m.Reason)
		return
	}
	w.warnf("refused by orchestrator: %s", m.Reason)
	w.connLost(true)
}

func (w *Worker) closed(m Close) {
	w.warnf("orchestrator closed the session: %s", m.Reason)
	w.connLost(true)
}

func (w *Worker) dispatch(m Dispatch) {
	if m.Lease <= w.maxLease {
		return // duplicate or stale
	}
	w.maxLease = m.Lease
	if w.draining {
		w.leaseLog(LevelInfo, LeaseRef{Step: m.Step, Lease: m.Lease}, "rejecting lease %d: draining", m.Lease)
		w.send(RejectDispatch{Lease: m.Lease, Reason: "draining"})
		return
	}
	free := w.busySlots() < w.cfg.Slots && w.oldestAhead() == nil
	if held := w.heldCount(); held >= w.cfg.Slots+w.cfg.Ahead {
		ahead := ""
		if w.cfg.Ahead > 0 {
			ahead = fmt.Sprintf(" and %d ahead", w.cfg.Ahead)
		}
		w.leaseLog(LevelInfo, LeaseRef{Step: m.Step, Lease: m.Lease}, "rejecting lease %d: busy (%d of %d slots%s)", m.Lease, held, w.cfg.Slots, ahead)
		w.send(RejectDispatch{Lease: m.Lease, Reason: "busy"})
		return
	}
	e := &execution{
		ref:     LeaseRef{Step: m.Step, Lease: m.Lease},
		command: m.Command,
		env:     copyMap(m.Env),
		secrets: append([]string(nil), m.Secrets...), secretsAs: m.SecretsAs,
		writes:  m.Writes,
		timeout: max(m.Timeout, 0),
	}
	w.addLease(e)
	if !free {
		// No free slot, room ahead: held, and said so at once, which meets
		// the dispatch-ack deadline (§3). It starts when a slot frees.
		e.ahead = true
		w.leaseLog(LevelInfo, e.ref, "holding lease %d ahead: no free slot", m.Lease)
		w.send(Held{Lease: m.Lease})
		return
	}
	w.begin(e)
	if w.cfg.SingleUse && !w.draining {
		// One step, then exit (SPEC §10): the Drain leaves before this
		// lease's Report on the same connection, so the orchestrator
		// dispatches nothing more here. No drain timeout is armed.
		w.draining = true
		w.leaseLog(LevelInfo, e.ref, "single use: lease %d is this worker's only step; it exits once the step is reported", m.Lease)
		w.send(Drain{})
	}
}

// begin starts a lease that takes a slot: a no-write step's process at once
// (it may start before START is recorded), a write-bearing one on
// StartAck{ok} (the start handshake, §4).
func (w *Worker) begin(e *execution) {
	if !e.writes {
		w.startProc(e)
	}
	w.newRequest(reqStart, e.ref, Outcome{})
}

func (w *Worker) startAck(m StartAck) {
	e := w.held(m.Lease)
	if e == nil || !w.dropRequests(func(r *request) bool { return r.kind == reqStart && r.ref.Lease == m.Lease }) {
		return // unknown, finished, cancelled meanwhile, or a duplicate
	}
	if !m.OK {
		w.leaseLog(LevelWarn, e.ref, "start of lease %d refused: %s", m.Lease, m.Reason)
		w.release(e)
		return
	}
	if e.proc == procNone {
		w.startProc(e) // the start handshake is complete: START is durable
	}
}

func (w *Worker) cancel(m Cancel) {
	e := w.held(m.Lease)
	if e == nil || e.cancelled || (e.stopped && e.proc == procNone) {
		return // a stopped lease that never started is already reported
	}
	e.cancelled = true
	w.leaseLog(LevelInfo, LeaseRef{Lease: m.Lease}, "lease %d cancelled by orchestrator: %s", m.Lease, m.Reason)
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
		w.leaseLog(LevelError, e.ref, "report for lease %d rejected: %s", m.Lease, m.Reason)
	default:
		w.leaseLog(LevelError, e.ref, "ignoring answer for lease %d with invalid verdict %d", m.Lease, m.Verdict)
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
	if e := w.find(l); e != nil && !e.released {
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

// heartbeatAfterReleases is how many leases a worker lets go of before it
// sends a Heartbeat early: the orchestrator keeps an entry for each lease
// of an archived run until a Heartbeat shows the worker no longer holds it
// (SPEC §7a, rule 2), so under load the table holds about this many entries
// per worker rather than a heartbeat interval's worth of steps.
const heartbeatAfterReleases = 1024

// sendHeartbeat sends a Heartbeat listing the held leases, and schedules
// the next one at the last instant of the heartbeat grid at most an
// interval from now (SPEC §10).
func (w *Worker) sendHeartbeat() {
	w.heartbeatAt = NextHeartbeat(w.beatAnchor, w.now, w.heartbeat)
	w.letGo = 0
	w.send(Heartbeat{InFlight: w.InFlight()})
}

// release finishes a lease: it frees its slot, forgets its requests and
// buffered output, and stops its process if it still runs.
func (w *Worker) release(e *execution) {
	l := e.ref.Lease
	e.released = true
	w.letGo++
	w.dropRequests(func(r *request) bool { return r.ref.Lease == l && r.kind != reqRefresh })
	e.lines, e.events, e.lineBytes, e.outDue = nil, nil, 0, time.Time{}
	e.dropLines, e.dropBytes, e.dropEvents = 0, 0, 0
	if e.proc == procRunning {
		w.stop(e)
	} else {
		w.dropLease(l)
	}
}

// find returns lease l's execution, or nil: a binary search in order,
// which is as true as the map (check asserts it) and, over a short slice,
// cheaper than a map lookup (check asks for every request's lease after
// every Step).
func (w *Worker) find(l LeaseID) *execution {
	lo, hi := 0, len(w.order)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if w.order[m].ref.Lease < l {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(w.order) && w.order[lo].ref.Lease == l {
		return w.order[lo]
	}
	return nil
}

// addLease files a new execution under its lease.
func (w *Worker) addLease(e *execution) {
	l := e.ref.Lease
	w.leases[l] = e
	i, _ := slices.BinarySearchFunc(w.order, l, func(x *execution, l LeaseID) int { return cmp.Compare(x.ref.Lease, l) })
	w.order = slices.Insert(w.order, i, e)
}

// dropLease forgets lease l's execution.
func (w *Worker) dropLease(l LeaseID) {
	delete(w.leases, l)
	if i, ok := slices.BinarySearchFunc(w.order, l, func(x *execution, l LeaseID) int { return cmp.Compare(x.ref.Lease, l) }); ok {
		w.order = slices.Delete(w.order, i, i+1)
	}
}

// output takes lines of a lease's process output (SPEC §10): each kept line
// gets the next sequence number, joins the lease's unacknowledged lines and,
// when connected, goes out at once (one Logs message per maxReplayBatch
// lines). A line that would take the lease's output past OutputCapBytes, and
// every line after it, is dropped and counted, as is a line beyond the hard
// bound of unacknowledged output (a driver that ignored OutputPaused).
func (w *Worker) output(l LeaseID, texts []string) {
	e := w.held(l)
	if e == nil || e.proc != procRunning {
		return // finished leases and exited processes emit nothing more
	}
	hardLines := logHardBoundFactor * w.cfg.LogWindowLines
	hardBytes := logHardBoundFactor * w.cfg.LogWindowBytes
	first := len(e.lines)
	for _, t := range texts {
		n := LineBytes(t)
		if !e.capped && e.outBytes+int64(n) > w.cfg.OutputCapBytes {
			e.capped = true
		}
		if e.capped || len(e.lines) >= hardLines || e.lineBytes+n > hardBytes {
			e.dropLines++
			e.dropBytes += int64(n)
			continue
		}
		e.logSeq++
		e.outBytes += int64(n)
		e.lineBytes += n
		e.lines = append(e.lines, LogLine{Seq: e.logSeq, At: w.now, Text: t})
	}
	if w.phase == phaseReady && len(e.lines) > first {
		for b := range batches(e.lines[first:]) {
			w.send(Logs{Lease: l, Lines: b})
		}
		w.armOutput(e)
	}
}

// armOutput starts the retransmission clock of a lease's output, if it has
// unacknowledged output and the clock is not running.
func (w *Worker) armOutput(e *execution) {
	if e.outDue.IsZero() && len(e.lines)+len(e.events) > 0 {
		e.outDue = w.now.Add(w.cfg.RequestTimeout)
	}
}

// unacked says whether a lease has output not yet acknowledged. Its Report
// waits until it has none (SPEC §10): an Answer then never finds a line of
// the lease unstored, whatever the link lost.
func (e *execution) unacked() bool { return len(e.lines)+len(e.events) > 0 }

// resendOutput sends a lease's unacknowledged events, then lines, again.
func (w *Worker) resendOutput(e *execution) {
	for b := range batches(e.events) {
		w.send(Events{Lease: e.ref.Lease, Events: b})
	}
	for b := range batches(e.lines) {
		w.send(Logs{Lease: e.ref.Lease, Lines: b})
	}
	e.outDue = time.Time{}
	w.armOutput(e)
}

// LineBytes is what a line of output counts toward the window and the cap:
// its text and its newline.
func LineBytes(text string) int { return len(text) + 1 }

// event takes one protocol event of a lease, like output.
func (w *Worker) event(l LeaseID, text string) {
	e := w.held(l)
	if e == nil || e.proc != procRunning {
		return
	}
	if len(e.events) >= maxUnackedEvents {
		e.dropEvents++
		return
	}
	e.eventSeq++
	ev := LogLine{Seq: e.eventSeq, At: w.now, Text: text}
	e.events = append(e.events, ev)
	if w.phase == phaseReady {
		w.send(Events{Lease: l, Events: []LogLine{ev}})
		w.armOutput(e)
	}
}

// logAck drops the acknowledged prefix of a lease's output. A gap marker
// (sequence 0) goes with the first acknowledged line after it: the
// orchestrator handles a connection's messages in order, so it was processed.
// Progress restarts the retransmission clock; once nothing is left, a Report
// that waited for the acks goes out.
func (w *Worker) logAck(m LogAck) {
	e := w.held(m.Lease)
	if e == nil {
		return // late: the lease is finished and its output gone
	}
	before := len(e.lines) + len(e.events)
	k := 0
	for i, ln := range e.lines {
		if ln.Seq != 0 {
			if ln.Seq > m.Lines {
				break
			}
			k = i + 1
		}
	}
	for _, ln := range e.lines[:k] {
		e.lineBytes -= LineBytes(ln.Text)
	}
	e.lines = append([]LogLine(nil), e.lines[k:]...)
	k = 0
	for k < len(e.events) && e.events[k].Seq <= m.Events {
		k++
	}
	e.events = append([]LogLine(nil), e.events[k:]...)
	if len(e.lines)+len(e.events) == before {
		return
	}
	e.outDue = time.Time{}
	w.armOutput(e)
	if !e.unacked() {
		for i := range w.requests {
			if r := &w.requests[i]; r.kind == reqReport && r.ref.Lease == m.Lease && r.due.IsZero() {
				w.transmit(r)
			}
		}
	}
}

// dropMarker adds, before a lease's report, the one gap marker that counts
// the output it dropped, if any (SPEC §10).
func (w *Worker) dropMarker(e *execution) {
	if e.dropLines == 0 && e.dropEvents == 0 {
		return
	}
	capBytes := w.cfg.OutputCapBytes
	if !e.capped {
		capBytes = 0
	}
	// It takes the next sequence number, so it is acknowledged, re-sent
	// and deduplicated like any line.
	e.logSeq++
	ln := LogLine{Seq: e.logSeq, At: w.now, Text: DropMarker(e.dropLines, e.dropBytes, e.dropEvents, capBytes)}
	e.dropLines, e.dropBytes, e.dropEvents = 0, 0, 0
	e.lines = append(e.lines, ln)
	e.lineBytes += LineBytes(ln.Text)
	if w.phase == phaseReady {
		w.send(Logs{Lease: e.ref.Lease, Lines: []LogLine{ln}})
		w.armOutput(e)
	}
}

func (w *Worker) procExited(x WExecExited) {
	e := w.leases[x.Lease]
	if e == nil || e.proc != procRunning {
		return
	}
	e.proc, e.killAt, e.timeoutAt = procExited, time.Time{}, time.Time{}
	if e.released {
		w.dropLease(x.Lease)
		return
	}
	var o Outcome
	if len(x.Err) > MaxOutcomeMessageBytes {
		// The orchestrator rejects a longer message (§12): cut it on a rune boundary.
		x.Err = strings.ToValidUTF8(x.Err[:MaxOutcomeMessageBytes], "")
	}
	switch {
	case e.cancelled && x.Err != "":
		o = Outcome{Status: OutcomeCleanupFailed, ExitCode: x.ExitCode, Message: x.Err}
	case e.cancelled:
		o = Outcome{Status: OutcomeCancelled, ExitCode: x.ExitCode}
	case e.stopped:
		o = Outcome{Status: OutcomeWorkerStopped, ExitCode: x.ExitCode, Message: "the worker was stopped while draining"}
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
	w.dropMarker(e)
	w.newRequest(reqReport, e.ref, o)
}

// --- drain (§10) ---

// drain handles WDrain: the first starts draining, the next stops the steps.
func (w *Worker) drain() {
	if w.draining && (!w.drainStopAt.IsZero() || w.stopping || !w.cfg.SingleUse) {
		w.logf("second stop request while draining")
		w.stopAll()
		return
	}
	w.draining = true
	w.drainStopAt = w.now.Add(w.cfg.DrainTimeout)
	w.logf("draining: taking no new work; %d lease(s) to finish within %v", w.heldCount(), w.cfg.DrainTimeout)
	if w.phase == phaseReady {
		w.send(Drain{})
	}
}

// stopAll stops every held lease cooperatively (SIGTERM to its group,
// SIGKILL after the kill grace); each is reported worker-stopped. A
// write-bearing step still waiting for its StartAck never started: it is
// reported worker-stopped at once.
func (w *Worker) stopAll() {
	if w.stopping {
		return
	}
	w.stopping, w.drainStopAt = true, time.Time{}
	for _, e := range w.sortedExecutions() {
		if e.released || e.cancelled || e.stopped {
			continue
		}
		switch e.proc {
		case procRunning:
			e.stopped = true
			w.leaseLog(LevelInfo, e.ref, "stopping lease %d: the worker is stopping", e.ref.Lease)
			w.stop(e)
		case procNone:
			e.stopped = true
			w.dropRequests(func(r *request) bool { return r.kind == reqStart && r.ref.Lease == e.ref.Lease })
			w.newRequest(reqReport, e.ref, Outcome{Status: OutcomeWorkerStopped, Message: "the worker was stopped before the step started"})
		}
	}
}

// Draining reports whether the worker got a WDrain.
func (w *Worker) Draining() bool { return w.draining }

// --- requests ---

// newRequest records a request and sends it when connected.
func (w *Worker) newRequest(k reqKind, ref LeaseRef, o Outcome) {
	w.requests = append(w.requests, request{id: w.nextRequest, kind: k, ref: ref, outcome: o})
	w.nextRequest++
	if r := &w.requests[len(w.requests)-1]; w.phase == phaseReady && !w.waitsForAcks(r) {
		w.transmit(r)
	}
}

// waitsForAcks says whether r is a Report whose lease still has output
// unacknowledged: it is sent once the acks are in (SPEC §10).
func (w *Worker) waitsForAcks(r *request) bool {
	if r.kind != reqReport {
		return false
	}
	e := w.held(r.ref.Lease)
	return e != nil && e.unacked()
}

// transmit (re)sends r on the current connection.
func (w *Worker) transmit(r *request) {
	if r.kind == reqStart && w.cfg.Ahead > 0 && w.cfg.LinkLosesFrames {
		w.resendReportsBefore(r)
	}
	r.due = w.now.Add(w.cfg.RequestTimeout)
	if r.kind == reqReport && w.cfg.Ahead > 0 {
		// Only lease-ahead reads it (busySlots): without it a worker's
		// state stays what it was, one state for the explorer.
		if e := w.held(r.ref.Lease); e != nil {
			e.reportSent = true
		}
	}
	w.send(r.msg())
}

// resendReportsBefore re-sends, just before the Start r, each unanswered
// Report older than it that last went out at another instant: on a link
// that loses messages without breaking, that copy may be gone while the
// Start gets through (each request is re-sent on its own timer), and the
// orchestrator would see the lease started in the slot that Report freed
// beside the one it reports (SPEC §10). A Report sent at this instant
// already precedes r on the connection.
func (w *Worker) resendReportsBefore(r *request) {
	now := w.now.Add(w.cfg.RequestTimeout)
	for i := range w.requests {
		q := &w.requests[i]
		if q.id >= r.id {
			return
		}
		if q.kind == reqReport && !q.due.IsZero() && !q.due.Equal(now) {
			q.due = now
			w.send(q.msg())
		}
	}
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
	if !w.drainStopAt.IsZero() && !w.now.Before(w.drainStopAt) {
		w.logf("drain timeout of %v reached", w.cfg.DrainTimeout)
		w.stopAll()
	}
	for _, e := range w.sortedExecutions() {
		if !e.timeoutAt.IsZero() && !w.now.Before(e.timeoutAt) {
			e.timeoutAt = time.Time{}
			if e.proc == procRunning && !e.released {
				e.timedOut = true
				w.leaseLog(LevelInfo, e.ref, "lease %d exceeded its timeout of %v; stopping it", e.ref.Lease, e.timeout)
				w.stop(e)
			}
		}
		if !e.killAt.IsZero() && !w.now.Before(e.killAt) {
			e.killAt = time.Time{}
			w.exec(ExecKill, e)
			if e.released {
				w.dropLease(e.ref.Lease) // nothing is left to report
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
			w.warnf("%s timed out after %v", what, w.cfg.DialTimeout)
			w.connLost(true)
		}
	case phaseReady:
		w.readyTimers()
	}
}

func (w *Worker) readyTimers() {
	if w.credTTL > 0 && !w.now.Before(w.credExpiry) {
		w.warnf("session credential expired; disconnecting")
		w.connLost(true)
		return
	}
	var due []*request
	for i := range w.requests {
		if r := &w.requests[i]; !r.due.IsZero() && !w.now.Before(r.due) {
			due = append(due, r)
		}
	}
	for _, r := range due {
		if r.kind == reqRefresh {
			w.warnf("credential refresh failed: no answer")
		}
	}
	for _, r := range due {
		if r.retries >= w.cfg.RequestRetries {
			w.warnf("request %d unanswered after %d retries; closing connection", r.id, r.retries)
			w.connLost(true)
			return
		}
	}
	for _, r := range due {
		r.retries++
		w.transmit(r)
	}
	for _, e := range w.sortedExecutions() {
		if !e.released && !e.outDue.IsZero() && !w.now.Before(e.outDue) {
			w.leaseLog(LevelWarn, e.ref, "lease %d: no ack for %v; re-sending %d events and %d log lines", e.ref.Lease, w.cfg.RequestTimeout, len(e.events), len(e.lines))
			w.resendOutput(e)
		}
	}
	if !w.now.Before(w.heartbeatAt) {
		w.sendHeartbeat()
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
	for _, e := range w.order {
		at(e.killAt)
		if w.phase == phaseReady {
			at(e.outDue)
		}
		at(e.timeoutAt)
	}
	at(w.drainStopAt)
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

// replay sends, per lease in lease order, every unacknowledged event, then
// every unacknowledged line, with their original stamps and sequence numbers
// (SPEC §10). After an offline period each such lease's output is preceded by
// a gap marker saying how long and how much; it reports no loss (nothing is
// lost while offline: the window pauses the step instead) and is not kept
// for acknowledgement.
func (w *Worker) replay(wasOffline bool, offline time.Duration) {
	secs := max(int64(offline/time.Second), 0)
	var nLeases, nEvents, nLines int
	for _, e := range w.sortedExecutions() {
		if e.released || len(e.lines)+len(e.events) == 0 {
			continue
		}
		l := e.ref.Lease
		if wasOffline {
			marker := LogLine{Seq: 0, At: w.now, Text: GapMarker(secs, len(e.events), len(e.lines))}
			w.send(Logs{Lease: l, Lines: []LogLine{marker}})
		}
		for b := range batches(e.events) {
			w.send(Events{Lease: l, Events: b})
		}
		for b := range batches(e.lines) {
			w.send(Logs{Lease: l, Lines: b})
		}
		w.armOutput(e)
		nLeases++
		nEvents += len(e.events)
		nLines += len(e.lines)
	}
	if nLeases > 0 {
		w.logf("offline for %ds: re-sent %d unacknowledged events and %d log lines of %d lease(s)", secs, nEvents, nLines, nLeases)
	}
}

// GapMarker is the log line that precedes a lease's re-sent output after an
// offline period (SPEC §10).
func GapMarker(offlineSecs int64, events, lines int) string {
	return fmt.Sprintf("--- Orchestrator offline for %ds. Replaying %d buffered events and %d buffered log lines. ---", offlineSecs, events, lines)
}

// DropMarker is the one gap marker that reports, before a lease's report,
// the output it dropped (SPEC §10): lines and bytes (len(text)+1 each) over
// the output cap (capBytes > 0: the cap was reached) or beyond the hard
// bound of unacknowledged output, and events beyond theirs.
func DropMarker(lines, bytes, events, capBytes int64) string {
	why := "beyond the bound of unacknowledged output"
	if capBytes > 0 {
		why = fmt.Sprintf("over the output cap of %d bytes", capBytes)
	}
	s := fmt.Sprintf("--- Output dropped: %d log lines (%d bytes) %s.", lines, bytes, why)
	if events > 0 {
		s += fmt.Sprintf(" %d events dropped.", events)
	}
	return s + " ---"
}

// ParseDropMarker reads the counts back from a DropMarker line: the log
// lines and bytes dropped, and whether over the output cap (else beyond the
// bound of unacknowledged output). ok is false for any other line.
func ParseDropMarker(text string) (lines, bytes int64, overCap, ok bool) {
	rest, found := strings.CutPrefix(text, "--- Output dropped: ")
	if !found || !strings.HasSuffix(text, " ---") {
		return 0, 0, false, false
	}
	if n, err := fmt.Sscanf(rest, "%d log lines (%d bytes)", &lines, &bytes); n != 2 || err != nil {
		return 0, 0, false, false
	}
	return lines, bytes, strings.Contains(rest, ") over the output cap of "), true
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
	c.order = make([]*execution, len(w.order))
	for i, e := range w.order {
		ce := *e
		ce.env = copyMap(e.env)
		ce.lines = append([]LogLine(nil), e.lines...)
		ce.events = append([]LogLine(nil), e.events...)
		c.leases[e.ref.Lease] = &ce
		c.order[i] = &ce
	}
	c.out = WorkerReady{}
	return &c
}

// Fingerprint is FNV-1a 64 over a canonical encoding of the whole state:
// equal states give equal fingerprints whatever the map order or the rings'
// physical layout.
func (w *Worker) Fingerprint() uint64 {
	var e enc
	c := &w.cfg
	e.str(string(c.ID), c.Name, c.Token, c.Credential, c.Platform)
	e.u64(uint64(len(c.Tags)))
	e.str(c.Tags...)
	e.strMap(c.Labels)
	e.bool(c.Scaler, c.NoReconnect, c.SingleUse, c.LinkLosesFrames)
	e.int(c.Slots, c.Ahead, c.LogWindowLines, c.LogWindowBytes, c.RequestRetries)
	e.u64(uint64(c.OutputCapBytes))
	e.u64(c.Seed, math.Float64bits(c.BackoffFactor), math.Float64bits(c.BackoffJitter))
	e.dur(c.BackoffBase, c.BackoffMax, c.RequestTimeout, c.KillGrace, c.DialTimeout)
	pcg, _ := w.pcg.MarshalBinary()
	e.str(string(pcg))

	e.bool(w.exited, w.welcomed, w.draining, w.stopping)
	e.time(w.drainStopAt)
	e.dur(c.DrainTimeout)
	e.u64(uint64(w.phase), uint64(w.conn), uint64(w.attempt), w.nextRequest, uint64(w.maxLease))
	e.time(w.connDeadline, w.dialAt, w.offlineSince, w.credExpiry, w.refreshAt, w.heartbeatAt, w.beatAnchor)
	e.str(w.credential)
	e.dur(w.credTTL, w.heartbeat)
	e.int(w.letGo)

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
		e.u64(uint64(len(x.secrets)))
		e.str(x.secrets...)
		e.str(x.secretsAs)
		e.bool(x.writes, x.released, x.cancelled, x.termed, x.stopped, x.timedOut, x.ahead, x.reportSent)
		e.time(x.killAt, x.timeoutAt)
		e.dur(x.timeout)
		e.int(x.lineBytes)
		e.time(x.outDue)
		e.u64(uint64(x.outBytes), uint64(x.dropLines), uint64(x.dropBytes), uint64(x.dropEvents))
		e.bool(x.capped)
		for _, q := range [][]LogLine{x.lines, x.events} {
			e.u64(uint64(len(q)))
			for _, ln := range q {
				e.u64(ln.Seq)
				e.time(ln.At)
				e.str(ln.Text)
			}
		}
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
	return slices.Clone(w.order) // a copy: a walk over it may drop leases
}

// check asserts cheap invariants after every Step.
func (w *Worker) check() {
	held, busy := 0, 0
	if len(w.order) != len(w.leases) {
		panic(fmt.Sprintf("core.Worker: %d leases filed, %d in order", len(w.leases), len(w.order)))
	}
	for i, e := range w.order {
		l := e.ref.Lease
		if w.leases[l] != e || l > w.maxLease || (i > 0 && w.order[i-1].ref.Lease >= l) {
			panic(fmt.Sprintf("core.Worker: lease %d misfiled", l))
		}
		if !e.released && !e.ahead && !e.reportSent {
			busy++
		}
		if e.released && e.proc != procRunning {
			panic(fmt.Sprintf("core.Worker: released lease %d kept without a process", l))
		}
		if !e.released {
			held++
		}
		n := 0
		for _, ln := range e.lines {
			n += LineBytes(ln.Text)
		}
		if n != e.lineBytes || (e.released && len(e.lines)+len(e.events) > 0) ||
			len(e.lines) > logHardBoundFactor*w.cfg.LogWindowLines+1 || len(e.events) > maxUnackedEvents {
			panic(fmt.Sprintf("core.Worker: lease %d output bookkeeping is off (%d bytes, counted %d; released %v; %d lines, %d events)", l, e.lineBytes, n, e.released, len(e.lines), len(e.events)))
		}
	}
	if held > w.cfg.Slots+w.cfg.Ahead {
		panic(fmt.Sprintf("core.Worker: holds %d leases with %d slots and %d ahead", held, w.cfg.Slots, w.cfg.Ahead))
	}
	if busy > w.cfg.Slots {
		panic(fmt.Sprintf("core.Worker: %d started leases take a slot, with %d slots", busy, w.cfg.Slots))
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
		if (w.phase == phaseReady && !w.waitsForAcks(r)) == r.due.IsZero() {
			panic(fmt.Sprintf("core.Worker: request %d transmission state disagrees with the connection", r.id))
		}
	}
	if (w.phase == phaseReady && !w.welcomed) || (w.phase < phaseHello && w.conn != 0) {
		panic(fmt.Sprintf("core.Worker: connection state is off (phase %d)", w.phase))
	}
}
