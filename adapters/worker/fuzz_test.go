package worker

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"unicode"

	"github.com/tether-run/tether/adapters/dataplane"
)

// FuzzStepEndpoint: the worker's step endpoint (SPEC §14) parses a step
// process's request — method, path, query, Authorization, body — and
// forwards it with the worker's session credential and the step's own
// lease. Whatever the request: it never panics; without the granted token
// it answers 401 and forwards nothing; a path outside /data/ and /bundle/
// is a 404 and forwards nothing; a forwarded request carries exactly the
// session credential and the granted lease (a lease the step names in the
// query never reaches the orchestrator); every refusal is a JSON error
// without a raw control character.
func FuzzStepEndpoint(f *testing.F) {
	for _, s := range []struct {
		method, path, query, auth string
		useToken                  bool
		body                      string
	}{
		{"GET", "/data/x/latest", "", "", true, ""},
		{"PUT", "/data/x", "lease=99", "", true, "bytes"},
		{"POST", "/data/x/append", "lease=1&lease=2", "", true, "line\n"},
		{"GET", "/bundle/ab/file/a/../b", "", "", true, ""},
		{"GET", "/api/runs", "", "", true, ""},
		{"GET", "/data/x", "", "Bearer nope", false, ""},
		{"GET", "/data/x", "", "Basic Zm9v", false, ""},
		{"DELETE", "/data/\x00\x1b", "offset=-1", "bearer ", false, ""},
	} {
		f.Add(s.method, s.path, s.query, s.auth, s.useToken, []byte(s.body))
	}
	type seen struct {
		auth, lease, query string
	}
	var (
		mu  sync.Mutex
		got []seen
	)
	upstream := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		got = append(got, seen{r.Header.Get("Authorization"), r.Header.Get(dataplane.LeaseHeader), r.URL.RawQuery})
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{}`))
	}))
	upstream.Config.Protocols = new(http.Protocols)
	upstream.Config.Protocols.SetUnencryptedHTTP2(true)
	upstream.Start()
	f.Cleanup(upstream.Close)
	client, err := NewDataClient(upstream.URL, nil, func() string { return "session-cred" })
	if err != nil {
		f.Fatal(err)
	}
	e, err := startStepEndpoint(slog.New(slog.NewTextHandler(io.Discard, nil)), client, nil, f.TempDir())
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(e.close)
	const lease = 7
	tok := e.grant(lease)[EnvDataToken]
	f.Fuzz(func(t *testing.T, method, path, query, auth string, useToken bool, body []byte) {
		if useToken {
			auth = "Bearer " + tok
		}
		req := &http.Request{Method: method, URL: &url.URL{Path: path, RawQuery: query}, Header: http.Header{}, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body)), Host: "127.0.0.1", RemoteAddr: "127.0.0.1:1"}
		req = req.WithContext(t.Context())
		req.Header.Set("Authorization", auth)
		mu.Lock()
		got = got[:0]
		mu.Unlock()
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, req)
		mu.Lock()
		fwd := append([]seen(nil), got...)
		mu.Unlock()
		scheme, presented, _ := strings.Cut(auth, " ")
		authorized := strings.EqualFold(scheme, "Bearer") && strings.TrimSpace(presented) == tok
		prefixed := path == "/data" || path == "/pool" // SPEC §14's paths, spelled out apart from stepPath
		for _, p := range []string{"/data/", "/bundle/", "/step/", "/secret/"} {
			prefixed = prefixed || strings.HasPrefix(path, p)
		}
		switch {
		case !authorized && (rec.Code != http.StatusUnauthorized || len(fwd) > 0):
			t.Fatalf("%s %q with %q: HTTP %d, %d forwarded; want 401, none", method, path, auth, rec.Code, len(fwd))
		case authorized && !prefixed && (rec.Code != http.StatusNotFound || len(fwd) > 0):
			t.Fatalf("%s %q: HTTP %d, %d forwarded; want 404, none", method, path, rec.Code, len(fwd))
		case len(fwd) > 1:
			t.Fatalf("%s %q: forwarded %d times", method, path, len(fwd))
		case len(fwd) == 1 && (fwd[0].auth != "Bearer session-cred" || fwd[0].lease != "7"):
			t.Fatalf("%s %q: forwarded with %+v, want the session credential and lease 7", method, path, fwd[0])
		case len(fwd) == 1:
			if q, err := url.ParseQuery(fwd[0].query); err == nil && q.Has("lease") {
				t.Fatalf("%s %q ?%s: the step's own lease query reached the orchestrator: %q", method, path, query, fwd[0].query)
			}
		}
		if rec.Code >= 400 {
			var e struct{ Error string }
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Error == "" {
				t.Fatalf("%s %q: HTTP %d %q is not a JSON error", method, path, rec.Code, rec.Body)
			}
			if strings.ContainsFunc(e.Error, func(r rune) bool { return r != ' ' && !unicode.IsPrint(r) }) {
				t.Fatalf("%s %q: error %q holds a raw control character", method, path, e.Error)
			}
		}
	})
}
