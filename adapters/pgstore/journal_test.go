package pgstore

import (
	"errors"
	"reflect"
	"testing"
)

// A journal row's encoding reads back as written, every kind of op; a row
// cut short anywhere, or with bytes past its ops, is an error naming it
// corrupt, never ops made up or a panic.
func TestJournalEncoding(t *testing.T) {
	ops := []jop{
		{table: tRecord, key: "worker/a", value: []byte("one")},
		{table: tRecord, key: "worker/b", del: true},
		{table: tRecord, key: "worker/empty", value: []byte{}},
		{table: tLog, key: "log/00000000000000000001/0000000000", value: []byte(`{"Index":0}`)},
		{table: tAudit, key: "audit/00000000000000000001", value: []byte(`{}`), at: 42, actor: "alice", action: "submit"},
		{table: tAudit, key: "audit/00000000000000000002", del: true},
		{table: tHistory, key: "run-7", value: []byte(`{"h":1}`), hist: histRow{run: "run-7", seq: 7, finished: -1, submitted: 1 << 40,
			status: "success", name: "wf", summary: []byte(`{"s":1}`), value: []byte(`{"h":1}`)}},
		{table: tHistory, key: "run-8", del: true},
	}
	enc := encodeOps(nil, ops)
	got, err := decodeOps(enc)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, ops) {
		t.Fatalf("decoded %+v\nwant %+v", got, ops)
	}
	for n := range len(enc) {
		if _, err := decodeOps(enc[:n]); !errors.Is(err, errCorrupt) {
			t.Fatalf("the row cut to %d of %d bytes: %v, want errCorrupt", n, len(enc), err)
		}
	}
	if _, err := decodeOps(append(enc, 0)); !errors.Is(err, errCorrupt) {
		t.Errorf("a byte past the ops: %v, want errCorrupt", err)
	}
	bad := append([]byte(nil), enc...)
	bad[2] = 'x' // the first op's table
	if _, err := decodeOps(bad); !errors.Is(err, errCorrupt) {
		t.Errorf("an unknown table: %v, want errCorrupt", err)
	}
}

// merge keeps the last write of each key across the entries folded
// together, a delete as much as an upsert, and the same key in another
// table apart.
func TestJournalMerge(t *testing.T) {
	got := merge([][]jop{
		{{table: tRecord, key: "a", value: []byte("1")}, {table: tRecord, key: "b", value: []byte("1")}, {table: tLog, key: "a", value: []byte("log")}},
		{{table: tRecord, key: "a", value: []byte("2")}, {table: tRecord, key: "b", del: true}},
		{{table: tRecord, key: "c", del: true}, {table: tRecord, key: "c", value: []byte("3")}},
	})
	want := []jop{
		{table: tLog, key: "a", value: []byte("log")},
		{table: tRecord, key: "a", value: []byte("2")},
		{table: tRecord, key: "b", del: true},
		{table: tRecord, key: "c", value: []byte("3")},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("merge = %+v\nwant %+v", got, want)
	}
}
