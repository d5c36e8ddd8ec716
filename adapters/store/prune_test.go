package store

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
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
