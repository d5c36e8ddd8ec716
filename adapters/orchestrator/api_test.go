package orchestrator_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/client"
	"github.com/tether-run/tether/core"
)

const adminToken = "test-admin-token-0123456789abcdef"

// apiRig is a real Driver with the API mounted, on 127.0.0.1:0 with a temp
// bbolt file.
type apiRig struct {
	t    *testing.T
	ctx  context.Context
	d    *orchestrator.Driver
	path string
}

func startAPI(t *testing.T) *apiRig {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	t.Cleanup(cancel)
	path := filepath.Join(t.TempDir(), "tether.db")
	d, err := orchestrator.Start(orchestrator.Options{
		Addr: "127.0.0.1:0", StorePath: path,
		Logger: testLogger(t).With("side", "orchestrator"), AdminToken: adminToken,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return &apiRig{t: t, ctx: ctx, d: d, path: path}
}

// do sends one request with the admin token (or the given Authorization
// header when auth is not nil) and returns the status and body.
func (r *apiRig) do(method, path string, body []byte, auth *string) (int, []byte) {
	r.t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(r.ctx, method, r.d.APIURL()+path, rd)
	if err != nil {
		r.t.Fatal(err)
	}
	if auth == nil {
		req.Header.Set("Authorization", "Bearer "+adminToken)
	} else if *auth != "" {
		req.Header.Set("Authorization", *auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		r.t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		r.t.Errorf("%s %s: Content-Type %q, want JSON", method, path, ct)
	}
	return resp.StatusCode, b
}

// expect sends a request, checks the status and decodes the body into out.
func (r *apiRig) expect(method, path string, body []byte, want int, out any) []byte {
	r.t.Helper()
	code, b := r.do(method, path, body, nil)
	if code != want {
		r.t.Fatalf("%s %s: HTTP %d, want %d: %s", method, path, code, want, b)
	}
	if code >= 400 {
		var e orchestrator.APIError
		if err := json.Unmarshal(b, &e); err != nil || e.Code != client.CodeFor(code) || e.Message == "" || e.Error != e.Message {
			r.t.Fatalf("%s %s: error body %q is not {\"code\": %q, \"message\", \"error\"}", method, path, b, client.CodeFor(code))
		}
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			r.t.Fatalf("%s %s: decode %s: %v", method, path, b, err)
		}
	}
	return b
}

// client is the operator's client (package client) of the rig's
// orchestrator.
func (r *apiRig) client() *client.Client {
	r.t.Helper()
	c, err := client.New(r.d.DataURL(), adminToken)
	if err != nil {
		r.t.Fatal(err)
	}
	return c
}

// ok fails the test on a client error.
func (r *apiRig) ok(what string, err error) {
	r.t.Helper()
	if err != nil {
		r.t.Fatalf("%s: %v", what, err)
	}
}

// wantCode fails the test unless err is an error answer with code.
func (r *apiRig) wantCode(what string, err error, code client.Code) {
	r.t.Helper()
	if got := client.ErrorCode(err); got != code {
		r.t.Fatalf("%s: %v, want an error with code %s", what, err, code)
	}
}

// waitRun polls GET /api/runs/{id} until cond holds.
func (r *apiRig) waitRun(id string, what string, cond func(orchestrator.APIRunDetail) bool) orchestrator.APIRunDetail {
	r.t.Helper()
	for {
		det, err := r.client().Run(r.ctx, id)
		r.ok("run "+id, err)
		if cond(*det) {
			return *det
		}
		select {
		case <-r.ctx.Done():
			r.t.Fatalf("waiting for %s: %v; last: %+v", what, r.ctx.Err(), *det)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func TestAPIAuth(t *testing.T) {
	r := startAPI(t)
	for _, auth := range []string{"", "Bearer wrong-token", "Bearer " + adminToken + "x", "Basic " + adminToken, adminToken, "Bearer "} {
		for _, ep := range []struct{ method, path string }{{"GET", "/runs"}, {"POST", "/tokens"}, {"GET", "/nope"}} {
			code, b := r.do(ep.method, ep.path, []byte(`{"name": "x"}`), &auth)
			if code != http.StatusUnauthorized {
				t.Errorf("%s %s with Authorization %q: HTTP %d, want 401: %s", ep.method, ep.path, auth, code, b)
			}
			var e orchestrator.APIError
			if json.Unmarshal(b, &e) != nil || e.Code != client.CodeUnauthorized || e.Message == "" {
				t.Errorf("401 body %q is not a JSON error with code unauthorized", b)
			}
		}
	}
	// Nothing was created by the refused calls.
	var toks orchestrator.APITokenList
	r.expect("GET", "/tokens", nil, http.StatusOK, &toks)
	if len(toks.Tokens) != 0 {
		t.Errorf("refused calls created tokens: %+v", toks.Tokens)
	}
	// The right token, any case of the scheme, is accepted.
	auth := "bearer " + adminToken
	if code, b := r.do("GET", "/runs", nil, &auth); code != http.StatusOK {
		t.Errorf("lower-case scheme: HTTP %d: %s", code, b)
	}
}

// An empty admin token admits nobody, even a request without a token.
func TestAPIHandlerEmptyTokenRefusesAll(t *testing.T) {
	r := startAPI(t)
	h := r.d.APIHandler("")
	for _, auth := range []string{"", "Bearer ", "Bearer x"} {
		req, _ := http.NewRequest("GET", "/api/runs", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		rec := &recorder{h: http.Header{}}
		h.ServeHTTP(rec, req)
		if rec.code != http.StatusUnauthorized {
			t.Errorf("Authorization %q with an empty admin token: HTTP %d, want 401", auth, rec.code)
		}
	}
}

type recorder struct {
	h    http.Header
	code int
	body bytes.Buffer
}

func (r *recorder) Header() http.Header         { return r.h }
func (r *recorder) Write(b []byte) (int, error) { return r.body.Write(b) }
func (r *recorder) WriteHeader(code int)        { r.code = code }

func TestAPISubmitAndShow(t *testing.T) {
	r := startAPI(t)

	// A bad definition: 400 naming the file and line.
	bad := "name: bad\nsteps:\n  - name: a\n    run: echo a\n    bogus: 1\n"
	b := r.expect("POST", "/runs?file=bad.yaml", []byte(bad), http.StatusBadRequest, nil)
	if !strings.Contains(string(b), "bad.yaml:5") || !strings.Contains(string(b), "bogus") {
		t.Errorf("bad definition error %s does not name bad.yaml:5 and the field", b)
	}
	b = r.expect("POST", "/runs", []byte("name: x\nsteps:\n  - name: a\n    depends_on: [nope]\n    run: echo\n"), http.StatusBadRequest, nil)
	if !strings.Contains(string(b), "workflow:3") || !strings.Contains(string(b), "nope") {
		t.Errorf("unknown dependency error %s does not name the line", b)
	}
	var runs orchestrator.APIRunList
	r.expect("GET", "/runs", nil, http.StatusOK, &runs)
	if len(runs.Runs) != 0 {
		t.Fatalf("a refused definition created runs: %+v", runs.Runs)
	}

	// A good one appears with its steps (no worker: they wait queued).
	good := "name: good\nsteps:\n  - name: a\n    run: echo a\n  - name: b\n    depends_on: [a]\n    writes: true\n    run: echo b\n"
	var sub orchestrator.APISubmitted
	r.expect("POST", "/runs?file=good.yaml", []byte(good), http.StatusCreated, &sub)
	if sub.Run != "run-1" {
		t.Fatalf("submitted run %q, want run-1", sub.Run)
	}
	r.expect("GET", "/runs", nil, http.StatusOK, &runs)
	if len(runs.Runs) != 1 || runs.Runs[0].ID != "run-1" || runs.Runs[0].Name != "good" || runs.Runs[0].Steps != 2 {
		t.Fatalf("GET /runs = %+v, want run-1 good with 2 steps", runs.Runs)
	}
	var det orchestrator.APIRunDetail
	r.expect("GET", "/runs/run-1", nil, http.StatusOK, &det)
	if det.Status != "running" || len(det.Steps) != 2 {
		t.Fatalf("GET /runs/run-1 = %+v", det)
	}
	if s := det.Steps[0]; s.ID != "run-1/a" || s.State != "queued" || s.Writes {
		t.Errorf("step a = %+v, want queued no-write", s)
	}
	if s := det.Steps[1]; s.ID != "run-1/b" || s.State != "pending" || !s.Writes {
		t.Errorf("step b = %+v, want pending write-bearing", s)
	}
	if len(det.Events) == 0 || det.Events[0].Kind != "run-submitted" {
		t.Errorf("events = %+v, want run-submitted first", det.Events)
	}
}

func TestAPIRunsWithAWorker(t *testing.T) {
	r := startAPI(t)
	f := startWorkers(t, r.ctx, r.d, "w1")
	defer f.stop(t)

	var workers orchestrator.APIWorkerList
	for {
		r.expect("GET", "/workers", nil, http.StatusOK, &workers)
		if len(workers.Workers) == 1 && workers.Workers[0].State == "connected" {
			break
		}
		select {
		case <-r.ctx.Done():
			t.Fatalf("worker never connected: %+v", workers)
		case <-time.After(20 * time.Millisecond):
		}
	}
	if w := workers.Workers[0]; w.Name != "w1" || w.Slots != 1 || w.Token != "w1" || w.LastHeartbeat.IsZero() {
		t.Errorf("worker = %+v", w)
	}

	src := "name: logs\nsteps:\n  - name: hello\n    run: echo hello from tether; echo second line\n" +
		"  - name: fan\n    forEach: [x, y]\n    run: echo item $TETHER_ITEM\n"
	var sub orchestrator.APISubmitted
	r.expect("POST", "/runs", []byte(src), http.StatusCreated, &sub)
	det := r.waitRun(sub.Run, "run to succeed", func(d orchestrator.APIRunDetail) bool { return !d.Run.FinishedAt.IsZero() })
	if det.Status != "success" {
		t.Fatalf("run finished %s: %+v", det.Status, det)
	}
	for _, s := range det.Steps {
		if s.Worker != "w1" || s.ExitCode == nil || *s.ExitCode != 0 || s.Attempts != 1 || s.Lease == 0 {
			t.Errorf("step %+v: want worker w1, exit 0, 1 attempt, a lease", s)
		}
	}

	var logs orchestrator.APILogs
	r.expect("GET", "/runs/"+sub.Run+"/logs?step=hello", nil, http.StatusOK, &logs)
	var texts []string
	for _, l := range logs.Lines {
		if l.Step != sub.Run+"/hello" || l.Lease == 0 || l.At.IsZero() || (!l.Gap && l.Seq == 0) {
			t.Errorf("log line %+v: want step hello with lease, seq and timestamp", l)
		}
		texts = append(texts, l.Text)
	}
	if strings.Join(texts, "|") != "hello from tether|second line" {
		t.Errorf("logs of hello = %q", texts)
	}
	r.expect("GET", "/runs/"+sub.Run+"/logs?step=fan", nil, http.StatusOK, &logs)
	if len(logs.Lines) != 2 {
		t.Errorf("logs of every fan instance = %+v, want 2 lines", logs.Lines)
	}
	r.expect("GET", "/runs/"+sub.Run+"/logs?step=fan[1]", nil, http.StatusOK, &logs)
	if len(logs.Lines) != 1 || logs.Lines[0].Text != "item y" {
		t.Errorf("logs of fan[1] = %+v, want [item y]", logs.Lines)
	}
	r.expect("GET", "/runs/"+sub.Run+"/logs", nil, http.StatusOK, &logs)
	if len(logs.Lines) != 4 {
		t.Errorf("all logs = %+v, want 4 lines", logs.Lines)
	}
	r.expect("GET", "/runs/"+sub.Run+"/logs?step=nope", nil, http.StatusNotFound, nil)

	// A finished run cannot be cancelled.
	r.expect("POST", "/runs/"+sub.Run+"/cancel", nil, http.StatusConflict, nil)
}

func TestAPITokens(t *testing.T) {
	r := startAPI(t)
	var created orchestrator.APICreatedToken
	r.expect("POST", "/tokens", []byte(`{"name": "builder-1", "ttl": "2h"}`), http.StatusCreated, &created)
	name, secret, ok := strings.Cut(created.Token, ".")
	if !ok || name != "builder-1" || len(secret) != 32 {
		t.Fatalf("token %q, want builder-1.<32 hex>", created.Token)
	}
	if d := time.Until(created.ExpiresAt); d < 119*time.Minute || d > 2*time.Hour {
		t.Errorf("expires in %v, want 2h", d)
	}
	r.expect("POST", "/tokens", []byte(`{"name": "default-ttl"}`), http.StatusCreated, nil)

	body := r.expect("GET", "/tokens", nil, http.StatusOK, nil)
	if strings.Contains(string(body), secret) || strings.Contains(strings.ToLower(string(body)), "hash") {
		t.Fatalf("GET /tokens shows a secret or a hash: %s", body)
	}
	var list orchestrator.APITokenList
	json.Unmarshal(body, &list)
	if len(list.Tokens) != 2 || list.Tokens[0].Name != "builder-1" || list.Tokens[0].State != "unused" || list.Tokens[0].Revoked {
		t.Fatalf("tokens = %+v", list.Tokens)
	}
	if d := list.Tokens[1].ExpiresAt.Sub(list.Tokens[1].CreatedAt); d != orchestrator.DefaultTokenTTL {
		t.Errorf("default TTL %v, want %v", d, orchestrator.DefaultTokenTTL)
	}

	// Refusals: duplicate 409, bad input 400, unknown 404.
	r.expect("POST", "/tokens", []byte(`{"name": "builder-1"}`), http.StatusConflict, nil)
	r.expect("POST", "/tokens", []byte(`{"name": "a.b"}`), http.StatusBadRequest, nil)
	r.expect("POST", "/tokens", []byte(`{"name": "x", "ttl": "soon"}`), http.StatusBadRequest, nil)
	r.expect("POST", "/tokens", []byte(`{"name": "x", "ttl": "-1h"}`), http.StatusBadRequest, nil)
	r.expect("POST", "/tokens", []byte(`{"name": "x", "extra": 1}`), http.StatusBadRequest, nil)
	r.expect("POST", "/tokens", []byte(`{}`), http.StatusBadRequest, nil)
	r.expect("POST", "/tokens", []byte(`not json`), http.StatusBadRequest, nil)
	r.expect("DELETE", "/tokens/nope", nil, http.StatusNotFound, nil)

	r.expect("DELETE", "/tokens/builder-1", nil, http.StatusOK, nil)
	r.expect("GET", "/tokens", nil, http.StatusOK, &list)
	if !list.Tokens[0].Revoked || list.Tokens[0].State != "revoked" {
		t.Errorf("after DELETE: %+v, want revoked", list.Tokens[0])
	}
	r.expect("GET", "/tokens/builder-1", nil, http.StatusMethodNotAllowed, nil)
}

func TestAPICancelAndGates(t *testing.T) {
	r := startAPI(t)
	src := "name: gates\nsteps:\n  - name: a\n    run: echo a\n  - name: ship\n    hold: true\n    run: echo ship\n" +
		"  - name: drop\n    hold: true\n    run: echo drop\n  - name: after\n    depends_on: [drop]\n    run: echo after\n"
	var sub orchestrator.APISubmitted
	r.expect("POST", "/runs", []byte(src), http.StatusCreated, &sub)
	stateOf := func(d orchestrator.APIRunDetail, id string) string {
		for _, s := range d.Steps {
			if s.ID == id {
				return s.State
			}
		}
		return "?"
	}
	det := r.waitRun(sub.Run, "gates held", func(d orchestrator.APIRunDetail) bool { return stateOf(d, "run-1/ship") == "held" })

	var ans orchestrator.APIStepAnswer
	r.expect("POST", "/steps/run-1/ship/approve", nil, http.StatusOK, &ans)
	if ans.Step != "run-1/ship" || ans.State != "queued" {
		t.Errorf("approve answered %+v, want run-1/ship queued", ans)
	}
	r.expect("POST", "/steps/run-1/ship/approve", nil, http.StatusConflict, nil) // no longer held
	r.expect("POST", "/steps/run-1/a/reject", nil, http.StatusConflict, nil)     // never held
	r.expect("POST", "/steps/run-1/drop/reject", nil, http.StatusOK, &ans)
	if ans.State != "cancelled" {
		t.Errorf("reject answered %+v, want cancelled", ans)
	}
	r.expect("POST", "/steps/run-1/nope/approve", nil, http.StatusNotFound, nil)
	r.expect("POST", "/steps/run-9/ship/approve", nil, http.StatusNotFound, nil)
	r.expect("GET", "/steps/run-1/ship/approve", nil, http.StatusMethodNotAllowed, nil)
	det = r.waitRun(sub.Run, "after skipped", func(d orchestrator.APIRunDetail) bool { return stateOf(d, "run-1/after") == "skipped" })
	for _, s := range det.Steps {
		if s.ID == "run-1/after" && s.SkippedBy != "run-1/drop" {
			t.Errorf("after skipped by %q, want run-1/drop", s.SkippedBy)
		}
	}

	// Cancel: the queued steps end cancelled; a second cancel is refused.
	r.expect("POST", "/runs/run-1/cancel", []byte(`{"reason": "test over"}`), http.StatusOK, nil)
	det = r.waitRun(sub.Run, "run cancelled", func(d orchestrator.APIRunDetail) bool { return !d.Run.FinishedAt.IsZero() })
	if det.Status != "cancelled" || det.Run.CancelReason != "test over" {
		t.Errorf("after cancel: status %s reason %q", det.Status, det.Run.CancelReason)
	}
	if st := stateOf(det, "run-1/a"); st != "cancelled" {
		t.Errorf("step a %s after cancel, want cancelled", st)
	}
	r.expect("POST", "/runs/run-1/cancel", nil, http.StatusConflict, nil)
	r.expect("POST", "/runs/run-1/cancel", []byte(`{"why": 1}`), http.StatusBadRequest, nil)
}

func TestAPINotFoundAndMethods(t *testing.T) {
	r := startAPI(t)
	for _, c := range []struct {
		method, path string
		want         int
	}{
		{"GET", "/runs/run-99", http.StatusNotFound},
		{"GET", "/runs/run-99/logs", http.StatusNotFound},
		{"POST", "/runs/run-99/cancel", http.StatusNotFound},
		{"POST", "/steps/run-99/x/approve", http.StatusNotFound},
		{"POST", "/steps/run-99/x/reject", http.StatusNotFound},
		{"DELETE", "/tokens/none", http.StatusNotFound},
		{"GET", "/nope", http.StatusNotFound},
		{"GET", "/", http.StatusNotFound},
		{"GET", "/runs/run-1/bogus", http.StatusNotFound},
		{"DELETE", "/runs", http.StatusMethodNotAllowed},
		{"PUT", "/workers", http.StatusMethodNotAllowed},
		{"POST", "/runs/run-1", http.StatusMethodNotAllowed},
		{"GET", "/runs/run-1/cancel", http.StatusMethodNotAllowed},
		{"GET", "/steps/run-1/x/approve", http.StatusMethodNotAllowed},
		{"POST", "/data/x", http.StatusMethodNotAllowed},
		{"PUT", "/data/x/append", http.StatusMethodNotAllowed},
		{"POST", "/store/backup", http.StatusMethodNotAllowed},
		{"POST", "/openapi.json", http.StatusMethodNotAllowed},
	} {
		code, b := r.do(c.method, c.path, nil, nil)
		if code != c.want {
			t.Errorf("%s %s: HTTP %d, want %d: %s", c.method, c.path, code, c.want, b)
		}
		var e orchestrator.APIError
		if json.Unmarshal(b, &e) != nil || e.Code != client.CodeFor(c.want) || e.Message == "" {
			t.Errorf("%s %s: body %q is not a JSON error with code %s", c.method, c.path, b, client.CodeFor(c.want))
		}
	}
	// A 405's Allow lists what the path serves; a wrong method without the
	// token is refused as unauthorized before anything is said of the path.
	for path, allow := range map[string]string{
		"/runs": "GET, HEAD, POST", "/runs/run-1/cancel": "POST", "/tokens/x": "DELETE", "/data/x": "GET, HEAD",
		"/bundles": "PUT", "/store/backup": "GET, HEAD",
	} {
		req, _ := http.NewRequestWithContext(r.ctx, "PATCH", r.d.APIURL()+path, nil)
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != allow {
			t.Errorf("PATCH %s: HTTP %d, Allow %q; want 405, Allow %q", path, resp.StatusCode, resp.Header.Get("Allow"), allow)
		}
	}
	none := ""
	if code, _ := r.do("DELETE", "/runs", nil, &none); code != http.StatusUnauthorized {
		t.Errorf("DELETE /api/runs without the token: HTTP %d, want 401", code)
	}
}

func TestAPIBodyLimit(t *testing.T) {
	r := startAPI(t)
	big := bytes.Repeat([]byte("# padding\n"), orchestrator.MaxAPIBody/10+1)
	r.expect("POST", "/runs", big, http.StatusRequestEntityTooLarge, nil)
	bigJSON := append([]byte(`{"name": "x", "ttl": "`), bytes.Repeat([]byte("1"), orchestrator.MaxAPIBody)...)
	r.expect("POST", "/tokens", append(bigJSON, `"}`...), http.StatusRequestEntityTooLarge, nil)
	r.expect("POST", "/runs/run-1/cancel", bigJSON, http.StatusRequestEntityTooLarge, nil)
	// Just under the limit is read (and refused for what it says, not its size).
	under := append([]byte("name: x\n"), bytes.Repeat([]byte("#"), orchestrator.MaxAPIBody-100)...)
	r.expect("POST", "/runs", under, http.StatusBadRequest, nil)
	var runs orchestrator.APIRunList
	r.expect("GET", "/runs", nil, http.StatusOK, &runs)
	if len(runs.Runs) != 0 {
		t.Errorf("oversize bodies created runs: %+v", runs.Runs)
	}
}

// Shutdown stops the API, and a submit answered before it is in the store.
func TestAPIShutdown(t *testing.T) {
	r := startAPI(t)
	var sub orchestrator.APISubmitted
	r.expect("POST", "/runs", []byte("name: x\nsteps:\n  - name: a\n    run: echo a\n"), http.StatusCreated, &sub)
	ctx, cancel := context.WithTimeout(r.ctx, 5*time.Second)
	defer cancel()
	if err := r.d.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if resp, err := http.Get(r.d.APIURL() + "/runs"); err == nil {
		resp.Body.Close()
		t.Errorf("the API still answers after Shutdown: HTTP %d", resp.StatusCode)
	}
	if _, ok := storedSteps(t, r.path)[core.StepID(sub.Run+"/a")]; !ok {
		t.Errorf("the answered submit of %s is not in the store", sub.Run)
	}
}

// The logs endpoint includes gap markers: the orchestrator restarts while a
// step runs, its worker reconnects, and the step's log shows the gap.
func TestAPILogsGapMarker(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	path := filepath.Join(t.TempDir(), "tether.db")
	jsonLogs := &lockedBuffer{}
	start := func(addr string, log *slog.Logger) *orchestrator.Driver {
		d, err := orchestrator.Start(orchestrator.Options{Addr: addr, StorePath: path, AdminToken: adminToken, Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	d1 := start("127.0.0.1:0", testLogger(t).With("side", "orchestrator"))
	defer d1.Close()
	f := startWorkers(t, ctx, d1, "w1")
	defer f.stop(t)
	r := &apiRig{t: t, ctx: ctx, d: d1, path: path}
	// The step is driven by files the test creates (no sleeping on a guess):
	// it prints "before"; once the orchestrator is down (gate1) it prints a
	// line every 20 ms, which its worker buffers, and acknowledges after five;
	// after the restart (gate2) it prints "after" and ends.
	dir := t.TempDir()
	gate1, gate2, ack := filepath.Join(dir, "gate1"), filepath.Join(dir, "gate2"), filepath.Join(dir, "ack")
	src := "name: gap\nsteps:\n  - name: s\n    run: |\n" +
		"      echo before\n" +
		"      while [ ! -e " + gate1 + " ]; do sleep 0.02; done\n" +
		"      i=0; while [ ! -e " + gate2 + " ]; do echo during $i; i=$((i+1)); [ $i -eq 5 ] && touch " + ack + "; sleep 0.02; done\n" +
		"      echo after\n"
	var sub orchestrator.APISubmitted
	r.expect("POST", "/runs", []byte(src), http.StatusCreated, &sub)
	var logs orchestrator.APILogs
	poll := func(what string, cond func() bool) {
		t.Helper()
		for !cond() {
			select {
			case <-ctx.Done():
				t.Fatalf("waiting for %s: %v", what, ctx.Err())
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	poll("the first line", func() bool {
		r.expect("GET", "/runs/"+sub.Run+"/logs", nil, http.StatusOK, &logs)
		return len(logs.Lines) > 0
	})
	addr := d1.Addr()
	if err := d1.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(gate1, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	poll("output while the orchestrator is down", func() bool { _, err := os.Stat(ack); return err == nil })
	d2 := start(addr, slog.New(slog.NewJSONHandler(jsonLogs, nil)))
	defer d2.Close()
	r.d = d2
	poll("the step to be reclaimed", func() bool {
		var det orchestrator.APIRunDetail
		r.expect("GET", "/runs/"+sub.Run, nil, http.StatusOK, &det)
		for _, ev := range det.Events {
			if ev.Kind == "step-reclaimed" {
				return true
			}
		}
		return false
	})
	if err := os.WriteFile(gate2, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r.waitRun(sub.Run, "the run to finish", func(d orchestrator.APIRunDetail) bool { return !d.Run.FinishedAt.IsZero() })
	r.expect("GET", "/runs/"+sub.Run+"/logs", nil, http.StatusOK, &logs)
	var texts []string
	gaps := 0
	for _, l := range logs.Lines {
		if l.Gap {
			gaps++
			if l.Seq != 0 || !strings.HasPrefix(l.Text, "--- Orchestrator offline for ") || l.Lease == 0 {
				t.Errorf("gap line %+v: want sequence 0, a lease and the marker text", l)
			}
			continue
		}
		if l.Seq == 0 || l.At.IsZero() {
			t.Errorf("line %+v: want a sequence number and the worker's timestamp", l)
		}
		texts = append(texts, l.Text)
	}
	joined := strings.Join(texts, "|")
	if gaps != 1 || !strings.HasPrefix(joined, "before|") || !strings.HasSuffix(joined, "|after") || !strings.Contains(joined, "during 4") {
		t.Errorf("logs after the restart: %d gap markers, lines %q; want 1 marker, before, the buffered lines, after", gaps, texts)
	}

	// The recovery log line's fields (SPEC §4), with recovery_duration a number.
	var rec map[string]any
	for _, line := range strings.Split(jsonLogs.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == "Job recovered from agent reconnection" {
			rec = m
		}
	}
	if rec == nil {
		t.Fatalf("no recovery log line in:\n%s", jsonLogs.String())
	}
	if _, ok := rec["recovery_duration"].(float64); !ok {
		t.Errorf("recovery_duration = %#v, want a number (SPEC §4)", rec["recovery_duration"])
	}
	if n, ok := rec["buffered_messages_count"].(float64); !ok || n < 1 {
		t.Errorf("buffered_messages_count = %#v, want a number of at least 1: the worker buffered lines while offline (SPEC §4)", rec["buffered_messages_count"])
	}
	if rec["step_id"] != sub.Run+"/s" || rec["run_id"] != sub.Run || rec["worker_id"] == nil {
		t.Errorf("recovery log line %v lacks worker_id, step_id or run_id", rec)
	}
}

// lockedBuffer is a log sink safe for concurrent writes and reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
