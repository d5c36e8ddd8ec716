package worker

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ShimSupported says whether steps can run under the shim here (Linux only).
const ShimSupported = true

// Shim limits.
const (
	shimDeathSignal   = syscall.SIGUSR2 // Pdeathsig of the shim: its worker is gone
	shimParentPoll    = 500 * time.Millisecond
	shimReapPasses    = 5                      // /proc sweeps for leftovers when the group cannot be left
	shimRaiseWaitTime = 200 * time.Millisecond // how long a re-raised signal may take to end the shim
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
// stdout, stderr and environment. It
//   - on SIGTERM (the worker's cancel), sends SIGTERM once to the whole group
//     and keeps waiting for the shell;
//   - when the worker goes (Pdeathsig, or its parent pid changes: the second
//     line, as Pdeathsig follows the forking thread), SIGKILLs the group;
//   - when the shell exits, SIGKILLs what is left of the group (background
//     processes die with their step) and exits with the shell's status: a
//     shell killed by signal N ends the shim with signal N when it can, so
//     the worker reads 128+N "killed by signal" as without a shim.
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
	signal.Notify(sigs, syscall.SIGTERM, shimDeathSignal)
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

// groupMembers lists the pids whose process group is pgid, from /proc.
func groupMembers(pgid int) []int {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var pids []int
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		// After the command: state, ppid, pgrp.
		if len(fields) > 2 && fields[2] == strconv.Itoa(pgid) {
			if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(f))); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// raise ends the shim with sig, as its shell ended. A signal the Go runtime
// turns into an exit or ignores leaves the shim alive: the caller then exits
// with 128+N.
func raise(sig syscall.Signal) {
	signal.Reset(sig)
	syscall.Kill(os.Getpid(), sig)
	time.Sleep(shimRaiseWaitTime)
}
