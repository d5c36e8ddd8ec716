package core

import "time"

// Config holds the orchestrator's knobs. Zero fields take the defaults of
// SPEC §12 (see DefaultConfig).
type Config struct {
	HeartbeatInterval time.Duration // told to workers; default 30s
	HeartbeatTimeout  time.Duration // silent longer → stale; default 120s
	SweepInterval     time.Duration // recovery sweeper period; default 60s
	UnmatchedTimeout  time.Duration // queued longer with no matching worker → failed; default 30s
	DispatchAck       time.Duration // a dispatch not started or rejected by then is requeued; default 10s
	ForceCancel       time.Duration // cancelling longer → cancelled (CANCEL_FORCE); default 30s
	KillGrace         time.Duration // worker's SIGTERM→SIGKILL; must be < ForceCancel; default 10s
	CredentialTTL     time.Duration // session credential validity, slid by each refresh; default 15m
	MaxAttempts       int           // lease grants per step; default 5
	// Retention is how long a worker that can never come back, and an
	// enrollment token that can never be used again, are kept (SPEC §7a);
	// default 720h (30 days). The store prunes history by the same figure.
	Retention time.Duration
	// NoStateCache is for a driver that never calls Fingerprint or Clone,
	// as the real one does not: the records a batch writes are then not
	// also kept in the core (a second copy of the live state's bytes, and a
	// map write per record). Decisions do not depend on it; the simulator
	// and the explorer, which fingerprint and clone, leave it false.
	NoStateCache bool
	// Env is the orchestrator's environment snapshot shipped with every
	// dispatch, minus the denylist (the driver fills it; the core filters).
	Env map[string]string
}

// DefaultConfig returns the defaults of SPEC §12.
func DefaultConfig() Config {
	return Config{
		HeartbeatInterval: 30 * time.Second,
		HeartbeatTimeout:  120 * time.Second,
		SweepInterval:     60 * time.Second,
		UnmatchedTimeout:  30 * time.Second,
		DispatchAck:       10 * time.Second,
		ForceCancel:       30 * time.Second,
		KillGrace:         10 * time.Second,
		CredentialTTL:     15 * time.Minute,
		MaxAttempts:       5,
		Retention:         720 * time.Hour,
	}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	set := func(v *time.Duration, def time.Duration) {
		if *v <= 0 {
			*v = def
		}
	}
	set(&c.HeartbeatInterval, d.HeartbeatInterval)
	set(&c.HeartbeatTimeout, d.HeartbeatTimeout)
	set(&c.SweepInterval, d.SweepInterval)
	set(&c.UnmatchedTimeout, d.UnmatchedTimeout)
	set(&c.DispatchAck, d.DispatchAck)
	set(&c.ForceCancel, d.ForceCancel)
	set(&c.KillGrace, d.KillGrace)
	set(&c.CredentialTTL, d.CredentialTTL)
	set(&c.Retention, d.Retention)
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = d.MaxAttempts
	}
	if c.KillGrace >= c.ForceCancel {
		c.ForceCancel = c.KillGrace + d.ForceCancel - d.KillGrace
	}
	return c
}

// Input is one thing that happened, handed to Orchestrator.Step with the
// orchestrator's clock reading.
type Input interface{ isInput() }

// CallID names an operator API call; its answer carries the same id.
type CallID uint64

// Inputs.
type (
	// Tick says only that time passed; due timers fire.
	Tick struct{}
	// Received is a message that arrived on a control connection. Entropy is
	// 16 fresh random bytes from the driver, used only when a credential is
	// issued (the core has no randomness of its own).
	Received struct {
		Conn    ConnID
		Msg     Msg
		Entropy [16]byte
	}
	// Disconnected says a control connection dropped.
	Disconnected struct{ Conn ConnID }
	// Submit submits a run.
	// The operator calls carry Actor, the operator token's name, which
	// their audit entry records (SPEC §15a); empty is ActorLocal.
	Submit struct {
		Call   CallID
		Actor  string
		Spec   RunSpec
		Parent RunID
		// RerunOf names the run this one reruns (`run rerun`, SPEC §2);
		// Reuse lists the steps created already succeeded (REUSE, §1).
		RerunOf RunID
		Reuse   []ReusedStep
	}
	// CancelRun cancels every non-terminal step of a run.
	CancelRun struct {
		Call   CallID
		Actor  string
		Run    RunID
		Reason string
	}
	// Approve opens a held step's gate; RejectGate closes it (cancelled).
	Approve struct {
		Call  CallID
		Actor string
		Step  StepID
	}
	RejectGate struct {
		Call  CallID
		Actor string
		Step  StepID
	}
	// CreateToken creates a named, time-boxed enrollment token whose secret
	// the driver drew at random.
	CreateToken struct {
		Call   CallID
		Actor  string
		Name   string
		TTL    time.Duration
		Secret [16]byte
		// IntoSecret stores the token ("Name.<hex secret>") as that secret
		// instead of answering it (SPEC §9, §14a): the token and the
		// secret's record change in one batch, audited token.create and
		// secret.put, and the driver writes the sealed value with it. The
		// answer's Token is then empty.
		IntoSecret string
		// Credential and Lease, when a step mints the token (POST /token,
		// SPEC §14a): admitted only as a write of IntoSecret under that
		// lease is (CheckSecret), the step the actor of both entries.
		Credential string
		Lease      LeaseID
	}
	// RevokeToken revokes a token; its worker, if any, is disconnected and
	// loses every lease.
	RevokeToken struct {
		Call  CallID
		Actor string
		Name  string
	}
)

func (Tick) isInput()         {}
func (Received) isInput()     {}
func (Disconnected) isInput() {}
func (Submit) isInput()       {}
func (CancelRun) isInput()    {}
func (Approve) isInput()      {}
func (RejectGate) isInput()   {}
func (CreateToken) isInput()  {}
func (RevokeToken) isInput()  {}

// Ready is everything one Step produced. The driver handles it in this order:
//
//  1. Records are saved to stable storage (one transaction, synced), with
//     the data writes that Writes admitted, BEFORE any Message is sent or
//     any Answer returned;
//  2. then Messages are sent, in order, each on its connection; a Close or
//     Refused message is followed by closing that connection;
//  3. then Answers are returned to their callers, and Writes to the
//     data-plane requests that asked;
//  4. Events and Logs are informational (Events are also in Records);
//  5. the driver calls Step with a Tick no later than Deadline (zero: none).
type Ready struct {
	// Records are upserts and deletes of keyed entity snapshots, sorted by
	// key. They must be durable before any Message or Answer leaves. A run
	// archived in this batch (SPEC §7a) appears as the deletes of its live
	// records and one history record (KindHistory) in the same batch: the
	// store applies them atomically, so a run is always either live or
	// history. The store keeps log records ("log/…") of archived leases:
	// the history record lists the leases whose lines they are.
	Records []Record
	// Messages to workers, in the order they must be sent.
	Messages []Envelope
	// Answers to operator API calls.
	Answers []APIAnswer
	// Events are the server events recorded on runs in this batch.
	Events []ServerEvent
	// Logs are the orchestrator's structured log lines.
	Logs []LogEntry
	// Transitions lists every step transition of the batch, in order; every
	// one is a row of the table (checkers verify it independently).
	Transitions []StepTransition
	// Writes answers the batch's DataWrite: the driver stores the write, in
	// the same durable group as Records, only if it is admitted (SPEC §14).
	Writes []DataAnswer
	// Audit lists the batch's audit entries (also in Records, SPEC §15a).
	Audit []AuditEntry
	// Deadline is the earliest time a timer is due; zero means none.
	Deadline time.Time
}

// StepTransition is one applied row of the transition table.
type StepTransition struct {
	Step  StepID
	From  State
	Event Event
	To    State
}

// Envelope addresses a message to a control connection.
type Envelope struct {
	Conn ConnID
	Msg  Msg
}

// APIAnswer answers an operator call. Err is empty on success.
type APIAnswer struct {
	Call  CallID
	Err   string
	Code  string // with Err: CodeInvalid, CodeNotFound or CodeConflict
	Run   RunID  // Submit
	Token string // CreateToken, CreateOperator: "<name>.<secret hex>", shown once
}

// ServerEvent is a recovery or lifecycle event recorded on a run.
type ServerEvent struct {
	Run     RunID
	Seq     int
	At      time.Time
	Step    StepID
	Kind    string
	Message string
	// Cause, Worker and Lease say, typed, what set a step event off and
	// the lease it concerns (see Cause); empty where the event has none.
	Cause  Cause    `json:",omitempty"`
	Worker WorkerID `json:",omitempty"`
	Lease  LeaseID  `json:",omitempty"`
}

// LogEntry is one structured log line of either machine (Ready.Logs,
// WorkerReady.Logs). Level is one of the Level* constants; drivers log the
// line at that level. Fields are in a fixed order; a line about a worker, a
// lease, a step or a run has the Field* keys that name them (SPEC §16).
type LogEntry struct {
	Level  string
	Msg    string
	Fields []Field
}

// Log levels of a LogEntry. Error is for what an operator must look at (a
// REJECTED answer, SPEC §10), warn for a degraded but self-healing condition
// (a lost connection, an unanswered refresh), info for routine facts.
const (
	LevelInfo  = "info"
	LevelWarn  = "warn"
	LevelError = "error"
)

// Field is one key=value of a LogEntry.
type Field struct{ Key, Value string }

// The keys of the fields that name what a log line concerns (SPEC §16);
// both binaries' drivers log with the same keys.
const (
	FieldWorker = "worker_id"
	FieldLease  = "lease" // a number
	FieldStep   = "step"
	FieldRun    = "run"
)
