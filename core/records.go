package core

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Record is one keyed entity snapshot: an upsert (Value set) or a delete. A
// batch of records is applied atomically by the driver; restart loads them all.
type Record struct {
	Key    string // "<kind>/<id>", see the *Key functions
	Value  []byte // canonical JSON of the entity; nil with Delete
	Delete bool
}

// Record kinds (the key prefix).
const (
	KindMeta   = "meta"
	KindRun    = "run"
	KindStep   = "step"
	KindLease  = "lease"
	KindWorker = "worker"
	KindToken  = "token"
	KindEvent  = "event"
	KindLog    = "log"
)

// ErrBadRecord is returned by Restore when a record cannot be decoded.
var ErrBadRecord = errors.New("bad record")

// MetaRecord holds the counters.
type MetaRecord struct {
	RunSeq    uint64
	LeaseSeq  uint64
	NextSweep time.Time
	// RestoredAt is when the orchestrator last restarted (Restore): the
	// closed-lease table's time bound runs from it (SPEC §7a).
	RestoredAt time.Time `json:",omitzero"`
	// AuditSeq numbers the audit entries (SPEC §15a).
	AuditSeq uint64 `json:",omitempty"`
}

// RunRecord is a run.
type RunRecord struct {
	ID     RunID
	Spec   RunSpec
	Parent RunID `json:",omitempty"`
	// ParentStep is the parent's workflow step that started this run
	// (empty for a run submitted with a parent through the API); Depth is
	// how many runs are above it (SPEC §2).
	ParentStep StepID `json:",omitempty"`
	Depth      int    `json:",omitzero"`
	// Children are the runs submitted below it through the API, in submit
	// order (a workflow step's child is its StepRecord.Child).
	Children []RunID `json:",omitempty"`
	// Schedule and FireAt: the schedule that started the run and the fire
	// time it stands for; GroupWait: the run waits for room in its
	// concurrency group, its steps pending (SPEC §8a).
	Schedule     string    `json:",omitzero"`
	FireAt       time.Time `json:",omitzero"`
	GroupWait    bool      `json:",omitzero"`
	SubmittedAt  time.Time
	Deadline     time.Time `json:",omitzero"` // run timeout instant
	CancelReason string    `json:",omitempty"`
	CancelClass  FailureClass
	Steps        []StepID
	Failed       bool      // some step failed: the run can no longer succeed
	Finished     bool      // every step is terminal
	FinishedAt   time.Time `json:",omitzero"`
	// RerunOf names the run this one reruns (SPEC §2, `run rerun`).
	RerunOf RunID `json:",omitempty"`
}

// StepRecord is a step (one forEach instance is one step).
type StepRecord struct {
	ID           StepID
	Run          RunID
	Name         string // the spec name (without "[i]")
	Index        int    // forEach instance index, -1 if not fanned out
	Item         string `json:",omitempty"`
	Deps         []StepID
	State        State
	Class        FailureClass `json:",omitempty"`
	Message      string       `json:",omitempty"`
	SkippedBy    StepID       `json:",omitempty"`
	Attempts     int          // lease grants so far
	Lease        LeaseID      // current lease, 0 when none
	QueuedAt     time.Time    `json:",omitzero"`
	StartedAt    time.Time    `json:",omitzero"`
	WaitUntil    time.Time    `json:",omitzero"` // waiting gate
	HoldUntil    time.Time    `json:",omitzero"` // held gate expiry
	ForceAt      time.Time    `json:",omitzero"` // cancelling force deadline
	TimeoutAt    time.Time    `json:",omitzero"` // timeout deadline a restore re-armed, if later than START + timeout (SPEC §7)
	Outcome      *Outcome     `json:",omitempty"`
	FinishedAt   time.Time    `json:",omitzero"`
	EverStarted  bool         // some lease of this step's current try recorded START (§1 RETRY)
	RejectedBy   WorkerID     `json:",omitempty"` // last worker that rejected a dispatch of it
	RequiredTags []string     `json:",omitempty"`
	// MissedBy lists, sorted, the workers that let a dispatch of this step
	// pass its dispatch-ack deadline and have not been heard from since:
	// none of them is chosen for it (§8).
	MissedBy []WorkerID `json:",omitempty"`
	// Tries counts the retries taken (SPEC §1 RETRY): the step is on try
	// Tries+1. Attempts counts the grants of the current try only.
	Tries int `json:",omitempty"`
	// ReusedFrom names the step of the rerun run whose success this step
	// took over (REUSE, SPEC §1, §2): it never ran in this run.
	ReusedFrom StepID `json:",omitempty"`
	// Child is the run a workflow step started (SPEC §2).
	Child RunID `json:",omitempty"`
}

// LeaseRecord is one dispatch attempt of one step to one worker.
type LeaseRecord struct {
	ID        LeaseID
	Step      StepID
	Worker    WorkerID
	GrantedAt time.Time
	Current   bool
	Started   bool // START recorded under this lease
	// Held: the worker said Held (or listed it held in a Hello): it holds
	// the lease ahead, not started (SPEC §3 lease-ahead). Deadline is then
	// when the worker turns silent (§8), no dispatch-ack deadline.
	Held      bool      `json:",omitempty"`
	Deadline  time.Time `json:",omitzero"` // ack deadline (not started), silence (held) or recovery deadline (recovering)
	EndReason string    `json:",omitempty"`
	Committed bool
	// LogClosed: the lease's log takes no more lines though it committed
	// (SPEC §3): set at a commit by a version 2 connection, whose worker
	// reports only once its output is acknowledged. A version 1 worker may
	// send buffered output after its report, so its log stays open.
	LogClosed bool             `json:",omitempty"`
	Answers   []AnsweredReport `json:",omitempty"`
}

// LogOpen reports whether the lease's log still takes lines: while it is
// current, or committed by a version 1 worker (SPEC §3). A closed log never
// opens again (authority never comes back, a commit is final), so its
// length is final.
func (l *LeaseRecord) LogOpen() bool { return (l.Current || l.Committed) && !l.LogClosed }

// AnsweredReport remembers an answered report for idempotent replays.
type AnsweredReport struct {
	Request uint64
	Outcome Outcome
	Verdict Verdict
	Reason  string `json:",omitempty"`
}

// WorkerRecord is an enrolled worker instance.
type WorkerRecord struct {
	ID             WorkerID
	Name           string
	Token          string
	Tags           []string          `json:",omitempty"`
	Labels         map[string]string `json:",omitempty"`
	Platform       string            `json:",omitempty"`
	Slots          int
	Ahead          int `json:",omitempty"` // leases held ahead beyond the slots (SPEC §3)
	Scaler         bool
	Grace          time.Duration
	Active         bool
	Revoked        bool
	CredHash       [32]byte
	CredExpiry     time.Time
	LastHeartbeat  time.Time // the heartbeat clock when this record was last written: its last Hello at least (§8)
	DisconnectedAt time.Time `json:",omitzero"` // zero while connected
	GraceUntil     time.Time `json:",omitzero"`
	EnrolledAt     time.Time
	// Draining: the worker process said Drain (§4). Dispatch skips it until
	// a reconnect Hello says otherwise: a drained process exits, and a
	// process restarted with the saved identity (§9) is not draining.
	Draining bool `json:",omitempty"`
	// clock is the heartbeat clock (§8): the last Hello or heartbeat, or a
	// later message that ended a silence. It is kept in memory only: a
	// heartbeat writes no record, and the clock reaches LastHeartbeat when
	// the record is written for another change (recordFor). A restore
	// restarts it at now (§7).
	clock time.Time
}

// TokenRecord is an enrollment token; only the secret's hash is kept.
type TokenRecord struct {
	Name      string
	Hash      [32]byte
	CreatedAt time.Time
	ExpiresAt time.Time
	Consumed  bool
	Worker    WorkerID `json:",omitempty"`
	Revoked   bool
}

// StepLogLine is one stored line of a step's log (or one event when Event).
type StepLogLine struct {
	Step  StepID
	Lease LeaseID
	Index int // arrival order within the lease
	Event bool
	Line  LogLine
}

// Key functions.
func metaKey() string          { return KindMeta }
func runKey(id RunID) string   { return KindRun + "/" + string(id) }
func stepKey(id StepID) string { return KindStep + "/" + string(id) }
func leaseKey(id LeaseID) string {
	return string(appendPadded(append(make([]byte, 0, len(KindLease)+21), KindLease+"/"...), uint64(id), 20))
}
func workerKey(id WorkerID) string { return KindWorker + "/" + string(id) }
func tokenKey(name string) string  { return KindToken + "/" + name }
func eventKey(r RunID, seq int) string {
	b := make([]byte, 0, len(KindEvent)+len(r)+10)
	b = append(append(append(append(b, KindEvent...), '/'), r...), '/')
	return string(appendPaddedInt(b, seq, 8))
}
func logKey(l LeaseID, idx int) string {
	b := make([]byte, 0, len(KindLog)+33)
	b = appendPadded(append(append(b, KindLog...), '/'), uint64(l), 20)
	return string(appendPaddedInt(append(b, '/'), idx, 10))
}

// appendPadded appends u as fmt's %0<width>d renders it: its decimal
// digits, zeros in front to make width. Keys are formatted on every step;
// fmt.Sprintf was a measurable share of the simulator's time.
func appendPadded(b []byte, u uint64, width int) []byte {
	var d [20]byte
	i := len(d)
	for u >= 10 {
		i--
		d[i] = byte('0' + u%10)
		u /= 10
	}
	i--
	d[i] = byte('0' + u)
	for n := len(d) - i; n < width; n++ {
		b = append(b, '0')
	}
	return append(b, d[i:]...)
}

// appendPaddedInt is appendPadded for an int; a negative one (never a
// key's) as fmt renders it.
func appendPaddedInt(b []byte, n, width int) []byte {
	if n < 0 {
		return fmt.Appendf(b, "%0*d", width, n)
	}
	return appendPadded(b, uint64(n), width)
}

// DecodeRecord decodes a record's value by its key's kind. It is what
// Restore uses, exported for tools and fuzzing.
func DecodeRecord(r Record) (any, error) {
	kind := r.Key
	if i := strings.IndexByte(kind, '/'); i >= 0 {
		kind = kind[:i]
	}
	var v any
	switch kind {
	case KindMeta:
		v = &MetaRecord{}
	case KindRun:
		rr := &RunRecord{}
		if err := decodeRun(r.Value, rr); err != nil {
			return nil, fmt.Errorf("%w: key %q: %v", ErrBadRecord, r.Key, err)
		}
		return rr, nil
	case KindStep:
		st := &StepRecord{}
		if err := decodeStep(r.Value, st); err != nil {
			return nil, fmt.Errorf("%w: key %q: %v", ErrBadRecord, r.Key, err)
		}
		return st, nil
	case KindLease:
		l := &LeaseRecord{}
		if err := decodeLease(r.Value, l); err != nil {
			return nil, fmt.Errorf("%w: key %q: %v", ErrBadRecord, r.Key, err)
		}
		return l, nil
	case KindWorker:
		wr := &WorkerRecord{}
		if err := decodeWorker(r.Value, wr); err != nil {
			return nil, fmt.Errorf("%w: key %q: %v", ErrBadRecord, r.Key, err)
		}
		return wr, nil
	case KindToken:
		tr := &TokenRecord{}
		if err := decodeToken(r.Value, tr); err != nil {
			return nil, fmt.Errorf("%w: key %q: %v", ErrBadRecord, r.Key, err)
		}
		return tr, nil
	case KindEvent:
		ev := &ServerEvent{}
		if err := decodeEvent(r.Value, ev); err != nil {
			return nil, fmt.Errorf("%w: key %q: %v", ErrBadRecord, r.Key, err)
		}
		return ev, nil
	case KindLog:
		ln := &StepLogLine{}
		if err := decodeLogLine(r.Value, ln); err != nil {
			return nil, fmt.Errorf("%w: key %q: %v", ErrBadRecord, r.Key, err)
		}
		return ln, nil
	case KindHistory:
		h := &RunHistory{}
		if err := decodeHistory(r.Value, h); err != nil {
			return nil, fmt.Errorf("%w: key %q: %v", ErrBadRecord, r.Key, err)
		}
		return h, nil
	case KindOperator:
		v = &OperatorRecord{}
	case KindSecret:
		v = &SecretRecord{}
	case KindAudit:
		v = &AuditEntry{}
	case KindSchedule:
		v = &ScheduleRecord{}
	case KindClosed:
		ch, err := decodeClosed(r.Value)
		if err != nil {
			return nil, fmt.Errorf("%w: key %q: %v", ErrBadRecord, r.Key, err)
		}
		return &ch, nil
	default:
		return nil, fmt.Errorf("%w: unknown kind in key %q", ErrBadRecord, r.Key)
	}
	if err := json.Unmarshal(r.Value, v); err != nil {
		return nil, fmt.Errorf("%w: key %q: %v", ErrBadRecord, r.Key, err)
	}
	return v, nil
}
