package orchestrator_test

// The end-to-end benchmark's store, and its peers.
//
// $TETHER_BENCH_STORE chooses the store BenchmarkEndToEnd runs on (`make
// bench STORE=…` sets it): empty or "bbolt", a bbolt file per rig;
// "postgres", a private PostgreSQL cluster on loopback started for the
// benchmark (adapters/pgtest: fsync=on, synchronous_commit=on), a fresh
// database per rig; a postgres:// URL, that server, on which each rig
// creates a database of its own and drops it after. On PostgreSQL the
// orchestrator holds the lead as `serve` does (SPEC §11): it takes the
// leader row's epoch and opens the store with it, so every commit checks
// the epoch.
//
// The peers are other job systems in the same shape (bench/peers, a module
// of its own so that their dependencies stay out of Tether's): River
// (bench/peers/river) runs after Tether's figures, on the same PostgreSQL
// cluster when the store is PostgreSQL, and on a private cluster of its own
// when BENCH_PEERS=1 asks for it beside the default store. Its shape is the
// throughput run's: 20,000 no-op jobs inserted 200 at a time, one
// InsertMany after the other (Tether's 100 runs of 200 steps), 64
// concurrent workers (Tether's 4 workers × 16 slots).

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
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
	st, err = pgstore.Open(ctx, dsn, pgstore.Options{Epoch: epoch})
	if err != nil {
		tb.Fatal(err)
	}
	return st
}

// benchPeers runs the peers after Tether's figures: on bs's cluster when
// it is PostgreSQL, else only when BENCH_PEERS=1, on a private cluster.
func benchPeers(b *testing.B, bs *benchStore) {
	if bs == nil && os.Getenv(benchPeersEnv) != "1" {
		return
	}
	b.Run(fmt.Sprintf("peer=river/jobs=%d/workers=%d", benchSteps, benchWorkers*16), func(b *testing.B) {
		newDB := func(tb testing.TB) string { return pgtest.Start(tb).DSN }
		if bs != nil {
			newDB = bs.newDB
		}
		bin := buildPeer(b, "river")
		var elapsed time.Duration
		var last peerResult
		b.ResetTimer()
		for range b.N {
			b.StopTimer()
			dsn := newDB(b)
			b.StartTimer()
			out, err := exec.Command(bin, "-dsn", dsn, "-jobs", strconv.Itoa(benchSteps),
				"-batch", strconv.Itoa(benchRunSize), "-workers", strconv.Itoa(benchWorkers*16)).CombinedOutput()
			if err != nil {
				b.Fatalf("river: %v\n%s", err, out)
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
		b.ReportMetric(last.startP50, "start-p50-ms")
		b.ReportMetric(last.startP99, "start-p99-ms")
		b.ReportMetric(last.doneP50, "done-p50-ms")
		b.ReportMetric(last.doneP99, "done-p99-ms")
		b.ReportMetric(0, "ns/op")
	})
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

// peerResult is a peer's line: its throughput run's time and its idle
// latencies (ms).
type peerResult struct {
	line                                 string
	elapsed                              time.Duration
	startP50, startP99, doneP50, doneP99 float64
}

var peerLine = regexp.MustCompile(`(?m)^\w+: (\d+) jobs \(InsertMany of \d+\), \d+ workers, [\d.]+ jobs/s \(([\d.]+) s\); idle \(\d+ samples\): ` +
	`insert→start p50 ([\d.]+) ms p99 ([\d.]+) ms, insert→done p50 ([\d.]+) ms p99 ([\d.]+) ms$`)

// parsePeerLine finds the result line in a peer's output (see
// bench/peers/river).
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
		v, err := strconv.ParseFloat(m[i+2], 64)
		if err != nil {
			return peerResult{}, err
		}
		f[i] = v
	}
	return peerResult{line: m[0], elapsed: time.Duration(f[0] * float64(time.Second)),
		startP50: f[1], startP99: f[2], doneP50: f[3], doneP99: f[4]}, nil
}

// TestEndToEndBenchRigPostgres keeps the benchmark's PostgreSQL rig honest
// under `make test`: a small throughput run through the orchestrator
// leading a private cluster with the epoch it took (every commit fenced),
// each run's history then read back from the database.
func TestEndToEndBenchRigPostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the worker binary")
	}
	c := pgtest.Start(t)
	r := startRig(t, &benchStore{name: "postgres", newDB: c.NewDatabase}, 2, 4)
	d, commits, check := r.throughput(t, 400, benchRunSize)
	if d <= 0 || commits == 0 {
		t.Errorf("throughput: %s, %d commits", d, commits)
	}
	check()
}
