package orchestrator_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-run/tether/adapters/dataplane"
	"github.com/tether-run/tether/adapters/netfault"
	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/core"
)

// send sends one request with extra headers (each value a separate
// header line) over hc; a transport error is returned, not fatal.
func (r *dataRig) send(hc *http.Client, base, method, path string, body []byte, cred string, lease core.LeaseID, hdr map[string][]string) (answer, error) {
	r.t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(r.ctx, method, base+path, rd)
	if err != nil {
		r.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+cred)
	if lease != 0 {
		req.Header.Set(orchestrator.LeaseHeader, strconv.FormatUint(uint64(lease), 10))
	}
	for k, vs := range hdr {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	resp, err := hc.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, err
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: b, proto: resp.ProtoMajor}, nil
}

func (r *dataRig) must(method, path string, body []byte, cred string, lease core.LeaseID, hdr map[string][]string, want int) answer {
	r.t.Helper()
	a, err := r.send(r.hc, r.d.DataURL(), method, path, body, cred, lease, hdr)
	if err != nil {
		r.t.Fatalf("%s %s: %v", method, path, err)
	}
	if a.status != want {
		r.t.Fatalf("%s %s: HTTP %d %s, want %d", method, path, a.status, a.body, want)
	}
	return a
}

func reqID(id string) map[string][]string { return map[string][]string{dataplane.RequestIDHeader: {id}} }

func (r *dataRig) versions(cred, id string) []dataplane.Version {
	r.t.Helper()
	var list dataplane.Versions
	a := r.must("GET", "/data/"+id, nil, cred, 0, nil, http.StatusOK)
	if err := json.Unmarshal(a.body, &list); err != nil {
		r.t.Fatal(err)
	}
	return list.Versions
}

// cutTap severs the proxy's links at the first chunk from the
// orchestrator that holds marker, once armed: the answer to a write is
// lost after the write was made.
type cutTap struct {
	p      atomic.Pointer[netfault.Proxy]
	armed  atomic.Bool
	marker []byte
	cuts   atomic.Int32
}

func (c *cutTap) Read(_ uint64, dir netfault.Dir, p []byte, _ time.Time) {
	if dir == netfault.Down && c.armed.Load() && bytes.Contains(p, c.marker) {
		c.armed.Store(false)
		c.cuts.Add(1)
		c.p.Load().Cut()
	}
}
func (c *cutTap) Closed(uint64) {}

// TestDataPlaneRetriedPutAfterCut: a PUT whose answer is lost to a
// connection cut mid-answer (real sockets, the cutting proxy), sent again
// with the same Tether-Request-Id, gets the first answer and leaves exactly
// one version; so does an append, and a DELETE. Once the lease ended, a
// repeat still gets the original 201 (verbatim), while a new write is
// fenced (409) (SPEC §14, idempotent writes). Planted bug: with the
// store's repeat lookup removed (repeated answering "not found"), the
// retried PUT made version 2 and this test failed.
func TestDataPlaneRetriedPutAfterCut(t *testing.T) {
	r := startData(t, orchestrator.Options{})
	w := r.enroll("w1")
	dm := r.lease(w, "build")

	tap := &cutTap{marker: []byte(`"sha256"`)}
	px, err := netfault.Listen(r.d.Addr(), tap)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	tap.p.Store(px)
	fresh := func() *http.Client { // a new connection each time
		tr := &http.Transport{Protocols: new(http.Protocols)}
		tr.Protocols.SetUnencryptedHTTP2(true)
		return &http.Client{Transport: tr, Timeout: testTimeout}
	}
	base := "http://" + px.Addr()

	tap.armed.Store(true)
	if a, err := r.send(fresh(), base, "PUT", "/data/out", []byte("hello"), w.cred, dm.Lease, reqID("put-1")); err == nil {
		t.Fatalf("the cut PUT was answered: HTTP %d %s", a.status, a.body)
	}
	if tap.cuts.Load() != 1 {
		t.Fatalf("the proxy cut %d times, want 1", tap.cuts.Load())
	}
	px.Restore()
	a, err := r.send(fresh(), base, "PUT", "/data/out", []byte("hello"), w.cred, dm.Lease, reqID("put-1"))
	if err != nil || a.status != http.StatusCreated {
		t.Fatalf("the retried PUT: %v, HTTP %d %s", err, a.status, a.body)
	}
	var v dataplane.Version
	if err := json.Unmarshal(a.body, &v); err != nil || v.Version != 1 || v.SHA256 != sha([]byte("hello")) || a.header.Get("Tether-Repeated") != "true" {
		t.Fatalf("the retried PUT answered %s (%v), headers %v; want the first answer, version 1", a.body, err, a.header)
	}
	if vs := r.versions(w.cred, "out"); len(vs) != 1 {
		t.Fatalf("after a retried PUT: %d versions, want exactly 1: %+v", len(vs), vs)
	}
	retried := a.body

	// A write answered in full, repeated: the same bytes, nothing written.
	first := r.must("PUT", "/data/out", []byte("two"), w.cred, dm.Lease, reqID("put-2"), http.StatusCreated)
	again := r.must("PUT", "/data/out", []byte("ignored"), w.cred, dm.Lease, reqID("put-2"), http.StatusCreated)
	if !bytes.Equal(first.body, again.body) {
		t.Fatalf("a repeat answered %s, the first %s", again.body, first.body)
	}
	app := r.must("POST", "/data/log/append", []byte("line\n"), w.cred, dm.Lease, reqID("app-1"), http.StatusOK)
	app2 := r.must("POST", "/data/log/append", []byte("line\n"), w.cred, dm.Lease, reqID("app-1"), http.StatusOK)
	if !bytes.Equal(app.body, app2.body) {
		t.Fatalf("a repeated append answered %s, the first %s", app2.body, app.body)
	}
	if s := r.must("GET", "/data/log/append", nil, w.cred, 0, nil, http.StatusOK); string(s.body) != "line\n" {
		t.Fatalf("the stream after a repeated append: %q, want one line", s.body)
	}
	// A request id names one write: reused for another is refused.
	r.must("PUT", "/data/other", []byte("x"), w.cred, dm.Lease, reqID("put-2"), http.StatusConflict)
	r.must("PUT", "/data/out", []byte("x"), w.cred, dm.Lease, reqID("bad id!"), http.StatusBadRequest)

	// The lease ends; a repeat still gets its first answer, verbatim.
	w.finish(dm)
	late := r.must("PUT", "/data/out", []byte("hello"), w.cred, dm.Lease, reqID("put-1"), http.StatusCreated)
	if !bytes.Equal(late.body, retried) {
		t.Fatalf("a repeat after the lease ended answered %s, before %s", late.body, retried)
	}
	late2 := r.must("PUT", "/data/out", []byte("two"), w.cred, dm.Lease, reqID("put-2"), http.StatusCreated)
	if !bytes.Equal(late2.body, first.body) {
		t.Fatalf("a repeat after the lease ended answered %s, the first %s", late2.body, first.body)
	}
	r.must("PUT", "/data/out", []byte("new"), w.cred, dm.Lease, reqID("put-3"), http.StatusConflict)
	// Another worker cannot replay someone else's answer.
	w2 := r.enroll("w2")
	r.must("PUT", "/data/out", []byte("hello"), w2.cred, dm.Lease, reqID("put-1"), http.StatusConflict)
	if vs := r.versions(w.cred, "out"); len(vs) != 2 {
		t.Fatalf("%d versions, want 2: %+v", len(vs), vs)
	}
}
