package pgstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tether-run/tether/adapters/pgstore"
	"github.com/tether-run/tether/adapters/pgtest"
	"github.com/tether-run/tether/adapters/store"
	"github.com/tether-run/tether/adapters/store/storetest"
	"github.com/tether-run/tether/core"
)

// The package's tests share one cluster (pgtest.Start costs more than a
// database): TestMain starts it, each test takes a database of its own.
var (
	cluster    *pgtest.Cluster
	clusterErr string // why Start failed, reported by every test
)

// mainTB is the testing.TB pgtest.Start gets outside any test: its
// cleanups run when the package's tests are done.
type mainTB struct {
	testing.TB
	cleanups []func()
	failed   string
}

type startFailed struct{}

func (m *mainTB) Helper()                   {}
func (m *mainTB) Cleanup(f func())          { m.cleanups = append(m.cleanups, f) }
func (m *mainTB) Skip(args ...any)          { m.failed = fmt.Sprint(args...); panic(startFailed{}) }
func (m *mainTB) Errorf(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) }
func (m *mainTB) Fatalf(f string, a ...any) {
	m.failed = fmt.Sprintf(f, a...)
	panic(startFailed{})
}

func TestMain(m *testing.M) {
	tb := &mainTB{}
	if os.Getenv(pgtest.SkipEnv) != "off" {
		func() {
			defer func() {
				if r := recover(); r != nil {
					if _, ok := r.(startFailed); !ok {
						panic(r)
					}
					clusterErr = tb.failed
				}
			}()
			cluster = pgtest.Start(tb)
		}()
	}
	code := m.Run()
	for i := len(tb.cleanups) - 1; i >= 0; i-- {
		tb.cleanups[i]()
	}
	os.Exit(code)
}

// database returns the DSN of a new empty database, skipping the test only
// when TETHER_TEST_PG=off says so.
func database(t *testing.T) string {
	t.Helper()
	if os.Getenv(pgtest.SkipEnv) == "off" {
		t.Skip(pgtest.SkipEnv + "=off: the PostgreSQL tests are skipped")
	}
	if cluster == nil {
		t.Fatalf("no PostgreSQL cluster: %s", clusterErr)
	}
	return cluster.NewDatabase(t)
}

func open(t *testing.T, dsn string, o pgstore.Options) *pgstore.Store {
	t.Helper()
	s, err := pgstore.Open(context.Background(), dsn, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestContractPostgres runs the store contract (store.Backend) on
// PostgreSQL: a new database per case, reopened by closing the Store and
// opening the same database.
func TestContractPostgres(t *testing.T) {
	dsns := map[store.Backend]string{}
	var mu sync.Mutex
	openB := func(t *testing.T) store.Backend {
		dsn := database(t)
		s, err := pgstore.Open(context.Background(), dsn, pgstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		dsns[s] = dsn
		mu.Unlock()
		return s
	}
	reopen := func(t *testing.T, b store.Backend) store.Backend {
		mu.Lock()
		dsn := dsns[b]
		mu.Unlock()
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		s, err := pgstore.Open(context.Background(), dsn, pgstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		dsns[s] = dsn
		mu.Unlock()
		return s
	}
	storetest.Run(t, openB, reopen)
}

// takeOver bumps the leader's epoch as a standby's take-over does.
func takeOver(t *testing.T, s *pgstore.Store, holder string) uint64 {
	t.Helper()
	var epoch uint64
	err := s.Pool().QueryRow(context.Background(), `UPDATE tether_leader SET epoch = epoch + 1, holder = $1, url = $2,
		expires_at = now() + $3 WHERE id = 1 AND expires_at <= now() RETURNING epoch`, holder, "http://"+holder, "10 seconds").Scan(&epoch)
	if err != nil {
		t.Fatalf("take-over by %s: %v", holder, err)
	}
	// The lease lapses at once, so the next take-over may follow.
	if _, err := s.Pool().Exec(context.Background(), "UPDATE tether_leader SET expires_at = now() WHERE id = 1"); err != nil {
		t.Fatal(err)
	}
	return epoch
}

// The fence (SPEC §11): once another orchestrator took over (epoch 2), the
// store of epoch 1 commits nothing — not a batch, not data, not the proof
// of an empty batch — and says it was deposed; the store of epoch 2
// commits.
func TestFence(t *testing.T) {
	dsn := database(t)
	admin := open(t, dsn, pgstore.Options{})
	if e := takeOver(t, admin, "one"); e != 1 {
		t.Fatalf("first take-over made epoch %d, want 1", e)
	}
	one := open(t, dsn, pgstore.Options{Epoch: 1})
	if err := one.Apply(nil); err != nil {
		t.Fatalf("the leader's proof: %v", err)
	}
	if err := one.Apply([]core.Record{{Key: "worker/a", Value: []byte("by one")}}); err != nil {
		t.Fatalf("the leader's commit: %v", err)
	}
	if e := takeOver(t, admin, "two"); e != 2 {
		t.Fatalf("second take-over made epoch %d, want 2", e)
	}
	two := open(t, dsn, pgstore.Options{Epoch: 2})

	if err := one.Apply(nil); !errors.Is(err, store.ErrDeposed) {
		t.Errorf("the deposed leader's proof (an empty Apply): %v, want ErrDeposed", err)
	}
	if err := one.Apply([]core.Record{{Key: "worker/a", Value: []byte("late")}, {Key: "worker/b", Value: []byte("late")}}); !errors.Is(err, store.ErrDeposed) {
		t.Errorf("the deposed leader's Apply: %v, want ErrDeposed", err)
	}
	if _, err := one.ApplyWithData([]core.Record{{Key: "worker/c", Value: []byte("late")}}, nil); !errors.Is(err, store.ErrDeposed) {
		t.Errorf("the deposed leader's ApplyWithData: %v, want ErrDeposed", err)
	}
	if _, err := one.WriteBlob(strings.NewReader("late bytes"), 100); !errors.Is(err, store.ErrDeposed) {
		t.Errorf("the deposed leader's WriteBlob: %v, want ErrDeposed", err)
	}
	if _, err := one.PruneAudit(time.Now(), 0); !errors.Is(err, store.ErrDeposed) {
		t.Errorf("the deposed leader's PruneAudit: %v, want ErrDeposed", err)
	}
	want := map[string]string{"worker/a": "by one"}
	if got := loadMap(t, two); !reflect.DeepEqual(got, want) {
		t.Errorf("after the deposed leader's writes the state is %v, want %v (nothing of them)", got, want)
	}
	if err := two.Apply([]core.Record{{Key: "worker/a", Value: []byte("by two")}}); err != nil {
		t.Fatalf("the new leader's commit: %v", err)
	}
	if got := loadMap(t, two)["worker/a"]; got != "by two" {
		t.Errorf("the new leader's commit reads %q", got)
	}
}

func loadMap(t *testing.T, s *pgstore.Store) map[string]string {
	t.Helper()
	recs, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, r := range recs {
		m[r.Key] = string(r.Value)
	}
	return m
}

// Migrations: Opens and Migrates at once on a new database agree (one
// migrates, the others find it done); a database a newer binary migrated is refused.
// Backup is pg_dump's, not the Store's.
func TestMigrations(t *testing.T) {
	dsn := database(t)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() {
			if i%2 == 1 { // what a standby runs
				errs[i] = pgstore.Migrate(context.Background(), dsn)
				return
			}
			s, err := pgstore.Open(context.Background(), dsn, pgstore.Options{})
			if err == nil {
				s.Close()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Open or Migrate %d of 4 at once: %v", i+1, err)
		}
	}
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var version, leaders int
	if err := conn.QueryRow(context.Background(), "SELECT version, (SELECT count(*) FROM tether_leader) FROM tether_schema").Scan(&version, &leaders); err != nil {
		t.Fatal(err)
	}
	if version != pgstore.SchemaVersion || leaders != 1 {
		t.Errorf("after 4 Opens and Migrates: schema version %d with %d leader rows; want %d and 1", version, leaders, pgstore.SchemaVersion)
	}
	s := open(t, dsn, pgstore.Options{})
	if err := s.Backup(io.Discard); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Backup: %v, want an error wrapping ErrUnsupported (pg_dump backs a database up)", err)
	}
	if err := s.ReleaseMapped(); err != nil {
		t.Errorf("ReleaseMapped: %v; a PostgreSQL store maps nothing", err)
	}
	if _, err := conn.Exec(context.Background(), "UPDATE tether_schema SET version = version + 1"); err != nil {
		t.Fatal(err)
	}
	if s, err := pgstore.Open(context.Background(), dsn, pgstore.Options{}); !errors.Is(err, pgstore.ErrSchemaTooNew) {
		if err == nil {
			s.Close()
		}
		t.Errorf("Open of a database of a newer schema: %v, want ErrSchemaTooNew", err)
	}
}

// A database restarted as a crash would (SPEC §11): what was committed is
// there, and after a bounded number of calls failing on the connections
// the restart cut, the Store works again on new ones.
func TestDatabaseRestart(t *testing.T) {
	// "before" waits in the journal across the restart (no fold for an
	// hour unless a read asks): the fold after it must bring it in.
	s := open(t, database(t), pgstore.Options{FoldDelay: time.Hour})
	if err := s.Apply([]core.Record{{Key: "worker/a", Value: []byte("before")}}); err != nil {
		t.Fatal(err)
	}
	cluster.Restart(t)
	var failed int
	for {
		err := s.Apply([]core.Record{{Key: "worker/b", Value: []byte("after")}})
		if err == nil {
			break
		}
		// Each failure costs the pool one cut connection: a bounded number.
		if failed++; failed > int(s.Pool().Config().MaxConns) {
			t.Fatalf("Apply still fails after the restart, %d times: %v", failed, err)
		}
		t.Logf("Apply after the restart: %v", err)
	}
	want := map[string]string{"worker/a": "before", "worker/b": "after"}
	if got := loadMap(t, s); !reflect.DeepEqual(got, want) {
		t.Errorf("after the restart: %v, want %v", got, want)
	}
}

// A blob's bytes are chunks: a body over its limit leaves none, and Open
// removes those no blob names (a write a crash cut).
func TestBlobChunks(t *testing.T) {
	dsn := database(t)
	s := open(t, dsn, pgstore.Options{})
	chunks := func() (n int) {
		t.Helper()
		if err := s.Pool().QueryRow(context.Background(), "SELECT count(*) FROM tether_blob_chunk").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	body := strings.Repeat("x", 2*pgstore.ChunkSize+1)
	ref, err := s.WriteBlob(strings.NewReader(body), int64(len(body)))
	if err != nil {
		t.Fatal(err)
	}
	if n := chunks(); n != 3 {
		t.Errorf("a blob of 2 chunks and a byte is %d chunks", n)
	}
	if _, err := s.WriteBlob(strings.NewReader(body+"y"), int64(len(body))); !errors.Is(err, store.ErrTooLarge) {
		t.Fatalf("a body over its limit: %v", err)
	}
	if n := chunks(); n != 3 {
		t.Errorf("a body over its limit left %d chunks beside the blob's 3", n-3)
	}
	if _, err := s.Pool().Exec(context.Background(), "INSERT INTO tether_blob_chunk VALUES ('cut', 0, 'abc')"); err != nil {
		t.Fatal(err)
	}
	s.ReleaseBlob(ref) // unnamed: collected
	if n := chunks(); n != 1 {
		t.Errorf("after the blob was collected %d chunks are left, want the cut write's 1", n)
	}
	s.Close()
	s = open(t, dsn, pgstore.Options{})
	if n := chunks(); n != 0 {
		t.Errorf("after a reopen %d chunks of a cut write are left", n)
	}
}

var icuDatabases atomic.Int32

// Keys sort in byte order (Go's string order, as bbolt's) even in a
// database whose collation sorts text otherwise (ICU's English: case and
// punctuation second): Load's order is the core's, and it finds the live
// leases' log lines by their keys' range.
func TestByteOrder(t *testing.T) {
	database(t) // skips or fails as every test here does without a cluster
	name := fmt.Sprintf("tether_icu_%d_%d", os.Getpid(), icuDatabases.Add(1))
	admin, err := pgx.Connect(context.Background(), strings.Replace(cluster.DSN, "/"+pgtest.Database+"?", "/postgres?", 1))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(context.Background(), "CREATE DATABASE "+name+" LOCALE_PROVIDER icu ICU_LOCALE 'en-US' TEMPLATE template0"); err != nil {
		t.Fatal(err)
	}
	s := open(t, strings.Replace(cluster.DSN, "/"+pgtest.Database+"?", "/"+name+"?", 1), pgstore.Options{})
	keys := []string{"worker/a", "worker/B", "worker/_x", "worker/-y", "worker/Z9", "worker/a-b", "worker/ab",
		"lease/00000000000000000007", "log/00000000000000000007/0000000000", "leases", "lease-x", "lease0"}
	var recs []core.Record
	for _, k := range keys {
		recs = append(recs, core.Record{Key: k, Value: []byte("v")})
	}
	if err := s.Apply(recs); err != nil {
		t.Fatal(err)
	}
	got, err := s.Load()
	if err != nil {
		t.Fatalf("Load in a database of ICU's collation: %v", err)
	}
	sort.Strings(keys)
	var order []string
	for _, r := range got {
		order = append(order, r.Key)
	}
	if !reflect.DeepEqual(order, keys) {
		t.Errorf("Load's order %q, want byte order %q", order, keys)
	}
}

// The pipeline's first place cannot read the last committed place (its
// read times out behind a lock): every place reserved after it must fail
// with it, never guess a number that the database then accepts (a later
// batch durable without an earlier one, SPEC §11).
func TestPipelineBrokenChain(t *testing.T) {
	dsn := database(t)
	s := open(t, dsn+"&statement_timeout=300", pgstore.Options{Pipeline: 2})
	if err := s.Reserve()([]core.Record{{Key: "worker/first", Value: []byte("1")}}); err != nil {
		t.Fatal(err)
	}
	// A fresh Store: its first Reserve reads the last committed place.
	s2 := open(t, dsn+"&statement_timeout=300", pgstore.Options{Pipeline: 2})
	ctx := context.Background()
	locker, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(ctx)
	tx, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE tether_order IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	first, later := s2.Reserve(), s2.Reserve()
	errFirst := first([]core.Record{{Key: "worker/second", Value: []byte("2")}})
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	errLater := later([]core.Record{{Key: "worker/third", Value: []byte("3")}})
	if errFirst == nil {
		t.Fatalf("the place whose read was locked out committed")
	}
	if !errors.Is(errLater, store.ErrEarlierFailed) {
		t.Errorf("the place after a place with no number: %v, want ErrEarlierFailed", errLater)
	}
	if got := loadMap(t, s); got["worker/third"] != "" {
		t.Errorf("the later place's batch is durable without the earlier one: %v", got)
	}
}

// raw reads the database as it is, past any Store: the live records'
// keys and values, and the journal's rows.
func raw(t *testing.T, dsn string) (recs map[string]string, history, audit, logs, journal int) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SELECT key, value FROM tether_record")
	if err != nil {
		t.Fatal(err)
	}
	recs = map[string]string{}
	for rows.Next() {
		var k string
		var v []byte
		if err := rows.Scan(&k, &v); err != nil {
			t.Fatal(err)
		}
		recs[k] = string(v)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	err = conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM tether_history), (SELECT count(*) FROM tether_audit),
		(SELECT count(*) FROM tether_log), (SELECT count(*) FROM tether_journal)`).Scan(&history, &audit, &logs, &journal)
	if err != nil {
		t.Fatal(err)
	}
	return recs, history, audit, logs, journal
}

// A journal left behind (SPEC §11): a Store stopped before its applier
// folded anything (as a killed process is) leaves its commits in
// tether_journal alone; the next Open folds every one of them, in order,
// before anything reads, and nothing is lost.
func TestJournalLeftBehind(t *testing.T) {
	dsn := database(t)
	s, err := pgstore.Open(context.Background(), dsn, pgstore.Options{FoldDelay: time.Hour, Pipeline: 2})
	if err != nil {
		t.Fatal(err)
	}
	hist := core.RunHistory{Status: "success", Run: core.RunRecord{ID: "run-7", Spec: core.RunSpec{Name: "wf"}, Finished: true,
		SubmittedAt: time.Unix(100, 0).UTC(), FinishedAt: time.Unix(200, 0).UTC()}}
	hv, err := json.Marshal(hist)
	if err != nil {
		t.Fatal(err)
	}
	av, err := json.Marshal(core.AuditEntry{Seq: 1, At: time.Unix(300, 0).UTC(), Actor: "alice", Action: core.ActionSubmit, Outcome: core.OutcomeAccepted})
	if err != nil {
		t.Fatal(err)
	}
	batches := [][]core.Record{
		{{Key: "worker/a", Value: []byte("1")}, {Key: "worker/b", Value: []byte("1")}, {Key: "lease/00000000000000000009", Value: []byte("{}")}},
		{{Key: "worker/a", Value: []byte("2")}, {Key: "worker/c", Value: []byte("born")}, {Key: "log/00000000000000000009/0000000000", Value: []byte(`{"Index":0}`)}},
		{{Key: "worker/b", Delete: true}, {Key: "worker/c", Value: []byte("grown")}, {Key: core.HistoryKey("run-7"), Value: hv}},
		{{Key: "worker/a", Value: []byte("3")}, {Key: core.AuditKey(1), Value: av}},
	}
	for i, b := range batches {
		if i == 1 {
			err = s.Reserve()(b) // a place of the pipeline journals as Apply does
		} else {
			err = s.Apply(b)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	recs, nh, na, nl, nj := raw(t, dsn)
	if len(recs) != 0 || nh+na+nl != 0 || nj != len(batches) {
		t.Fatalf("before any fold: %d live records, %d history, %d audit, %d log rows and %d journal rows; want only the %d journal rows",
			len(recs), nh, na, nl, nj, len(batches))
	}
	s.Close() // stopped before its fold: the journal is all there is

	s2 := open(t, dsn, pgstore.Options{})
	want := map[string]string{"worker/a": "3", "worker/c": "grown", "lease/00000000000000000009": "{}"}
	recs, nh, na, nl, nj = raw(t, dsn)
	if !reflect.DeepEqual(recs, want) || nh != 1 || na != 1 || nl != 1 || nj != 0 {
		t.Fatalf("right after the next Open, the tables hold %v, %d history, %d audit, %d log rows and %d journal rows;\nwant %v, 1, 1, 1 and 0",
			recs, nh, na, nl, nj, want)
	}
	want["log/00000000000000000009/0000000000"] = `{"Index":0}`
	if got := loadMap(t, s2); !reflect.DeepEqual(got, want) {
		t.Errorf("Load after the next Open: %v, want %v", got, want)
	}
	if h, err := s2.History("run-7"); err != nil || h.Run.ID != "run-7" {
		t.Errorf("the archived run after the next Open: %+v %v", h.Run, err)
	}
}

// A deposed leader's fold (SPEC §11): its commit is in the journal when
// another orchestrator takes over; the fold a read then asks for fails
// with ErrDeposed and writes nothing, and the new leader's Open folds that
// commit (durable before the take-over) before its own commits.
func TestDeposedFold(t *testing.T) {
	dsn := database(t)
	admin := open(t, dsn, pgstore.Options{})
	takeOver(t, admin, "one")
	one := open(t, dsn, pgstore.Options{Epoch: 1, FoldDelay: time.Hour})
	if err := one.Apply([]core.Record{{Key: "worker/a", Value: []byte("by one")}}); err != nil {
		t.Fatal(err)
	}
	takeOver(t, admin, "two")
	if _, err := one.Load(); !errors.Is(err, store.ErrDeposed) {
		t.Fatalf("the deposed leader's Load (its fold first): %v, want ErrDeposed", err)
	}
	if _, err := one.ArchivedRuns(); !errors.Is(err, store.ErrDeposed) {
		t.Errorf("the deposed leader's next read: %v, want ErrDeposed", err)
	}
	if recs, _, _, _, nj := raw(t, dsn); len(recs) != 0 || nj != 1 {
		t.Fatalf("after the deposed leader's fold: live records %v and %d journal rows; want none and its 1", recs, nj)
	}
	two := open(t, dsn, pgstore.Options{Epoch: 2})
	if recs, _, _, _, nj := raw(t, dsn); recs["worker/a"] != "by one" || nj != 0 {
		t.Fatalf("after the new leader's Open: live records %v and %d journal rows; want the deposed leader's commit folded", recs, nj)
	}
	if err := two.Apply([]core.Record{{Key: "worker/a", Value: []byte("by two")}}); err != nil {
		t.Fatal(err)
	}
	if got := loadMap(t, two)["worker/a"]; got != "by two" {
		t.Errorf("the new leader reads %q, want by two", got)
	}
}

// A large commit's journal row is stored compressed (SPEC §11, migration
// 4): the server keeps a batch of JSON records in a third of its bytes or
// less, so its WAL, which each commit waits to flush, shrinks with it; and
// the row reads back whole, as the next Open's fold of it shows.
func TestJournalCompressed(t *testing.T) {
	dsn := database(t)
	s, err := pgstore.Open(context.Background(), dsn, pgstore.Options{FoldDelay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	var recs []core.Record
	for i := range 200 { // a 64-slot commit's worth of step records
		k := fmt.Sprintf("step/run-%d/s%d", i/50, i)
		v := fmt.Sprintf(`{"ID":"run-%d/s%d","Run":"run-%d","Name":"s%d","Index":-1,"Deps":null,"State":7,"Attempts":1,"Lease":%d,"QueuedAt":"2026-11-27T02:27:53.%09dZ","StartedAt":"2026-11-27T02:27:56.%09dZ","Outcome":{"Status":1,"ExitCode":0,"Message":""},"EverStarted":true}`,
			i/50, i, i/50, i, 17000+i, 813067675+i*7919, 114342834+i*104729)
		recs = append(recs, core.Record{Key: k, Value: []byte(v)})
		want[k] = v
	}
	if err := s.Apply(recs); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var length, stored int
	var method *string
	err = conn.QueryRow(context.Background(), `SELECT length(batch), pg_column_size(batch), pg_column_compression(batch) FROM tether_journal`).Scan(&length, &stored, &method)
	if err != nil {
		t.Fatal(err)
	}
	if method == nil || stored*3 > length {
		t.Errorf("the journal row of %d bytes is stored in %d bytes (compressed: %v); want a third or less, compressed", length, stored, method != nil)
	}
	s.Close() // stopped before its fold: the next Open folds the compressed row
	s2 := open(t, dsn, pgstore.Options{})
	if got := loadMap(t, s2); !reflect.DeepEqual(got, want) {
		t.Errorf("Load after the next Open folded the compressed row: %d records, want %d", len(got), len(want))
	}
}

// The tables' large values are compressed with lz4 where the server has it
// (SPEC §11, migration 5): a run's record of several KB, folded into
// tether_record, is stored compressed with lz4, and the history's and the
// log's columns ask for lz4 too (pglz, the default, costs the server
// several times the CPU).
func TestLargeValuesLZ4(t *testing.T) {
	dsn := database(t)
	s := open(t, dsn, pgstore.Options{})
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var lz4 bool
	if err := conn.QueryRow(context.Background(), `SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'`).Scan(&lz4); err != nil {
		t.Fatal(err)
	}
	if !lz4 {
		t.Skip("the server was built without lz4")
	}
	var v strings.Builder
	for i := range 200 {
		fmt.Fprintf(&v, `{"ID":"run-1/s%d","State":7,"QueuedAt":"2026-11-27T02:27:53.%09dZ"},`, i, 813067675+i*7919)
	}
	if err := s.Apply([]core.Record{{Key: "run/run-1", Value: []byte("[" + strings.TrimSuffix(v.String(), ",") + "]")}}); err != nil {
		t.Fatal(err)
	}
	loadMap(t, s) // a read: the fold first
	var method *string
	if err := conn.QueryRow(context.Background(), `SELECT pg_column_compression(value) FROM tether_record WHERE key = 'run/run-1'`).Scan(&method); err != nil {
		t.Fatal(err)
	}
	if method == nil || *method != "lz4" {
		got := "none"
		if method != nil {
			got = *method
		}
		t.Errorf("a run's record of %d bytes is stored with compression %s, want lz4", v.Len(), got)
	}
	rows, err := conn.Query(context.Background(), `SELECT attrelid::regclass::text || '.' || attname FROM pg_attribute
		WHERE (attrelid::regclass::text, attname) IN (('tether_history', 'value'), ('tether_history', 'summary'), ('tether_record', 'value'), ('tether_log', 'value'), ('tether_journal', 'batch'))
		AND attcompression = 'l'`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(got)
	want := []string{"tether_history.summary", "tether_history.value", "tether_journal.batch", "tether_log.value", "tether_record.value"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("the columns compressed with lz4: %v, want %v", got, want)
	}
}
