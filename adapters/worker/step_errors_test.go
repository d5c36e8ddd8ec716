package worker

import (
	"encoding/json"
	"io"
	"net/http"
	"sync"
	"testing"

	"github.com/tether-run/tether/client"
)

// The orchestrator's refusals reach a step through the step endpoint as
// they were written (SPEC §14: the endpoint serves the data plane's paths,
// whose errors are §15's {"code", "message", "error"}): the status, the
// body byte for byte, Content-Type, a 405's Allow, a 401's
// WWW-Authenticate; a 4xx write is sent once. (Planted: the endpoint
// re-encoded every refusal as {"error"} and dropped Allow and
// WWW-Authenticate.)
func TestStepEndpointPassesOnOrchestratorErrors(t *testing.T) {
	type answer struct {
		status int
		hdr    map[string]string
		body   string
	}
	answers := map[string]answer{
		"/data/m": {http.StatusMethodNotAllowed, map[string]string{"Allow": "DELETE, GET, PUT"},
			`{"code": "method_not_allowed", "message": "method PATCH is not allowed on \"/data/m\" (allowed: DELETE, GET, PUT)", "error": "method PATCH is not allowed on \"/data/m\" (allowed: DELETE, GET, PUT)"}` + "\n"},
		"/data/gone/latest": {http.StatusNotFound, nil,
			`{"code": "not_found", "message": "no data \"gone\"", "error": "no data \"gone\""}` + "\n"},
		"/data/fenced": {http.StatusConflict, nil,
			`{"code": "conflict", "message": "lease 7 is not current: fenced", "error": "lease 7 is not current: fenced"}` + "\n"},
		"/data/cred/latest": {http.StatusUnauthorized, map[string]string{"WWW-Authenticate": `Bearer realm="tether-data"`},
			`{"code": "unauthorized", "message": "session credential refused", "error": "session credential refused"}` + "\n"},
	}
	var (
		mu   sync.Mutex
		sent = map[string]int{}
	)
	url := h2cServer(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		sent[r.Method+" "+r.URL.Path]++
		mu.Unlock()
		a, ok := answers[r.URL.Path]
		if !ok {
			w.WriteHeader(http.StatusTeapot)
			return
		}
		for k, v := range a.hdr {
			w.Header().Set(k, v)
		}
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.WriteHeader(a.status)
		io.WriteString(w, a.body)
	})
	c, err := NewDataClient(url, nil, func() string { return "cred" })
	if err != nil {
		t.Fatal(err)
	}
	c.SetRetry(Retry{Attempts: 3, First: 0, Max: 0})
	e, tok := testEndpoint(t, c, 0)
	for _, tc := range []struct {
		method, path string
		body         []byte
	}{
		{"PATCH", "/data/m", []byte("x")},
		{http.MethodGet, "/data/gone/latest", nil},
		{http.MethodPut, "/data/fenced", []byte("x")},
		{http.MethodGet, "/data/cred/latest", nil},
	} {
		want := answers[tc.path]
		resp := stepRequest(t, e, tok, tc.method, tc.path, tc.body, nil)
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != want.status || string(b) != want.body {
			t.Errorf("%s %s: HTTP %d %q; want %d %q", tc.method, tc.path, resp.StatusCode, b, want.status, want.body)
		}
		for k, v := range want.hdr {
			if got := resp.Header.Get(k); got != v {
				t.Errorf("%s %s: %s %q; want %q", tc.method, tc.path, k, got, v)
			}
		}
		if ct := resp.Header.Get("Content-Type"); ct != "application/json; charset=utf-8" {
			t.Errorf("%s %s: Content-Type %q", tc.method, tc.path, ct)
		}
		var eb client.ErrorBody
		if json.Unmarshal(b, &eb) != nil || eb.Code != client.CodeFor(want.status) || eb.Message == "" || eb.Error != eb.Message {
			t.Errorf("%s %s: %q is not a %s error answer", tc.method, tc.path, b, client.CodeFor(want.status))
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if n := sent["PUT /data/fenced"]; n != 1 {
		t.Errorf("a fenced write was sent %d times; want once (a 4xx is final)", n)
	}
}

// An answer that is not a §15 error answer (an older orchestrator's
// {"error"}, a proxy's page) reaches the step in that shape, with its
// status and the code of that status.
func TestStepEndpointReshapesOtherErrors(t *testing.T) {
	url := h2cServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/data/old/latest" {
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, `{"error":"no such data"}`)
			return
		}
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusForbidden)
		io.WriteString(w, "<html>forbidden by the proxy</html>")
	})
	c, _ := NewDataClient(url, nil, func() string { return "cred" })
	e, tok := testEndpoint(t, c, 0)
	for path, want := range map[string]client.ErrorBody{
		"/data/old/latest":   {Code: client.CodeNotFound, Message: "no such data", Error: "no such data"},
		"/data/proxy/latest": {Code: client.CodeForbidden, Message: "<html>forbidden by the proxy</html>", Error: "<html>forbidden by the proxy</html>"},
	} {
		resp := stepRequest(t, e, tok, http.MethodGet, path, nil, nil)
		var eb client.ErrorBody
		err := json.NewDecoder(resp.Body).Decode(&eb)
		if err != nil || eb != want || resp.Header.Get("Content-Type") != "application/json; charset=utf-8" {
			t.Errorf("GET %s: HTTP %d %s %+v (%v); want %+v as JSON", path, resp.StatusCode, resp.Header.Get("Content-Type"), eb, err, want)
		}
	}
}

// The step endpoint's own refusals have the data plane's shape too
// (SPEC §14, §15): code, message, and error repeating it; a 401 has
// WWW-Authenticate. (Planted: they were {"error"} only.)
func TestStepEndpointOwnRefusals(t *testing.T) {
	f := newFakeDataPlane(t)
	e, tok := testEndpoint(t, f.client(t), 0)
	// A worker not enrolled yet has no credential to forward with.
	unenrolled, _ := NewDataClient(f.srv.URL, nil, func() string { return "" })
	eu, toku := testEndpoint(t, unenrolled, 0)
	for _, tc := range []struct {
		name         string
		e            *stepEndpoint
		tok          string
		method, path string
		hdr          map[string]string
		status       int
	}{
		{"no token", e, "nope", http.MethodGet, "/data/x/latest", nil, http.StatusUnauthorized},
		{"unknown path", e, tok, http.MethodGet, "/api/runs", nil, http.StatusNotFound},
		{"malformed request id", e, tok, http.MethodPut, "/data/x", map[string]string{RequestIDHeader: "no spaces"}, http.StatusBadRequest},
		{"not enrolled", eu, toku, http.MethodGet, "/data/x/latest", nil, http.StatusServiceUnavailable},
	} {
		var body []byte
		if tc.method == http.MethodPut {
			body = []byte("x")
		}
		resp := stepRequest(t, tc.e, tc.tok, tc.method, tc.path, body, tc.hdr)
		var eb client.ErrorBody
		err := json.NewDecoder(resp.Body).Decode(&eb)
		if resp.StatusCode != tc.status || err != nil || eb.Code != client.CodeFor(tc.status) || eb.Message == "" || eb.Error != eb.Message {
			t.Errorf("%s: HTTP %d %+v (%v); want %d with code %s, a message and error repeating it", tc.name, resp.StatusCode, eb, err, tc.status, client.CodeFor(tc.status))
		}
		if tc.status == http.StatusUnauthorized && resp.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("%s: a 401 without WWW-Authenticate", tc.name)
		}
	}
}
