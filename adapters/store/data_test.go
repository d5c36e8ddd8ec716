package store

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/tether-run/tether/core"
)

var at = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// apply applies ops as the driver does: the bytes of a put or a bundle
// given as its Body are written to a blob first, released once applied.
func apply(t *testing.T, s *Store, recs []core.Record, ops ...DataOp) []DataResult {
	t.Helper()
	ops = withBlobs(t, s, ops...)
	res, err := s.ApplyWithData(recs, ops)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != len(ops) {
		t.Fatalf("%d results for %d ops", len(res), len(ops))
	}
	return res
}

// withBlobs writes the Body of each put and bundle op to a blob it names
// instead (released at the end of the test).
func withBlobs(t *testing.T, s *Store, ops ...DataOp) []DataOp {
	t.Helper()
	out := make([]DataOp, len(ops))
	for i, op := range ops {
		if (op.Kind == OpPut || op.Kind == OpBundle) && op.Blob.SHA256 == "" {
			ref, err := s.WriteBlob(bytes.NewReader(op.Body), int64(len(op.Body)))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.ReleaseBlob(ref) })
			op.Blob, op.Body = ref, nil
		}
		out[i] = op
	}
	return out
}

func putOp(id string, body []byte) DataOp {
	return DataOp{Kind: OpPut, ID: id, Body: body, Worker: "w1", Lease: 7, At: at}
}

func appendOp(id, body string) DataOp {
	return DataOp{Kind: OpAppend, ID: id, Body: []byte(body), At: at}
}

func readAll(t *testing.T, r io.Reader) []byte {
	t.Helper()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// pattern returns n bytes that differ from chunk to chunk, so a chunk read
// from the wrong place shows.
func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/ChunkSize)
	}
	return b
}

func TestPutVersionsAreImmutableAndIncreasing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tether.db")
	s := open(t, path)
	big := pattern(2*ChunkSize + 12345) // three chunks, the last one short
	res := apply(t, s, []core.Record{put("run/run-1", `{}`)}, putOp("out", []byte("v1")), putOp("out", big), putOp("out.log", []byte("other")))
	if res[0].Data.Version != 1 || res[1].Data.Version != 2 || res[2].Data.Version != 1 {
		t.Fatalf("versions %d, %d, %d; want 1, 2 (same id, same transaction) and 1 (another id)", res[0].Data.Version, res[1].Data.Version, res[2].Data.Version)
	}
	sum := sha256.Sum256(big)
	if res[1].Data.SHA256 != hex.EncodeToString(sum[:]) || res[1].Data.Size != int64(len(big)) {
		t.Fatalf("meta %+v: wrong size or sha256", res[1].Data)
	}
	res = apply(t, s, nil, putOp("out", []byte("v3")))
	if res[0].Data.Version != 3 {
		t.Fatalf("third put got version %d", res[0].Data.Version)
	}

	// Reopen: everything is durable, and no version was rewritten.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, path)
	if got := load(t, s); len(got) != 1 || got[0].Key != "run/run-1" {
		t.Fatalf("records %s: data must not appear among the records", show(got))
	}
	for v, want := range map[uint64][]byte{1: []byte("v1"), 2: big, 3: []byte("v3")} {
		m, err := s.Data("out", v)
		if err != nil {
			t.Fatal(err)
		}
		if got := readAll(t, s.DataReader(m)); !bytes.Equal(got, want) {
			t.Fatalf("version %d: read %d bytes, want %d (equal: %v)", v, len(got), len(want), bytes.Equal(got, want))
		}
	}
	latest, err := s.Data("out", 0)
	if err != nil || latest.Version != 3 {
		t.Fatalf("latest = %+v, %v; want version 3", latest, err)
	}
	if m, err := s.Data("out.log", 0); err != nil || m.Version != 1 {
		t.Fatalf("out.log latest = %+v, %v: ids that share a prefix must not mix", m, err)
	}
	vs, err := s.Versions("out")
	if err != nil || len(vs) != 3 || vs[0].Version != 1 || vs[2].Version != 3 || vs[0].Worker != "w1" || vs[0].Lease != 7 {
		t.Fatalf("Versions = %+v, %v", vs, err)
	}
	for _, c := range []struct {
		id string
		v  uint64
	}{{"out", 4}, {"missing", 0}, {"missing", 1}, {"ou", 0}} {
		if _, err := s.Data(c.id, c.v); !errors.Is(err, ErrNotFound) {
			t.Errorf("Data(%q, %d) = %v, want ErrNotFound", c.id, c.v, err)
		}
	}
}

func TestAppendOrderAndOffsets(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "tether.db"))
	res := apply(t, s, nil, appendOp("log", "hello "), appendOp("log", "wor"), appendOp("lo", "x"))
	res = append(res, apply(t, s, nil, appendOp("log", "ld\n"))...)
	wantOff := []int64{0, 6, 0, 9}
	for i, r := range res {
		if r.Err != nil || r.Append.Offset != wantOff[i] {
			t.Fatalf("append %d: %+v, want offset %d", i, r, wantOff[i])
		}
	}
	m, err := s.Stream("log")
	if err != nil || m.Length != 12 || m.Appends != 3 {
		t.Fatalf("Stream = %+v, %v", m, err)
	}
	// From every offset, including ones inside an append.
	const all = "hello world\n"
	for off := int64(0); off <= m.Length; off++ {
		if got := string(readAll(t, s.StreamReader("log", off, m.Length))); got != all[off:] {
			t.Fatalf("from %d: %q, want %q", off, got, all[off:])
		}
	}
	// A reader stops at the length it was given, even if more is appended.
	r := s.StreamReader("log", 0, 5)
	apply(t, s, nil, appendOp("log", "more"))
	if got := string(readAll(t, r)); got != "hello" {
		t.Fatalf("bounded read: %q", got)
	}
	if _, err := s.Stream("nothing"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown stream: %v", err)
	}
}

func TestAppendOverLimitIsRefusedAlone(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "tether.db"))
	over := appendOp("log", "0123456789")
	over.MaxStream = 11
	ok := appendOp("log", "ab")
	ok.MaxStream = 11
	res := apply(t, s, []core.Record{put("k", "v")}, ok, over, putOp("other", []byte("x")), ok)
	if res[0].Err != nil || !errors.Is(res[1].Err, ErrStreamFull) || res[3].Err != nil {
		t.Fatalf("results %+v: want the second append refused, the others applied", res)
	}
	m, _ := s.Stream("log")
	if m.Length != 4 || m.Appends != 2 {
		t.Fatalf("stream %+v: the refused append wrote something", m)
	}
	if got := string(readAll(t, s.StreamReader("log", 0, m.Length))); got != "abab" {
		t.Fatalf("stream holds %q", got)
	}
	if _, err := s.Data("other", 1); err != nil {
		t.Fatalf("the put after a refused append was not applied: %v", err)
	}
	if got := load(t, s); len(got) != 1 {
		t.Fatalf("records %s: the batch's records were not applied", show(got))
	}
}

func TestBadOpsWriteNothing(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "tether.db"))
	for name, op := range map[string]DataOp{
		"bad id":       putOp("../x", []byte("x")),
		"empty append": appendOp("log", ""),
		"no kind":      {ID: "x"},
		"bad path":     {Kind: OpBundle, Body: []byte("x"), Files: map[string]FileSpan{"../etc/passwd": {}}},
	} {
		if _, err := s.ApplyWithData([]core.Record{put("k", "v")}, withBlobs(t, s, putOp("fine", []byte("x")), op)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := s.ApplyWithData([]core.Record{{Key: ""}}, withBlobs(t, s, putOp("fine", []byte("x")))); !errors.Is(err, ErrEmptyKey) {
		t.Errorf("a bad record: %v", err)
	}
	if got := load(t, s); len(got) != 0 {
		t.Fatalf("records %s written by a refused batch", show(got))
	}
	if _, err := s.Data("fine", 0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("data written by a refused batch: %v", err)
	}
}

func makeTar(t *testing.T, files map[string]string, order []string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	for _, name := range order {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(files[name]))}); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, files[name]); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestBundles(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "tether.db"))
	files := map[string]string{
		"./model.yaml":   "kind: model\n",
		"bin/run.sh":     "#!/bin/sh\necho hi\n",
		"data/large.bin": string(pattern(ChunkSize + 100)), // spans a chunk boundary of the bundle
		"empty":          "",
	}
	order := []string{"./model.yaml", "bin/run.sh", "data/large.bin", "empty"}
	tarball := makeTar(t, files, order)
	index, ok := TarIndex(tarball)
	if !ok || len(index) != 4 {
		t.Fatalf("TarIndex: %v, %d files; want 4 regular files", ok, len(index))
	}
	res := apply(t, s, nil, DataOp{Kind: OpBundle, Body: tarball, Files: index, At: at})
	m := res[0].Bundle
	sum := sha256.Sum256(tarball)
	if m.Fingerprint != hex.EncodeToString(sum[:]) || !m.Tar || m.Files != 4 || m.Existed {
		t.Fatalf("bundle meta %+v", m)
	}
	got, err := s.Bundle(m.Fingerprint)
	if err != nil || got.Size != int64(len(tarball)) {
		t.Fatalf("Bundle = %+v, %v", got, err)
	}
	if b := readAll(t, s.BundleReader(got, 0, got.Size)); !bytes.Equal(b, tarball) {
		t.Fatal("bundle bytes differ")
	}
	for _, name := range order {
		rel := name
		if rel == "./model.yaml" {
			rel = "model.yaml" // indexed cleaned
		}
		span, err := s.BundleFile(m.Fingerprint, rel)
		if err != nil {
			t.Fatalf("%s: %v", rel, err)
		}
		if b := string(readAll(t, s.BundleReader(got, span.Offset, span.Size))); b != files[name] {
			t.Fatalf("%s: read %d bytes, want %d", rel, len(b), len(files[name]))
		}
	}
	for _, rel := range []string{"bin", "missing", "bin/run"} {
		if _, err := s.BundleFile(m.Fingerprint, rel); !errors.Is(err, ErrNotFound) {
			t.Errorf("BundleFile(%q) = %v, want ErrNotFound", rel, err)
		}
	}

	// Content-addressed: the same bytes again are not stored twice.
	again := apply(t, s, nil, DataOp{Kind: OpBundle, Body: tarball, Files: index, At: at.Add(time.Hour)})
	if !again[0].Bundle.Existed || !again[0].Bundle.Created.Equal(at) {
		t.Fatalf("re-upload: %+v, want the existing bundle", again[0].Bundle)
	}

	// An opaque bundle has no files.
	opaque := apply(t, s, nil, DataOp{Kind: OpBundle, Body: []byte("not a tar"), At: at})[0].Bundle
	if opaque.Tar {
		t.Fatal("an opaque bundle claims to be a tar")
	}
	if _, err := s.Bundle(hex.EncodeToString(make([]byte, 32))); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown bundle: %v", err)
	}
}

func TestTarIndexRefusesWhatItCannotServe(t *testing.T) {
	for name, b := range map[string][]byte{
		"not a tar":   []byte("hello"),
		"empty":       nil,
		"only a dir":  makeTar(t, nil, nil),
		"climbs out":  makeTar(t, map[string]string{"../x": "x"}, []string{"../x"}),
		"absolute":    makeTar(t, map[string]string{"/etc/x": "x"}, []string{"/etc/x"}),
		"truncated":   makeTar(t, map[string]string{"a": "hello"}, []string{"a"})[:600],
		"gzip header": {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0},
	} {
		if files, ok := TarIndex(b); ok || files != nil {
			t.Errorf("%s: indexed %v (ok=%v); want no index at all", name, files, ok)
		}
	}
}

func TestValidate(t *testing.T) {
	for id, ok := range map[string]bool{
		"a": true, "out.log": true, "A-1_b.c": true, "0": true,
		"": false, ".": false, "..": false, ".hidden": false, "-x": false, "a/b": false, "a b": false,
		"a\x00": false, "é": false, string(make([]byte, 129)): false,
	} {
		if err := ValidateID(id); (err == nil) != ok || (err != nil && !errors.Is(err, ErrBadID)) {
			t.Errorf("ValidateID(%q) = %v", id, err)
		}
	}
	long := bytes.Repeat([]byte("a"), MaxIDLength)
	if err := ValidateID(string(long)); err != nil {
		t.Errorf("a %d-byte id: %v", MaxIDLength, err)
	}
	for p, ok := range map[string]bool{
		"a": true, "a/b.txt": true, "..a": true,
		"": false, "/a": false, "a/": false, "a//b": false, "./a": false, "..": false, "../a": false, "a/../b": false, "a\x00b": false,
	} {
		if err := ValidateRelPath(p); (err == nil) != ok {
			t.Errorf("ValidateRelPath(%q) = %v", p, err)
		}
	}
	good := hex.EncodeToString(make([]byte, 32))
	for fp, ok := range map[string]bool{good: true, good[1:]: false, "A" + good[1:]: false, good[1:] + "g": false} {
		if err := ValidateFingerprint(fp); (err == nil) != ok {
			t.Errorf("ValidateFingerprint(%q) = %v", fp, err)
		}
	}
}

func TestReadersAfterClose(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "tether.db"))
	m := apply(t, s, nil, putOp("x", []byte("abc")))[0].Data
	r := s.DataReader(m)
	s.Close()
	if _, err := io.ReadAll(r); !errors.Is(err, ErrClosed) {
		t.Fatalf("read after close: %v", err)
	}
	if !reflect.DeepEqual(m.Created, at) {
		t.Fatalf("created %v", m.Created)
	}
}
