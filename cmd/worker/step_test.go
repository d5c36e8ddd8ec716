package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-run/tether/adapters/dataplane"
	"github.com/tether-run/tether/adapters/worker"
)

// stepEnv points worker step at url with token t for one test.
func stepEnv(t *testing.T, url string) {
	old, oldRetry := getenv, stepRetry
	t.Cleanup(func() { getenv, stepRetry = old, oldRetry })
	stepRetry = worker.Retry{Attempts: 6, First: time.Millisecond, Max: time.Millisecond}
	getenv = func(k string) string {
		switch k {
		case worker.EnvDataURL:
			return url
		case worker.EnvDataToken:
			return "tok"
		case worker.EnvScratch:
			return t.TempDir()
		}
		return ""
	}
}

func runStepArgs(t *testing.T, in string, args ...string) (stdout, stderr string, code int) {
	var o, e bytes.Buffer
	old := stdin
	stdin = strings.NewReader(in)
	defer func() { stdin = old }()
	code = run(t.Context(), append([]string{"step"}, args...), &o, &e)
	return o.String(), e.String(), code
}

// Outside a step (no $TETHER_DATA_URL) and with bad arguments, worker step
// exits 64 and says why.
func TestStepUsage(t *testing.T) {
	stepEnv(t, "")
	if _, errOut, code := runStepArgs(t, "", "data", "get", "x"); code != stepExitUsage || !strings.Contains(errOut, "TETHER_DATA_URL") {
		t.Errorf("outside a step: exit %d %q; want 64 naming $TETHER_DATA_URL", code, errOut)
	}
	stepEnv(t, "http://127.0.0.1:1")
	for _, args := range [][]string{
		{}, {"bogus"}, {"data"}, {"data", "put", "x"}, {"data", "put", ".bad", "-"}, {"data", "get", "x", "--version", "0"},
		{"data", "get", "x", "--version", "latest"}, {"data", "query", "--since", "yesterday"}, {"data", "query", "--attr", "novalue"},
		{"data", "put", "x", "-", "--attr", "=v"}, {"data", "rm", "x", "--request-id", "has space"}, {"secret"}, {"output"}, {"pool", "extra"},
	} {
		if _, errOut, code := runStepArgs(t, "", args...); code != stepExitUsage {
			t.Errorf("worker step %q: exit %d, want 64; %s", args, code, errOut)
		}
	}
	if out, _, code := runStepArgs(t, "", "--help"); code != 0 || !strings.Contains(out, "Exit codes:") || !strings.Contains(out, "data put NAME FILE|-") {
		t.Errorf("worker step --help: exit %d\n%s", code, out)
	}
	for _, group := range []string{"data", "secret", "token"} { // a group's help is the list of verbs
		if out, errOut, code := runStepArgs(t, "", group, "--help"); code != 0 || !strings.Contains(out, "token create") {
			t.Errorf("worker step %s --help: exit %d\n%s%s", group, code, out, errOut)
		}
	}
}

// fakeEndpoint is a step endpoint (HTTP/1.1) that answers with the
// statuses given in turn and records each request.
type fakeEndpoint struct {
	mu       sync.Mutex
	statuses []int
	reqs     []*http.Request
	bodies   []string
	answer   string
	header   http.Header
}

func (f *fakeEndpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reqs, f.bodies = append(f.reqs, r), append(f.bodies, string(b))
	st := http.StatusOK
	if len(f.statuses) > 0 {
		st, f.statuses = f.statuses[0], f.statuses[1:]
	}
	for k, v := range f.header {
		w.Header()[k] = v
	}
	w.WriteHeader(st)
	if st/100 == 2 {
		io.WriteString(w, f.answer)
	} else {
		io.WriteString(w, `{"error":"said no"}`)
	}
}

// A write whose answer is a 5xx (or never comes) is sent again with the
// same request id and the same body; a 4xx is final and maps to its exit
// code. (Planted: drawing the id per attempt made the three attempts carry
// three ids.)
func TestStepWriteRetriesWithOneRequestID(t *testing.T) {
	f := &fakeEndpoint{statuses: []int{502, 503, 201}, answer: `{"id": "out", "version": 1}`}
	srv := httptest.NewServer(f)
	defer srv.Close()
	stepEnv(t, srv.URL)
	file := filepath.Join(t.TempDir(), "in")
	os.WriteFile(file, []byte("payload"), 0o600)
	out, errOut, code := runStepArgs(t, "", "data", "put", "out", file, "--attr", "k=v")
	if code != 0 || out != `{"id":"out","version":1}`+"\n" {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if len(f.reqs) != 3 {
		t.Fatalf("%d requests, want 3", len(f.reqs))
	}
	id := f.reqs[0].Header.Get(worker.RequestIDHeader)
	for i, r := range f.reqs {
		if r.Method != http.MethodPut || r.URL.Path != "/data/out" || r.Header.Get(worker.RequestIDHeader) != id || !worker.ValidRequestID(id) ||
			f.bodies[i] != "payload" || r.Header.Get(worker.AttributeHeader) != "k=v" || r.Header.Get("Authorization") != "Bearer tok" {
			t.Errorf("attempt %d: %s %s id %q body %q attr %q; want PUT /data/out, id %q, the body, k=v", i+1, r.Method, r.URL.Path,
				r.Header.Get(worker.RequestIDHeader), f.bodies[i], r.Header.Get(worker.AttributeHeader), id)
		}
	}
	// stdin is held so that it can be sent again too.
	f.reqs, f.bodies, f.statuses = nil, nil, []int{500, 201}
	if _, errOut, code := runStepArgs(t, "from stdin", "data", "append", "log", "-"); code != 0 || len(f.bodies) != 2 || f.bodies[1] != "from stdin" {
		t.Errorf("append from stdin: exit %d, bodies %q; %s", code, f.bodies, errOut)
	}
	for status, want := range map[int]int{404: stepExitNotFound, 409: stepExitFenced, 403: stepExitRefused, 413: stepExitRefused} {
		f.reqs, f.statuses = nil, []int{status}
		if _, errOut, code := runStepArgs(t, "", "data", "rm", "x"); code != want || len(f.reqs) != 1 || !strings.Contains(errOut, "said no") {
			t.Errorf("HTTP %d: exit %d after %d requests (%q); want %d after 1, with the message", status, code, len(f.reqs), errOut, want)
		}
	}
}

// data get checks the bytes against the announced SHA-256: -o FILE is
// written only when they match.
func TestStepDataGetVerifies(t *testing.T) {
	sum := sha256.Sum256([]byte("good bytes"))
	f := &fakeEndpoint{answer: "good bytes", header: http.Header{dataplane.SHA256Header: {hex.EncodeToString(sum[:])}}}
	srv := httptest.NewServer(f)
	defer srv.Close()
	stepEnv(t, srv.URL)
	dst := filepath.Join(t.TempDir(), "got")
	if _, errOut, code := runStepArgs(t, "", "data", "get", "x", "--version", "2", "-o", dst); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if b, _ := os.ReadFile(dst); string(b) != "good bytes" || f.reqs[0].URL.Path != "/data/x/2" {
		t.Errorf("got %q from %s", b, f.reqs[0].URL.Path)
	}
	f.answer = "rotten bytes"
	dst2 := filepath.Join(t.TempDir(), "got2")
	if _, errOut, code := runStepArgs(t, "", "data", "get", "x", "-o", dst2); code != stepExitFailed || !strings.Contains(errOut, "sha256") {
		t.Errorf("corrupt bytes: exit %d %q; want 1 naming the sha256", code, errOut)
	}
	if _, err := os.Stat(dst2); err == nil {
		t.Error("corrupt bytes were written to -o")
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(dst2), ".*")); len(left) != 0 {
		t.Errorf("partial files left: %q", left)
	}
}

// The step surroundings' settings: flags over the config file, and their
// usage errors.
func TestStepSurroundingsSettings(t *testing.T) {
	cfg := writeFile(t, "worker-config.yaml", "work_dir: w\nkeep_scratch: true\ncache_size: 2MiB\npass_env: [GOPATH, \"GIT_*\"]\n")
	s, _, _, err := parseConnect([]string{"--config", cfg}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if s.WorkDir != filepath.Join(filepath.Dir(cfg), "w") || !s.KeepScratch || s.CacheBytes != 2<<20 || strings.Join(s.PassEnv, ",") != "GOPATH,GIT_*" {
		t.Errorf("from the config file: %+v", s)
	}
	s, _, _, err = parseConnect([]string{"--config", cfg, "--work-dir", "/x", "--cache-size", "0", "--pass-env", "A,B_*"}, io.Discard)
	if err != nil || s.WorkDir != "/x" || s.CacheBytes != -1 || strings.Join(s.PassEnv, ",") != "A,B_*" {
		t.Errorf("flags over the file: %+v, %v", s, err)
	}
	for _, args := range [][]string{{"--work-dir="}, {"--cache-size", "lots"}, {"--cache-size", "12"}, {"--pass-env", "["}} {
		if _, _, _, err := parseConnect(append([]string{"--token", "a.b"}, args...), io.Discard); err == nil {
			t.Errorf("worker connect %q: no usage error", args)
		}
	}
	if _, err := loadConfig("c.yaml", []byte("cache_size: huge\npass_env: [\"[\"]\n")); err == nil || !strings.Contains(err.Error(), "c.yaml:1") || !strings.Contains(err.Error(), "c.yaml:2") {
		t.Errorf("bad config keys: %v", err)
	}
}
