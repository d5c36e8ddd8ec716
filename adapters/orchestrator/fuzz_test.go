package orchestrator_test

// Fuzz targets for what the orchestrator decodes from its sockets besides
// frames (adapters/wire FuzzDecode) and data paths (FuzzParseDataPath): the
// operator API's request bodies and path arguments, and the data plane's
// headers and query values (version, offset, lease). Each drives a real
// Driver's handlers and checks a property of every answer (SPEC §12, §14).

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"golang.org/x/net/http/httpguts"

	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/adapters/workflow"
	"github.com/tether-run/tether/client"
	"github.com/tether-run/tether/core"
)

// rawControlIn reports whether an error message holds a character a terminal
// would act on (a newline separates the problems of one error).
func rawControlIn(s string) bool {
	return strings.ContainsFunc(s, func(r rune) bool { return r != '\n' && r != ' ' && !unicode.IsPrint(r) })
}

// fuzzAPIRoutes are the operator API calls that decode a body or a path
// argument; FuzzAPIRequest picks one by its first input.
var fuzzAPIRoutes = []struct {
	method string
	target func(arg string) string
}{
	{"POST", func(string) string { return "/api/tokens" }},
	{"POST", func(arg string) string { return "/api/runs?file=" + url.QueryEscape(arg) }},
	{"POST", func(arg string) string { return "/api/runs/" + url.PathEscape(arg) + "/cancel" }},
	{"POST", func(arg string) string { return "/api/steps/run-1/" + url.PathEscape(arg) + "/approve" }},
	{"POST", func(arg string) string { return "/api/steps/" + url.PathEscape(arg) + "/reject" }},
	{"DELETE", func(arg string) string { return "/api/tokens/" + url.PathEscape(arg) }},
	{"GET", func(arg string) string { return "/api/runs/run-1/logs?step=" + url.QueryEscape(arg) }},
}

// FuzzAPIRequest: the operator API (token create and revoke, submit, cancel,
// approve and reject, logs) never panics and never fails inside (5xx) on
// any body or path argument; every refusal is a JSON error whose message
// holds no raw control character; an accepted token or run holds only
// names core.CheckName accepts (SPEC §12).
func FuzzAPIRequest(f *testing.F) {
	for _, s := range []struct {
		route uint8
		arg   string
		body  string
	}{
		{0, "", `{"name":"builder-1","ttl":"1h"}`},
		{0, "", `{"name":"bad\u001b[2J","ttl":"1h"}`},
		{0, "", `{"name":"a\r\nb"}`},
		{0, "", `{"name":"x","ttl":"-1s","extra":1}`},
		{0, "", `{"name":`},
		{1, "wf.yaml", "name: r\nsteps:\n  - name: a\n    run: echo\n    tags: [script]\n    labels: {zone: eu}\n"},
		{1, "wf.yaml", "steps:\n  - name: \"b\\ec\"\n    run: echo\n"},
		{1, "wf.json", `{"name":"j","steps":[{"name":"a","run":"x","depends_on":["a"]}]}`},
		{1, "", "steps: [\n"},
		{2, "run-1", `{"reason":"wrong branch"}`},
		{2, "run-1\x1b", `{"reason":"x\u0000"}`},
		{3, "a", ""},
		{4, "run-1/a[0]", ""},
		{5, "builder-1", ""},
		{5, "tok\x1b[2J", ""},
		{6, "a[1]", ""},
	} {
		f.Add(s.route, s.arg, []byte(s.body))
	}
	d, err := orchestrator.Start(orchestrator.Options{Addr: "127.0.0.1:0", StorePath: filepath.Join(f.TempDir(), "tether.db"),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), AdminToken: adminToken})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { d.Close() })
	h := d.APIHandler(adminToken)
	f.Fuzz(func(t *testing.T, route uint8, arg string, body []byte) {
		rt := fuzzAPIRoutes[int(route)%len(fuzzAPIRoutes)]
		req := httptest.NewRequest(rt.method, rt.target(arg), bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+adminToken)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		code, b := rec.Code, rec.Body.Bytes()
		switch code {
		case 200, 201, 400, 404, 405, 409, 413:
		default:
			t.Fatalf("%s %s %q: HTTP %d %s", rt.method, req.URL, body, code, b)
		}
		if code >= 400 {
			var e orchestrator.APIError
			if err := json.Unmarshal(b, &e); err != nil || e.Code != client.CodeFor(code) || e.Message == "" {
				t.Fatalf("%s %s: HTTP %d answer %q is not a JSON error with code %s", rt.method, req.URL, code, b, client.CodeFor(code))
			}
			if rawControlIn(e.Message) || rawControlIn(e.Error) {
				t.Fatalf("%s %s: error %q holds a raw control character", rt.method, req.URL, e.Message)
			}
			return
		}
		switch {
		case rt.method == "POST" && strings.HasPrefix(req.URL.Path, "/api/tokens"):
			var tok orchestrator.APICreatedToken
			if err := json.Unmarshal(b, &tok); err != nil || core.CheckName("token name", tok.Name) != nil {
				t.Fatalf("token %q accepted: %v", tok.Name, core.CheckName("token name", tok.Name))
			}
		case rt.method == "POST" && req.URL.Path == "/api/runs":
			spec, err := workflow.Parse("f", body)
			if err != nil {
				t.Fatalf("a run the parser refuses was accepted: %v", err)
			}
			names := []string{spec.Name}
			for _, s := range spec.Steps {
				names = append(append(names, s.Name), s.Tags...)
				for k, v := range s.Labels {
					names = append(names, k, v)
				}
			}
			for _, n := range names {
				if n != "" && core.CheckName("name", n) != nil {
					t.Fatalf("a run with the name %q was accepted", n)
				}
			}
		}
	})
}

// FuzzDataPlaneHeaders: the data plane's version (path), offset (query) and
// lease (header, or ?lease=) values, with a real session credential, no
// credential or a wrong one. It never panics or fails inside; a version
// read answers 200 only for "1" or "latest" with the stored bytes; a stream
// read answers 200 only for an offset from 0 to the stream's length, with
// the bytes from there; a write is stored (201) only under the worker's
// current lease, named in decimal (SPEC §14).
func FuzzDataPlaneHeaders(f *testing.F) {
	for _, s := range []struct {
		version, offset, lease string
		inQuery                bool
		auth                   uint8
	}{
		{"1", "0", "1", false, 0}, {"latest", "10", "1", true, 0}, {"01", "-1", "01", false, 0}, {"2", "11", "18446744073709551616", false, 0},
		{"1/x", "1e3", "0x1", true, 0}, {"latest", "", "", false, 1}, {"1", "5", "1", false, 2}, {"\x00", " 3", " 1", false, 0},
	} {
		f.Add(s.version, s.offset, s.lease, s.inQuery, s.auth)
	}
	r := startData(f, orchestrator.Options{RefusalsPerSec: -1}) // it is refused on purpose, as fast as it can
	w := r.enroll("fz")
	dm := r.lease(w, "fz-step")
	version := []byte("version one")
	stream := []byte("0123456789")
	r.expect("PUT", "/data/fz-v", version, w.cred, dm.Lease, http.StatusCreated)
	r.expect("POST", "/data/fz-s/append", stream, w.cred, dm.Lease, http.StatusOK)
	send := func(t *testing.T, method, path string, body []byte, header http.Header, auth uint8) (int, []byte) {
		req, err := http.NewRequestWithContext(context.Background(), method, r.d.DataURL()+path, bytes.NewReader(body))
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		for k, v := range header {
			req.Header[k] = v
		}
		switch auth % 3 {
		case 0:
			req.Header.Set("Authorization", "Bearer "+w.cred)
		case 2:
			req.Header.Set("Authorization", "Bearer "+w.cred+"x")
		}
		resp, err := r.hc.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode >= 400 {
			var e orchestrator.APIError
			if err := json.Unmarshal(b, &e); err != nil || e.Code != client.CodeFor(resp.StatusCode) || e.Message == "" || rawControlIn(e.Message) {
				t.Fatalf("%s %s: HTTP %d answer %q is not a clean JSON error", method, path, resp.StatusCode, b)
			}
		}
		return resp.StatusCode, b
	}
	f.Fuzz(func(t *testing.T, ver, offset, lease string, inQuery bool, auth uint8) {
		authed := auth%3 == 0
		// A version ("." and ".." are cleaned out of the path: another route).
		vpath := "/data/fz-v/" + url.PathEscape(ver)
		code, b := send(t, "GET", vpath, nil, nil, auth)
		switch {
		case path.Clean(vpath) != vpath:
		case code != 200 && code != 400 && code != 401 && code != 404:
			t.Fatalf("GET version %q: HTTP %d %s", ver, code, b)
		case !authed && code == 200:
			t.Fatalf("GET version %q without a valid credential: 200", ver)
		case code == 200 && ((ver != "1" && ver != "latest") || !bytes.Equal(b, version)):
			t.Fatalf("GET version %q: 200 %q", ver, b)
		}
		// The stream from an offset.
		code, b = send(t, "GET", "/data/fz-s/append?offset="+url.QueryEscape(offset), nil, nil, auth)
		off, perr := strconv.ParseInt(offset, 10, 64)
		if offset == "" {
			off, perr = 0, nil
		}
		switch {
		case code != 200 && code != 400 && code != 401 && code != 416:
			t.Fatalf("GET offset %q: HTTP %d %s", offset, code, b)
		case !authed && code == 200:
			t.Fatalf("GET offset %q without a valid credential: 200", offset)
		case code == 200 && (perr != nil || off < 0 || off > int64(len(stream)) || !bytes.Equal(b, stream[off:])):
			t.Fatalf("GET offset %q: 200 %q", offset, b)
		}
		// A write under a lease.
		wpath, header := "/data/fz-p", http.Header{}
		switch {
		case inQuery:
			wpath += "?lease=" + url.QueryEscape(lease)
		case httpguts.ValidHeaderFieldValue(lease):
			header.Set(orchestrator.LeaseHeader, lease)
		default:
			return // the client cannot send it
		}
		code, b = send(t, "PUT", wpath, []byte("x"), header, auth)
		n, perr := strconv.ParseUint(strings.Trim(lease, " \t"), 10, 64)
		switch {
		case code != 201 && code != 400 && code != 401 && code != 409:
			t.Fatalf("PUT lease %q: HTTP %d %s", lease, code, b)
		case code == 201 && (!authed || perr != nil || core.LeaseID(n) != dm.Lease):
			t.Fatalf("PUT lease %q (auth %d) stored, the current lease is %d", lease, auth%3, dm.Lease)
		}
	})
}
