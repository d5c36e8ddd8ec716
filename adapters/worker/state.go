package worker

// The worker's identity across restarts (SPEC §9, §10): a state directory
// holds the instance id and the session credential, so that a process
// restarted by its supervisor reconnects as the same worker within the
// credential's lifetime instead of needing a new enrollment token.
//
// Two files, both mode 0600, in a directory of mode 0700:
//
//   - worker.lock, locked with flock(2) for as long as the process runs, so
//     that two processes can never share an identity (the second is refused
//     with ErrStateLocked). The lock is on a file of its own because the
//     state file is replaced by rename: a lock on the replaced inode would
//     not exclude a process that opened the new one.
//   - worker.json, the State, replaced atomically: written to a temporary
//     file, synced, renamed over the old one, and the directory synced, so
//     a crash leaves either the old state or the new one, never a torn one.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tether-run/tether/core"
)

// State directory layout and limits.
const (
	StateFileName     = "worker.json"
	LockFileName      = "worker.lock"
	stateVersion      = 1
	stateFileMode     = 0o600
	stateDirMode      = 0o700
	maxStateFileBytes = 64 << 10
)

// ErrStateLocked is returned by OpenStateDir when another process holds the
// directory's lock: it is running as the identity saved there.
var ErrStateLocked = errors.New("state directory is locked by another worker process")

// ErrBadState is returned by StateDir.Load for a state file that cannot be
// used (unreadable, malformed, another version, open to other users).
var ErrBadState = errors.New("unusable worker state file")

// State is what a worker keeps across restarts.
type State struct {
	Version    int           `json:"version"`
	Worker     core.WorkerID `json:"worker_id"`
	Name       string        `json:"name"`
	Credential string        `json:"credential"`     // "<worker id>.<secret>": a secret, hence mode 0600
	URL        string        `json:"url"`            // the orchestrator it was issued by (informational)
	URLs       []string      `json:"urls,omitempty"` // every control URL the worker was given (SPEC §11), URL first
	EnrolledAt time.Time     `json:"enrolled_at"`    // by the worker's clock (informational)
}

// StateDir is an open, locked state directory.
type StateDir struct {
	dir  string
	lock *os.File
}

// OpenStateDir creates dir if needed (mode 0700) and takes its lock without
// waiting; if another process holds it, the error wraps ErrStateLocked and
// names that process's pid when it is known. Close releases the lock (so
// does the process's death, however it dies).
func OpenStateDir(dir string) (*StateDir, error) {
	if dir == "" {
		return nil, errors.New("no state directory")
	}
	if err := os.MkdirAll(dir, stateDirMode); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	path := filepath.Join(dir, LockFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, stateFileMode)
	if err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder := ""
		if b, rerr := io.ReadAll(io.LimitReader(f, 32)); rerr == nil {
			if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil && pid > 0 {
				holder = fmt.Sprintf(" (pid %d)", pid)
			}
		}
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s: %w%s", dir, ErrStateLocked, holder)
		}
		return nil, fmt.Errorf("state directory: lock %s: %w", path, err)
	}
	// The holder's pid, for the message a second process prints.
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &StateDir{dir: dir, lock: f}, nil
}

// Dir returns the directory's path.
func (s *StateDir) Dir() string { return s.dir }

// Path returns the state file's path.
func (s *StateDir) Path() string { return filepath.Join(s.dir, StateFileName) }

// Load reads the saved state: nil and no error when there is none.
func (s *StateDir) Load() (*State, error) {
	path := s.Path()
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w %s: %v", ErrBadState, path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%w %s: %v", ErrBadState, path, err)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("%w %s: mode %04o lets other users read the session credential; want %04o",
			ErrBadState, path, perm, stateFileMode)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxStateFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%w %s: %v", ErrBadState, path, err)
	}
	if len(b) > maxStateFileBytes {
		return nil, fmt.Errorf("%w %s: larger than %d bytes", ErrBadState, path, maxStateFileBytes)
	}
	var st State
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		return nil, fmt.Errorf("%w %s: %v", ErrBadState, path, err)
	}
	switch id, _, _ := strings.Cut(st.Credential, "."); {
	case st.Version != stateVersion:
		return nil, fmt.Errorf("%w %s: version %d, want %d", ErrBadState, path, st.Version, stateVersion)
	case st.Worker == "" || st.Credential == "" || id != string(st.Worker):
		return nil, fmt.Errorf("%w %s: no worker id, or a credential of another worker", ErrBadState, path)
	}
	return &st, nil
}

// Save replaces the state file atomically and durably: temporary file
// (0600), write, fsync, rename, fsync of the directory.
func (s *StateDir) Save(st State) error {
	st.Version = stateVersion
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(s.dir, StateFileName+".tmp-*")
	if err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	defer os.Remove(tmp.Name()) // after a successful rename: nothing to remove
	if err := tmp.Chmod(stateFileMode); err != nil {
		tmp.Close()
		return fmt.Errorf("save state: %w", err)
	}
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("save state: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("save state: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	if err := os.Rename(tmp.Name(), s.Path()); err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	d, err := os.Open(s.dir)
	if err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("save state: sync %s: %w", s.dir, err)
	}
	return nil
}

// Close releases the lock.
func (s *StateDir) Close() error {
	if s.lock == nil {
		return nil
	}
	err := s.lock.Close() // closing the descriptor drops the flock
	s.lock = nil
	return err
}

// DefaultStateDir is where a worker keeps its state when not told:
// $STATE_DIRECTORY (systemd's StateDirectory=; the first of a list), else
// $XDG_STATE_HOME/tether, else ~/.local/state/tether.
func DefaultStateDir() (string, error) {
	if v := os.Getenv("STATE_DIRECTORY"); v != "" {
		first, _, _ := strings.Cut(v, ":")
		return first, nil
	}
	if v := os.Getenv("XDG_STATE_HOME"); v != "" && filepath.IsAbs(v) {
		return filepath.Join(v, "tether"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("no default state directory (%v): give --state-dir", err)
	}
	return filepath.Join(home, ".local", "state", "tether"), nil
}
