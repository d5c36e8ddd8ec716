package worker

import (
	"os/exec"
	"runtime"
)

// ShimArg is the first argument that makes the worker binary (or a test
// binary, from its TestMain) run ShimMain instead of its usual self.
const ShimArg = "__tether-step-shim"

// startPinned starts cmd from a goroutine locked to its OS thread and keeps
// that goroutine, and so the thread, until the process is reaped: Pdeathsig
// is sent when the thread that forked the child exits, not the process, and
// the Go runtime may retire an idle thread at any time. The returned wait is
// cmd.Wait, run on that goroutine.
func startPinned(cmd *exec.Cmd) (wait func() error, err error) {
	started := make(chan error, 1)
	waited := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		waited <- cmd.Wait()
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return func() error { return <-waited }, nil
}
