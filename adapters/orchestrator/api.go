package orchestrator

// The operator HTTP JSON API, mounted under /api/ on the control plane's
// server (Options.AdminToken). Every request carries
// "Authorization: Bearer <admin token>", compared in constant time; the two
// stream routes also take the status page's session cookie (web.go).
//
//	POST   /api/runs                    body: workflow YAML (?file=NAME names it in errors) → 201 {"run": "run-1"}
//	GET    /api/runs[?limit=&cursor=&status=&name=&since=]
//	                                    → {"runs": [...], "next_cursor"} newest first, live and archived
//	GET    /api/runs/{id}               → {"run", "status", "steps", "events"} (live or archived, one shape)
//	POST   /api/runs/{id}/cancel        optional body {"reason": "..."} → {"run": "run-1"}
//	GET    /api/runs/{id}/logs[?step=N] → {"run", "step", "lines": [...]} (gap markers included)
//	POST   /api/steps/{id}/approve      {id} is "run-1/name" or "run-1/name[i]" → {"step": ...}
//	POST   /api/steps/{id}/reject
//	POST   /api/tokens                  body {"name", "ttl": "24h"} → 201 {"name", "token", "expires"} (shown once)
//	GET    /api/tokens                  → {"tokens": [...]} (never a secret or a hash)
//	DELETE /api/tokens/{name}           → {"revoked": name}
//	GET    /api/workers                 → {"workers": [...]}
//	PUT    /api/bundles                 body: the bundle (a tar is indexed) → 201 {"fingerprint", "size", "tar", "files"} (200 if it existed)
//	GET    /api/bundles/{fingerprint}   → {"fingerprint", "size", "tar", "files", "created"}
//	GET    /api/data/{id}[/{version}|/latest|/append]  the data plane's reads (data.go), for operators
//	GET    /api/runs/{id}/events        text/event-stream: the run live (events.go, SPEC §15)
//	GET    /api/events                  text/event-stream: the whole server live
//
// Errors are {"error": "..."} with 400 (bad request or definition), 401
// (admin token), 404 (unknown path, run, step or token), 405 (method), 409
// (the orchestrator refused: wrong state, duplicate name), 413 (body over
// 1 MiB; a workflow over Options.MaxSubmitBody; a bundle over
// Options.MaxBundleBody), 503 (the orchestrator is
// stopping or did not answer in time).
//
// Reads of live state go through Driver.Snapshot, so they see only durable
// state; archived runs (SPEC §7a) are read from the store's history in
// short read transactions (history.go). Writes go through the Driver's
// calls, answered only once their batch is durable.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/tether-run/tether/adapters/store"
	"github.com/tether-run/tether/adapters/workflow"
	"github.com/tether-run/tether/core"
)

// API limits.
const (
	// MaxAPIBody bounds a request body (a workflow definition has its own
	// limit, Options.MaxSubmitBody).
	MaxAPIBody = 1 << 20
	// DefaultMaxSubmitBody bounds a workflow definition (POST /api/runs)
	// when Options.MaxSubmitBody is zero; it is also the parser's own
	// limit (workflow.MaxSize), which a larger setting cannot pass.
	DefaultMaxSubmitBody = workflow.MaxSize
	// DefaultTokenTTL is an enrollment token's validity when none is given.
	DefaultTokenTTL = 24 * time.Hour
	// apiTimeout bounds one request's wait for the orchestrator.
	apiTimeout = 30 * time.Second
)

// ---- response bodies (shared with the command-line client) ----

// APIError is every error answer.
type APIError struct {
	Error string `json:"error"`
}

// APISubmitted answers POST /api/runs and POST /api/runs/{id}/cancel.
type APISubmitted struct {
	Run string `json:"run"`
}

// APIRun is a run's summary.
type APIRun struct {
	ID           string         `json:"id"`
	Name         string         `json:"name"`
	Status       string         `json:"status"`
	Parent       string         `json:"parent,omitempty"`
	SubmittedAt  time.Time      `json:"submitted"`
	FinishedAt   time.Time      `json:"finished,omitzero"`
	Deadline     time.Time      `json:"deadline,omitzero"`
	CancelReason string         `json:"cancel_reason,omitempty"`
	Steps        int            `json:"steps"`
	States       map[string]int `json:"states"` // steps per state
}

// APIRunList answers GET /api/runs: a page of runs, newest first.
// NextCursor, when set, asks for the next page (?cursor=).
type APIRunList struct {
	Runs       []APIRun `json:"runs"`
	NextCursor string   `json:"next_cursor,omitempty"`
}

// APIStep is one step of a run.
type APIStep struct {
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
}

// APIEvent is one server event of a run.
type APIEvent struct {
	Seq     int       `json:"seq"`
	At      time.Time `json:"at"`
	Step    string    `json:"step,omitempty"`
	Kind    string    `json:"kind"`
	Message string    `json:"message"`
}

// APIRunDetail answers GET /api/runs/{id}.
type APIRunDetail struct {
	Run    APIRun     `json:"run"`
	Status string     `json:"status"`
	Steps  []APIStep  `json:"steps"`
	Events []APIEvent `json:"events"`
}

// APILogLine is one stored line of a step's log. At is the worker's
// timestamp. A gap marker (Gap) has sequence 0; an Event is a protocol event
// of the step rather than a line of its output.
type APILogLine struct {
	Step  string    `json:"step"`
	Lease uint64    `json:"lease"`
	Seq   uint64    `json:"seq"`
	At    time.Time `json:"at"`
	Text  string    `json:"text"`
	Event bool      `json:"event,omitempty"`
	Gap   bool      `json:"gap,omitempty"`
}

// APILogs answers GET /api/runs/{id}/logs.
type APILogs struct {
	Run   string       `json:"run"`
	Step  string       `json:"step,omitempty"`
	Lines []APILogLine `json:"lines"`
}

// APIStepAnswer answers POST /api/steps/{id}/approve and /reject.
type APIStepAnswer struct {
	Step  string `json:"step"`
	State string `json:"state"`
}

// APITokenRequest is the body of POST /api/tokens.
type APITokenRequest struct {
	Name string `json:"name"`
	TTL  string `json:"ttl,omitempty"` // a Go duration ("24h", "90m"); default 24h
}

// APICreatedToken answers POST /api/tokens; Token is shown only here.
type APICreatedToken struct {
	Name      string    `json:"name"`
	Token     string    `json:"token"`
	ExpiresAt time.Time `json:"expires"`
}

// APIToken is one enrollment token, without its secret.
type APIToken struct {
	Name       string    `json:"name"`
	State      string    `json:"state"` // unused, consumed, expired, revoked
	CreatedAt  time.Time `json:"created"`
	ExpiresAt  time.Time `json:"expires"`
	ConsumedBy string    `json:"consumed_by,omitempty"` // worker instance id
	WorkerName string    `json:"worker_name,omitempty"`
	Revoked    bool      `json:"revoked"`
}

// APITokenList answers GET /api/tokens.
type APITokenList struct {
	Tokens []APIToken `json:"tokens"`
}

// APIWorker is one enrolled worker instance.
type APIWorker struct {
	ID             string            `json:"id"`
	Name           string            `json:"name"`
	State          string            `json:"state"` // connected, disconnected, inactive, revoked
	Connected      bool              `json:"connected"`
	Token          string            `json:"token"`
	Tags           []string          `json:"tags"`
	Labels         map[string]string `json:"labels,omitempty"`
	Platform       string            `json:"platform,omitempty"`
	Slots          int               `json:"slots"`
	Leases         int               `json:"leases"`
	Scaler         bool              `json:"scaler,omitempty"`
	LastHeartbeat  time.Time         `json:"last_heartbeat"`
	EnrolledAt     time.Time         `json:"enrolled"`
	DisconnectedAt time.Time         `json:"disconnected,omitzero"`
	GraceUntil     time.Time         `json:"grace_until,omitzero"`
}

// APIWorkerList answers GET /api/workers.
type APIWorkerList struct {
	Workers []APIWorker `json:"workers"`
}

// ---- handler ----

type api struct {
	d    *Driver
	hash [32]byte // of the admin token; an empty token admits nobody
	open bool
}

// APIHandler returns the operator API, authenticated with adminToken (an
// empty token refuses every request). Start mounts it under /api/ when
// Options.AdminToken is set.
func (d *Driver) APIHandler(adminToken string) http.Handler {
	return &api{d: d, hash: sha256.Sum256([]byte(adminToken)), open: adminToken != ""}
}

// httpError is an error with its status code.
type httpError struct {
	code  int
	msg   string
	allow string // 405: the allowed methods
}

func (e *httpError) Error() string { return e.msg }

func errorf(code int, format string, args ...any) error {
	return &httpError{code: code, msg: fmt.Sprintf(format, args...)}
}

func (a *api) authorized(r *http.Request) bool {
	tok := bearer(r)
	// Hashing first makes the comparison constant-time in the length too.
	got := sha256.Sum256([]byte(tok))
	return subtle.ConstantTimeCompare(got[:], a.hash[:]) == 1 && a.open && tok != ""
}

func (a *api) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !a.authorized(r) && !a.streamSession(r) { // the streams also take the status page's session (web.go)
		w.Header().Set("WWW-Authenticate", `Bearer realm="tether"`)
		writeJSON(w, http.StatusUnauthorized, APIError{Error: "missing or wrong admin token (send Authorization: Bearer <admin token>)"})
		return
	}
	if r.URL.Path == "/api/store/backup" {
		a.backup(w, r) // a stream without the answer deadline
		return
	}
	if a.serveStream(w, r) { // live streams (events.go): no answer deadline either
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), apiTimeout)
	defer cancel()
	r = r.WithContext(ctx)
	if strings.HasPrefix(r.URL.Path, "/api/data/") {
		// The data plane's reads, for operators: the same routes and
		// answers, with the admin token instead of a session credential.
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			writeJSON(w, http.StatusMethodNotAllowed, APIError{Error: fmt.Sprintf("method %s is not allowed on %s: operators read data, steps write it (allowed: GET, HEAD)", r.Method, core.Quote(r.URL.Path))})
			return
		}
		(&dataPlane{d: a.d}).serveOperator(w, r, strings.TrimPrefix(r.URL.Path, "/api"))
		return
	}
	limit := int64(MaxAPIBody)
	if r.URL.Path == "/api/bundles" && a.d.opts.MaxBundleBody > 0 {
		limit = a.d.opts.MaxBundleBody
	}
	if strings.Trim(r.URL.Path, "/") == "api/runs" && r.Method == http.MethodPost {
		limit = min(a.d.opts.MaxSubmitBody, workflow.MaxSize)
	}
	if r.URL.Path == "/api/bundles" && r.Body != http.NoBody {
		// A bundle may take longer to arrive than the body deadline every
		// request got (Driver.bodyDeadline, SPEC §12); only an operator's
		// request gets this far.
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(bundleBodyTimeout))
	}
	if r.ContentLength > limit {
		writeJSON(w, http.StatusRequestEntityTooLarge, APIError{Error: fmt.Sprintf("request body of %d bytes is larger than the limit of %d bytes", r.ContentLength, limit)})
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, limit)
	if r.URL.Path == "/api/bundles" {
		// A bundle's body must keep arriving, like a data write's (SPEC §14).
		r.Body = &idleBody{r: r.Body, rc: http.NewResponseController(w), idle: a.d.opts.BodyIdleTimeout, end: time.Now().Add(apiTimeout)}
	}
	status, body, err := a.route(r)
	if err != nil {
		var he *httpError
		if !errors.As(err, &he) {
			he = a.classify(err)
		}
		if he.allow != "" {
			w.Header().Set("Allow", he.allow)
		}
		if he.code >= 500 {
			a.d.log.Warn("operator API request failed", "method", r.Method, "path", r.URL.Path, "status", he.code, "err", he.msg)
		}
		writeJSON(w, he.code, APIError{Error: he.msg})
		return
	}
	writeJSON(w, status, body)
}

// classify maps an error of the driver to a status.
func (a *api) classify(err error) *httpError {
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return &httpError{code: http.StatusRequestEntityTooLarge, msg: fmt.Sprintf("request body larger than %d bytes", mbe.Limit)}
	case errors.Is(err, ErrRefused):
		return &httpError{code: http.StatusConflict, msg: err.Error()}
	case errors.Is(err, ErrClosed):
		return &httpError{code: http.StatusServiceUnavailable, msg: "the orchestrator is stopping"}
	case errors.Is(err, context.DeadlineExceeded):
		return &httpError{code: http.StatusServiceUnavailable, msg: "the orchestrator did not answer in time"}
	case errors.Is(err, context.Canceled):
		return &httpError{code: http.StatusServiceUnavailable, msg: "request cancelled"}
	}
	return &httpError{code: http.StatusInternalServerError, msg: err.Error()}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		code, b = http.StatusInternalServerError, []byte(`{"error": "cannot encode the answer"}`)
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	w.Write(append(b, '\n'))
}

// route dispatches by path and method; it returns the status and body of a
// success, or an error.
func (a *api) route(r *http.Request) (int, any, error) {
	path := strings.Trim(strings.TrimPrefix(r.URL.Path, "/api/"), "/")
	segs := strings.Split(path, "/")
	method := func(allowed ...string) error {
		for _, m := range allowed {
			if r.Method == m {
				return nil
			}
		}
		allow := strings.Join(allowed, ", ")
		return &httpError{code: http.StatusMethodNotAllowed, msg: fmt.Sprintf("method %s is not allowed on %s (allowed: %s)", r.Method, core.Quote(r.URL.Path), allow), allow: allow}
	}
	ctx := r.Context()
	switch {
	case path == "runs":
		if err := method(http.MethodGet, http.MethodPost); err != nil {
			return 0, nil, err
		}
		if r.Method == http.MethodPost {
			return a.submit(r)
		}
		return a.listRuns(r)
	case segs[0] == "runs" && len(segs) == 2:
		if err := method(http.MethodGet); err != nil {
			return 0, nil, err
		}
		return a.showRun(ctx, core.RunID(segs[1]))
	case segs[0] == "runs" && len(segs) == 3 && segs[2] == "cancel":
		if err := method(http.MethodPost); err != nil {
			return 0, nil, err
		}
		return a.cancelRun(r, core.RunID(segs[1]))
	case segs[0] == "runs" && len(segs) == 3 && segs[2] == "logs":
		if err := method(http.MethodGet); err != nil {
			return 0, nil, err
		}
		return a.logs(ctx, core.RunID(segs[1]), r.URL.Query().Get("step"))
	case segs[0] == "steps" && len(segs) >= 4 && (segs[len(segs)-1] == "approve" || segs[len(segs)-1] == "reject"):
		// A step id is "run-1/name" (forEach: "run-1/name[i]"), so it spans segments.
		if err := method(http.MethodPost); err != nil {
			return 0, nil, err
		}
		return a.gate(ctx, core.StepID(strings.Join(segs[1:len(segs)-1], "/")), segs[len(segs)-1] == "approve")
	case path == "tokens":
		if err := method(http.MethodGet, http.MethodPost); err != nil {
			return 0, nil, err
		}
		if r.Method == http.MethodPost {
			return a.createToken(r)
		}
		return a.listTokens(ctx)
	case segs[0] == "tokens" && len(segs) == 2:
		if err := method(http.MethodDelete); err != nil {
			return 0, nil, err
		}
		return a.revokeToken(ctx, segs[1])
	case path == "workers":
		if err := method(http.MethodGet); err != nil {
			return 0, nil, err
		}
		return a.listWorkers(ctx)
	case path == "bundles":
		if err := method(http.MethodPut); err != nil {
			return 0, nil, err
		}
		return a.putBundle(r)
	case segs[0] == "bundles" && len(segs) == 2:
		if err := method(http.MethodGet); err != nil {
			return 0, nil, err
		}
		return a.showBundle(segs[1])
	}
	return 0, nil, errorf(http.StatusNotFound, "no such endpoint: %s %s", r.Method, core.Quote(r.URL.Path))
}

// readBody reads the whole (size-limited) body.
func readBody(r *http.Request) ([]byte, error) {
	b, err := io.ReadAll(r.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, err
		}
		return nil, errorf(http.StatusBadRequest, "reading the request body: %v", err)
	}
	return b, nil
}

// decodeJSON decodes an optional JSON body strictly (unknown fields refused).
func decodeJSON(r *http.Request, v any) error {
	b, err := readBody(r)
	if err != nil {
		return err
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return errorf(http.StatusBadRequest, "request body is not valid JSON for this call: %v", err)
	}
	if dec.More() {
		return errorf(http.StatusBadRequest, "request body holds more than one JSON value")
	}
	return nil
}

// exists answers whether f finds the entity, through a snapshot.
func (a *api) exists(ctx context.Context, f func(o *core.Orchestrator) bool) (bool, error) {
	var ok bool
	err := a.d.Snapshot(ctx, func(o *core.Orchestrator) { ok = f(o) })
	return ok, err
}

func (a *api) submit(r *http.Request) (int, any, error) {
	src, err := readBody(r)
	if err != nil {
		return 0, nil, err
	}
	file := r.URL.Query().Get("file")
	if file == "" {
		file = "workflow"
	}
	if err := core.CheckName("workflow file name (?file=)", file); err != nil { // it prefixes every error (SPEC §12)
		return 0, nil, errorf(http.StatusBadRequest, "%v", err)
	}
	spec, err := workflow.Parse(file, src)
	if err != nil {
		return 0, nil, errorf(http.StatusBadRequest, "%v", err)
	}
	run, err := a.d.Submit(r.Context(), spec)
	if errors.Is(err, ErrRefused) {
		return 0, nil, errorf(http.StatusBadRequest, "%v", err)
	}
	if err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, APISubmitted{Run: string(run)}, nil
}

func (a *api) showRun(ctx context.Context, id core.RunID) (int, any, error) {
	var src runSource
	var names map[core.WorkerID]string
	found := false
	err := a.d.Snapshot(ctx, func(o *core.Orchestrator) {
		src, found = liveSource(o, id)
		names = map[core.WorkerID]string{}
		for _, w := range o.Workers() {
			names[w.ID] = w.Name
		}
	})
	if err != nil {
		return 0, nil, err
	}
	if !found {
		// Not in the core: archived (the store has it: the batch that
		// archived it was durable before the snapshot ran), or unknown.
		h, ok, err := a.history(id)
		if err != nil {
			return 0, nil, err
		}
		if !ok {
			return 0, nil, errorf(http.StatusNotFound, "unknown run %q", id)
		}
		src = archivedSource(h)
	}
	return http.StatusOK, src.detail(names), nil
}

func (a *api) cancelRun(r *http.Request, id core.RunID) (int, any, error) {
	var body struct {
		Reason string `json:"reason"`
	}
	if err := decodeJSON(r, &body); err != nil {
		return 0, nil, err
	}
	ok, err := a.exists(r.Context(), func(o *core.Orchestrator) bool { _, _, ok := o.Run(id); return ok })
	if err != nil {
		return 0, nil, err
	}
	if !ok {
		if _, archived, err := a.history(id); err != nil {
			return 0, nil, err
		} else if archived {
			return 0, nil, archivedErr(id)
		}
		return 0, nil, errorf(http.StatusNotFound, "unknown run %q", id)
	}
	if err := a.d.CancelRun(r.Context(), id, body.Reason); err != nil {
		return 0, nil, err // refused (already finished) → 409
	}
	return http.StatusOK, APISubmitted{Run: string(id)}, nil
}

func (a *api) logs(ctx context.Context, id core.RunID, step string) (int, any, error) {
	out := APILogs{Run: string(id), Step: step, Lines: []APILogLine{}}
	var src runSource
	found, matched := false, false
	err := a.d.Snapshot(ctx, func(o *core.Orchestrator) {
		if src, found = liveSource(o, id); !found {
			return
		}
		steps := src.matchSteps(step)
		matched = len(steps) > 0
		for _, sid := range steps {
			for _, l := range o.StepLogs(sid) {
				out.Lines = append(out.Lines, logLine(l))
			}
		}
	})
	if err != nil {
		return 0, nil, err
	}
	if !found {
		h, ok, err := a.history(id)
		if err != nil {
			return 0, nil, err
		}
		if !ok {
			return 0, nil, errorf(http.StatusNotFound, "unknown run %q", id)
		}
		src = archivedSource(h)
		steps := src.matchSteps(step)
		matched = len(steps) > 0
		if matched {
			if out.Lines, err = a.archivedLogs(&src, steps); err != nil {
				return 0, nil, err
			}
		}
	}
	if !matched {
		return 0, nil, errorf(http.StatusNotFound, "run %s has no step %q", id, step)
	}
	return http.StatusOK, out, nil
}

func (a *api) gate(ctx context.Context, id core.StepID, approve bool) (int, any, error) {
	ok, err := a.exists(ctx, func(o *core.Orchestrator) bool { _, ok := o.StepByID(id); return ok })
	if err != nil {
		return 0, nil, err
	}
	if !ok {
		if h, archived, err := a.history(runOfStep(id)); err != nil {
			return 0, nil, err
		} else if _, has := h.Step(id); archived && has {
			return 0, nil, errorf(http.StatusConflict, "step %s: run %s already finished (archived)", id, h.Run.ID)
		}
		return 0, nil, errorf(http.StatusNotFound, "unknown step %q (a step id reads run-1/name or run-1/name[i])", id)
	}
	if approve {
		err = a.d.Approve(ctx, id)
	} else {
		err = a.d.RejectGate(ctx, id)
	}
	if err != nil {
		return 0, nil, err // refused (not held) → 409
	}
	var state string
	if err := a.d.Snapshot(ctx, func(o *core.Orchestrator) {
		s, _ := o.StepByID(id)
		state = s.State.String()
	}); err != nil {
		return 0, nil, err
	}
	return http.StatusOK, APIStepAnswer{Step: string(id), State: state}, nil
}

func (a *api) createToken(r *http.Request) (int, any, error) {
	var req APITokenRequest
	if err := decodeJSON(r, &req); err != nil {
		return 0, nil, err
	}
	if req.Name == "" {
		return 0, nil, errorf(http.StatusBadRequest, `a token needs a name: {"name": "worker-1", "ttl": "24h"}`)
	}
	ttl := DefaultTokenTTL
	if req.TTL != "" {
		d, err := time.ParseDuration(req.TTL)
		if err != nil || d <= 0 {
			return 0, nil, errorf(http.StatusBadRequest, "ttl %q is not a positive duration like 90m or 24h", req.TTL)
		}
		ttl = d
	}
	exists, err := a.exists(r.Context(), func(o *core.Orchestrator) bool {
		for _, t := range o.Tokens() {
			if t.Name == req.Name {
				return true
			}
		}
		return false
	})
	if err != nil {
		return 0, nil, err
	}
	if exists {
		return 0, nil, errorf(http.StatusConflict, "token %q already exists (token names are never reused)", req.Name)
	}
	tok, err := a.d.CreateToken(r.Context(), req.Name, ttl)
	if errors.Is(err, ErrRefused) {
		return 0, nil, errorf(http.StatusBadRequest, "%v", err) // an invalid name, mostly
	}
	if err != nil {
		return 0, nil, err
	}
	var exp time.Time
	if err := a.d.Snapshot(r.Context(), func(o *core.Orchestrator) {
		for _, t := range o.Tokens() {
			if t.Name == req.Name {
				exp = t.ExpiresAt
			}
		}
	}); err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, APICreatedToken{Name: req.Name, Token: tok, ExpiresAt: exp}, nil
}

func (a *api) listTokens(ctx context.Context) (int, any, error) {
	out := APITokenList{Tokens: []APIToken{}}
	now := time.Now()
	err := a.d.Snapshot(ctx, func(o *core.Orchestrator) {
		names := map[core.WorkerID]string{}
		for _, w := range o.Workers() {
			names[w.ID] = w.Name
		}
		for _, t := range o.Tokens() {
			v := APIToken{Name: t.Name, CreatedAt: t.CreatedAt, ExpiresAt: t.ExpiresAt, Revoked: t.Revoked}
			if t.Consumed {
				v.ConsumedBy, v.WorkerName = string(t.Worker), names[t.Worker]
			}
			switch {
			case t.Revoked:
				v.State = "revoked"
			case t.Consumed:
				v.State = "consumed"
			case !now.Before(t.ExpiresAt):
				v.State = "expired"
			default:
				v.State = "unused"
			}
			out.Tokens = append(out.Tokens, v)
		}
	})
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, out, nil
}

func (a *api) revokeToken(ctx context.Context, name string) (int, any, error) {
	ok, err := a.exists(ctx, func(o *core.Orchestrator) bool {
		for _, t := range o.Tokens() {
			if t.Name == name {
				return true
			}
		}
		return false
	})
	if err != nil {
		return 0, nil, err
	}
	if !ok {
		return 0, nil, errorf(http.StatusNotFound, "unknown token %q", name)
	}
	if err := a.d.RevokeToken(ctx, name); err != nil {
		return 0, nil, err
	}
	return http.StatusOK, map[string]string{"revoked": name}, nil
}

func (a *api) listWorkers(ctx context.Context) (int, any, error) {
	out := APIWorkerList{Workers: []APIWorker{}}
	err := a.d.Snapshot(ctx, func(o *core.Orchestrator) {
		for _, w := range o.Workers() {
			v := APIWorker{
				ID: string(w.ID), Name: w.Name, Connected: w.Connected, Token: w.Token,
				Tags: append([]string{}, w.Tags...), Labels: w.Labels, Platform: w.Platform,
				Slots: w.Slots, Leases: w.Leases, Scaler: w.Scaler, LastHeartbeat: w.LastHeartbeat,
				EnrolledAt: w.EnrolledAt, DisconnectedAt: w.DisconnectedAt, GraceUntil: w.GraceUntil,
			}
			switch {
			case w.Revoked:
				v.State = "revoked"
			case !w.Active:
				v.State = "inactive"
			case w.Connected:
				v.State = "connected"
			default:
				v.State = "disconnected"
			}
			out.Workers = append(out.Workers, v)
		}
		sort.SliceStable(out.Workers, func(i, j int) bool { return out.Workers[i].Name < out.Workers[j].Name })
	})
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, out, nil
}

func (a *api) putBundle(r *http.Request) (int, any, error) {
	// A bundle is streamed into a blob, not held in memory (SPEC §14);
	// ServeHTTP bounds it by MaxBundleBody, and a body that stalls is cut.
	m, err := a.d.PutBundleFrom(r.Context(), r.Body, a.d.opts.MaxBundleBody)
	if errors.Is(err, ErrNoDataStore) {
		return 0, nil, &httpError{code: http.StatusServiceUnavailable, msg: err.Error()}
	}
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) || errors.Is(err, store.ErrTooLarge) || errors.Is(err, ErrBodyStalled) {
			return 0, nil, bodyError(err, a.d.opts.MaxBundleBody)
		}
		return 0, nil, err
	}
	if m.Existed {
		return http.StatusOK, m, nil
	}
	return http.StatusCreated, m, nil
}

func (a *api) showBundle(fp string) (int, any, error) {
	if a.d.ds == nil {
		return 0, nil, &httpError{code: http.StatusServiceUnavailable, msg: ErrNoDataStore.Error()}
	}
	m, err := a.d.ds.Bundle(fp)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return 0, nil, errorf(http.StatusNotFound, "unknown bundle %s", fp)
	case err != nil:
		return 0, nil, errorf(http.StatusBadRequest, "%s", strings.TrimPrefix(err.Error(), "store: "))
	}
	return http.StatusOK, m, nil
}
