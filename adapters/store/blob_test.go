package store

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sort"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/tether-run/tether/core"
)

// blobFiles lists the files of a store's blob directory.
func blobFiles(t *testing.T, path string) []string {
	t.Helper()
	ents, err := os.ReadDir(path + ".blobs")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out
}

func sumOf(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// A crash between the blob and the commit that would name it leaves an
// orphan blob; the next Open collects it, and keeps the blobs records name.
func TestBlobOrphanOfACrashCollectedAtOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tether.db")
	s := open(t, path)
	kept := apply(t, s, nil, putOp("out", []byte("committed")))[0].Data
	orphan, err := s.WriteBlob(bytes.NewReader([]byte("never committed")), 100)
	if err != nil {
		t.Fatal(err)
	}
	// A write cut short mid-body by the crash leaves a temporary file.
	if err := os.WriteFile(filepath.Join(path+".blobs", blobTempPrefix+"123"), []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, want := blobFiles(t, path), []string{blobTempPrefix + "123", kept.SHA256, orphan.SHA256}; len(got) != 3 {
		t.Fatalf("blob files %v, want %v", got, want)
	}
	s.Close() // the crash: the orphan is still pinned, nothing released it
	s = open(t, path)
	if got := blobFiles(t, path); len(got) != 1 || got[0] != kept.SHA256 {
		t.Fatalf("blob files after reopen %v, want only the committed %s", got, kept.SHA256)
	}
	m, err := s.Data("out", 1)
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, s.DataReader(m)); string(got) != "committed" {
		t.Fatalf("committed version reads %q", got)
	}
}

// A write the driver refused (its op never applied) leaves nothing once
// released; a blob another write still pins, or a record names, stays.
func TestBlobOfARefusedWriteLeavesNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tether.db")
	s := open(t, path)
	refused, err := s.WriteBlob(bytes.NewReader([]byte("fenced out")), 100)
	if err != nil {
		t.Fatal(err)
	}
	s.ReleaseBlob(refused)
	if got := blobFiles(t, path); len(got) != 0 {
		t.Fatalf("blob files %v after a refused write, want none", got)
	}

	// Two writes of the same bytes: one refused, one committed.
	a, err := s.WriteBlob(bytes.NewReader([]byte("same")), 100)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.WriteBlob(bytes.NewReader([]byte("same")), 100)
	if err != nil {
		t.Fatal(err)
	}
	s.ReleaseBlob(a) // refused: b still pins the blob
	if got := blobFiles(t, path); len(got) != 1 {
		t.Fatalf("blob files %v: a blob another write pins was collected", got)
	}
	res, err := s.ApplyWithData(nil, []DataOp{{Kind: OpPut, ID: "x", Blob: b, At: at}})
	if err != nil || res[0].Err != nil {
		t.Fatal(err, res)
	}
	s.ReleaseBlob(b)
	if got := blobFiles(t, path); len(got) != 1 || got[0] != sumOf([]byte("same")) {
		t.Fatalf("blob files %v: the committed blob must stay", got)
	}

	// An op naming a released blob is refused and writes nothing.
	gone, err := s.WriteBlob(bytes.NewReader([]byte("released")), 100)
	if err != nil {
		t.Fatal(err)
	}
	s.ReleaseBlob(gone)
	res, err = s.ApplyWithData([]core.Record{put("k", "v")}, []DataOp{{Kind: OpPut, ID: "y", Blob: gone, At: at}})
	if err != nil || !errors.Is(res[0].Err, ErrNoBlob) {
		t.Fatalf("op naming a released blob: %v, %v; want ErrNoBlob", err, res)
	}
	if _, err := s.Data("y", 0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a refused op wrote data: %v", err)
	}
	if got := load(t, s); len(got) != 1 {
		t.Fatalf("records %s: the rest of the batch must apply", show(got))
	}
}

// Bytes over the limit are refused and leave no file, whatever the source.
func TestBlobOverTheLimitLeavesNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tether.db")
	s := open(t, path)
	if _, err := s.WriteBlob(bytes.NewReader(make([]byte, 101)), 100); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("101 bytes under a limit of 100: %v, want ErrTooLarge", err)
	}
	broken := io.MultiReader(bytes.NewReader([]byte("partial")), errReader{})
	if _, err := s.WriteBlob(broken, 100); err == nil {
		t.Fatal("a body that failed mid-way was kept")
	}
	if got := blobFiles(t, path); len(got) != 0 {
		t.Fatalf("blob files %v, want none", got)
	}
	if ref, err := s.WriteBlob(bytes.NewReader(make([]byte, 100)), 100); err != nil || ref.Size != 100 {
		t.Fatalf("exactly the limit: %+v, %v", ref, err)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("connection reset") }

// A store written by b5f896c (bodies in chunks inside the bbolt file) opens
// and reads as it did, and takes new writes (blobs) beside the old ones.
func TestLegacyStoreReadable(t *testing.T) {
	gz, err := os.Open(filepath.Join("testdata", "legacy-b5f896c.db.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer gz.Close()
	zr, err := gzip.NewReader(gz)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "tether.db")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	s := open(t, path)
	big := make([]byte, ChunkSize+10) // what the fixture's writer stored as version 2
	for i := range big {
		big[i] = byte(i % 251)
	}
	for v, want := range map[uint64][]byte{1: []byte("legacy v1\n"), 2: big} {
		m, err := s.Data("report", v)
		if err != nil {
			t.Fatal(err)
		}
		if m.SHA256 != sumOf(want) || m.Worker != "w-1" {
			t.Fatalf("version %d meta %+v", v, m)
		}
		if got := readAll(t, s.DataReader(m)); !bytes.Equal(got, want) {
			t.Fatalf("legacy version %d: read %d bytes, want %d", v, len(got), len(want))
		}
	}
	if got := string(readAll(t, s.StreamReader("log", 0, 7))); got != "line 1\n" {
		t.Fatalf("legacy stream %q", got)
	}
	// The fixture's one bundle: a tar with dir/a.txt.
	bundle := onlyBundle(t, s)
	span, err := s.BundleFile(bundle.Fingerprint, "dir/a.txt")
	if err != nil {
		t.Fatal(err)
	}
	if got := string(readAll(t, s.BundleReader(bundle, span.Offset, span.Size))); got != "alpha\n" {
		t.Fatalf("legacy bundle file %q", got)
	}
	if whole := readAll(t, s.BundleReader(bundle, 0, bundle.Size)); sumOf(whole) != bundle.Fingerprint {
		t.Fatal("legacy bundle bytes do not match their fingerprint")
	}
	// New writes go to blobs, next to the old versions.
	m := apply(t, s, nil, putOp("report", []byte("v3 in a blob")))[0].Data
	if m.Version != 3 {
		t.Fatalf("new version %d, want 3", m.Version)
	}
	if got := string(readAll(t, s.DataReader(m))); got != "v3 in a blob" {
		t.Fatalf("new version reads %q", got)
	}
	if got := blobFiles(t, path); len(got) != 1 || got[0] != m.SHA256 {
		t.Fatalf("blob files %v", got)
	}
}

// onlyBundle returns the store's one bundle.
func onlyBundle(t *testing.T, s *Store) BundleMeta {
	t.Helper()
	var fps []string
	err := s.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bktBundle).ForEach(func(k, _ []byte) error { fps = append(fps, string(k)); return nil })
	})
	if err != nil || len(fps) != 1 {
		t.Fatalf("bundles %v, %v; want one", fps, err)
	}
	m, err := s.Bundle(fps[0])
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// Releasing what was never pinned (or twice) changes nothing and does not
// stop later collections.
func TestReleaseBlobOfNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tether.db")
	s := open(t, path)
	s.ReleaseBlob(BlobRef{})
	ref, err := s.WriteBlob(bytes.NewReader([]byte("x")), 10)
	if err != nil {
		t.Fatal(err)
	}
	s.ReleaseBlob(ref)
	s.ReleaseBlob(ref)
	if got := blobFiles(t, path); len(got) != 0 {
		t.Fatalf("blob files %v, want none", got)
	}
}
