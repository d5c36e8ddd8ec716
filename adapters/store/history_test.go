package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/tether-run/tether/core"
)

var h0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func jsonRec(t testing.TB, key string, v any) core.Record {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return core.Record{Key: key, Value: b}
}

func leaseKey(id core.LeaseID) string { return fmt.Sprintf("%s/%020d", core.KindLease, id) }
func logKey(id core.LeaseID, idx int) string {
	return fmt.Sprintf("%s/%020d/%010d", core.KindLog, id, idx)
}

func logRec(t testing.TB, step core.StepID, id core.LeaseID, idx int) core.Record {
	return jsonRec(t, logKey(id, idx), core.StepLogLine{Step: step, Lease: id, Index: idx,
		Line: core.LogLine{Seq: uint64(idx + 1), At: h0, Text: fmt.Sprintf("line %d of lease %d", idx, id)}})
}

// history builds an archived run of n steps, one lease each (leases
// firstLease..), finished at h0+seq minutes.
func history(seq uint64, name, status string, n int, firstLease core.LeaseID) core.RunHistory {
	id := core.RunID(fmt.Sprintf("run-%d", seq))
	at := h0.Add(time.Duration(seq) * time.Minute)
	h := core.RunHistory{Status: status, Run: core.RunRecord{ID: id, Spec: core.RunSpec{Name: name}, SubmittedAt: at, Finished: true, FinishedAt: at.Add(time.Second)}}
	for i := range n {
		sid := core.StepID(fmt.Sprintf("%s/s%d", id, i))
		h.Run.Steps = append(h.Run.Steps, sid)
		lid := firstLease + core.LeaseID(i)
		st := core.StateSuccess
		if status == "failed" && i == 0 {
			st = core.StateFailed
		}
		h.Steps = append(h.Steps, core.StepRecord{ID: sid, Run: id, Name: fmt.Sprintf("s%d", i), Index: -1, State: st, Attempts: 1,
			QueuedAt: at, StartedAt: at, FinishedAt: at.Add(time.Second), Outcome: &core.Outcome{Status: core.OutcomeSuccess}})
		h.Leases = append(h.Leases, core.LeaseRecord{ID: lid, Step: sid, Worker: "w1", GrantedAt: at, Started: true, Committed: true,
			EndReason: "step success", Answers: []core.AnsweredReport{{Request: 7}}})
		h.Events = append(h.Events, core.ServerEvent{Run: id, Seq: i + 1, At: at, Step: sid, Kind: "step-succeeded", Message: "exit 0"})
	}
	return h
}

func TestHistoryRoutingAndLoad(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "tether.db"))
	h := history(1, "build", "success", 2, 1)
	recs := []core.Record{
		put("meta", `{}`),
		jsonRec(t, leaseKey(3), core.LeaseRecord{ID: 3, Step: "run-2/a", Current: true}),
		logRec(t, "run-1/s0", 1, 0), logRec(t, "run-1/s0", 1, 1), logRec(t, "run-1/s1", 2, 0),
		logRec(t, "run-2/a", 3, 0), logRec(t, "run-2/a", 3, 1),
		jsonRec(t, core.HistoryKey(h.Run.ID), h),
	}
	if err := s.Apply(recs); err != nil {
		t.Fatal(err)
	}
	// Load: the live records and lease 3's lines; not lease 1's or 2's
	// (archived), nor the history.
	var keys []string
	for _, r := range load(t, s) {
		keys = append(keys, r.Key)
	}
	want := []string{leaseKey(3), logKey(3, 0), logKey(3, 1), "meta"}
	if !reflect.DeepEqual(keys, want) {
		t.Fatalf("Load keys = %v, want %v", keys, want)
	}
	got, err := s.History("run-1")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(jsonOf(t, got), jsonOf(t, h)) {
		t.Fatalf("History = %s\nwant %s", jsonOf(t, got), jsonOf(t, h))
	}
	if _, err := s.History("run-2"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("History of a live run: %v, want ErrNotFound", err)
	}
	if n, err := s.ArchivedRuns(); err != nil || n != 1 {
		t.Fatalf("ArchivedRuns = %d, %v; want 1", n, err)
	}
	// HistoryLogs pages through leases 2 then 1 asked in any order.
	var all []string
	after := ""
	for pages := 0; ; pages++ {
		if pages > 5 {
			t.Fatal("HistoryLogs does not end")
		}
		lines, next, err := s.HistoryLogs([]core.LeaseID{2, 1}, after, 2)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range lines {
			all = append(all, fmt.Sprintf("%d/%d", l.Lease, l.Index))
		}
		if next == "" {
			break
		}
		after = next
	}
	if w := []string{"1/0", "1/1", "2/0"}; !reflect.DeepEqual(all, w) {
		t.Fatalf("HistoryLogs pages = %v, want %v", all, w)
	}
}

func jsonOf(t testing.TB, v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestListRunsPagesAndFilters(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "tether.db"))
	var recs []core.Record
	for seq := uint64(1); seq <= 25; seq++ {
		name, status := "build", "success"
		if seq%3 == 0 {
			name = "deploy"
		}
		if seq%5 == 0 {
			status = "failed"
		}
		h := history(seq, name, status, 1, core.LeaseID(seq))
		recs = append(recs, jsonRec(t, core.HistoryKey(h.Run.ID), h))
	}
	if err := s.Apply(recs); err != nil {
		t.Fatal(err)
	}
	list := func(f RunFilter, limit int) []uint64 {
		var seqs []uint64
		cursor := uint64(0)
		for pages := 0; ; pages++ {
			if pages > 30 {
				t.Fatal("ListRuns does not end")
			}
			runs, next, err := s.ListRuns(f, cursor, limit)
			if err != nil {
				t.Fatal(err)
			}
			if len(runs) > limit {
				t.Fatalf("a page of %d runs, limit %d", len(runs), limit)
			}
			for _, r := range runs {
				if !r.Archived || r.Steps != 1 || r.States[r.Status] != 1 && r.Status != "failed" {
					t.Fatalf("summary %+v", r)
				}
				seqs = append(seqs, r.Seq)
			}
			if next == 0 {
				return seqs
			}
			cursor = next
		}
	}
	var want []uint64
	for seq := uint64(25); seq >= 1; seq-- {
		want = append(want, seq)
	}
	for _, limit := range []int{1, 4, 25, 100} {
		if got := list(RunFilter{}, limit); !reflect.DeepEqual(got, want) {
			t.Fatalf("limit %d: %v, want %v", limit, got, want)
		}
	}
	if got, w := list(RunFilter{Name: "deploy", Status: "failed"}, 2), []uint64{15}; !reflect.DeepEqual(got, w) {
		t.Fatalf("deploy+failed: %v, want %v", got, w)
	}
	if got, w := list(RunFilter{Since: h0.Add(22 * time.Minute)}, 2), []uint64{25, 24, 23, 22}; !reflect.DeepEqual(got, w) {
		t.Fatalf("since: %v, want %v", got, w)
	}
	// A cursor past the newest run starts from the newest.
	if runs, _, err := s.ListRuns(RunFilter{}, 1000, 1); err != nil || len(runs) != 1 || runs[0].Seq != 25 {
		t.Fatalf("cursor 1000: %+v %v", runs, err)
	}
}

// TestMigrateOldLayout opens a store of the layout before archival (every
// record in "records"): the log and history records move to their buckets,
// in several transactions, and a second Open finds nothing to move.
func TestMigrateOldLayout(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tether.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := history(1, "build", "success", 1, 1)
	nlogs := 2*migrateBatch + 7
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket([]byte("records"))
		if err != nil {
			return err
		}
		recs := []core.Record{put("meta", `{}`), jsonRec(t, leaseKey(9), core.LeaseRecord{ID: 9, Step: "run-2/a", Current: true}),
			jsonRec(t, core.HistoryKey("run-1"), h), logRec(t, "run-1/s0", 1, 0)}
		for i := range nlogs {
			recs = append(recs, logRec(t, "run-2/a", 9, i))
		}
		for _, r := range recs {
			if err := b.Put([]byte(r.Key), r.Value); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	for round := range 2 {
		s, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		recs := load(t, s)
		if len(recs) != 2+nlogs || recs[0].Key != leaseKey(9) || recs[len(recs)-1].Key != "meta" {
			t.Fatalf("round %d: Load gives %d records (%s … %s), want %d", round, len(recs), recs[0].Key, recs[len(recs)-1].Key, 2+nlogs)
		}
		if _, err := s.History("run-1"); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		lines, _, err := s.HistoryLogs([]core.LeaseID{1}, "", 0)
		if err != nil || len(lines) != 1 {
			t.Fatalf("round %d: lease 1's lines %v, %v", round, lines, err)
		}
		err = s.view(func(tx *bolt.Tx) error {
			c := tx.Bucket(bucket).Cursor()
			for _, p := range []string{"log/", "history/", "meta", "run/"} {
				if k, _ := c.Seek([]byte(p)); k != nil && strings.HasPrefix(string(k), p) {
					t.Errorf("round %d: %s left in records", round, k)
				}
			}
			if tx.Bucket(bktMeta).Get([]byte("meta")) == nil {
				t.Errorf("round %d: meta not moved to its bucket", round)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := s.ArchivedRuns(); n != 1 {
			t.Fatalf("round %d: ArchivedRuns = %d", round, n)
		}
		s.Close()
	}
}

// TestHistorySize measures a 500-step run's history record, as JSON and as
// stored (flate, BestSpeed).
func TestHistorySize(t *testing.T) {
	h := history(1, "build", "success", 500, 1)
	js := []byte(jsonOf(t, h))
	z := compressHistory(js)
	t.Logf("500-step history: JSON %d bytes, stored %d bytes (%.1f%%)", len(js), len(z), 100*float64(len(z))/float64(len(js)))
	if len(z) >= len(js)/2 {
		t.Fatalf("compressed %d of %d bytes", len(z), len(js))
	}
	back, err := decodeHistory(z)
	if err != nil || jsonOf(t, back) != string(js) {
		t.Fatalf("round trip: %v", err)
	}
}
