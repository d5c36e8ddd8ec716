package client

import (
	"time"

	"github.com/tether-run/tether/adapters/dataplane"
)

// The operator API's request and answer bodies (SPEC §15). The orchestrator
// encodes these very types (adapters/orchestrator aliases them), so the
// client and the server cannot disagree on a field.

// Code is the stable, machine-readable kind of an error answer (SPEC §15).
// The set is closed: a client may switch on it; the message is for people.
type Code string

// The error codes, each with the one HTTP status it is answered with.
const (
	CodeInvalid          Code = "invalid"            // 400: a bad request, query, body or definition
	CodeUnauthorized     Code = "unauthorized"       // 401: missing, wrong or revoked credential
	CodeForbidden        Code = "forbidden"          // 403: a read-only operator token asked for a change
	CodeNotFound         Code = "not_found"          // 404: no such endpoint, run, step, token, bundle or data
	CodeMethodNotAllowed Code = "method_not_allowed" // 405: see the Allow header
	CodeTimeout          Code = "timeout"            // 408: the request body stopped arriving
	CodeConflict         Code = "conflict"           // 409: refused in the current state (finished, not held, duplicate name, fenced)
	CodeTooLarge         Code = "too_large"          // 413: a body over its limit
	CodeOutOfRange       Code = "out_of_range"       // 416: an offset past the end of a stream
	CodeInternal         Code = "internal"           // 500: a fault of the orchestrator
	CodeUnsupported      Code = "unsupported"        // 501: this orchestrator cannot do it (a store without backup)
	CodeUnavailable      Code = "unavailable"        // 503: stopping, not answering in time, a cap reached, or no secrets key
)

// Codes lists every Code, in status order.
var Codes = []Code{CodeInvalid, CodeUnauthorized, CodeForbidden, CodeNotFound, CodeMethodNotAllowed, CodeTimeout, CodeConflict,
	CodeTooLarge, CodeOutOfRange, CodeInternal, CodeUnsupported, CodeUnavailable}

// CodeFor returns the code of an error answer's HTTP status; a status
// outside the set is internal (5xx) or invalid (4xx).
func CodeFor(status int) Code {
	switch status {
	case 400:
		return CodeInvalid
	case 401:
		return CodeUnauthorized
	case 403:
		return CodeForbidden
	case 404:
		return CodeNotFound
	case 405:
		return CodeMethodNotAllowed
	case 408:
		return CodeTimeout
	case 409:
		return CodeConflict
	case 413:
		return CodeTooLarge
	case 416:
		return CodeOutOfRange
	case 501:
		return CodeUnsupported
	case 503:
		return CodeUnavailable
	}
	if status >= 400 && status < 500 {
		return CodeInvalid
	}
	return CodeInternal
}

// ErrorBody is every error answer. Error repeats Message for clients
// written before codes existed; new clients read Code and Message.
type ErrorBody struct {
	Code    Code   `json:"code"`
	Message string `json:"message"`
	Error   string `json:"error"`
}

// Submitted answers POST /api/runs and POST /api/runs/{id}/cancel.
type Submitted struct {
	Run string `json:"run"`
}

// Run is a run's summary.
type Run struct {
	ID           string         `json:"id"`
	Name         string         `json:"name"`
	Status       string         `json:"status"`
	Parent       string         `json:"parent,omitempty"`
	RerunOf      string         `json:"rerun_of,omitempty"` // the run this one reruns (run rerun)
	SubmittedAt  time.Time      `json:"submitted"`
	FinishedAt   time.Time      `json:"finished,omitzero"`
	Deadline     time.Time      `json:"deadline,omitzero"`
	CancelReason string         `json:"cancel_reason,omitempty"`
	Steps        int            `json:"steps"`
	States       map[string]int `json:"states"` // steps per state
}

// RunList answers GET /api/runs: a page of runs, newest first.
// NextCursor, when set, asks for the next page (RunsOptions.Cursor).
type RunList struct {
	Runs       []Run  `json:"runs"`
	NextCursor string `json:"next_cursor,omitempty"`
}

// Step is one step of a run.
type Step struct {
	ID         string    `json:"id"`
	Name       string    `json:"name"`
	Item       string    `json:"item,omitempty"` // forEach item
	State      string    `json:"state"`
	Class      string    `json:"class,omitempty"`
	Message    string    `json:"message,omitempty"`
	SkippedBy  string    `json:"skipped_by,omitempty"`
	Attempts   int       `json:"attempts"`
	Writes     bool      `json:"writes"`
	Deps       []string  `json:"deps,omitempty"`      // the ids of the steps it depends on
	Worker     string    `json:"worker,omitempty"`    // name of the worker of its latest lease
	WorkerID   string    `json:"worker_id,omitempty"` // its instance id
	Lease      uint64    `json:"lease,omitempty"`     // latest lease
	ExitCode   *int      `json:"exit_code,omitempty"` // of a committed outcome
	QueuedAt   time.Time `json:"queued,omitzero"`
	StartedAt  time.Time `json:"started,omitzero"`
	FinishedAt time.Time `json:"finished,omitzero"`
	// Try and TryLimit are set for a step with a retry: policy (SPEC §1
	// RETRY): the try it is on (1-based) and 1 + its retry attempts.
	Try      int    `json:"try,omitempty"`
	TryLimit int    `json:"try_limit,omitempty"`
	Child    string `json:"child,omitempty"` // the run a workflow step started (SPEC §2)
}

// Event is one server event of a run.
type Event struct {
	Seq     int       `json:"seq"`
	At      time.Time `json:"at"`
	Step    string    `json:"step,omitempty"`
	Kind    string    `json:"kind"`
	Message string    `json:"message"`
}

// RunDetail answers GET /api/runs/{id}.
type RunDetail struct {
	Run    Run     `json:"run"`
	Status string  `json:"status"`
	Steps  []Step  `json:"steps"`
	Events []Event `json:"events"`
	// The tree (SPEC §2): the parent's workflow step that started this
	// run, and the runs started below it, in submit order.
	ParentStep string   `json:"parent_step,omitempty"`
	Children   []string `json:"children,omitempty"`
	// Group is the run's concurrency group; Schedule and FireAt the
	// schedule that started it and the fire time it stands for (SPEC §8a).
	Group    string    `json:"group,omitempty"`
	Schedule string    `json:"schedule,omitempty"`
	FireAt   time.Time `json:"fire_at,omitzero"`
}

// LogLine is one stored line of a step's log. At is the worker's
// timestamp. A gap marker (Gap) has sequence 0; an Event is a protocol event
// of the step rather than a line of its output.
type LogLine struct {
	Step  string    `json:"step"`
	Lease uint64    `json:"lease"`
	Seq   uint64    `json:"seq"`
	At    time.Time `json:"at"`
	Text  string    `json:"text"`
	Event bool      `json:"event,omitempty"`
	Gap   bool      `json:"gap,omitempty"`
}

// Logs answers GET /api/runs/{id}/logs.
type Logs struct {
	Run   string    `json:"run"`
	Step  string    `json:"step,omitempty"`
	Lines []LogLine `json:"lines"`
}

// StepAnswer answers POST /api/steps/{run}/{step}/approve and /reject.
type StepAnswer struct {
	Step  string `json:"step"`
	State string `json:"state"`
}

// RerunRequest is the optional body of POST /api/runs/{id}/rerun: with
// FailedOnly, the steps that succeeded in the run are not run again (SPEC §2).
type RerunRequest struct {
	FailedOnly bool `json:"failed_only,omitempty"`
}

// CancelRequest is the optional body of POST /api/runs/{id}/cancel.
type CancelRequest struct {
	Reason string `json:"reason,omitempty"`
}

// TokenRequest is the body of POST /api/tokens.
type TokenRequest struct {
	Name string `json:"name"`
	TTL  string `json:"ttl,omitempty"` // a Go duration ("24h", "90m"); default 24h
	// IntoSecret stores the token as this secret (SPEC §9, §14a) instead of
	// answering it: the answer's Token is then empty.
	IntoSecret string `json:"into_secret,omitempty"`
}

// CreatedToken answers POST /api/tokens; Token is shown only here.
type CreatedToken struct {
	Name       string    `json:"name"`
	Token      string    `json:"token,omitempty"`
	IntoSecret string    `json:"into_secret,omitempty"`
	ExpiresAt  time.Time `json:"expires"`
}

// Token is one enrollment token, without its secret.
type Token struct {
	Name       string    `json:"name"`
	State      string    `json:"state"` // unused, consumed, expired, revoked
	CreatedAt  time.Time `json:"created"`
	ExpiresAt  time.Time `json:"expires"`
	ConsumedBy string    `json:"consumed_by,omitempty"` // worker instance id
	WorkerName string    `json:"worker_name,omitempty"`
	Revoked    bool      `json:"revoked"`
}

// TokenList answers GET /api/tokens.
type TokenList struct {
	Tokens []Token `json:"tokens"`
}

// RevokedToken answers DELETE /api/tokens/{name}.
type RevokedToken struct {
	Revoked string `json:"revoked"`
}

// Worker is one enrolled worker instance.
type Worker struct {
	ID             string            `json:"id"`
	Name           string            `json:"name"`
	State          string            `json:"state"` // connected, disconnected, inactive, revoked
	Connected      bool              `json:"connected"`
	Token          string            `json:"token"`
	Tags           []string          `json:"tags"`
	Labels         map[string]string `json:"labels,omitempty"`
	Platform       string            `json:"platform,omitempty"`
	Slots          int               `json:"slots"`
	Ahead          int               `json:"ahead,omitempty"` // leases it may hold ahead (SPEC §3)
	Leases         int               `json:"leases"`
	Scaler         bool              `json:"scaler,omitempty"`
	LastHeartbeat  time.Time         `json:"last_heartbeat"`
	EnrolledAt     time.Time         `json:"enrolled"`
	DisconnectedAt time.Time         `json:"disconnected,omitzero"`
	GraceUntil     time.Time         `json:"grace_until,omitzero"`
}

// WorkerList answers GET /api/workers.
type WorkerList struct {
	Workers []Worker `json:"workers"`
}

// The data plane's answers (SPEC §14) are its protocol's types, defined
// once in adapters/dataplane.
type (
	// Bundle answers PUT /api/bundles and GET /api/bundles/{fingerprint}: a
	// content-addressed bundle.
	Bundle = dataplane.Bundle
	// DataVersion is one version of a data item.
	DataVersion = dataplane.Version
	// DataStream is a data item's append stream.
	DataStream = dataplane.Stream
	// DataVersions answers GET /api/data/{id}.
	DataVersions = dataplane.Versions
)

// OperatorTokenRequest is the body of POST /api/operator-tokens.
type OperatorTokenRequest struct {
	Name     string `json:"name"`                // 1-64 letters, digits, '-' or '_'; never reused
	ReadOnly bool   `json:"read_only,omitempty"` // may read (every GET, the streams, /metrics), never change
}

// CreatedOperatorToken answers POST /api/operator-tokens; Token
// ("<name>.<secret>") is shown only here.
type CreatedOperatorToken struct {
	Name     string `json:"name"`
	Token    string `json:"token"`
	ReadOnly bool   `json:"read_only"`
}

// OperatorToken is one operator token, without its secret or hash.
type OperatorToken struct {
	Name      string    `json:"name"`
	ReadOnly  bool      `json:"read_only"`
	CreatedAt time.Time `json:"created"`
	CreatedBy string    `json:"created_by"`
	Revoked   bool      `json:"revoked"`
	RevokedAt time.Time `json:"revoked_at,omitzero"`
}

// OperatorTokenList answers GET /api/operator-tokens.
type OperatorTokenList struct {
	OperatorTokens []OperatorToken `json:"operator_tokens"`
}

// AuditEntry is one recorded operator action (SPEC §15a).
type AuditEntry struct {
	Seq     uint64    `json:"seq"`
	At      time.Time `json:"at"`
	Actor   string    `json:"actor"`            // the operator token's name
	Action  string    `json:"action"`           // run.submit, run.cancel, step.approve, ...
	Target  string    `json:"target,omitempty"` // run, step or token
	Outcome string    `json:"outcome"`          // accepted or refused
	Code    Code      `json:"code,omitempty"`   // refused: why, as an error answer's code
	Message string    `json:"message,omitempty"`
}

// AuditList answers GET /api/audit, newest first. NextCursor, when set,
// asks for the next (older) page (AuditOptions.Cursor).
type AuditList struct {
	Entries    []AuditEntry `json:"entries"`
	NextCursor string       `json:"next_cursor,omitempty"`
}

// ---- live streams (SPEC §17): the "data:" JSON of each event type ----

// StreamStep is a run stream's "step" event: the step's state after a
// commit. Worker is the worker instance id of the step's latest lease
// (empty before the first); Lease is that lease (0 before the first).
type StreamStep struct {
	Run        string    `json:"run"`
	Step       string    `json:"step"`
	State      string    `json:"state"`
	Attempts   int       `json:"attempts"`
	Worker     string    `json:"worker"`
	Lease      uint64    `json:"lease"`
	Exit       *int      `json:"exit,omitempty"`
	StartedAt  time.Time `json:"started_at,omitzero"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
}

// StreamRun is a "run" event: the run's status as GET /api/runs/{id} shows
// it; Finished once it is archived (success, failed, cancelled).
type StreamRun struct {
	Run      string `json:"run"`
	Status   string `json:"status"`
	Finished bool   `json:"finished"`
}

// StreamServerEvent is a "server" event: a server event of a run, in the
// API's shape (Event) with the run.
type StreamServerEvent struct {
	Run string `json:"run"`
	Event
}

// StreamLine is a "log" event, or a "gap" event for a gap marker (a line
// of sequence 0, as GET /api/runs/{id}/logs flags it). Index is the line's
// place in its lease's log (0, 1, ...); Seq the worker's sequence number;
// Event marks a protocol event of the step rather than its output.
type StreamLine struct {
	Run   string    `json:"run"`
	Step  string    `json:"step"`
	Lease uint64    `json:"lease"`
	Index int       `json:"index"`
	Seq   uint64    `json:"seq"`
	At    time.Time `json:"at"`
	Text  string    `json:"text"`
	Event bool      `json:"event,omitempty"`
}

// StreamWorker is a "worker" event of the server stream. State is as GET
// /api/workers shows it (connected, disconnected, inactive, revoked), or
// "removed" once the worker's record is pruned (SPEC §7a).
type StreamWorker struct {
	Worker string `json:"worker"`
	Name   string `json:"name"`
	State  string `json:"state"`
	Slots  int    `json:"slots"`
	Ahead  int    `json:"ahead,omitempty"` // leases it may hold ahead (SPEC §3)
	Leases int    `json:"leases"`
}

// StreamEnd is the run stream's last event, once the run is archived.
type StreamEnd struct {
	Run    string `json:"run"`
	Status string `json:"status"`
}

// StreamLost is the server stream's "lost" event: it could not resume
// from the client's Last-Event-ID, so server events may be missing before
// this point (the states that follow are whole again).
type StreamLost struct {
	Reason string `json:"reason"`
}

// ScheduleRequest creates a cron schedule (POST /api/schedules, SPEC §8a):
// Workflow is the YAML definition, File its name in errors.
type ScheduleRequest struct {
	Name     string `json:"name"`
	Cron     string `json:"cron"`
	TZ       string `json:"tz,omitempty"`       // a zone name (Europe/Paris) or a fixed offset (+05:30); empty is UTC
	CatchUp  string `json:"catch_up,omitempty"` // none, one (default) or all
	File     string `json:"file,omitempty"`
	Workflow string `json:"workflow"`
}

// Schedule is one cron schedule.
type Schedule struct {
	Name      string    `json:"name"`
	Cron      string    `json:"cron"`
	TZ        string    `json:"tz"` // "UTC" when none was given
	CatchUp   string    `json:"catch_up"`
	Workflow  string    `json:"workflow"` // the workflow's name
	Steps     int       `json:"steps"`
	Paused    bool      `json:"paused"`
	CreatedAt time.Time `json:"created_at"`
	CreatedBy string    `json:"created_by"`
	LastFire  time.Time `json:"last_fire"`
	NextFire  time.Time `json:"next_fire,omitzero"` // absent while paused
	LastRun   string    `json:"last_run,omitempty"`
	Runs      int       `json:"runs"`
	Skipped   int       `json:"skipped"`
	// Upcoming lists the next fire times (GET /api/schedules/{name} only).
	Upcoming []time.Time `json:"upcoming,omitempty"`
}

// ScheduleList answers GET /api/schedules.
type ScheduleList struct {
	Schedules []Schedule `json:"schedules"`
}

// DeletedSchedule answers DELETE /api/schedules/{name}.
type DeletedSchedule struct {
	Deleted string `json:"deleted"`
}
