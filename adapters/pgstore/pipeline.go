package pgstore

// The pipeline (store.Pipeline, SPEC §11): up to Options.Pipeline batches
// in flight at once, each on a connection of its own, made durable in the
// order of their places. A place's transaction begins with tether_order
// (schema.go): after the fence, it locks the one row of tether_order, which
// holds the place of the last committed batch, and goes on only if that is
// the place just before its own, which it then writes. The lock is held to
// the end of the transaction, so the next place's transaction waits there
// until this one committed (and then reads its place) or rolled back (and
// then reads the place before: it fails). So a place commits only after
// every earlier one did, in the same database, whatever the connections'
// timing: what is durable is always a prefix of the places. The WAL is one
// sequence, so the flush of a place's commit also covers every earlier
// commit record.
//
// What the pipeline overlaps is everything but that serial work: the
// round trip, the client's encoding and the server's parsing of the next
// batch are done while the batch before commits. The rows themselves are
// written only after the lock, so two places never wait on each other's
// rows in opposite orders (no deadlock). A place's rows are its journal
// row (journal.go), numbered at Reserve, in the places' order, so the
// applier folds places in the order they became durable.
//
// A place whose transaction reached the lock before the place before it
// had (the two connections raced) finds the last committed place two
// behind, and fails with orderCode; its function then waits for the place
// before, and if that one committed, runs its transaction again, once.

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tether-run/tether/adapters/store"
	"github.com/tether-run/tether/core"
)

// DefaultPipeline is the pipeline's depth unless Options.Pipeline sets it:
// one group at a time, as no gain from more was measured on a shared
// 2-core machine (the server's serial work is the limit there).
const DefaultPipeline = 1

var _ store.Pipeline = (*Store)(nil)

// place is one reserved place of the pipeline. Its number is fixed on the
// commit goroutine, not at Reserve (on the driver's loop): the first place
// of a chain reads the last committed one from the database, each later one
// waits for the number of the place before. A place that cannot be
// numbered (the read failed) breaks the chain: every later place fails
// with it, since a number guessed after it could match what the database
// holds and commit without it.
type place struct {
	prev     *place // nil: the first since the last committed was read
	numbered chan struct{}
	n        int64 // set before numbered is closed, unless broken
	broken   error // set before numbered is closed: no number
	done     chan struct{}
	err      error // set before done is closed
	seq      int64 // its journal entry's number, taken in place order (journal.go)
}

// PipelineDepth is Options.Pipeline (DefaultPipeline when zero).
func (s *Store) PipelineDepth() int { return s.depth }

// Reserve takes the next place (store.Pipeline).
func (s *Store) Reserve() func(recs []core.Record) error {
	s.orderMu.Lock()
	defer s.orderMu.Unlock()
	p := &place{prev: s.last, numbered: make(chan struct{}), done: make(chan struct{}), seq: s.reserveSeq()}
	if s.last != nil && s.failed && s.outstanding == 0 {
		// Every place since the failure has returned: start again
		// after what is durable.
		p.prev, s.failed = nil, false
	}
	s.last = p
	s.outstanding++
	return func(recs []core.Record) error {
		err := s.number(p)
		if err == nil {
			err = s.applyPlace(p, recs)
		}
		if err != nil {
			s.committed(p.seq, nil, 0, err)
		}
		s.orderMu.Lock()
		if err != nil {
			s.failed = true
		}
		s.outstanding--
		s.orderMu.Unlock()
		p.err = err
		// Only this place's own call reads prev (the places after it read
		// its number and its end): let go of it, or every place ever
		// reserved would stay reachable from s.last.
		p.prev = nil
		close(p.done)
		return err
	}
}

// number fixes p's number (see place).
func (s *Store) number(p *place) error {
	defer close(p.numbered)
	if p.prev == nil {
		n, err := s.lastCommitted()
		p.n, p.broken = n+1, err
		return p.broken
	}
	<-p.prev.numbered
	if p.prev.broken != nil {
		p.broken = fmt.Errorf("pgstore: the place before has no number: %w", store.ErrEarlierFailed)
		return p.broken
	}
	p.n = p.prev.n + 1
	return nil
}

// lastCommitted reads the place of the last committed batch.
func (s *Store) lastCommitted() (int64, error) {
	if err := s.check(); err != nil {
		return 0, err
	}
	var n int64
	if err := s.pool.QueryRow(s.ctx, "SELECT n FROM tether_order WHERE id = 1").Scan(&n); err != nil {
		return 0, fmt.Errorf("pgstore: the pipeline's last commit: %w", s.mapErr(err))
	}
	return n, nil
}

// applyPlace commits recs in p's place.
func (s *Store) applyPlace(p *place, recs []core.Record) error {
	if err := s.check(); err != nil {
		return err
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
	args := [][]byte{strconv.AppendInt(nil, s.epoch, 10), strconv.AppendInt(nil, p.n, 10)}
	row := batch
	if len(ops) == 0 {
		row = nil
	}
	for retried := false; ; retried = true {
		err := s.sendJournal(&orderStmt, args, p.seq, row)
		if err == nil {
			s.committed(p.seq, ops, len(batch), nil)
			return nil
		}
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != orderCode || p.prev == nil || retried {
			return fmt.Errorf("pgstore: apply %d records in place %d: %w", len(recs), p.n, s.mapErr(err))
		}
		// The place before had not taken the lock yet, or it failed.
		<-p.prev.done
		if p.prev.err != nil {
			return fmt.Errorf("pgstore: %d records in place %d: %w", len(recs), p.n, store.ErrEarlierFailed)
		}
	}
}
