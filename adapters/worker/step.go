package worker

// A step's surroundings on the worker (SPEC §10): the environment it
// inherits from the worker, its scratch directory (its cwd) and its output
// directory, whose files are uploaded when it exits (persistFile), before
// its report.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/tether-run/tether/adapters/dataplane"
	"github.com/tether-run/tether/core"
)

// Environment variables a step process gets for its directories.
const (
	EnvScratch   = "TETHER_SCRATCH"    // its working directory, fresh per dispatch
	EnvOutputDir = "TETHER_OUTPUT_DIR" // files left here are uploaded when it exits
)

// StepInherits are the variables of the worker's own environment a step
// process inherits by default (LC_* too): what a shell needs to find
// programs and speak the host's locale. Nothing else of the worker's
// environment reaches a step — not its enrollment token, not a cloud
// credential the host was started with — unless worker connect --pass-env
// names it.
var StepInherits = []string{"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "LC_*", "TZ", "TMPDIR"}

// StepBaseEnv returns the part of environ (KEY=VALUE entries) a step
// inherits: the variables StepInherits names, and those matching one of
// pass (path.Match globs), never TETHER_* (the worker sets a step's own).
func StepBaseEnv(environ, pass []string) []string {
	var out []string
	for _, kv := range environ {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.HasPrefix(k, "TETHER_") {
			continue
		}
		if matchAny(StepInherits, k) || matchAny(pass, k) {
			out = append(out, kv)
		}
	}
	return out
}

func matchAny(patterns []string, name string) bool {
	for _, p := range patterns {
		if ok, _ := path.Match(p, name); ok {
			return true
		}
	}
	return false
}

// CheckEnvPattern says whether p is a usable --pass-env (or --ship-env)
// pattern: a path.Match glob.
func CheckEnvPattern(p string) error {
	if p == "" {
		return errors.New("an empty pattern")
	}
	if _, err := path.Match(p, ""); err != nil {
		return fmt.Errorf("pattern %q: %v", p, err)
	}
	return nil
}

// Bounds of a step's output directory (persistFile).
const (
	DefaultMaxOutputFiles = 256
	DefaultMaxOutputBytes = 1 << 30
)

// openWorkDir makes the work directory ready: Options.WorkDir (made if
// missing; directories a previous process of this worker left behind are
// removed, unless KeepScratch), or a fresh temporary one.
func (d *Driver) openWorkDir() error {
	if d.opts.WorkDir == "" {
		dir, err := os.MkdirTemp("", "tether-work-")
		if err != nil {
			return fmt.Errorf("work directory: %w", err)
		}
		d.workDir, d.tempWork = dir, true
		return nil
	}
	if err := os.MkdirAll(d.opts.WorkDir, 0o700); err != nil {
		return fmt.Errorf("work directory: %w", err)
	}
	d.workDir = d.opts.WorkDir
	sweepSecrets(d.workDir, d.log) // never kept: secret values
	if d.opts.KeepScratch {
		return nil
	}
	old, _ := filepath.Glob(filepath.Join(d.workDir, "step-*"))
	for _, dir := range old {
		if err := removeTree(dir); err != nil {
			d.log.Warn("cannot remove a step directory a previous worker process left", "dir", dir, "err", err)
		}
	}
	return nil
}

// stepDirs are one dispatch's directories.
type stepDirs struct {
	root, scratch, output string
}

// makeStepDirs makes lease's directories, empty, mode 0700.
func (d *Driver) makeStepDirs(lease core.LeaseID) (stepDirs, error) {
	root := filepath.Join(d.workDir, "step-"+strconv.FormatUint(uint64(lease), 10))
	s := stepDirs{root: root, scratch: filepath.Join(root, "scratch"), output: filepath.Join(root, "output")}
	removeTree(root) // a directory of the same lease cannot be in use: leases are never reused
	for _, dir := range []string{root, s.scratch, s.output} {
		if err := os.Mkdir(dir, 0o700); err != nil {
			removeTree(root)
			return stepDirs{}, fmt.Errorf("step directory: %w", err)
		}
	}
	return s, nil
}

// removeStepDirs removes a finished step's directories unless KeepScratch.
func (d *Driver) removeStepDirs(s stepDirs, log interface{ Warn(string, ...any) }) {
	if d.opts.KeepScratch || s.root == "" {
		return
	}
	if err := removeTree(s.root); err != nil {
		log.Warn("cannot remove the step's directory", "dir", s.root, "err", err)
	}
}

// removeTree removes dir and everything in it, as os.RemoveAll does, also
// when a step left a directory in it that its user may not write or search
// (`chmod 500 d`, `chmod 000 .`), which SPEC §10 removes all the same: then
// it gives each directory of the tree its owner's rwx and tries again. It
// does so through an os.Root of dir's parent, so that a symbolic link in
// the tree (or one put in dir's place) never leads a change outside it.
func removeTree(dir string) error {
	err := os.RemoveAll(dir)
	if err == nil {
		return nil
	}
	root, rerr := os.OpenRoot(filepath.Dir(dir))
	if rerr != nil {
		return err
	}
	defer root.Close()
	openUp(root, filepath.Base(dir))
	return os.RemoveAll(dir)
}

// openUp gives name, when it is a directory (not a link to one), and each
// directory under it u+rwx, top down.
func openUp(root *os.Root, name string) {
	fi, err := root.Lstat(name)
	if err != nil || !fi.IsDir() {
		return
	}
	if perm := fi.Mode().Perm(); perm&0o700 != 0o700 && root.Chmod(name, perm|0o700) != nil {
		return
	}
	f, err := root.Open(name)
	if err != nil {
		return
	}
	ents, _ := f.ReadDir(-1)
	f.Close()
	for _, e := range ents {
		if e.IsDir() {
			openUp(root, filepath.Join(name, e.Name()))
		}
	}
}

// outputFile is one file to upload.
type outputFile struct {
	name string
	size int64
}

// ErrOutputDir is wrapped by every refusal of a step's output directory.
var ErrOutputDir = errors.New("persistFile")

// listOutputs checks dir, a step's output directory, and returns its files
// in name order. Every entry must be a regular file named as a data id
// (SPEC §14): a symbolic link (it could name any file the worker can read),
// a subdirectory (a data id has no '/'), a device, pipe or socket, a name
// that is no data id, more than maxFiles files or more than maxBytes in all
// are refused, and then nothing is uploaded.
func listOutputs(dir string, maxFiles int, maxBytes int64) ([]outputFile, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: reading $%s: %v", ErrOutputDir, EnvOutputDir, err)
	}
	sort.Slice(ents, func(i, j int) bool { return ents[i].Name() < ents[j].Name() })
	var out []outputFile
	var total int64
	for _, e := range ents {
		name := e.Name()
		switch {
		case e.Type()&fs.ModeSymlink != 0:
			return nil, fmt.Errorf("%w: $%s/%s is a symbolic link; only regular files are uploaded (copy the file there instead)", ErrOutputDir, EnvOutputDir, name)
		case e.IsDir():
			return nil, fmt.Errorf("%w: $%s/%s is a directory; only regular files directly in it are uploaded (archive the directory into one file)", ErrOutputDir, EnvOutputDir, name)
		case !e.Type().IsRegular():
			return nil, fmt.Errorf("%w: $%s/%s is not a regular file (%s)", ErrOutputDir, EnvOutputDir, name, e.Type())
		case !ValidDataID(name):
			return nil, fmt.Errorf("%w: $%s/%s: a file's name is its data id: 1–128 of [A-Za-z0-9._-], the first a letter or digit", ErrOutputDir, EnvOutputDir, core.Quote(name))
		}
		if len(out) == maxFiles {
			return nil, fmt.Errorf("%w: $%s holds more than %d files", ErrOutputDir, EnvOutputDir, maxFiles)
		}
		fi, err := e.Info()
		if err != nil {
			return nil, fmt.Errorf("%w: $%s/%s: %v", ErrOutputDir, EnvOutputDir, name, err)
		}
		if total += fi.Size(); total > maxBytes {
			return nil, fmt.Errorf("%w: $%s holds more than %d bytes", ErrOutputDir, EnvOutputDir, maxBytes)
		}
		out = append(out, outputFile{name: name, size: fi.Size()})
	}
	return out, nil
}

// ValidDataID says whether s is a data id (SPEC §14): 1–128 characters of
// [A-Za-z0-9._-], the first a letter or digit.
func ValidDataID(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i, c := range s {
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || c != '.' && c != '_' && c != '-') {
			return false
		}
	}
	return true
}

// persistOutputs uploads the files of a step's output directory under its
// lease, in name order, each a new version of the data id its name gives;
// it returns the lines to add to the step's output and the error that fails
// the step (nil when every file is stored, or when the lease ended: then
// nobody takes the step's report). The first failure stops the rest.
func (d *Driver) persistOutputs(ctx context.Context, lease core.LeaseID, dir string) (lines []string, err error) {
	files, err := listOutputs(dir, d.opts.OutputFiles, d.opts.OutputBytes)
	if err != nil {
		return []string{"[tether] " + err.Error()}, err
	}
	for _, f := range files {
		v, err := d.uploadOutput(ctx, lease, dir, f)
		if errors.Is(err, ErrDataFenced) {
			return append(lines, fmt.Sprintf("[tether] persistFile: %s not stored: the step's lease ended", f.name)), nil
		}
		if err != nil {
			err = fmt.Errorf("%w: uploading $%s/%s failed: %v", ErrOutputDir, EnvOutputDir, f.name, err)
			return append(lines, "[tether] "+err.Error()), err
		}
		lines = append(lines, fmt.Sprintf("[tether] persistFile: stored %s version %d (%d bytes, sha256 %s)", f.name, v.Version, v.Size, v.SHA256))
	}
	return lines, nil
}

func (d *Driver) uploadOutput(ctx context.Context, lease core.LeaseID, dir string, f outputFile) (v dataplane.Version, err error) {
	// O_NOFOLLOW: a file swapped for a link after the listing is refused.
	fh, err := os.OpenFile(filepath.Join(dir, f.name), os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return v, err
	}
	defer fh.Close()
	fi, err := fh.Stat()
	if err != nil {
		return v, err
	}
	if !fi.Mode().IsRegular() {
		return v, errors.New("not a regular file")
	}
	return d.data.PutWith(ctx, lease, f.name, fh, fi.Size(), WriteOpts{})
}
