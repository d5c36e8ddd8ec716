package orchestrator

// The operator HTTP JSON API under /api/ on the control plane's server
// (Options.AdminToken), routed by ServeMux method-and-path patterns. Every
// request but GET /api/openapi.json carries "Authorization: Bearer
// <operator token>" (operators.go: the admin token is the operator token
// "admin"; a read-only one may only GET, 403 otherwise); the two stream
// routes also take the status page's session cookie (web.go). The routes, their limits and their
// answers are the table apiRoutes below; GET /api/openapi.json describes
// them (openapi.go).
//
// Every error answer is {"code", "message", "error"} (SPEC §15): code is
// one of a closed set (client.Code), one per status: invalid 400,
// unauthorized 401, forbidden 403 (a read-only token), not_found 404 (an unknown path too), method_not_allowed
// 405 (with Allow), timeout 408, conflict 409 (the orchestrator refused:
// wrong state, duplicate name), too_large 413 (body over 1 MiB; a workflow
// over Options.MaxSubmitBody; a bundle over Options.MaxBundleBody),
// out_of_range 416, internal 500, unsupported 501, unavailable 503 (the
// orchestrator is stopping or did not answer in time). error repeats
// message for clients older than the codes.
//
// Reads of live state go through Driver.Snapshot, so they see only durable
// state; archived runs (SPEC §7a) are read from the store's history in
// short read transactions (history.go). Writes go through the Driver's
// calls, answered only once their batch is durable.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/tether-run/tether/adapters/dataplane"
	"github.com/tether-run/tether/adapters/store"
	"github.com/tether-run/tether/adapters/workflow"
	"github.com/tether-run/tether/client"
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

// ---- request and answer bodies ----

// The bodies are package client's types (one definition for the server and
// its client); these names keep the orchestrator's callers unchanged.
type (
	APIError        = client.ErrorBody
	APISubmitted    = client.Submitted
	APIRerunRequest = client.RerunRequest
	APIRun          = client.Run
	APIRunList      = client.RunList
	APIStep         = client.Step
	APIEvent        = client.Event
	APIRunDetail    = client.RunDetail
	APILogLine      = client.LogLine
	APILogs         = client.Logs
	APIStepAnswer   = client.StepAnswer
	APITokenRequest = client.TokenRequest
	APICreatedToken = client.CreatedToken
	APIToken        = client.Token
	APITokenList    = client.TokenList
	APIWorker       = client.Worker
	APIWorkerList   = client.WorkerList
)

// ---- routes ----

// apiRoute is one operator API endpoint: the method and path of its
// ServeMux pattern, its handler, and what the OpenAPI document
// (openapi.go) says of it. Adding an endpoint is adding one entry here.
type apiRoute struct {
	method, path string
	summary      string
	// serve answers with JSON: a success status and body, or an error.
	serve func(a *api, r *http.Request) (int, any, error)
	// raw, instead of serve, writes its own answer (a stream of bytes).
	raw func(a *api, w http.ResponseWriter, r *http.Request)
	// public routes need no admin token; session routes (the read-only
	// streams) also take the status page's session cookie (web.go).
	public, session bool
	// full: a GET that a read-only operator token may not call (SPEC §15a).
	full bool
	// noDeadline: no answer deadline (apiTimeout); the per-write timeout
	// still cuts a reader that stops reading.
	noDeadline bool
	// limit bounds the body (nil: MaxAPIBody); slowBody gives it the
	// bundle's read deadline and cuts it when it stops arriving.
	limit    func(o *Options) int64
	slowBody bool

	// For the document: query parameters, the request body (a Go value
	// for JSON, or a media type), the success status (0: 200) and body
	// (a Go value for JSON, or a media type).
	query   []docParam
	request any
	status  int
	answer  any
	also200 string // when status is 201: a 200 answer of the same body too, meaning this
}

// docParam is a documented query parameter.
type docParam struct{ name, desc string }

// apiRoutes is the operator API (SPEC §15; limits §12), in the order of the document.
var apiRoutes = []apiRoute{
	{method: "POST", path: "/api/runs", summary: "Submit a workflow definition (YAML); ?file=NAME names it in errors",
		serve: (*api).submit, limit: func(o *Options) int64 { return min(o.MaxSubmitBody, workflow.MaxSize) },
		query: []docParam{{"file", "the definition's file name, prefixing each error"},
			{"parent", "a live run that becomes its parent: cancelling the parent cancels it (SPEC §2)"}},
		request: "application/yaml", status: http.StatusCreated, answer: client.Submitted{}},
	{method: "GET", path: "/api/runs", summary: "List runs, newest first, live and archived; next_cursor continues",
		serve: (*api).listRuns,
		query: []docParam{{"limit", "at most this many runs (1 to 1000, default 100)"}, {"cursor", "next_cursor of the previous page"},
			{"status", "only runs of this status"}, {"name", "only runs of this workflow"}, {"since", "submitted at or after an RFC 3339 time, or within a duration (24h)"}},
		answer: client.RunList{}},
	{method: "GET", path: "/api/runs/{id}", summary: "A run: status, steps, server events (live or archived, one shape)",
		serve: func(a *api, r *http.Request) (int, any, error) {
			return a.showRun(r.Context(), core.RunID(r.PathValue("id")))
		}, answer: client.RunDetail{}},
	{method: "POST", path: "/api/runs/{id}/cancel", summary: "Cancel a run (optional body {\"reason\": ...})",
		serve:   func(a *api, r *http.Request) (int, any, error) { return a.cancelRun(r, core.RunID(r.PathValue("id"))) },
		request: client.CancelRequest{}, answer: client.Submitted{}},
	{method: "POST", path: "/api/runs/{id}/rerun", summary: "Start a new run of the run's definition, live or archived (optional body {\"failed_only\": true}: its successes are reused, not run)",
		serve: (*api).rerun, request: client.RerunRequest{}, status: http.StatusCreated, answer: client.Submitted{}},
	{method: "GET", path: "/api/runs/{id}/logs", summary: "A run's stored log lines, gap markers included; ?step= keeps one step",
		serve: func(a *api, r *http.Request) (int, any, error) {
			return a.logs(r.Context(), core.RunID(r.PathValue("id")), r.URL.Query().Get("step"))
		},
		query: []docParam{{"step", "only this step NAME (all its forEach instances) or NAME[i]"}}, answer: client.Logs{}},
	{method: "POST", path: "/api/steps/{run}/{step}/approve", summary: "Approve a held step: it is queued; {step} is its name, or name[i] of a forEach instance",
		serve: func(a *api, r *http.Request) (int, any, error) { return a.gate(r.Context(), pathStep(r), true) }, answer: client.StepAnswer{}},
	{method: "POST", path: "/api/steps/{run}/{step}/reject", summary: "Reject a held step: it is cancelled, its dependents skipped",
		serve: func(a *api, r *http.Request) (int, any, error) { return a.gate(r.Context(), pathStep(r), false) }, answer: client.StepAnswer{}},
	{method: "POST", path: "/api/tokens", summary: "Create an enrollment token; its secret is shown only in this answer",
		serve: (*api).createToken, request: client.TokenRequest{}, status: http.StatusCreated, answer: client.CreatedToken{}},
	{method: "GET", path: "/api/tokens", summary: "List enrollment tokens (never a secret or a hash)",
		serve: func(a *api, r *http.Request) (int, any, error) { return a.listTokens(r.Context()) }, answer: client.TokenList{}},
	{method: "DELETE", path: "/api/tokens/{name}", summary: "Revoke a token; its worker is disconnected for good",
		serve: func(a *api, r *http.Request) (int, any, error) {
			return a.revokeToken(r.Context(), r.PathValue("name"))
		},
		answer: client.RevokedToken{}},
	{method: "POST", path: "/api/operator-tokens", summary: "Create a named operator token (read_only: may only read); its secret is shown only in this answer",
		serve: (*api).createOperator, request: client.OperatorTokenRequest{}, status: http.StatusCreated, answer: client.CreatedOperatorToken{}},
	{method: "GET", path: "/api/operator-tokens", summary: "List operator tokens, revoked ones too (never a secret or a hash)",
		serve: func(a *api, r *http.Request) (int, any, error) { return a.listOperators(r.Context()) }, answer: client.OperatorTokenList{}},
	{method: "DELETE", path: "/api/operator-tokens/{name}", summary: "Revoke an operator token for good: its requests are answered 401",
		serve: (*api).revokeOperator, answer: client.RevokedToken{}},
	{method: "GET", path: "/api/audit", summary: "The audit log of operator actions, newest first; next_cursor continues",
		serve: (*api).listAudit,
		query: []docParam{{"limit", "at most this many entries (1 to 1000, default 100)"}, {"cursor", "next_cursor of the previous page"},
			{"since", "recorded at or after an RFC 3339 time, or within a duration (24h)"}, {"actor", "only this operator token's actions"},
			{"action", "only this action (run.submit, run.cancel, step.approve, step.reject, token.create, token.revoke, operator-token.create, operator-token.revoke, ...)"}},
		answer: client.AuditList{}},
	{method: "PUT", path: "/api/secrets/{name}", summary: "Store a secret: the body is its value (at most 64 KiB), sealed at rest; the answer never holds it (SPEC §14a)",
		serve: (*api).putSecret, limit: func(*Options) int64 { return core.MaxSecretBytes }, request: "application/octet-stream", answer: client.Secret{}},
	{method: "GET", path: "/api/secrets", summary: "List secrets: names, sizes, times (never a value)",
		serve: (*api).listSecrets, answer: client.SecretList{}},
	{method: "DELETE", path: "/api/secrets/{name}", summary: "Remove a secret",
		serve: (*api).removeSecret, answer: client.RemovedSecret{}},
	{method: "POST", path: "/api/schedules", summary: "Create a cron schedule of a workflow (SPEC §8a): {name, cron, tz, catch_up, file, workflow}",
		serve: (*api).createSchedule, limit: func(o *Options) int64 { return 2*workflow.MaxSize + 4096 },
		request: client.ScheduleRequest{}, status: http.StatusCreated, answer: client.Schedule{}},
	{method: "GET", path: "/api/schedules", summary: "List cron schedules, by name",
		serve: func(a *api, r *http.Request) (int, any, error) { return a.listSchedules(r.Context()) }, answer: client.ScheduleList{}},
	{method: "GET", path: "/api/schedules/{name}", summary: "A cron schedule and its next five fire times",
		serve: (*api).showSchedule, answer: client.Schedule{}},
	{method: "POST", path: "/api/schedules/{name}/pause", summary: "Pause a schedule: it fires no more until resumed",
		serve:  func(a *api, r *http.Request) (int, any, error) { return a.changeSchedule(r, core.SchedulePause) },
		answer: client.Schedule{}},
	{method: "POST", path: "/api/schedules/{name}/resume", summary: "Resume a schedule; fire times in the pause are not caught up",
		serve:  func(a *api, r *http.Request) (int, any, error) { return a.changeSchedule(r, core.ScheduleResume) },
		answer: client.Schedule{}},
	{method: "DELETE", path: "/api/schedules/{name}", summary: "Delete a schedule; its runs are left alone",
		serve:  func(a *api, r *http.Request) (int, any, error) { return a.changeSchedule(r, core.ScheduleDelete) },
		answer: client.DeletedSchedule{}},
	{method: "GET", path: "/api/workers", summary: "List enrolled worker instances",
		serve: func(a *api, r *http.Request) (int, any, error) { return a.listWorkers(r.Context()) }, answer: client.WorkerList{}},
	{method: "PUT", path: "/api/bundles", summary: "Upload a bundle (a tar is indexed); 201 when new, 200 when it existed",
		serve: (*api).putBundle, slowBody: true, limit: func(o *Options) int64 {
			if o.MaxBundleBody > 0 {
				return o.MaxBundleBody
			}
			return MaxAPIBody
		}, request: "application/octet-stream", status: http.StatusCreated, answer: client.Bundle{}, also200: "the bundle was already stored"},
	{method: "GET", path: "/api/bundles/{fingerprint}", summary: "A bundle's description",
		serve: func(a *api, r *http.Request) (int, any, error) { return a.showBundle(r.PathValue("fingerprint")) }, answer: client.Bundle{}},
	{method: "GET", path: "/api/data", summary: "Query data versions, sorted by (id, version); next continues (the data plane's GET /data, for operators)",
		raw: (*api).dataRead, query: []docParam{{"prefix", "ids starting with this"}, {"run", "written by this run"}, {"step", "written by this step (run/name)"},
			{"since", "created at or after an RFC 3339 time"}, {"until", "created before an RFC 3339 time"}, {"attr.KEY", "with attribute KEY of this value"},
			{"limit", "at most this many versions (1 to 1000, default 100)"}, {"after", "next of the previous page"}},
		answer: dataplane.Query{}},
	{method: "GET", path: "/api/data/{id}", summary: "A data item's versions and append stream (the data plane's read, for operators)",
		raw: (*api).dataRead, answer: client.DataVersions{}},
	{method: "GET", path: "/api/data/{id}/{version}", summary: "A data item's bytes: {version} is a number, latest, or append (its stream; ?offset=)",
		raw: (*api).dataRead, query: []docParam{{"offset", "append stream: start at this byte"}}, answer: "application/octet-stream"},
	{method: "GET", path: "/api/runs/{id}/events", summary: "A run live (Server-Sent Events): its steps' states, server events, log lines and gap markers, then end; resumes by Last-Event-ID (SPEC §17)",
		raw: (*api).runEvents, noDeadline: true, session: true, answer: "text/event-stream"},
	{method: "GET", path: "/api/events", summary: "The whole server live (Server-Sent Events): runs' states, server events, workers; resumes by Last-Event-ID (SPEC §17)",
		raw: (*api).serverEvents, noDeadline: true, session: true, answer: "text/event-stream"},
	{method: "GET", path: "/api/store/backup", summary: "A consistent backup of the store, its blobs included (no answer deadline)",
		raw: (*api).backup, noDeadline: true, full: true, answer: "application/x-tar"},
	{method: "GET", path: "/api/openapi.json", summary: "This document (no admin token needed)",
		raw: (*api).openAPI, public: true, answer: "application/json"},
}

// pathStep is the step id of /api/steps/{run}/{step}/...: "run-1/name".
func pathStep(r *http.Request) core.StepID {
	return core.StepID(r.PathValue("run") + "/" + r.PathValue("step"))
}

// routeMux is the server's ServeMux, remembering its patterns so that a
// test can hold them against the OpenAPI document.
type routeMux struct {
	*http.ServeMux
	patterns []string
}

func newRouteMux() *routeMux { return &routeMux{ServeMux: http.NewServeMux()} }

func (m *routeMux) Handle(pattern string, h http.Handler) {
	m.patterns = append(m.patterns, pattern)
	m.ServeMux.Handle(pattern, h)
}

func (m *routeMux) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request)) {
	m.Handle(pattern, http.HandlerFunc(h))
}

// apiCatchAll is the pattern of every /api/ path no route serves: a JSON
// 401, 405 (with Allow) or 404.
const apiCatchAll = "/api/"

// ---- handler ----

type api struct {
	d    *Driver
	mux  *routeMux
	open bool   // false: an empty admin token admits nobody
	doc  []byte // the OpenAPI document (openapi.go)
}

// APIHandler returns the operator API on a ServeMux of its own,
// authenticated with the driver's operator tokens (an empty adminToken
// refuses every request).
// Start registers the same routes on its server's mux (routes) when
// Options.AdminToken is set.
func (d *Driver) APIHandler(adminToken string) http.Handler {
	mux := newRouteMux()
	d.registerAPI(mux, adminToken)
	return mux
}

// routes registers the operator API on the server's mux when
// Options.AdminToken is set (Start).
func (d *Driver) routes(mux *routeMux) {
	if d.opts.AdminToken != "" {
		d.registerAPI(mux, d.opts.AdminToken)
	}
}

// registerAPI registers the operator API on mux: each apiRoutes entry as a
// method-and-path pattern, and the catch-all.
func (d *Driver) registerAPI(mux *routeMux, adminToken string) {
	a := &api{d: d, mux: mux, open: adminToken != ""}
	a.doc = openAPIDocument(apiRoutes)
	for _, rt := range apiRoutes {
		mux.Handle(rt.method+" "+rt.path, a.handler(rt))
	}
	mux.HandleFunc(apiCatchAll, a.unrouted)
}

// httpError is an error with its status code; its answer's Code is
// client.CodeFor(code).
type httpError struct {
	code  int
	msg   string
	allow string // 405: the allowed methods
}

func (e *httpError) Error() string { return e.msg }

func errorf(code int, format string, args ...any) error {
	return &httpError{code: code, msg: fmt.Sprintf(format, args...)}
}

// writeError answers he as {"code", "message", "error"}.
func writeError(w http.ResponseWriter, he *httpError, realm string) {
	if he.allow != "" {
		w.Header().Set("Allow", he.allow)
	}
	if he.code == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="`+realm+`"`)
	}
	writeJSON(w, he.code, APIError{Code: client.CodeFor(he.code), Message: he.msg, Error: he.msg})
}

// authorized finds the request's live operator token (SPEC §15a).
func (a *api) authorized(r *http.Request) (core.OperatorRecord, bool) {
	if !a.open {
		return core.OperatorRecord{}, false
	}
	return a.d.operator(bearer(r))
}

var errUnauthorized = &httpError{code: http.StatusUnauthorized, msg: "missing, wrong or revoked operator token (send Authorization: Bearer <operator token>, the admin token for one)"}

// fail answers an error of a request.
func (a *api) fail(w http.ResponseWriter, r *http.Request, err error) {
	var he *httpError
	if !errors.As(err, &he) {
		he = a.classify(err)
	}
	if he.code >= 500 {
		a.d.log.Warn("operator API request failed", "method", r.Method, "path", r.URL.Path, "status", he.code, "err", he.msg)
	}
	writeError(w, he, "tether")
}

// handler wraps a route: the admin token, the answer deadline, the body's
// limit and deadlines, and the JSON answer.
func (a *api) handler(rt apiRoute) http.Handler {
	changes := rt.method != http.MethodGet || rt.full
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		op, ok := a.authorized(r)
		if !rt.public && !ok && !(rt.session && a.d.OperatorAuthorized(r)) {
			a.fail(w, r, errUnauthorized)
			return
		}
		if changes && op.ReadOnly {
			a.refused(r, op.Name, errForbidden)
			a.fail(w, r, errForbidden)
			return
		}
		// The core records the call's actor; the API audits the refusals
		// the core never saw (SPEC §15a).
		note := &auditNote{}
		r = r.WithContext(context.WithValue(WithActor(r.Context(), op.Name), noteKey{}, note))
		if !rt.noDeadline {
			wait := apiTimeout
			if rt.slowBody {
				wait += a.d.opts.bundleBody // its body first, then its answer
			}
			ctx, cancel := context.WithTimeout(r.Context(), wait)
			defer cancel()
			r = r.WithContext(ctx)
		}
		if rt.raw != nil {
			rt.raw(a, w, r)
			return
		}
		limit := int64(MaxAPIBody)
		if rt.limit != nil {
			limit = rt.limit(&a.d.opts)
		}
		if rt.slowBody && r.Body != http.NoBody {
			// A bundle may take longer to arrive than the body deadline
			// every request got (Driver.bodyDeadline, SPEC §12); only an
			// operator's request gets this far.
			_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(a.d.opts.bundleBody))
		}
		if r.ContentLength > limit {
			err := tooLarge(r.ContentLength, limit)
			if changes {
				a.refused(r, op.Name, err)
			}
			a.fail(w, r, err)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, limit)
		if rt.slowBody {
			// A bundle's body must keep arriving, like a data write's, and
			// all of it within bundleBodyTimeout (SPEC §12, §14).
			r.Body = &idleBody{r: r.Body, rc: http.NewResponseController(w), idle: a.d.opts.BodyIdleTimeout, end: time.Now().Add(a.d.opts.bundleBody)}
		}
		status, body, err := rt.serve(a, r)
		if s, ok := body.(jsonStreamer); ok && err == nil {
			sent, serr := writeStream(w, status, s)
			switch {
			case serr == nil:
				return
			case !sent: // nothing of the answer left: an error answer instead
				err = serr
			default:
				// The status is gone: cut the answer, so that the client
				// sees a broken one rather than a short one that parses.
				a.d.log.Warn("answer cut", "method", r.Method, "path", r.URL.Path, "err", serr)
				panic(http.ErrAbortHandler)
			}
		}
		if err != nil {
			if changes && !note.decided {
				a.refused(r, op.Name, err)
			}
			a.fail(w, r, err)
			return
		}
		writeJSON(w, status, body)
	})
}

// probeMethods are the methods unrouted tries for a 405's Allow.
var probeMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}

// unrouted answers an /api/ request no route matched: 401 without the admin
// token, 405 with Allow when the path is served for other methods, else 404.
func (a *api) unrouted(w http.ResponseWriter, r *http.Request) {
	if _, ok := a.authorized(r); !ok {
		a.fail(w, r, errUnauthorized)
		return
	}
	var allow []string
	for _, m := range probeMethods {
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pat := a.mux.Handler(probe); pat != "" && pat != apiCatchAll {
			allow = append(allow, m)
		}
	}
	if len(allow) > 0 {
		list := strings.Join(allow, ", ")
		a.fail(w, r, &httpError{code: http.StatusMethodNotAllowed, msg: fmt.Sprintf("method %s is not allowed on %s (allowed: %s)", r.Method, core.Quote(r.URL.Path), list), allow: list})
		return
	}
	a.fail(w, r, errorf(http.StatusNotFound, "no such endpoint: %s %s (GET /api/openapi.json lists them)", r.Method, core.Quote(r.URL.Path)))
}

// dataRead answers the data plane's reads for operators: the same routes
// and answers (data.go), with the admin token instead of a session
// credential.
func (a *api) dataRead(w http.ResponseWriter, r *http.Request) {
	(&dataPlane{d: a.d}).serveOperator(w, r, strings.TrimPrefix(r.URL.Path, "/api"))
}

// classify maps an error of the driver to a status.
func (a *api) classify(err error) *httpError {
	var mbe *http.MaxBytesError
	var ref *Refusal
	switch {
	case errors.As(err, &mbe):
		return &httpError{code: http.StatusRequestEntityTooLarge, msg: fmt.Sprintf("request body larger than %d bytes", mbe.Limit)}
	case errors.As(err, &ref):
		return &httpError{code: codeStatus(ref.Code), msg: err.Error()} // the core's code (SPEC §15)
	case errors.Is(err, ErrRefused):
		return &httpError{code: http.StatusConflict, msg: err.Error()}
	case errors.Is(err, ErrNoSecrets):
		return &httpError{code: http.StatusServiceUnavailable, msg: err.Error()} // SPEC §15: unavailable
	case errors.Is(err, ErrClosed):
		return &httpError{code: http.StatusServiceUnavailable, msg: "the orchestrator is stopping"}
	case errors.Is(err, context.DeadlineExceeded):
		return &httpError{code: http.StatusServiceUnavailable, msg: "the orchestrator did not answer in time"}
	case errors.Is(err, context.Canceled):
		return &httpError{code: http.StatusServiceUnavailable, msg: "request cancelled"}
	}
	return &httpError{code: http.StatusInternalServerError, msg: err.Error()}
}

// jsonStreamer is an answer too long to hold whole: it writes itself,
// as json.MarshalIndent would, to a buffer writeStream flushes as it fills.
type jsonStreamer interface {
	streamJSON(w *bufio.Writer) error
}

// writeStream writes s's answer with writeJSON's headers, which go out
// with its first bytes (streamAnswerBuffer of them, or all): so an error
// before that (sent false) can still be answered as an error.
func writeStream(w http.ResponseWriter, code int, s jsonStreamer) (sent bool, err error) {
	lw := &lazyHeader{w: w, code: code}
	bw := bufio.NewWriterSize(lw, streamAnswerBuffer)
	if err := s.streamJSON(bw); err != nil {
		return lw.sent, err
	}
	bw.WriteString("\n")
	return true, bw.Flush()
}

// streamAnswerBuffer is how much of a streamed answer is held before it
// is written.
const streamAnswerBuffer = 64 << 10

// lazyHeader writes the answer's headers and status with its first bytes.
type lazyHeader struct {
	w    http.ResponseWriter
	code int
	sent bool
}

func (l *lazyHeader) Write(b []byte) (int, error) {
	if !l.sent {
		l.sent = true
		jsonHeaders(l.w.Header())
		l.w.WriteHeader(l.code)
	}
	return l.w.Write(b)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		code, b = http.StatusInternalServerError, []byte(`{"code": "internal", "message": "cannot encode the answer", "error": "cannot encode the answer"}`)
	}
	jsonHeaders(w.Header())
	w.WriteHeader(code)
	w.Write(append(b, '\n'))
}

// jsonHeaders are the headers of every JSON answer.
func jsonHeaders(h http.Header) {
	h.Set("Content-Type", "application/json; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
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
	parent := core.RunID(r.URL.Query().Get("parent"))
	if parent != "" {
		var live, finished bool
		if err := a.d.Snapshot(r.Context(), func(o *core.Orchestrator) {
			if rec, _, ok := o.Run(parent); ok {
				live, finished = true, rec.Finished
			}
		}); err != nil {
			return 0, nil, err
		}
		if !live {
			if _, archived, err := a.history(parent); err != nil {
				return 0, nil, err
			} else if archived {
				return 0, nil, errorf(http.StatusConflict, "parent run %s already finished (archived)", parent)
			}
			return 0, nil, errorf(http.StatusNotFound, "unknown parent run %s", core.Quote(string(parent)))
		}
		if finished {
			return 0, nil, errorf(http.StatusConflict, "parent run %s already finished", parent)
		}
	}
	run, err := a.d.SubmitChild(r.Context(), spec, parent)
	if errors.Is(err, ErrRefused) {
		if errors.As(err, new(parentError)) {
			return 0, nil, errorf(http.StatusConflict, "%v", err) // finished or cancelled meanwhile, or full
		}
		return 0, nil, errorf(http.StatusBadRequest, "%v", err)
	}
	if err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, APISubmitted{Run: string(run)}, nil
}

func (a *api) showRun(ctx context.Context, id core.RunID) (int, any, error) {
	var names map[core.WorkerID]string
	src, err := a.runSource(ctx, id, liveSource, func(o *core.Orchestrator) {
		names = map[core.WorkerID]string{}
		for _, w := range o.Workers() {
			names[w.ID] = w.Name
		}
	})
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, src.detail(names), nil
}

// runSource reads run id with live from a snapshot of the core (also
// calling also, if not nil, in that snapshot), or from its history record
// once archived: the store has it, as the batch that archived it was
// durable before the snapshot ran. An unknown run is 404.
func (a *api) runSource(ctx context.Context, id core.RunID, live func(*core.Orchestrator, core.RunID) (runSource, bool), also func(*core.Orchestrator)) (runSource, error) {
	var src runSource
	found := false
	err := a.d.Snapshot(ctx, func(o *core.Orchestrator) {
		src, found = live(o, id)
		if also != nil {
			also(o)
		}
	})
	if err != nil || found {
		return src, err
	}
	h, ok, err := a.history(id)
	if err != nil {
		return runSource{}, err
	}
	if !ok {
		return runSource{}, errorf(http.StatusNotFound, "unknown run %q", id)
	}
	return archivedSource(h), nil
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

// logsAnswer is GET /api/runs/{id}/logs's answer, written a line at a
// time (jsonStreamer): the lines of a live run from views of its leases'
// logs (shared with the core, read off the loop), an archived run's a page
// at a time from the store. What the answer holds at once is a page, not
// the log, however long (SPEC §15).
type logsAnswer struct {
	run, step string
	views     [][]core.StepLogLine // a live run's
	a         *api                 // an archived run's: src's steps' pages
	src       *runSource
	steps     []core.StepID
}

// streamJSON writes the answer as writeJSON would write an APILogs.
func (l *logsAnswer) streamJSON(w *bufio.Writer) error {
	head := APILogs{Run: l.run, Step: l.step}
	b, err := json.MarshalIndent(head, "", "  ")
	if err != nil {
		return err
	}
	// head ends `"lines": null` then "\n}": the lines go in its place.
	b = bytes.TrimSuffix(b, []byte("null\n}"))
	w.Write(b)
	n := 0
	lines := func(ls []core.StepLogLine) error {
		for _, ln := range ls {
			b, err := json.MarshalIndent(logLine(ln), "    ", "  ")
			if err != nil {
				return err
			}
			if n == 0 {
				w.WriteString("[\n    ")
			} else {
				w.WriteString(",\n    ")
			}
			n++
			if _, err := w.Write(b); err != nil {
				return err
			}
		}
		return nil
	}
	for _, v := range l.views {
		if err := lines(v); err != nil {
			return err
		}
	}
	if l.a != nil {
		if err := l.a.eachArchivedPage(l.src, l.steps, lines); err != nil {
			return err
		}
	}
	if n == 0 {
		w.WriteString("[]\n}")
	} else {
		w.WriteString("\n  ]\n}")
	}
	return nil
}

func (a *api) logs(ctx context.Context, id core.RunID, step string) (int, any, error) {
	out := &logsAnswer{run: string(id), step: step}
	var src runSource
	found, matched := false, false
	err := a.d.Snapshot(ctx, func(o *core.Orchestrator) {
		if src, found = liveSource(o, id); !found {
			return
		}
		steps := src.matchSteps(step)
		matched = len(steps) > 0
		for _, sid := range steps {
			for _, l := range src.leases { // by id
				if l.Step == sid {
					out.views = append(out.views, o.LeaseLogsView(l.ID, 0)) // read off the loop
				}
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
			out.a, out.src, out.steps = a, &src, steps
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
	var tok string
	if req.IntoSecret != "" {
		err = a.d.CreateTokenIntoSecret(r.Context(), req.Name, ttl, req.IntoSecret, "", 0)
	} else {
		tok, err = a.d.CreateToken(r.Context(), req.Name, ttl)
	}
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
	return http.StatusCreated, APICreatedToken{Name: req.Name, Token: tok, IntoSecret: req.IntoSecret, ExpiresAt: exp}, nil
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
	return http.StatusOK, client.RevokedToken{Revoked: name}, nil
}

func (a *api) listWorkers(ctx context.Context) (int, any, error) {
	out := APIWorkerList{Workers: []APIWorker{}}
	err := a.d.Snapshot(ctx, func(o *core.Orchestrator) {
		for _, w := range o.Workers() {
			v := APIWorker{
				ID: string(w.ID), Name: w.Name, Connected: w.Connected, Token: w.Token,
				Tags: append([]string{}, w.Tags...), Labels: w.Labels, Platform: w.Platform,
				Slots: w.Slots, Ahead: w.Ahead, Leases: w.Leases, Scaler: w.Scaler, LastHeartbeat: w.LastHeartbeat,
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
	m, err := a.d.st.Bundle(fp)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return 0, nil, errorf(http.StatusNotFound, "unknown bundle %s", fp)
	case err != nil:
		return 0, nil, errorf(http.StatusBadRequest, "%s", strings.TrimPrefix(err.Error(), "store: "))
	}
	return http.StatusOK, m, nil
}
