package main

// serve --store and $TETHER_STORE (SPEC §11): bbolt:PATH is the file the
// orchestrator serves from; postgres://… without what a pair of
// orchestrators must share is refused, before anything is created and
// without echoing the URL (it may carry a password).

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-run/tether/adapters/store"
)

func TestServeStoreRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	const url = "postgres://tether:hunter2@db.example:5432/tether"
	for _, c := range []struct {
		name string
		args []string
		env  string
		want string
	}{
		{"postgres without a secrets key", []string{"--store", url}, "", "a PostgreSQL store needs --secrets-key-file"},
		{"postgresql without a secrets key", []string{"--store", "postgresql://db/tether"}, "", "a PostgreSQL store needs --secrets-key-file"},
		{"postgres env without a secrets key", nil, url, "a PostgreSQL store needs --secrets-key-file"},
		{"postgres without an admin token file", []string{"--store", url, "--secrets-key-file", "k"}, "", "a PostgreSQL store needs --admin-token-file"},
		{"postgres, a bad URL", []string{"--store", "postgres://hunter2@db:port/x"}, "", "--store: the URL does not parse"},
		{"flag over env", []string{"--store", "postgres://tether:hunter2@db:bad/x"}, "bbolt:" + filepath.Join(t.TempDir(), "x.db"), "--store: the URL does not parse"},
		{"bad advertise", []string{"--store", url, "--secrets-key-file", "k", "--admin-token-file", "a", "--advertise", "10.0.0.5:7420"}, "", "--advertise \"10.0.0.5:7420\": want the base URL"},
		{"short lease", []string{"--store", url, "--leader-lease", "10ms"}, "", "--leader-lease 10ms: want 1s to 10m0s"},
		{"lease without postgres", []string{"--leader-lease", "5s"}, "", "--advertise and --leader-lease are for a PostgreSQL store"},
		{"empty bbolt", []string{"--store", "bbolt:"}, "", "bbolt: names no file"},
		{"unknown kind", []string{"--store", "mysql://hunter2@db"}, "", "unknown kind of store; want bbolt:PATH or postgres://…"},
	} {
		dataDir := filepath.Join(t.TempDir(), "data")
		var stdout, stderr syncBuffer
		args := append([]string{"serve", "--addr", "127.0.0.1:0", "--data-dir", dataDir}, c.args...)
		code := run(ctx, args, &stdout, &stderr, func(k string) string {
			if k == storeEnv {
				return c.env
			}
			return ""
		})
		if code != exitUsage || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%s: exit %d, stderr %q; want exit %d and %q", c.name, code, stderr.String(), exitUsage, c.want)
		}
		if strings.Contains(stderr.String(), "hunter2") {
			t.Errorf("%s: the error echoes the password: %q", c.name, stderr.String())
		}
		if stdout.String() != "" || exists(dataDir) {
			t.Errorf("%s: refused, yet stdout %q and data dir created: %v", c.name, stdout.String(), exists(dataDir))
		}
	}
}

// serve --store bbolt:PATH serves from PATH (its secrets key beside it),
// not from the data directory's tether.db; $TETHER_STORE names it too.
func TestServeStoreBbolt(t *testing.T) {
	for _, viaEnv := range []bool{false, true} {
		dir := t.TempDir()
		dataDir := filepath.Join(dir, "data")
		path := filepath.Join(dir, "elsewhere", "state.db")
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		args := []string{"serve", "--addr", "127.0.0.1:0", "--data-dir", dataDir}
		env := ""
		if viaEnv {
			env = "bbolt:" + path
		} else {
			args = append(args, "--store", "bbolt:"+path)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		var stdout, stderr syncBuffer
		done := make(chan int, 1)
		go func() {
			done <- run(ctx, args, &stdout, &stderr, func(k string) string {
				if k == storeEnv {
					return env
				}
				return ""
			})
		}()
		for !strings.Contains(stdout.String(), "listening") {
			select {
			case code := <-done:
				cancel()
				t.Fatalf("env %v: serve exited %d before listening: %s", viaEnv, code, stderr.String())
			case <-ctx.Done():
				t.Fatalf("env %v: serve never listened: %s", viaEnv, stderr.String())
			case <-time.After(10 * time.Millisecond):
			}
		}
		cancel() // as SIGINT: shut down
		if code := <-done; code != 0 {
			t.Fatalf("env %v: exit %d: %s", viaEnv, code, stderr.String())
		}
		if !strings.Contains(stdout.String(), "(store "+path+")") {
			t.Errorf("env %v: stdout does not name the store %s: %q", viaEnv, path, stdout.String())
		}
		if exists(filepath.Join(dataDir, storeFile)) || exists(filepath.Join(dataDir, storeFile+".secrets-key")) {
			t.Errorf("env %v: a store was made in the data directory, not at %s", viaEnv, path)
		}
		if !exists(path + ".secrets-key") {
			t.Errorf("env %v: no secrets key beside %s", viaEnv, path)
		}
		st, err := store.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		recs, err := st.Load()
		st.Close()
		if err != nil || len(recs) == 0 {
			t.Errorf("env %v: the store at %s holds %d records (%v); the admin token's at least", viaEnv, path, len(recs), err)
		}
	}
}
