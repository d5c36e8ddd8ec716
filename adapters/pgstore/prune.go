package pgstore

// Retention (SPEC §7a) with the bbolt store's rules, each kind deleted in
// fenced transactions of at most budget rows of its own table (a stream's
// appends and a bundle's file index go with it). PostgreSQL's writers do
// not wait for each other unless they touch the same rows, so a pass
// never holds the driver's commits; the budget keeps each transaction
// short.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tether-run/tether/adapters/store"
	"github.com/tether-run/tether/core"
)

// pruneStep is one transaction of one kind of deletion: it adds what it
// deleted to st, returns the blobs that may have lost their last name, and
// says whether more is left.
type pruneStep func(ctx context.Context, tx pgx.Tx, budget int, st *store.PruneStats) (blobs []string, more bool, err error)

// prune runs each step until it says nothing is left.
func (s *Store) prune(budget int, steps ...pruneStep) (store.PruneStats, error) {
	if budget <= 0 {
		budget = store.PruneBudget
	}
	var st store.PruneStats
	for _, step := range steps {
		for more := true; more; {
			var pass store.PruneStats
			var blobs []string
			err := s.write(func(ctx context.Context, tx pgx.Tx) error {
				pass = store.PruneStats{}
				var err error
				blobs, more, err = step(ctx, tx, budget, &pass)
				return err
			})
			if err != nil {
				return st, fmt.Errorf("pgstore: prune: %w", err)
			}
			pass.Transactions = 1
			st.Add(pass)
			st.Blobs += s.release(blobs)
		}
	}
	return st, nil
}

// release collects those of shas no record names and no write pins.
func (s *Store) release(shas []string) int {
	if len(shas) == 0 {
		return 0
	}
	s.blobMu.Lock()
	defer s.blobMu.Unlock()
	var free []string
	for _, sha := range shas {
		if s.pins[sha] == 0 {
			free = append(free, sha)
		}
	}
	n, err := s.removeUnnamed(free)
	if err != nil {
		for _, sha := range free {
			s.unsure[sha] = true
		}
	}
	return n
}

// PruneAudit deletes the audit entries recorded before cutoff.
func (s *Store) PruneAudit(cutoff time.Time, budget int) (store.PruneStats, error) {
	return s.prune(budget, func(ctx context.Context, tx pgx.Tx, budget int, st *store.PruneStats) ([]string, bool, error) {
		tag, err := tx.Exec(ctx, `DELETE FROM tether_audit WHERE key IN
			(SELECT key FROM tether_audit WHERE at_ns < $1 ORDER BY key LIMIT $2)`, nanos(cutoff), budget)
		if err != nil {
			return nil, false, err
		}
		st.Audit += int(tag.RowsAffected())
		return nil, int(tag.RowsAffected()) == budget, nil
	})
}

// PruneHistory deletes the archived runs that finished before cutoff and
// their log lines: a run leaves tether_history in a transaction that notes
// its leases in tether_pruning; their lines go after, in bounded
// transactions, and the note with the last of them (a crash in between
// leaves the note for the next pass).
func (s *Store) PruneHistory(cutoff time.Time, budget int) (store.PruneStats, error) {
	runs := func(ctx context.Context, tx pgx.Tx, budget int, st *store.PruneStats) ([]string, bool, error) {
		rows, err := tx.Query(ctx, `DELETE FROM tether_history WHERE run IN
			(SELECT run FROM tether_history WHERE finished_ns < $1 ORDER BY finished_ns, run LIMIT $2) RETURNING run, value`, nanos(cutoff), budget)
		if err != nil {
			return nil, false, err
		}
		// Each history (130 KB for 200 steps) is decoded as it is read
		// and only its leases kept: a pass holds one value at a time,
		// not budget of them.
		type victim struct {
			run    string
			leases []string
		}
		var victims []victim
		var value []byte
		for rows.Next() {
			var v victim
			if err := rows.Scan(&v.run, &value); err != nil {
				rows.Close()
				return nil, false, err
			}
			if h, err := s.decodeHistory(core.RunID(v.run), value); err == nil { // else nothing to find its lines by
				for _, l := range h.Leases {
					v.leases = append(v.leases, fmt.Sprintf("%020d", uint64(l.ID)))
				}
			}
			victims = append(victims, v)
		}
		if err := rows.Err(); err != nil {
			return nil, false, err
		}
		for _, v := range victims {
			st.Runs++
			if len(v.leases) == 0 {
				continue
			}
			if _, err := tx.Exec(ctx, `INSERT INTO tether_pruning (run, leases) VALUES ($1, $2)
				ON CONFLICT (run) DO UPDATE SET leases = excluded.leases`, v.run, v.leases); err != nil {
				return nil, false, err
			}
		}
		return nil, len(victims) == budget, nil
	}
	logs := func(ctx context.Context, tx pgx.Tx, budget int, st *store.PruneStats) ([]string, bool, error) {
		left := budget
		for left > 0 {
			var run string
			var leases []string
			err := tx.QueryRow(ctx, "SELECT run, leases FROM tether_pruning ORDER BY run LIMIT 1").Scan(&run, &leases)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil, false, nil
			}
			if err != nil {
				return nil, false, err
			}
			tag, err := tx.Exec(ctx, `DELETE FROM tether_log WHERE key IN
				(SELECT l.key FROM unnest($1::text[]) AS q(lease)
					JOIN tether_log l ON l.key >= 'log/' || q.lease || '/' AND l.key < 'log/' || q.lease || '0'
					ORDER BY l.key LIMIT $2)`, leases, left)
			if err != nil {
				return nil, false, err
			}
			n := int(tag.RowsAffected())
			st.LogLines += n
			left -= n
			if left == 0 {
				return nil, true, nil // the note stays until a pass deletes fewer than it may
			}
			if _, err := tx.Exec(ctx, "DELETE FROM tether_pruning WHERE run = $1", run); err != nil {
				return nil, false, err
			}
		}
		return nil, true, nil
	}
	return s.prune(budget, runs, logs)
}

// PruneData deletes the versions created before cutoff that are not their
// id's newest, the streams last appended before it, the remembered answers
// older than it, and the bundles uploaded before it that keepBundle does
// not keep; the blobs they alone named are collected.
func (s *Store) PruneData(cutoff time.Time, keepBundle func(fp string) bool, budget int) (store.PruneStats, error) {
	if keepBundle == nil {
		keepBundle = func(string) bool { return false }
	}
	c := nanos(cutoff)
	// Versions and streams are scanned in key order from where the last
	// transaction stopped, at most budget rows each: a pass costs the
	// table once, however many rows stay (an id's newest version stays).
	fromID, fromVersion := "", int64(0)
	versions := func(ctx context.Context, tx pgx.Tx, budget int, st *store.PruneStats) ([]string, bool, error) {
		var lastID *string
		var lastVersion *int64
		var scanned int
		var shas []*string
		err := tx.QueryRow(ctx, `WITH scan AS (
				SELECT id, version, created_ns FROM tether_data WHERE (id, version) > ($2, $3) ORDER BY id, version LIMIT $4),
			gone AS (
				DELETE FROM tether_data d USING scan s WHERE d.id = s.id AND d.version = s.version AND s.created_ns < $1
					AND EXISTS (SELECT 1 FROM tether_data y WHERE y.id = s.id AND y.version > s.version)
				RETURNING d.sha),
			last AS (SELECT id, version FROM scan ORDER BY id DESC, version DESC LIMIT 1)
			SELECT (SELECT id FROM last), (SELECT version FROM last), (SELECT count(*) FROM scan),
				coalesce((SELECT array_agg(sha) FROM gone), '{}')`, c, fromID, fromVersion, budget).Scan(&lastID, &lastVersion, &scanned, &shas)
		if err != nil {
			return nil, false, err
		}
		if lastID != nil {
			fromID, fromVersion = *lastID, *lastVersion
		}
		st.Versions += len(shas)
		var blobs []string
		for _, sha := range shas {
			if sha != nil {
				blobs = append(blobs, *sha)
			}
		}
		return blobs, scanned == budget, nil
	}
	fromStream := ""
	streams := func(ctx context.Context, tx pgx.Tx, budget int, st *store.PruneStats) ([]string, bool, error) {
		var last *string
		var scanned int
		var ids []string
		// The age is read from the row deleted (t), not the scan (s): an
		// append that commits while the DELETE waits for its row makes
		// PostgreSQL test the row again, as it is now (SPEC §7a: only
		// streams last appended before the cutoff go).
		err := tx.QueryRow(ctx, `WITH scan AS (
				SELECT id, updated_ns FROM tether_stream WHERE id > $2 ORDER BY id LIMIT $3),
			gone AS (
				DELETE FROM tether_stream t USING scan s WHERE t.id = s.id AND t.updated_ns < $1 RETURNING t.id)
			SELECT (SELECT max(id) FROM scan), (SELECT count(*) FROM scan),
				coalesce((SELECT array_agg(id) FROM gone), '{}')`, c, fromStream, budget).Scan(&last, &scanned, &ids)
		if err != nil {
			return nil, false, err
		}
		if last != nil {
			fromStream = *last
		}
		if len(ids) > 0 {
			if _, err := tx.Exec(ctx, "DELETE FROM tether_stream_chunk WHERE id = ANY($1::text[])", ids); err != nil {
				return nil, false, err
			}
		}
		st.Streams += len(ids)
		return nil, scanned == budget, nil
	}
	requests := func(ctx context.Context, tx pgx.Tx, budget int, st *store.PruneStats) ([]string, bool, error) {
		rows, err := tx.Query(ctx, `DELETE FROM tether_request WHERE (lease, id) IN
			(SELECT lease, id FROM tether_request WHERE at_ns < $1 LIMIT $2) RETURNING lease`, c, budget)
		if err != nil {
			return nil, false, err
		}
		leases, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil || len(leases) == 0 {
			return nil, false, err
		}
		leases = append(leases, make([]int64, len(leases))...) // each counted out of the total (lease 0) too
		// The counts' rows locked in lease order, as ApplyWithData's writes
		// lock them: the two never wait for each other in a cycle.
		if _, err := tx.Exec(ctx, "SELECT 1 FROM tether_request_count WHERE lease = ANY($1::bigint[]) ORDER BY lease FOR UPDATE", leases); err != nil {
			return nil, false, err
		}
		_, err = tx.Exec(ctx, `UPDATE tether_request_count c SET n = c.n - d.k
			FROM (SELECT l, count(*) AS k FROM unnest($1::bigint[]) AS l GROUP BY l) d WHERE c.lease = d.l`, leases)
		if err == nil {
			_, err = tx.Exec(ctx, "DELETE FROM tether_request_count WHERE n <= 0")
		}
		return nil, len(leases) == 2*budget, err
	}
	from := ""
	bundles := func(ctx context.Context, tx pgx.Tx, budget int, st *store.PruneStats) ([]string, bool, error) {
		rows, err := tx.Query(ctx, "SELECT fp FROM tether_bundle WHERE created_ns < $1 AND fp > $2 ORDER BY fp LIMIT $3", c, from, budget)
		if err != nil {
			return nil, false, err
		}
		fps, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, false, err
		}
		var gone []string
		for _, fp := range fps {
			if !keepBundle(fp) {
				gone = append(gone, fp)
			}
		}
		if len(gone) > 0 {
			b := &pgx.Batch{}
			b.Queue("DELETE FROM tether_bundle WHERE fp = ANY($1::text[])", gone)
			b.Queue("DELETE FROM tether_bundle_file WHERE fp = ANY($1::text[])", gone)
			if err := tx.SendBatch(ctx, b).Close(); err != nil {
				return nil, false, err
			}
		}
		st.Bundles += len(gone)
		if len(fps) > 0 {
			from = fps[len(fps)-1]
		}
		return gone, len(fps) == budget, nil
	}
	return s.prune(budget, versions, streams, requests, bundles)
}

// Backup is not the PostgreSQL backend's: take its snapshots with the
// database's own tools (pg_dump, or a base backup), SPEC §7.
func (s *Store) Backup(io.Writer) error {
	return fmt.Errorf("pgstore: %w: back up a PostgreSQL store with pg_dump (or a base backup), not the orchestrator", errors.ErrUnsupported)
}

// ReleaseMapped holds nothing to release.
func (s *Store) ReleaseMapped() error { return nil }
