package worker

import (
	"context"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tether-run/tether/core"
)

// newExecDriver is a driver whose loop the test plays, with shim as its
// Options.Shim ("": each step's shell leads its own group); it is stopped
// at the test's end unless the test stopped it (closed done).
func newExecDriver(t *testing.T, shim, dataURL string) *Driver {
	t.Helper()
	d, err := New(Options{URL: "ws://unused", DataURL: dataURL, Env: []string{"PATH=" + os.Getenv("PATH")}, Shim: shim, WorkDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	d.timer = time.NewTimer(time.Hour) // for shutdown
	t.Cleanup(func() {
		select {
		case <-d.done:
		default:
			for _, p := range d.procs {
				p.signal(killSignal)
			}
			close(d.done)
		}
		d.wg.Wait()
	})
	return d
}

// procState is the state letter of /proc/PID/stat ("" when there is none).
func procState(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// holdPipe opens, for writing, the output pipe of the step process pid (its
// stdout) from this process: a holder of the pipe outside the step's
// process group and tree, as a process the step handed it to would be.
func holdPipe(t *testing.T, pid int) {
	t.Helper()
	f, err := os.OpenFile("/proc/"+strconv.Itoa(pid)+"/fd/1", os.O_WRONLY, 0)
	if err != nil {
		t.Skipf("cannot hold a step's pipe through /proc: %v", err)
	}
	t.Cleanup(func() { f.Close() })
}

// A process outside the step's group that keeps its output pipe open does
// not hold the step's exit for ever (SPEC §10), whether the step ends by
// itself, by a cancel or with the worker: once the step's process has
// exited the driver reads for a moment, kills what is left of the group,
// and after another gives the pipe up and reports the exit. Until then the
// leader is left unreaped, so its pid — the group's id — cannot be reused
// while the driver may signal the group; once reaped it is signalled no
// more. (Planted: a reader blocked on the pipe counted as one held for
// acks, so the wait never ended; and the leader was reaped at once.)
func TestExecPipeHolderOutsideTheGroup(t *testing.T) {
	if _, err := os.Stat("/proc/self/fd/1"); err != nil {
		t.Skip("no /proc")
	}
	for _, shim := range []bool{false, true} {
		t.Run("shim="+strconv.FormatBool(shim), func(t *testing.T) {
			s := ""
			if shim {
				if s = testShim(t); s == "" {
					t.Skip("no shim here")
				}
			}
			ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
			defer cancel()
			d := newExecDriver(t, s, "")

			// A cancel: the shell dies of the SIGTERM, the holder lives on.
			d.exec(core.ExecCommand{Op: core.ExecStart, Lease: 1, Command: `echo $$; sleep 30`})
			out, ok := next(t, ctx, d).(output)
			if !ok {
				t.Fatal("want the shell's pid")
			}
			pid, _ := strconv.Atoi(out.lines[0])
			holdPipe(t, pid)
			p := d.procs[1]
			start := time.Now()
			d.exec(core.ExecCommand{Op: core.ExecTerm, Lease: 1})
			for alive(p.pgid) {
				time.Sleep(10 * time.Millisecond)
			}
			time.Sleep(300 * time.Millisecond)
			if st := procState(p.pgid); st != "Z" {
				t.Errorf("the exited leader %d is not kept unreaped while its pipe is read: state %q", p.pgid, st)
			}
			d.exec(core.ExecCommand{Op: core.ExecKill, Lease: 1}) // the kill after the grace: harmless
			var x exited
			for x.Lease == 0 { // read here: next would forget p
				select {
				case in := <-d.inputs:
					x, _ = in.(exited)
				case <-ctx.Done():
					t.Fatal("the step's exit was never reported while a process outside its group held its pipe")
				}
			}
			if took := time.Since(start); !x.Signaled || x.ExitCode != 128+int(syscall.SIGTERM) || took > 2*drainWait+time.Second {
				t.Fatalf("exit %+v after %v, want killed by SIGTERM within %v", x, took, 2*drainWait+time.Second)
			}
			// The leader is reaped: its pid may be anyone's now, and a
			// late cancel signals nobody.
			victim := exec.Command("sleep", "30")
			victim.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			if err := victim.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { victim.Process.Kill(); victim.Wait() }()
			p.pgid = victim.Process.Pid // as if the pid were reused
			d.exec(core.ExecCommand{Op: core.ExecKill, Lease: 1})
			time.Sleep(100 * time.Millisecond)
			if !alive(victim.Process.Pid) {
				t.Fatal("a cancel after the step was reaped signalled the group id it had")
			}
			delete(d.procs, 1)

			// A step that ends by itself, its background child in its group
			// holding the pipe: killed after the moment (SPEC §10: it survives
			// only when it no longer holds the pipe).
			start = time.Now()
			lines, x2 := runToExit(t, ctx, d, 2, `sleep 30 & echo "$!"`)
			if took := time.Since(start); x2.ExitCode != 0 || took > drainWait+time.Second {
				t.Fatalf("exit %+v after %v, want 0 within %v", x2, took, drainWait+time.Second)
			}
			child, _ := strconv.Atoi(lines[0])
			for deadline := time.Now().Add(5 * time.Second); alive(child); time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					syscall.Kill(child, syscall.SIGKILL)
					t.Fatalf("the background child %d holding the pipe survived its step", child)
				}
			}
		})
	}
}

// runToExit starts command as lease and returns its output lines and exit.
func runToExit(t *testing.T, ctx context.Context, d *Driver, lease core.LeaseID, command string) ([]string, exited) {
	t.Helper()
	d.exec(core.ExecCommand{Op: core.ExecStart, Lease: lease, Command: command})
	var lines []string
	for {
		switch in := next(t, ctx, d).(type) {
		case output:
			lines = append(lines, in.lines...)
		case exited:
			return lines, in
		}
	}
}

// The worker's shutdown kills its steps and returns at once, even when a
// process outside a step's group holds its pipe; a step it killed is not
// uploaded (SPEC §10 persistFile: a process the worker stopped is not),
// so the shutdown does not wait on uploads either. (Planted: the shutdown
// waited for the pipe for ever, and uploaded the killed step's files.)
func TestExecShutdownStopsWithoutUploads(t *testing.T) {
	if _, err := os.Stat("/proc/self/fd/1"); err != nil {
		t.Skip("no /proc")
	}
	var puts atomic.Int32
	url := h2cServer(t, func(w http.ResponseWriter, r *http.Request) {
		puts.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable) // retried: a shutdown that uploads waits
	})
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	d := newExecDriver(t, testShim(t), url)
	cred := "w.cred"
	d.cred.Store(&cred)
	d.exec(core.ExecCommand{Op: core.ExecStart, Lease: 3, Command: `echo half > "$TETHER_OUTPUT_DIR/part"; echo $$; sleep 30`})
	out, ok := next(t, ctx, d).(output)
	if !ok {
		t.Fatal("want the shell's pid")
	}
	pid, _ := strconv.Atoi(out.lines[0])
	holdPipe(t, pid)
	start := time.Now()
	stopped := make(chan struct{})
	go func() { d.shutdown(); close(stopped) }()
	select {
	case <-stopped:
	case <-ctx.Done():
		t.Fatalf("the shutdown did not return: it waits for the pipe a process outside the step's group holds, or on uploads (%d requests)", puts.Load())
	}
	if took := time.Since(start); took > drainWait {
		t.Errorf("the shutdown took %v", took)
	}
	if n := puts.Load(); n != 0 {
		t.Errorf("the output directory of a step the shutdown killed was uploaded (%d requests)", n)
	}
}

// A step's directories are removed when it ends even if the worker stops
// just then and its last output cannot reach the loop. (Planted: the step
// goroutine returned before removing them when that push lost the race.)
func TestExecStepDirsRemovedWhenThePushLoses(t *testing.T) {
	d := newExecDriver(t, testShim(t), "")
	d.exec(core.ExecCommand{Op: core.ExecStart, Lease: 4, Command: `sleep 0.5; touch "$TETHER_OUTPUT_DIR/not a data id"`})
	root := filepath.Join(d.workDir, "step-4")
	if _, err := os.Stat(root); err != nil {
		t.Fatal(err)
	}
	for len(d.inputs) < cap(d.inputs) { // nothing more fits: a push can only lose
		d.inputs <- nil
	}
	close(d.done) // the worker stops before the step's refusal line is pushed
	d.wg.Wait()
	if _, err := os.Stat(root); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the step's directory is left: %v", err)
	}
}
