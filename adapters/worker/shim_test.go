package worker

import (
	"context"
	"io"
	"log/slog"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/tether-run/tether/core"
)

// TestMain runs the step shim when the test binary is re-executed as one
// (Options.Shim names this binary in the tests), and the tests otherwise.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == ShimArg {
		os.Exit(ShimMain(os.Args[2:]))
	}
	os.Exit(m.Run())
}

// testShim is the shim the exec tests run their steps under: this test
// binary, or none where the shim is not supported. TETHER_TEST_NO_SHIM=1
// runs them without it (as the worker did before the shim).
func testShim(t *testing.T) string {
	if !ShimSupported || os.Getenv("TETHER_TEST_NO_SHIM") == "1" {
		return ""
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return exe
}

// A step's background processes die when the step ends, even those that
// let go of its output (§10): the shim kills the rest of its group when the
// shell exits. The exit status is the shell's.
func TestExecLeftoversDieWithTheStep(t *testing.T) {
	if testShim(t) == "" {
		t.Skip("steps run without the shim here (it is Linux only, or TETHER_TEST_NO_SHIM=1): only the shim kills what let go of the output")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	d := execDriver(t)
	d.exec(core.ExecCommand{Op: core.ExecStart, Lease: 5, Command: `sleep 60 >/dev/null 2>&1 & echo "$!"; exit 4`})
	out, ok := next(t, ctx, d).(output)
	if !ok || len(out.lines) != 1 {
		t.Fatal("want the background child's pid")
	}
	child, err := strconv.Atoi(out.lines[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(child, syscall.SIGKILL) })
	x, ok := next(t, ctx, d).(exited)
	if !ok || x.ExitCode != 4 || x.Signaled {
		t.Fatalf("exit = %v, want code 4", x)
	}
	for alive(child) {
		select {
		case <-ctx.Done():
			t.Fatalf("background child %d of a finished step is still running", child)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// A shell that dies of a signal reads as killed by that signal through the
// shim, as without it.
func TestExecSignalStatusThroughTheShim(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	d := execDriver(t)
	d.exec(core.ExecCommand{Op: core.ExecStart, Lease: 6, Command: `kill -TERM $$`})
	x, ok := next(t, ctx, d).(exited)
	if !ok || !x.Signaled || x.ExitCode != 128+int(syscall.SIGTERM) {
		t.Fatalf("exit = %v, want signalled by SIGTERM", x)
	}
}

// The shim refuses bad use with a clear message and exit code 1.
func TestShimBadArguments(t *testing.T) {
	if !ShimSupported {
		t.Skip("the step shim is Linux only")
	}
	for _, args := range [][]string{nil, {"x", "true"}, {"1", "true"}, {"12", "true", "extra"}} {
		if code := ShimMain(args); code != 1 {
			t.Errorf("ShimMain(%q) = %d, want 1", args, code)
		}
	}
}

// BenchmarkExecTrue measures one step's start-to-exit (`true`) with and
// without the shim: the shim's cost is one more fork and exec of this binary.
func BenchmarkExecTrue(b *testing.B) {
	for _, c := range []struct {
		name string
		shim bool
	}{{"sh", false}, {"shim", true}} {
		b.Run(c.name, func(b *testing.B) {
			if c.shim && !ShimSupported {
				b.Skip("the step shim is Linux only")
			}
			opts := Options{URL: "ws://unused", Env: []string{"PATH=" + os.Getenv("PATH")}, WorkDir: b.TempDir(),
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
			if c.shim {
				exe, err := os.Executable()
				if err != nil {
					b.Fatal(err)
				}
				opts.Shim = exe
			}
			d, err := New(opts)
			if err != nil {
				b.Fatal(err)
			}
			defer func() { close(d.done); d.wg.Wait() }()
			for i := 0; i < b.N; i++ {
				d.exec(core.ExecCommand{Op: core.ExecStart, Lease: core.LeaseID(i + 1), Command: "true"})
				for {
					if x, ok := (<-d.inputs).(exited); ok {
						delete(d.procs, x.Lease)
						break
					}
				}
			}
		})
	}
}

// A shell killed by any signal ends the step as killed by that signal
// (SPEC §10: 128+N, "killed by signal"), through the shim as without it,
// with nothing in the step's output: not for the signals the Go runtime
// catches (a crash dump and exit 2) nor those it ignores (a plain exit
// 128+N). (Planted: the shim re-raised the signal through the runtime.)
func TestExecEverySignalStatusThroughTheShim(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	d := execDriver(t)
	for i, c := range []struct {
		name string
		sig  syscall.Signal
	}{
		{"TERM", syscall.SIGTERM}, {"ABRT", syscall.SIGABRT}, {"QUIT", syscall.SIGQUIT}, {"SEGV", syscall.SIGSEGV},
		{"BUS", syscall.SIGBUS}, {"ILL", syscall.SIGILL}, {"USR1", syscall.SIGUSR1}, {"PIPE", syscall.SIGPIPE},
		{"HUP", syscall.SIGHUP}, {"KILL", syscall.SIGKILL},
	} {
		name, sig := c.name, c.sig
		lines, x := runToExit(t, ctx, d, core.LeaseID(20+i), "kill -"+name+" $$")
		if !x.Signaled || x.ExitCode != 128+int(sig) || x.Err != "" || len(lines) != 0 {
			t.Errorf("kill -%s: exit %+v, %d lines %.100q; want killed by signal %d (%d), no output", name, x, len(lines), lines, sig, 128+int(sig))
		}
	}
}
