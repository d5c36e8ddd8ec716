// Package pgstore is store.Backend on PostgreSQL (SPEC §11): the live
// records, the history of archived runs, the audit log, the data plane
// (its bytes chunked in the database too) and the sealed secrets, in the
// tables of schema.go, so that any number of orchestrators can point at
// one database and one of them leads.
//
// The fence. A Store opened with a nonzero Options.Epoch begins every write
// transaction with tether_fence (schema.go): it reads the leader row FOR
// SHARE (a take-over, which updates that row, waits for the transaction or
// makes it wait) and aborts the transaction, before anything of it is
// written, unless the epoch is the Store's; the caller gets an error
// wrapping store.ErrDeposed. Apply of an empty batch is then the proof of
// leadership on its own: the driver calls it before any group that leaves
// without records, and it reads the epoch without a transaction of its
// own to commit.
//
// Apply, the driver's hot path, is one round trip: the fence and one
// INSERT of the batch, routed, sealed and encoded, as one row of
// tether_journal (journal.go; the server stores a row past a page
// compressed, lz4 where it can: schema.go's migration 4), both statements
// prepared on the connection and sent as one pgconn batch (sendJournal),
// which PostgreSQL runs as one implicit transaction, committed and
// flushed before it answers: the Store's sessions run with
// synchronous_commit=on (or what the URL asks beyond it; off is refused). That row is the durable point;
// the Store's applier folds the rows into the tables of records later
// (the last write of a key among those folded together), and every read of
// those tables, and every other write, waits until what was acknowledged
// before it began is folded. With Options.Pipeline above 1 the driver's
// groups come through Reserve instead (pipeline.go, store.Pipeline): the
// same round trip, ordered, more than one in flight.
//
// What is durable where: a commit's records are in tether_journal from the
// moment it is acknowledged until a fold moves them, in one transaction,
// into tether_record, tether_log, tether_audit and tether_history; the
// data plane, the blobs and the secrets are written to their tables
// directly, in the commit's transaction (ApplyWithData journals its
// records in the transaction of its ops). Only the Store of the leader (or
// of the one orchestrator) folds, and reads through it; anything else that
// reads those tables directly sees them as of the last fold: up to
// Options.FoldDelay (and one fold's time) behind, or further when no
// orchestrator runs, until the next Open folds what is left.
package pgstore

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tether-run/tether/adapters/store"
	"github.com/tether-run/tether/core"
)

// Options configure a Store.
type Options struct {
	// Epoch, when nonzero, fences every write transaction: it commits only
	// while tether_leader's epoch is this one, else it fails with an error
	// wrapping store.ErrDeposed. Zero: no fence (one orchestrator alone).
	Epoch uint64
	// Pipeline is how many batches the driver may have in flight at once
	// through Reserve (pipeline.go); zero is DefaultPipeline, 1 one at a
	// time (Reserve still orders its places).
	Pipeline int
	// FoldDelay is the longest a commit waits in the journal before the
	// applier folds it into the tables unless a read asks sooner or
	// enough gathered (journal.go); zero is DefaultFoldDelay.
	FoldDelay time.Duration
}

// DefaultMaxConns is the pool's size unless the store URL sets
// pool_max_conns.
const DefaultMaxConns = 16

// MaxKeyLength bounds a record's key: a PostgreSQL index entry holds at
// most about a third of a page.
const MaxKeyLength = 2000

// Store is a PostgreSQL database of Tether's state. It is safe for
// concurrent use.
type Store struct {
	pool   *pgxpool.Pool
	epoch  int64
	closed atomic.Bool

	ctx    context.Context // canceled by Close
	cancel context.CancelFunc

	blobMu   sync.Mutex
	pins     map[string]int  // blobs written and not yet released
	unsure   map[string]bool // released blobs to collect unless a record names them
	creating int             // WriteBlobs under way

	keys store.Sealer // the secrets key (secrets.go)

	dataMu sync.Mutex // one ApplyWithData at a time decides on its reads (applydata.go)

	// The pipeline (pipeline.go).
	depth       int
	orderMu     sync.Mutex
	last        *place // the last reserved; nil: none yet
	failed      bool   // a place failed since the last committed was read
	outstanding int    // places reserved whose functions have not returned

	// The journal (journal.go), under jmu.
	jmu          sync.Mutex
	jcond        *sync.Cond // broadcast when an entry lands or a fold ends
	jseq         int64      // the last entry number reserved
	inflight     map[int64]struct{}
	pending      []entry // committed, not folded, by number
	pendingBytes int
	acked        int64     // the greatest entry number committed
	folded       int64     // every entry up to it is in the tables
	jUnsure      int64     // the greatest entry number whose commit failed (maybe committed)
	urgent       bool      // a reader or a commit waits for a fold
	oldest       time.Time // since when the oldest pending entry waits (zero: not yet seen)
	foldGen      uint64    // folds tried
	foldErr      error     // the last fold's error
	foldFails    int       // folds failed in a row
	stopped      error     // why the applier stopped for good (deposed)
	kick         chan struct{}
	foldDelay    time.Duration
	applierDone  chan struct{}
}

var _ store.Backend = (*Store)(nil)

// Open connects to the database at dsn, runs the migrations it lacks
// (schema.go) and collects the blobs no record names and what unfinished
// blob writes left. Only the orchestrator that writes opens a Store (alone
// with no epoch, or the leader with its epoch): that collection would take
// the blobs a running leader is writing. A standby runs Migrate.
func Open(ctx context.Context, dsn string, o Options) (*Store, error) {
	pool, err := connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	s := &Store{pool: pool, epoch: int64(o.Epoch), pins: map[string]int{}, unsure: map[string]bool{}, depth: o.Pipeline,
		inflight: map[int64]struct{}{}, kick: make(chan struct{}, 1), applierDone: make(chan struct{}), foldDelay: o.FoldDelay}
	if s.foldDelay <= 0 {
		s.foldDelay = DefaultFoldDelay
	}
	s.jcond = sync.NewCond(&s.jmu)
	if s.depth <= 0 {
		s.depth = DefaultPipeline
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	// Open's own work (the fold of what a predecessor left, the sweep of
	// unfinished blobs) runs under s.ctx, but ends with the caller's ctx
	// while Open runs: a stop asked for during a long Open is heard.
	stop := context.AfterFunc(ctx, s.cancel)
	defer stop()
	// What a predecessor committed and did not fold, under this Store's
	// fence, before anything reads (journal.go).
	if err := s.pool.QueryRow(s.ctx, "SELECT coalesce(max(seq), 0) FROM tether_journal").Scan(&s.jseq); err != nil {
		close(s.applierDone)
		s.Close()
		return nil, fmt.Errorf("pgstore: the journal: %w", err)
	}
	s.acked, s.folded = s.jseq, s.jseq
	if err := s.foldAll(); err != nil {
		close(s.applierDone)
		s.Close()
		return nil, err
	}
	go s.applier()
	if err := s.write(func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `DELETE FROM tether_blob_chunk c WHERE NOT EXISTS (SELECT 1 FROM tether_blob b WHERE b.chunks = c.chunks)`)
		return err
	}); err != nil {
		s.Close()
		return nil, fmt.Errorf("pgstore: unfinished blobs: %w", err)
	}
	if _, err := s.CollectBlobs(); err != nil {
		s.Close()
		return nil, err
	}
	if !stop() { // ctx ended: the store was cancelled with it
		s.Close()
		return nil, fmt.Errorf("pgstore: open: %w", ctx.Err())
	}
	return s, nil
}

// Migrate runs the migrations the database at dsn lacks, as Open does, and
// nothing else: what a standby does before it campaigns, so that the
// leader row exists.
func Migrate(ctx context.Context, dsn string) error {
	pool, err := connect(ctx, dsn)
	if err != nil {
		return err
	}
	pool.Close()
	return nil
}

// connect makes the pool and migrates the database.
func connect(ctx context.Context, dsn string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// The DSN may carry a password: not echoed.
		return nil, fmt.Errorf("pgstore: the store URL does not parse as a PostgreSQL connection string")
	}
	// Commits, reads of the API and the data plane, blob chunks and the
	// leader's renewals share the pool: more than pgxpool's default of 4,
	// unless the URL says (pool_max_conns).
	if !strings.Contains(dsn, "pool_max_conns") {
		cfg.MaxConns = DefaultMaxConns
	}
	// A commit is answered only once it is on stable storage (SPEC §11),
	// whatever the server's default; a connection string may ask for more
	// (remote_apply, with standbys), never for less.
	switch strings.ToLower(cfg.ConnConfig.RuntimeParams["synchronous_commit"]) {
	case "":
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
	case "off", "false", "no", "0": // PostgreSQL reads each as off
		return nil, errSyncOff
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgstore: connect: %w", err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("pgstore: connect: %w", err)
	}
	// What the session runs with, however it was set (an options=-c
	// parameter, a role's or a database's default the URL left alone).
	var sync string
	if err = conn.QueryRow(ctx, "SHOW synchronous_commit").Scan(&sync); err == nil && sync == "off" {
		err = errSyncOff
	}
	if err == nil {
		err = migrate(ctx, conn.Conn(), migrations)
	}
	conn.Release()
	if err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// errSyncOff is returned by Open for sessions that would commit with
// synchronous_commit off.
var errSyncOff = errors.New("pgstore: synchronous_commit=off would answer commits a crash can lose (SPEC §11); drop it from the store URL")

// Pool is the Store's connection pool (the leader election shares it).
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Close closes the pool; closing twice is harmless. Calls after it return
// store.ErrClosed.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.cancel()
	<-s.applierDone
	s.jmu.Lock()
	s.jcond.Broadcast() // waiters see the Store closed
	s.jmu.Unlock()
	s.pool.Close()
	return nil
}

// check refuses a call after Close.
func (s *Store) check() error {
	if s.closed.Load() {
		return store.ErrClosed
	}
	return nil
}

// mapErr names what an error of the database means to the caller.
func (s *Store) mapErr(err error) error {
	var pe *pgconn.PgError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &pe) && pe.Code == fenceCode:
		return fmt.Errorf("%w: %s", store.ErrDeposed, pe.Message)
	case s.closed.Load():
		return store.ErrClosed
	}
	return err
}

// fence queues the epoch check first in b, when the Store has an epoch.
func (s *Store) fence(b *pgx.Batch) {
	if s.epoch != 0 {
		b.Queue("SELECT tether_fence($1)", s.epoch)
	}
}

// fenceTx runs the epoch check in tx, when the Store has an epoch.
func (s *Store) fenceTx(ctx context.Context, tx pgx.Tx) error {
	if s.epoch == 0 {
		return nil
	}
	_, err := tx.Exec(ctx, "SELECT tether_fence($1)", s.epoch)
	return err
}

// write runs f in one fenced transaction, once every entry of the journal
// acknowledged before it is in the tables.
func (s *Store) write(f func(ctx context.Context, tx pgx.Tx) error) error {
	return s.tx(true, f)
}

// tx runs f in one fenced transaction; first, if catchUp, once every entry
// of the journal acknowledged before it is in the tables.
func (s *Store) tx(catchUp bool, f func(ctx context.Context, tx pgx.Tx) error) error {
	if err := s.check(); err != nil {
		return err
	}
	if catchUp {
		if err := s.catchUp(); err != nil {
			return err
		}
	}
	ctx := s.ctx
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := s.fenceTx(ctx, tx); err != nil {
			return err
		}
		return f(ctx, tx)
	})
	return s.mapErr(err)
}

// read runs f in one read-only transaction (a consistent snapshot), once
// every entry of the journal acknowledged before it is in the tables.
func (s *Store) read(f func(ctx context.Context, tx pgx.Tx) error) error {
	if err := s.check(); err != nil {
		return err
	}
	if err := s.catchUp(); err != nil {
		return err
	}
	return s.readData(f)
}

// readData is read of tables the journal does not feed (the data plane's,
// the blobs', the secrets'): it waits for no fold.
func (s *Store) readData(f func(ctx context.Context, tx pgx.Tx) error) error {
	if err := s.check(); err != nil {
		return err
	}
	ctx := s.ctx
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{AccessMode: pgx.ReadOnly, IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
		return f(ctx, tx)
	})
	return s.mapErr(err)
}

// checkRecords refuses a batch with a record the store cannot hold.
func checkRecords(recs []core.Record) error {
	for i, r := range recs {
		switch {
		case r.Key == "":
			return fmt.Errorf("pgstore: apply record %d of %d: %w", i+1, len(recs), store.ErrEmptyKey)
		case len(r.Key) > MaxKeyLength:
			return fmt.Errorf("pgstore: apply record %d of %d (%.40q…): %w", i+1, len(recs), r.Key, store.ErrKeyTooLarge)
		case !r.Delete && r.Value == nil:
			return fmt.Errorf("pgstore: apply record %q: %w", r.Key, store.ErrNoValue)
		case !textHolds(r.Key):
			return fmt.Errorf("pgstore: apply record %q: a key is UTF-8 without a NUL byte (a text column holds no other): %w", r.Key, store.ErrEmptyKey)
		}
	}
	return nil
}

// textHolds says whether a text column can hold s: PostgreSQL's text is
// without NUL, and in a UTF-8 database (initdb's default) valid UTF-8.
func textHolds(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}

// Apply writes a batch of records in one transaction, fenced: upserts put
// their value, deletes remove their key, a later record of a key winning.
// An empty batch with an epoch is the proof of leadership alone.
func (s *Store) Apply(recs []core.Record) error {
	if err := s.check(); err != nil {
		return err
	}
	if len(recs) == 0 {
		return s.prove()
	}
	if err := checkRecords(recs); err != nil {
		return err
	}
	ops, batch, err := s.prepare(recs)
	if err != nil {
		return err
	}
	defer releaseBatch(batch)
	if err := s.admit(); err != nil {
		return err
	}
	seq := s.reserveSeq()
	var first *stmt
	var args [][]byte
	if s.epoch != 0 {
		first, args = &fenceStmt, [][]byte{strconv.AppendInt(nil, s.epoch, 10)}
	}
	err = s.sendJournal(first, args, seq, batch)
	s.committed(seq, ops, len(batch), err)
	if err != nil {
		return fmt.Errorf("pgstore: apply %d records: %w", len(recs), s.mapErr(err))
	}
	return nil
}

// journalInsert is the statement of a commit's journal row.
const journalInsert = "INSERT INTO tether_journal (seq, batch) VALUES ($1, $2)"

// stmt is a statement sendJournal prepares on each connection once, by
// name.
type stmt struct{ name, sql string }

var (
	fenceStmt   = stmt{"tether_fence", "SELECT tether_fence($1)"}
	orderStmt   = stmt{"tether_order", "SELECT tether_order($1, $2)"}
	journalStmt = stmt{"tether_journal_insert", journalInsert}
)

// sendJournal runs first (the fence or the pipeline's order, its arguments
// in text; nil: none) and the INSERT of the journal row seq holding batch
// (nil: none) as one implicit transaction, in one round trip, on a
// connection of the pool. The statements go through pgconn, not a
// pgx.Batch: pgx would copy the batch's bytes into a parameter buffer of
// its own before the connection's (a commit's batch is tens of KB).
func (s *Store) sendJournal(first *stmt, args [][]byte, seq int64, batch []byte) error {
	c, err := s.pool.Acquire(s.ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	conn := c.Conn()
	b := &pgconn.Batch{}
	for _, st := range []*stmt{first, &journalStmt} {
		if st == nil || st == &journalStmt && batch == nil {
			continue
		}
		if _, err := conn.Prepare(s.ctx, st.name, st.sql); err != nil {
			return err
		}
		if st == &journalStmt {
			b.ExecPrepared(st.name, [][]byte{strconv.AppendInt(nil, seq, 10), batch}, journalFormats, nil)
		} else {
			b.ExecPrepared(st.name, args, nil, nil)
		}
	}
	_, err = conn.PgConn().ExecBatch(s.ctx, b).ReadAll()
	return err
}

// journalFormats are the journal INSERT's parameter formats: the number in
// text, the batch in binary.
var journalFormats = []int16{0, 1}

// batchBufs keeps the buffers journal rows are encoded in (a commit's
// batch is not kept once sent); one past maxPooledBatch is left to the
// collector.
var batchBufs = sync.Pool{New: func() any { return new([]byte) }}

const maxPooledBatch = 1 << 20

// releaseBatch gives prepare's buffer back once the batch is sent.
func releaseBatch(b []byte) {
	if cap(b) == 0 || cap(b) > maxPooledBatch {
		return
	}
	b = b[:0]
	batchBufs.Put(&b)
}

// prove is the proof of leadership of an empty Apply: the leader row's
// epoch is the Store's now. A plain read: with nothing to commit there is
// nothing to hold the row for, and it asks no flush of the WAL.
func (s *Store) prove() error {
	if s.epoch == 0 {
		return nil
	}
	var epoch int64
	if err := s.pool.QueryRow(s.ctx, "SELECT epoch FROM tether_leader WHERE id = 1").Scan(&epoch); err != nil {
		return fmt.Errorf("pgstore: proof of leadership: %w", s.mapErr(err))
	}
	if epoch != s.epoch {
		return fmt.Errorf("pgstore: proof of leadership: %w: the leader epoch is %d, this orchestrator's is %d", store.ErrDeposed, epoch, s.epoch)
	}
	return nil
}

type histRow struct {
	run                 string
	seq                 int64
	finished, submitted int64
	status, name        string
	summary, value      []byte
}

// prepare turns recs into the rows the tables will hold (a later record of
// a key wins): routed by kind, run records sealed, an archived run's
// columns derived, an audit entry's decoded; and encodes them as a journal
// row. Whatever a batch holds that the tables cannot is refused here,
// before it is committed, never at its fold.
func (s *Store) prepare(recs []core.Record) ([]jop, []byte, error) {
	last := make(map[string]int, len(recs))
	for i, r := range recs {
		last[r.Key] = i
	}
	ops := make([]jop, 0, len(last))
	for i, r := range recs {
		if last[r.Key] != i {
			continue
		}
		switch {
		case core.IsHistoryKey(r.Key):
			run := strings.TrimPrefix(r.Key, core.KindHistory+"/")
			if r.Delete {
				ops = append(ops, jop{table: tHistory, del: true, key: run})
				continue
			}
			h, err := s.historyRow(core.RunID(run), r.Value)
			if err == nil && (!textHolds(h.name) || !textHolds(h.status)) {
				err = errors.New("its run's name and status are UTF-8 without a NUL byte (text columns)")
			}
			if err != nil {
				return nil, nil, fmt.Errorf("pgstore: record %q: %w", r.Key, err)
			}
			ops = append(ops, jop{table: tHistory, key: run, value: h.value, hist: h})
		case strings.HasPrefix(r.Key, core.KindLog+"/"):
			ops = append(ops, jop{table: tLog, del: r.Delete, key: r.Key, value: r.Value})
		case core.IsAuditKey(r.Key):
			if r.Delete {
				ops = append(ops, jop{table: tAudit, del: true, key: r.Key})
				continue
			}
			var e core.AuditEntry
			if err := jsonUnmarshal(r.Value, &e); err != nil {
				return nil, nil, fmt.Errorf("pgstore: audit record %q: %w", r.Key, err)
			}
			if !textHolds(e.Actor) || !textHolds(e.Action) {
				return nil, nil, fmt.Errorf("pgstore: audit record %q: its actor and action are UTF-8 without a NUL byte (text columns)", r.Key)
			}
			ops = append(ops, jop{table: tAudit, key: r.Key, value: r.Value, at: nanos(e.At), actor: e.Actor, action: e.Action})
		default:
			if r.Delete {
				ops = append(ops, jop{table: tRecord, del: true, key: r.Key})
				continue
			}
			v := r.Value
			if s.keys.SealsRecord(r.Key) {
				var err error
				if v, err = s.keys.Seal(r.Key, v); err != nil {
					return nil, nil, err
				}
			}
			ops = append(ops, jop{table: tRecord, key: r.Key, value: v})
		}
	}
	buf := batchBufs.Get().(*[]byte)
	return ops, encodeOps((*buf)[:0], ops), nil
}

// queueOps queues the statements that write ops (one op a key): per table
// one multi-row upsert and one delete.
func queueOps(b *pgx.Batch, ops []jop) {
	type rows struct {
		keys, dels []string
		values     [][]byte
	}
	var live, logs, audit rows
	var ats []int64
	var actors, actions []string
	var hist []histRow
	var histDels []string
	for _, o := range ops {
		var t *rows
		switch o.table {
		case tRecord:
			t = &live
		case tLog:
			t = &logs
		case tAudit:
			t = &audit
			if !o.del {
				ats, actors, actions = append(ats, o.at), append(actors, o.actor), append(actions, o.action)
			}
		case tHistory:
			if o.del {
				histDels = append(histDels, o.key)
			} else {
				hist = append(hist, o.hist)
			}
			continue
		}
		if o.del {
			t.dels = append(t.dels, o.key)
		} else {
			t.keys, t.values = append(t.keys, o.key), append(t.values, o.value)
		}
	}
	if len(live.keys) > 0 {
		b.Queue(`INSERT INTO tether_record (key, value) SELECT * FROM unnest($1::text[], $2::bytea[])
			ON CONFLICT (key) DO UPDATE SET value = excluded.value`, live.keys, live.values)
	}
	if len(live.dels) > 0 {
		b.Queue(`DELETE FROM tether_record WHERE key = ANY($1::text[])`, live.dels)
	}
	if len(logs.keys) > 0 {
		b.Queue(`INSERT INTO tether_log (key, value) SELECT * FROM unnest($1::text[], $2::bytea[])
			ON CONFLICT (key) DO UPDATE SET value = excluded.value`, logs.keys, logs.values)
	}
	if len(logs.dels) > 0 {
		b.Queue(`DELETE FROM tether_log WHERE key = ANY($1::text[])`, logs.dels)
	}
	if len(audit.keys) > 0 {
		b.Queue(`INSERT INTO tether_audit (key, at_ns, actor, action, value) SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::bytea[])
			ON CONFLICT (key) DO UPDATE SET at_ns = excluded.at_ns, actor = excluded.actor, action = excluded.action, value = excluded.value`,
			audit.keys, ats, actors, actions, audit.values)
	}
	if len(audit.dels) > 0 {
		b.Queue(`DELETE FROM tether_audit WHERE key = ANY($1::text[])`, audit.dels)
	}
	if n := len(hist); n > 0 {
		runs, seqs, fins, subs := make([]string, n), make([]int64, n), make([]int64, n), make([]int64, n)
		stats, names, sums, vals := make([]string, n), make([]string, n), make([][]byte, n), make([][]byte, n)
		for i, h := range hist {
			runs[i], seqs[i], fins[i], subs[i], stats[i], names[i], sums[i], vals[i] = h.run, h.seq, h.finished, h.submitted, h.status, h.name, h.summary, h.value
		}
		b.Queue(`INSERT INTO tether_history (run, seq, finished_ns, submitted_ns, status, name, summary, value)
			SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $5::text[], $6::text[], $7::bytea[], $8::bytea[])
			ON CONFLICT (run) DO UPDATE SET seq = excluded.seq, finished_ns = excluded.finished_ns, submitted_ns = excluded.submitted_ns,
			status = excluded.status, name = excluded.name, summary = excluded.summary, value = excluded.value`,
			runs, seqs, fins, subs, stats, names, sums, vals)
	}
	if len(histDels) > 0 {
		b.Queue(`DELETE FROM tether_history WHERE run = ANY($1::text[])`, histDels)
	}
}

// nanos is t in Unix nanoseconds, the zero time (and before 1970) as 0.
func nanos(t time.Time) int64 {
	if t.IsZero() || t.UnixNano() < 0 {
		return 0
	}
	return t.UnixNano()
}

// Load returns the live records and the log lines of the live leases,
// sorted by key, in one query.
func (s *Store) Load() ([]core.Record, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	if err := s.catchUp(); err != nil {
		return nil, fmt.Errorf("pgstore: load: %w", err)
	}
	rows, err := s.pool.Query(s.ctx, `
		SELECT key, value FROM tether_record
		UNION ALL
		SELECT l.key, l.value FROM tether_record r JOIN tether_log l ON l.key >= 'log/' || substr(r.key, 7) || '/' AND l.key < 'log/' || substr(r.key, 7) || '0'
			WHERE r.key >= 'lease/' AND r.key < 'lease0'
		ORDER BY 1`)
	if err != nil {
		return nil, fmt.Errorf("pgstore: load: %w", s.mapErr(err))
	}
	var recs []core.Record
	for rows.Next() {
		var r core.Record
		if err := rows.Scan(&r.Key, &r.Value); err != nil {
			rows.Close()
			return nil, fmt.Errorf("pgstore: load: %w", err)
		}
		if strings.HasPrefix(r.Key, core.KindRun+"/") && store.Sealed(r.Value) {
			if r.Value, err = s.keys.Open(r.Key, r.Value); err != nil {
				rows.Close()
				return nil, fmt.Errorf("pgstore: load: %w", err)
			}
		}
		recs = append(recs, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgstore: load: %w", s.mapErr(err))
	}
	if !sort.SliceIsSorted(recs, func(i, j int) bool { return recs[i].Key < recs[j].Key }) {
		return nil, fmt.Errorf("pgstore: load: the database did not return the records in byte order (its keys' collation is not \"C\")")
	}
	return recs, nil
}
