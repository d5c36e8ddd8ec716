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

func TestScanLines(t *testing.T) {
	long := strings.Repeat("x", maxLine+10)
	in := "one\r\ntwo\n\n" + long + "\nafter\nno newline"
	var got []string
	scanLines(strings.NewReader(in), func(s string) bool { got = append(got, s); return true })
	want := []string{"one", "two", "", long[:maxLine] + " [line truncated]", "after", "no newline"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("scanLines = %q…, want %q…", abbrev(got), abbrev(want))
	}
	got = nil
	scanLines(strings.NewReader("a\nb\nc\n"), func(s string) bool { got = append(got, s); return len(got) < 2 })
	if !reflect.DeepEqual(got, []string{"a", "b"}) {
		t.Fatalf("scanLines did not stop when emit returned false: %q", got)
	}
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
	d, err := New(Options{URL: "ws://unused", Env: []string{"PATH=" + os.Getenv("PATH"), "BASE=base"}, Shim: testShim(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for l, p := range d.procs {
			p.signal(d.log, l, killSignal)
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
			lines = append(lines, in.text)
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
	child, err := strconv.Atoi(out.text)
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
