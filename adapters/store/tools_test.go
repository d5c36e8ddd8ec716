package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/tether-run/tether/core"
)

func rec(t *testing.T, key string, v any) core.Record {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return core.Record{Key: key, Value: b}
}

// soundStore writes a store whose records agree with each other: a run of
// two steps, the second running under a current lease on worker w1, an
// ended lease of the first, a token, a data version, a stream and a tar
// bundle. It returns the store, open.
func soundStore(t *testing.T, path string) *Store {
	t.Helper()
	s := open(t, path)
	recs := []core.Record{
		rec(t, "meta", core.MetaRecord{RunSeq: 1, LeaseSeq: 2}),
		rec(t, "run/run-1", core.RunRecord{ID: "run-1", Steps: []core.StepID{"run-1/a", "run-1/b"}}),
		rec(t, "step/run-1/a", core.StepRecord{ID: "run-1/a", Run: "run-1", Name: "a", Index: -1, State: core.StateSuccess, Attempts: 1}),
		rec(t, "step/run-1/b", core.StepRecord{ID: "run-1/b", Run: "run-1", Name: "b", Index: -1, Deps: []core.StepID{"run-1/a"}, State: core.StateRunning, Attempts: 1, Lease: 2}),
		rec(t, "lease/00000000000000000001", core.LeaseRecord{ID: 1, Step: "run-1/a", Worker: "w1", Committed: true}),
		rec(t, "lease/00000000000000000002", core.LeaseRecord{ID: 2, Step: "run-1/b", Worker: "w1", Current: true, Started: true}),
		rec(t, "worker/w1", core.WorkerRecord{ID: "w1", Name: "builder", Slots: 1, Active: true}),
		rec(t, "token/builder", core.TokenRecord{Name: "builder", Consumed: true, Worker: "w1"}),
		rec(t, "log/00000000000000000001/0000000000", core.StepLogLine{Step: "run-1/a", Lease: 1}),
	}
	tarball := makeTar(t, map[string]string{"bin/tool": "#!/bin/sh\n", "README": "hello"}, []string{"bin/tool", "README"})
	bundle := withBlobs(t, s, DataOp{Kind: OpBundle, Body: tarball, At: at})[0]
	bundle.Files, _ = TarIndex(tarball)
	apply(t, s, recs, putOp("out", []byte("result bytes")), appendOp("log", "one "), appendOp("log", "two"), bundle)
	return s
}

func mustCheck(t *testing.T, path string) *Report {
	t.Helper()
	rep, err := Check(path)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func TestCheckSoundStore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tether.db")
	soundStore(t, path).Close()
	rep := mustCheck(t, path)
	if !rep.Sound() || len(rep.Findings) != 0 {
		t.Fatalf("a sound store: %s\n%v", rep.Summary(), rep.Findings)
	}
	for what, want := range map[string]int{"run": 1, "step": 2, "lease": 2, "worker": 1, "data versions": 1, "streams": 1, "bundles": 1, "blobs named": 2, "blob files": 2} {
		if rep.Counted[what] != want {
			t.Errorf("counted %d %s, want %d (%s)", rep.Counted[what], what, want, rep.Summary())
		}
	}
}

// Each planted inconsistency is found, by the check that owns it, naming
// where; the store is then unsound. Warnings alone leave it sound.
func TestCheckFindsPlantedInconsistencies(t *testing.T) {
	bundleFP := ""
	for _, tc := range []struct {
		name     string
		plant    func(t *testing.T, tx *bolt.Tx, path string)
		check    string
		where    string
		unsound  bool
		wantWhat string
	}{
		{"a step whose run is missing", func(t *testing.T, tx *bolt.Tx, _ string) {
			delRaw(t, tx, bktRuns, "run/run-1")
		}, "steps", "step/run-1/a", true, "names run"},
		{"a current lease naming a missing worker", func(t *testing.T, tx *bolt.Tx, _ string) {
			delRaw(t, tx, bucket, "worker/w1")
		}, "leases", "lease/00000000000000000002", true, "worker"},
		{"a run both live and archived", func(t *testing.T, tx *bolt.Tx, _ string) {
			hist := `{"Run": {"ID": "run-1", "Finished": true}, "Status": "success"}`
			if err := putRecords(tx, []core.Record{{Key: "history/run-1", Value: []byte(hist)}}, nil); err != nil {
				t.Fatal(err)
			}
		}, "archived", "run/run-1", true, "both live and archived"},
		{"a history record retention cannot find", func(t *testing.T, tx *bolt.Tx, _ string) {
			hist := `{"Run": {"ID": "run-9", "Finished": true}, "Status": "success"}`
			if err := putRecords(tx, []core.Record{{Key: "history/run-9", Value: []byte(hist)}}, nil); err != nil {
				t.Fatal(err)
			}
			if err := tx.Bucket(bktRunsByFinish).Delete(finishKey(time.Time{}, "run-9")); err != nil {
				t.Fatal(err)
			}
		}, "history", `history/"run-9"`, true, "runs_by_finish"},
		{"a log line of no lease", func(t *testing.T, tx *bolt.Tx, _ string) {
			putRaw(t, tx, bktLogs, "log/00000000000000000077/0000000000", `{"Step": "run-3/x", "Lease": 77, "Index": 0}`)
		}, "log lines", `"log/00000000000000000077/0000000000"`, true, "neither live nor archived"},
		{"a corrupt value", func(t *testing.T, tx *bolt.Tx, _ string) {
			putRaw(t, tx, bucket, "step/run-1/b", `{"ID": "run-1/b", "State": `)
		}, "records", `"step/run-1/b"`, true, "does not decode"},
		{"a record under another entity's key", func(t *testing.T, tx *bolt.Tx, _ string) {
			putRaw(t, tx, bucket, "worker/w2", `{"ID": "w1"}`)
		}, "records", `"worker/w2"`, true, "another key"},
		{"a step naming a lease of another step", func(t *testing.T, tx *bolt.Tx, _ string) {
			putRaw(t, tx, bucket, "step/run-1/a", `{"ID": "run-1/a", "Run": "run-1", "Lease": 2}`)
		}, "steps", "step/run-1/a", true, "lease 2"},
		{"a blob missing", func(t *testing.T, tx *bolt.Tx, path string) {
			if err := os.Remove(filepath.Join(path+".blobs", sumOf([]byte("result bytes")))); err != nil {
				t.Fatal(err)
			}
		}, "blob files", "blob " + sumOf([]byte("result bytes")), true, "missing"},
		{"a version naming a blob the index does not", func(t *testing.T, tx *bolt.Tx, _ string) {
			delRaw(t, tx, bktBlob, sumOf([]byte("result bytes")))
		}, "data", "data out v1", true, "does not name"},
		{"a stream shorter than its appends", func(t *testing.T, tx *bolt.Tx, _ string) {
			putRaw(t, tx, bktStream, "log", `{"id": "log", "length": 4, "appends": 1}`)
		}, "streams", `stream "log"`, true, "length is 4"},
		{"a bundle file index entry of no bundle", func(t *testing.T, tx *bolt.Tx, _ string) {
			putRaw(t, tx, bktBundleFile, strings.Repeat("a", 64)+"\x00x", string(make([]byte, 16)))
		}, "bundles", "bundle.file", true, "does not exist"},
		{"a bundle whose file index lost an entry", func(t *testing.T, tx *bolt.Tx, _ string) {
			delRaw(t, tx, bktBundleFile, bundleFP+"\x00README")
		}, "bundles", "bundle " + bundleFP, true, "says 2 files"},
		{"an unknown record kind (warning)", func(t *testing.T, tx *bolt.Tx, _ string) {
			putRaw(t, tx, bucket, "newkind/x", "\x00\x01binary")
			putRaw(t, tx, bucket, "newkind/y", "\x00\x02binary")
		}, "records", `kind "newkind"`, false, "2 records"},
		{"a live run outside its bucket", func(t *testing.T, tx *bolt.Tx, _ string) {
			v := tx.Bucket(bktRuns).Get([]byte("run/run-1"))
			putRaw(t, tx, bucket, "run/run-1", string(v))
			delRaw(t, tx, bktRuns, "run/run-1")
		}, "records", `"run/run-1"`, true, "is in bucket records, not runs"},
		{"an unknown bucket (warning)", func(t *testing.T, tx *bolt.Tx, _ string) {
			if _, err := tx.CreateBucket([]byte("newbucket")); err != nil {
				t.Fatal(err)
			}
		}, "buckets", `bucket "newbucket"`, false, "no check"},
		{"a blob nobody names (warning)", func(t *testing.T, tx *bolt.Tx, path string) {
			if err := os.WriteFile(filepath.Join(path+".blobs", sumOf([]byte("x"))), []byte("x"), 0o600); err != nil {
				t.Fatal(err)
			}
		}, "blob files", "blob " + sumOf([]byte("x")), false, "no record names"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "tether.db")
			s := soundStore(t, path)
			bundleFP = onlyBundle(t, s).Fingerprint
			s.Close()
			db, err := bolt.Open(path, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := db.Update(func(tx *bolt.Tx) error { tc.plant(t, tx, path); return nil }); err != nil {
				t.Fatal(err)
			}
			db.Close()
			rep := mustCheck(t, path)
			if rep.Sound() == tc.unsound {
				t.Errorf("Sound() = %v, want %v: %s", rep.Sound(), !tc.unsound, rep.Summary())
			}
			found := false
			for _, f := range rep.Findings {
				if f.Check == tc.check && strings.HasPrefix(f.Where, tc.where) && f.Problem == tc.unsound && strings.Contains(f.What, tc.wantWhat) {
					found = true
				}
			}
			if !found {
				t.Errorf("want a finding of check %q at %s (%q); got:\n%v", tc.check, tc.where, tc.wantWhat, rep.Findings)
			}
		})
	}
}

func delRaw(t *testing.T, tx *bolt.Tx, b []byte, k string) {
	t.Helper()
	if tx.Bucket(b).Get([]byte(k)) == nil {
		t.Fatalf("plant: %s %q does not exist", b, k)
	}
	if err := tx.Bucket(b).Delete([]byte(k)); err != nil {
		t.Fatal(err)
	}
}

func putRaw(t *testing.T, tx *bolt.Tx, b []byte, k, v string) {
	t.Helper()
	if err := tx.Bucket(b).Put([]byte(k), []byte(v)); err != nil {
		t.Fatal(err)
	}
}

// A backup taken while the store is in use restores to a store with the
// same records, data and blobs; it never overwrites.
func TestBackupUnpackRoundTrip(t *testing.T) {
	dir := t.TempDir()
	s := soundStore(t, filepath.Join(dir, "tether.db"))
	var buf bytes.Buffer
	if err := s.Backup(&buf); err != nil {
		t.Fatal(err)
	}
	// Written after the snapshot: not in the backup.
	if err := s.Apply([]core.Record{put("token/later", `{"Name": "later"}`)}); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 3 { // the file, its log, its blobs
		t.Errorf("the backup left files behind next to the store: %v", ents)
	}
	want := load(t, s)
	restored := filepath.Join(dir, "restored.db")
	if err := Unpack(bytes.NewReader(buf.Bytes()), restored); err != nil {
		t.Fatal(err)
	}
	if rep := mustCheck(t, restored); !rep.Sound() || len(rep.Findings) != 0 {
		t.Fatalf("the backup: %s\n%v", rep.Summary(), rep.Findings)
	}
	r := open(t, restored)
	got := load(t, r)
	var wantBefore []core.Record
	for _, x := range want {
		if x.Key != "token/later" {
			wantBefore = append(wantBefore, x)
		}
	}
	if !reflect.DeepEqual(got, wantBefore) {
		t.Fatalf("restored records:\n%s\nwant\n%s", show(got), show(wantBefore))
	}
	m, err := r.Data("out", 0)
	if err != nil {
		t.Fatal(err)
	}
	if b := readAll(t, r.DataReader(m)); string(b) != "result bytes" {
		t.Fatalf("restored data = %q", b)
	}
	if b := readAll(t, r.StreamReader("log", 0, 7)); string(b) != "one two" {
		t.Fatalf("restored stream = %q", b)
	}
	if err := Unpack(bytes.NewReader(buf.Bytes()), restored); !errors.Is(err, ErrExists) {
		t.Fatalf("Unpack over an existing store = %v, want ErrExists", err)
	}
}

// A blob whose bytes do not hash to its name is refused, and nothing is
// left of the unpack.
func TestUnpackRefusesACorruptBlob(t *testing.T) {
	dir := t.TempDir()
	s := soundStore(t, filepath.Join(dir, "tether.db"))
	var buf bytes.Buffer
	if err := s.Backup(&buf); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	i := bytes.Index(b, []byte("result bytes"))
	if i < 0 {
		t.Fatal("the blob's bytes are not in the stream")
	}
	b[i] = 'R'
	restored := filepath.Join(dir, "restored.db")
	if err := Unpack(bytes.NewReader(b), restored); err == nil || !strings.Contains(err.Error(), "hash") {
		t.Fatalf("Unpack of a corrupt blob = %v", err)
	}
	for _, p := range []string{restored, restored + ".blobs"} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s left behind (%v)", p, err)
		}
	}
}

// While a backup is under way no blob is collected: a blob released then
// stays until the backup ends, and is collected after.
func TestBackupHoldsCollection(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tether.db")
	s := open(t, path)
	s.blobMu.Lock()
	s.holds++ // as Backup does
	s.blobMu.Unlock()
	ref, err := s.WriteBlob(strings.NewReader("refused write"), 100)
	if err != nil {
		t.Fatal(err)
	}
	s.ReleaseBlob(ref)
	if got := blobFiles(t, path); len(got) != 1 {
		t.Fatalf("collected during a backup: %v", got)
	}
	if n, _ := s.CollectBlobs(); n != 0 {
		t.Fatalf("CollectBlobs removed %d during a backup", n)
	}
	s.blobMu.Lock()
	s.holds--
	s.collectLocked()
	s.blobMu.Unlock()
	if got := blobFiles(t, path); len(got) != 0 {
		t.Fatalf("not collected after the backup: %v", got)
	}
}

// An offline backup reads a closed store without changing it; a store in
// use is ErrLocked for it, for Check and for Compact.
func TestOfflineToolsRefuseAStoreInUse(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tether.db")
	s := soundStore(t, path)
	var buf bytes.Buffer
	if err := BackupFile(path, &buf); !errors.Is(err, ErrLocked) {
		t.Fatalf("BackupFile of a store in use = %v, want ErrLocked", err)
	}
	if _, err := Check(path); !errors.Is(err, ErrLocked) {
		t.Fatalf("Check of a store in use = %v, want ErrLocked", err)
	}
	if _, _, err := Compact(path); !errors.Is(err, ErrLocked) {
		t.Fatalf("Compact of a store in use = %v, want ErrLocked", err)
	}
	s.Close()
	if err := BackupFile(path, &buf); err != nil {
		t.Fatal(err)
	}
	if err := Unpack(&buf, path+".copy"); err != nil {
		t.Fatal(err)
	}
	if rep := mustCheck(t, path+".copy"); !rep.Sound() {
		t.Fatalf("offline backup: %s %v", rep.Summary(), rep.Findings)
	}
	if _, err := Check(filepath.Join(t.TempDir(), "none.db")); err == nil {
		t.Fatal("Check of a missing file succeeded")
	}
}

// Compact reclaims the free pages of deleted records and keeps the rest.
func TestCompact(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tether.db")
	s := soundStore(t, path)
	var batch []core.Record
	for i := range 2000 {
		batch = append(batch, put(fmt.Sprintf("event/run-9/%08d", i), `{"Text": "`+strings.Repeat("x", 1000)+`"}`))
	}
	if err := s.Apply(batch); err != nil {
		t.Fatal(err)
	}
	for i := range batch {
		batch[i] = del(batch[i].Key)
	}
	if err := s.Apply(batch); err != nil {
		t.Fatal(err)
	}
	want := load(t, s)
	s.Close()
	before, after, err := Compact(path)
	if err != nil {
		t.Fatal(err)
	}
	if after >= before || before < 2_000_000 {
		t.Fatalf("compact: %d → %d bytes", before, after)
	}
	if st, _ := os.Stat(path); st.Size() != after {
		t.Fatalf("the file is %d bytes, Compact said %d", st.Size(), after)
	}
	if rep := mustCheck(t, path); !rep.Sound() || len(rep.Findings) != 0 {
		t.Fatalf("after compact: %s %v", rep.Summary(), rep.Findings)
	}
	r := open(t, path)
	if got := load(t, r); !reflect.DeepEqual(got, want) {
		t.Fatalf("records changed by compact:\n%s\nwant\n%s", show(got), show(want))
	}
	if ents, _ := os.ReadDir(filepath.Dir(path)); len(ents) != 3 { // the file, its log, its blobs
		t.Errorf("compact left files behind: %v", ents)
	}
}

// Backups taken while batches commit are each one consistent state: every
// batch writes a run with its step and a data version naming a blob, and
// every backup checks sound and holds whole batches only.
func TestBackupUnderConcurrentWrites(t *testing.T) {
	dir := t.TempDir()
	s := open(t, filepath.Join(dir, "tether.db"))
	const batches = 60
	done := make(chan error, 1)
	go func() {
		for i := range batches {
			run, step := fmt.Sprintf("run-%d", i), core.StepID(fmt.Sprintf("run-%d/a", i))
			recs := []core.Record{
				rec(t, "run/"+run, core.RunRecord{ID: core.RunID(run), Steps: []core.StepID{step}}),
				rec(t, "step/"+string(step), core.StepRecord{ID: step, Run: core.RunID(run), Name: "a", Index: -1}),
			}
			body := []byte(fmt.Sprintf("output of %s", run))
			ref, err := s.WriteBlob(bytes.NewReader(body), int64(len(body)))
			if err != nil {
				done <- err
				return
			}
			_, err = s.ApplyWithData(recs, []DataOp{{Kind: OpPut, ID: "out", Blob: ref, At: at}})
			s.ReleaseBlob(ref)
			if err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for n := 0; ; n++ {
		var buf bytes.Buffer
		if err := s.Backup(&buf); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, fmt.Sprintf("backup-%d.db", n))
		if err := Unpack(&buf, path); err != nil {
			t.Fatal(err)
		}
		rep := mustCheck(t, path)
		if !rep.Sound() || len(rep.Findings) != 0 {
			t.Fatalf("backup %d: %s\n%v", n, rep.Summary(), rep.Findings)
		}
		if rep.Counted["run"] != rep.Counted["data versions"] || rep.Counted["run"] != rep.Counted["blob files"] {
			t.Fatalf("backup %d holds part of a batch: %s", n, rep.Summary())
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				t.Log("every backup came after the last batch")
			}
			return
		default:
		}
	}
}

// What a compaction or an unpack killed midway leaves is removed by the
// next call that owns it: a compaction's copy (as large as the store) by
// the next Compact or Open of the store, an unpack's half-written store
// file by the next Unpack to the same path. An unpack's blob directory
// left without its store file is refused with what to do.
func TestKilledToolsLeftoversRemoved(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tether.db")
	s := soundStore(t, path)
	var buf bytes.Buffer
	if err := s.Backup(&buf); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	touch := func(name string) string {
		t.Helper()
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, make([]byte, 1<<10), 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	gone := func(what, f string) {
		t.Helper()
		if _, err := os.Stat(f); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s (%s): %v, want it removed", what, filepath.Base(f), err)
		}
	}
	keep := touch("tether.db.compactor") // not a leftover: kept
	left := touch("tether.db.compact-111")
	if _, _, err := Compact(path); err != nil {
		t.Fatal(err)
	}
	gone("a compaction's leftover, after Compact", left)
	left = touch("tether.db.compact-222")
	open(t, path).Close()
	gone("a compaction's leftover, after Open", left)
	if _, err := os.Stat(keep); err != nil {
		t.Errorf("another file beside the store: %v, want it kept", err)
	}

	restored := filepath.Join(dir, "restored.db")
	half := touch("restored.db.tmp-333")
	if err := os.Mkdir(restored+".blobs", 0o700); err != nil {
		t.Fatal(err)
	}
	err := Unpack(bytes.NewReader(buf.Bytes()), restored)
	if !errors.Is(err, ErrExists) || !strings.Contains(err.Error(), "stopped midway") {
		t.Fatalf("Unpack beside a blob directory left without its store = %v, want ErrExists saying what to do", err)
	}
	if err := os.Remove(restored + ".blobs"); err != nil {
		t.Fatal(err)
	}
	if err := Unpack(bytes.NewReader(buf.Bytes()), restored); err != nil {
		t.Fatal(err)
	}
	gone("an unpack's half-written store file, after Unpack", half)
}
