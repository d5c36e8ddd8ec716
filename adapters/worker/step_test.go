package worker

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-run/tether/adapters/dataplane"
)

// fakeDataPlane is an h2c data plane that keeps versions and answers a
// write's repeat (same request id) with its first answer, as SPEC §14
// requires; lose makes it drop the answer of the next n writes after
// storing them (the stream is reset: a lost answer).
type fakeDataPlane struct {
	mu       sync.Mutex
	versions map[string][][]byte
	answers  map[string][]byte // request id → first answer
	ids      []string          // request id of every write received
	lose     int
	reads    int
	corrupt  bool // announce a wrong SHA-256
	srv      *httptest.Server
}

func newFakeDataPlane(t *testing.T) *fakeDataPlane {
	f := &fakeDataPlane{versions: map[string][][]byte{}, answers: map[string][]byte{}}
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(f.serve))
	f.srv.Config.Protocols = new(http.Protocols)
	f.srv.Config.Protocols.SetUnencryptedHTTP2(true)
	f.srv.Start()
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeDataPlane) serve(w http.ResponseWriter, r *http.Request) {
	id, rest, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/data/"), "/")
	f.mu.Lock()
	defer f.mu.Unlock()
	switch r.Method {
	case http.MethodPut:
		rid := r.Header.Get(RequestIDHeader)
		f.ids = append(f.ids, rid)
		body, _ := io.ReadAll(r.Body)
		ans, seen := f.answers[rid]
		if !seen || rid == "" {
			f.versions[id] = append(f.versions[id], body)
			sum := sha256.Sum256(body)
			ans, _ = json.Marshal(dataplane.Version{ID: id, Version: uint64(len(f.versions[id])), Size: int64(len(body)), SHA256: hex.EncodeToString(sum[:])})
			f.answers[rid] = ans
		}
		if f.lose > 0 {
			f.lose--
			panic(http.ErrAbortHandler) // stored, answer lost
		}
		w.WriteHeader(http.StatusCreated)
		w.Write(ans)
	case http.MethodGet:
		f.reads++
		var n int
		fmt.Sscan(rest, &n)
		vs := f.versions[id]
		if rest == "latest" {
			n = len(vs)
		}
		if n < 1 || n > len(vs) {
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte(`{"error":"no such version"}`))
			return
		}
		b := vs[n-1]
		sum := sha256.Sum256(b)
		if f.corrupt {
			sum[0]++
		}
		w.Header().Set(dataplane.SHA256Header, hex.EncodeToString(sum[:]))
		w.Header().Set(dataplane.VersionHeader, fmt.Sprint(n))
		w.Header().Set("Content-Length", fmt.Sprint(len(b)))
		w.Write(b)
	}
}

func (f *fakeDataPlane) client(t *testing.T) *DataClient {
	c, err := NewDataClient(f.srv.URL, nil, func() string { return "cred" })
	if err != nil {
		t.Fatal(err)
	}
	c.SetRetry(Retry{Attempts: 4, First: time.Millisecond, Max: time.Millisecond})
	return c
}

func testEndpoint(t *testing.T, c *DataClient, cacheBytes int64) (*stepEndpoint, string) {
	e, err := startStepEndpoint(slog.New(slog.NewTextHandler(io.Discard, nil)), c, newReadCache(cacheBytes), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.close)
	return e, e.grant(7)[EnvDataToken]
}

func stepRequest(t *testing.T, e *stepEndpoint, tok, method, path string, body []byte, hdr map[string]string) *http.Response {
	req, _ := http.NewRequestWithContext(t.Context(), method, e.URL()+path, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+tok)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// A step's PUT whose answer is lost twice on the way back is sent again
// with the same request id (the step's own, or one the endpoint drew), and
// the step gets the first answer: one version. (Planted: a fresh id per
// attempt made versions 1–3 and answered 3.)
func TestStepEndpointRetriesAWriteWithItsRequestID(t *testing.T) {
	f := newFakeDataPlane(t)
	e, tok := testEndpoint(t, f.client(t), 0)
	big := bytes.Repeat([]byte("b"), spoolMemory+10) // held in a file, not in memory
	for i, own := range []string{"", "step-chose-this.1", ""} {
		f.mu.Lock()
		f.lose, f.ids, f.versions = 2, nil, map[string][][]byte{}
		f.mu.Unlock()
		hdr := map[string]string{}
		if own != "" {
			hdr[RequestIDHeader] = own
		}
		body := []byte("the bytes")
		if i == 2 {
			body = big
		}
		resp := stepRequest(t, e, tok, http.MethodPut, "/data/out", body, hdr)
		var v dataplane.Version
		json.NewDecoder(resp.Body).Decode(&v)
		f.mu.Lock()
		ids, n := f.ids, len(f.versions["out"])
		f.mu.Unlock()
		if n == 1 && !bytes.Equal(f.versions["out"][0], body) {
			t.Errorf("case %d: the stored bytes differ from the step's", i)
		}
		if resp.StatusCode != http.StatusCreated || v.Version != 1 || n != 1 {
			t.Errorf("own id %q: HTTP %d version %d, %d stored; want 201, version 1, one stored", own, resp.StatusCode, v.Version, n)
		}
		if len(ids) != 3 || ids[0] != ids[1] || ids[1] != ids[2] || (own != "" && ids[0] != own) || !ValidRequestID(ids[0]) {
			t.Errorf("own id %q: the attempts carried request ids %q; want three of one id (the step's own when it sent one)", own, ids)
		}
	}
	// A malformed id is refused and nothing is forwarded.
	f.mu.Lock()
	f.ids = nil
	f.mu.Unlock()
	if resp := stepRequest(t, e, tok, http.MethodPut, "/data/out", []byte("x"), map[string]string{RequestIDHeader: "no spaces allowed"}); resp.StatusCode != http.StatusBadRequest || len(f.ids) != 0 {
		t.Errorf("a malformed request id: HTTP %d, %d forwarded; want 400, none", resp.StatusCode, len(f.ids))
	}
}

// A write is sent at most Retry.Attempts times; a 4xx is never sent again.
func TestDataClientRetryBounds(t *testing.T) {
	var mu sync.Mutex
	calls := 0
	status := http.StatusServiceUnavailable
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls++
		mu.Unlock()
		w.WriteHeader(status)
		w.Write([]byte(`{"error":"no"}`))
	}))
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	defer srv.Close()
	c, _ := NewDataClient(srv.URL, nil, func() string { return "cred" })
	c.SetRetry(Retry{Attempts: 3, First: time.Millisecond, Max: time.Millisecond})
	if _, err := c.Put(t.Context(), 1, "x", strings.NewReader("b"), 1); err == nil || calls != 3 {
		t.Errorf("503 each time: %d sends, %v; want 3 and an error", calls, err)
	}
	calls, status = 0, http.StatusConflict
	if _, err := c.Put(t.Context(), 1, "x", strings.NewReader("b"), 1); !errors.Is(err, ErrDataFenced) || calls != 1 {
		t.Errorf("409: %d sends, %v; want 1 and ErrDataFenced", calls, err)
	}
}

// The read cache answers a numbered version's second read without the
// orchestrator and with the same bytes; `latest` is never cached; bytes
// whose SHA-256 is not the announced one are neither served nor cached.
// (Planted: caching `latest` made the second latest read a hit.)
func TestStepEndpointReadCache(t *testing.T) {
	f := newFakeDataPlane(t)
	f.versions["in"] = [][]byte{[]byte("version one"), []byte("version two")}
	e, tok := testEndpoint(t, f.client(t), 1<<20)
	read := func(path string) (string, string, int) {
		resp := stepRequest(t, e, tok, http.MethodGet, path, nil, nil)
		b, _ := io.ReadAll(resp.Body)
		return string(b), resp.Header.Get(CacheHeader), resp.StatusCode
	}
	for i, want := range []string{"miss", "hit", "hit"} {
		b, cache, code := read("/data/in/1")
		if b != "version one" || cache != want || code != 200 {
			t.Errorf("read %d of in/1: %q, cache %q, HTTP %d; want the bytes, %s", i+1, b, cache, code, want)
		}
	}
	if f.reads != 1 {
		t.Errorf("the orchestrator was read %d times for three reads of one version, want 1", f.reads)
	}
	read("/data/in/latest")
	f.mu.Lock()
	f.versions["in"] = append(f.versions["in"], []byte("v3"))
	f.mu.Unlock()
	if b, cache, _ := read("/data/in/latest"); cache == "hit" || b != "v3" {
		t.Errorf("latest after a new version: %q, cache %q; want v3 from the orchestrator", b, cache)
	}
	f.corrupt = true
	if b, _, code := read("/data/in/2"); code != http.StatusBadGateway || strings.Contains(b, "version two") {
		t.Errorf("a version with a wrong SHA-256: HTTP %d %q; want 502 without the bytes", code, b)
	}
	if _, n := e.cache.size(); n != 1 {
		t.Errorf("%d versions cached, want 1 (the corrupt one not)", n)
	}
}

// The cache holds at most its bound, evicting the least recently used; a
// cached copy that no longer matches its SHA-256 is dropped, not served.
func TestReadCacheBoundAndCheck(t *testing.T) {
	c := newReadCache(10)
	sha := func(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }
	put := func(id, b string) { c.put(cacheKey{id, 1}, []byte(b), sha(b), nil) }
	put("a", "1234")
	put("b", "5678")
	c.get(cacheKey{"a", 1}) // a is now the most recently used
	put("c", "9012")        // 12 bytes > 10: b goes
	if _, ok := c.get(cacheKey{"b", 1}); ok {
		t.Error("b, the least recently used, was not evicted")
	}
	if _, ok := c.get(cacheKey{"a", 1}); !ok {
		t.Error("a was evicted")
	}
	if used, _ := c.size(); used > 10 {
		t.Errorf("%d bytes cached, bound 10", used)
	}
	if c.put(cacheKey{"big", 1}, []byte("01234567890"), sha("01234567890"), nil) {
		t.Error("a version larger than the cache was cached")
	}
	e, _ := c.get(cacheKey{"a", 1})
	e.b[0] = 'X' // the copy rots
	if _, ok := c.get(cacheKey{"a", 1}); ok {
		t.Error("a copy that fails its SHA-256 was served")
	}
}

// A step's output directory: regular files named as data ids, in name
// order; a link, a directory, a bad name, too many files or bytes are
// refused, naming the entry.
func TestListOutputs(t *testing.T) {
	mk := func(files map[string]string, extra func(dir string)) string {
		dir := t.TempDir()
		for n, b := range files {
			os.WriteFile(filepath.Join(dir, n), []byte(b), 0o600)
		}
		if extra != nil {
			extra(dir)
		}
		return dir
	}
	got, err := listOutputs(mk(map[string]string{"b.txt": "22", "a.txt": "1"}, nil), 10, 100)
	if err != nil || len(got) != 2 || got[0] != (outputFile{"a.txt", 1}) || got[1] != (outputFile{"b.txt", 2}) {
		t.Errorf("two files: %v, %v", got, err)
	}
	for name, c := range map[string]struct {
		dir  string
		want string
	}{
		"link":      {mk(nil, func(d string) { os.Symlink("/etc/passwd", filepath.Join(d, "p")) }), "p is a symbolic link"},
		"subdir":    {mk(nil, func(d string) { os.Mkdir(filepath.Join(d, "sub"), 0o700) }), "sub is a directory"},
		"bad name":  {mk(map[string]string{"-x": "1"}, nil), "data id"},
		"too many":  {mk(map[string]string{"a": "", "b": "", "c": ""}, nil), "more than 2 files"},
		"too large": {mk(map[string]string{"a": strings.Repeat("x", 101)}, nil), "more than 100 bytes"},
	} {
		maxFiles := 10
		if name == "too many" {
			maxFiles = 2
		}
		_, err = listOutputs(c.dir, maxFiles, 100)
		if !errors.Is(err, ErrOutputDir) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error naming %q", name, err, c.want)
		}
	}
}

// A step inherits PATH and the like from the worker, and what --pass-env
// names, never the rest nor TETHER_*. (Planted: inheriting everything let
// CLOUD_KEY through.)
func TestStepBaseEnv(t *testing.T) {
	environ := []string{"PATH=/bin", "HOME=/h", "LC_ALL=C", "CLOUD_KEY=secret", "TETHER_WORKER_TOKEN=w.s", "GIT_SSH=ssh", "GOPATH=/go"}
	got := StepBaseEnv(environ, nil)
	if want := []string{"PATH=/bin", "HOME=/h", "LC_ALL=C"}; !slices.Equal(got, want) {
		t.Errorf("default: %q, want %q", got, want)
	}
	got = StepBaseEnv(environ, []string{"GIT_*", "TETHER_*"})
	if want := []string{"PATH=/bin", "HOME=/h", "LC_ALL=C", "GIT_SSH=ssh"}; !slices.Equal(got, want) {
		t.Errorf("--pass-env GIT_*,TETHER_*: %q, want %q", got, want)
	}
	if CheckEnvPattern("[") == nil || CheckEnvPattern("") == nil || CheckEnvPattern("AWS_*") != nil {
		t.Error("CheckEnvPattern")
	}
}

func TestValidIDs(t *testing.T) {
	for s, want := range map[string]bool{"a": true, "A.b_c-9": true, "": false, ".x": false, "-x": false, "a/b": false, strings.Repeat("a", 128): true, strings.Repeat("a", 129): false, "é": false} {
		if ValidDataID(s) != want {
			t.Errorf("ValidDataID(%q) != %v", s, want)
		}
	}
	for s, want := range map[string]bool{"a": true, ".-_": true, "": false, "a b": false, strings.Repeat("a", 64): true, strings.Repeat("a", 65): false} {
		if ValidRequestID(s) != want {
			t.Errorf("ValidRequestID(%q) != %v", s, want)
		}
	}
}
