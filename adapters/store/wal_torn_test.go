package store

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tether-run/tether/core"
)

// logTwo has the log write two batches as ONE write (what two Apply calls
// at once get from group commit), and returns where that write began.
func logTwo(t *testing.T, s *Store, a, b []core.Record) int64 {
	t.Helper()
	enc := func(recs []core.Record) []byte {
		ps := make([]prep, len(recs))
		for i, r := range recs {
			var err error
			if ps[i], err = prepare(r, s); err != nil {
				t.Fatal(err)
			}
		}
		return encodePayload(ps)
	}
	l := s.log
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, recs := range [][]core.Record{a, b} {
		l.next++
		l.queue = append(l.queue, walEntry{seq: l.next, buf: enc(recs)})
	}
	last := l.next
	pos := l.pos
	l.write()
	if l.err != nil || l.durable != last {
		t.Fatalf("write: %v (durable %d, want %d)", l.err, l.durable, last)
	}
	if l.pos < pos {
		return walHeaderSize
	}
	return pos
}

// The first write after the ring turned, of two entries (group commit),
// torn so that its first 4 KiB page kept the bytes of the turn before (the
// crash came before its fdatasync; the kernel had written back its second
// page, not its first). Nothing of it was acknowledged, so the store opens
// without it (SPEC §11: a torn last write is cut); the scan must not take
// the second entry for one written after a synced bad one.
func TestLogTornFirstWriteAfterTheRingTurned(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tether.db")
	s, err := OpenWith(path, Options{LogLimit: MinLogLimit})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := 1; i <= 3; i++ { // the turn begins with three small batches
		if err := s.Apply(walBatch(i)); err != nil {
			t.Fatal(err)
		}
	}
	for s.log.pos+150000 < MinLogLimit { // then large ones, to the end of the ring
		if err := s.Apply([]core.Record{put("step/run-1/large", `{"pad":"`+strings.Repeat("q", 140000)+`"}`)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.log.barrier(); err != nil { // all applied: the next write turns the ring
		t.Fatal(err)
	}
	before, err := os.ReadFile(path + ".wal")
	if err != nil {
		t.Fatal(err)
	}
	holdApplier(s, true)
	defer holdApplier(s, false)
	at := logTwo(t, s,
		[]core.Record{put("step/run-1/big", `{"pad":"`+strings.Repeat("z", 150000)+`"}`)},
		[]core.Record{put("step/run-1/small", `{"x":1}`)})
	if at != walHeaderSize {
		t.Fatalf("the write went to %d, not to the header: the ring did not turn", at)
	}
	whole := crashCopy(t, path)
	got, err := loadAt(whole)
	if err != nil {
		t.Fatalf("the write whole: %v", err)
	}
	if !hasKey(got, "step/run-1/small") || !hasKey(got, "step/run-1/big") {
		t.Fatalf("the write whole: its two batches not replayed (%d records)", len(got))
	}
	torn := crashCopy(t, path)
	lb, err := os.ReadFile(torn + ".wal")
	if err != nil {
		t.Fatal(err)
	}
	copy(lb[:4096], before[:4096])
	if err := os.WriteFile(torn+".wal", lb, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err = loadAt(torn)
	if err != nil {
		t.Fatalf("the write torn (never acknowledged): Open refuses the store: %v", err)
	}
	if hasKey(got, "step/run-1/small") || hasKey(got, "step/run-1/big") {
		t.Fatal("the write torn: a batch of it replayed")
	}
}

func hasKey(recs []core.Record, key string) bool {
	for _, r := range recs {
		if r.Key == key {
			return true
		}
	}
	return false
}

// An empty batch writes nothing but answers as any batch would (Backend):
// a broken log's error (a failed fdatasync: stop), and ErrClosed after
// Close, with the log and without.
func TestEmptyApplyAnswersAsAnyBatch(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(nil); err != nil {
		t.Fatalf("Apply(nil) on an open store: %v", err)
	}
	broken := errors.New("injected: fdatasync: EIO")
	s.log.mu.Lock()
	s.log.err = broken
	s.log.mu.Unlock()
	if err := s.Apply(nil); !errors.Is(err, broken) {
		t.Fatalf("Apply(nil) after the log broke = %v, want its error", err)
	}
	s.log.mu.Lock()
	s.log.err = nil
	s.log.mu.Unlock()
	s.Close()
	if err := s.Apply(nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Apply(nil) after Close = %v, want ErrClosed", err)
	}
	s, err = OpenWith(filepath.Join(t.TempDir(), "tether.db"), Options{NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := s.Apply(nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Apply(nil) after Close, no log = %v, want ErrClosed", err)
	}
}

// An attribute's value is printable as a name is (core.CheckName, SPEC
// §12): C1 controls and bidi overrides are refused with C0 and DEL; spaces
// and printable non-ASCII pass.
func TestAttributeValuesPrintable(t *testing.T) {
	for _, v := range []string{"a\x1bb", "a\x7fb", "a\u009bb", "a\u202eb", "\xff"} {
		if err := ValidateAttributes(map[string]string{"k": v}); err == nil {
			t.Errorf("attribute value %q accepted", v)
		}
	}
	for _, v := range []string{"", "a b", "résumé", "日本"} {
		if err := ValidateAttributes(map[string]string{"k": v}); err != nil {
			t.Errorf("attribute value %q refused: %v", v, err)
		}
	}
}
