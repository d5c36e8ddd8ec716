package orchestrator

// The web status page (SPEC §18), mounted at / on the control plane's
// server when Options.AdminToken is set: server-rendered pages
// (html/template, embedded; no build step) and a little plain JavaScript
// (web/app.js) that follows the live streams with EventSource.
//
//	GET  /login, POST /login     an operator token in a form → a session cookie
//	POST /logout
//	GET  /                       runs, newest first (?status=, ?name=, ?cursor=, ?limit=)
//	GET  /runs/{id}              one run: its DAG, its steps, its log, its server events
//	GET  /events                 the server events of the latest runs
//	GET  /workers                the workers
//	GET  /tokens                 the enrollment tokens (never a secret)
//	POST /runs/{id}/cancel       form: csrf, reason
//	POST /steps/approve          form: csrf, step
//	POST /steps/reject           form: csrf, step
//	GET  /static/{file}          the style sheet and the script
//
// Every read and every action is a call of the operator API (api.go),
// made in-process with the session's own operator token: the page has no read path of its
// own. Sessions live in memory only (a restart logs everyone out), at most
// MaxWebSessions of them; every POST is checked for its origin
// (http.CrossOriginProtection: Sec-Fetch-Site, Origin) and, but the login,
// for the session's CSRF token, compared in constant time.

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Web page limits.
const (
	// MaxWebSessions bounds the sessions kept in memory; a login past it
	// ends the session closest to its expiry.
	MaxWebSessions = 64
	// WebSessionTTL is a session's lifetime from its login.
	WebSessionTTL = 12 * time.Hour
	// maxWebForm bounds a form's body.
	maxWebForm = 64 << 10
	// webEventRuns is how many of the latest runs the events page reads.
	webEventRuns = 20
	// webRunsPage is the runs page's default page size.
	webRunsPage = 50
	// sessionCookie names the session cookie.
	sessionCookie = "tether_session"
)

//go:embed web
var webFiles embed.FS

// webSession is a logged-in browser: the operator token it logged in with
// (kept in memory only) makes its API calls, so the audit log names that
// token and a read-only one can view but not act (SPEC §15a, §18).
type webSession struct {
	csrf    string
	expires time.Time
	token   string
}

type sessionKey struct{}

// withSession puts a request's session in its context, for call.
func withSession(r *http.Request, s *webSession) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), sessionKey{}, s))
}

type web struct {
	d     *Driver
	api   http.Handler // serves /api/...
	open  bool         // false (no admin token): nobody logs in
	pages map[string]*template.Template
	xo    *http.CrossOriginProtection
	mux   *http.ServeMux

	mu       sync.Mutex
	sessions map[[32]byte]*webSession // by the SHA-256 of the session id
}

// newWeb builds the status page over api, the handler of /api/.
func newWeb(d *Driver, adminToken string, api http.Handler) *web {
	w := &web{
		d: d, api: api, open: adminToken != "",
		pages: map[string]*template.Template{}, xo: http.NewCrossOriginProtection(),
		sessions: map[[32]byte]*webSession{},
	}
	funcs := template.FuncMap{
		"when":  fmtWhen,
		"took":  fmtTook,
		"deref": func(p *int) int { return *p },
		"join":  func(s []string) string { return strings.Join(s, ", ") },
	}
	for _, p := range []string{"login", "runs", "run", "events", "workers", "tokens", "error"} {
		w.pages[p] = template.Must(template.New("layout.html").Funcs(funcs).ParseFS(webFiles, "web/layout.html", "web/"+p+".html"))
	}
	static, _ := fs.Sub(webFiles, "web/static")
	m := http.NewServeMux()
	m.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	m.HandleFunc("GET /login", w.loginPage)
	m.HandleFunc("POST /login", w.login)
	m.HandleFunc("POST /logout", w.logout)
	m.HandleFunc("GET /{$}", w.page(w.runs))
	m.HandleFunc("GET /runs/{id}", w.page(w.run))
	m.HandleFunc("GET /events", w.page(w.events))
	m.HandleFunc("GET /workers", w.page(w.workers))
	m.HandleFunc("GET /tokens", w.page(w.tokens))
	m.HandleFunc("POST /runs/{id}/cancel", w.action(w.cancel))
	m.HandleFunc("POST /steps/approve", w.action(w.gate(true)))
	m.HandleFunc("POST /steps/reject", w.action(w.gate(false)))
	m.HandleFunc("/", func(rw http.ResponseWriter, r *http.Request) {
		w.render(rw, r, http.StatusNotFound, "error", nil, errPage{Code: http.StatusNotFound, Message: "no such page: " + r.URL.Path})
	})
	w.mux = m
	return w
}

func (w *web) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	h := rw.Header()
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	if r.Method == http.MethodPost {
		// Every POST, the login's too, must come from this site's own pages.
		if err := w.xo.Check(r); err != nil {
			w.render(rw, r, http.StatusForbidden, "error", nil, errPage{Code: http.StatusForbidden, Message: "refused: " + err.Error()})
			return
		}
		r.Body = http.MaxBytesReader(rw, r.Body, maxWebForm)
	}
	w.mux.ServeHTTP(rw, r)
}

// ---- sessions ----

func (w *web) newSession(now time.Time, token string) (id string, s *webSession) {
	var b [32]byte
	rand.Read(b[:])
	id = base64.RawURLEncoding.EncodeToString(b[:])
	rand.Read(b[:])
	s = &webSession{csrf: base64.RawURLEncoding.EncodeToString(b[:]), expires: now.Add(WebSessionTTL), token: token}
	w.mu.Lock()
	defer w.mu.Unlock()
	for k, v := range w.sessions {
		if !now.Before(v.expires) {
			delete(w.sessions, k)
		}
	}
	for len(w.sessions) >= MaxWebSessions {
		var oldest [32]byte
		first := true
		for k, v := range w.sessions {
			if first || v.expires.Before(w.sessions[oldest].expires) {
				oldest, first = k, false
			}
		}
		delete(w.sessions, oldest)
	}
	w.sessions[sha256.Sum256([]byte(id))] = s
	return id, s
}

// session returns the request's live session, or nil.
func (w *web) session(r *http.Request) *webSession {
	c, err := r.Cookie(sessionCookie)
	if err != nil || c.Value == "" {
		return nil
	}
	k := sha256.Sum256([]byte(c.Value))
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.sessions[k]
	if s == nil {
		return nil
	}
	if _, live := w.d.operator(s.token); !live || !time.Now().Before(s.expires) {
		delete(w.sessions, k) // expired, or its token was revoked
		return nil
	}
	return s
}

// WebSessions returns how many status page sessions are held.
func (d *Driver) WebSessions() int {
	if d.web == nil {
		return 0
	}
	d.web.mu.Lock()
	defer d.web.mu.Unlock()
	return len(d.web.sessions)
}

// OperatorAuthorized says whether r carries a live operator token as a
// bearer token or the cookie of a live web session: the check of the read-only
// stream routes, which the status page's EventSource reads with its
// cookie. Routes that change anything take the bearer token only.
func (d *Driver) OperatorAuthorized(r *http.Request) bool {
	if d.web == nil {
		return false
	}
	if tok := bearer(r); tok != "" {
		return d.web.operatorToken(tok)
	}
	return d.web.session(r) != nil
}

func (w *web) operatorToken(tok string) bool {
	_, ok := w.d.operator(tok)
	return ok && w.open
}

func (w *web) cookie(r *http.Request, value string, maxAge int) *http.Cookie {
	return &http.Cookie{
		Name: sessionCookie, Value: value, Path: "/", MaxAge: maxAge,
		HttpOnly: true, Secure: w.d.opts.TLS != nil || r.TLS != nil, SameSite: http.SameSiteStrictMode,
	}
}

// ---- login ----

type loginData struct {
	Error string
	Next  string
}

func (w *web) loginPage(rw http.ResponseWriter, r *http.Request) {
	w.render(rw, r, http.StatusOK, "login", nil, loginData{Next: safeNext(r.URL.Query().Get("next"))})
}

func (w *web) login(rw http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		w.render(rw, r, http.StatusBadRequest, "login", nil, loginData{Error: "the form could not be read"})
		return
	}
	next := safeNext(r.PostForm.Get("next"))
	tok := r.PostForm.Get("token")
	if !w.operatorToken(tok) {
		w.render(rw, r, http.StatusUnauthorized, "login", nil, loginData{Error: "wrong or revoked operator token", Next: next})
		return
	}
	id, _ := w.newSession(time.Now(), tok)
	http.SetCookie(rw, w.cookie(r, id, int(WebSessionTTL/time.Second)))
	http.Redirect(rw, r, next, http.StatusSeeOther)
}

func (w *web) logout(rw http.ResponseWriter, r *http.Request) {
	s := w.session(r)
	if err := r.ParseForm(); err != nil { // over 64 KiB, or not a form (SPEC §18: 400)
		w.render(rw, r, http.StatusBadRequest, "error", nil, errPage{Code: http.StatusBadRequest, Message: "the form could not be read: " + err.Error()})
		return
	}
	if s == nil || !w.csrfOK(r, s) {
		w.render(rw, r, http.StatusForbidden, "error", nil, errPage{Code: http.StatusForbidden, Message: "refused: no session, or the form's CSRF token is wrong"})
		return
	}
	if c, err := r.Cookie(sessionCookie); err == nil {
		w.mu.Lock()
		delete(w.sessions, sha256.Sum256([]byte(c.Value)))
		w.mu.Unlock()
	}
	http.SetCookie(rw, w.cookie(r, "", -1))
	http.Redirect(rw, r, "/login", http.StatusSeeOther)
}

// safeNext keeps a redirect target on this site (SPEC §18): a path, read
// as a browser will read it. A browser drops tabs and newlines from a URL
// and reads '\\' as '/', so "/\t/host" and "/\\host" are "//host", another
// site: no control byte and no backslash at all, and what is left must
// parse as a path alone (no scheme, no host) starting with one '/'.
func safeNext(next string) string {
	for i := 0; i < len(next); i++ {
		if c := next[i]; c < 0x20 || c == 0x7f || c == '\\' {
			return "/"
		}
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.Opaque != "" || !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") {
		return "/"
	}
	return next
}

func (w *web) csrfOK(r *http.Request, s *webSession) bool {
	got := r.PostForm.Get("csrf")
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(s.csrf)) == 1
}

// ---- pages and actions ----

// page wraps a page's handler: without a session, to the login page.
func (w *web) page(f func(r *http.Request) (string, any, error)) http.HandlerFunc {
	return func(rw http.ResponseWriter, r *http.Request) {
		s := w.session(r)
		if s == nil {
			http.Redirect(rw, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
			return
		}
		name, data, err := f(withSession(r, s))
		if err != nil {
			w.fail(rw, r, s, err)
			return
		}
		w.render(rw, r, http.StatusOK, name, s, data)
	}
}

// action wraps a form's handler: a session and its CSRF token are
// required; success redirects to the page f names.
func (w *web) action(f func(r *http.Request) (string, error)) http.HandlerFunc {
	return func(rw http.ResponseWriter, r *http.Request) {
		s := w.session(r)
		if s == nil {
			w.render(rw, r, http.StatusUnauthorized, "error", nil, errPage{Code: http.StatusUnauthorized, Message: "not logged in (or the session expired): log in again"})
			return
		}
		if err := r.ParseForm(); err != nil {
			w.fail(rw, r, s, &webError{code: http.StatusBadRequest, msg: "the form could not be read: " + err.Error()})
			return
		}
		if !w.csrfOK(r, s) {
			w.render(rw, r, http.StatusForbidden, "error", s, errPage{Code: http.StatusForbidden, Message: "refused: the form's CSRF token is missing or wrong (reload the page)"})
			return
		}
		to, err := f(withSession(r, s))
		if err != nil {
			w.fail(rw, r, s, err)
			return
		}
		http.Redirect(rw, r, to, http.StatusSeeOther)
	}
}

// webError is an API call's refusal, shown on an error page.
type webError struct {
	code int
	msg  string
}

func (e *webError) Error() string { return e.msg }

type errPage struct {
	Code    int
	Message string
}

func (w *web) fail(rw http.ResponseWriter, r *http.Request, s *webSession, err error) {
	var we *webError
	if !errors.As(err, &we) {
		we = &webError{code: http.StatusInternalServerError, msg: err.Error()}
	}
	w.render(rw, r, we.code, "error", s, errPage{Code: we.code, Message: we.msg})
}

type layoutData struct {
	Page     string
	CSRF     string
	Authed   bool
	ReadOnly bool // the session's token may view but not act: no action forms
	Data     any
}

func (w *web) render(rw http.ResponseWriter, r *http.Request, code int, page string, s *webSession, data any) {
	ld := layoutData{Page: page, Data: data}
	if s != nil {
		ld.CSRF, ld.Authed = s.csrf, true
		if op, ok := w.d.operator(s.token); ok {
			ld.ReadOnly = op.ReadOnly
		}
	}
	var b bytes.Buffer
	if err := w.pages[page].Execute(&b, ld); err != nil {
		w.d.log.Warn("web page failed to render", "page", page, "err", err)
		http.Error(rw, "the page failed to render", http.StatusInternalServerError)
		return
	}
	rw.Header().Set("Content-Type", "text/html; charset=utf-8")
	rw.WriteHeader(code)
	rw.Write(b.Bytes())
}

// call makes one operator API call in-process, with the token of the
// request's session (withSession), and decodes its answer into out; a
// refusal is a webError with its message.
func (w *web) call(ctx context.Context, method, path string, body any, out any) error {
	var rd io.Reader = http.NoBody
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "/api"+path, rd)
	if err != nil {
		return &webError{code: http.StatusBadRequest, msg: err.Error()}
	}
	s, _ := ctx.Value(sessionKey{}).(*webSession)
	if s == nil {
		return &webError{code: http.StatusUnauthorized, msg: "not logged in"}
	}
	req.Header.Set("Authorization", "Bearer "+s.token)
	rec := &memResponse{h: http.Header{}, code: http.StatusOK}
	if !serveIn(w.api, rec, req) {
		return &webError{code: http.StatusInternalServerError, msg: "the answer was cut short (the orchestrator's log says why)"}
	}
	if rec.code >= 400 {
		var e struct {
			Error   any    `json:"error"`
			Message string `json:"message"`
		}
		msg := strings.TrimSpace(rec.body.String())
		if json.Unmarshal(rec.body.Bytes(), &e) == nil {
			switch v := e.Error.(type) {
			case string:
				msg = v
			case map[string]any:
				if m, ok := v["message"].(string); ok {
					msg = m
				}
			}
			if e.Message != "" {
				msg = e.Message
			}
		}
		return &webError{code: rec.code, msg: msg}
	}
	if out != nil {
		return json.Unmarshal(rec.body.Bytes(), out)
	}
	return nil
}

// serveIn serves req into rec; false if the handler cut its answer
// (http.ErrAbortHandler, as a streamed answer that failed midway does).
func serveIn(h http.Handler, rec *memResponse, req *http.Request) (whole bool) {
	defer func() {
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler {
				panic(v)
			}
			whole = false
		}
	}()
	h.ServeHTTP(rec, req)
	return true
}

// memResponse is an in-memory http.ResponseWriter.
type memResponse struct {
	h    http.Header
	code int
	body bytes.Buffer
}

func (m *memResponse) Header() http.Header         { return m.h }
func (m *memResponse) Write(b []byte) (int, error) { return m.body.Write(b) }
func (m *memResponse) WriteHeader(code int)        { m.code = code }

// ---- the pages ----

type runsData struct {
	Runs     []APIRun
	Status   string
	Name     string
	Statuses []string
	Next     string // the next page's query, if any
}

func (w *web) runs(r *http.Request) (string, any, error) {
	in := r.URL.Query()
	q := url.Values{}
	for _, k := range []string{"status", "name", "cursor", "limit", "since"} {
		if v := in.Get(k); v != "" {
			q.Set(k, v)
		}
	}
	if q.Get("limit") == "" {
		q.Set("limit", strconv.Itoa(webRunsPage))
	}
	var list APIRunList
	if err := w.call(r.Context(), http.MethodGet, "/runs?"+q.Encode(), nil, &list); err != nil {
		return "", nil, err
	}
	out := runsData{Runs: list.Runs, Status: in.Get("status"), Name: in.Get("name"), Statuses: runStatuses}
	if list.NextCursor != "" {
		q.Set("cursor", list.NextCursor)
		out.Next = "/?" + q.Encode()
	}
	return "runs", out, nil
}

// dagStep is one box of a run's DAG.
type dagStep struct {
	APIStep
	After []string // the names of the steps it depends on
}

type runData struct {
	Detail   APIRunDetail
	Finished bool
	Layers   [][]dagStep
	Logs     []webLine
	Names    map[string]string // step id → its name as shown
	Workers  []APIWorker       // for the script: a stream names workers by id
}

// webLine is a log line with its key: its lease and its place in that
// lease's log, as the live stream numbers it (index), so the script does
// not add a line the page already shows.
type webLine struct {
	APILogLine
	Key string
}

func (w *web) run(r *http.Request) (string, any, error) {
	id := r.PathValue("id")
	var det APIRunDetail
	if err := w.call(r.Context(), http.MethodGet, "/runs/"+url.PathEscape(id), nil, &det); err != nil {
		return "", nil, err
	}
	var logs APILogs
	if err := w.call(r.Context(), http.MethodGet, "/runs/"+url.PathEscape(id)+"/logs", nil, &logs); err != nil {
		return "", nil, err
	}
	out := runData{Detail: det, Finished: !det.Run.FinishedAt.IsZero(), Names: map[string]string{}}
	index := map[uint64]int{}
	for _, l := range logs.Lines {
		out.Logs = append(out.Logs, webLine{APILogLine: l, Key: fmt.Sprintf("%d.%d", l.Lease, index[l.Lease])})
		index[l.Lease]++
	}
	for _, s := range det.Steps {
		out.Names[s.ID] = stepLabel(s)
	}
	out.Layers = layers(det.Steps, out.Names)
	var ws APIWorkerList
	if err := w.call(r.Context(), http.MethodGet, "/workers", nil, &ws); err != nil {
		return "", nil, err
	}
	out.Workers = ws.Workers
	return "run", out, nil
}

func stepLabel(s APIStep) string {
	if s.Item != "" {
		return s.Name + "[" + s.Item + "]"
	}
	return s.Name
}

// layers orders a run's steps into the columns of its DAG: a step stands
// one column right of its deepest dependency.
func layers(steps []APIStep, names map[string]string) [][]dagStep {
	depth := map[string]int{}
	byID := map[string]APIStep{}
	for _, s := range steps {
		byID[s.ID] = s
	}
	var walk func(id string, seen map[string]bool) int
	walk = func(id string, seen map[string]bool) int {
		if d, ok := depth[id]; ok {
			return d
		}
		if seen[id] { // not a DAG: cannot happen, the core refuses cycles
			return 0
		}
		seen[id] = true
		d := 0
		for _, dep := range byID[id].Deps {
			if _, ok := byID[dep]; ok {
				d = max(d, walk(dep, seen)+1)
			}
		}
		depth[id] = d
		return d
	}
	var out [][]dagStep
	for _, s := range steps {
		d := walk(s.ID, map[string]bool{})
		for len(out) <= d {
			out = append(out, nil)
		}
		ds := dagStep{APIStep: s}
		for _, dep := range s.Deps {
			ds.After = append(ds.After, names[dep])
		}
		out[d] = append(out[d], ds)
	}
	return out
}

type eventRow struct {
	Run string
	APIEvent
}

func (w *web) events(r *http.Request) (string, any, error) {
	var list APIRunList
	if err := w.call(r.Context(), http.MethodGet, "/runs?limit="+strconv.Itoa(webEventRuns), nil, &list); err != nil {
		return "", nil, err
	}
	var rows []eventRow
	for _, run := range list.Runs {
		var det APIRunDetail
		if err := w.call(r.Context(), http.MethodGet, "/runs/"+url.PathEscape(run.ID), nil, &det); err != nil {
			var we *webError
			if errors.As(err, &we) && we.code == http.StatusNotFound {
				continue // pruned since the listing
			}
			return "", nil, err
		}
		for i := len(det.Events) - 1; i >= 0; i-- { // newest first within a run too
			rows = append(rows, eventRow{Run: run.ID, APIEvent: det.Events[i]})
		}
	}
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].At.After(rows[j].At) })
	return "events", rows, nil
}

func (w *web) workers(r *http.Request) (string, any, error) {
	var list APIWorkerList
	err := w.call(r.Context(), http.MethodGet, "/workers", nil, &list)
	return "workers", list.Workers, err
}

func (w *web) tokens(r *http.Request) (string, any, error) {
	var list APITokenList
	err := w.call(r.Context(), http.MethodGet, "/tokens", nil, &list)
	return "tokens", list.Tokens, err
}

func (w *web) cancel(r *http.Request) (string, error) {
	id := r.PathValue("id")
	body := map[string]string{"reason": r.PostForm.Get("reason")}
	if err := w.call(r.Context(), http.MethodPost, "/runs/"+url.PathEscape(id)+"/cancel", body, nil); err != nil {
		return "", err
	}
	return "/runs/" + url.PathEscape(id), nil
}

func (w *web) gate(approve bool) func(r *http.Request) (string, error) {
	verb := "reject"
	if approve {
		verb = "approve"
	}
	return func(r *http.Request) (string, error) {
		step := r.PostForm.Get("step")
		run, _, ok := strings.Cut(step, "/")
		if !ok || run == "" {
			return "", &webError{code: http.StatusBadRequest, msg: fmt.Sprintf("step %q is not a step id (run-1/name)", step)}
		}
		// The API's path takes the step id's segments as they are; each
		// is escaped, the slash between run and name kept.
		path := "/steps/" + url.PathEscape(run) + "/" + url.PathEscape(strings.TrimPrefix(step, run+"/")) + "/" + verb
		if err := w.call(r.Context(), http.MethodPost, path, nil, nil); err != nil {
			return "", err
		}
		return "/runs/" + url.PathEscape(run), nil
	}
}

// ---- template helpers ----

func fmtWhen(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

func fmtTook(a, b time.Time) string {
	if a.IsZero() || b.IsZero() {
		return ""
	}
	return b.Sub(a).Round(time.Millisecond).String()
}
