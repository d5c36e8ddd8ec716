package worker

import (
	"os/exec"
	"runtime"
)

// ShimArg is the first argument that makes the worker binary (or a test
// binary, from its TestMain) run ShimMain instead of its usual self.
const ShimArg = "__tether-step-shim"

// startPinned starts cmd from a goroutine locked to its OS thread and keeps
// that goroutine, and so the thread, until the process has exited: Pdeathsig
// is sent when the thread that forked the child exits, not the process, and
// the Go runtime may retire an idle thread at any time. The returned wait
// is awaitLeader's, run on that goroutine.
func startPinned(cmd *exec.Cmd) (wait func() (zombie bool, err error), err error) {
	started := make(chan error, 1)
	type result struct {
		zombie bool
		err    error
	}
	waited := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		zombie, err := awaitLeader(cmd)
		waited <- result{zombie, err}
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return func() (bool, error) { r := <-waited; return r.zombie, r.err }, nil
}

// awaitLeader returns once cmd's process has exited. Where it can (awaitExit)
// it leaves the process unreaped, a zombie that keeps its pid, and so its
// group's id, from reuse: zombie is true and the caller reaps it with
// cmd.Wait. Elsewhere it reaps it: cmd.Wait's error.
func awaitLeader(cmd *exec.Cmd) (zombie bool, err error) {
	if awaitExit(cmd.Process.Pid) == nil {
		return true, nil
	}
	return false, cmd.Wait()
}
