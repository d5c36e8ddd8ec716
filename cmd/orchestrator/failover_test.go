package main

// Failover of a highly available group (SPEC §11), with the real binaries:
// a private PostgreSQL cluster, two `serve --store postgres://…` processes
// each under a supervisor loop (restarted when it exits, as systemd would:
// a deposed leader exits 75), three worker processes given both URLs, and
// runs of a workflow mixing a forEach of write-bearing steps and one of
// no-write steps, submitted with the CLI given both URLs. Every step appends
// "<step> <lease>" to a marker file of its own. Mid-run the leader is
// SIGKILLed, or SIGSTOPped past its lease and resumed, or the database is
// restarted. Each time the standby leads soon after the lease lapses (the
// time is logged), the runs end success, every step has its marker, no
// write-bearing step's marker has two lines (it never ran twice), and every
// step reported succeeded has its marker (no committed result lost). The
// paused leader must exit 75 once resumed, and the database's own note of
// each commit (a trigger on every table, by the committing process's
// application_name) must hold none of it after it resumed.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tether-run/tether/adapters/pgtest"
	"github.com/tether-run/tether/client"
)

// Timings of the failover tests. The lease is short so that a takeover is
// quick; the workers' reconnect delay is short so that they find the new
// leader soon after it takes over (their grace window, twice it, is ample).
const (
	failoverLease     = 3 * time.Second
	failoverTimeout   = 150 * time.Second
	failoverExitCode  = 75 // serve's exit code when deposed (EX_TEMPFAIL)
	failoverTakeover  = 5 * time.Second
	failoverFarBeyond = 30 * time.Second // only this late a takeover fails the test
)

// supervised is one `serve` process kept running by a loop, as a supervisor
// would: when it exits it is started again after a moment, with the same
// arguments, until the test ends.
type supervised struct {
	name string
	bin  string
	args []string
	url  string // its advertised base URL, http://127.0.0.1:PORT

	mu     sync.Mutex
	lives  []*life
	gaveUp bool // a process exited with a usage error: restarting cannot help
	stop   chan struct{}
	done   chan struct{}
}

// life is one process of a supervised serve.
type life struct {
	app     string // its sessions' application_name
	cmd     *exec.Cmd
	stdout  *syncBuffer
	stderr  *syncBuffer
	started time.Time
	exited  chan struct{}
	code    int // once exited: its exit code (-1 when killed by a signal)
}

func supervise(t *testing.T, name, bin, url string, args ...string) *supervised {
	s := &supervised{name: name, bin: bin, url: url, args: args, stop: make(chan struct{}), done: make(chan struct{})}
	go s.loop()
	t.Cleanup(func() {
		close(s.stop)
		if l := s.current(); l != nil {
			l.cmd.Process.Kill() // only our own child, by its pid
		}
		<-s.done
		s.mu.Lock()
		defer s.mu.Unlock()
		for i, l := range s.lives {
			if strings.Contains(l.stderr.String(), "WARNING: DATA RACE") {
				t.Errorf("%s (process %d): the race detector found a data race", name, i+1)
			}
			if t.Failed() && (i < 2 || i >= len(s.lives)-2) {
				t.Logf("--- %s, process %d (exit %d) stderr:\n%s", name, i+1, l.code, tail(l.stderr.String(), 8000))
			}
		}
	})
	return s
}

func (s *supervised) loop() {
	defer close(s.done)
	for {
		l := &life{stdout: &syncBuffer{}, stderr: &syncBuffer{}, exited: make(chan struct{}), started: time.Now()}
		l.cmd = exec.Command(s.bin, s.args...)
		l.cmd.Stdout, l.cmd.Stderr = l.stdout, l.stderr
		s.mu.Lock()
		l.app = s.appName(len(s.lives))
		s.mu.Unlock()
		// Its sessions are named in the database (application_name), so
		// that what each process wrote can be told apart (noteWrites).
		l.cmd.Env = append(os.Environ(), "TETHER_ADMIN_TOKEN=", "TETHER_STORE=", "PGAPPNAME="+l.app)
		err := l.cmd.Start()
		s.mu.Lock()
		select {
		case <-s.stop:
			s.mu.Unlock()
			if err == nil {
				l.cmd.Process.Kill()
				l.cmd.Wait()
			}
			return
		default:
		}
		if err == nil {
			s.lives = append(s.lives, l)
		}
		s.mu.Unlock()
		if err == nil {
			l.cmd.Wait()
			l.code = l.cmd.ProcessState.ExitCode()
			close(l.exited)
		}
		if err != nil || l.code == exitUsage { // as systemd's RestartPreventExitStatus would
			s.mu.Lock()
			s.gaveUp = true
			s.mu.Unlock()
			return
		}
		select {
		case <-s.stop:
			return
		case <-time.After(200 * time.Millisecond): // systemd's RestartSec, about
		}
	}
}

// appName names the sessions of its i-th process (from 0).
func (s *supervised) appName(i int) string {
	return strings.ReplaceAll(s.name, " ", "-") + "-" + strconv.Itoa(i+1)
}

// current is the process running now (or last), nil before the first.
func (s *supervised) current() *life {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.lives) == 0 {
		return nil
	}
	return s.lives[len(s.lives)-1]
}

func (s *supervised) signal(t *testing.T, sig syscall.Signal) *life {
	t.Helper()
	l := s.current()
	if l == nil {
		t.Fatalf("%s: no process to signal", s.name)
	}
	if err := l.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("%s: signal %v: %v", s.name, sig, err)
	}
	return l
}

// ready says whether it answers /readyz 200: it leads and serves. It
// fails the test when the supervisor gave up.
func (s *supervised) ready(t *testing.T) bool {
	s.mu.Lock()
	gaveUp := s.gaveUp
	s.mu.Unlock()
	if gaveUp {
		l := s.current()
		t.Fatalf("%s exited %d, not to be restarted:\n%s", s.name, l.code, tail(l.stderr.String(), 4000))
	}
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(s.url + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// freeAddr returns a loopback address no one listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// leaderRow reads the leader table (SPEC §11).
func leaderRow(ctx context.Context, dsn string) (epoch uint64, url string, err error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return 0, "", err
	}
	defer conn.Close(ctx)
	err = conn.QueryRow(ctx, "SELECT epoch, url FROM tether_leader WHERE id = 1").Scan(&epoch, &url)
	return epoch, url, err
}

// failoverRig is the cluster of one scenario.
type failoverRig struct {
	t        *testing.T
	ctx      context.Context
	pg       *pgtest.Cluster
	orchBin  string
	serves   [2]*supervised
	api      *client.Client // given both URLs: it follows the leader
	markers  string         // the steps' marker directories
	dataDirs [2]string
}

func newFailoverRig(t *testing.T, ctx context.Context) *failoverRig {
	t.Helper()
	orchBin, workerBin := buildFailoverBinaries(t, ctx)
	pg := pgtest.Start(t)
	dir := t.TempDir()
	r := &failoverRig{t: t, ctx: ctx, pg: pg, orchBin: orchBin, markers: filepath.Join(dir, "markers")}
	if err := os.MkdirAll(r.markers, 0o700); err != nil {
		t.Fatal(err)
	}
	// What a standby needs to take over (SPEC §11, §14a): the database, the
	// secrets key, and (for the operator) the same admin token.
	var key, admin [32]byte
	rand.Read(key[:])
	rand.Read(admin[:])
	keyFile := filepath.Join(dir, "secrets-key")
	if err := os.WriteFile(keyFile, []byte(hex.EncodeToString(key[:])+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	adminToken := hex.EncodeToString(admin[:])
	adminFile := filepath.Join(dir, "admin-token")
	if err := os.WriteFile(adminFile, []byte(adminToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var urls []string
	for i := range r.serves {
		addr := freeAddr(t)
		url := "http://" + addr
		urls = append(urls, url)
		r.dataDirs[i] = filepath.Join(dir, fmt.Sprintf("data-%d", i))
		if err := os.MkdirAll(r.dataDirs[i], 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(r.dataDirs[i], adminTokenFile), []byte(adminToken+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("serve %c", 'A'+i)
		r.serves[i] = supervise(t, name, orchBin, url, "serve", "--addr", addr, "--advertise", url, "--data-dir", r.dataDirs[i],
			"--store", pg.DSN, "--leader-lease", failoverLease.String(), "--secrets-key-file", keyFile, "--admin-token-file", adminFile, "--log-level", "debug")
		if i == 0 {
			// A leads first: the scenarios fault the leader, whichever it is.
			poll(t, ctx, "serve A to lead", func() bool { return r.serves[0].ready(t) })
		}
	}
	api, err := client.New(urls[0], adminToken, client.WithURLs(urls[1]))
	if err != nil {
		t.Fatal(err)
	}
	r.api = api
	for i := range 3 {
		tok, err := api.CreateToken(ctx, fmt.Sprintf("w%d", i+1), 10*time.Minute)
		if err != nil {
			t.Fatalf("token create: %v", err)
		}
		start(t, ctx, fmt.Sprintf("worker w%d", i+1), workerBin, "connect",
			"--url", "ws://"+strings.TrimPrefix(urls[0], "http://")+"/control",
			"--url", "ws://"+strings.TrimPrefix(urls[1], "http://")+"/control",
			"--token", tok.Token, "--tags", "script", "--slots", "8", "--max-reconnect-delay", "3s",
			"--state-dir", filepath.Join(dir, fmt.Sprintf("worker-%d", i+1)))
	}
	poll(t, ctx, "the three workers to connect", func() bool {
		l, err := api.Workers(ctx)
		if err != nil {
			return false
		}
		n := 0
		for _, w := range l.Workers {
			if w.State == "connected" {
				n++
			}
		}
		return n == 3
	})
	return r
}

// noteWrites makes every table of the store but the leader table note each
// statement that changes it, in failover_writes: the session's
// application_name and the database's clock. A note is kept only if the
// statement's transaction commits: it is a record of commits, by process.
func (r *failoverRig) noteWrites() {
	r.t.Helper()
	conn, err := pgx.Connect(r.ctx, r.pg.DSN)
	if err != nil {
		r.t.Fatal(err)
	}
	defer conn.Close(r.ctx)
	for _, q := range []string{
		`CREATE TABLE failover_writes (app text NOT NULL, at timestamptz NOT NULL, tbl text NOT NULL)`,
		`CREATE FUNCTION failover_note() RETURNS trigger LANGUAGE plpgsql AS $$
		 BEGIN
		   INSERT INTO failover_writes VALUES (current_setting('application_name'), clock_timestamp(), TG_TABLE_NAME);
		   RETURN NULL;
		 END $$`,
		`DO $$ DECLARE t text;
		 BEGIN
		   FOR t IN SELECT tablename FROM pg_tables WHERE schemaname = current_schema()
		            AND tablename NOT IN ('tether_leader', 'failover_writes') LOOP
		     EXECUTE format('CREATE TRIGGER failover_note AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON %I
		                     FOR EACH STATEMENT EXECUTE FUNCTION failover_note()', t);
		   END LOOP;
		 END $$`,
	} {
		if _, err := conn.Exec(r.ctx, q); err != nil {
			r.t.Fatalf("noting writes: %v", err)
		}
	}
}

// commitsSince returns the tables that a process (by application_name)
// committed a change to at or after the database's time since.
func (r *failoverRig) commitsSince(app string, since time.Time) []string {
	r.t.Helper()
	conn, err := pgx.Connect(r.ctx, r.pg.DSN)
	if err != nil {
		r.t.Fatal(err)
	}
	defer conn.Close(r.ctx)
	var tbls []string
	rows, err := conn.Query(r.ctx, `SELECT tbl || ' at ' || at::text FROM failover_writes WHERE app = $1 AND at >= $2 ORDER BY at`, app, since)
	if err != nil {
		r.t.Fatal(err)
	}
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			r.t.Fatal(err)
		}
		tbls = append(tbls, s)
	}
	if err := rows.Err(); err != nil {
		r.t.Fatal(err)
	}
	return tbls
}

// dbNow reads the database's clock.
func (r *failoverRig) dbNow() time.Time {
	r.t.Helper()
	conn, err := pgx.Connect(r.ctx, r.pg.DSN)
	if err != nil {
		r.t.Fatal(err)
	}
	defer conn.Close(r.ctx)
	var now time.Time
	if err := conn.QueryRow(r.ctx, "SELECT clock_timestamp()").Scan(&now); err != nil {
		r.t.Fatal(err)
	}
	return now
}

// leader returns the serve that leads now, by the leader table.
func (r *failoverRig) leader() (*supervised, uint64) {
	r.t.Helper()
	epoch, url, err := leaderRow(r.ctx, r.pg.DSN)
	if err != nil {
		r.t.Fatalf("the leader table: %v", err)
	}
	for _, s := range r.serves {
		if s.url == url {
			return s, epoch
		}
	}
	r.t.Fatalf("the leader table names %q, neither serve", url)
	return nil, 0
}

// submit submits runs runs of one workflow, each a forEach of writes
// write-bearing steps and one of noWrites no-write steps, with the CLI
// given both URLs; it returns the runs' ids. (One submission expands to at
// most 1,000 steps, child runs included, SPEC §12: 2,000 steps are two
// runs.) Each step appends "<name>[<item>] <lease>" to its own marker file,
// in a directory of its own; the items are unique across the runs.
// midRun submits the scenarios' 2,000 steps — two runs of 500
// write-bearing and 500 no-write steps, as a submission expands to at most
// 1,000 (SPEC §12) — and returns once a quarter of them have run.
func (r *failoverRig) midRun() (ids []string, steps int) {
	const runs, writes, noWrites = 2, 500, 500
	ids = r.submit(runs, writes, noWrites)
	steps = runs * (writes + noWrites)
	r.waitMarkers(steps / 4)
	return ids, steps
}

func (r *failoverRig) submit(runs, writes, noWrites int) []string {
	r.t.Helper()
	dir := r.t.TempDir()
	items := func(run, n int) string {
		var b strings.Builder
		for i := range n {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "\"%d-%d\"", run, i)
		}
		return b.String()
	}
	var ids []string
	for k := range runs {
		src := fmt.Sprintf(`name: failover
env: {MARKERS: %q}
steps:
  - name: w
    writes: true
    forEach: [%s]
    run: |
      d="$MARKERS/w-$TETHER_ITEM"
      mkdir -p "$d"
      echo "w[$TETHER_ITEM] $TETHER_LEASE" >> "$d/marker"
  - name: n
    forEach: [%s]
    run: |
      d="$MARKERS/n-$TETHER_ITEM"
      mkdir -p "$d"
      echo "n[$TETHER_ITEM] $TETHER_LEASE" >> "$d/marker"
`, r.markers, items(k, writes), items(k, noWrites))
		file := filepath.Join(dir, fmt.Sprintf("failover-%d.yaml", k))
		if err := os.WriteFile(file, []byte(src), 0o600); err != nil {
			r.t.Fatal(err)
		}
		args := []string{"run", "submit", file, "--data-dir", r.dataDirs[0]}
		for _, s := range r.serves {
			args = append(args, "--url", s.url)
		}
		out, errOut, code := orchCLI(r.t, r.ctx, r.orchBin, args...)
		if code != 0 {
			r.t.Fatalf("run submit: exit %d\n%s", code, errOut)
		}
		ids = append(ids, strings.TrimSpace(out))
	}
	return ids
}

// markerCount counts the steps that have a marker.
func (r *failoverRig) markerCount() int {
	ents, _ := os.ReadDir(r.markers)
	return len(ents)
}

// waitMarkers waits until n steps have their marker.
func (r *failoverRig) waitMarkers(n int) {
	r.t.Helper()
	poll(r.t, r.ctx, fmt.Sprintf("%d steps to run", n), func() bool { return r.markerCount() >= n })
}

// takenOver waits until a serve leads with an epoch past oldEpoch (the
// other one, or old itself restarted by its supervisor, a standby like any
// other), and logs how long after since that took; only far beyond the
// lease plus failoverTakeover is that a failure.
func (r *failoverRig) takenOver(oldEpoch uint64, since time.Time, what string) *supervised {
	r.t.Helper()
	var next *supervised
	poll(r.t, r.ctx, "a standby to lead", func() bool {
		epoch, url, err := leaderRow(r.ctx, r.pg.DSN)
		if err != nil || epoch <= oldEpoch {
			return false
		}
		for _, s := range r.serves {
			if s.url == url && s.ready(r.t) {
				next = s
				return true
			}
		}
		return false
	})
	took := time.Since(since)
	r.t.Logf("%s: %s leads %v after it (lease %v; the goal: within the lease + %v)", what, next.name, took.Round(time.Millisecond), failoverLease, failoverTakeover)
	if took > failoverLease+failoverFarBeyond {
		r.t.Fatalf("%s: the standby took %v to lead, far beyond the lease (%v) + %v", what, took, failoverLease, failoverTakeover)
	}
	return next
}

// finish waits for the runs to end and checks them and the markers: each
// ends success; every step succeeded and has its marker; no write-bearing
// step's marker has two lines; there are as many markers as steps.
func (r *failoverRig) finish(runs []string, steps int) {
	r.t.Helper()
	var problems []string
	seen := 0
	for _, run := range runs {
		var det *client.RunDetail
		poll(r.t, r.ctx, run+" to finish", func() bool {
			d, err := r.api.Run(r.ctx, run)
			if err != nil {
				return false // between leaders
			}
			det = d
			return !d.Run.FinishedAt.IsZero()
		})
		if det.Status != "success" {
			problems = append(problems, fmt.Sprintf("%s ended %s, want success", run, det.Status))
		}
		for _, s := range det.Steps {
			seen++
			b, err := os.ReadFile(filepath.Join(r.markers, s.Name+"-"+s.Item, "marker"))
			lines := strings.Count(string(b), "\n")
			switch {
			case s.State != "success":
				problems = append(problems, fmt.Sprintf("%s: %s %s %s", s.ID, s.State, s.Class, s.Message))
			case err != nil:
				problems = append(problems, fmt.Sprintf("%s succeeded without its marker: %v", s.ID, err))
			}
			if s.Writes && lines > 1 {
				problems = append(problems, fmt.Sprintf("write-bearing %s ran %d times:\n%s", s.ID, lines, b))
			}
		}
	}
	if seen != steps {
		problems = append(problems, fmt.Sprintf("%d steps in the runs, want %d", seen, steps))
	}
	if n := r.markerCount(); n != steps {
		problems = append(problems, fmt.Sprintf("%d markers, want %d", n, steps))
	}
	if len(problems) > 10 {
		problems = append(problems[:10], fmt.Sprintf("… and %d more", len(problems)-10))
	}
	if len(problems) > 0 {
		r.t.Fatalf("after the failover:\n  %s", strings.Join(problems, "\n  "))
	}
}

// TestFailoverLeaderKilled: the leader is SIGKILLed mid-run (SPEC §11).
func TestFailoverLeaderKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binaries")
	}
	ctx, cancel := context.WithTimeout(t.Context(), failoverTimeout)
	defer cancel()
	r := newFailoverRig(t, ctx)
	ids, steps := r.midRun()
	old, epoch := r.leader()
	r.t.Logf("killing %s (epoch %d) with %d of %d steps run", old.name, epoch, r.markerCount(), steps)
	killed := time.Now()
	old.signal(t, syscall.SIGKILL)
	r.takenOver(epoch, killed, "SIGKILL")
	r.finish(ids, steps)
}

// TestFailoverLeaderPaused: the leader is SIGSTOPped for longer than its
// lease, then resumed: by then the standby leads (a newer epoch), and the
// old leader commits nothing more: it exits 75 (deposed) and its supervisor
// starts it again as a standby.
func TestFailoverLeaderPaused(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binaries")
	}
	ctx, cancel := context.WithTimeout(t.Context(), failoverTimeout)
	defer cancel()
	r := newFailoverRig(t, ctx)
	r.noteWrites()
	ids, steps := r.midRun()
	old, epoch := r.leader()
	r.t.Logf("stopping %s (epoch %d) with %d of %d steps run", old.name, epoch, r.markerCount(), steps)
	stopped := time.Now()
	paused := old.signal(t, syscall.SIGSTOP)
	if next := r.takenOver(epoch, stopped, "SIGSTOP"); next == old {
		t.Fatalf("%s leads while it is stopped", old.name)
	}
	resumed := r.dbNow()
	old.signal(t, syscall.SIGCONT)
	select {
	case <-paused.exited:
	case <-ctx.Done():
		t.Fatalf("%s resumed after it was deposed and did not exit", old.name)
	}
	if paused.code != failoverExitCode {
		t.Fatalf("%s resumed deposed and exited %d, want %d:\n%s", old.name, paused.code, failoverExitCode, tail(paused.stderr.String(), 4000))
	}
	if !strings.Contains(strings.ToLower(paused.stderr.String()), "depose") {
		t.Errorf("%s exited %d without saying it was deposed:\n%s", old.name, paused.code, tail(paused.stderr.String(), 4000))
	}
	if now, _ := r.leader(); now == old {
		t.Fatalf("%s leads again", old.name)
	}
	if len(r.commitsSince(paused.app, time.Time{})) == 0 {
		t.Fatalf("no commit of %s is noted, not even before its pause: the notes do not work", old.name)
	}
	if c := r.commitsSince(paused.app, resumed); len(c) > 0 {
		t.Fatalf("%s committed after it resumed, deposed:\n  %s", old.name, strings.Join(c, "\n  "))
	}
	r.finish(ids, steps)
}

// TestFailoverDatabaseRestarted: the database restarts mid-run; the
// orchestrators ride it out (a leader whose commit's fate is unknown exits
// 75 and comes back as a standby) and the run finishes.
func TestFailoverDatabaseRestarted(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binaries")
	}
	ctx, cancel := context.WithTimeout(t.Context(), failoverTimeout)
	defer cancel()
	r := newFailoverRig(t, ctx)
	ids, steps := r.midRun()
	_, epoch := r.leader()
	r.t.Logf("restarting the database (epoch %d) with %d of %d steps run", epoch, r.markerCount(), steps)
	began := time.Now()
	r.pg.Restart(t)
	// The leader exits 75 when a commit's fate is unknown (then a standby
	// takes over, a new epoch); one that had nothing in flight rides the
	// restart out and leads on.
	var now uint64
	poll(t, ctx, "an orchestrator to lead after the restart", func() bool {
		e, url, err := leaderRow(ctx, r.pg.DSN)
		if err != nil {
			return false
		}
		for _, s := range r.serves {
			if s.url == url && s.ready(t) {
				now = e
				return true
			}
		}
		return false
	})
	t.Logf("database restart: epoch %d → %d; a leader serves %v after the restart began", epoch, now, time.Since(began).Round(time.Millisecond))
	r.finish(ids, steps)
}

// The failover tests' worker binary is built without the race detector even
// when the test runs under it: each of their steps execs the worker binary
// as its shim (SPEC §10), and 2,000 shims under the race detector are most
// of a minute on 2 cores. The orchestrators still run race-built, and the
// worker's code runs under the race detector in its own tests.
var (
	plainWorkerOnce sync.Once
	plainWorker     string
	plainWorkerErr  error
)

func buildFailoverBinaries(t *testing.T, ctx context.Context) (orch, work string) {
	t.Helper()
	orch, work = buildBinaries(t, ctx)
	if !raceBuild {
		return orch, work
	}
	plainWorkerOnce.Do(func() {
		dir := filepath.Join(binDir, "plain")
		goBin, err := exec.LookPath("go")
		if err != nil {
			goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		cmd := exec.CommandContext(ctx, goBin, "build", "-o", dir+string(filepath.Separator), "./cmd/worker")
		cmd.Dir = filepath.Join("..", "..") // the module root
		if out, err := cmd.CombinedOutput(); err != nil {
			plainWorkerErr = fmt.Errorf("go build: %v\n%s", err, out)
			return
		}
		plainWorker = filepath.Join(dir, "worker")
	})
	if plainWorkerErr != nil {
		t.Fatal(plainWorkerErr)
	}
	return orch, plainWorker
}
