package main

// Two serve processes on one PostgreSQL store (SPEC §7, §11): one leads,
// the other stands by — /readyz 503 naming the leader, a worker endpoint
// 503 with Tether-Leader, the operator API 307 to the leader. The leader
// killed (SIGKILL), the standby takes over and holds the run submitted
// before; a restarted one comes back as a standby; a leader paused past
// its lease is deposed and exits 75 once resumed; a leader shut down
// resigns, so the standby takes over at once; a leader whose database is
// gone exits 75.

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tether-run/tether/adapters/pglead"
	"github.com/tether-run/tether/adapters/pgstore"
	"github.com/tether-run/tether/adapters/pgtest"
)

func TestServeLeaderStandby(t *testing.T) {
	c := pgtest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*e2eTimeout)
	defer cancel()
	orchBin, _ := buildBinaries(t, ctx)
	shared := t.TempDir()         // what every orchestrator of the store names: the secrets key, the admin token
	const lease = 3 * time.Second // renewed every 750 ms: a loaded machine does not depose the leader by accident
	n := 0
	serveOne := func() (*proc, string) {
		t.Helper()
		n++
		name := "orchestrator-" + string(rune('a'+n-1))
		p := start(t, ctx, name, orchBin, "serve", "--addr", "127.0.0.1:0", "--data-dir", filepath.Join(t.TempDir(), "data"),
			"--store", c.DSN, "--secrets-key-file", filepath.Join(shared, "secrets-key"),
			"--admin-token-file", filepath.Join(shared, "admin-token"), "--leader-lease", lease.String())
		var url string
		at := regexp.MustCompile(`advertised as (http://[0-9.:]+)\)`)
		poll(t, ctx, name+" standing by", func() bool {
			m := at.FindStringSubmatch(p.stdout.String())
			if m != nil {
				url = m[1]
			}
			return m != nil
		})
		return p, url
	}
	// No keep-alive: processes are killed and started again, and a
	// connection kept to a dead one answers its next request with EOF.
	noRedirect := &http.Client{Transport: &http.Transport{DisableKeepAlives: true},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(url string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	readyz := func(url string) (int, string) {
		resp, body := get(url + "/readyz")
		return resp.StatusCode, strings.TrimSpace(body)
	}
	leads := func(p *proc, url string) func() bool {
		return func() bool {
			code, _ := readyz(url)
			return code == http.StatusOK && strings.Contains(p.stdout.String(), "listening on")
		}
	}
	// standsBy checks what a standby answers while leader leads.
	standsBy := func(url, leader string) {
		t.Helper()
		poll(t, ctx, "the standby to name the leader", func() bool {
			code, body := readyz(url)
			return code == http.StatusServiceUnavailable && body == "standby; leader at "+leader
		})
		if resp, body := get(url + "/livez"); resp.StatusCode != http.StatusOK {
			t.Errorf("standby /livez: %d %q", resp.StatusCode, body)
		}
		for _, path := range []string{"/control", "/data/x"} {
			resp, body := get(url + path)
			if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Tether-Leader") != leader || !strings.Contains(body, `"error":"standby"`) {
				t.Errorf("standby %s: %d, Tether-Leader %q, %q; want 503, %s, error standby", path, resp.StatusCode, resp.Header.Get("Tether-Leader"), body, leader)
			}
		}
		resp, _ := get(url + "/api/runs?limit=1")
		if resp.StatusCode != http.StatusTemporaryRedirect || resp.Header.Get("Location") != leader+"/api/runs?limit=1" || resp.Header.Get("Tether-Leader") != leader {
			t.Errorf("standby /api/runs: %d, Location %q, Tether-Leader %q; want 307 to %s/api/runs?limit=1", resp.StatusCode, resp.Header.Get("Location"), resp.Header.Get("Tether-Leader"), leader)
		}
	}
	cli := func(url string, args ...string) string {
		t.Helper()
		p := start(t, ctx, "cli", orchBin, append(args, "--url", url, "--data-dir", shared)...)
		if code := p.wait(t, ctx); code != exitOK {
			t.Fatalf("orchestrator %s --url %s: exit %d: %s", strings.Join(args, " "), url, code, p.stderr)
		}
		return p.stdout.String()
	}

	a, aURL := serveOne()
	poll(t, ctx, "a to lead", leads(a, aURL))
	b, bURL := serveOne()
	standsBy(bURL, aURL)
	if strings.Contains(b.stdout.String(), "listening on") {
		t.Fatalf("b leads beside a: %s", b.stdout)
	}
	dag := filepath.Join(t.TempDir(), "held.yaml")
	if err := os.WriteFile(dag, []byte("steps:\n  - name: held\n    tags: [nobody-has-this]\n    run: true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	run := strings.TrimSpace(cli(aURL, "run", "submit", dag))

	// The leader killed: the standby leads once the lease lapsed.
	killed := time.Now()
	a.signal(t, syscall.SIGKILL)
	poll(t, ctx, "b to lead", leads(b, bURL))
	t.Logf("b leads %s after a was killed (lease %s; SPEC §11 wants at most lease + 5 s)", time.Since(killed).Round(time.Millisecond), lease)
	if !strings.Contains(b.stdout.String(), "leading: epoch 2") {
		t.Errorf("b's take-over is not epoch 2: %s", b.stdout)
	}
	if _, m := get(bURL + "/metrics"); !regexp.MustCompile(`(?m)^tether_leader 1$`).MatchString(m) || !regexp.MustCompile(`(?m)^tether_leader_epoch 2$`).MatchString(m) {
		t.Errorf("b's /metrics lacks tether_leader 1 and tether_leader_epoch 2 (SPEC §16)")
	}
	if out := cli(bURL, "run", "show", run); !strings.Contains(out, run) {
		t.Errorf("the run submitted to a before it was killed is not on b: %q", out)
	}

	// a, restarted (as its supervisor would), stands by.
	a2, a2URL := serveOne()
	standsBy(a2URL, bURL)

	// b paused past its lease: a2 takes over; b, resumed, is deposed.
	b.signal(t, syscall.SIGSTOP)
	poll(t, ctx, "a2 to lead", leads(a2, a2URL))
	b.signal(t, syscall.SIGCONT)
	if code := b.wait(t, ctx); code != exitDeposed || !strings.Contains(b.stderr.String(), "deposed") {
		t.Errorf("b, deposed while paused: exit %d, stderr %s; want exit %d saying deposed", code, b.stderr, exitDeposed)
	}
	if out := cli(a2URL, "run", "show", run); !strings.Contains(out, run) {
		t.Errorf("the run is not on a2: %q", out)
	}

	// a2 shut down resigns: a standby leads at once, not a lease later.
	b2, b2URL := serveOne()
	standsBy(b2URL, a2URL)
	a2.signal(t, syscall.SIGTERM)
	if code := a2.wait(t, ctx); code != exitOK {
		t.Errorf("a2 on SIGTERM: exit %d: %s", code, a2.stderr)
	}
	// At a2's exit its lease has ended: the row is a2's, lapsed, or b2's.
	conn, err := pgx.Connect(ctx, c.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var epoch int64
	var lapsed bool
	if err := conn.QueryRow(ctx, "SELECT epoch, expires_at <= now() FROM tether_leader WHERE id = 1").Scan(&epoch, &lapsed); err != nil {
		t.Fatal(err)
	}
	if epoch == 3 && !lapsed {
		t.Errorf("a2 exited on SIGTERM still holding its lease (epoch 3): it did not resign")
	}
	poll(t, ctx, "b2 to lead", leads(b2, b2URL))
	if !strings.Contains(b2.stdout.String(), "leading: epoch 4") {
		t.Errorf("b2's take-over is not epoch 4: %s", b2.stdout)
	}

	// The database gone: b2 can prove nothing, so it stops leading.
	conn.Close(ctx)
	c.Stop(t)
	if code := b2.wait(t, ctx); code != exitDeposed || !strings.Contains(b2.stderr.String(), "stopped leading") {
		t.Errorf("b2 without its database: exit %d, stderr %s; want exit %d, stopped leading", code, b2.stderr, exitDeposed)
	}
}

// A leader paused inside a write transaction holds the leader row FOR KEY SHARE
// (the fence): the server ends its session after a lease idle, so a
// standby's take-over does not wait for it to resume.
func TestLeaderSessionPausedInTransaction(t *testing.T) {
	if got := leaderDSN("postgres://h/db?idle_in_transaction_session_timeout=5000", time.Second); got != "postgres://h/db?idle_in_transaction_session_timeout=5000" {
		t.Errorf("leaderDSN overrode the URL's own timeout: %s", got)
	}
	c := pgtest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := pgstore.Migrate(ctx, c.DSN); err != nil {
		t.Fatal(err)
	}
	paused, err := pgx.Connect(ctx, leaderDSN(c.DSN, time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer paused.Close(context.Background())
	tx, err := paused.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT epoch FROM tether_leader WHERE id = 1 FOR KEY SHARE"); err != nil {
		t.Fatal(err)
	}
	// The transaction stays open, as a paused process leaves it.
	pool, err := pgxpool.New(ctx, c.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	epoch, ok, err := pglead.New(pool, pglead.Config{URL: "http://b", Lease: time.Hour}).TryTakeOver(ctx)
	if !ok || err != nil || epoch != 1 {
		t.Fatalf("a take-over behind a paused leader's transaction: ok %v epoch %d, %v; want epoch 1 once the server ended that session", ok, epoch, err)
	}
}

// TestServeRefusesAnotherKeyOrToken: every orchestrator of a PostgreSQL
// store must name the same secrets key and admin token (SPEC §11): one
// with another admin-token file, or another key, exits 2 naming the flag
// and resigns, and the store keeps the first token (it is not reset).
func TestServeRefusesAnotherKeyOrToken(t *testing.T) {
	c := pgtest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), e2eTimeout)
	defer cancel()
	orchBin, _ := buildBinaries(t, ctx)
	first, other := t.TempDir(), t.TempDir()
	serve := func(name, keyDir, tokenDir string) *proc {
		return start(t, ctx, name, orchBin, "serve", "--addr", "127.0.0.1:0", "--data-dir", filepath.Join(t.TempDir(), "data"),
			"--store", c.DSN, "--secrets-key-file", filepath.Join(keyDir, "secrets-key"),
			"--admin-token-file", filepath.Join(tokenDir, "admin-token"), "--leader-lease", "2s")
	}
	a := serve("orchestrator-a", first, first)
	var url string
	at := regexp.MustCompile(`workers connect to: ws://([0-9.:]+)/control`)
	poll(t, ctx, "a to lead", func() bool {
		m := at.FindStringSubmatch(a.stdout.String())
		if m != nil {
			url = "http://" + m[1]
		}
		return m != nil
	})
	dag := filepath.Join(t.TempDir(), "sealed.yaml") // a run's record is sealed with the key (SPEC §14a)
	if err := os.WriteFile(dag, []byte("env:\n  K: v\nsteps:\n  - name: held\n    tags: [nobody-has-this]\n    run: true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if p := start(t, ctx, "cli", orchBin, "run", "submit", dag, "--url", url, "--data-dir", first); p.wait(t, ctx) != exitOK {
		t.Fatalf("run submit: %s", p.stderr)
	}
	a.signal(t, syscall.SIGTERM) // resigns: the next one leads at once
	if code := a.wait(t, ctx); code != exitOK {
		t.Fatalf("a on SIGTERM: exit %d: %s", code, a.stderr)
	}
	for _, tc := range []struct {
		name, keyDir, tokenDir, flag string
	}{
		{"another-admin-token", first, other, "--admin-token-file"},
		{"another-secrets-key", other, first, "--secrets-key-file"},
	} {
		p := serve(tc.name, tc.keyDir, tc.tokenDir)
		if code := p.wait(t, ctx); code != exitUsage || !strings.Contains(p.stderr.String(), tc.flag) {
			t.Errorf("%s: exit %d, stderr %q; want exit %d naming %s", tc.name, code, p.stderr, exitUsage, tc.flag)
		}
	}
	// The first token still leads, and was not reset.
	b := serve("orchestrator-b", first, first)
	poll(t, ctx, "b to lead", func() bool { return strings.Contains(b.stdout.String(), "leading: epoch") })
	m := at.FindStringSubmatch(b.stdout.String())
	if p := start(t, ctx, "cli", orchBin, "run", "list", "--url", "http://"+m[1], "--data-dir", first); p.wait(t, ctx) != exitOK {
		t.Errorf("run list with the first admin token after the refused starts: %s", p.stderr)
	}
}
