package worker

import (
	"context"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-run/tether/core"
)

func TestReadOutput(t *testing.T) {
	long := strings.Repeat("x", maxLine+10)
	in := "one\r\ntwo\n\n" + long + "\nafter\nno newline"
	var got []string
	g := newOutGate()
	readOutput(strings.NewReader(in), g, nil, func(s []string) bool { got = append(got, s...); g.taken(); return true })
	want := []string{"one", "two", "", long[:maxLine] + " [line truncated]", "after", "no newline"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("readOutput = %q…, want %q…", abbrev(got), abbrev(want))
	}
	got = nil
	g = newOutGate()
	readOutput(strings.NewReader("a\nb\nc\n"), g, nil, func(s []string) bool { got = append(got, s...); return false })
	if !reflect.DeepEqual(got, []string{"a", "b", "c"}) {
		t.Fatalf("readOutput did not stop when emit returned false: %q", got)
	}
}

// A line of exactly 16 KiB (SPEC §10), with either ending, is whole; one
// byte more is cut to 16 KiB and marked. (Planted: the reader's buffer was
// the limit, so a line of the limit and its newline did not fit: cut.)
func TestReadOutputLineOfTheLimit(t *testing.T) {
	limit, over := strings.Repeat("a", maxLine), strings.Repeat("b", maxLine+1)
	var got []string
	g := newOutGate()
	readOutput(strings.NewReader(limit+"\n"+limit+"\r\n"+over+"\n"+over+"\r\n"+limit), g, nil,
		func(s []string) bool { got = append(got, s...); g.taken(); return true })
	cut := over[:maxLine] + " [line truncated]"
	if want := []string{limit, limit, cut, cut, limit}; !reflect.DeepEqual(got, want) {
		t.Fatalf("readOutput = %q…, want %q…", abbrev(got), abbrev(want))
	}
}

// TestReadOutputBatchesAndWaits: lines already in the pipe come as one
// batch; the next batch waits until the loop took the first and the gate is
// not paused; a paused reader gives up when the worker stops.
func TestReadOutputBatchesAndWaits(t *testing.T) {
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	g := newOutGate()
	done := make(chan struct{})
	batches := make(chan []string, 10)
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		readOutput(pr, g, done, func(s []string) bool { batches <- s; return true })
	}()
	pw.WriteString("1\n2\n3\n")
	if b := <-batches; !reflect.DeepEqual(b, []string{"1", "2", "3"}) {
		t.Fatalf("first batch %q, want the three lines at once", b)
	}
	pw.WriteString("4\n")
	g.setPaused(true)
	g.taken()
	select {
	case b := <-batches:
		t.Fatalf("a paused reader read %q", b)
	case <-time.After(50 * time.Millisecond):
	}
	g.setPaused(false)
	if b := <-batches; !reflect.DeepEqual(b, []string{"4"}) {
		t.Fatalf("after resume %q, want [4]", b)
	}
	g.setPaused(true)
	g.taken()
	close(done)
	select {
	case <-finished:
	case <-time.After(5 * time.Second):
		t.Fatal("a paused reader did not stop with the worker")
	}
	pw.Close()
}

func abbrev(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		if len(s) > 20 {
			s = s[:10] + "…" + s[len(s)-20:]
		}
		out[i] = s
	}
	return out
}

func TestOverlay(t *testing.T) {
	got := overlay([]string{"PATH=/bin", "A=1", "B=2"}, map[string]string{"A": "x", "C": "3"}, nil, map[string]string{"C": "4", "D": "5"})
	want := []string{"A=x", "B=2", "C=4", "D=5", "PATH=/bin"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("overlay = %q, want %q", got, want)
	}
}

// execDriver is a driver whose loop the test plays: it starts processes and
// reads what they feed back.
func execDriver(t *testing.T) *Driver {
	t.Helper()
	d, err := New(Options{URL: "ws://unused", Env: []string{"PATH=" + os.Getenv("PATH"), "BASE=base"}, Shim: testShim(t), WorkDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, p := range d.procs {
			p.signal(killSignal)
		}
		close(d.done)
		d.wg.Wait()
	})
	return d
}

// next returns the next output or exit of the processes.
func next(t *testing.T, ctx context.Context, d *Driver) input {
	t.Helper()
	select {
	case in := <-d.inputs:
		if x, ok := in.(exited); ok {
			delete(d.procs, x.Lease)
		}
		if o, ok := in.(output); ok {
			if p := d.procs[o.lease]; p != nil {
				p.gate.taken() // as the loop does once it stepped the batch
			}
		}
		return in
	case <-ctx.Done():
		t.Fatal("no output or exit from the step process")
		return nil
	}
}

func TestExecOutputEnvAndExitCode(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	d := execDriver(t)
	d.exec(core.ExecCommand{Op: core.ExecStart, Lease: 7, Step: "run-1/s",
		Command: `echo "$BASE $SHIPPED"; echo err >&2; printf tail; exit 3`, Env: map[string]string{"SHIPPED": "shipped", "BASE": "over"}})
	var lines []string
	for {
		switch in := next(t, ctx, d).(type) {
		case output:
			if in.lease != 7 {
				t.Fatalf("output of lease %d", in.lease)
			}
			lines = append(lines, in.lines...)
			continue
		case exited:
			if in.ExitCode != 3 || in.Signaled || in.Err != "" {
				t.Fatalf("exit = %v, want code 3", core.WExecExited(in))
			}
		}
		break
	}
	if want := []string{"over shipped", "err", "tail"}; !reflect.DeepEqual(lines, want) {
		t.Fatalf("output lines %q, want %q (all output before the exit)", lines, want)
	}
}

// ExecTerm signals the whole process group: the shell and its background
// child both die, and the exit is reported as signalled.
func TestExecTermKillsTheGroup(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	d := execDriver(t)
	d.exec(core.ExecCommand{Op: core.ExecStart, Lease: 9, Command: `sleep 30 & echo "$!"; wait`})
	in := next(t, ctx, d)
	out, ok := in.(output)
	if !ok {
		t.Fatalf("want the child's pid, got %T", in)
	}
	child, err := strconv.Atoi(out.lines[0])
	if err != nil {
		t.Fatal(err)
	}
	d.exec(core.ExecCommand{Op: core.ExecTerm, Lease: 9})
	x, ok := next(t, ctx, d).(exited)
	if !ok || !x.Signaled || x.ExitCode != 128+int(syscall.SIGTERM) {
		t.Fatalf("exit = %v, want signalled by SIGTERM", x)
	}
	for alive(child) {
		select {
		case <-ctx.Done():
			t.Fatalf("background child %d survived SIGTERM to the group", child)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if os.IsNotExist(err) {
		return false
	} else if err != nil {
		return syscall.Kill(pid, 0) == nil
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(f) > 0 && !slices.Contains([]string{"Z", "X"}, f[0])
}

func TestExecKillAndUnknownLease(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	d := execDriver(t)
	d.exec(core.ExecCommand{Op: core.ExecKill, Lease: 99}) // nothing to kill: ignored
	d.exec(core.ExecCommand{Op: core.ExecStart, Lease: 4, Command: `trap '' TERM; echo ready; sleep 30`})
	if _, ok := next(t, ctx, d).(output); !ok {
		t.Fatal("want the ready line")
	}
	d.exec(core.ExecCommand{Op: core.ExecKill, Lease: 4})
	x, ok := next(t, ctx, d).(exited)
	if !ok || !x.Signaled || x.ExitCode != 128+int(syscall.SIGKILL) {
		t.Fatalf("exit = %v, want signalled by SIGKILL", x)
	}
}
