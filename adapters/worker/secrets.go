package worker

// A step's secrets (SPEC §14a). Before it starts the process of a dispatch
// that names secrets, the worker fetches each one from the data plane
// (GET /secret/{name} under the dispatch's lease), off the loop, and hands
// them over:
//
//	secrets_as: files (default)  $TETHER_SECRETS_DIR/NAME, mode 0600, in a
//	                             fresh 0700 directory (under /dev/shm when it
//	                             exists, so never on disk; when it cannot be
//	                             used, the temp dir, with a warning), removed
//	                             when the process has exited
//	secrets_as: env              NAME=value in the process's environment
//	                             (readable through /proc/PID/environ by the
//	                             same user); not a name on the denylist a
//	                             step's env: gets (PATH, TETHER_*, …),
//	                             which would override the worker's
//
// A secrets directory's name carries a digest of the worker's work
// directory (secretsDirPrefix), so that a worker started again with it
// removes the directories a killed process of it left (sweepSecrets), and
// no other worker's.
//
// Every value of at least MinRedact bytes, and every line of at least
// MinRedact bytes of a multi-line value, is replaced by "***" in the step's
// output lines before they leave the worker. A secret that cannot be
// fetched fails the step before its process starts (exit 127, like a
// process that cannot start).

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/tether-run/tether/core"
)

// EnvSecretsDir names the directory of a step's secrets (secrets_as: files).
const EnvSecretsDir = "TETHER_SECRETS_DIR"

// MinRedact is the shortest value that is redacted: a shorter one would
// turn common words and digits of every line into "***" and hide nothing
// (a value of 1-3 bytes is guessed in at most 2^24 tries anyway).
const MinRedact = 4

// Redacted replaces a secret's value in output.
const Redacted = "***"

// secretsFetchTimeout bounds the fetch of one dispatch's secrets.
const secretsFetchTimeout = 30 * time.Second

// shmDir is where a step's secrets directory is made when it exists
// (SPEC §14a: tmpfs, so the values never reach a disk); a variable for
// tests.
var shmDir = "/dev/shm"

// stepSecrets is what one lease's process is given: nil for a dispatch
// that names none.
type stepSecrets struct {
	pending   bool     // being fetched
	cancelled bool     // an ExecTerm or ExecKill came while fetching
	dir       string   // secrets_as files: the directory, removed at exit
	env       []string // secrets_as env: NAME=value
	redact    []string // the strings to redact, longest first
}

// secretsFetched is the loop's input once a dispatch's secrets are in
// hand (or could not be).
type secretsFetched struct {
	c   core.ExecCommand
	sec *stepSecrets
	err error
}

// secretsReady says whether c's process may start now: true when c names
// no secret or its secrets were fetched; otherwise it starts the fetch
// (once) and the loop starts the process when it is done.
func (d *Driver) secretsReady(c core.ExecCommand) bool {
	if len(c.Secrets) == 0 {
		return true
	}
	if s := d.secrets[c.Lease]; s != nil {
		return !s.pending
	}
	if d.secrets == nil {
		d.secrets = map[core.LeaseID]*stepSecrets{}
	}
	d.secrets[c.Lease] = &stepSecrets{pending: true}
	prefix := secretsDirPrefix(d.workDir)
	parent := d.ctx // Run's: a worker that stops stops fetching
	if parent == nil {
		parent = context.Background()
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		ctx, cancel := context.WithTimeout(parent, secretsFetchTimeout)
		defer cancel()
		sec, err := fetchSecrets(ctx, d.data, c, prefix, d.log)
		if !d.push(secretsFetched{c: c, sec: sec, err: err}) && sec != nil {
			sec.remove()
		}
	}()
	return false
}

// fetched takes a fetch's result on the loop: the process starts now, or
// the step fails (or was cancelled meanwhile) without starting it.
func (d *Driver) fetched(in secretsFetched) {
	lease := in.c.Lease
	cancelled := d.secrets[lease] != nil && d.secrets[lease].cancelled
	switch {
	case in.err != nil || cancelled:
		if in.sec != nil {
			in.sec.remove()
		}
		delete(d.secrets, lease)
		x := exited{Lease: lease, ExitCode: exitCodeErr}
		if cancelled {
			x.Signaled, x.ExitCode = true, 128+int(termSignal)
		} else {
			x.Err = "secrets: " + in.err.Error()
			d.log.Warn("step secrets not fetched; the step fails without starting", "lease", uint64(lease), "step", string(in.c.Step), "err", in.err)
		}
		d.local = append(d.local, x)
	default:
		d.secrets[lease] = in.sec
		d.start(in.c)
	}
}

// cancelFetch notes an ExecTerm or ExecKill for a lease whose secrets are
// still being fetched; false if none is.
func (d *Driver) cancelFetch(lease core.LeaseID) bool {
	if s := d.secrets[lease]; s != nil && s.pending {
		s.cancelled = true
		return true
	}
	return false
}

// dropSecrets removes what lease's process was given (it has exited).
func (d *Driver) dropSecrets(lease core.LeaseID) {
	if s := d.secrets[lease]; s != nil {
		s.remove()
		delete(d.secrets, lease)
	}
}

func (s *stepSecrets) remove() {
	if s != nil && s.dir != "" {
		removeTree(s.dir) // the step may have made it read-only
	}
}

// secretsDirPrefix begins the name of every secrets directory of the
// worker whose work directory is workDir: "tether-secrets-", 12 hex digits
// of its absolute path's SHA-256, "-". A worker's work directory is its
// own (its state directory's lock, or --work-dir, whose step-* a worker
// removes at start too), so these directories are its own.
func secretsDirPrefix(workDir string) string {
	if workDir == "" {
		return "tether-secrets-"
	}
	if abs, err := filepath.Abs(workDir); err == nil {
		workDir = abs
	}
	sum := sha256.Sum256([]byte(workDir))
	return "tether-secrets-" + hex.EncodeToString(sum[:6]) + "-"
}

// sweepSecrets removes the secrets directories a previous process of the
// worker whose work directory is workDir left (killed, it could not remove
// them): under shmDir and the temp dir, named with its prefix, directories
// (not links) this user owns. Called at start, before any step runs.
func sweepSecrets(workDir string, log *slog.Logger) {
	prefix := secretsDirPrefix(workDir)
	for _, base := range []string{shmDir, os.TempDir()} {
		old, _ := filepath.Glob(filepath.Join(base, prefix+"*"))
		for _, dir := range old {
			fi, err := os.Lstat(dir)
			if err != nil || !fi.IsDir() {
				continue
			}
			if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Geteuid() {
				continue
			}
			if err := removeTree(dir); err != nil {
				log.Warn("cannot remove a secrets directory a previous worker process left", "dir", dir, "err", err)
			} else {
				log.Info("removed a secrets directory a previous worker process left", "dir", dir)
			}
		}
	}
}

// environ is the process's variables for its secrets.
func (s *stepSecrets) environ() map[string]string {
	if s == nil {
		return nil
	}
	m := map[string]string{}
	if s.dir != "" {
		m[EnvSecretsDir] = s.dir
	}
	for _, kv := range s.env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

// redactLines replaces every secret in lines (in place) with Redacted.
func (s *stepSecrets) redactLines(lines []string) []string {
	if s == nil || len(s.redact) == 0 {
		return lines
	}
	for i, l := range lines {
		lines[i] = redact(l, s.redact)
	}
	return lines
}

func redact(line string, values []string) string {
	for _, v := range values {
		if strings.Contains(line, v) {
			line = strings.ReplaceAll(line, v, Redacted)
		}
	}
	return line
}

// redactions are the strings redacted for these values: each value, and
// each line of a multi-line one, of at least MinRedact bytes, longest
// first (so that a value containing another is replaced whole).
func redactions(values [][]byte) []string {
	seen := map[string]bool{}
	var out []string
	add := func(s string) {
		if len(s) >= MinRedact && !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	for _, v := range values {
		add(string(v))
		add(strings.TrimRight(string(v), "\r\n"))
		for _, l := range strings.Split(string(v), "\n") {
			add(strings.TrimRight(l, "\r"))
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

// fetchSecrets fetches c's secrets and hands them over as c asks, in a
// directory whose name begins with prefix (secretsDirPrefix); log gets a
// warning when their directory cannot be under shmDir, or a secret is not
// set in the environment.
func fetchSecrets(ctx context.Context, dc *DataClient, c core.ExecCommand, prefix string, log *slog.Logger) (*stepSecrets, error) {
	if dc == nil {
		return nil, errors.New("the worker has no data plane")
	}
	values := make([][]byte, len(c.Secrets))
	for i, name := range c.Secrets {
		if err := core.CheckSecretName(name); err != nil {
			return nil, err // never a path outside the directory
		}
		resp, err := dc.do(ctx, "GET", "/secret/"+name, "", c.Lease, nil, 0)
		if err != nil {
			return nil, fmt.Errorf("secret %s: %w", name, err)
		}
		v, err := io.ReadAll(io.LimitReader(resp.Body, core.MaxSecretBytes+1))
		resp.Body.Close()
		if err != nil || len(v) > core.MaxSecretBytes {
			return nil, fmt.Errorf("secret %s: reading its value: %v", name, cmpErr(err, "too long"))
		}
		values[i] = v
	}
	s := &stepSecrets{redact: redactions(values)}
	if c.SecretsAs == core.SecretsAsEnv {
		for i, name := range c.Secrets {
			if strings.IndexByte(string(values[i]), 0) >= 0 {
				return nil, fmt.Errorf("secret %s holds a NUL byte: an environment variable cannot; use secrets_as: files", name)
			}
			if core.Denied(name) { // as the step's env: (SPEC §8): the worker's own variables stay
				log.Warn("secret not set in the step's environment: its name is one the worker sets; use secrets_as: files",
					"lease", uint64(c.Lease), "step", string(c.Step), "secret", name)
				continue
			}
			s.env = append(s.env, name+"="+string(values[i]))
		}
		return s, nil
	}
	base := ""
	if fi, err := os.Stat(shmDir); err == nil && fi.IsDir() {
		base = shmDir // tmpfs: the values never reach a disk
	}
	dir, err := os.MkdirTemp(base, prefix) // mode 0700
	if err != nil && base != "" {
		// A step does not fail because /dev/shm is full or not writable,
		// but SPEC §14a promises it is never on a disk: say so.
		shmErr := err
		if dir, err = os.MkdirTemp("", prefix); err == nil {
			log.Warn("step secrets directory is on disk: "+shmDir+" could not be used", "lease", uint64(c.Lease), "step", string(c.Step), "dir", dir, "err", shmErr)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("secrets directory: %w", err)
	}
	s.dir = dir
	for i, name := range c.Secrets {
		if err := os.WriteFile(filepath.Join(dir, name), values[i], 0o600); err != nil {
			s.remove()
			return nil, fmt.Errorf("secret %s: %w", name, err)
		}
	}
	return s, nil
}

func cmpErr(err error, otherwise string) string {
	if err != nil {
		return err.Error()
	}
	return otherwise
}
