package pgstore

// The data plane (SPEC §14) in the tables of schema.go: a version is a row
// of tether_data naming its blob (blob.go) by SHA-256, an append stream's
// meta a row of tether_stream and each append a row of tether_stream_chunk
// at its offset, a bundle a row of tether_bundle naming its blob with its
// tar index in tether_bundle_file, a write's first answer a row of
// tether_request (with the counts in tether_request_count, lease 0 being
// the total). ApplyWithData runs the records and every op in one fenced
// transaction, op by op, with the bbolt store's rules and limits.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/tether-run/tether/adapters/store"
)

// isRefusal says whether an op's error refuses that op alone. Such an op
// wrote nothing: every refusal is decided before its first write.
func isRefusal(err error) bool {
	for _, r := range []error{store.ErrStreamFull, store.ErrNoBlob, store.ErrNotFound, store.ErrRequestsFull, store.ErrRequestReused, store.ErrRequestLost} {
		if errors.Is(err, r) {
			return true
		}
	}
	return false
}

func (s *Store) checkOp(op store.DataOp) error {
	if op.Request != "" {
		if err := store.ValidateRequestID(op.Request); err != nil {
			return err
		}
		if op.Kind != store.OpPut && op.Kind != store.OpAppend && op.Kind != store.OpDelete || op.Lease == 0 {
			return fmt.Errorf("%w: a request id names a fenced write (put, append, delete)", store.ErrBadOp)
		}
	}
	switch op.Kind {
	case store.OpPut:
		if err := store.ValidateFingerprint(op.Blob.SHA256); err != nil {
			return fmt.Errorf("%w: a put names no blob (%v)", store.ErrBadOp, err)
		}
		if err := store.ValidateAttributes(op.Attributes); err != nil {
			return err
		}
		return store.ValidateID(op.ID)
	case store.OpAppend:
		if len(op.Body) == 0 {
			return fmt.Errorf("%w: an empty append", store.ErrBadOp)
		}
		return store.ValidateID(op.ID)
	case store.OpDelete:
		return store.ValidateID(op.ID)
	case store.OpBundle:
		if err := store.ValidateFingerprint(op.Blob.SHA256); err != nil {
			return fmt.Errorf("%w: a bundle names no blob (%v)", store.ErrBadOp, err)
		}
		for p := range op.Files {
			if err := store.ValidateRelPath(p); err != nil {
				return err
			}
		}
		return nil
	case store.OpSecretPut, store.OpSecretDelete:
		if op.ID == "" || strings.ContainsRune(op.ID, 0) || (op.Kind == store.OpSecretPut && len(op.Body) == 0) {
			return fmt.Errorf("%w: a secret op with no name or value", store.ErrBadOp)
		}
		if op.Kind == store.OpSecretPut {
			if err := s.keys.Keyed(); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("%w: kind %d", store.ErrBadOp, op.Kind)
}

// latestVersion is the greatest version of id.
func latestVersion(ctx context.Context, q pgx.Tx, id string) (store.DataMeta, error) {
	var v []byte
	err := q.QueryRow(ctx, "SELECT meta FROM tether_data WHERE id = $1 ORDER BY version DESC LIMIT 1", id).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.DataMeta{}, fmt.Errorf("%w: data %q", store.ErrNotFound, id)
	}
	if err != nil {
		return store.DataMeta{}, err
	}
	var m store.DataMeta
	if err := json.Unmarshal(v, &m); err != nil {
		return store.DataMeta{}, fmt.Errorf("data %q: %w", id, err)
	}
	return m, nil
}

// Request returns the remembered answer of (lease, request id), if any.
func (s *Store) Request(lease uint64, id string) (store.RequestEntry, bool, error) {
	var v []byte
	err := s.readData(func(ctx context.Context, tx pgx.Tx) error {
		return tx.QueryRow(ctx, "SELECT entry FROM tether_request WHERE lease = $1 AND id = $2", int64(lease), id).Scan(&v)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return store.RequestEntry{}, false, nil
	}
	if err != nil {
		return store.RequestEntry{}, false, err
	}
	var e store.RequestEntry
	if err := json.Unmarshal(v, &e); err != nil {
		return store.RequestEntry{}, false, err
	}
	return e, true, nil
}

// Data returns the metadata of a version of id; version 0 means the latest.
func (s *Store) Data(id string, version uint64) (store.DataMeta, error) {
	if err := store.ValidateID(id); err != nil {
		return store.DataMeta{}, err
	}
	var m store.DataMeta
	err := s.readData(func(ctx context.Context, tx pgx.Tx) error {
		if version == 0 {
			var err error
			if m, err = latestVersion(ctx, tx, id); err == nil && m.Deleted {
				return fmt.Errorf("%w: data %q was deleted (version %d is its tombstone)", store.ErrNotFound, id, m.Version)
			}
			return err
		}
		var v []byte
		err := tx.QueryRow(ctx, "SELECT meta FROM tether_data WHERE id = $1 AND version = $2", id, int64(version)).Scan(&v)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: data %q version %d", store.ErrNotFound, id, version)
		}
		if err != nil {
			return err
		}
		if err := json.Unmarshal(v, &m); err != nil {
			return err
		}
		if m.Deleted {
			return fmt.Errorf("%w: data %q version %d is a deletion (a tombstone has no bytes)", store.ErrNotFound, id, version)
		}
		return nil
	})
	if err != nil {
		return store.DataMeta{}, err
	}
	return m, nil
}

// metas runs a query of meta values and decodes them.
func metas[T any](ctx context.Context, tx pgx.Tx, sql string, args ...any) ([]T, error) {
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		var v []byte
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		var m T
		if err := json.Unmarshal(v, &m); err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// Versions lists every version of id, oldest first.
func (s *Store) Versions(id string) ([]store.DataMeta, error) {
	if err := store.ValidateID(id); err != nil {
		return nil, err
	}
	var out []store.DataMeta
	err := s.readData(func(ctx context.Context, tx pgx.Tx) error {
		var err error
		out, err = metas[store.DataMeta](ctx, tx, "SELECT meta FROM tether_data WHERE id = $1 ORDER BY version", id)
		return err
	})
	return out, err
}

// QueryData answers a query: the matching versions sorted by (id,
// version), at most q.Limit, and the cursor of the next page ("" when none
// is left); at most store.MaxQueryScan versions examined per call.
func (s *Store) QueryData(q store.DataQuery) ([]store.DataMeta, string, error) {
	if q.Limit <= 0 {
		q.Limit = store.DefaultQueryLimit
	}
	q.Limit = min(q.Limit, store.MaxQueryLimit)
	aid, av := "", int64(0)
	if q.After != "" {
		id, v, ok := strings.Cut(q.After, ":")
		n, err := strconv.ParseUint(v, 10, 63)
		if !ok || err != nil || store.ValidateID(id) != nil {
			return nil, "", fmt.Errorf("%w: bad cursor %q: pass the next of the page before", store.ErrBadID, q.After)
		}
		aid, av = id, int64(n)
	}
	out := []store.DataMeta{}
	next := ""
	err := s.readData(func(ctx context.Context, tx pgx.Tx) error {
		// Every id sorts below the prefix followed by '~', past the
		// characters an id may hold (store.ValidateID): the scan ends
		// where the prefix's ids end.
		rows, err := tx.Query(ctx, `SELECT id, version, meta FROM tether_data
			WHERE id >= $1 AND id < $1 || '~' AND (id, version) > ($2, $3) ORDER BY id, version LIMIT $4`,
			q.Prefix, aid, av, store.MaxQueryScan+1)
		if err != nil {
			return err
		}
		defer rows.Close()
		out, next = out[:0], ""
		scanned := 0
		for rows.Next() {
			var id string
			var ver int64
			var v []byte
			if err := rows.Scan(&id, &ver, &v); err != nil {
				return err
			}
			if scanned >= store.MaxQueryScan || len(out) >= q.Limit {
				if ver > 0 {
					next = store.QueryCursor(id, uint64(ver-1))
				}
				return nil
			}
			scanned++
			var m store.DataMeta
			if err := json.Unmarshal(v, &m); err != nil {
				return fmt.Errorf("data %q: %w", id, err)
			}
			if q.Matches(m) {
				out = append(out, m)
			}
		}
		return rows.Err()
	})
	if err != nil {
		return nil, "", err
	}
	return out, next, nil
}

// Stream returns the metadata of id's append stream.
func (s *Store) Stream(id string) (store.StreamMeta, error) {
	if err := store.ValidateID(id); err != nil {
		return store.StreamMeta{}, err
	}
	var ms []store.StreamMeta
	err := s.readData(func(ctx context.Context, tx pgx.Tx) error {
		var err error
		ms, err = metas[store.StreamMeta](ctx, tx, "SELECT meta FROM tether_stream WHERE id = $1", id)
		return err
	})
	if err == nil && len(ms) == 0 {
		err = fmt.Errorf("%w: stream %q", store.ErrNotFound, id)
	}
	if err != nil {
		return store.StreamMeta{}, err
	}
	return ms[0], nil
}

// Bundle returns the metadata of a bundle.
func (s *Store) Bundle(fp string) (store.BundleMeta, error) {
	if err := store.ValidateFingerprint(fp); err != nil {
		return store.BundleMeta{}, err
	}
	var ms []store.BundleMeta
	err := s.readData(func(ctx context.Context, tx pgx.Tx) error {
		var err error
		ms, err = metas[store.BundleMeta](ctx, tx, "SELECT meta FROM tether_bundle WHERE fp = $1", fp)
		return err
	})
	if err == nil && len(ms) == 0 {
		err = fmt.Errorf("%w: bundle %s", store.ErrNotFound, fp)
	}
	if err != nil {
		return store.BundleMeta{}, err
	}
	return ms[0], nil
}

// BundleFile returns where a file of a tar bundle lies.
func (s *Store) BundleFile(fp, relPath string) (store.FileSpan, error) {
	if err := store.ValidateFingerprint(fp); err != nil {
		return store.FileSpan{}, err
	}
	if err := store.ValidateRelPath(relPath); err != nil {
		return store.FileSpan{}, err
	}
	var span store.FileSpan
	err := s.readData(func(ctx context.Context, tx pgx.Tx) error {
		return tx.QueryRow(ctx, "SELECT off, size FROM tether_bundle_file WHERE fp = $1 AND path = $2", fp, relPath).Scan(&span.Offset, &span.Size)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return store.FileSpan{}, fmt.Errorf("%w: file %q in bundle %s", store.ErrNotFound, relPath, fp)
	}
	return span, err
}

// DataReader reads the bytes of a version (its metadata from Data).
func (s *Store) DataReader(m store.DataMeta) io.ReadCloser {
	if m.SHA256 == "" || m.Size == 0 {
		return io.NopCloser(strings.NewReader(""))
	}
	return s.section(m.SHA256, 0, m.Size)
}

// BundleReader reads size bytes of a bundle from offset.
func (s *Store) BundleReader(m store.BundleMeta, offset, size int64) io.ReadCloser {
	end := min(offset+size, m.Size)
	offset = min(offset, end)
	return s.section(m.Fingerprint, offset, end-offset)
}

// StreamReader reads id's stream from offset up to end, one query per
// append read.
func (s *Store) StreamReader(id string, offset, end int64) io.Reader {
	return store.AppendReader(id, offset, end, func(pos int64, buf []byte) (int64, []byte, error) {
		var at int64
		err := s.readData(func(ctx context.Context, tx pgx.Tx) error {
			// The append that holds pos started at or before it.
			return tx.QueryRow(ctx, "SELECT off, bytes FROM tether_stream_chunk WHERE id = $1 AND off <= $2 ORDER BY off DESC LIMIT 1",
				id, pos).Scan(&at, &buf)
		})
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, nil, store.ErrNotFound
		}
		return at, buf, err
	})
}
