package worker

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
)

// nobody is the unprivileged user the tests act as when they run as root.
const nobody = 65534

// asUnprivileged runs f on a thread whose file-system uid is nobody's when
// this process is root (so that permissions bite: setfsuid also drops the
// capabilities that bypass them, for this thread alone); as itself
// otherwise. The thread is not reused: its goroutine ends locked to it.
func asUnprivileged(t *testing.T, f func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		f()
		return
	}
	done := make(chan bool)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		syscall.RawSyscall(syscall.SYS_SETFSUID, nobody, 0, 0)
		if r, _, _ := syscall.RawSyscall(syscall.SYS_SETFSUID, nobody, 0, 0); r != nobody {
			done <- false
			return
		}
		f()
		done <- true
	}()
	if !<-done {
		t.Skip("running as root and cannot act as an unprivileged user (setfsuid)")
	}
}

// readOnlyTree makes, under dir, the directories a step can leave that its
// user cannot remove as they are: a read-only directory with a file, one
// that cannot be read or searched, a read-only cwd; and a symbolic link
// to a read-only directory outside, which must stay as it is. Everything
// belongs to nobody when the test runs as root.
func readOnlyTree(t *testing.T, dir, outside string) {
	t.Helper()
	for _, d := range []string{"scratch/d/e", "scratch/z", "output"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"scratch/d/e/f", "scratch/z/g", "scratch/f"} {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o400); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(outside, filepath.Join(dir, "scratch/link")); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		filepath.Walk(filepath.Dir(dir), func(p string, _ fs.FileInfo, _ error) error { return os.Lchown(p, nobody, nobody) })
	}
	for d, mode := range map[string]os.FileMode{"scratch/d/e": 0o500, "scratch/z": 0, "scratch": 0o500} {
		if err := os.Chmod(filepath.Join(dir, d), mode); err != nil {
			t.Fatal(err)
		}
	}
}

// A step's directory is removed even when the step left read-only
// directories in it (`chmod 500 d`, `chmod 000 d`, `chmod 500 .`), when
// it ends and by the start-up sweep, and nothing a symbolic link in it
// names is changed. (Planted: os.RemoveAll alone, which cannot empty a
// directory its user may not write.)
func TestRemoveStepDirsReadOnly(t *testing.T) {
	base, err := os.MkdirTemp("", "tether-rm-") // not t.TempDir: nobody must reach it
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(base)
	os.Chmod(base, 0o755)
	outside := filepath.Join(base, "outside")
	os.Mkdir(outside, 0o500)
	work := filepath.Join(base, "work")
	os.Mkdir(work, 0o700)
	readOnlyTree(t, filepath.Join(work, "step-1"), outside) // a previous process's
	readOnlyTree(t, filepath.Join(work, "step-2"), outside) // a step that just ended
	if os.Geteuid() == 0 {
		os.Lchown(outside, nobody, nobody)
		os.Lchown(work, nobody, nobody)
	}

	d, err := New(Options{URL: "ws://unused", WorkDir: work})
	if err != nil {
		t.Fatal(err)
	}
	var openErr error
	asUnprivileged(t, func() {
		openErr = d.openWorkDir()
		d.removeStepDirs(stepDirs{root: filepath.Join(work, "step-2")}, d.log)
	})
	if openErr != nil {
		t.Fatal(openErr)
	}
	for _, s := range []string{"step-1", "step-2"} {
		if _, err := os.Lstat(filepath.Join(work, s)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: not removed: %v", s, err)
		}
	}
	if fi, err := os.Stat(outside); err != nil || fi.Mode().Perm() != 0o500 {
		t.Errorf("the directory a link in the step's directory names was changed: %v, %v", fi.Mode(), err)
	}
}
