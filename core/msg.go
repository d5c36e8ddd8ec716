package core

import (
	"strings"
	"time"
)

// ProtocolVersion is the version a worker declares in its Hello (SPEC §9).
// Version 2 adds LogAck; the orchestrator still accepts MinProtocolVersion
// for one release and never sends a connection a message its version lacks.
// A Hello outside MinProtocolVersion..ProtocolVersion is refused.
const (
	ProtocolVersion    = 2
	MinProtocolVersion = 1
)

// ConnID names one control connection. The driver assigns it; a reconnect is a
// new ConnID. Zero means "no connection".
type ConnID uint64

// LeaseID is a fencing token: every grant gets a strictly greater one.
type LeaseID uint64

// StepID names a step: "<run>/<step name>", with "[i]" appended for the i-th
// instance of a forEach step.
type StepID string

// Run returns the run a step belongs to: step ids are "<run>/<name>"
// (SPEC §2), and run ids hold no "/".
func (s StepID) Run() RunID {
	run, _, _ := strings.Cut(string(s), "/")
	return RunID(run)
}

// RunID names a run: "run-<n>".
type RunID string

// WorkerID is a worker instance's UUID, fixed for its process lifetime.
type WorkerID string

// LeaseRef names one lease a worker holds.
type LeaseRef struct {
	Step  StepID
	Lease LeaseID
	// Held marks, in a Hello's or a Heartbeat's list, a lease the worker
	// holds ahead, not started (SPEC §3 lease-ahead).
	Held bool
}

// Msg is a control-plane message between a worker and the orchestrator.
type Msg interface{ Kind() string }

// Messages from a worker to the orchestrator.
type (
	// Hello opens every connection. The first connection of an instance
	// carries Token (enrollment); later ones carry Credential and InFlight.
	Hello struct {
		Version    int
		Token      string // "<name>.<secret hex>" on enrollment
		Credential string // session credential on reconnect
		Worker     WorkerID
		Name       string
		Tags       []string
		Labels     map[string]string
		Platform   string
		Slots      int
		// Ahead is how many leases beyond its slots the worker holds
		// granted but not started (SPEC §3 lease-ahead): 0..MaxWorkerAhead,
		// whatever its slots.
		Ahead    int
		Scaler   bool          // scaler-managed: single use, no grace
		MaxDelay time.Duration // the worker's max reconnect delay; grace = 2×; at most MaxReconnectDelay
		InFlight []LeaseRef
		// Buffered counts the log lines and events the worker buffered
		// while offline and replays after the Welcome (observability only).
		Buffered int
		// Draining says the worker process is draining (§10). A reconnect
		// Hello sets the worker's draining mark to it: a process restarted
		// with its saved identity (§9) is not draining.
		Draining bool
	}
	// Heartbeat lists the leases the worker holds.
	Heartbeat struct{ InFlight []LeaseRef }
	// Start accepts a dispatch. For a no-write step the process has already
	// started; for a write-bearing step it asks permission (the start handshake)
	// and the process starts only on a StartAck with OK.
	Start struct {
		Lease   LeaseID
		Request uint64
	}
	// RejectDispatch refuses a dispatch (busy, incompatible); the step is
	// requeued as never started.
	RejectDispatch struct {
		Lease  LeaseID
		Reason string
	}
	// Report is complete|fail(step, lease, outcome, request id).
	Report struct {
		Step    StepID
		Lease   LeaseID
		Request uint64
		Outcome Outcome
	}
	// Logs carries log lines of one lease, each with the worker's sequence
	// number and timestamp.
	Logs struct {
		Lease LeaseID
		Lines []LogLine
	}
	// Events carries protocol events of one lease (buffered while offline).
	Events struct {
		Lease  LeaseID
		Events []LogLine
	}
	// Refresh asks for the session credential's validity to slide forward.
	Refresh struct{ Request uint64 }
	// Held answers a dispatch the worker holds ahead (no free slot, room
	// ahead: SPEC §3): it meets the dispatch-ack deadline; the worker starts
	// it when a slot frees.
	Held struct{ Lease LeaseID }
	// Drain says the worker is draining (§4, §10): it takes no new work and
	// exits once its leases are finished. The orchestrator dispatches nothing
	// more to it. A draining worker sends it again after every Welcome.
	Drain struct{}
)

// Messages from the orchestrator to a worker.
type (
	// Welcome accepts a Hello. Credential is set only on enrollment.
	Welcome struct {
		Worker        WorkerID
		Credential    string
		CredentialTTL time.Duration
		Heartbeat     time.Duration
		// HeartbeatPhase is how long after this Welcome leaves the
		// orchestrator's clock next crosses its heartbeat grid (a multiple of
		// HeartbeatGrid(Heartbeat)); the worker sends its heartbeats on that
		// grid, so that a fleet's arrive together (SPEC §10).
		HeartbeatPhase time.Duration
		// Cancel lists reported leases that are no longer current.
		Cancel []LeaseID
	}
	// Refused refuses a Hello; the driver closes the connection after sending.
	Refused struct {
		Reason string
		Fatal  bool  // the worker must not retry (bad token, revoked, expired)
		Cause  Cause // not on the wire: what the reason says, typed for checkers
	}
	// Dispatch grants a lease.
	Dispatch struct {
		Lease   LeaseID
		Step    StepID
		Run     RunID
		Command string
		Env     map[string]string
		Writes  bool
		Timeout time.Duration
		Attempt int
		// Secrets the worker fetches before it starts the process, and how
		// it hands them over (SPEC §14a).
		Secrets   []string
		SecretsAs string
	}
	// StartAck answers Start: OK means START is durably recorded.
	StartAck struct {
		Lease   LeaseID
		Request uint64
		OK      bool
		Reason  string
	}
	// Cancel tells the worker to stop a lease's execution.
	Cancel struct {
		Lease  LeaseID
		Reason string
	}
	// Answer answers a Report: exactly one of COMMITTED, CANCELLED, REJECTED.
	Answer struct {
		Lease   LeaseID
		Request uint64
		Verdict Verdict
		Reason  string
	}
	// LogAck acknowledges a lease's log lines and events once stored
	// (protocol version 2, SPEC §3): Lines and Events are the highest
	// sequence numbers up to which every line (event) of the lease is stored,
	// or discarded because the lease lost authority. It is a message of the
	// batch that stored them, so it leaves only once they are durable.
	LogAck struct {
		Lease  LeaseID
		Lines  uint64
		Events uint64
	}
	// Refreshed answers Refresh with the credential's new validity.
	Refreshed struct {
		Request uint64
		TTL     time.Duration
	}
	// Close ends the session (token revoked, credential expired, superseded,
	// a protocol error). The driver closes the connection after sending it,
	// with the close code its Code names (SPEC §9).
	Close struct {
		Reason string
		Code   CloseCode // not on the wire: the transport's close code says it
		Cause  Cause     // not on the wire: what the reason says, typed for checkers
	}
)

// CloseCode says why the orchestrator ends a session, for the transport's
// close code (SPEC §9): the driver maps CloseEnded to 1000 (normal),
// CloseProtocolError to 1002 and ClosePolicy to 1008.
type CloseCode uint8

const (
	CloseEnded         CloseCode = iota // the session is over: superseded by a new connection
	CloseProtocolError                  // the worker broke the protocol (message before Hello, a second Hello, a limit of a message)
	ClosePolicy                         // the worker may no longer connect this way: token revoked, credential expired
)

func (c CloseCode) String() string {
	switch c {
	case CloseProtocolError:
		return "protocol-error"
	case ClosePolicy:
		return "policy"
	}
	return "ended"
}

func (Hello) Kind() string          { return "hello" }
func (Heartbeat) Kind() string      { return "heartbeat" }
func (Start) Kind() string          { return "start" }
func (RejectDispatch) Kind() string { return "reject" }
func (Report) Kind() string         { return "report" }
func (Logs) Kind() string           { return "logs" }
func (Events) Kind() string         { return "events" }
func (Refresh) Kind() string        { return "refresh" }
func (Drain) Kind() string          { return "drain" }
func (Held) Kind() string           { return "held" }
func (Welcome) Kind() string        { return "welcome" }
func (Refused) Kind() string        { return "refused" }
func (Dispatch) Kind() string       { return "dispatch" }
func (StartAck) Kind() string       { return "start-ack" }
func (Cancel) Kind() string         { return "cancel" }
func (Answer) Kind() string         { return "answer" }
func (LogAck) Kind() string         { return "log-ack" }
func (Refreshed) Kind() string      { return "refreshed" }
func (Close) Kind() string          { return "close" }

// Verdict is the orchestrator's answer to a report.
type Verdict uint8

const (
	VerdictNone Verdict = iota
	Committed
	Cancelled
	Rejected
)

func (v Verdict) String() string {
	switch v {
	case Committed:
		return "COMMITTED"
	case Cancelled:
		return "CANCELLED"
	case Rejected:
		return "REJECTED"
	}
	return "NONE"
}

// OutcomeStatus is what a worker says happened to an execution.
type OutcomeStatus uint8

const (
	OutcomeSuccess       OutcomeStatus = iota + 1 // exit code 0
	OutcomeFailure                                // non-zero exit or failed to start
	OutcomeCancelled                              // stopped after a Cancel
	OutcomeCleanupFailed                          // stopped after a Cancel, cleanup failed
	OutcomeWorkerStopped                          // stopped because the worker itself was stopped (§4)
	OutcomeTimedOut                               // stopped by the worker at the dispatched timeout (§10)
)

func (o OutcomeStatus) String() string {
	switch o {
	case OutcomeSuccess:
		return "ok"
	case OutcomeFailure:
		return "fail"
	case OutcomeCancelled:
		return "cancelled"
	case OutcomeCleanupFailed:
		return "cleanup-failed"
	case OutcomeWorkerStopped:
		return "worker-stopped"
	case OutcomeTimedOut:
		return "timed-out"
	}
	return "invalid"
}

// Outcome is the result a worker reports for a lease.
type Outcome struct {
	Status   OutcomeStatus
	ExitCode int
	Message  string
}

// LogLine is one line of step output or one protocol event, stamped by the
// worker's clock (the orchestrator stores it as given).
type LogLine struct {
	Seq  uint64
	At   time.Time
	Text string
}

// Limits on what one worker message may carry (SPEC §12). Each bounds what
// the orchestrator stores and iterates for one worker, so one worker's input
// costs the loop a bounded amount. A Hello beyond one is refused (fatal: the
// same Hello would be refused again); any other message beyond one closes
// the connection with a protocol error, except a report, which is REJECTED
// as malformed (§3). Names (worker name, tags, label keys and values,
// platform) are checked by CheckName: 1..MaxNameLength bytes, printable.
const (
	MaxWorkerSlots         = 1024                            // a Hello declares 1..MaxWorkerSlots slots
	MaxWorkerTags          = 64                              // tags in a Hello
	MaxWorkerLabels        = 64                              // labels in a Hello
	MaxWorkerAhead         = 64                              // a Hello declares 0..MaxWorkerAhead leases ahead, whatever its slots
	MaxInFlightLeases      = MaxWorkerSlots + MaxWorkerAhead // leases a Hello or a Heartbeat lists (a worker holds at most slots + ahead)
	MaxCredentialBytes     = 256                             // a Hello's enrollment token or session credential
	MaxBufferedItems       = 1 << 30                         // a Hello's count of buffered lines and events (observability only)
	MaxRejectReasonBytes   = 1024                            // a RejectDispatch's reason (it is stored in the step's events)
	MaxOutcomeMessageBytes = 4096                            // a Report's outcome message (stored with the lease's answers)
)

// MaxReconnectDelay is the longest reconnect delay a Hello may declare; a
// worker's grace window is twice its declared delay, so at most 2 h.
const MaxReconnectDelay = time.Hour
