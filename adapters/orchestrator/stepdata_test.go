package orchestrator_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
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

func reqID(id string) map[string][]string {
	return map[string][]string{dataplane.RequestIDHeader: {id}}
}

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

// leaseOf submits spec (its first step targeted at w) and starts that
// step: w then holds a current lease on it.
func (r *dataRig) leaseOf(w *hand, spec core.RunSpec) core.Dispatch {
	r.t.Helper()
	spec.Steps[0].Target = w.name
	if _, err := r.d.Submit(r.ctx, spec); err != nil {
		r.t.Fatal(err)
	}
	dm, ok := w.recv().(core.Dispatch)
	if !ok {
		r.t.Fatalf("want a Dispatch, got %s", core.DescribeMsg(dm))
	}
	w.send(core.Start{Lease: dm.Lease, Request: 1})
	if m, ok := w.recv().(core.StartAck); !ok || !m.OK {
		r.t.Fatalf("want StartAck OK, got %s", core.DescribeMsg(m))
	}
	return dm
}

// TestDataPlaneDeclaredOutputs: a step that declares outputs writes only
// those ids (or prefixes): a PUT, append or DELETE elsewhere is 403 and
// stores nothing; a step that declares none writes anywhere (SPEC §14,
// declared writes). Planted bug: with the core's output check skipped
// (output admitting every id), the PUT to "elsewhere" was stored (201)
// and this test failed.
func TestDataPlaneDeclaredOutputs(t *testing.T) {
	r := startData(t, orchestrator.Options{})
	w := r.enroll("w1")
	dm := r.leaseOf(w, core.RunSpec{Name: "out", Steps: []core.StepSpec{{Name: "make", Command: "true", Writes: true, Outputs: []string{"report.txt", "logs-*"}}}})
	r.must("PUT", "/data/report.txt", []byte("r"), w.cred, dm.Lease, nil, http.StatusCreated)
	r.must("PUT", "/data/logs-1", []byte("l"), w.cred, dm.Lease, nil, http.StatusCreated)
	r.must("POST", "/data/logs-2/append", []byte("l"), w.cred, dm.Lease, nil, http.StatusOK)
	for _, c := range []struct{ method, path string }{{"PUT", "/data/elsewhere"}, {"POST", "/data/elsewhere/append"}, {"DELETE", "/data/elsewhere"}, {"PUT", "/data/report.txt2"}} {
		a := r.must(c.method, c.path, []byte("x"), w.cred, dm.Lease, reqID("r-"+c.method), http.StatusForbidden)
		if msg := a.errorText(t); !strings.Contains(msg, "declared outputs") || !strings.Contains(msg, `"report.txt"`) {
			t.Fatalf("%s %s: %q does not say which outputs the step declares", c.method, c.path, msg)
		}
	}
	r.must("GET", "/data/elsewhere", nil, w.cred, 0, nil, http.StatusNotFound)
	r.must("GET", "/data/report.txt2", nil, w.cred, 0, nil, http.StatusNotFound)
	// The refused write's request id stored nothing: once allowed... it
	// never is; a step that declares nothing writes anywhere.
	dm2 := r.lease(w, "free")
	r.must("PUT", "/data/elsewhere", []byte("x"), w.cred, dm2.Lease, nil, http.StatusCreated)
}

// TestDataPlaneDeleteAndQuery: DELETE makes a tombstone version (latest
// answers 404, a pinned earlier version still reads its bytes, the
// listing shows the tombstone); GET /data selects by prefix, attributes,
// writer run and step and time, sorted by (id, version), paginated with a
// cursor; operators get the same under /api/data (SPEC §14).
func TestDataPlaneDeleteAndQuery(t *testing.T) {
	r := startData(t, orchestrator.Options{})
	w := r.enroll("w1")
	dm := r.lease(w, "build")
	attr := func(kv ...string) map[string][]string { return map[string][]string{dataplane.AttributeHeader: kv} }
	r.must("PUT", "/data/a.1", []byte("one"), w.cred, dm.Lease, attr("kind=log", "team=x"), http.StatusCreated)
	r.must("PUT", "/data/a.1", []byte("two"), w.cred, dm.Lease, attr("kind=bin"), http.StatusCreated)
	r.must("PUT", "/data/a.2", []byte("three"), w.cred, dm.Lease, attr("kind=log"), http.StatusCreated)
	r.must("PUT", "/data/b", []byte("four"), w.cred, dm.Lease, nil, http.StatusCreated)
	r.must("PUT", "/data/bad", []byte("x"), w.cred, dm.Lease, attr("novalue"), http.StatusBadRequest)
	r.must("PUT", "/data/bad", []byte("x"), w.cred, dm.Lease, attr("k="+strings.Repeat("v", 257)), http.StatusBadRequest)

	// Delete.
	del := r.must("DELETE", "/data/a.1", nil, w.cred, dm.Lease, reqID("del-1"), http.StatusCreated)
	var tomb dataplane.Version
	if err := json.Unmarshal(del.body, &tomb); err != nil || !tomb.Deleted || tomb.Version != 3 || tomb.Size != 0 {
		t.Fatalf("DELETE answered %s (%v), want a tombstone version 3", del.body, err)
	}
	again := r.must("DELETE", "/data/a.1", nil, w.cred, dm.Lease, reqID("del-1"), http.StatusCreated)
	if !bytes.Equal(again.body, del.body) {
		t.Fatalf("a repeated DELETE answered %s, the first %s", again.body, del.body)
	}
	if msg := r.must("GET", "/data/a.1/latest", nil, w.cred, 0, nil, http.StatusNotFound).errorText(t); !strings.Contains(msg, "deleted") {
		t.Fatalf("latest of a deleted id: %q", msg)
	}
	r.must("GET", "/data/a.1/3", nil, w.cred, 0, nil, http.StatusNotFound)
	if a := r.must("GET", "/data/a.1/2", nil, w.cred, 0, nil, http.StatusOK); string(a.body) != "two" {
		t.Fatalf("a pinned version after the delete read %q", a.body)
	}
	if vs := r.versions(w.cred, "a.1"); len(vs) != 3 || !vs[2].Deleted {
		t.Fatalf("the listing after a delete: %+v", vs)
	}
	r.must("DELETE", "/data/a.1", nil, w.cred, dm.Lease, nil, http.StatusNotFound) // already deleted
	r.must("DELETE", "/data/nothing", nil, w.cred, dm.Lease, nil, http.StatusNotFound)
	// A new PUT revives it.
	r.must("PUT", "/data/a.1", []byte("five"), w.cred, dm.Lease, nil, http.StatusCreated)
	if a := r.must("GET", "/data/a.1/latest", nil, w.cred, 0, nil, http.StatusOK); string(a.body) != "five" {
		t.Fatalf("latest after a PUT over a tombstone: %q", a.body)
	}

	query := func(q string) dataplane.Query {
		t.Helper()
		var out dataplane.Query
		a := r.must("GET", "/data?"+q, nil, w.cred, 0, nil, http.StatusOK)
		if err := json.Unmarshal(a.body, &out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	names := func(q dataplane.Query) string {
		var s []string
		for _, v := range q.Items {
			s = append(s, v.ID+"@"+strconv.FormatUint(v.Version, 10))
		}
		return strings.Join(s, " ")
	}
	for q, want := range map[string]string{
		"prefix=a.":                 "a.1@1 a.1@2 a.1@3 a.1@4 a.2@1",
		"":                          "a.1@1 a.1@2 a.1@3 a.1@4 a.2@1 b@1",
		"attr.kind=log":             "a.1@1 a.2@1",
		"attr.kind=log&attr.team=x": "a.1@1",
		"run=" + string(dm.Step)[:strings.Index(string(dm.Step), "/")] + "&step=" + string(dm.Step): "a.1@1 a.1@2 a.1@3 a.1@4 a.2@1 b@1",
		"step=nobody/x": "",
		"since=2000-01-01T00:00:00Z&until=2000-01-02T00:00:00Z": "",
	} {
		if got := names(query(q)); got != want {
			t.Errorf("GET /data?%s: %q, want %q", q, got, want)
		}
	}
	// Pages of two, following next, cover the whole list once.
	var all []string
	for q, pages := query("limit=2"), 0; ; q = query("limit=2&after=" + q.Next) {
		if all = append(all, names(q)); q.Next == "" {
			break
		}
		if pages++; pages > 5 {
			t.Fatal("paging never ends")
		}
	}
	if got := strings.Join(all, " "); got != "a.1@1 a.1@2 a.1@3 a.1@4 a.2@1 b@1" {
		t.Fatalf("paged: %q", got)
	}
	r.must("GET", "/data?limit=0", nil, w.cred, 0, nil, http.StatusBadRequest)
	r.must("GET", "/data?limit=1001", nil, w.cred, 0, nil, http.StatusBadRequest)
	r.must("GET", "/data?colour=red", nil, w.cred, 0, nil, http.StatusBadRequest)
	r.must("GET", "/data?since=yesterday", nil, w.cred, 0, nil, http.StatusBadRequest)
	r.must("GET", "/data", nil, "", 0, nil, http.StatusUnauthorized)
	// Operators: the same query under /api/data with an operator token.
	a := r.must("GET", "/api/data?prefix=a.2", nil, adminToken, 0, nil, http.StatusOK)
	var op dataplane.Query
	if err := json.Unmarshal(a.body, &op); err != nil || names(op) != "a.2@1" {
		t.Fatalf("GET /api/data?prefix=a.2: %s (%v)", a.body, err)
	}
}

// TestDataPlaneStepReads: GET /step/definition answers the lease's run,
// workflow and step declaration; GET /step/output/{step} a step of the
// same run (state, exit, the versions it wrote, its declared outputs),
// also once the lease ended while the run is live; GET /pool the workers
// as data, without tokens (SPEC §14: readDefinition, readOutput).
func TestDataPlaneStepReads(t *testing.T) {
	r := startData(t, orchestrator.Options{})
	w := r.enroll("w1")
	spec := core.RunSpec{Name: "pipe", Steps: []core.StepSpec{
		{Name: "build", Command: "make", Writes: true, Outputs: []string{"bin"}},
		{Name: "test", Command: "make test", DependsOn: []string{"build"}, Target: "w1"},
	}}
	dm := r.leaseOf(w, spec)
	r.must("PUT", "/data/bin", []byte("elf"), w.cred, dm.Lease, nil, http.StatusCreated)

	var def orchestrator.StepDefinitionAnswer
	a := r.must("GET", "/step/definition", nil, w.cred, dm.Lease, nil, http.StatusOK)
	if err := json.Unmarshal(a.body, &def); err != nil || def.Step != string(dm.Step) || def.Definition.Name != "build" ||
		def.Definition.Command != "make" || len(def.Workflow.Steps) != 2 || def.Workflow.Name != "pipe" || !strings.HasPrefix(def.Step, def.Run+"/") {
		t.Fatalf("definition: %s (%v)", a.body, err)
	}
	r.must("GET", "/step/definition", nil, w.cred, 0, nil, http.StatusBadRequest)
	r.must("GET", "/step/definition", nil, w.cred, dm.Lease+100, nil, http.StatusNotFound)
	w2 := r.enroll("w2")
	r.must("GET", "/step/definition", nil, w2.cred, dm.Lease, nil, http.StatusNotFound) // another worker's lease

	w.send(core.Report{Step: dm.Step, Lease: dm.Lease, Request: 2, Outcome: core.Outcome{Status: core.OutcomeSuccess}})
	if m, ok := w.recv().(core.Answer); !ok || m.Verdict != core.Committed {
		t.Fatalf("want COMMITTED, got %s", core.DescribeMsg(m))
	}
	next, ok := w.recv().(core.Dispatch) // test, on w1
	if !ok {
		t.Fatalf("want the dispatch of test, got %s", core.DescribeMsg(next))
	}
	var out orchestrator.StepOutputAnswer
	for _, lease := range []core.LeaseID{next.Lease, dm.Lease} { // the ended lease still reads while the run lives
		a = r.must("GET", "/step/output/build", nil, w.cred, lease, nil, http.StatusOK)
		if err := json.Unmarshal(a.body, &out); err != nil || out.State != core.StateSuccess.String() || out.Exit == nil || *out.Exit != 0 ||
			len(out.Writes) != 1 || out.Writes[0].ID != "bin" || len(out.Outputs) != 1 || out.Outputs[0] != "bin" {
			t.Fatalf("output of build (lease %d): %s (%v)", lease, a.body, err)
		}
	}
	a = r.must("GET", "/step/output/test", nil, w.cred, next.Lease, nil, http.StatusOK)
	if err := json.Unmarshal(a.body, &out); err != nil || out.Exit != nil || len(out.Writes) != 0 || out.Outputs == nil {
		t.Fatalf("output of a step not finished: %s (%v)", a.body, err)
	}
	r.must("GET", "/step/output/nope", nil, w.cred, next.Lease, nil, http.StatusNotFound)

	var pool orchestrator.PoolAnswer
	a = r.must("GET", "/pool", nil, w.cred, 0, nil, http.StatusOK)
	if err := json.Unmarshal(a.body, &pool); err != nil || len(pool.Workers) != 2 || pool.Workers[0].Name != "w1" ||
		pool.Workers[0].State != "connected" || pool.Workers[0].Busy != 1 || pool.Workers[0].Slots != 4 || pool.Workers[1].Busy != 0 {
		t.Fatalf("pool: %s (%v)", a.body, err)
	}
	if bytes.Contains(a.body, []byte("token")) || bytes.Contains(a.body, []byte("Cred")) {
		t.Fatalf("the pool shows a token or a credential: %s", a.body)
	}
	r.must("GET", "/pool", nil, "", 0, nil, http.StatusUnauthorized)
}
