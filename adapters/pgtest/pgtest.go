// Package pgtest starts a private PostgreSQL cluster for a test: initdb in a
// temporary directory, the server on a free loopback port with its Unix
// socket in that directory, fsync=on and synchronous_commit=on (a commit
// returns only once its WAL is on disk), one database, torn down when the
// test ends. Tests of any package import it; it is not a _test.go file so
// that they can.
//
// The server binaries (initdb, pg_ctl) are found on PATH, else under
// /usr/lib/postgresql/*/bin (the newest version); `make deps` installs
// Debian's postgresql when neither has them. Without them Start fails the
// test, naming `make deps`: the PostgreSQL tests are skipped only when
// TETHER_TEST_PG=off says so. initdb and the server refuse to run as root,
// so a root test process runs them as the unprivileged user postgres (the
// Debian package creates it), which owns the cluster's directory.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// SkipEnv is the variable that, set to "off", skips the PostgreSQL tests.
const SkipEnv = "TETHER_TEST_PG"

// Database is the name of the database Start creates; User is the
// cluster's superuser, trusted on loopback and the socket only.
const (
	Database = "tether"
	User     = "tether"
)

// dirPrefix begins the name of each cluster's directory; its file owner
// holds the process ID of the test process that made it.
const dirPrefix = "tether-pg-"

// libRoot is where Debian installs each PostgreSQL version's binaries
// (<libRoot>/<version>/bin); a variable for the lookup's test.
var libRoot = "/usr/lib/postgresql"

// Cluster is one private PostgreSQL server. Its fields do not change after
// Start; Stop and Restart take a lock, and fail the test with Fatalf, so
// they belong on the test's goroutine.
type Cluster struct {
	// DSN connects to the database Start created, over TCP on loopback:
	// postgres://tether@127.0.0.1:PORT/tether?sslmode=disable.
	DSN string
	// Port is the server's TCP port on 127.0.0.1; Restart keeps it.
	Port int
	// Dir holds the data directory (Dir/data), the server's log
	// (Dir/server.log) and its Unix socket; removed when the test ends.
	Dir string

	bin  string              // the directory of initdb and pg_ctl
	cred *syscall.Credential // who runs them: nil for this process's user, postgres under root
	mu   sync.Mutex
	up   bool
	dbs  int // databases NewDatabase made
}

// Start makes a cluster, starts it and creates its database; the test's
// cleanup stops it (pg_ctl stop -m immediate) and removes its directory. It
// skips the test when TETHER_TEST_PG=off and fails it when there are no
// server binaries.
func Start(t testing.TB) *Cluster {
	t.Helper()
	if os.Getenv(SkipEnv) == "off" {
		t.Skip(SkipEnv + "=off: the PostgreSQL tests are skipped")
	}
	bin, err := findBin(os.Getenv("PATH"), libRoot)
	if err != nil {
		t.Fatalf("%v: run `make deps` (it installs Debian's postgresql), or set %s=off to skip the PostgreSQL tests", err, SkipEnv)
	}
	reap(os.TempDir())
	c := &Cluster{bin: bin}
	// A short directory name of its own (not t.TempDir, whose name carries
	// the test's): the socket's path must fit in 107 bytes.
	dir, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	c.Dir = dir
	if err := os.WriteFile(filepath.Join(dir, "owner"), []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		os.RemoveAll(dir)
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.up {
			if err := c.pgctl("stop", "-m", "immediate"); err != nil {
				t.Errorf("pgtest: stopping the cluster at the test's end: %v", err)
			}
			c.up = false
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("pgtest: %v", err)
		}
	})
	if os.Geteuid() == 0 {
		c.cred, err = unprivileged(dir)
		if err != nil {
			t.Fatalf("pgtest: initdb refuses to run as root and %v: run `make deps` (Debian's postgresql creates the user postgres), or set %s=off to skip the PostgreSQL tests", err, SkipEnv)
		}
	}
	// --no-sync: initdb's own files are not flushed (only an OS crash
	// could lose them); the server's commits are, with fsync=on.
	if out, err := c.run(filepath.Join(bin, "initdb"), "-D", c.data(), "-U", User,
		"--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"); err != nil {
		t.Fatalf("pgtest: initdb: %v\n%s", err, out)
	}
	// Each start tries a new free port until one is still free when the
	// server binds it (another process may take it in between).
	for attempt := 1; ; attempt++ {
		c.Port, err = freePort()
		if err != nil {
			t.Fatalf("pgtest: %v", err)
		}
		if err = c.configure(); err != nil {
			t.Fatalf("pgtest: %v", err)
		}
		c.mu.Lock()
		err = c.start()
		c.mu.Unlock()
		if err == nil || attempt == 3 {
			break
		}
	}
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	if err := c.createDatabase(Database); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	c.DSN = c.dsn(Database)
	return c
}

// NewDatabase creates another empty database in the cluster and returns
// its DSN: tests that each need a fresh store can share one cluster.
func (c *Cluster) NewDatabase(t testing.TB) string {
	t.Helper()
	c.mu.Lock()
	c.dbs++
	name := fmt.Sprintf("%s_%d", Database, c.dbs)
	c.mu.Unlock()
	if err := c.createDatabase(name); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return c.dsn(name)
}

func (c *Cluster) createDatabase(name string) error {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, c.dsn("postgres"))
	if err != nil {
		return fmt.Errorf("connecting to the cluster: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return fmt.Errorf("creating the database %s: %v", name, err)
	}
	return nil
}

// Stop stops the server as a crash would (pg_ctl stop -m immediate: no
// shutdown checkpoint; the next start replays the WAL). Connections fail
// until Restart. Stopping a stopped cluster does nothing.
func (c *Cluster) Stop(t testing.TB) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.up {
		return
	}
	if err := c.pgctl("stop", "-m", "immediate"); err != nil {
		t.Fatalf("pgtest: stop: %v", err)
	}
	c.up = false
}

// Restart stops the server as Stop does, if it is running, and starts it
// again on the same port; it returns once the server accepts connections.
// Committed transactions survive it; open connections do not.
func (c *Cluster) Restart(t testing.TB) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.up {
		if err := c.pgctl("stop", "-m", "immediate"); err != nil {
			t.Fatalf("pgtest: restart: stop: %v", err)
		}
		c.up = false
	}
	if err := c.start(); err != nil {
		t.Fatalf("pgtest: restart: %v", err)
	}
}

func (c *Cluster) data() string { return filepath.Join(c.Dir, "data") }

func (c *Cluster) dsn(db string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", User, c.Port, db)
}

// configure writes the settings the cluster runs with into
// postgresql.auto.conf, which is read after postgresql.conf and so wins.
func (c *Cluster) configure() error {
	conf := fmt.Sprintf(`listen_addresses = '127.0.0.1'
port = %d
unix_socket_directories = '%s'
fsync = on
synchronous_commit = on
full_page_writes = on
`, c.Port, c.Dir)
	p := filepath.Join(c.data(), "postgresql.auto.conf")
	if err := os.WriteFile(p, []byte(conf), 0o600); err != nil {
		return err
	}
	if c.cred != nil {
		return os.Chown(p, int(c.cred.Uid), int(c.cred.Gid))
	}
	return nil
}

// start starts the server and waits until it accepts connections; c.mu is held.
func (c *Cluster) start() error {
	if err := c.pgctl("start", "-w", "-t", "600", "-l", filepath.Join(c.Dir, "server.log")); err != nil {
		log, _ := os.ReadFile(filepath.Join(c.Dir, "server.log"))
		if len(log) > 4000 {
			log = log[len(log)-4000:]
		}
		return fmt.Errorf("start on port %d: %v\nserver log:\n%s", c.Port, err, log)
	}
	c.up = true
	return nil
}

func (c *Cluster) pgctl(args ...string) error {
	args = append([]string{"-D", c.data()}, args...)
	out, err := c.run(filepath.Join(c.bin, "pg_ctl"), args...)
	if err != nil {
		return fmt.Errorf("pg_ctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// run runs a server binary as c.cred, with the cluster's directory as its
// working directory and the PG* variables of this process's environment
// left out (they would redirect it).
func (c *Cluster) run(name string, args ...string) ([]byte, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = c.Dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
		cmd.Env = append(cmd.Env, "HOME="+c.Dir, "USER=postgres", "LOGNAME=postgres")
	}
	// pg_ctl start's server inherits no pipe of ours: its output goes to
	// the log, so CombinedOutput returns when pg_ctl does.
	return cmd.CombinedOutput()
}

// unprivileged returns the credential of the user postgres and gives it dir.
func unprivileged(dir string) (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("there is no user postgres to run it as (%v)", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("the user postgres: %v", err)
	}
	if err := os.Chown(dir, int(uid), int(gid)); err != nil {
		return nil, fmt.Errorf("giving %s to the user postgres: %v", dir, err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
}

// reap stops and removes the clusters under tmp whose test process died
// without its cleanup (a -timeout panic, a kill): the directories whose
// owner file names a process that no longer exists. A directory without
// that file is being made, or is not one of these, and is left alone.
func reap(tmp string) {
	dirs, _ := filepath.Glob(filepath.Join(tmp, dirPrefix+"*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, "owner"))
		if err != nil {
			continue
		}
		owner, err := strconv.Atoi(string(b))
		if err != nil || owner <= 0 || syscall.Kill(owner, 0) != syscall.ESRCH {
			continue
		}
		if pm := postmaster(dir); pm > 0 && syscall.Kill(pm, syscall.SIGQUIT) == nil {
			// SIGQUIT is the immediate shutdown; wait (10 s at most) until
			// it is no longer a postgres of this directory (exited, or a
			// zombie nobody reaps), so that its port is free.
			for i := 0; i < 1000 && postmaster(dir) == pm; i++ {
				time.Sleep(10 * time.Millisecond)
			}
		}
		os.RemoveAll(dir)
	}
}

// postmaster returns the process ID of the server running on dir/data, or
// 0: the PID in postmaster.pid, if that process is a postgres of this data
// directory (a stale file may name a process that has since reused it).
func postmaster(dir string) int {
	data := filepath.Join(dir, "data")
	b, err := os.ReadFile(filepath.Join(data, "postmaster.pid"))
	if err != nil {
		return 0
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 0 {
		return 0
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !strings.Contains(string(cmdline), data) {
		return 0
	}
	return pid
}

// findBin returns a directory holding both initdb and pg_ctl: initdb's on
// path (a PATH list) when pg_ctl is beside it, else the newest
// <root>/<version>/bin that has both.
func findBin(path, root string) (string, error) {
	has := func(dir string) bool {
		for _, b := range []string{"initdb", "pg_ctl"} {
			if fi, err := os.Stat(filepath.Join(dir, b)); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
				return false
			}
		}
		return true
	}
	for _, d := range filepath.SplitList(path) {
		if d != "" && has(d) {
			return d, nil
		}
	}
	entries, _ := os.ReadDir(root)
	var best string
	var bestV []int
	for _, e := range entries {
		v, ok := version(e.Name())
		if !ok || !has(filepath.Join(root, e.Name(), "bin")) {
			continue
		}
		if bestV == nil || slices.Compare(v, bestV) > 0 {
			best, bestV = filepath.Join(root, e.Name(), "bin"), v
		}
	}
	if best == "" {
		return "", fmt.Errorf("no PostgreSQL server binaries (initdb and pg_ctl) on PATH or under %s/*/bin", root)
	}
	return best, nil
}

// version parses a version directory's name, "15" or "9.6", into its numbers.
func version(name string) ([]int, bool) {
	var v []int
	for _, f := range strings.Split(name, ".") {
		n, err := strconv.Atoi(f)
		if err != nil || n < 0 {
			return nil, false
		}
		v = append(v, n)
	}
	return v, true
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
