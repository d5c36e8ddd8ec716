package worker

import (
	"context"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-run/tether/core"
)

// A step starts with SIGHUP at its default even when its worker ignores it
// (an ignored signal stays ignored across exec): the shim catches SIGHUP
// rather than inheriting the worker's disposition. (Planted: steps could
// not be hung up.)
func TestShimStepHangupIsDefault(t *testing.T) {
	if testShim(t) == "" {
		t.Skip("steps run without the shim")
	}
	signal.Ignore(syscall.SIGHUP)                                                // as the worker once did
	t.Cleanup(func() { signal.Notify(make(chan os.Signal, 1), syscall.SIGHUP) }) // caught, dropped: steps inherit the default
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	d := execDriver(t)
	lines, x := runToExit(t, ctx, d, 1, `sed -n 's/^SigIgn:[[:space:]]*//p' /proc/self/status; sleep 3 & kill -HUP $!; wait $!; echo "$?"`)
	if len(lines) < 2 || x.ExitCode != 0 { // the shell may say "Hangup" between
		t.Fatalf("output %q, exit %+v", lines, x)
	}
	if ign, err := strconv.ParseUint(lines[0], 16, 64); err != nil || ign&(1<<(syscall.SIGHUP-1)) != 0 {
		t.Errorf("the step's ignored signals %s include SIGHUP", lines[0])
	}
	if last := lines[len(lines)-1]; last != strconv.Itoa(128+int(syscall.SIGHUP)) {
		t.Errorf("a background process sent SIGHUP ended with %s, want %d (killed)", last, 128+int(syscall.SIGHUP))
	}
}

// A worker that is PID 1 (in a container) or a subreaper adopts every
// orphan; the shim, the step's own subreaper, adopts the step's instead,
// reaps those that exit while it runs, and kills and reaps the rest when
// the shell exits: no zombie is left to the worker, and a background
// process that left the group (setsid) dies with its step too. (Planted:
// the killed orphans were the worker's zombies.)
func TestShimReapsTheStepsOrphans(t *testing.T) {
	if testShim(t) == "" {
		t.Skip("steps run without the shim")
	}
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("no setsid")
	}
	if _, _, e := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); e != 0 {
		t.Skipf("cannot be a subreaper: %v", e)
	}
	me := strconv.Itoa(os.Getpid())
	t.Cleanup(func() {
		syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 0, 0)
		for _, pid := range procsWhere(procPPID, me) { // whatever this test made ours
			if comm, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm"); strings.TrimSpace(string(comm)) == "sleep" {
				syscall.Kill(pid, syscall.SIGKILL)
				syscall.Wait4(pid, nil, 0, nil)
			}
		}
	})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	d := execDriver(t)
	var escaped []int
	for i := 1; i <= 3; i++ {
		lines, x := runToExit(t, ctx, d, core.LeaseID(i), `sleep 30 & sleep 60 & setsid sleep 70 >/dev/null 2>&1 & echo "$!"`)
		if x.ExitCode != 0 || len(lines) != 1 {
			t.Fatalf("output %q, exit %+v", lines, x)
		}
		pid, _ := strconv.Atoi(lines[0])
		escaped = append(escaped, pid)
	}
	time.Sleep(200 * time.Millisecond)
	for _, pid := range procsWhere(procPPID, me) {
		if comm, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm"); strings.TrimSpace(string(comm)) == "sleep" {
			t.Errorf("a step's background process %d is the worker's child, state %s", pid, procState(pid))
		}
	}
	for _, pid := range escaped {
		if alive(pid) {
			t.Errorf("the step's background process %d that left its group outlived the step", pid)
		}
	}

	// The orphans of a running step are reaped as they exit, not when it
	// ends: a loop of `(cmd &)` leaves no pile of zombies.
	d.exec(core.ExecCommand{Op: core.ExecStart, Lease: 9, Command: `for i in $(seq 200); do (true &); done; echo "$PPID"; sleep 30`})
	out, ok := next(t, ctx, d).(output)
	if !ok {
		t.Fatal("want the shim's pid")
	}
	time.Sleep(300 * time.Millisecond)
	zombies := 0
	for _, pid := range procsWhere(procPPID, out.lines[0]) {
		if procState(pid) == "Z" {
			zombies++
		}
	}
	if zombies > 10 {
		t.Errorf("the shim of a running step holds %d zombies", zombies)
	}
	d.exec(core.ExecCommand{Op: core.ExecKill, Lease: 9})
	if x, ok := next(t, ctx, d).(exited); !ok || x.ExitCode != 128+int(syscall.SIGKILL) {
		t.Fatalf("exit %+v, want killed", x)
	}
}
