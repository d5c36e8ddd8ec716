package worker

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestStateDirSaveLoad(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	sd, err := OpenStateDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer sd.Close()
	if st, err := sd.Load(); st != nil || err != nil {
		t.Fatalf("empty directory: Load = %+v, %v; want nothing", st, err)
	}
	want := State{Worker: "w-1", Name: "b1", Credential: "w-1.abc", URL: "ws://o/control", URLs: []string{"ws://o/control", "ws://p/control"}, EnrolledAt: time.Unix(1, 0).UTC()}
	if err := sd.Save(want); err != nil {
		t.Fatal(err)
	}
	got, err := sd.Load()
	if err != nil {
		t.Fatal(err)
	}
	want.Version = stateVersion
	if !reflect.DeepEqual(*got, want) {
		t.Fatalf("Load = %+v, want %+v", *got, want)
	}
	for _, p := range []string{sd.Path(), filepath.Join(dir, LockFileName)} {
		fi, err := os.Stat(p)
		if err != nil || fi.Mode().Perm() != stateFileMode {
			t.Errorf("%s: mode %v, %v; want %04o", p, fi.Mode().Perm(), err, stateFileMode)
		}
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != stateDirMode {
		t.Errorf("%s: mode %v, %v; want %04o", dir, fi.Mode().Perm(), err, stateDirMode)
	}
	// Nothing but the two files is left behind (the temporary file was renamed).
	if ents, _ := os.ReadDir(dir); len(ents) != 2 {
		t.Errorf("directory holds %d entries, want 2: %v", len(ents), ents)
	}
}

// Two holders of one directory: the second is refused, naming the first's
// pid; once the first lets go, the directory can be taken again.
func TestStateDirLock(t *testing.T) {
	dir := t.TempDir()
	a, err := OpenStateDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = OpenStateDir(dir)
	if !errors.Is(err, ErrStateLocked) || !strings.Contains(err.Error(), "pid ") {
		t.Fatalf("second open: %v; want ErrStateLocked naming the holder's pid", err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := OpenStateDir(dir)
	if err != nil {
		t.Fatalf("after Close: %v", err)
	}
	b.Close()
}

func TestStateDirBadFiles(t *testing.T) {
	for name, c := range map[string]struct {
		src  string
		mode os.FileMode
		want string
	}{
		"torn":          {`{"version": 1, "worker_id": "w`, 0o600, "unexpected EOF"},
		"open to group": {`{"version":1,"worker_id":"w","credential":"w.s"}`, 0o640, "lets other users read"},
		"other version": {`{"version":9,"worker_id":"w","credential":"w.s"}`, 0o600, "version 9"},
		"unknown key":   {`{"version":1,"worker_id":"w","credential":"w.s","x":1}`, 0o600, "unknown field"},
		"foreign cred":  {`{"version":1,"worker_id":"w","credential":"v.s"}`, 0o600, "credential of another worker"},
		"no credential": {`{"version":1,"worker_id":"w"}`, 0o600, "no worker id"},
	} {
		dir := t.TempDir()
		sd, err := OpenStateDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(sd.Path(), []byte(c.src), c.mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(sd.Path(), c.mode)
		_, err = sd.Load()
		if !errors.Is(err, ErrBadState) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Load: %v; want ErrBadState containing %q", name, err, c.want)
		}
		sd.Close()
	}
}

func TestDefaultStateDir(t *testing.T) {
	t.Setenv("STATE_DIRECTORY", "/var/lib/tw:/var/lib/other")
	if d, _ := DefaultStateDir(); d != "/var/lib/tw" {
		t.Errorf("under systemd: %q", d)
	}
	t.Setenv("STATE_DIRECTORY", "")
	t.Setenv("XDG_STATE_HOME", "/xdg")
	if d, _ := DefaultStateDir(); d != "/xdg/tether" {
		t.Errorf("XDG: %q", d)
	}
	t.Setenv("XDG_STATE_HOME", "")
	t.Setenv("HOME", "/home/u")
	if d, _ := DefaultStateDir(); d != "/home/u/.local/state/tether" {
		t.Errorf("home: %q", d)
	}
}
