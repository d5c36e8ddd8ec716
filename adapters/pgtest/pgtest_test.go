package pgtest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestClusterStarts: the cluster runs durable (fsync and synchronous_commit
// on), a committed row survives Restart (a crash-like stop and a start on
// the same port), and the DSN reaches the database Start created.
func TestClusterStarts(t *testing.T) {
	t0 := time.Now()
	c := Start(t)
	t.Logf("Start took %v", time.Since(t0))
	ctx := context.Background()

	conn := connect(t, c.DSN)
	for _, name := range []string{"fsync", "synchronous_commit"} {
		var v string
		if err := conn.QueryRow(ctx, "SHOW "+name).Scan(&v); err != nil {
			t.Fatalf("SHOW %s: %v", name, err)
		}
		if v != "on" {
			t.Errorf("%s = %q, want on", name, v)
		}
	}
	var db string
	if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil || db != Database {
		t.Fatalf("current_database() = %q, %v; want %q", db, err, Database)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE kv (k text PRIMARY KEY, v text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "INSERT INTO kv VALUES ('a', 'committed')"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)

	port := c.Port
	t1 := time.Now()
	c.Restart(t)
	t.Logf("Restart took %v", time.Since(t1))
	if c.Port != port {
		t.Fatalf("Restart moved the port from %d to %d", port, c.Port)
	}
	conn = connect(t, c.DSN)
	defer conn.Close(ctx)
	var v string
	if err := conn.QueryRow(ctx, "SELECT v FROM kv WHERE k = 'a'").Scan(&v); err != nil || v != "committed" {
		t.Fatalf("after Restart: the committed row reads %q, %v", v, err)
	}
}

// TestStopAndCleanup: after Stop nothing accepts connections on the port,
// Restart brings the server back there, and the test's end stops the
// server and removes its directory.
func TestStopAndCleanup(t *testing.T) {
	if os.Getenv(SkipEnv) == "off" {
		t.Skip(SkipEnv + "=off: the PostgreSQL tests are skipped")
	}
	var c *Cluster
	t.Run("cluster", func(t *testing.T) {
		c = Start(t)
		c.Stop(t)
		if listening(c.Port) {
			t.Fatal("the port still accepts connections after Stop")
		}
		c.Restart(t)
		connect(t, c.DSN).Close(context.Background())
	})
	if c == nil || t.Failed() {
		t.FailNow()
	}
	if _, err := os.Stat(c.Dir); !os.IsNotExist(err) {
		t.Errorf("the cluster's directory %s outlived its test (%v)", c.Dir, err)
	}
	if listening(c.Port) {
		t.Error("the server still listens after its test ended")
	}
}

// TestNewDatabase: each call gives a database of its own, empty, apart
// from the others and from the one Start made.
func TestNewDatabase(t *testing.T) {
	c := Start(t)
	ctx := context.Background()
	dsns := []string{c.DSN}
	for range 2 {
		t0 := time.Now()
		dsns = append(dsns, c.NewDatabase(t))
		t.Logf("NewDatabase took %v", time.Since(t0))
	}
	for i, dsn := range dsns {
		conn := connect(t, dsn)
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE tablename = 'mine'").Scan(&n); err != nil || n != 0 {
			t.Errorf("database %d (%s): %d tables named mine before it made one (%v); databases are not apart", i, dsn, n, err)
		}
		if _, err := conn.Exec(ctx, "CREATE TABLE mine (x int)"); err != nil {
			t.Errorf("database %d (%s): %v", i, dsn, err)
		}
		conn.Close(ctx)
	}
}

// TestReap: a cluster whose test process is gone (its owner file names a
// process that exited) is stopped and removed by the next Start's reap; a
// cluster whose test process lives is left running.
func TestReap(t *testing.T) {
	dead := Start(t)
	live := Start(t)
	exited := exec.Command("true")
	if err := exited.Run(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dead.Dir, "owner"), []byte(strconv.Itoa(exited.Process.Pid)), 0o600); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	reap(filepath.Dir(dead.Dir))
	t.Logf("reap took %v", time.Since(t0))
	dead.up = false // reaped: the test's cleanup has nothing to stop
	if _, err := os.Stat(dead.Dir); !os.IsNotExist(err) {
		t.Errorf("the dead test's cluster directory %s is still there (%v)", dead.Dir, err)
	}
	if listening(dead.Port) {
		t.Error("the dead test's cluster still listens")
	}
	connect(t, live.DSN).Close(context.Background())
}

// TestSkipOnlyWhenOff: TETHER_TEST_PG=off skips; any other value runs.
func TestSkipOnlyWhenOff(t *testing.T) {
	if os.Getenv(SkipEnv) == "off" {
		t.Skip(SkipEnv + "=off: the PostgreSQL tests are skipped")
	}
	t.Setenv(SkipEnv, "off")
	var skipped bool
	t.Run("off", func(t *testing.T) {
		defer func() { skipped = t.Skipped() }()
		Start(t)
	})
	if !skipped {
		t.Errorf("%s=off did not skip", SkipEnv)
	}
}

// TestMissingBinariesFail: without server binaries Start fails the test,
// naming make deps and the variable; it does not skip it.
func TestMissingBinariesFail(t *testing.T) {
	t.Setenv(SkipEnv, "")
	t.Setenv("PATH", "")
	defer func(old string) { libRoot = old }(libRoot)
	libRoot = t.TempDir()
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Start(r)
	}()
	<-done
	if r.skipped != "" || !strings.Contains(r.fatal, "make deps") || !strings.Contains(r.fatal, SkipEnv+"=off") {
		t.Errorf("Start without binaries: skipped %q, failed %q; want a failure naming make deps and %s=off", r.skipped, r.fatal, SkipEnv)
	}
}

// recorder is a testing.TB whose Fatalf and Skip record and end the
// goroutine, as the real ones do.
type recorder struct {
	testing.TB
	fatal, skipped string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (r *recorder) Skip(args ...any) {
	r.skipped = fmt.Sprint(args...)
	runtime.Goexit()
}

// TestFindBin: PATH first (when it holds both binaries), else the newest
// version under the library root by number, not by name ("9.6" sorts after
// "16" as text), skipping versions without pg_ctl; none found is an error.
func TestFindBin(t *testing.T) {
	root := t.TempDir()
	mk := func(dir string, names ...string) string {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			if err := os.WriteFile(filepath.Join(dir, n), []byte("#!/bin/sh\n"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	lib := filepath.Join(root, "lib")
	mk(filepath.Join(lib, "9.6", "bin"), "initdb", "pg_ctl")
	want := mk(filepath.Join(lib, "16", "bin"), "initdb", "pg_ctl")
	mk(filepath.Join(lib, "17", "bin"), "initdb") // no pg_ctl
	mk(filepath.Join(lib, "common", "bin"), "initdb", "pg_ctl")
	onlyInitdb := mk(filepath.Join(root, "path1"), "initdb")

	if got, err := findBin(onlyInitdb, lib); err != nil || got != want {
		t.Errorf("findBin = %q, %v; want %q", got, err, want)
	}
	both := mk(filepath.Join(root, "path2"), "initdb", "pg_ctl")
	if got, err := findBin(onlyInitdb+string(os.PathListSeparator)+both, lib); err != nil || got != both {
		t.Errorf("with both on PATH: findBin = %q, %v; want %q", got, err, both)
	}
	if got, err := findBin("", filepath.Join(root, "none")); err == nil || !strings.Contains(err.Error(), "initdb") {
		t.Errorf("with none: findBin = %q, %v; want an error naming initdb", got, err)
	}
}

// listening reports whether something accepts TCP connections on the
// port: a server without its files still listens, though it can no longer
// open a session.
func listening(port int) bool {
	conn, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	conn.Close()
	return true
}

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatalf("connecting to %s: %v", dsn, err)
	}
	return conn
}
