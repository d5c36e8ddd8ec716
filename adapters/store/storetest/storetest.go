// Package storetest is the contract test suite of store.Backend (SPEC §11):
// every backend runs the same Run, as a user of the contract — the records
// of the live state, the data plane's writes in one transaction with them,
// blobs, the history of archived runs, the audit log, sealed secrets and
// retention — and everything it wrote must survive a reopen.
package storetest

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-run/tether/adapters/store"
	"github.com/tether-run/tether/core"
)

// Run runs the suite. open returns a new, empty backend (the suite closes
// it); reopen closes b and opens the same storage again, as a restarted
// orchestrator does. The suite gives a reopened backend its secrets key
// again itself.
func Run(t *testing.T, open func(t *testing.T) store.Backend, reopen func(t *testing.T, b store.Backend) store.Backend) {
	r := func(name string, f func(t *testing.T, h *harness)) {
		t.Run(name, func(t *testing.T) {
			h := &harness{t: t, b: open(t), reopen: reopen}
			t.Cleanup(func() { h.b.Close() })
			f(t, h)
		})
	}
	r("Records", testRecords)
	r("Visible", testVisible)
	r("Pipeline", testPipeline)
	r("Data", testData)
	r("Requests", testRequests)
	r("Blobs", testBlobs)
	r("Bundles", testBundles)
	r("History", testHistory)
	r("Audit", testAudit)
	r("Secrets", testSecrets)
	r("Retention", testRetention)
	r("RequestLimits", testRequestLimits)
	r("ConcurrentBlobs", testConcurrentBlobs)
	r("Closed", testClosed)
}

// harness holds the backend under test.
type harness struct {
	t      *testing.T
	b      store.Backend
	reopen func(t *testing.T, b store.Backend) store.Backend
	key    []byte // the secrets key given, given again at a reopen
}

func (h *harness) restart() {
	h.t.Helper()
	h.b = h.reopen(h.t, h.b)
	if h.key != nil {
		if err := h.b.SetSecretsKey(h.key); err != nil {
			h.t.Fatal(err)
		}
	}
}

// twice runs check, then again after a reopen.
func (h *harness) twice(check func(when string)) {
	h.t.Helper()
	check("before a reopen")
	h.restart()
	check("after a reopen")
}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func rec(key, value string) core.Record { return core.Record{Key: key, Value: []byte(value)} }
func del(key string) core.Record        { return core.Record{Key: key, Delete: true} }

func jsonRec(t *testing.T, key string, v any) core.Record {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return core.Record{Key: key, Value: b}
}

func leaseKey(id core.LeaseID) string { return fmt.Sprintf("%s/%020d", core.KindLease, id) }
func logKey(id core.LeaseID, i int) string {
	return fmt.Sprintf("%s/%020d/%010d", core.KindLog, id, i)
}

func logRec(t *testing.T, step core.StepID, lease core.LeaseID, i int) core.Record {
	return jsonRec(t, logKey(lease, i), core.StepLogLine{Step: step, Lease: lease, Index: i,
		Line: core.LogLine{Seq: uint64(i + 1), At: t0, Text: fmt.Sprintf("line %d of lease %d", i, lease)}})
}

func keys(recs []core.Record) map[string]string {
	m := map[string]string{}
	for _, r := range recs {
		m[r.Key] = string(r.Value)
	}
	return m
}

func (h *harness) load() []core.Record {
	h.t.Helper()
	recs, err := h.b.Load()
	if err != nil {
		h.t.Fatal(err)
	}
	return recs
}

// Apply: upserts and deletes in order (a later record of a key wins), all
// or nothing; Load returns the live state sorted by key — never a history
// record, an audit entry, nor the log lines of a lease no longer live.
func testRecords(t *testing.T, h *harness) {
	if err := h.b.Apply(nil); err != nil {
		t.Fatalf("an empty batch: %v", err)
	}
	must(t, h.b.Apply([]core.Record{rec(core.KindMeta, `{"RunSeq":1}`), rec("worker/w1", "one"), rec("worker/w2", "two"),
		rec("token/t1", "tok"), rec(leaseKey(5), `{}`), logRec(t, "r/s", 5, 0), logRec(t, "r/s", 6, 0)}))
	must(t, h.b.Apply([]core.Record{rec("worker/w1", "one again"), del("worker/w2"), rec("worker/w3", "first"), rec("worker/w3", "last"),
		rec("worker/w4", "born"), del("worker/w4")}))
	// A batch with a record no backend can hold applies nothing of itself.
	if err := h.b.Apply([]core.Record{rec("worker/w1", "torn"), del("token/t1"), {Key: "", Value: []byte("x")}}); err == nil {
		t.Fatal("a record with an empty key was applied")
	}
	want := map[string]string{core.KindMeta: `{"RunSeq":1}`, "worker/w1": "one again", "worker/w3": "last", "token/t1": "tok",
		leaseKey(5): `{}`, logKey(5, 0): string(logRec(t, "r/s", 5, 0).Value)}
	h.twice(func(when string) {
		recs := h.load()
		if got := keys(recs); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: Load = %v\nwant %v (the log line of lease 6, which is not live, is not state)", when, got, want)
		}
		if !sort.SliceIsSorted(recs, func(i, j int) bool { return recs[i].Key < recs[j].Key }) {
			t.Errorf("%s: Load is not sorted by key", when)
		}
	})
}

// Visible: what a commit made durable is what every read sees the moment
// it returns, whatever the backend defers behind its durable point (a log
// or journal in front of its tables, SPEC §11): Load, the history, its
// log lines, the listing, the count, the audit log and retention, after
// each of Apply, a place of the pipeline and ApplyWithData, round after
// round, each round rewriting the keys of the one before.
func testVisible(t *testing.T, h *harness) {
	pipe, _ := h.b.(store.Pipeline)
	for round := 1; round <= 12; round++ {
		rh := history(uint64(round), "success", core.LeaseID(500+round))
		recs := []core.Record{
			rec("worker/w", fmt.Sprintf("round %d", round)),
			rec(leaseKey(core.LeaseID(900+round)), fmt.Sprintf(`{"round":%d}`, round)),
			logRec(t, "r/s", core.LeaseID(900+round), round),
			jsonRec(t, core.HistoryKey(rh.Run.ID), rh),
			logRec(t, rh.Run.Steps[0], core.LeaseID(500+round), 0),
			auditRec(t, uint64(round), "alice"),
		}
		if round > 1 {
			recs = append(recs, del(leaseKey(core.LeaseID(900+round-1))))
		}
		how := "Apply"
		switch {
		case round%3 == 1 && pipe != nil:
			how = "a place of the pipeline"
			must(t, pipe.Reserve()(recs))
		case round%3 == 2:
			how = "ApplyWithData"
			if _, err := h.b.ApplyWithData(recs, nil); err != nil {
				t.Fatal(err)
			}
		default:
			must(t, h.b.Apply(recs))
		}
		want := map[string]string{"worker/w": fmt.Sprintf("round %d", round),
			leaseKey(core.LeaseID(900 + round)):    fmt.Sprintf(`{"round":%d}`, round),
			logKey(core.LeaseID(900+round), round): string(logRec(t, "r/s", core.LeaseID(900+round), round).Value)}
		// Each read comes first in some round: the one that could see
		// the tables before the commit is in them.
		reads := []func(){
			func() {
				if got := keys(h.load()); !reflect.DeepEqual(got, want) {
					t.Fatalf("round %d, right after %s: Load = %v\nwant %v", round, how, got, want)
				}
			},
			func() {
				if got, err := h.b.History(rh.Run.ID); err != nil || jsonOf(t, got) != jsonOf(t, rh) {
					t.Fatalf("round %d, right after %s: History(%s) = %v", round, how, rh.Run.ID, err)
				}
			},
			func() {
				if n, err := h.b.ArchivedRuns(); err != nil || n != round {
					t.Fatalf("round %d, right after %s: ArchivedRuns = %d %v, want %d", round, how, n, err, round)
				}
			},
			func() {
				if page, _, err := h.b.ListRuns(store.RunFilter{}, 0, 1); err != nil || len(page) != 1 || page[0].Seq != uint64(round) {
					t.Fatalf("round %d, right after %s: the newest run listed: %+v %v", round, how, page, err)
				}
			},
			func() {
				if lines, _, err := h.b.HistoryLogs([]core.LeaseID{core.LeaseID(500 + round)}, "", 10); err != nil || len(lines) != 1 {
					t.Fatalf("round %d, right after %s: the archived run's lines: %+v %v", round, how, lines, err)
				}
			},
			func() {
				if page, _, err := h.b.Audit(store.AuditQuery{Limit: 1}); err != nil || len(page) != 1 || page[0].Seq != uint64(round) {
					t.Fatalf("round %d, right after %s: the newest audit entry: %+v %v", round, how, page, err)
				}
			},
		}
		for i := range reads {
			reads[(round+i)%len(reads)]()
		}
	}
	// Retention sees every run committed: all twelve finished before now.
	st, err := h.b.PruneHistory(t0.Add(100*time.Hour), 0)
	if err != nil || st.Runs != 12 {
		t.Fatalf("PruneHistory right after the commits: %+v %v, want 12 runs", st, err)
	}
	if n, err := h.b.ArchivedRuns(); err != nil || n != 0 {
		t.Fatalf("ArchivedRuns right after PruneHistory = %d %v, want 0", n, err)
	}
	h.twice(func(when string) {
		if got := keys(h.load())["worker/w"]; got != "round 12" {
			t.Errorf("%s: worker/w = %q, want round 12", when, got)
		}
		if n, err := h.b.ArchivedRuns(); err != nil || n != 0 {
			t.Errorf("%s: ArchivedRuns = %d %v, want 0 (pruned)", when, n, err)
		}
	})
}

// Pipeline, when the backend has it (SPEC §11): places commit in their
// order whatever the order their functions run in, and a later place is
// never durable without every earlier one; an earlier place's failure
// fails the later one, which applies nothing; then the pipeline goes on
// after what is durable.
func testPipeline(t *testing.T, h *harness) {
	p, ok := h.b.(store.Pipeline)
	if !ok {
		t.Log("the backend has no store.Pipeline: one Apply at a time, nothing more to check")
		return
	}
	if d := p.PipelineDepth(); d < 1 {
		t.Fatalf("PipelineDepth = %d, want at least 1", d)
	}
	run := func(f func([]core.Record) error, recs ...core.Record) chan error {
		c := make(chan error, 1)
		go func() { c <- f(recs) }()
		return c
	}
	// Three places, their functions called last first.
	f1, f2, f3 := p.Reserve(), p.Reserve(), p.Reserve()
	r3 := run(f3, rec("worker/k", "three"), rec("worker/c", "3"), del("worker/x"))
	r2 := run(f2, rec("worker/k", "two"), rec("worker/b", "2"), rec("worker/x", "born in 2"))
	// Room for a backend that would commit them before the first place
	// (not a measure of speed: a correct one waits however long it takes).
	time.Sleep(200 * time.Millisecond)
	if got := keys(h.load()); len(got) != 0 {
		t.Fatalf("before the first place ran, the later places' records are there: %v", got)
	}
	select {
	case err := <-r2:
		t.Fatalf("place 2 returned (%v) before place 1 ran", err)
	case err := <-r3:
		t.Fatalf("place 3 returned (%v) before place 1 ran", err)
	default:
	}
	must(t, f1([]core.Record{rec("worker/k", "one"), rec("worker/a", "1")}))
	must(t, <-r2)
	must(t, <-r3)
	want := map[string]string{"worker/a": "1", "worker/b": "2", "worker/c": "3", "worker/k": "three"}
	if got := keys(h.load()); !reflect.DeepEqual(got, want) {
		t.Fatalf("after three places: Load = %v\nwant %v (the last place's record of a key wins)", got, want)
	}

	// The earlier place fails: the later one fails too, and nothing of
	// either is applied.
	g1, g2 := p.Reserve(), p.Reserve()
	r := run(g2, rec("worker/d", "4"), rec("worker/k", "four"), del("worker/a"))
	time.Sleep(100 * time.Millisecond)
	if err := g1([]core.Record{rec("worker/e", "5"), {Key: "", Value: []byte("x")}}); err == nil {
		t.Fatal("a record with an empty key was applied")
	}
	if err := <-r; !errors.Is(err, store.ErrEarlierFailed) {
		t.Fatalf("the place after a failed one: %v, want an error wrapping ErrEarlierFailed", err)
	}
	if got := keys(h.load()); !reflect.DeepEqual(got, want) {
		t.Fatalf("after a failed place and the one after it: Load = %v\nwant %v", got, want)
	}
	// Then it goes on after what is durable, an empty batch too.
	must(t, p.Reserve()(nil))
	must(t, p.Reserve()([]core.Record{rec("worker/f", "6")}))
	want["worker/f"] = "6"
	h.twice(func(when string) {
		if got := keys(h.load()); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: Load = %v\nwant %v", when, got, want)
		}
	})
}

func (h *harness) blob(body []byte) store.BlobRef {
	h.t.Helper()
	ref, err := h.b.WriteBlob(bytes.NewReader(body), int64(len(body)))
	if err != nil {
		h.t.Fatal(err)
	}
	return ref
}

// put stores body as the next version of id and releases its blob.
func (h *harness) put(id string, body []byte, at time.Time) store.DataResult {
	h.t.Helper()
	ref := h.blob(body)
	defer h.b.ReleaseBlob(ref)
	res, err := h.b.ApplyWithData(nil, []store.DataOp{{Kind: store.OpPut, ID: id, Blob: ref, At: at, Lease: 1, Worker: "w1"}})
	if err != nil || res[0].Err != nil {
		h.t.Fatalf("put %s: %v %v", id, err, res)
	}
	return res[0]
}

func (h *harness) read(r io.Reader) string {
	h.t.Helper()
	if c, ok := r.(io.Closer); ok {
		defer c.Close()
	}
	b, err := io.ReadAll(r)
	if err != nil {
		h.t.Fatal(err)
	}
	return string(b)
}

// ApplyWithData: the records and every accepted op in one transaction;
// versions 1, 2, 3 per id, in op order; a tombstone is a version without
// bytes that hides latest; appends tile the stream; an op refused alone
// writes nothing and the rest of its call is applied.
func testData(t *testing.T, h *harness) {
	h.put("a", []byte("one"), t0)
	ra, rb := h.blob([]byte("two")), h.blob([]byte("three"))
	res, err := h.b.ApplyWithData([]core.Record{rec("worker/w1", "with data")}, []store.DataOp{
		{Kind: store.OpPut, ID: "a", Blob: ra, At: t0, Run: "run-1", Step: "s", Attributes: map[string]string{"k": "v"}},
		{Kind: store.OpPut, ID: "b", Blob: rb, At: t0},
		{Kind: store.OpPut, ID: "a", Blob: rb, At: t0},
		{Kind: store.OpAppend, ID: "log", Body: []byte("abc"), At: t0},
		{Kind: store.OpAppend, ID: "log", Body: []byte("de"), At: t0},
		{Kind: store.OpAppend, ID: "log", Body: []byte("too long"), At: t0, MaxStream: 8}, // 5 + 8 > 8
		{Kind: store.OpAppend, ID: "log", Body: []byte("f"), At: t0, MaxStream: 8},
	})
	h.b.ReleaseBlob(ra)
	h.b.ReleaseBlob(rb)
	if err != nil {
		t.Fatal(err)
	}
	if v := []uint64{res[0].Data.Version, res[1].Data.Version, res[2].Data.Version}; !reflect.DeepEqual(v, []uint64{2, 1, 3}) {
		t.Errorf("versions of a, b, a = %v; want 2 1 3", v)
	}
	offs := func(rs ...store.DataResult) (o []int64) {
		for _, r := range rs {
			o = append(o, r.Append.Offset, r.Append.Length)
		}
		return o
	}
	if got := offs(res[3], res[4], res[6]); !reflect.DeepEqual(got, []int64{0, 3, 3, 5, 5, 6}) {
		t.Errorf("appends (offset, length) = %v; want 0 3, 3 5, 5 6", got)
	}
	if !errors.Is(res[5].Err, store.ErrStreamFull) {
		t.Errorf("an append past MaxStream: %v, want ErrStreamFull", res[5].Err)
	}
	res, err = h.b.ApplyWithData(nil, []store.DataOp{{Kind: store.OpDelete, ID: "b", At: t0}})
	if err != nil || res[0].Data.Version != 2 || !res[0].Data.Deleted {
		t.Fatalf("delete b: %v %+v; want version 2, a tombstone", err, res)
	}
	h.twice(func(when string) {
		for v, want := range []string{"", "one", "two", "three"} {
			if v == 0 {
				continue
			}
			m, err := h.b.Data("a", uint64(v))
			if err != nil || m.Version != uint64(v) || m.Size != int64(len(want)) {
				t.Errorf("%s: a version %d: %+v %v", when, v, m, err)
				continue
			}
			if got := h.read(h.b.DataReader(m)); got != want {
				t.Errorf("%s: a version %d reads %q, want %q", when, v, got, want)
			}
		}
		if m, err := h.b.Data("a", 2); err != nil || m.Attributes["k"] != "v" || m.Run != "run-1" || m.Step != "s" {
			t.Errorf("%s: a version 2 lost its attributes or provenance: %+v %v", when, m, err)
		}
		if m, err := h.b.Data("a", 0); err != nil || m.Version != 3 {
			t.Errorf("%s: latest of a: %+v %v; want version 3", when, m, err)
		}
		if _, err := h.b.Data("b", 0); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s: latest of b, deleted: %v; want ErrNotFound", when, err)
		}
		if vs, err := h.b.Versions("b"); err != nil || len(vs) != 2 || vs[0].Version != 1 || !vs[1].Deleted {
			t.Errorf("%s: versions of b: %+v %v; want 1, then its tombstone", when, vs, err)
		}
		if _, err := h.b.Data("none", 0); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s: an unknown id: %v", when, err)
		}
		s, err := h.b.Stream("log")
		if err != nil || s.Length != 6 || s.Appends != 3 {
			t.Errorf("%s: stream: %+v %v; want length 6 of 3 appends", when, s, err)
		}
		if got := h.read(h.b.StreamReader("log", 0, 6)); got != "abcdef" {
			t.Errorf("%s: the stream reads %q, want abcdef (the refused append wrote nothing)", when, got)
		}
		if got := h.read(h.b.StreamReader("log", 2, 4)); got != "cd" {
			t.Errorf("%s: stream [2, 4) reads %q, want cd", when, got)
		}
		if got := keys(h.load())["worker/w1"]; got != "with data" {
			t.Errorf("%s: the record applied with the ops: %q", when, got)
		}
		items, next, err := h.b.QueryData(store.DataQuery{Run: "run-1"})
		if err != nil || len(items) != 1 || items[0].ID != "a" || items[0].Version != 2 || next != "" {
			t.Errorf("%s: query by run: %+v %q %v; want a version 2", when, items, next, err)
		}
		items, next, err = h.b.QueryData(store.DataQuery{Prefix: "a", Limit: 2})
		if err != nil || len(items) != 2 || items[0].Version != 1 || items[1].Version != 2 || next == "" {
			t.Fatalf("%s: first page of prefix a: %+v %q %v; want a 1, a 2 and more", when, items, next, err)
		}
		items, next, err = h.b.QueryData(store.DataQuery{Prefix: "a", Limit: 2, After: next})
		if err != nil || len(items) != 1 || items[0].ID != "a" || items[0].Version != 3 || next != "" {
			t.Errorf("%s: second page of prefix a: %+v %q %v; want a 3 alone (b is not of the prefix)", when, items, next, err)
		}
	})
	// A malformed op refuses the whole call: nothing of it is written.
	if _, err := h.b.ApplyWithData([]core.Record{rec("worker/w9", "no")}, []store.DataOp{{Kind: store.OpAppend, ID: "c", Body: []byte("x")},
		{Kind: store.OpAppend, ID: "bad id!", Body: []byte("x")}}); err == nil {
		t.Error("an op with a bad id was accepted")
	}
	if _, err := h.b.Stream("c"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the call refused for a bad op wrote its other op: %v", err)
	}
	if _, ok := keys(h.load())["worker/w9"]; ok {
		t.Error("the call refused for a bad op wrote its record")
	}
	// The next version after a reopen follows the last one.
	if r := h.put("a", []byte("four"), t0); r.Data.Version != 4 {
		t.Errorf("a put after a reopen made version %d, want 4", r.Data.Version)
	}
}

// A request id's first answer is durable with its write: repeats, in the
// same call or later, after a reopen too, get it again and write nothing.
func testRequests(t *testing.T, h *harness) {
	ref := h.blob([]byte("v"))
	defer h.b.ReleaseBlob(ref)
	op := store.DataOp{Kind: store.OpPut, ID: "x", Blob: ref, At: t0, Lease: 7, Worker: "w1", Request: "req-1"}
	ap := store.DataOp{Kind: store.OpAppend, ID: "s", Body: []byte("12"), At: t0, Lease: 7, Worker: "w1", Request: "req-2"}
	res, err := h.b.ApplyWithData(nil, []store.DataOp{op, ap, op, ap})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Repeated || res[1].Repeated || !res[2].Repeated || !res[3].Repeated {
		t.Errorf("Repeated = %v %v %v %v; want the second of each repeated", res[0].Repeated, res[1].Repeated, res[2].Repeated, res[3].Repeated)
	}
	if res[2].Data.Version != res[0].Data.Version || res[3].Append != res[1].Append {
		t.Errorf("a repeat's answer differs: %+v %+v", res[2], res[3])
	}
	refused := store.DataOp{Kind: store.OpAppend, ID: "s", Body: []byte("345"), At: t0, Lease: 7, Request: "req-3", MaxStream: 4}
	if res, err := h.b.ApplyWithData(nil, []store.DataOp{refused}); err != nil || !errors.Is(res[0].Err, store.ErrStreamFull) {
		t.Fatalf("an append past its limit: %v %+v", err, res)
	}
	h.twice(func(when string) {
		res, err := h.b.ApplyWithData(nil, []store.DataOp{op, ap})
		if err != nil || !res[0].Repeated || res[0].Data.Version != 1 || !res[1].Repeated || res[1].Append.Offset != 0 {
			t.Errorf("%s: repeats: %v %+v; want the first answers", when, err, res)
		}
		if vs, _ := h.b.Versions("x"); len(vs) != 1 {
			t.Errorf("%s: %d versions of x; a repeated put must write none", when, len(vs))
		}
		if s, _ := h.b.Stream("s"); s.Length != 2 {
			t.Errorf("%s: stream length %d; repeated appends must write nothing", when, s.Length)
		}
		e, ok, err := h.b.Request(7, "req-1")
		if err != nil || !ok || e.Data == nil || e.Data.Version != 1 || e.Worker != "w1" {
			t.Errorf("%s: Request(7, req-1) = %+v %v %v", when, e, ok, err)
		}
		if _, ok, err := h.b.Request(7, "req-3"); ok || err != nil {
			t.Errorf("%s: a refused op's request id was stored (%v, %v)", when, ok, err)
		}
		if _, ok, _ := h.b.Request(8, "req-1"); ok {
			t.Errorf("%s: a request id answered under another lease", when)
		}
	})
}

// Blobs: written and read back; over the limit refused; one no record
// names is gone once released, one a version names stays.
func testBlobs(t *testing.T, h *harness) {
	if _, err := h.b.WriteBlob(strings.NewReader("12345"), 4); !errors.Is(err, store.ErrTooLarge) {
		t.Errorf("a blob over its limit: %v, want ErrTooLarge", err)
	}
	loose := h.blob([]byte("nobody names me"))
	if got := h.read(must2(t)(h.b.OpenBlob(loose.SHA256))); got != "nobody names me" {
		t.Errorf("a pinned blob reads %q", got)
	}
	h.b.ReleaseBlob(loose)
	if f, err := h.b.OpenBlob(loose.SHA256); err == nil {
		f.Close()
		t.Error("a released blob no record names is still there")
	}
	// Another write streaming meanwhile (its body stalled) holds up none
	// of it: a released blob goes at once (SPEC §14), not once every
	// upload has ended.
	pr, pw := io.Pipe()
	streaming := make(chan error, 1)
	go func() {
		ref, err := h.b.WriteBlob(pr, 1<<20)
		if err == nil {
			h.b.ReleaseBlob(ref)
		}
		streaming <- err
	}()
	if _, err := pw.Write([]byte("a body that stalls")); err != nil {
		t.Fatal(err)
	}
	loose2 := h.blob([]byte("nobody names me either"))
	h.b.ReleaseBlob(loose2)
	if f, err := h.b.OpenBlob(loose2.SHA256); err == nil {
		f.Close()
		t.Error("a released blob no record names stays while another write streams")
	}
	pw.Close()
	if err := <-streaming; err != nil {
		t.Fatalf("the streaming write: %v", err)
	}
	m := h.put("kept", []byte("named by a version"), t0).Data
	big := make([]byte, 1300<<10) // more than a MiB: several pieces wherever a backend cuts them
	for i := range big {
		big[i] = byte(i*7 + i>>10)
	}
	bm := h.put("big", big, t0).Data
	h.twice(func(when string) {
		if got := h.read(must2(t)(h.b.OpenBlob(m.SHA256))); got != "named by a version" {
			t.Errorf("%s: a named blob reads %q", when, got)
		}
		if got := h.read(h.b.DataReader(bm)); got != string(big) {
			t.Errorf("%s: a blob of %d bytes reads back %d bytes, not the same", when, len(big), len(got))
		}
		f := must2(t)(h.b.OpenBlob(bm.SHA256))
		if _, err := f.Seek(1<<20-3, io.SeekStart); err != nil {
			t.Fatal(err)
		}
		if got := h.read(io.LimitReader(f, 6)); got != string(big[1<<20-3:1<<20+3]) {
			t.Errorf("%s: 6 bytes across the first MiB read %q, want %q", when, got, big[1<<20-3:1<<20+3])
		}
		f.Close()
	})
	// A put naming no pinned blob is refused alone.
	res, err := h.b.ApplyWithData(nil, []store.DataOp{{Kind: store.OpPut, ID: "ghost", Blob: loose, At: t0}})
	if err != nil || res[0].Err == nil {
		t.Errorf("a put naming a collected blob: %v %+v", err, res)
	}
}

func must2(t *testing.T) func(io.ReadSeekCloser, error) io.ReadSeekCloser {
	return func(f io.ReadSeekCloser, err error) io.ReadSeekCloser {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// Bundles: content-addressed, a tar's files served one by one.
func testBundles(t *testing.T, h *harness) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range []struct{ name, body string }{{"bin/tool", "#!/bin/sh\necho hi\n"}, {"README", "read me"}} {
		must(t, tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o755, Size: int64(len(f.body)), Typeflag: tar.TypeReg}))
		tw.Write([]byte(f.body))
	}
	must(t, tw.Close())
	files, ok := store.TarIndex(buf.Bytes())
	if !ok {
		t.Fatal("TarIndex refused the tar")
	}
	ref := h.blob(buf.Bytes())
	res, err := h.b.ApplyWithData(nil, []store.DataOp{{Kind: store.OpBundle, Blob: ref, Files: files, At: t0}})
	h.b.ReleaseBlob(ref)
	if err != nil || res[0].Err != nil || res[0].Bundle.Fingerprint != ref.SHA256 {
		t.Fatalf("bundle: %v %+v", err, res)
	}
	h.twice(func(when string) {
		m, err := h.b.Bundle(ref.SHA256)
		if err != nil || !m.Tar || m.Files != 2 || m.Size != int64(buf.Len()) {
			t.Fatalf("%s: bundle: %+v %v", when, m, err)
		}
		span, err := h.b.BundleFile(ref.SHA256, "README")
		if err != nil {
			t.Fatal(err)
		}
		if got := h.read(h.b.BundleReader(m, span.Offset, span.Size)); got != "read me" {
			t.Errorf("%s: README reads %q", when, got)
		}
		if _, err := h.b.BundleFile(ref.SHA256, "nope"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s: a file not in the bundle: %v", when, err)
		}
	})
}

// history is an archived run of one step and lease, finished at t0+seq h.
func history(seq uint64, status string, lease core.LeaseID) core.RunHistory {
	id := core.RunID(fmt.Sprintf("run-%d", seq))
	at := t0.Add(time.Duration(seq) * time.Hour)
	sid := core.StepID(string(id) + "/s")
	return core.RunHistory{Status: status,
		Run:    core.RunRecord{ID: id, Spec: core.RunSpec{Name: "wf"}, SubmittedAt: at, Finished: true, FinishedAt: at.Add(time.Second), Steps: []core.StepID{sid}},
		Steps:  []core.StepRecord{{ID: sid, Run: id, Name: "s", Index: -1, State: core.StateSuccess, Attempts: 1, QueuedAt: at, StartedAt: at, FinishedAt: at.Add(time.Second)}},
		Leases: []core.LeaseRecord{{ID: lease, Step: sid, Worker: "w1", GrantedAt: at, Started: true, Committed: true, EndReason: "step success"}},
		Events: []core.ServerEvent{{Run: id, Seq: 1, At: at, Step: sid, Kind: "step-succeeded", Message: "exit 0"}},
	}
}

// The history of archived runs: each read back as written, listed newest
// first a page at a time and filtered, its log lines paged; none of it is
// live state.
func testHistory(t *testing.T, h *harness) {
	var recs []core.Record
	runs := map[core.RunID]core.RunHistory{}
	for seq := uint64(1); seq <= 5; seq++ {
		status := "success"
		if seq%2 == 0 {
			status = "failed"
		}
		rh := history(seq, status, core.LeaseID(100+seq))
		runs[rh.Run.ID] = rh
		recs = append(recs, jsonRec(t, core.HistoryKey(rh.Run.ID), rh))
		for i := range 3 {
			recs = append(recs, logRec(t, rh.Run.Steps[0], core.LeaseID(100+seq), i))
		}
	}
	must(t, h.b.Apply(recs))
	h.twice(func(when string) {
		if live := h.load(); len(live) != 0 {
			t.Errorf("%s: Load returned %d records of archived runs (first %s)", when, len(live), live[0].Key)
		}
		for id, want := range runs {
			got, err := h.b.History(id)
			if err != nil || !reflect.DeepEqual(jsonOf(t, got), jsonOf(t, want)) {
				t.Errorf("%s: History(%s) = %s %v\nwant %s", when, id, jsonOf(t, got), err, jsonOf(t, want))
			}
		}
		if _, err := h.b.History("run-99"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s: an unknown run: %v", when, err)
		}
		if n, err := h.b.ArchivedRuns(); err != nil || n != 5 {
			t.Errorf("%s: ArchivedRuns = %d %v, want 5", when, n, err)
		}
		var seqs []uint64
		for cursor := uint64(0); ; {
			page, next, err := h.b.ListRuns(store.RunFilter{}, cursor, 2)
			if err != nil || len(page) > 2 {
				t.Fatalf("%s: ListRuns: %d runs, %v", when, len(page), err)
			}
			for _, s := range page {
				seqs = append(seqs, s.Seq)
			}
			if next == 0 {
				break
			}
			cursor = next
		}
		if !reflect.DeepEqual(seqs, []uint64{5, 4, 3, 2, 1}) {
			t.Errorf("%s: paged listing %v; want 5 4 3 2 1", when, seqs)
		}
		page, _, err := h.b.ListRuns(store.RunFilter{Status: "failed"}, 0, 10)
		if err != nil || len(page) != 2 || page[0].Seq != 4 || page[1].Seq != 2 || page[0].Status != "failed" {
			t.Errorf("%s: failed runs: %+v %v; want 4, 2", when, page, err)
		}
		lines, next, err := h.b.HistoryLogs([]core.LeaseID{103}, "", 2)
		if err != nil || len(lines) != 2 || lines[0].Index != 0 || lines[1].Index != 1 || next == "" {
			t.Fatalf("%s: first page of lease 103's lines: %+v %q %v", when, lines, next, err)
		}
		lines, _, err = h.b.HistoryLogs([]core.LeaseID{103}, next, 2)
		if err != nil || len(lines) != 1 || lines[0].Index != 2 || lines[0].Line.Text != "line 2 of lease 103" {
			t.Errorf("%s: second page of lease 103's lines: %+v %v", when, lines, err)
		}
	})
}

func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func auditRec(t *testing.T, seq uint64, actor string) core.Record {
	return jsonRec(t, core.AuditKey(seq), core.AuditEntry{Seq: seq, At: t0.Add(time.Duration(seq) * time.Hour), Actor: actor,
		Action: core.ActionSubmit, Outcome: core.OutcomeAccepted})
}

// The audit log: written as records, read newest first, filtered and
// paged, never live state.
func testAudit(t *testing.T, h *harness) {
	var recs []core.Record
	for seq := uint64(1); seq <= 7; seq++ {
		actor := "alice"
		if seq%2 == 0 {
			actor = "bob"
		}
		recs = append(recs, auditRec(t, seq, actor))
	}
	must(t, h.b.Apply(recs))
	seqs := func(es []core.AuditEntry) (out []uint64) {
		for _, e := range es {
			out = append(out, e.Seq)
		}
		return out
	}
	h.twice(func(when string) {
		if live := h.load(); len(live) != 0 {
			t.Errorf("%s: Load returned audit entries (%s)", when, live[0].Key)
		}
		page, next, err := h.b.Audit(store.AuditQuery{Limit: 3})
		if err != nil || !reflect.DeepEqual(seqs(page), []uint64{7, 6, 5}) || next == 0 {
			t.Fatalf("%s: first page %v next %d %v; want 7 6 5 and more", when, seqs(page), next, err)
		}
		page, _, err = h.b.Audit(store.AuditQuery{Limit: 3, Before: next})
		if err != nil || !reflect.DeepEqual(seqs(page), []uint64{4, 3, 2}) {
			t.Errorf("%s: second page %v %v; want 4 3 2", when, seqs(page), err)
		}
		page, _, err = h.b.Audit(store.AuditQuery{Actor: "bob"})
		if err != nil || !reflect.DeepEqual(seqs(page), []uint64{6, 4, 2}) {
			t.Errorf("%s: bob's entries %v %v; want 6 4 2", when, seqs(page), err)
		}
		page, _, err = h.b.Audit(store.AuditQuery{Since: t0.Add(6 * time.Hour)})
		if err != nil || !reflect.DeepEqual(seqs(page), []uint64{7, 6}) {
			t.Errorf("%s: entries since hour 6: %v %v; want 7 6", when, seqs(page), err)
		}
	})
	// A filter that matches little examines at most AuditScanLimit entries
	// a read (SPEC §12): behind more than that of another actor's, bob's
	// first read is a short page and a cursor, the next one finds them.
	recs = recs[:0]
	for seq := uint64(8); seq < 8+store.AuditScanLimit+5; seq++ {
		recs = append(recs, auditRec(t, seq, "carol"))
		if len(recs) == 2000 {
			must(t, h.b.Apply(recs))
			recs = recs[:0]
		}
	}
	must(t, h.b.Apply(recs))
	page, next, err := h.b.Audit(store.AuditQuery{Actor: "bob"})
	if err != nil || len(page) != 0 || next == 0 {
		t.Fatalf("bob's entries behind %d of carol's: %v next %d %v; want a short page and a cursor", store.AuditScanLimit+5, seqs(page), next, err)
	}
	page, _, err = h.b.Audit(store.AuditQuery{Actor: "bob", Before: next})
	if err != nil || !reflect.DeepEqual(seqs(page), []uint64{6, 4, 2}) {
		t.Errorf("bob's entries from the cursor %d: %v %v; want 6 4 2", next, seqs(page), err)
	}
}

// Secrets: none without a key; sealed with it (a run's record too) and
// read back; another key opens none of them; a backend holding sealed
// values says so.
func testSecrets(t *testing.T, h *harness) {
	value := []byte("the-secret-value-42")
	if sealed, err := h.b.HoldsSealed(); err != nil || sealed {
		t.Errorf("an empty backend: HoldsSealed %v, %v; want false", sealed, err)
	}
	if _, err := h.b.ApplyWithData(nil, []store.DataOp{{Kind: store.OpSecretPut, ID: "A", Body: value}}); !errors.Is(err, store.ErrNoSecretsKey) {
		t.Fatalf("a secret put without a key: %v, want ErrNoSecretsKey", err)
	}
	h.key = bytes.Repeat([]byte{0x42}, store.SecretsKeySize)
	must(t, h.b.SetSecretsKey(h.key))
	run := jsonRec(t, core.KindRun+"/run-1", map[string]any{"ID": "run-1", "Env": map[string]string{"TOKEN": string(value)}})
	_, err := h.b.ApplyWithData([]core.Record{run}, []store.DataOp{{Kind: store.OpSecretPut, ID: "A", Body: value}, {Kind: store.OpSecretPut, ID: "B", Body: []byte("b")}})
	must(t, err)
	_, err = h.b.ApplyWithData(nil, []store.DataOp{{Kind: store.OpSecretDelete, ID: "B"}})
	must(t, err)
	h.twice(func(when string) {
		if got, err := h.b.Secret("A"); err != nil || !bytes.Equal(got, value) {
			t.Errorf("%s: Secret(A) = %q %v", when, got, err)
		}
		if _, err := h.b.Secret("B"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s: a removed secret: %v", when, err)
		}
		if got := keys(h.load())[run.Key]; got != string(run.Value) {
			t.Errorf("%s: the sealed run record loads as %q", when, got)
		}
		if sealed, err := h.b.HoldsSealed(); err != nil || !sealed {
			t.Errorf("%s: HoldsSealed %v, %v with a sealed value; want true", when, sealed, err)
		}
	})
	// Another key: refused, never other bytes.
	h.key = bytes.Repeat([]byte{0x07}, store.SecretsKeySize)
	h.restart()
	if got, err := h.b.Secret("A"); !errors.Is(err, store.ErrSecretsKey) || got != nil {
		t.Errorf("another key: Secret(A) = %q %v, want ErrSecretsKey", got, err)
	}
	if _, err := h.b.Load(); !errors.Is(err, store.ErrSecretsKey) {
		t.Errorf("another key: Load of a sealed run record: %v, want ErrSecretsKey", err)
	}
}

// Retention: what is older than the cutoff goes — old versions (never an
// id's newest), streams, bundles nothing keeps, archived runs with their
// log lines, audit entries — in transactions of at most the budget, and
// the rest stays.
func testRetention(t *testing.T, h *harness) {
	old, cutoff, recent := t0, t0.Add(10*time.Hour), t0.Add(20*time.Hour)
	h.put("d", []byte("v1"), old)
	h.put("d", []byte("v2"), old)
	h.put("d", []byte("v3"), recent)
	h.put("only", []byte("old but newest"), old)
	if _, err := h.b.ApplyWithData(nil, []store.DataOp{{Kind: store.OpAppend, ID: "oldstream", Body: []byte("x"), At: old}}); err != nil {
		t.Fatal(err)
	}
	var bundles []string
	for _, body := range []string{"keep me", "drop me"} {
		ref := h.blob([]byte(body))
		res, err := h.b.ApplyWithData(nil, []store.DataOp{{Kind: store.OpBundle, Blob: ref, At: old}})
		h.b.ReleaseBlob(ref)
		if err != nil || res[0].Err != nil {
			t.Fatal(err, res)
		}
		bundles = append(bundles, ref.SHA256)
	}
	var recs []core.Record
	for seq, lease := range map[uint64]core.LeaseID{1: 201, 15: 202} { // finished at hour 1 (old) and 15 (recent)
		rh := history(seq, "success", lease)
		recs = append(recs, jsonRec(t, core.HistoryKey(rh.Run.ID), rh), logRec(t, rh.Run.Steps[0], lease, 0), logRec(t, rh.Run.Steps[0], lease, 1))
	}
	recs = append(recs, auditRec(t, 1, "alice"), auditRec(t, 2, "alice"), auditRec(t, 15, "bob"))
	must(t, h.b.Apply(recs))
	v1, _ := h.b.Data("d", 1)

	const budget = 2
	var st store.PruneStats
	for range 20 { // each call may stop at its budget; repeat until nothing is left
		var pass store.PruneStats
		for _, f := range []func() (store.PruneStats, error){
			func() (store.PruneStats, error) { return h.b.PruneHistory(cutoff, budget) },
			func() (store.PruneStats, error) {
				return h.b.PruneData(cutoff, func(fp string) bool { return fp == bundles[0] }, budget)
			},
			func() (store.PruneStats, error) { return h.b.PruneAudit(cutoff, budget) },
		} {
			p, err := f()
			must(t, err)
			pass.Add(p)
		}
		st.Add(pass)
		if pass.Runs+pass.LogLines+pass.Versions+pass.Streams+pass.Bundles+pass.Audit == 0 {
			break
		}
	}
	if st.Runs != 1 || st.LogLines != 2 || st.Versions != 2 || st.Streams != 1 || st.Bundles != 1 || st.Audit != 2 {
		t.Errorf("pruned %+v; want 1 run, 2 log lines, 2 versions, 1 stream, 1 bundle, 2 audit entries", st)
	}
	h.twice(func(when string) {
		if vs, _ := h.b.Versions("d"); len(vs) != 1 || vs[0].Version != 3 {
			t.Errorf("%s: versions of d after pruning: %+v; want 3 alone", when, vs)
		}
		if m, err := h.b.Data("only", 0); err != nil || m.Version != 1 {
			t.Errorf("%s: an id's newest version was pruned: %v", when, err)
		}
		if f, err := h.b.OpenBlob(v1.SHA256); err == nil {
			f.Close()
			t.Errorf("%s: the blob of a pruned version is still there", when)
		}
		if _, err := h.b.Stream("oldstream"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s: an old stream: %v", when, err)
		}
		if _, err := h.b.Bundle(bundles[0]); err != nil {
			t.Errorf("%s: a kept bundle: %v", when, err)
		}
		if _, err := h.b.Bundle(bundles[1]); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s: a bundle nothing keeps: %v", when, err)
		}
		if _, err := h.b.History("run-1"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s: an old run: %v", when, err)
		}
		if _, err := h.b.History("run-15"); err != nil {
			t.Errorf("%s: a recent run: %v", when, err)
		}
		if lines, _, _ := h.b.HistoryLogs([]core.LeaseID{201}, "", 10); len(lines) != 0 {
			t.Errorf("%s: %d log lines of a pruned run", when, len(lines))
		}
		if lines, _, _ := h.b.HistoryLogs([]core.LeaseID{202}, "", 10); len(lines) != 2 {
			t.Errorf("%s: %d log lines of a kept run, want 2", when, len(lines))
		}
		if n, _ := h.b.ArchivedRuns(); n != 1 {
			t.Errorf("%s: %d archived runs, want 1", when, n)
		}
		if es, _, _ := h.b.Audit(store.AuditQuery{}); len(es) != 1 || es[0].Seq != 15 {
			t.Errorf("%s: audit after pruning: %+v; want 15 alone", when, es)
		}
	})
}

// The remembered answers are bounded: a lease's past MaxRequestsPerLease
// is refused alone and writes nothing, the bound holds after a reopen, and
// retention makes room again.
func testRequestLimits(t *testing.T, h *harness) {
	ops := make([]store.DataOp, store.MaxRequestsPerLease+1)
	for i := range ops {
		ops[i] = store.DataOp{Kind: store.OpAppend, ID: "s", Body: []byte("x"), At: t0, Lease: 3, Request: fmt.Sprintf("r-%d", i)}
	}
	res, err := h.b.ApplyWithData(nil, ops)
	must(t, err)
	for i, r := range res[:store.MaxRequestsPerLease] {
		if r.Err != nil {
			t.Fatalf("request %d of %d refused: %v", i+1, store.MaxRequestsPerLease, r.Err)
		}
	}
	if err := res[store.MaxRequestsPerLease].Err; !errors.Is(err, store.ErrRequestsFull) {
		t.Errorf("request %d of one lease: %v, want ErrRequestsFull", store.MaxRequestsPerLease+1, err)
	}
	over := store.DataOp{Kind: store.OpAppend, ID: "s", Body: []byte("y"), At: t0.Add(time.Hour), Lease: 3, Request: "over"}
	other := store.DataOp{Kind: store.OpAppend, ID: "s", Body: []byte("z"), At: t0.Add(time.Hour), Lease: 4, Request: "r-0"}
	h.twice(func(when string) {
		res, err := h.b.ApplyWithData(nil, []store.DataOp{over})
		if err != nil || !errors.Is(res[0].Err, store.ErrRequestsFull) {
			t.Errorf("%s: one more of the full lease: %v %+v, want ErrRequestsFull", when, err, res)
		}
		if s, _ := h.b.Stream("s"); s.Length != store.MaxRequestsPerLease {
			t.Errorf("%s: the stream holds %d bytes, want %d (a refused append writes nothing)", when, s.Length, store.MaxRequestsPerLease)
		}
	})
	if res, err := h.b.ApplyWithData(nil, []store.DataOp{other}); err != nil || res[0].Err != nil {
		t.Errorf("another lease's request: %v %+v", err, res)
	}
	// Retention removes the full lease's answers (older than the cutoff),
	// and with them its count.
	if _, err := h.b.PruneData(t0.Add(time.Minute), nil, 0); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := h.b.Request(3, "r-0"); ok {
		t.Error("an answer older than the cutoff was kept")
	}
	if _, ok, _ := h.b.Request(4, "r-0"); !ok {
		t.Error("an answer newer than the cutoff was pruned")
	}
	if res, err := h.b.ApplyWithData(nil, []store.DataOp{over}); err != nil || res[0].Err != nil {
		t.Errorf("a request of the lease once retention made room: %v %+v", err, res)
	}
}

// Blobs written, named, released and left unnamed from several goroutines
// while records commit: each version reads its bytes, a blob both named
// and left by another write stays, a blob only left goes.
func testConcurrentBlobs(t *testing.T, h *harness) {
	// First one interleaving, in order: two writes of the same bytes; the
	// one that leaves it unnamed is answered first, and the blob must stay
	// for the other, which names it.
	a := h.blob([]byte("shared"))
	b := h.blob([]byte("shared"))
	h.b.ReleaseBlob(b)
	res, err := h.b.ApplyWithData(nil, []store.DataOp{{Kind: store.OpPut, ID: "shared", Blob: a, At: t0}})
	h.b.ReleaseBlob(a)
	if err != nil || res[0].Err != nil {
		t.Fatalf("a put of a blob another write released: %v %+v", err, res)
	}
	if got := h.read(h.b.DataReader(res[0].Data)); got != "shared" {
		t.Fatalf("a blob one write released while another pinned it reads %q", got)
	}
	const writers, rounds = 4, 8
	var wg sync.WaitGroup
	errs := make(chan error, writers*rounds*2)
	loose := make(chan string, writers*rounds)
	for w := range writers {
		wg.Go(func() {
			for i := range rounds {
				body := []byte(fmt.Sprintf("body %d", i)) // every writer writes the same bytes, round by round
				ref, err := h.b.WriteBlob(bytes.NewReader(body), 100)
				if err != nil {
					errs <- err
					return
				}
				if w%2 == 1 { // left unnamed
					h.b.ReleaseBlob(ref)
					if i%2 == 1 {
						own, err := h.b.WriteBlob(strings.NewReader(fmt.Sprintf("only %d of %d", i, w)), 100)
						if err != nil {
							errs <- err
							return
						}
						h.b.ReleaseBlob(own)
						loose <- own.SHA256
					}
					continue
				}
				res, err := h.b.ApplyWithData([]core.Record{rec(fmt.Sprintf("worker/w%d", w), fmt.Sprint(i))},
					[]store.DataOp{{Kind: store.OpPut, ID: fmt.Sprintf("d%d", w), Blob: ref, At: t0}})
				h.b.ReleaseBlob(ref)
				if err == nil && res[0].Err != nil {
					err = res[0].Err
				}
				if err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Go(func() {
		for i := range rounds * 4 {
			if err := h.b.Apply([]core.Record{rec("worker/beat", fmt.Sprint(i))}); err != nil {
				errs <- err
				return
			}
		}
	})
	wg.Wait()
	close(errs)
	close(loose)
	for err := range errs {
		t.Fatal(err)
	}
	h.twice(func(when string) {
		for w := 0; w < writers; w += 2 {
			vs, err := h.b.Versions(fmt.Sprintf("d%d", w))
			if err != nil || len(vs) != rounds {
				t.Fatalf("%s: versions of d%d: %d, %v; want %d", when, w, len(vs), err, rounds)
			}
			for i, m := range vs {
				if got, want := h.read(h.b.DataReader(m)), fmt.Sprintf("body %d", i); got != want {
					t.Errorf("%s: d%d version %d reads %q, want %q", when, w, m.Version, got, want)
				}
			}
		}
		for sha := range loose {
			if f, err := h.b.OpenBlob(sha); err == nil {
				f.Close()
				t.Errorf("%s: a blob only ever released, never named, is still there", when)
			}
		}
	})
}

// After Close: the calls fail with ErrClosed, and closing again is
// harmless.
func testClosed(t *testing.T, h *harness) {
	must(t, h.b.Apply([]core.Record{rec("worker/w1", "one")}))
	must(t, h.b.Close())
	must(t, h.b.Close())
	if err := h.b.Apply([]core.Record{rec("worker/w2", "two")}); !errors.Is(err, store.ErrClosed) {
		t.Errorf("Apply after Close: %v, want ErrClosed", err)
	}
	if _, err := h.b.ApplyWithData([]core.Record{rec("worker/w2", "two")}, nil); !errors.Is(err, store.ErrClosed) {
		t.Errorf("ApplyWithData after Close: %v, want ErrClosed", err)
	}
	if _, err := h.b.Load(); !errors.Is(err, store.ErrClosed) {
		t.Errorf("Load after Close: %v, want ErrClosed", err)
	}
	if _, err := h.b.History("run-1"); !errors.Is(err, store.ErrClosed) {
		t.Errorf("History after Close: %v, want ErrClosed", err)
	}
	if _, err := h.b.Data("a", 0); !errors.Is(err, store.ErrClosed) {
		t.Errorf("Data after Close: %v, want ErrClosed", err)
	}
	if err := h.b.Apply(nil); !errors.Is(err, store.ErrClosed) {
		t.Errorf("an empty Apply after Close: %v, want ErrClosed", err)
	}
	// A backend that cannot tell whether it holds sealed values says so:
	// a start must not make a new secrets key on a guess (SPEC §14a).
	if sealed, err := h.b.HoldsSealed(); !errors.Is(err, store.ErrClosed) {
		t.Errorf("HoldsSealed after Close: %v, %v; want ErrClosed", sealed, err)
	}
	h.restart()
	if got := keys(h.load()); !reflect.DeepEqual(got, map[string]string{"worker/w1": "one"}) {
		t.Errorf("after a reopen: %v; want the commit before Close alone", got)
	}
}
