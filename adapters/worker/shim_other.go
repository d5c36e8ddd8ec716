//go:build !linux

package worker

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// ShimSupported says whether steps can run under the shim here (Linux only).
// Elsewhere a step runs as `sh -c` in its own process group, as the worker
// always did: the group is signalled on cancel and SIGKILLed when the worker
// stops, but a worker killed with SIGKILL leaves its step processes running
// (no Pdeathsig), and background processes of a finished step survive unless
// they still hold its output pipe (§10).
const ShimSupported = false

func shimAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// ShimMain is the step shim on Linux; here it only refuses.
func ShimMain(args []string) int {
	fmt.Fprintln(os.Stderr, "tether step shim: not supported on this system")
	return 1
}

// awaitExit cannot wait for a process without reaping it here: the caller
// reaps it (and its group's id may then be reused while a background
// process still holds the step's pipe).
func awaitExit(pid int) error { return errors.ErrUnsupported }
