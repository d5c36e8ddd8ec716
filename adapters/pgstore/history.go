package pgstore

// The history of archived runs (SPEC §7a), the log lines and the audit
// log (SPEC §15a): a commit's records are routed by their keys' kind (in
// prepare, before they are journaled; a fold writes them), as the bbolt
// store does: live state to tether_record, log lines to tether_log (a
// lease's lines are the range of keys "log/<lease>/…": Load and HistoryLogs
// read them with one index range each), archived runs to
// tether_history with the columns their listing filters on (the summary
// derived once, store.SummaryOf), audit entries to tether_audit. PostgreSQL
// compresses a history's JSON itself (TOAST, with lz4 where it can: schema.go's
// migration 5) unless it is sealed.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"github.com/jackc/pgx/v5"

	"github.com/tether-run/tether/adapters/store"
	"github.com/tether-run/tether/core"
)

// historyRow is the row of an archived run's record.
func (s *Store) historyRow(id core.RunID, v []byte) (histRow, error) {
	seq, ok := store.RunSeq(id)
	if !ok {
		return histRow{}, fmt.Errorf("history of run %q, which has no run number", id)
	}
	sum, err := store.SummaryOf(v)
	if err != nil {
		return histRow{}, fmt.Errorf("history value: %w", err)
	}
	if sum.ID != id {
		return histRow{}, fmt.Errorf("history record of %s holds run %q", id, sum.ID)
	}
	sj, err := json.Marshal(sum)
	if err != nil {
		return histRow{}, err
	}
	if key := core.HistoryKey(id); s.keys.SealsRecord(key) {
		if v, err = s.keys.Seal(key, v); err != nil {
			return histRow{}, err
		}
	}
	return histRow{run: string(id), seq: int64(seq), finished: nanos(sum.FinishedAt), submitted: nanos(sum.SubmittedAt),
		status: sum.Status, name: sum.Name, summary: sj, value: v}, nil
}

// decodeHistory decodes a stored history value, opening it if sealed.
func (s *Store) decodeHistory(run core.RunID, v []byte) (core.RunHistory, error) {
	var h core.RunHistory
	if store.Sealed(v) {
		plain, err := s.keys.Open(core.HistoryKey(run), v)
		if err != nil {
			return h, err
		}
		v = plain
	}
	if err := json.Unmarshal(v, &h); err != nil {
		return h, fmt.Errorf("history value: %w", err)
	}
	return h, nil
}

// History returns an archived run; store.ErrNotFound if there is none.
func (s *Store) History(run core.RunID) (core.RunHistory, error) {
	var v []byte
	err := s.read(func(ctx context.Context, tx pgx.Tx) error {
		return tx.QueryRow(ctx, "SELECT value FROM tether_history WHERE run = $1", string(run)).Scan(&v)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return core.RunHistory{}, fmt.Errorf("%w: no history of run %s", store.ErrNotFound, run)
	}
	if err != nil {
		return core.RunHistory{}, fmt.Errorf("pgstore: history of %s: %w", run, err)
	}
	h, err := s.decodeHistory(run, v)
	if err != nil {
		return core.RunHistory{}, fmt.Errorf("pgstore: run %s: %w", run, err)
	}
	return h, nil
}

// HistoryLogs returns a page of the log lines of leases, lease by lease in
// id order, each lease's in index order: at most limit lines (capped at
// store.MaxLogPage) after the cursor (a line's key; empty: the first).
// next is the cursor of the following page, empty when there is none.
func (s *Store) HistoryLogs(leases []core.LeaseID, after string, limit int) ([]core.StepLogLine, string, error) {
	if limit <= 0 || limit > store.MaxLogPage {
		limit = store.MaxLogPage
	}
	ids := make([]string, len(leases))
	for i, l := range leases {
		ids[i] = fmt.Sprintf("%020d", uint64(l))
	}
	sort.Strings(ids)
	var recs []core.Record
	err := s.read(func(ctx context.Context, tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT l.key, l.value FROM unnest($1::text[]) AS q(lease)
			JOIN tether_log l ON l.key >= 'log/' || q.lease || '/' AND l.key < 'log/' || q.lease || '0'
			WHERE l.key > $2 ORDER BY l.key LIMIT $3`, ids, after, limit+1)
		if err != nil {
			return err
		}
		recs = recs[:0]
		for rows.Next() {
			var r core.Record
			if err := rows.Scan(&r.Key, &r.Value); err != nil {
				rows.Close()
				return err
			}
			recs = append(recs, r)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, "", fmt.Errorf("pgstore: history logs: %w", err)
	}
	next := ""
	if len(recs) > limit {
		recs = recs[:limit]
		next = recs[limit-1].Key
	}
	lines := make([]core.StepLogLine, 0, len(recs))
	for _, r := range recs {
		v, err := core.DecodeRecord(r)
		if err != nil {
			return nil, "", fmt.Errorf("pgstore: history logs: %w", err)
		}
		ln, ok := v.(*core.StepLogLine)
		if !ok {
			return nil, "", fmt.Errorf("pgstore: history logs: record %q is not a log line", r.Key)
		}
		lines = append(lines, *ln)
	}
	return lines, next, nil
}

// ListRuns returns the archived runs matching f, newest (highest run
// number) first, numbered below cursor (0: from the newest): at most limit.
// next is the cursor of the following page, 0 when none is left.
func (s *Store) ListRuns(f store.RunFilter, cursor uint64, limit int) ([]store.RunSummary, uint64, error) {
	if limit <= 0 {
		return nil, cursor, nil
	}
	below := int64(^uint64(0) >> 1)
	if cursor != 0 {
		below = int64(cursor)
	}
	var runs []store.RunSummary
	var next uint64
	err := s.read(func(ctx context.Context, tx pgx.Tx) error {
		// As the bbolt store reads its index: newest first, at most
		// store.ListScanLimit runs examined (a filter that matches
		// little answers a short page and a cursor, never a scan of
		// the whole table), stopping at the first submitted before
		// Since.
		rows, err := tx.Query(ctx, `SELECT seq, summary FROM tether_history
			WHERE seq < $1 ORDER BY seq DESC LIMIT $2`, below, store.ListScanLimit+1)
		if err != nil {
			return err
		}
		defer rows.Close()
		runs, next = runs[:0], 0
		for scanned := 0; rows.Next(); scanned++ {
			var seq int64
			var sj []byte
			if err := rows.Scan(&seq, &sj); err != nil {
				return err
			}
			if len(runs) == limit || scanned == store.ListScanLimit {
				next = uint64(seq) + 1 // this one is not examined yet
				return nil
			}
			var sum store.RunSummary
			if err := json.Unmarshal(sj, &sum); err != nil {
				return fmt.Errorf("summary of run %d: %w", seq, err)
			}
			if !f.Since.IsZero() && sum.SubmittedAt.Before(f.Since) {
				return nil
			}
			if f.Match(sum.Status, sum.Name, sum.SubmittedAt) {
				runs = append(runs, sum)
			}
		}
		return rows.Err()
	})
	if err != nil {
		return nil, 0, fmt.Errorf("pgstore: list runs: %w", err)
	}
	return runs, next, nil
}

// ArchivedRuns counts the archived runs.
func (s *Store) ArchivedRuns() (int, error) {
	var n int
	err := s.read(func(ctx context.Context, tx pgx.Tx) error {
		return tx.QueryRow(ctx, "SELECT count(*) FROM tether_history").Scan(&n)
	})
	if err != nil {
		return 0, fmt.Errorf("pgstore: count archived runs: %w", err)
	}
	return n, nil
}

// Audit returns the entries q selects, newest first, and the cursor of the
// next page (0: none; pass it as Before).
func (s *Store) Audit(q store.AuditQuery) ([]core.AuditEntry, uint64, error) {
	if q.Limit <= 0 {
		q.Limit = 100
	}
	q.Limit = min(q.Limit, 1000)
	before := core.AuditKey(^uint64(0))
	if q.Before != 0 {
		before = core.AuditKey(q.Before)
	}
	entries := []core.AuditEntry{}
	var next uint64
	err := s.read(func(ctx context.Context, tx pgx.Tx) error {
		// As the bbolt store reads it: newest first, at most
		// store.AuditScanLimit entries examined (SPEC §12: a filter
		// that matches little answers a short page and a cursor),
		// stopping at the first recorded before Since.
		rows, err := tx.Query(ctx, `SELECT value FROM tether_audit
			WHERE key < $1 ORDER BY key DESC LIMIT $2`, before, store.AuditScanLimit+1)
		if err != nil {
			return err
		}
		defer rows.Close()
		entries, next = entries[:0], 0
		for scanned := 0; rows.Next(); scanned++ {
			var v []byte
			if err := rows.Scan(&v); err != nil {
				return err
			}
			var e core.AuditEntry
			if err := json.Unmarshal(v, &e); err != nil {
				return fmt.Errorf("audit entry: %w", err)
			}
			if !q.Since.IsZero() && e.At.Before(q.Since) {
				return nil // older entries are older still: the core's clock never runs back
			}
			if len(entries) == q.Limit || scanned == store.AuditScanLimit {
				next = e.Seq + 1 // this one is not examined yet
				return nil
			}
			if (q.Actor == "" || e.Actor == q.Actor) && (q.Action == "" || e.Action == q.Action) {
				entries = append(entries, e)
			}
		}
		return rows.Err()
	})
	if err != nil {
		return nil, 0, fmt.Errorf("pgstore: audit: %w", err)
	}
	return entries, next, nil
}
