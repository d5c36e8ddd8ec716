// Package store is the orchestrator's durable record store on bbolt, and
// the data plane's (data.go).
//
// A Store holds core.Records, keyed snapshots of entities. Apply appends a
// batch of upserts and deletes as one entry of the store's log and
// fdatasyncs it (wal.go), and the log's applier puts it in the bbolt file
// later: when Apply returns nil the whole batch is on stable storage, and
// after a crash either all of it or none of it is there.
//
// Records go to a bucket by their key's kind (history.go): live state to
// "records", log lines to "logs", archived runs (SPEC §7a) to "history" with
// their indexes. Load returns the live records and the log lines of live
// leases, sorted by key, which is what core.Restore wants; history is read
// by History, HistoryLogs and ListRuns, each in a short read transaction.
package store

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/tether-run/tether/core"
)

// bucket holds the live records, keyed by core.Record.Key (history.go holds
// the other kinds' buckets), but for two kinds kept apart in their own
// buckets because of their size and how often they change: liveBuckets.
var bucket = []byte("records")

// bktRuns holds the live runs' records, large (a run carries its whole
// spec: tens of KB for a run of a few hundred steps), and bktMeta the one
// meta record, rewritten by nearly every commit. In one bucket with the
// rest, a bbolt leaf holds at least two entries, so the meta record or a
// step shared a leaf with a run's record and every commit rewrote that
// record's pages with it. bbolt's TxStats after `go test
// ./adapters/orchestrator -run '^$' -bench 'EndToEnd/steps=20000/workers=4/slots=1$'
// -benchtime 1x` (read with a temporary hook): 252,900 pages allocated for
// the 20,000 steps in one bucket, 77,152 with these two.
var (
	bktRuns = []byte("runs")
	bktMeta = []byte("meta")
)

// liveBuckets are the buckets of the live records, which Load reads.
var liveBuckets = [][]byte{bucket, bktRuns, bktMeta}

// liveBucket is the bucket of a live record's key.
func liveBucket(key string) []byte {
	switch {
	case key == core.KindMeta:
		return bktMeta
	case len(key) > len(core.KindRun) && key[:len(core.KindRun)+1] == core.KindRun+"/":
		return bktRuns
	}
	return bucket
}

// openTimeout bounds the wait for bbolt's file lock, held by another process
// (or another Store in this one) that has the file open.
const openTimeout = 2 * time.Second

var (
	// ErrClosed is returned when a Store is used after Close.
	ErrClosed = errors.New("store: closed")
	// ErrEmptyKey is returned when a record to apply has an empty key.
	ErrEmptyKey = errors.New("store: record with an empty key")
	// ErrKeyTooLarge is returned when a record's key exceeds bbolt's key limit.
	ErrKeyTooLarge = errors.New("store: record key too large")
	// ErrNoValue is returned when an upsert record carries no value.
	ErrNoValue = errors.New("store: upsert record without a value")
	// ErrLocked is returned (wrapped, naming the file) when another process
	// holds the store file open: bbolt's lock was not free within
	// openTimeout.
	ErrLocked = errors.New("store: locked by another process")
)

// Store is a bbolt file of core.Records. It is safe for concurrent use, though
// the orchestrator driver uses it from one goroutine.
type Store struct {
	db    *bolt.DB
	blobs Blobs // the data plane's large bytes (blob.go)

	blobMu   sync.Mutex
	pins     map[string]int  // blobs written and not yet released, by SHA-256
	unsure   map[string]bool // released blobs to collect unless a record names them
	creating int             // WriteBlobs under way
	holds    int             // Backups under way: no blob is collected (tools.go)

	keys Sealer // the secrets key (seal.go, secrets.go); none until SetSecretsKey

	log *wlog // the log in front of the file (wal.go); nil with Options.NoLog
}

// Open opens (creating if needed) the store file at path, its log
// path+".wal" (wal.go) and its blob directory path+".blobs", replaying the
// log's entries not yet in the file and collecting the blobs no record
// names. It fails after a short wait if another Store holds the file.
func Open(path string) (*Store, error) { return OpenWith(path, Options{}) }

// OpenWith is Open with options.
func OpenWith(path string, opts Options) (*Store, error) {
	// NoFreelistSync: bbolt does not write its list of free pages at every
	// commit, and rebuilds it by walking the file's pages when it opens it.
	// Archival deletes records and rewrites the live ones, so the file keeps
	// a few thousand free pages; writing their list (tens of KB, and as much
	// garbage) with every fsync'd commit: the end-to-end benchmark at 1
	// slot (adapters/orchestrator/PERFORMANCE.md), alternated with and
	// without it, made 2,914 · 3,143 steps/s with it and 3,459 · 3,259
	// without. The walk at open is short (the soak's restart with
	// 1,000,000 finished steps serves after 14 ms); the pages it touched
	// are released below.
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: openTimeout, NoSync: false, NoFreelistSync: true})
	if errors.Is(err, bolt.ErrTimeout) {
		return nil, fmt.Errorf("%w: %s is held open by another process (another orchestrator serving this data directory?) "+
			"and its lock was not free within %s; stop that process or use another data directory", ErrLocked, path, openTimeout)
	}
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range append([][]byte{bucket, bktRuns, bktMeta, bktBlob, bktLogs, bktHistory, bktRunsBySeq, bktRunsByFinish, bktHistoryStats, bktPruning, bktAudit}, dataBuckets...) {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return fmt.Errorf("bucket %s: %w", b, err)
			}
		}
		return ensureBlobBy(tx)
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("store: create bucket in %s: %w", path, err)
	}
	// A store of the layout before archival kept every kind in "records".
	if err := migrate(db); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: migrate %s: %w", path, err)
	}
	// The log's entries not yet in the file go in before anything reads it.
	walSt, err := recoverLog(db, path, !opts.NoLog)
	if err != nil {
		db.Close()
		return nil, err
	}
	blobs, err := openDirBlobs(path + ".blobs")
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("store: blob directory of %s: %w", path, err)
	}
	s := &Store{db: db, blobs: blobs, pins: map[string]int{}, unsure: map[string]bool{}}
	if err := s.useKeyNextTo(path); err != nil { // SPEC §14a
		db.Close()
		return nil, err
	}
	// Blobs of writes that never committed (refused while a crash came, or
	// a crash between the blob and its record) are collected now.
	if _, err := s.CollectBlobs(); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	// Opening read the file through its map (the free pages' walk, the
	// migration, the blob collection): none of it is needed resident.
	if err := s.ReleaseMapped(); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	if !opts.NoLog {
		if s.log, err = openLog(db, path, walSt, opts.LogLimit); err != nil {
			db.Close()
			return nil, err
		}
	}
	return s, nil
}

// Apply makes a batch of records durable: upserts put their value, deletes
// remove their key, in order (a later record of the same key wins). With
// the log, the batch is one entry of it, fdatasynced, and reaches the file
// later (wal.go); without, it is one bbolt transaction, committed and
// synced. It returns only once the batch is on stable storage. On error
// the batch was not acknowledged: without the log nothing of it is
// applied; with it, an entry written whole before its fdatasync failed may
// still be replayed at the next Open, as if the process had crashed before
// answering (which the caller must assume anyway: it exits, SPEC §11).
func (s *Store) Apply(recs []core.Record) error {
	if len(recs) == 0 {
		// Writes nothing, but answers as any batch would: a closed store
		// or a broken log (a failed fdatasync: the only safe answer is to
		// stop) is not hidden behind groups that happen to be empty.
		if s.log != nil {
			return s.log.failed()
		}
		return s.mapErr(s.db.View(func(*bolt.Tx) error { return nil }))
	}
	if err := checkRecords(recs); err != nil {
		return err
	}
	if s.log != nil {
		pp := prepPool.Get().(*[]prep)
		defer func() {
			clear(*pp)
			prepPool.Put(pp)
		}()
		ps := slices.Grow((*pp)[:0], len(recs))[:len(recs)]
		*pp = ps
		for i, r := range recs {
			var err error
			if ps[i], err = prepare(r, s); err != nil {
				return fmt.Errorf("store: apply %d records: record %q: %w", len(recs), r.Key, err)
			}
		}
		if err := s.log.append(encodePayload(ps)); err != nil { // the payload holds copies
			return fmt.Errorf("store: apply %d records: %w", len(recs), err)
		}
		return nil
	}
	err := s.db.Update(func(tx *bolt.Tx) error { return putRecords(tx, recs, s) })
	if err != nil {
		return fmt.Errorf("store: apply %d records: %w", len(recs), s.mapErr(err))
	}
	return nil
}

// view is a read transaction that sees every batch Apply acknowledged
// before it was called (wal.go's barrier).
func (s *Store) view(fn func(*bolt.Tx) error) error {
	if s.log != nil {
		if err := s.log.barrier(); err != nil {
			return err
		}
	}
	return s.db.View(fn)
}

// update is a synced write transaction after every batch Apply
// acknowledged before it was called.
func (s *Store) update(fn func(*bolt.Tx) error) error {
	if s.log != nil {
		if err := s.log.barrier(); err != nil {
			return err
		}
	}
	return s.db.Update(fn)
}

// checkRecords refuses a batch with a record bbolt cannot hold.
func checkRecords(recs []core.Record) error {
	for i, r := range recs {
		switch {
		case r.Key == "":
			return fmt.Errorf("store: apply record %d of %d: %w", i+1, len(recs), ErrEmptyKey)
		case len(r.Key) > bolt.MaxKeySize:
			return fmt.Errorf("store: apply record %d of %d (%.40q…): %w", i+1, len(recs), r.Key, ErrKeyTooLarge)
		case !r.Delete && r.Value == nil:
			return fmt.Errorf("store: apply record %q: %w", r.Key, ErrNoValue)
		}
	}
	return nil
}

// putRecords writes a batch of records inside tx, each to its kind's bucket.
// With sl's secrets key, a run's record and its history are sealed
// (secrets.go: a run carries its env:); sl is nil where nothing is sealed.
func putRecords(tx *bolt.Tx, recs []core.Record, sl *Store) error {
	for _, r := range recs {
		p, err := prepare(r, sl)
		if err == nil {
			err = p.put(tx)
		}
		if err != nil {
			return fmt.Errorf("record %q: %w", r.Key, err)
		}
	}
	return nil
}

// prep is a record as the store keeps it: a run's record sealed, a
// history compressed (and sealed) with the entries of its indexes. What
// can refuse a record is done by prepare, so that the log (wal.go) holds
// only batches whose application cannot fail but for the file itself.
type prep struct {
	key    string
	val    []byte // the stored value; nil for a delete
	del    bool
	hist   bool   // a history record (SPEC §7a): val the history, sum and finish its indexes'
	sum    []byte // runs_by_seq's value: the run's summary (JSON)
	finish []byte // runs_by_finish's key
}

// prepPool holds Apply's lists of prepared records: one per commit would
// be a few kilobytes each time (SPEC §12, the loop's longest step).
var prepPool = sync.Pool{New: func() any { return new([]prep) }}

// prepare turns a record into what put writes. It reads nothing of the
// file: its result is the same whenever it is applied.
func prepare(r core.Record, sl *Store) (prep, error) {
	switch {
	case core.IsHistoryKey(r.Key):
		return prepareHistory(r, sl)
	case !r.Delete && sl.sealsRecord(r.Key):
		v, err := sl.keys.Seal(r.Key, r.Value)
		return prep{key: r.Key, val: v}, err
	}
	return prep{key: r.Key, val: r.Value, del: r.Delete}, nil
}

// put writes a prepared record inside tx, to its kind's bucket.
func (p prep) put(tx *bolt.Tx) error {
	switch {
	case p.hist:
		return putHistory(tx, p)
	case isLogKey(p.key):
		return putIn(tx.Bucket(bktLogs), p)
	case core.IsAuditKey(p.key):
		return putIn(tx.Bucket(bktAudit), p)
	}
	return putIn(tx.Bucket(liveBucket(p.key)), p)
}

func putIn(b *bolt.Bucket, p prep) error {
	if p.del {
		return b.Delete([]byte(p.key))
	}
	return b.Put([]byte(p.key), p.val)
}

// Load returns the live records and the log lines of the live leases, sorted
// by key (bbolt's byte order, which is Go's string order). Its cost is that
// of the live state: the log lines are sought lease by lease, and history is
// not read (SPEC §7a: Restore loads live state only).
func (s *Store) Load() ([]core.Record, error) {
	var recs []core.Record
	err := s.view(func(tx *bolt.Tx) error {
		var leases [][]byte
		for _, name := range liveBuckets {
			err := tx.Bucket(name).ForEach(func(k, v []byte) error {
				if bytes.Equal(name, bktRuns) && Sealed(v) { // a run's record, sealed (secrets.go)
					plain, err := s.keys.Open(string(k), v)
					if err != nil {
						return err
					}
					recs = append(recs, core.Record{Key: string(k), Value: plain})
					return nil
				}
				// bbolt's slices are valid only inside the transaction.
				recs = append(recs, core.Record{Key: string(k), Value: append([]byte{}, v...)})
				if id, ok := bytes.CutPrefix(k, leasePrefix); ok {
					leases = append(leases, id)
				}
				return nil
			})
			if err != nil {
				return err
			}
		}
		c := tx.Bucket(bktLogs).Cursor()
		for _, id := range leases {
			prefix := logPrefix(id)
			for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
				recs = append(recs, core.Record{Key: string(k), Value: append([]byte{}, v...)})
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: load: %w", s.mapErr(err))
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].Key < recs[j].Key })
	return recs, nil
}

// Close applies what the log holds to the file and closes both; closing
// twice is harmless. Apply and Load return ErrClosed afterwards.
func (s *Store) Close() error {
	var lerr error
	if s.log != nil {
		lerr = s.log.close()
	}
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("store: close: %w", err)
	}
	if lerr != nil {
		return fmt.Errorf("store: close: %w", lerr)
	}
	return nil
}

// Path returns the file's path.
func (s *Store) Path() string { return s.db.Path() }

func (s *Store) mapErr(err error) error {
	if errors.Is(err, berrors.ErrDatabaseNotOpen) {
		return ErrClosed
	}
	return err
}
