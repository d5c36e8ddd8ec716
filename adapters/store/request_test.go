package store

import (
	"errors"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"
	"time"
)

// TestRequestAnswersOnceAndBounded: the first op of (lease, request id)
// writes and remembers its answer in its transaction; a repeat — in the
// same transaction or a later one — writes nothing and gets that answer;
// a key reused for another write is refused; a RepeatOnly op with no first
// answer stores nothing; the per-lease bound refuses the next key, writing
// nothing; retention prunes old answers and their counts, and store check
// finds the counts true (SPEC §14, idempotent writes). Planted bug: with
// remember's count not kept (no request.count update), the bound never
// refused and this test failed at the bound.
func TestRequestAnswersOnceAndBounded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tether.db")
	s := open(t, path)
	op := func(kind DataOpKind, id, req string, body string) DataOp {
		o := DataOp{Kind: kind, ID: id, Body: []byte(body), Worker: "w1", Lease: 7, At: at, Request: req}
		return o
	}
	res := apply(t, s, nil, op(OpPut, "out", "r1", "one"), op(OpPut, "out", "r1", "two"))
	if res[0].Data.Version != 1 || res[0].Repeated || !res[1].Repeated || !reflect.DeepEqual(res[1].Data, res[0].Data) {
		t.Fatalf("same transaction: %+v, %+v; want version 1 then its repeat", res[0], res[1])
	}
	res = apply(t, s, nil, op(OpPut, "out", "r1", "three"), op(OpAppend, "log", "a1", "x"), op(OpAppend, "log", "a1", "x"))
	if !res[0].Repeated || res[0].Data.Version != 1 || res[1].Append.Length != 1 || res[2].Append != res[1].Append || !res[2].Repeated {
		t.Fatalf("later transaction: %+v", res)
	}
	if vs, _ := s.Versions("out"); len(vs) != 1 {
		t.Fatalf("%d versioafter repeats, want 1", len(vs))
	}
	if m, _ := s.Stream("log"); m.Length != 1 {
		t.Fatalf("stream of %d bytes after a repeated append, want 1", m.Length)
	}
	res = apply(t, s, nil, op(OpPut, "other", "r1", "x"), DataOp{Kind: OpDelete, ID: "out", Lease: 7, At: at, Request: "gone", RepeatOnly: true})
	if !errors.Is(res[0].Err, ErrRequestReused) || !errors.Is(res[1].Err, ErrRequestLost) {
		t.Fatalf("reused key: %v; repeat of nothing: %v", res[0].Err, res[1].Err)
	}
	if _, err := s.Data("other", 0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a reused key wrote: %v", err)
	}
	e, ok, err := s.Request(7, "r1")
	if err != nil || !ok || e.Data == nil || e.Data.Version != 1 || e.Worker != "w1" {
		t.Fatalf("Request(7, r1) = %+v, %v, %v", e, ok, err)
	}

	// The bound per lease: fill lease 9 to the bound, then one more.
	ops := make([]DataOp, 0, MaxRequestsPerLease)
	for i := range MaxRequestsPerLease {
		ops = append(ops, DataOp{Kind: OpAppend, ID: "fill", Body: []byte("."), Lease: 9, At: at, Request: "f" + itoa(i)})
	}
	if _, err := s.ApplyWithData(nil, ops); err != nil {
		t.Fatal(err)
	}
	res = apply(t, s, nil, DataOp{Kind: OpAppend, ID: "fill", Body: []byte("!"), Lease: 9, At: at, Request: "over"})
	if !errors.Is(res[0].Err, ErrRequestsFull) {
		t.Fatalf("past the bound: %+v", res[0])
	}
	if m, _ := s.Stream("fill"); m.Length != MaxRequestsPerLease {
		t.Fatalf("a refused append wrote: stream of %d bytes", m.Length)
	}
	s = checkSound(t, s, path)
	// Retention prunes them all (and their counts); a new key fits again.
	if _, err := s.PruneData(at.Add(time.Hour), nil, 0); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := s.Request(9, "f0"); ok {
		t.Fatal("an answer older than the cutoff survived pruning")
	}
	res = apply(t, s, nil, DataOp{Kind: OpAppend, ID: "fill", Body: []byte("!"), Lease: 9, At: at.Add(2 * time.Hour), Request: "over"})
	if res[0].Err != nil {
		t.Fatalf("after pruning: %v", res[0].Err)
	}
	checkSound(t, s, path)
}

// checkSound closes s, holds store check's report to no problem, and
// opethe store again.
func checkSound(t *testing.T, s *Store, path string) *Store {
	t.Helper()
	s.Close()
	rep, err := Check(path)
	if err != nil || !rep.Sound() {
		t.Fatalf("store check: %v %+v", err, rep)
	}
	return open(t, path)
}

func itoa(i int) string { return strconv.Itoa(i) }

// TestTombstonesAndQueries: a delete is the next version, latest and its
// own number answer not found, earlier versioread; queries filter and
// page in (id, version) order.
func TestTombstonesAndQueries(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tether.db")
	s := open(t, path)
	p := func(id, body string, attrs map[string]string) DataOp {
		o := putOp(id, []byte(body))
		o.Attributes, o.Run, o.Step = attrs, "run-1", "run-1/a"
		return o
	}
	apply(t, s, nil, p("a", "1", map[string]string{"k": "v"}), p("a", "2", nil), p("b", "3", map[string]string{"k": "v"}), p("c", "4", nil))
	res := apply(t, s, nil, DataOp{Kind: OpDelete, ID: "a", Lease: 7, At: at}, DataOp{Kind: OpDelete, ID: "a", Lease: 7, At: at}, DataOp{Kind: OpDelete, ID: "zz", Lease: 7, At: at})
	if res[0].Err != nil || !res[0].Data.Deleted || res[0].Data.Version != 3 || !errors.Is(res[1].Err, ErrNotFound) || !errors.Is(res[2].Err, ErrNotFound) {
		t.Fatalf("deletes: %+v", res)
	}
	if _, err := s.Data("a", 0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("latest of a deleted id: %v", err)
	}
	if _, err := s.Data("a", 3); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the tombstone by number: %v", err)
	}
	if m, err := s.Data("a", 2); err != nil || string(readAll(t, s.DataReader(m))) != "2" {
		t.Fatalf("a pinned version after a delete: %v", err)
	}
	q := func(dq DataQuery) (string, string) {
		t.Helper()
		items, next, err := s.QueryData(dq)
		if err != nil {
			t.Fatal(err)
		}
		out := ""
		for _, m := range items {
			out += m.ID + itoa(int(m.Version)) + " "
		}
		return out, next
	}
	if got, next := q(DataQuery{}); got != "a1 a2 a3 b1 c1 " || next != "" {
		t.Fatalf("all: %q next %q", got, next)
	}
	if got, _ := q(DataQuery{Attrs: map[string]string{"k": "v"}}); got != "a1 b1 " {
		t.Fatalf("by attribute: %q", got)
	}
	if got, _ := q(DataQuery{Prefix: "b", Step: "run-1/a"}); got != "b1 " {
		t.Fatalf("by prefix and step: %q", got)
	}
	got, next := q(DataQuery{Limit: 2})
	got2, next2 := q(DataQuery{Limit: 2, After: next})
	got3, next3 := q(DataQuery{Limit: 2, After: next2})
	if got+got2+got3 != "a1 a2 a3 b1 c1 " || next3 != "" {
		t.Fatalf("pages: %q %q %q (next %q %q %q)", got, got2, got3, next, next2, next3)
	}
	checkSound(t, s, path)
}
