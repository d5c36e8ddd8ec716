package pgstore

// The journal in front of the tables (SPEC §11). A commit of records
// (Apply, a place of the pipeline, the records of ApplyWithData) is the
// fence and one INSERT of the batch, already routed, sealed and derived
// (prepare: the rows the tables will hold), as one row of tether_journal
// under a sequence number; that row, committed and flushed, is the durable
// point. The applier, a goroutine of the Store, folds the rows gathered
// since into tether_record, tether_log, tether_audit and tether_history:
// of one key's rows in the entries folded together only the last is
// written (most of a step's rows are rewritten or deleted within a few
// commits), in one fenced transaction that also deletes the journal rows
// it folded, so a fold is all or nothing and a row is folded exactly once.
// That transaction commits with synchronous_commit off: losing it in a
// crash loses the journal rows' deletion with it, and the next Open folds
// them again; the WAL is one sequence, so any later flushed commit covers
// it too.
//
// A fold starts when foldEntries entries or foldBytes bytes have gathered,
// Options.FoldDelay after the oldest unfolded one, or at once when a reader waits:
// every read of those tables, and every other write, first waits until
// every entry acknowledged before it began is folded (catchUp). Entries
// are numbered in the order they are reserved (the pipeline's places in
// their order); a fold takes a prefix of them, never past one still in
// flight, so an entry is never folded before an earlier one. The applier
// folds from memory what this Store committed; after a commit whose
// outcome is unknown (its error may hide a commit) it reads the journal
// table instead. More than maxPendingEntries or maxPendingBytes unfolded
// makes the next commit wait for the applier.
//
// Open folds every row a predecessor left (a process killed before its
// fold, or a deposed leader's last commits) under its own fence before
// anything reads. A deposed leader's fold begins with the fence too: it
// fails with store.ErrDeposed and changes nothing; one in flight at the
// take-over holds the leader row FOR KEY SHARE, so the take-over waits for it
// to end, and the new leader's Open folds what is left after it.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tether-run/tether/adapters/store"
)

// DefaultFoldDelay is the longest an entry waits unfolded unless a read
// asks or enough gathered (Options.FoldDelay).
const DefaultFoldDelay = 100 * time.Millisecond

// The applier's thresholds and the journal's bound.
const (
	foldEntries       = 256         // entries gathered that start a fold
	foldBytes         = 16 << 20    // bytes gathered that start a fold
	maxFoldEntries    = 512         // at most this many entries in one fold
	maxFoldBytes      = 32 << 20    // and at most about this many bytes
	maxPendingEntries = 4096        // unfolded entries past which a commit waits
	maxPendingBytes   = 128 << 20   // unfolded bytes past which a commit waits
	foldRetryMax      = time.Second // the longest pause between failed folds
)

// The tables a journal row's ops go to.
const (
	tRecord  byte = 'r'
	tLog     byte = 'l'
	tAudit   byte = 'a'
	tHistory byte = 'h'
)

// asyncCommit makes the transaction it runs in commit without waiting for
// its flush (a fold's: see above).
const asyncCommit = "SELECT set_config('synchronous_commit', 'off', true)"

// jop is one row's write of a journal entry: an upsert or a delete of key
// in table, with the table's extra columns.
type jop struct {
	table  byte
	del    bool
	key    string // tether_history: the run id
	value  []byte
	at     int64   // tether_audit
	actor  string  // tether_audit
	action string  // tether_audit
	hist   histRow // tether_history (hist.value is value)
}

// entry is one journal row: its number and its ops.
type entry struct {
	seq  int64
	ops  []jop
	size int // encoded bytes
}

// encodeOps is a journal row's batch, in b's storage (its contents are
// dropped): a version byte, the number of ops,
// then each op's table, delete flag, key and (upserts) its columns, every
// string and byte string length-prefixed.
func encodeOps(b []byte, ops []jop) []byte {
	n := 16
	for _, o := range ops {
		n += 24 + len(o.key) + len(o.value) + len(o.actor) + len(o.action) + len(o.hist.status) + len(o.hist.name) + len(o.hist.summary) + 40
	}
	b = slices.Grow(b[:0], n)
	b = append(b, 1)
	b = binary.AppendUvarint(b, uint64(len(ops)))
	str := func(s []byte) { b = binary.AppendUvarint(b, uint64(len(s))); b = append(b, s...) }
	for _, o := range ops {
		b = append(b, o.table)
		if o.del {
			b = append(b, 1)
			str([]byte(o.key))
			continue
		}
		b = append(b, 0)
		str([]byte(o.key))
		str(o.value)
		switch o.table {
		case tAudit:
			b = binary.AppendVarint(b, o.at)
			str([]byte(o.actor))
			str([]byte(o.action))
		case tHistory:
			b = binary.AppendVarint(b, o.hist.seq)
			b = binary.AppendVarint(b, o.hist.finished)
			b = binary.AppendVarint(b, o.hist.submitted)
			str([]byte(o.hist.status))
			str([]byte(o.hist.name))
			str(o.hist.summary)
		}
	}
	return b
}

var errCorrupt = errors.New("corrupt journal entry")

// decodeOps reads what encodeOps wrote; anything else is an error.
func decodeOps(b []byte) ([]jop, error) {
	if len(b) == 0 || b[0] != 1 {
		return nil, fmt.Errorf("%w: unknown version", errCorrupt)
	}
	b = b[1:]
	bad := false
	uv := func() uint64 {
		v, k := binary.Uvarint(b)
		if k <= 0 {
			bad = true
			return 0
		}
		b = b[k:]
		return v
	}
	sv := func() int64 {
		v, k := binary.Varint(b)
		if k <= 0 {
			bad = true
			return 0
		}
		b = b[k:]
		return v
	}
	bytes := func() []byte {
		n := uv()
		if bad || n > uint64(len(b)) {
			bad = true
			return nil
		}
		v := b[:n:n]
		b = b[n:]
		return v
	}
	n := uv()
	if bad || n > uint64(len(b)) {
		return nil, fmt.Errorf("%w: bad op count", errCorrupt)
	}
	ops := make([]jop, 0, n)
	for range n {
		if len(b) < 2 {
			return nil, fmt.Errorf("%w: truncated", errCorrupt)
		}
		o := jop{table: b[0], del: b[1] == 1}
		b = b[2:]
		switch o.table {
		case tRecord, tLog, tAudit, tHistory:
		default:
			return nil, fmt.Errorf("%w: unknown table %q", errCorrupt, o.table)
		}
		o.key = string(bytes())
		if !o.del {
			o.value = bytes()
			switch o.table {
			case tAudit:
				o.at = sv()
				o.actor = string(bytes())
				o.action = string(bytes())
			case tHistory:
				o.hist = histRow{run: o.key, seq: sv(), finished: sv(), submitted: sv()}
				o.hist.status = string(bytes())
				o.hist.name = string(bytes())
				o.hist.summary = bytes()
				o.hist.value = o.value
			}
			if o.value == nil && !bad {
				o.value = []byte{}
			}
		}
		if bad {
			return nil, fmt.Errorf("%w: truncated", errCorrupt)
		}
		ops = append(ops, o)
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("%w: %d bytes past its ops", errCorrupt, len(b))
	}
	return ops, nil
}

// merge is the ops of entries folded together: of one key's ops only the
// last, in table then key order.
func merge(entries [][]jop) []jop {
	type tk struct {
		table byte
		key   string
	}
	n := 0
	for _, ops := range entries {
		n += len(ops)
	}
	at := make(map[tk]int, n) // sized once: growing it (and out) was most of its allocation
	out := make([]jop, 0, n)
	for _, ops := range entries {
		for _, o := range ops {
			k := tk{o.table, o.key}
			if i, ok := at[k]; ok {
				out[i] = o
				continue
			}
			at[k] = len(out)
			out = append(out, o)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].table != out[j].table {
			return out[i].table < out[j].table
		}
		return out[i].key < out[j].key
	})
	return out
}

// reserveSeq numbers the next journal entry and marks it in flight.
// Callers hold no lock of the journal.
func (s *Store) reserveSeq() int64 {
	s.jmu.Lock()
	defer s.jmu.Unlock()
	return s.reserveSeqLocked()
}

func (s *Store) reserveSeqLocked() int64 {
	s.jseq++
	s.inflight[s.jseq] = struct{}{}
	return s.jseq
}

// admit waits while the journal holds more than its bound unfolded (the
// applier asked to fold at once); it fails when the applier cannot.
func (s *Store) admit() error {
	s.jmu.Lock()
	defer s.jmu.Unlock()
	gen := s.foldGen
	for len(s.pending) >= maxPendingEntries || s.pendingBytes >= maxPendingBytes {
		if err := s.check(); err != nil {
			return err
		}
		if s.stopped != nil {
			return fmt.Errorf("pgstore: the journal's applier stopped: %w", s.stopped)
		}
		if s.foldGen != gen && s.foldFails > s.failLimit() {
			return fmt.Errorf("pgstore: the journal is full (%d entries, %d bytes unfolded) and the applier cannot fold: %w", len(s.pending), s.pendingBytes, s.foldErr)
		}
		s.urgent = true
		s.kickLocked()
		s.jcond.Wait()
	}
	return nil
}

// committed ends the flight of entry seq: on success its ops wait in
// memory for the applier; on failure the outcome may be unknown (a commit
// the connection lost), so the applier reads the journal table until it
// is past seq.
func (s *Store) committed(seq int64, ops []jop, size int, err error) {
	s.jmu.Lock()
	defer s.jmu.Unlock()
	delete(s.inflight, seq)
	if err != nil {
		s.jUnsure = max(s.jUnsure, seq)
	} else {
		s.acked = max(s.acked, seq)
		e := entry{seq: seq, ops: ops, size: size}
		i := sort.Search(len(s.pending), func(i int) bool { return s.pending[i].seq > seq })
		s.pending = append(s.pending, entry{})
		copy(s.pending[i+1:], s.pending[i:])
		s.pending[i] = e
		s.pendingBytes += size
	}
	if len(s.pending) == 1 || len(s.pending) >= foldEntries || s.pendingBytes >= foldBytes || s.jUnsure > s.folded {
		s.kickLocked()
	}
	s.jcond.Broadcast()
}

func (s *Store) kickLocked() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// lowWaterLocked is the first entry number a fold may not reach: the
// oldest in flight, else the next to be reserved.
func (s *Store) lowWaterLocked() int64 {
	lw := s.jseq + 1
	for q := range s.inflight {
		lw = min(lw, q)
	}
	return lw
}

// catchUp waits until every entry acknowledged before it was called is
// folded into the tables (the applier asked to fold at once).
func (s *Store) catchUp() error {
	s.jmu.Lock()
	defer s.jmu.Unlock()
	target := max(s.acked, s.jUnsure)
	gen := s.foldGen
	for s.folded < target {
		if err := s.check(); err != nil {
			return err
		}
		if s.stopped != nil {
			return fmt.Errorf("pgstore: the journal's applier stopped: %w", s.stopped)
		}
		if s.foldGen != gen && s.foldFails > s.failLimit() {
			return fmt.Errorf("pgstore: the journal's entries up to %d are not in the tables yet: %w", target, s.foldErr)
		}
		s.urgent = true
		s.kickLocked()
		s.jcond.Wait()
	}
	return nil
}

// failLimit is how many folds may fail in a row, at once, before the
// applier pauses between them and waiters get the error: one more than
// the connections the database can have cut (a restart cuts them all).
func (s *Store) failLimit() int { return int(s.pool.Config().MaxConns) + 1 }

// applier folds the journal until the Store closes or is deposed.
func (s *Store) applier() {
	defer close(s.applierDone)
	t := time.NewTimer(time.Hour)
	t.Stop()
	retry := time.Duration(0)
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.kick:
		case <-t.C:
		}
		for {
			due, wait := s.due()
			if !due {
				if wait > 0 {
					t.Reset(wait)
				}
				break
			}
			err := s.foldOnce()
			stop := err != nil && (s.closed.Load() || isDeposed(err))
			s.jmu.Lock()
			s.foldGen++
			s.foldErr = err
			s.foldFails++
			if err == nil {
				s.foldFails = 0
			}
			if stop {
				s.stopped = err
			}
			s.jcond.Broadcast()
			s.jmu.Unlock()
			if err == nil {
				retry = 0
				continue
			}
			if stop {
				return
			}
			if s.foldFails <= s.failLimit() {
				continue // a connection the database cut: the next one may serve
			}
			retry = min(max(2*retry, 10*time.Millisecond), foldRetryMax)
			select {
			case <-s.ctx.Done():
				return
			case <-time.After(retry):
			}
		}
	}
}

// due says whether a fold should run now, else how long until the oldest
// unfolded entry has waited foldDelay (0: nothing to fold).
func (s *Store) due() (bool, time.Duration) {
	s.jmu.Lock()
	defer s.jmu.Unlock()
	lw := s.lowWaterLocked()
	ready := 0
	for ready < len(s.pending) && s.pending[ready].seq < lw {
		ready++
	}
	if s.jUnsure > s.folded && s.jUnsure < lw {
		return true, 0
	}
	if ready == 0 {
		s.urgent = s.urgent && len(s.pending) > 0
		return false, 0
	}
	if s.urgent || ready >= foldEntries || s.pendingBytes >= foldBytes {
		return true, 0
	}
	if s.oldest.IsZero() {
		s.oldest = time.Now()
	}
	if w := s.foldDelay - time.Since(s.oldest); w > 0 {
		return false, w
	}
	return true, 0
}

// foldOnce folds one prefix of the journal: from memory, or from the
// table when a commit's outcome was unknown.
func (s *Store) foldOnce() error {
	s.jmu.Lock()
	lw := s.lowWaterLocked()
	fromTable := s.jUnsure > s.folded && s.jUnsure < lw
	var take []entry
	bytes := 0
	for _, e := range s.pending {
		if e.seq >= lw || len(take) >= maxFoldEntries || (bytes >= maxFoldBytes && len(take) > 0) {
			break
		}
		take = append(take, e)
		bytes += e.size
	}
	s.jmu.Unlock()
	var hi int64
	if fromTable {
		var more bool
		var err error
		hi, more, err = s.foldTable(lw - 1)
		if err != nil {
			return err
		}
		if !more {
			hi = lw - 1
		}
	} else {
		if len(take) == 0 {
			return nil
		}
		lists := make([][]jop, len(take))
		for i, e := range take {
			lists[i] = e.ops
		}
		hi = take[len(take)-1].seq
		ops := merge(lists)
		if len(ops) > 0 {
			if err := s.fold(take[0].seq, hi, ops); err != nil {
				return err
			}
		}
	}
	s.jmu.Lock()
	s.folded = max(s.folded, hi)
	k := 0
	for k < len(s.pending) && s.pending[k].seq <= hi {
		s.pendingBytes -= s.pending[k].size
		k++
	}
	s.pending = append(s.pending[:0], s.pending[k:]...)
	s.oldest = time.Time{}
	if len(s.pending) > 0 {
		s.oldest = time.Now() // the rest waits at most foldDelay more
	}
	s.urgent = s.urgent && len(s.pending) > 0
	s.jmu.Unlock()
	return nil
}

// fold writes ops and deletes the journal rows lo..hi in one fenced
// transaction (one round trip).
func (s *Store) fold(lo, hi int64, ops []jop) error {
	if err := s.check(); err != nil {
		return err
	}
	b := &pgx.Batch{}
	b.Queue(asyncCommit)
	s.fence(b)
	queueOps(b, ops)
	b.Queue("DELETE FROM tether_journal WHERE seq BETWEEN $1 AND $2", lo, hi)
	err := s.pool.SendBatch(s.ctx, b).Close()
	if err != nil {
		return fmt.Errorf("pgstore: fold journal entries %d to %d (%d rows): %w", lo, hi, len(ops), s.mapErr(err))
	}
	return nil
}

// foldTable folds the journal's rows numbered up to hi (0: all) from the
// table, at most maxFoldEntries (and about maxFoldBytes) in one fenced
// transaction: the number of the last folded (0: none) and whether rows
// up to hi are left.
func (s *Store) foldTable(hi int64) (last int64, more bool, err error) {
	if hi == 0 {
		hi = 1<<63 - 1
	}
	err = s.tx(false, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, asyncCommit); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, "SELECT seq, batch FROM tether_journal WHERE seq <= $1 ORDER BY seq LIMIT $2", hi, maxFoldEntries)
		if err != nil {
			return err
		}
		var lists [][]jop
		bytes := 0
		last, more = 0, false
		for rows.Next() {
			var seq int64
			var batch []byte
			if err := rows.Scan(&seq, &batch); err != nil {
				rows.Close()
				return err
			}
			ops, err := decodeOps(batch)
			if err != nil {
				rows.Close()
				return fmt.Errorf("journal entry %d: %w", seq, err)
			}
			lists = append(lists, ops)
			last = seq
			if bytes += len(batch); bytes >= maxFoldBytes {
				more = true
				break
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if len(lists) == maxFoldEntries {
			more = true
		}
		if len(lists) == 0 {
			return nil
		}
		b := &pgx.Batch{}
		queueOps(b, merge(lists))
		b.Queue("DELETE FROM tether_journal WHERE seq <= $1", last)
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return 0, false, fmt.Errorf("pgstore: fold the journal's rows: %w", err)
	}
	return last, more, nil
}

// foldAll folds every row of the journal table (Open).
func (s *Store) foldAll() error {
	for {
		_, more, err := s.foldTable(0)
		if err != nil || !more {
			return err
		}
	}
}

// isDeposed says whether err is the fence's.
func isDeposed(err error) bool {
	return errors.Is(err, store.ErrDeposed)
}
