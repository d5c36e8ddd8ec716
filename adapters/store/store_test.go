package store

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"github.com/tether-run/tether/core"
)

func open(t *testing.T, path string) *Store {
	t.Helper()
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func load(t *testing.T, s *Store) []core.Record {
	t.Helper()
	recs, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

func put(k, v string) core.Record { return core.Record{Key: k, Value: []byte(v)} }
func del(k string) core.Record    { return core.Record{Key: k, Delete: true} }

func TestApplyLoadRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tether.db")
	s := open(t, path)
	if got := load(t, s); len(got) != 0 {
		t.Fatalf("new store holds %d records", len(got))
	}
	// Unsorted on purpose: Load sorts by key.
	if err := s.Apply([]core.Record{put("step/run-1/b", `{"b":1}`), put("run/run-1", `{}`), put("step/run-1/a", `{"a":1}`)}); err != nil {
		t.Fatal(err)
	}
	// A later record of the same key wins; a delete removes.
	if err := s.Apply([]core.Record{put("step/run-1/a", `{"a":2}`), del("step/run-1/b"), put("step/run-1/b", `{"b":3}`), del("run/run-1"), del("missing")}); err != nil {
		t.Fatal(err)
	}
	want := []core.Record{put("step/run-1/a", `{"a":2}`), put("step/run-1/b", `{"b":3}`)}
	if got := load(t, s); !reflect.DeepEqual(got, want) {
		t.Fatalf("Load = %s, want %s", show(got), show(want))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Load after Close: err = %v, want ErrClosed", err)
	}
	if err := s.Apply(want); !errors.Is(err, ErrClosed) {
		t.Fatalf("Apply after Close: err = %v, want ErrClosed", err)
	}
	// Reopen: the same records, sorted.
	if got := load(t, open(t, path)); !reflect.DeepEqual(got, want) {
		t.Fatalf("after reopen Load = %s, want %s", show(got), show(want))
	}
}

func TestLoadSortsByKey(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "tether.db"))
	var batch []core.Record
	for i := 30; i > 0; i-- {
		batch = append(batch, put(fmt.Sprintf("lease/%020d", i*7919%101), "{}"))
	}
	batch = append(batch, put("meta", "{}"), put("event/run-1/00000002", "{}"), put("worker/w", "{}"))
	if err := s.Apply(batch); err != nil {
		t.Fatal(err)
	}
	got := load(t, s)
	for i := 1; i < len(got); i++ {
		if got[i-1].Key >= got[i].Key {
			t.Fatalf("Load not sorted: %q before %q", got[i-1].Key, got[i].Key)
		}
	}
	if len(got) != len(batch) {
		t.Fatalf("Load returned %d records, want %d", len(got), len(batch))
	}
}

// A batch with one invalid record applies nothing, before or after a reopen.
func TestApplyAllOrNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tether.db")
	s := open(t, path)
	if err := s.Apply([]core.Record{put("a", "1")}); err != nil {
		t.Fatal(err)
	}
	bad := [][]core.Record{
		{put("b", "2"), put("", "x"), put("c", "3")},
		{put("b", "2"), del("a"), {Key: "c"}},
		{put("b", "2"), put(strings.Repeat("k", 40000), "x")},
	}
	wantErr := []error{ErrEmptyKey, ErrNoValue, ErrKeyTooLarge}
	for i, batch := range bad {
		if err := s.Apply(batch); !errors.Is(err, wantErr[i]) {
			t.Fatalf("bad batch %d: err = %v, want %v", i, err, wantErr[i])
		}
	}
	want := []core.Record{put("a", "1")}
	if got := load(t, s); !reflect.DeepEqual(got, want) {
		t.Fatalf("after refused batches Load = %s, want %s", show(got), show(want))
	}
	s.Close()
	if got := load(t, open(t, path)); !reflect.DeepEqual(got, want) {
		t.Fatalf("after reopen Load = %s, want %s", show(got), show(want))
	}
}

// crashEnv tells the test binary, re-executed as a child, to apply a batch
// to the store at this path and then die by SIGKILL without closing it.
const crashEnv = "TETHER_STORE_CRASH_PATH"

func crashBatch() []core.Record {
	var recs []core.Record
	for i := range 200 {
		recs = append(recs, put(fmt.Sprintf("step/run-1/s%03d", i), fmt.Sprintf(`{"i":%d,"pad":%q}`, i, strings.Repeat("x", 500))))
	}
	return recs
}

// TestCrashAfterApply applies a batch in a child process that is killed
// (SIGKILL, no Close, no clean shutdown) as soon as Apply returns; reopening
// the file must show every record of the batch.
func TestCrashAfterApply(t *testing.T) {
	if path := os.Getenv(crashEnv); path != "" {
		s, err := Open(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		if err := s.Apply(crashBatch()); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
	path := filepath.Join(t.TempDir(), "tether.db")
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestCrashAfterApply$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashEnv+"="+path)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || !ee.Sys().(syscall.WaitStatus).Signaled() {
		t.Fatalf("child should die by SIGKILL after Apply: err = %v, stderr: %s", err, stderr.String())
	}
	got := load(t, open(t, path))
	if want := crashBatch(); !reflect.DeepEqual(got, want) {
		t.Fatalf("after crash Load returned %d records, want the %d of the batch", len(got), len(want))
	}
}

func show(recs []core.Record) string {
	var b strings.Builder
	for _, r := range recs {
		if r.Delete {
			fmt.Fprintf(&b, "[-%s]", r.Key)
		} else {
			fmt.Fprintf(&b, "[%s=%s]", r.Key, r.Value)
		}
	}
	return b.String()
}
