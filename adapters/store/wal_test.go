package store

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/tether-run/tether/core"
)

// walBatch is the i-th batch of the log tests: it adds step i and moves
// "meta", so a state shows which prefix of the batches it holds.
func walBatch(i int) []core.Record {
	return []core.Record{
		put(fmt.Sprintf("step/run-1/s%05d", i), fmt.Sprintf(`{"i":%d,"pad":%q}`, i, strings.Repeat("x", i%300))),
		put("meta", fmt.Sprintf(`{"last":%d}`, i)),
	}
}

// walPrefix is the state after batches 1..n.
func walPrefix(n int) []core.Record {
	var want []core.Record
	if n > 0 {
		want = append(want, walBatch(n)[1])
	}
	for i := 1; i <= n; i++ {
		want = append(want, walBatch(i)[0])
	}
	return want
}

// holdApplier stops the applier of s: what Apply logs from now on stays out
// of the bbolt file, as if the process died before applying it.
func holdApplier(s *Store, hold bool) {
	s.log.mu.Lock()
	s.log.hold = hold
	s.log.cond.Broadcast()
	s.log.mu.Unlock()
}

// crashCopy copies the store file and its log to a new directory, as a
// crash would leave them (the applier held, no transaction under way).
func crashCopy(t *testing.T, path string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "tether.db")
	for _, sfx := range []string{"", ".wal"} {
		b, err := os.ReadFile(path + sfx)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst+sfx, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// loadAt opens a store at path, loads it and closes it.
func loadAt(path string) ([]core.Record, error) {
	s, err := Open(path)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	return s.Load()
}

// A crash after Apply returned but before the applier applied: Open replays
// the log. The last entry torn at every byte offset (a write the crash cut
// short, never acknowledged): Open cuts it, and returns exactly the state
// after the batches before it, never fewer.
func TestLogReplayTornTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tether.db")
	s := open(t, path)
	for i := 1; i <= 3; i++ { // applied: in the bbolt file
		if err := s.Apply(walBatch(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.log.barrier(); err != nil {
		t.Fatal(err)
	}
	holdApplier(s, true)
	defer holdApplier(s, false)
	const n = 7
	var start, end int64      // the last entry's bytes in the log
	for i := 4; i <= n; i++ { // logged only
		start = s.log.pos
		if err := s.Apply(walBatch(i)); err != nil {
			t.Fatal(err)
		}
		end = s.log.pos
	}
	dir := crashCopy(t, path)
	got, err := loadAt(dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := walPrefix(n); !reflect.DeepEqual(got, want) {
		t.Fatalf("after the crash: %s\nwant %s", show(got), show(want))
	}
	for cut := start; cut < end; cut++ {
		p := crashCopy(t, path)
		lb, _ := os.ReadFile(p + ".wal")
		clear(lb[cut:end]) // the write reached the disk up to cut
		os.WriteFile(p+".wal", lb, 0o600)
		got, err := loadAt(p)
		if err != nil {
			t.Fatalf("torn at byte %d of the last entry: %v", cut-start, err)
		}
		if want := walPrefix(n - 1); !reflect.DeepEqual(got, want) {
			t.Fatalf("torn at byte %d of the last entry: %d records, want the %d of batches 1-%d", cut-start, len(got), len(want), n-1)
		}
	}
}

// An entry that went bad with good ones after it is an error at Open, not
// a silent loss; and the tools that read the file alone refuse it too.
func TestLogCorruptMiddleEntry(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tether.db")
	s := open(t, path)
	holdApplier(s, true)
	defer holdApplier(s, false)
	var mid int64
	for i := 1; i <= 5; i++ {
		if i == 3 {
			mid = s.log.pos
		}
		if err := s.Apply(walBatch(i)); err != nil {
			t.Fatal(err)
		}
	}
	for _, at := range []int64{0, 4, 9, 17, walEntryHead + 3} { // length, CRC, number, group, payload
		p := crashCopy(t, path)
		lb, _ := os.ReadFile(p + ".wal")
		lb[mid+at] ^= 0x40
		os.WriteFile(p+".wal", lb, 0o600)
		if _, err := loadAt(p); !errors.Is(err, ErrLog) {
			t.Fatalf("entry 3 of 5 bad at its byte %d: Open err = %v, want ErrLog", at, err)
		}
		if _, err := Check(p); !errors.Is(err, ErrLog) {
			t.Fatalf("entry 3 of 5 bad at its byte %d: Check err = %v, want ErrLog", at, err)
		}
	}
}

// mkEntry encodes an entry as the writer does.
func mkEntry(seq, group uint64, payload string) []byte {
	b := make([]byte, walEntryHead, walEntryHead+len(payload))
	b = append(b, payload...)
	binary.LittleEndian.PutUint32(b[0:4], uint32(len(payload)))
	binary.LittleEndian.PutUint64(b[8:16], seq)
	binary.LittleEndian.PutUint64(b[16:24], group)
	binary.LittleEndian.PutUint32(b[4:8], entryCRC(b[:walEntryHead], b[walEntryHead:]))
	return b
}

// The rules of where the log ends, on files made by hand.
func TestScanLog(t *testing.T) {
	e := func(seq, group uint64) []byte { return mkEntry(seq, group, fmt.Sprintf("payload of %d", seq)) }
	bad := func(b []byte) []byte { b = append([]byte(nil), b...); b[len(b)-1] ^= 1; return b }
	file := func(parts ...[]byte) []byte {
		b := make([]byte, walHeaderSize)
		for _, p := range parts {
			b = append(b, p...)
		}
		return append(b, make([]byte, 100)...)
	}
	for _, c := range []struct {
		name    string
		buf     []byte
		applied uint64
		want    []uint64 // the entries returned
		err     bool
	}{
		{"a chain", file(e(1, 1), e(2, 2), e(3, 2)), 0, []uint64{1, 2, 3}, false},
		{"applied ones skipped", file(e(1, 1), e(2, 2), e(3, 3)), 2, []uint64{3}, false},
		{"torn last write", file(e(1, 1), e(2, 2), bad(e(3, 3))), 0, []uint64{1, 2}, false},
		{"torn write, a later entry of it whole", file(e(1, 1), bad(e(2, 2)), e(3, 2), e(4, 2)), 0, []uint64{1}, false},
		{"torn write begun before the bad entry", file(e(1, 1), e(2, 2), bad(e(3, 2)), e(4, 2)), 0, []uint64{1, 2}, false},
		{"bad entry, a later write after it", file(e(1, 1), bad(e(2, 2)), e(3, 3)), 0, nil, true},
		{"bad entry, a later write of a group begun after it", file(e(1, 1), bad(e(2, 2)), e(3, 3), e(4, 3)), 0, nil, true},
		{"bad applied entry hiding a needed one", file(e(1, 1), bad(e(2, 2)), e(3, 3), e(4, 4)), 3, nil, true},
		{"bad applied entry, nothing needed after", file(e(1, 1), bad(e(2, 2)), e(3, 3)), 3, nil, false},
		{"an earlier turn of the ring after the chain", file(e(9, 9), e(10, 10), e(5, 5), e(6, 6)), 8, []uint64{9, 10}, false},
		{"first entry after a turn torn, its write's next whole", file(bad(e(9, 9)), e(10, 9), e(6, 6)), 8, nil, false},
		{"first entry bad, a later write whole", file(bad(e(9, 9)), e(10, 10)), 8, nil, true},
		{"first entry bad, itself whole later", file(bad(e(9, 9)), e(9, 9)), 8, nil, true},
		{"entries missing", file(e(5, 5), e(6, 6)), 3, nil, true},
		{"empty", file(), 4, nil, false},
	} {
		got, last, err := scanLog(c.buf, c.applied)
		if (err != nil) != c.err {
			t.Errorf("%s: err = %v, want an error: %v", c.name, err, c.err)
			continue
		}
		var seqs []uint64
		for i := range got {
			seqs = append(seqs, c.applied+1+uint64(i))
			if want := fmt.Sprintf("payload of %d", c.applied+1+uint64(i)); string(got[i]) != want {
				t.Errorf("%s: entry %d holds %q", c.name, i, got[i])
			}
		}
		if !c.err && (!reflect.DeepEqual(seqs, c.want) || last != c.applied+uint64(len(c.want))) {
			t.Errorf("%s: entries %v (last %d), want %v", c.name, seqs, last, c.want)
		}
	}
}

// The log stays within its limit however much is applied, starting again
// after the header once all of it is applied; every batch is kept, through
// reopens.
func TestLogStaysBounded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tether.db")
	const limit = 1 << 20
	s, err := OpenWith(path, Options{LogLimit: limit})
	if err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("y", 20000)
	n := 0
	for round := range 3 {
		for range 150 { // about 3 MB a round
			n++
			b := walBatch(n)
			b[0].Value = fmt.Appendf(nil, `{"i":%d,"pad":%q}`, n, big)
			if err := s.Apply(b); err != nil {
				t.Fatal(err)
			}
		}
		if fi, err := os.Stat(path + ".wal"); err != nil || fi.Size() > limit {
			t.Fatalf("round %d: the log is %d bytes, over its limit of %d (%v)", round, fi.Size(), limit, err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if s, err = OpenWith(path, Options{LogLimit: limit}); err != nil {
			t.Fatal(err)
		}
		if got := load(t, s); len(got) != n+1 {
			t.Fatalf("round %d: %d records, want %d", round, len(got), n+1)
		}
	}
	s.Close()
}

// A write that would pass the limit while entries are not applied waits
// for the applier rather than overwrite them: a crash then loses nothing
// acknowledged.
func TestLogBackpressure(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tether.db")
	s, err := OpenWith(path, Options{LogLimit: walChunk})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	holdApplier(s, true)
	defer holdApplier(s, false) // before Close
	n := 0
	for s.log.pos < walChunk*3/4 {
		n++
		b := walBatch(n)
		b[0].Value = fmt.Appendf(nil, `{"pad":%q}`, strings.Repeat("f", 16<<10))
		if err := s.Apply(b); err != nil {
			t.Fatal(err)
		}
	}
	big := walBatch(n + 1)
	big[0].Value = fmt.Appendf(nil, `{"pad":%q}`, strings.Repeat("z", walChunk/2))
	done := make(chan error, 1)
	go func() { done <- s.Apply(big) }()
	for returned := false; !returned; { // until it waits, or returned without
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			returned = true
		default:
			s.log.mu.Lock()
			returned = s.log.waited > 0
			s.log.mu.Unlock()
			runtime.Gosched()
		}
	}
	got, err := loadAt(crashCopy(t, path)) // a crash now
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != n+1 || got[n].Key != fmt.Sprintf("step/run-1/s%05d", n) {
		t.Fatalf("a crash with the log full: %d records, want the %d acknowledged", len(got), n+1)
	}
	holdApplier(s, false)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := load(t, s); len(got) != n+2 {
		t.Fatalf("after the wait: %d records, want %d", len(got), n+2)
	}
}

// Apply calls that arrive while a write is under way share the next write
// and its one fdatasync (group commit), and a crash then keeps them all.
func TestLogGroupCommit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tether.db")
	s := open(t, path)
	if err := s.Apply(walBatch(1)); err != nil {
		t.Fatal(err)
	}
	s.log.mu.Lock()
	s.log.writing = true // as if a write were under way
	s.log.mu.Unlock()
	const n = 6
	errs := make(chan error, n)
	for i := 2; i < 2+n; i++ {
		go func() { errs <- s.Apply(walBatch(i)) }()
	}
	for queued := 0; queued < n; runtime.Gosched() {
		s.log.mu.Lock()
		queued = len(s.log.queue)
		s.log.mu.Unlock()
	}
	holdApplier(s, true)
	defer holdApplier(s, false)
	s.log.mu.Lock()
	before := s.log.writes
	s.log.writing = false // that write is done
	s.log.cond.Broadcast()
	s.log.mu.Unlock()
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	s.log.mu.Lock()
	w := s.log.writes - before
	s.log.mu.Unlock()
	if w != 1 {
		t.Fatalf("%d Apply calls waiting made %d writes, want one", n, w)
	}
	// Their order among themselves is the goroutines'; all of them are there.
	got, err := loadAt(crashCopy(t, path))
	if err != nil || len(got) != n+2 {
		t.Fatalf("after a crash: %d records (%v), want %d", len(got), err, n+2)
	}
}

// The same store opens with and without the log, either way round, and
// a store whose log is gone opens only if nothing in it was unapplied.
func TestLogSwitch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tether.db")
	s := open(t, path)
	holdApplier(s, true)
	for i := 1; i <= 3; i++ {
		if err := s.Apply(walBatch(i)); err != nil {
			t.Fatal(err)
		}
	}
	p := crashCopy(t, path)
	holdApplier(s, false)
	s.Close()
	// The tools that read the file alone replay the log first: a backup
	// of it holds the batches.
	var tarball bytes.Buffer
	if err := BackupFile(crashCopy(t, p), &tarball); err != nil {
		t.Fatal(err)
	}
	up := filepath.Join(t.TempDir(), "up.db")
	if err := Unpack(&tarball, up); err != nil {
		t.Fatal(err)
	}
	if got, err := loadAt(up); err != nil || !reflect.DeepEqual(got, walPrefix(3)) {
		t.Fatalf("a backup of a store a crash left with its log: %s %v", show(got), err)
	}
	// A crash left batches in the log only: without it, no Open.
	os.Rename(p+".wal", p+".wal.away")
	if _, err := loadAt(p); !errors.Is(err, ErrLog) {
		t.Fatalf("the log gone after a crash: err = %v, want ErrLog", err)
	}
	os.Rename(p+".wal.away", p+".wal")
	// Without the log: the batches replayed, then as before.
	ns, err := OpenWith(p, Options{NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := load(t, ns); !reflect.DeepEqual(got, walPrefix(3)) {
		t.Fatalf("opened without the log: %s", show(got))
	}
	if err := ns.Apply(walBatch(4)); err != nil {
		t.Fatal(err)
	}
	ns.Close()
	// Clean: the log may go, and comes back.
	os.Remove(p + ".wal")
	got, err := loadAt(p)
	if err != nil || !reflect.DeepEqual(got, walPrefix(4)) {
		t.Fatalf("reopened with a new log: %s %v", show(got), err)
	}
}

// killEnv tells the test binary, re-executed as a child, to apply batches
// to the store at this path in a loop, printing each batch's number once
// Apply returned, until it is killed.
const killEnv = "TETHER_STORE_KILL_PATH"

// A child applying batches is killed by SIGKILL at a random moment, again
// and again on the same store: each reopen holds exactly the batches
// 1..m for some m, and m is at least the last one acknowledged.
func TestLogKilledMidAppend(t *testing.T) {
	if path := os.Getenv(killEnv); path != "" {
		s, err := Open(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		recs, err := s.Load()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		i := len(recs) // batches 1..i are there (the parent checked)
		if i > 0 {
			i--
		}
		w := bufio.NewWriter(os.Stdout)
		for {
			i++
			if err := s.Apply(walBatch(i)); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(2)
			}
			fmt.Fprintln(w, i)
			w.Flush()
		}
	}
	path := filepath.Join(t.TempDir(), "tether.db")
	acked := 0
	for round := range 8 {
		cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestLogKilledMidAppend$", "-test.count=1")
		cmd.Env = append(os.Environ(), killEnv+"="+path)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(out)
		for k := 5 + rand.IntN(200); k > 0 && sc.Scan(); k-- { // some batches acknowledged
			acked, _ = strconv.Atoi(sc.Text())
		}
		cmd.Process.Signal(syscall.SIGKILL)
		for sc.Scan() { // acknowledged before it died
			acked, _ = strconv.Atoi(sc.Text())
		}
		cmd.Wait()
		if acked == 0 {
			t.Fatalf("round %d: the child acknowledged nothing: %s", round, stderr.String())
		}
		got, err := loadAt(path)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		m := len(got) - 1
		if m < acked || !reflect.DeepEqual(got, walPrefix(m)) {
			t.Fatalf("round %d: %d acknowledged, the store holds %d records (not batches 1..m for any m ≥ %d)", round, acked, len(got), acked)
		}
	}
}

// An older clean copy of a store file put back beside a newer log of the
// same store (a restore from a copy, say): the log's entries are not this
// file's. A batch of the same length as the log's next entry, then a crash:
// Open must replay that batch alone, never the newer log's entries after it.
func TestLogOlderFileBesideNewerLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tether.db")
	s := open(t, path)
	for i := 1; i <= 3; i++ {
		if err := s.Apply(walBatch(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	older, err := os.ReadFile(path) // clean, at batch 3
	if err != nil {
		t.Fatal(err)
	}
	s = open(t, path)
	holdApplier(s, true)
	for i := 4; i <= 6; i++ { // logged only
		if err := s.Apply(walBatch(i)); err != nil {
			t.Fatal(err)
		}
	}
	newer := crashCopy(t, path)
	holdApplier(s, false)
	s.Close()
	if err := os.WriteFile(newer, older, 0o600); err != nil { // the older file beside the newer log
		t.Fatal(err)
	}
	s = open(t, newer)
	holdApplier(s, true)
	other := walBatch(4) // batch 4's length, other bytes
	other[0].Value = bytes.ReplaceAll(other[0].Value, []byte("x"), []byte("w"))
	other[1].Value = []byte(`{"last":9}`)
	if err := s.Apply(other); err != nil {
		t.Fatal(err)
	}
	crashed := crashCopy(t, newer)
	holdApplier(s, false)
	s.Close()
	got, err := loadAt(crashed)
	if err != nil {
		t.Fatal(err)
	}
	want := append(walPrefix(3)[1:], other[0])
	want = append([]core.Record{other[1]}, want...)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("after the crash: %s\nwant %s", show(got), show(want))
	}
}

// A log limit under one chunk is one chunk: the ring always has room for
// a chunk's writes before it waits.
func TestLogLimitFloor(t *testing.T) {
	for _, limit := range []int64{1, walChunk - 1} {
		s, err := OpenWith(filepath.Join(t.TempDir(), "tether.db"), Options{LogLimit: limit})
		if err != nil {
			t.Fatal(err)
		}
		if s.log.limit != MinLogLimit {
			t.Errorf("LogLimit %d: the limit is %d, want %d", limit, s.log.limit, MinLogLimit)
		}
		if err := s.Apply(walBatch(1)); err != nil {
			t.Fatal(err)
		}
		s.Close()
	}
}

// The applier and the replay at Open put only the last record of each key
// of the entries they apply together (applyPayloads): whatever came before
// it in those entries — a put, a delete, several — the file ends as if
// every record had been put in order. Both ways: replayed after a crash,
// and applied by the applier.
func TestLogLastRecordOfAKeyWins(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tether.db")
	s := open(t, path)
	// In the file before: c and d.
	if err := s.Apply([]core.Record{put("step/c", "c0"), put("step/d", "d0")}); err != nil {
		t.Fatal(err)
	}
	if err := s.log.barrier(); err != nil {
		t.Fatal(err)
	}
	holdApplier(s, true)
	defer holdApplier(s, false)
	for _, batch := range [][]core.Record{
		{put("lease/x", "x1"), put("step/a", "a1"), put("step/b", "b1")},
		{put("step/a", "a2"), del("step/b"), del("step/c"), put("step/d", "d2")},
		{put("lease/x", "x3"), put("step/b", "b3"), put("step/c", "c3"), del("step/d")},
		{put("lease/x", "x4"), put("step/a", "a4")},
	} {
		if err := s.Apply(batch); err != nil {
			t.Fatal(err)
		}
	}
	want := []core.Record{put("lease/x", "x4"), put("step/a", "a4"), put("step/b", "b3"), put("step/c", "c3")}
	got, err := loadAt(crashCopy(t, path))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("replayed after a crash: %s\nwant %s", show(got), show(want))
	}
	holdApplier(s, false)
	if got = load(t, s); !reflect.DeepEqual(got, want) {
		t.Errorf("applied: %s\nwant %s", show(got), show(want))
	}
	s.Close()
	if got, err = loadAt(path); err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("reopened: %s (%v)\nwant %s", show(got), err, show(want))
	}
}

// TestLogTempLeftoverRemoved: a log file being made when a process died
// (newLogFile's temporary, 1 MiB each) is removed by the next open that
// takes the store, so a store killed while starting again and again does
// not pile them up; other files beside the store are left alone.
func TestLogTempLeftoverRemoved(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tether.db")
	s := open(t, path)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	left := filepath.Join(dir, "tether.db.wal.tmp-123456")
	other := filepath.Join(dir, "tether.db.walnut")
	for _, f := range []string{left, other} {
		if err := os.WriteFile(f, make([]byte, 1<<10), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s = open(t, path)
	defer s.Close()
	if _, err := os.Stat(left); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the leftover log temporary: %v, want it removed", err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("another file beside the store: %v, want it kept", err)
	}
}
