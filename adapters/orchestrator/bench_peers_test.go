package orchestrator_test

// The end-to-end benchmark's store, and its peers.
//
// $TETHER_BENCH_STORE chooses the store BenchmarkEndToEnd runs on (`make
// bench` runs it with "bbolt", then with its STORE, "postgres" unless
// told otherwise): empty or "bbolt", a bbolt file per rig;
// "postgres", a private PostgreSQL cluster on loopback started for the
// benchmark (adapters/pgtest: fsync=on, synchronous_commit=on), a fresh
// database per rig; a postgres:// URL, that server, on which each rig
// creates a database of its own and drops it after. On PostgreSQL the
// orchestrator holds the lead as `serve` does (SPEC §11): it takes the
// leader row's epoch and opens the store with it, so every commit checks
// the epoch.
//
// The peers are other job systems in the same shapes (bench/peers, a
// module of its own so that their dependencies stay out of Tether's), run
// after Tether's figures at each shape's concurrency (benchShapes: 64 and
// 4), 20,000 no-op jobs each, idle latency from 100 single jobs at the
// first shape: River (bench/peers/river) on the same PostgreSQL cluster
// when the store is PostgreSQL; and, when $BENCH_PEERS asks for them
// beside the default store (peersWanted), asynq (bench/peers/asynq) on a
// private Redis server without fsync and on one with appendfsync always
// (startRedis), and River on a private cluster. River runs in two
// submission shapes: "river", its jobs going in as Tether's runs are
// submitted, 200 at a time, one InsertMany after the other (Tether's 100
// runs of 200 steps); and "river-insert", one Insert per job (each its own
// transaction, as issue 16 measured River) by 200 goroutines at once. asynq
// has no batch enqueue, so its 20,000 are enqueued by 200 goroutines at
// once.

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tether-run/tether/adapters/pglead"
	"github.com/tether-run/tether/adapters/pgstore"
	"github.com/tether-run/tether/adapters/pgtest"
	"github.com/tether-run/tether/adapters/store"
)

// Variables of the benchmark's environment.
const (
	benchStoreEnv = "TETHER_BENCH_STORE"
	benchPeersEnv = "BENCH_PEERS"
	// benchPipelineEnv sets the PostgreSQL store's pipeline depth
	// (pgstore.Options.Pipeline; empty: its default).
	benchPipelineEnv = "TETHER_BENCH_PG_PIPELINE"
	// benchFoldDelayEnv sets the PostgreSQL store's journal fold delay
	// (pgstore.Options.FoldDelay, a Go duration; empty: its default).
	benchFoldDelayEnv = "TETHER_BENCH_PG_FOLD_DELAY"
)

// benchStore is where the benchmark's rigs keep their state; nil is bbolt.
type benchStore struct {
	name string // "postgres" or the server's URL without its credentials
	// newDB makes a fresh, empty database and returns its DSN.
	newDB func(tb testing.TB) string
}

// benchStoreFromEnv reads $TETHER_BENCH_STORE; tb's cleanup stops the
// cluster it starts.
func benchStoreFromEnv(tb testing.TB) *benchStore {
	tb.Helper()
	v := os.Getenv(benchStoreEnv)
	switch {
	case v == "" || v == "bbolt":
		return nil
	case v == "postgres":
		c := pgtest.Start(tb)
		return &benchStore{name: "postgres", newDB: c.NewDatabase}
	case strings.HasPrefix(v, "postgres://") || strings.HasPrefix(v, "postgresql://"):
		u, err := url.Parse(v)
		if err != nil {
			tb.Fatalf("%s: %v", benchStoreEnv, err)
		}
		return &benchStore{name: u.Redacted(), newDB: serverDatabases(u)}
	}
	tb.Fatalf("%s=%q: want bbolt, postgres (a private cluster) or a postgres:// URL", benchStoreEnv, v)
	return nil
}

// serverDatabases makes each new database on the server at u, named for
// this process, and drops it when the test ends.
func serverDatabases(u *url.URL) func(tb testing.TB) string {
	var mu sync.Mutex
	n := 0
	return func(tb testing.TB) string {
		tb.Helper()
		mu.Lock()
		n++
		name := fmt.Sprintf("tether_bench_%d_%d", os.Getpid(), n)
		mu.Unlock()
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, u.String())
		if err != nil {
			tb.Fatal(err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() {
			conn, err := pgx.Connect(ctx, u.String())
			if err != nil {
				tb.Error(err)
				return
			}
			defer conn.Close(ctx)
			if _, err := conn.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
				tb.Error(err)
			}
		})
		db := *u
		db.Path = "/" + name
		return db.String()
	}
}

// open opens a fresh store: a bbolt file when bs is nil, else a new
// PostgreSQL database that the caller leads, with the epoch it took.
func (bs *benchStore) open(tb testing.TB) store.Backend {
	tb.Helper()
	if bs == nil {
		st, err := store.Open(filepath.Join(tb.TempDir(), "tether.db"))
		if err != nil {
			tb.Fatal(err)
		}
		return st
	}
	dsn := bs.newDB(tb)
	ctx := context.Background()
	st, err := pgstore.Open(ctx, dsn, pgstore.Options{}) // runs the migrations
	if err != nil {
		tb.Fatal(err)
	}
	// Take the lead as a standby does once the lease has lapsed (SPEC §11),
	// for an hour: the benchmark needs no renewals.
	epoch, ok, err := pglead.New(st.Pool(), pglead.Config{Holder: "bench", Lease: time.Hour}).TryTakeOver(ctx)
	st.Close()
	if err != nil || !ok {
		tb.Fatalf("taking the lead: ok %v, %v", ok, err)
	}
	depth := 0 // pgstore's default
	if v := os.Getenv(benchPipelineEnv); v != "" {
		if depth, err = strconv.Atoi(v); err != nil || depth < 1 {
			tb.Fatalf("%s=%q: want the number of groups in flight at once (1: one at a time)", benchPipelineEnv, v)
		}
	}
	var fold time.Duration // pgstore's default
	if v := os.Getenv(benchFoldDelayEnv); v != "" {
		if fold, err = time.ParseDuration(v); err != nil || fold <= 0 {
			tb.Fatalf("%s=%q: want a positive duration (e.g. 100ms)", benchFoldDelayEnv, v)
		}
	}
	st, err = pgstore.Open(ctx, dsn, pgstore.Options{Epoch: epoch, Pipeline: depth, FoldDelay: fold})
	if err != nil {
		tb.Fatal(err)
	}
	return st
}

// The peers and their configurations. Each runs at every shape's
// concurrency (benchShapes), latency samples only at the first.
var benchPeerList = []struct {
	name string // the sub-benchmark's peer=NAME (bench/report reads it)
	prog string // bench/peers/PROG
	// server starts what the peer runs against on a fresh, empty
	// server and returns the program's flags for it; bs is the store of
	// Tether's figures (nil: bbolt).
	server func(tb testing.TB, bs *benchStore) []string
}{
	{"river", "river", func(tb testing.TB, bs *benchStore) []string {
		if bs != nil {
			return []string{"-dsn", bs.newDB(tb), "-batch", strconv.Itoa(benchRunSize)} // the same cluster
		}
		return []string{"-dsn", pgtest.Start(tb).DSN, "-batch", strconv.Itoa(benchRunSize)}
	}},
	{"river-insert", "river", func(tb testing.TB, bs *benchStore) []string {
		// One Insert (one transaction) per job, as issue 16's point measured
		// River, by as many inserters at once as a run of Tether's has steps.
		args := []string{"-batch", "1", "-inserters", strconv.Itoa(benchRunSize)}
		if bs != nil {
			return append(args, "-dsn", bs.newDB(tb))
		}
		return append(args, "-dsn", pgtest.Start(tb).DSN)
	}},
	{"asynq-nofsync", "asynq", func(tb testing.TB, _ *benchStore) []string {
		return []string{"-redis", startRedis(tb, false), "-enqueuers", strconv.Itoa(benchRunSize)}
	}},
	{"asynq-fsync", "asynq", func(tb testing.TB, _ *benchStore) []string {
		return []string{"-redis", startRedis(tb, true), "-enqueuers", strconv.Itoa(benchRunSize)}
	}},
}

// peersWanted says which peers run after Tether's figures: on a
// PostgreSQL store River always, in both shapes (on the same cluster); $BENCH_PEERS adds
// more: "1" (or "all") every peer, or a comma-separated list of names
// ("asynq" names both of its configurations), River on a private cluster
// when the store is bbolt.
func peersWanted(name string, bs *benchStore) bool {
	v := os.Getenv(benchPeersEnv)
	if bs != nil && strings.HasPrefix(name, "river") || v == "1" || v == "all" {
		return true
	}
	for _, w := range strings.Split(v, ",") {
		if w = strings.TrimSpace(w); w != "" && (w == name || strings.HasPrefix(name, w+"-")) {
			return true
		}
	}
	return false
}

// benchPeers runs the peers in Tether's shapes after Tether's figures:
// every shape's concurrency (workers × slots), 20,000 no-op jobs, the
// jobs inserted as Tether's runs are submitted (River: InsertMany of 200,
// one after the other; asynq, which has no batch enqueue: 200 enqueueing
// goroutines at once).
func benchPeers(b *testing.B, bs *benchStore) {
	seen := map[int]bool{}
	var concs []int
	for _, sh := range benchShapes {
		if c := sh.concurrency(); !seen[c] {
			seen[c] = true
			concs = append(concs, c)
		}
	}
	for _, p := range benchPeerList {
		if !peersWanted(p.name, bs) {
			continue
		}
		for i, conc := range concs {
			b.Run(fmt.Sprintf("peer=%s/jobs=%d/workers=%d", p.name, benchSteps, conc), func(b *testing.B) {
				bin := buildPeer(b, p.prog)
				samples := 0
				if i == 0 {
					samples = 100
				}
				var elapsed time.Duration
				var last peerResult
				b.ResetTimer()
				for range b.N {
					b.StopTimer()
					args := append(p.server(b, bs), "-jobs", strconv.Itoa(benchSteps),
						"-workers", strconv.Itoa(conc), "-latency", strconv.Itoa(samples))
					b.StartTimer()
					out, err := exec.Command(bin, args...).CombinedOutput()
					if err != nil {
						b.Fatalf("%s: %v\n%s", p.name, err, out)
					}
					last, err = parsePeerLine(string(out))
					if err != nil {
						b.Fatal(err)
					}
					elapsed += last.elapsed
					b.Log(strings.TrimSpace(last.line))
				}
				b.StopTimer()
				b.ReportMetric(float64(benchSteps*b.N)/elapsed.Seconds(), "jobs/s")
				if last.latency {
					b.ReportMetric(last.startP50, "start-p50-ms")
					b.ReportMetric(last.startP99, "start-p99-ms")
					b.ReportMetric(last.doneP50, "done-p50-ms")
					b.ReportMetric(last.doneP99, "done-p99-ms")
				}
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}

// startRedis starts a private Redis server (redis-server on PATH: Debian's
// redis-server package, which `make bench` installs when missing) on a
// free loopback port in a temporary directory, stopped when tb ends, and
// returns its address. Without fsync it keeps nothing (appendonly no, save
// ""); with fsync every write is appended and fsync'd before the answer
// (appendonly yes, appendfsync always).
func startRedis(tb testing.TB, fsync bool) string {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		tb.Fatalf("redis-server is not on PATH (Debian: apt-get install redis-server; make bench installs it): %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	_, port, _ := net.SplitHostPort(addr)
	dir := tb.TempDir()
	args := []string{"--bind", "127.0.0.1", "--port", port, "--dir", dir, "--save", "", "--daemonize", "no", "--logfile", ""}
	if fsync {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		args = append(args, "--appendonly", "no")
	}
	cmd := exec.Command(bin, args...)
	log := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	tb.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM) // our own child, by pid
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	})
	for deadline := time.Now().Add(10 * time.Second); ; {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.SetDeadline(time.Now().Add(time.Second))
			_, err = c.Write([]byte("PING\r\n"))
			buf := make([]byte, 7)
			if err == nil {
				_, err = io.ReadFull(c, buf)
			}
			c.Close()
			if err == nil && string(buf) == "+PONG\r\n" {
				return addr
			}
		}
		select {
		case err := <-exited:
			tb.Fatalf("redis-server exited: %v\n%s", err, log)
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatalf("redis-server did not answer on %s\n%s", addr, log)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// buildPeer builds bench/peers/<name> into a temporary directory of tb's.
func buildPeer(tb testing.TB, name string) string {
	tb.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	bin := filepath.Join(tb.TempDir(), name)
	cmd := exec.Command(goBin, "build", "-o", bin, "./"+name)
	cmd.Dir = filepath.Join("..", "..", "bench", "peers")
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("go build ./%s in bench/peers: %v\n%s", name, err, out)
	}
	return bin
}

// peerResult is a peer's line: its throughput run's time and, if it
// measured them, its idle latencies (ms).
type peerResult struct {
	line                                 string
	elapsed                              time.Duration
	latency                              bool
	startP50, startP99, doneP50, doneP99 float64
}

var peerLine = regexp.MustCompile(`(?m)^[\w-]+: (\d+) jobs \([^)]*\), \d+ workers, [\d.]+ jobs/s \(([\d.]+) s\)` +
	`(?:; idle \(\d+ samples\): insert→start p50 ([\d.]+) ms p99 ([\d.]+) ms, insert→done p50 ([\d.]+) ms p99 ([\d.]+) ms)?$`)

// parsePeerLine finds the result line in a peer's output (see
// bench/peers/river and bench/peers/asynq).
func parsePeerLine(out string) (peerResult, error) {
	m := peerLine.FindStringSubmatch(out)
	if m == nil {
		return peerResult{}, fmt.Errorf("no result line in the peer's output:\n%s", out)
	}
	if n, _ := strconv.Atoi(m[1]); n != benchSteps {
		return peerResult{}, fmt.Errorf("the peer ran %d jobs, not %d:\n%s", n, benchSteps, out)
	}
	f := make([]float64, 5)
	for i := range f {
		if m[i+2] == "" {
			continue
		}
		v, err := strconv.ParseFloat(m[i+2], 64)
		if err != nil {
			return peerResult{}, err
		}
		f[i] = v
	}
	return peerResult{line: m[0], elapsed: time.Duration(f[0] * float64(time.Second)), latency: m[3] != "",
		startP50: f[1], startP99: f[2], doneP50: f[3], doneP99: f[4]}, nil
}

// TestEndToEndBenchRigPostgres keeps the benchmark's PostgreSQL rig honest
// under `make test`: a small throughput run through the orchestrator
// leading a private cluster with the epoch it took (every commit fenced),
// each run's history then read back from the database; one group in
// flight at a time, then two.
func TestEndToEndBenchRigPostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the worker binary")
	}
	c := pgtest.Start(t)
	// One group in flight at a time (the default), and two (the pipeline
	// of SPEC §11: every commit ordered by tether_order).
	for _, depth := range []string{"1", "2"} {
		t.Run("pipeline="+depth, func(t *testing.T) {
			t.Setenv(benchPipelineEnv, depth)
			r := startRig(t, &benchStore{name: "postgres", newDB: c.NewDatabase}, 2, 4)
			d, commits, check := r.throughput(t, 400, benchRunSize)
			if d <= 0 || commits == 0 {
				t.Errorf("throughput: %s, %d commits", d, commits)
			}
			check()
		})
	}
}

// TestParsePeerLine: the peers' result lines, with and without their idle
// latencies, give the run's time and the latencies; a line of another
// count of jobs is refused.
func TestParsePeerLine(t *testing.T) {
	for _, c := range []struct {
		out      string
		elapsed  time.Duration
		latency  bool
		startP50 float64
	}{
		{"river: 20000 jobs (InsertMany of 200), 64 workers, 1580 jobs/s (12.66 s); idle (100 samples): insert→start p50 1.20 ms p99 3.40 ms, insert→done p50 250.10 ms p99 251.00 ms\n",
			12660 * time.Millisecond, true, 1.2},
		{"log line\nasynq: 20000 jobs (200 enqueuers), 4 workers, 5698 jobs/s (3.51 s)\n", 3510 * time.Millisecond, false, 0},
		{"river: 20000 jobs (one Insert per job, 200 at once), 4 workers, 525 jobs/s (38.10 s)\n", 38100 * time.Millisecond, false, 0},
	} {
		r, err := parsePeerLine(c.out)
		if err != nil {
			t.Errorf("%q: %v", c.out, err)
			continue
		}
		if r.elapsed != c.elapsed || r.latency != c.latency || r.startP50 != c.startP50 {
			t.Errorf("%q: %+v", c.out, r)
		}
	}
	if _, err := parsePeerLine("asynq: 2000 jobs (200 enqueuers), 4 workers, 5698 jobs/s (0.35 s)\n"); err == nil {
		t.Error("a run of 2,000 jobs is taken for one of 20,000")
	}
}
