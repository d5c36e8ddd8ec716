package main

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The worker ignores SIGHUP (SPEC §10) without handing that on: what it
// starts begins with SIGHUP at its default, as an ignored disposition would
// survive exec and a caught one does not. (Planted: signal.Ignore, so
// every step, and anything it started, could not be hung up.)
func TestHangupsIgnoredNotInherited(t *testing.T) {
	ignoreHangups()
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the worker is still here
	out, err := exec.Command("sed", "-n", `s/^SigIgn:[[:space:]]*//p`, "/proc/self/status").Output()
	if err != nil {
		t.Skipf("cannot read a child's signal dispositions: %v", err)
	}
	ign, err := strconv.ParseUint(strings.TrimSpace(string(out)), 16, 64)
	if err != nil {
		t.Fatalf("SigIgn %q: %v", out, err)
	}
	if ign&(1<<(syscall.SIGHUP-1)) != 0 {
		t.Fatalf("a child of the worker starts with SIGHUP ignored (SigIgn %s)", strings.TrimSpace(string(out)))
	}
}
