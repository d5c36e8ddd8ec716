package fuzz

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/tether-run/tether/core"
)

// recordKinds are the key prefixes DecodeRecord knows, in a fixed order (a
// fuzzed byte picks one), plus one it must refuse.
var recordKinds = []string{core.KindMeta, core.KindRun, core.KindStep, core.KindLease, core.KindWorker,
	core.KindToken, core.KindEvent, core.KindLog, core.KindAudit, "bogus"}

// FuzzRecordRoundTrip feeds arbitrary bytes to core.DecodeRecord as the value
// of a record of each kind. It must never panic; it refuses with
// ErrBadRecord or decodes, and what it decodes re-encodes to canonical JSON
// that decodes to the same value and re-encodes to the same bytes (a store
// that loads a record and writes it back changes nothing). The seeds are the
// records of real orchestrator runs, which must already be canonical: they
// re-encode byte for byte (TestRecordsOfRealRunsRoundTrip).
func FuzzRecordRoundTrip(f *testing.F) {
	perKind := map[int]int{}
	for _, r := range realRecords(f) {
		if k := kindIndex(r.Key); perKind[k] < 12 { // a few of each kind
			perKind[k]++
			f.Add(uint8(k), r.Value)
		}
	}
	f.Add(uint8(1), []byte(`{"ID":"run-1","Steps":null,"SubmittedAt":"2026-01-01T00:00:00+14:00"}`))
	f.Add(uint8(3), []byte(`{"ID":18446744073709551615,"Answers":[{"Request":1,"Verdict":3,"Outcome":{"Status":9}}]}`))
	f.Add(uint8(4), []byte(`{"CredHash":[1,2,3],"Labels":{"a":"\ud800"}}`))
	f.Add(uint8(len(recordKinds)-1), []byte(`{}`)) // the refused kind
	f.Fuzz(func(t *testing.T, kind uint8, value []byte) {
		k := recordKinds[int(kind)%len(recordKinds)]
		key := k + "/fuzz"
		if k == core.KindMeta {
			key = k
		}
		v, err := core.DecodeRecord(core.Record{Key: key, Value: value})
		if err != nil {
			if !errors.Is(err, core.ErrBadRecord) {
				t.Fatalf("DecodeRecord error is not ErrBadRecord: %v", err)
			}
			return
		}
		checkCanonical(t, key, v)
	})
}

// checkCanonical re-encodes a decoded record the way the core does and
// requires the encoding to be a fixed point.
func checkCanonical(t *testing.T, key string, v any) []byte {
	t.Helper()
	if ch, ok := v.(*core.ClosedChunk); ok {
		// The closed-lease table's log is binary (core/closed.go).
		b := core.EncodeClosed(*ch)
		v2, err := core.DecodeRecord(core.Record{Key: key, Value: b})
		if err != nil || !reflect.DeepEqual(v2, v) {
			t.Fatalf("%s: a closed-lease record does not round-trip: %v", key, err)
		}
		return b
	}
	b1, err := json.Marshal(v)
	if err != nil {
		// The core's own encoder panics here: a record that loads but cannot
		// be written back would crash the orchestrator on its next change.
		t.Fatalf("%s: a decoded record does not re-encode: %v", key, err)
	}
	v2, err := core.DecodeRecord(core.Record{Key: key, Value: b1})
	if err != nil {
		t.Fatalf("%s: the re-encoding %s does not decode: %v", key, b1, err)
	}
	b2, err := json.Marshal(v2)
	if err != nil || !bytes.Equal(b1, b2) {
		t.Fatalf("%s: encoding is not stable:\n first %s\nsecond %s (%v)", key, b1, b2, err)
	}
	if !reflect.DeepEqual(stripLocations(v), stripLocations(v2)) {
		t.Fatalf("%s: %s decodes to a different value after a round trip", key, b1)
	}
	return b1
}

// stripLocations makes values comparable across decodes: two decodes of one
// timestamp with a zone offset give equal instants in distinct *Location
// values. It compares through a second canonical encoding instead.
func stripLocations(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func kindIndex(key string) int {
	k, _, _ := strings.Cut(key, "/")
	for i, kk := range recordKinds {
		if kk == k {
			return i
		}
	}
	return len(recordKinds) - 1
}

// TestRecordsOfRealRunsRoundTrip: every record an orchestrator emitted in a
// few real runs (enrollment, dispatch, the start handshake, reports, logs,
// restarts, revocations…) decodes, and re-encodes byte for byte: records are
// canonical, so a restore that writes nothing back changes nothing.
func TestRecordsOfRealRunsRoundTrip(t *testing.T) {
	recs := realRecords(t)
	kinds := map[string]int{}
	for _, r := range recs {
		if r.Delete {
			continue
		}
		v, err := core.DecodeRecord(r)
		if err != nil {
			t.Fatalf("record %s of a real run does not decode: %v", r.Key, err)
		}
		b := checkCanonical(t, r.Key, v)
		if !bytes.Equal(b, r.Value) {
			t.Fatalf("record %s re-encodes differently:\n  was %s\n  now %s", r.Key, r.Value, b)
		}
		kinds[recordKinds[kindIndex(r.Key)]]++
	}
	for _, k := range recordKinds[:len(recordKinds)-1] {
		if kinds[k] == 0 {
			t.Errorf("the real runs emitted no %s record", k)
		}
	}
	t.Logf("%d records: %v", len(recs), kinds)
}

// realRecords runs the seed streams of FuzzInputStream and a few more and
// returns the distinct records they emitted, in order.
func realRecords(tb testing.TB) []core.Record {
	var out []core.Record
	seen := map[string]bool{}
	streams := streamSeeds()
	for seed := uint64(1); seed <= 4; seed++ {
		r := rand.New(rand.NewPCG(seed, 11))
		in := make([]byte, 900)
		for i := range in {
			in[i] = byte(r.UintN(256))
		}
		streams = append(streams, in)
	}
	for _, in := range streams {
		s := newStream(tb, in)
		s.run()
		for _, rec := range s.records {
			id := rec.Key + "\x00" + string(rec.Value)
			if !seen[id] {
				seen[id] = true
				out = append(out, rec)
			}
		}
	}
	return out
}
