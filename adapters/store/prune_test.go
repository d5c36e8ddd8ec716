package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/tether-run/tether/core"
)

// put stores body as the next version of id at time when, releasing its
// blob's pin at once (as the driver does once the write is answered).
func putAt(t *testing.T, s *Store, id string, body []byte, when time.Time, kind DataOpKind) DataResult {
	t.Helper()
	ref, err := s.WriteBlob(bytes.NewReader(body), int64(len(body)))
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.ApplyWithData(nil, []DataOp{{Kind: kind, ID: id, Blob: ref, At: when, Lease: 1}})
	s.ReleaseBlob(ref)
	if err != nil || res[0].Err != nil {
		t.Fatal(err, res)
	}
	return res[0]
}

func blobExists(path, sha string) bool {
	_, err := os.Stat(filepath.Join(path+".blobs", sha))
	return err == nil
}

// TestPruneData: what is older than the cutoff and kept by nothing goes —
// old versions but each id's newest, old streams with their chunks, old
// bundles no live run names — and its blob with it unless another record
// names the same bytes; everything else stays, the store checks sound, and
// small budgets only mean more transactions.
func TestPruneData(t *testing.T) {
	for _, budget := range []int{1, 3, PruneBudget} {
		path := filepath.Join(t.TempDir(), "tether.db")
		s := open(t, path)
		old, cutoff, recent := at, at.Add(time.Hour), at.Add(2*time.Hour)

		v1 := putAt(t, s, "out", []byte("first"), old, OpPut).Data       // old, not newest: goes
		v2 := putAt(t, s, "out", []byte("shared"), old, OpPut).Data      // old, not newest: goes, but its bytes stay (v3)
		v3 := putAt(t, s, "out", []byte("shared"), old, OpPut).Data      // old but newest: stays
		keep := putAt(t, s, "other", []byte("kept"), old, OpPut).Data    // old but newest: stays
		fresh1 := putAt(t, s, "fresh", []byte("f1"), recent, OpPut).Data // recent: stays
		putAt(t, s, "fresh", []byte("f2"), recent, OpPut)
		oldFP := putAt(t, s, "", []byte("old bundle"), old, OpBundle).Bundle.Fingerprint
		liveFP := putAt(t, s, "", []byte("bundle a live run names"), old, OpBundle).Bundle.Fingerprint
		newFP := putAt(t, s, "", []byte("new bundle"), recent, OpBundle).Bundle.Fingerprint
		for i := 0; i < 5; i++ {
			if _, err := s.ApplyWithData(nil, []DataOp{{Kind: OpAppend, ID: "oldlog", Body: []byte("x"), At: old}}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.ApplyWithData(nil, []DataOp{{Kind: OpAppend, ID: "newlog", Body: []byte("y"), At: recent}}); err != nil {
			t.Fatal(err)
		}

		st, err := s.PruneData(cutoff, func(fp string) bool { return fp == liveFP }, budget)
		if err != nil {
			t.Fatal(err)
		}
		if st.Versions != 2 || st.Streams != 1 || st.Bundles != 1 || st.Blobs != 2 {
			t.Fatalf("budget %d: pruned %+v, want 2 versions, 1 stream, 1 bundle, 2 blobs", budget, st)
		}
		if budget == 1 && st.Transactions < 4 {
			t.Fatalf("budget 1 took %d transactions", st.Transactions)
		}
		for _, v := range []DataMeta{v1, v2} {
			if _, err := s.Data(v.ID, v.Version); !errors.Is(err, ErrNotFound) {
				t.Fatalf("%s v%d survived: %v", v.ID, v.Version, err)
			}
		}
		for _, v := range []DataMeta{v3, keep, fresh1} {
			if _, err := s.Data(v.ID, v.Version); err != nil {
				t.Fatalf("%s v%d pruned: %v", v.ID, v.Version, err)
			}
		}
		if got := readAll(t, s.DataReader(v3)); string(got) != "shared" {
			t.Fatalf("v3 reads %q: its blob went with v2", got)
		}
		if blobExists(path, v1.SHA256) || !blobExists(path, v3.SHA256) || blobExists(path, oldFP) || !blobExists(path, liveFP) || !blobExists(path, newFP) {
			t.Fatal("the blobs left are not exactly those still named")
		}
		if _, err := s.Stream("oldlog"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("old stream survived: %v", err)
		}
		if _, err := s.Stream("newlog"); err != nil {
			t.Fatalf("new stream pruned: %v", err)
		}
		for fp, want := range map[string]bool{oldFP: false, liveFP: true, newFP: true} {
			if _, err := s.Bundle(fp); (err == nil) != want {
				t.Fatalf("bundle %s: %v, want kept=%v", fp[:8], err, want)
			}
		}
		s.Close()
		rep := mustCheck(t, path)
		if !rep.Sound() || len(rep.Findings) != 0 {
			t.Fatalf("after pruning: %s %v", rep.Summary(), rep.Findings)
		}
		if rep.Counted["streams"] != 1 {
			t.Fatalf("stream chunks of the pruned stream left behind: %s", rep.Summary())
		}
	}
}

// archivedRun is the history record of a run finished at when, with one
// lease and its log lines.
func archivedRun(t *testing.T, n int, lease core.LeaseID, when time.Time, lines int) []core.Record {
	t.Helper()
	id := core.RunID(fmt.Sprintf("run-%d", n))
	h := core.RunHistory{Run: core.RunRecord{ID: id, Finished: true, FinishedAt: when, SubmittedAt: when},
		Status: "success", Leases: []core.LeaseRecord{{ID: lease, Step: core.StepID(string(id) + "/a")}}}
	v, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	recs := []core.Record{{Key: core.HistoryKey(id), Value: v}}
	for i := 0; i < lines; i++ {
		ln := core.StepLogLine{Step: core.StepID(string(id) + "/a"), Lease: lease, Index: i}
		lv, _ := json.Marshal(ln)
		recs = append(recs, core.Record{Key: fmt.Sprintf("log/%020d/%010d", uint64(lease), i), Value: lv})
	}
	return recs
}

// TestPruneHistory: the runs that finished before the cutoff leave the
// history, its indexes and its count, with every log line of their leases,
// whatever the budget; a later run and a live lease's lines stay; a note
// left by a pass cut short (a crash) is finished by the next.
func TestPruneHistory(t *testing.T) {
	for _, budget := range []int{1, 7, PruneBudget} {
		path := filepath.Join(t.TempDir(), "tether.db")
		s := open(t, path)
		old, cutoff, recent := at, at.Add(time.Hour), at.Add(2*time.Hour)
		var recs []core.Record
		recs = append(recs, archivedRun(t, 1, 1, old, 25)...)
		recs = append(recs, archivedRun(t, 2, 2, old, 3)...)
		recs = append(recs, archivedRun(t, 3, 3, recent, 4)...)
		// a live run's lease, with lines
		recs = append(recs, rec(t, "lease/00000000000000000009", core.LeaseRecord{ID: 9, Step: "run-4/a", Worker: "w1"}))
		for i := 0; i < 2; i++ {
			lv, _ := json.Marshal(core.StepLogLine{Step: "run-4/a", Lease: 9, Index: i})
			recs = append(recs, core.Record{Key: fmt.Sprintf("log/%020d/%010d", 9, i), Value: lv})
		}
		if err := s.Apply(recs); err != nil {
			t.Fatal(err)
		}
		st, err := s.PruneHistory(cutoff, budget)
		if err != nil {
			t.Fatal(err)
		}
		if st.Runs != 2 || st.LogLines != 28 {
			t.Fatalf("budget %d: pruned %+v, want 2 runs and 28 lines", budget, st)
		}
		for _, id := range []core.RunID{"run-1", "run-2"} {
			if _, err := s.History(id); !errors.Is(err, ErrNotFound) {
				t.Fatalf("%s survived: %v", id, err)
			}
		}
		if _, err := s.History("run-3"); err != nil {
			t.Fatalf("run-3 pruned: %v", err)
		}
		if n, _ := s.ArchivedRuns(); n != 1 {
			t.Fatalf("%d archived runs counted, want 1", n)
		}
		if lines, _, _ := s.HistoryLogs([]core.LeaseID{1, 2, 3}, "", 0); len(lines) != 4 {
			t.Fatalf("%d lines left of leases 1-3, want run-3's 4", len(lines))
		}
		live, err := s.Load()
		if err != nil {
			t.Fatal(err)
		}
		if nlog := countPrefix(live, "log/"); nlog != 2 {
			t.Fatalf("the live lease's lines: %d, want 2", nlog)
		}
		runs, _, _ := s.ListRuns(RunFilter{}, 0, 10)
		if len(runs) != 1 || runs[0].ID != "run-3" {
			t.Fatalf("listing after pruning: %v", runs)
		}
		s.Close()
		if rep := mustCheck(t, path); !rep.Sound() {
			t.Fatalf("after pruning: %s %v", rep.Summary(), rep.Findings)
		}
	}

	// A pass cut short after run-1 left the history: its note finishes.
	path := filepath.Join(t.TempDir(), "tether.db")
	s := open(t, path)
	if err := s.Apply(archivedRun(t, 1, 1, at, 5)); err != nil {
		t.Fatal(err)
	}
	err := s.update(func(tx *bolt.Tx) error {
		_, err := pruneRuns(tx, &pruneTx{left: 10}, at.Add(time.Hour), nil)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if rep := mustCheck(t, path); !rep.Sound() {
		t.Fatalf("a store with a pruning note is sound: %s %v", rep.Summary(), rep.Findings)
	}
	s = open(t, path)
	st, err := s.PruneHistory(at.Add(time.Hour), 2)
	if err != nil || st.LogLines != 5 || st.Runs != 0 {
		t.Fatalf("the next pass: %+v %v, want the 5 noted lines", st, err)
	}
	s.Close()
}

func countPrefix(recs []core.Record, prefix string) int {
	n := 0
	for _, r := range recs {
		if strings.HasPrefix(r.Key, prefix) {
			n++
		}
	}
	return n
}

// TestSlimSummary: the summary built from the slim decode on the commit
// path is the one Summarize builds from the whole history.
func TestSlimSummary(t *testing.T) {
	h := core.RunHistory{Status: "failed", Run: core.RunRecord{ID: "run-7", Parent: "run-2", Spec: core.RunSpec{Name: "nightly",
		Steps: []core.StepSpec{{Name: "a", Command: "make"}, {Name: "b", Command: "make test"}}},
		SubmittedAt: at, Deadline: at.Add(time.Hour), CancelReason: "operator", Steps: []core.StepID{"run-7/a", "run-7/b"},
		Finished: true, FinishedAt: at.Add(time.Minute)},
		Steps:  []core.StepRecord{{ID: "run-7/a", State: core.StateSuccess}, {ID: "run-7/b", State: core.StateFailed, Message: "exit 2"}},
		Leases: []core.LeaseRecord{{ID: 3, Step: "run-7/a"}}, Events: []core.ServerEvent{{Run: "run-7", Seq: 1, Kind: "run-submitted"}}}
	v, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	var slim slimHistory
	if err := json.Unmarshal(v, &slim); err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(slim.summary())
	b, _ := json.Marshal(Summarize(&h))
	if !bytes.Equal(a, b) {
		t.Fatalf("slim summary\n%s\nwhole\n%s", a, b)
	}
}

// TestSummaryFromHead: a history record with a head (what the core writes,
// SPEC §7a) is summarized from the head alone, as Summarize summarizes the
// whole, and the reader stops after the head: what follows it is not read.
func TestSummaryFromHead(t *testing.T) {
	h := core.RunHistory{Status: "failed", Run: core.RunRecord{ID: "run-7", Parent: "run-2", Spec: core.RunSpec{Name: "nightly"},
		SubmittedAt: at, Deadline: at.Add(time.Hour), CancelReason: "operator", Steps: []core.StepID{"run-7/a", "run-7/b"},
		Finished: true, FinishedAt: at.Add(time.Minute)},
		Steps: []core.StepRecord{{ID: "run-7/a", State: core.StateSuccess}, {ID: "run-7/b", State: core.StateFailed}}}
	h.Head = core.HistoryHead{Run: "run-7", Name: "nightly", Status: "failed", Parent: "run-2", SubmittedAt: at, FinishedAt: at.Add(time.Minute),
		Deadline: at.Add(time.Hour), CancelReason: "operator", Steps: 2, States: map[string]int{"success": 1, "failed": 1}}
	v, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	head, _, ok := bytes.Cut(v, []byte(`,"Run":`))
	if !ok {
		t.Fatalf("no Run after the head in %s", v)
	}
	for name, val := range map[string][]byte{"whole": v, "head then garbage": append(head, `,"Run":{"ID":[[[`...)} {
		sum, err := summaryOf(val)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		a, _ := json.Marshal(sum)
		b, _ := json.Marshal(Summarize(&h))
		if !bytes.Equal(a, b) {
			t.Fatalf("%s: summary from the head\n%s\nfrom the whole\n%s", name, a, b)
		}
	}
}
