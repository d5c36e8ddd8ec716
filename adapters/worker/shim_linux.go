package worker

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

// ShimSupported says whether steps can run under the shim here (Linux only).
const ShimSupported = true

// Shim limits.
const (
	shimDeathSignal   = syscall.SIGUSR2 // Pdeathsig of the shim: its worker is gone
	shimParentPoll    = 500 * time.Millisecond
	shimReapPasses    = 5                      // /proc sweeps for leftovers when the group cannot be left
	shimRaiseWaitTime = 200 * time.Millisecond // how long a re-raised signal may take to end the shim
	shimOrphanWait    = time.Second            // how long the shim waits for the orphans it killed
)

// Linux's, which package syscall lacks.
const (
	prSetChildSubreaper = 36 // prctl(2) PR_SET_CHILD_SUBREAPER
	sigSetBytes         = 8  // the kernel's sigset_t (64 signals)
	sigUnblock          = 1  // rt_sigprocmask(2) SIG_UNBLOCK
	pAll                = 0  // waitid(2) P_ALL
	pPID                = 1  // waitid(2) P_PID
	siginfoBytes        = 128
	// Where siginfo_t holds si_pid: after three ints, aligned for a pointer.
	siPidOffset = 12 + 4*(unsafe.Sizeof(uintptr(0))/8)
)

// shimAttr makes the shim the leader of a new process group that dies with
// the worker: Pdeathsig is delivered when the thread that forked the shim
// exits (startPinned keeps that thread for the shim's lifetime).
func shimAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: shimDeathSignal}
}

// ShimMain is the step shim (§10), run by the worker binary re-executed with
// ShimArg: args are the worker's pid and the step's command. The shim leads
// the step's process group and runs `sh -c COMMAND` in it with its own
// stdout, stderr and environment. It is the step's child subreaper: an
// orphan of the step (a background process whose parent exited) becomes
// its child, not the worker's, which would leave it a zombie were the
// worker PID 1 or a subreaper itself; the shim reaps each as it exits. It
//   - on SIGTERM (the worker's cancel), sends SIGTERM once to the whole group
//     and keeps waiting for the shell;
//   - when the worker goes (Pdeathsig, or its parent pid changes: the second
//     line, as Pdeathsig follows the forking thread), SIGKILLs the group;
//   - catches SIGHUP and ignores it (caught, not ignored, so the shell
//     starts with SIGHUP at its default whatever the worker's is);
//   - when the shell exits, SIGKILLs what is left of the group and the
//     orphans it adopted (background processes die with their step), reaps
//     them, and exits with the shell's status: a shell killed by signal N
//     ends the shim by signal N, so the worker reads 128+N "killed by
//     signal" as without a shim.
//
// It returns the exit code for a shell that exited, or 1 on bad use.
func ShimMain(args []string) int {
	if len(args) != 2 {
		fmt.Fprintf(os.Stderr, "tether step shim: want WORKER-PID COMMAND, got %d arguments\n", len(args))
		return 1
	}
	ppid, err := strconv.Atoi(args[0])
	if err != nil || ppid <= 1 {
		fmt.Fprintf(os.Stderr, "tether step shim: bad worker pid %q\n", args[0])
		return 1
	}
	pgid := os.Getpid()
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, shimDeathSignal, syscall.SIGHUP, syscall.SIGCHLD)
	// Best effort: without it (before Linux 3.4) orphans go to the worker.
	syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
	if os.Getppid() != ppid {
		// The worker died before Pdeathsig was armed.
		syscall.Kill(-pgid, syscall.SIGKILL)
		return 1
	}
	sh := exec.Command("sh", "-c", args[1])
	sh.Stdout, sh.Stderr = os.Stdout, os.Stderr // inherited descriptors: no copying
	if err := sh.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "tether step shim: start sh: %v\n", err)
		return 127
	}
	done := make(chan struct{})
	go func() { sh.Wait(); close(done) }()
	poll := time.NewTicker(shimParentPoll)
	defer poll.Stop()
	termed := false
	for {
		select {
		case sig := <-sigs:
			if sig == shimDeathSignal {
				syscall.Kill(-pgid, syscall.SIGKILL)
				return 1
			}
			if sig == syscall.SIGCHLD {
				reapAdopted(sh.Process.Pid)
				continue
			}
			if sig == syscall.SIGHUP {
				continue
			}
			if !termed {
				// Once: the shim gets its own SIGTERM back and ignores it.
				termed = true
				syscall.Kill(-pgid, syscall.SIGTERM)
			}
		case <-poll.C:
			if os.Getppid() != ppid {
				syscall.Kill(-pgid, syscall.SIGKILL)
				return 1
			}
		case <-done:
			reapGroup(pgid, ppid)
			reapOrphans()
			st, _ := sh.ProcessState.Sys().(syscall.WaitStatus)
			if st.Signaled() {
				raise(st.Signal())
				return 128 + int(st.Signal())
			}
			return st.ExitStatus()
		}
	}
}

// reapGroup SIGKILLs every other member of the shim's group. The shim moves
// itself into its worker's group first, so one kill of the old group reaches
// all the rest (the group id stays in use while they live); when it cannot,
// it sweeps /proc for the group's members a few times.
func reapGroup(pgid, ppid int) {
	if wpg, err := syscall.Getpgid(ppid); err == nil && syscall.Setpgid(0, wpg) == nil {
		syscall.Kill(-pgid, syscall.SIGKILL)
		return
	}
	self := os.Getpid()
	for range shimReapPasses {
		found := false
		for _, pid := range groupMembers(pgid) {
			if pid != self {
				syscall.Kill(pid, syscall.SIGKILL)
				found = true
			}
		}
		if !found {
			return
		}
	}
}

// reapAdopted reaps the orphans the shim adopted that have exited, so that
// those of a running step (`(cmd &)` in a loop) do not pile up as zombies;
// never the shell (pid sh), which its Wait reaps: it stops at the shell.
func reapAdopted(sh int) {
	for {
		var info [siginfoBytes]byte
		_, _, e := syscall.Syscall6(syscall.SYS_WAITID, pAll, 0, uintptr(unsafe.Pointer(&info)), syscall.WEXITED|syscall.WNOHANG|syscall.WNOWAIT, 0, 0)
		pid := int(*(*int32)(unsafe.Pointer(&info[siPidOffset])))
		if e != 0 || pid == 0 || pid == sh {
			return
		}
		var st syscall.WaitStatus
		syscall.Wait4(pid, &st, syscall.WNOHANG, nil)
	}
}

// reapOrphans SIGKILLs the shim's children, every one an orphan of the step
// it adopted as their subreaper (the shell is reaped), and reaps them, until
// it has none (a killed one's own children are adopted in turn), for at
// most shimOrphanWait (a process stuck in the kernel dies late).
func reapOrphans() {
	self := strconv.Itoa(os.Getpid())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			for { // reap every dead child
				var st syscall.WaitStatus
				pid, err := syscall.Wait4(-1, &st, syscall.WNOHANG, nil)
				if err == syscall.ECHILD {
					return
				}
				if err != syscall.EINTR && (err != nil || pid == 0) {
					break
				}
			}
			// Kill the living ones (those adopted since too), then wait
			// for one to die.
			for _, pid := range procsWhere(procPPID, self) {
				syscall.Kill(pid, syscall.SIGKILL)
			}
			var st syscall.WaitStatus
			if _, err := syscall.Wait4(-1, &st, 0, nil); err == syscall.ECHILD {
				return
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(shimOrphanWait):
	}
}

// Fields of /proc/PID/stat after the command: state, ppid, pgrp.
const (
	procPPID = 1
	procPGrp = 2
)

// groupMembers lists the pids whose process group is pgid, from /proc.
func groupMembers(pgid int) []int { return procsWhere(procPGrp, strconv.Itoa(pgid)) }

// procsWhere lists the pids whose stat field (after the command) is value.
func procsWhere(field int, value string) []int {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var pids []int
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) > field && fields[field] == value {
			if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(f))); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// raise ends the shim by sig, as its shell ended (SPEC §10), with no Go
// traceback and no core file of its own. The Go runtime keeps its handler
// for every signal (one it catches crashes the shim with a traceback, one
// it ignores leaves it alive), so the handler is set to the default with
// rt_sigaction itself, the signal unblocked, and sent to this thread.
// Should the shim live on, the caller exits with 128+N.
func raise(sig syscall.Signal) {
	signal.Reset(sig)
	syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_DUMPABLE, 0, 0)
	runtime.LockOSThread()
	var dfl [8]uint64 // struct sigaction, all zero: SIG_DFL, no flags, an empty mask
	if _, _, e := syscall.RawSyscall6(syscall.SYS_RT_SIGACTION, uintptr(sig), uintptr(unsafe.Pointer(&dfl)), 0, sigSetBytes, 0, 0); e == 0 {
		set := uint64(1) << (sig - 1)
		syscall.RawSyscall6(syscall.SYS_RT_SIGPROCMASK, sigUnblock, uintptr(unsafe.Pointer(&set)), 0, sigSetBytes, 0, 0)
		syscall.Tgkill(os.Getpid(), syscall.Gettid(), sig)
	} else {
		syscall.Kill(os.Getpid(), sig) // SIGKILL, which has no handler
	}
	time.Sleep(shimRaiseWaitTime)
}

// awaitExit blocks until pid, a child, has exited, and leaves it unreaped
// (waitid with WNOWAIT).
func awaitExit(pid int) error {
	for {
		var info [siginfoBytes]byte
		_, _, e := syscall.Syscall6(syscall.SYS_WAITID, pPID, uintptr(pid), uintptr(unsafe.Pointer(&info)), syscall.WEXITED|syscall.WNOWAIT, 0, 0)
		switch e {
		case 0:
			return nil
		case syscall.EINTR:
		default:
			return e
		}
	}
}
