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
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/tether-run/tether/adapters/store"
	"github.com/tether-run/tether/core"
)

// ApplyWithData is Apply plus data-plane writes, all in one fenced
// transaction: the records and every accepted op, or nothing. A refused op
// (its DataResult.Err) writes nothing and does not abort the rest.
func (s *Store) ApplyWithData(recs []core.Record, ops []store.DataOp) ([]store.DataResult, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	if err := checkRecords(recs); err != nil {
		return nil, err
	}
	for i, op := range ops {
		if err := s.checkOp(op); err != nil {
			return nil, fmt.Errorf("pgstore: data op %d of %d: %w", i+1, len(ops), err)
		}
	}
	var res []store.DataResult
	err := s.write(func(ctx context.Context, tx pgx.Tx) error {
		b := &pgx.Batch{}
		if err := s.queueRecords(b, recs); err != nil {
			return err
		}
		if b.Len() > 0 {
			if err := tx.SendBatch(ctx, b).Close(); err != nil {
				return err
			}
		}
		res = make([]store.DataResult, len(ops))
		for i, op := range ops {
			var err error
			var done bool
			if op.Request != "" {
				res[i], done, err = repeated(ctx, tx, op)
			}
			switch {
			case done || err != nil:
			case op.Kind == store.OpPut:
				res[i].Data, err = s.putVersion(ctx, tx, op)
			case op.Kind == store.OpAppend:
				res[i].Append, err = appendStream(ctx, tx, op)
			case op.Kind == store.OpBundle:
				res[i].Bundle, err = s.putBundle(ctx, tx, op)
			case op.Kind == store.OpDelete:
				res[i].Data, err = deleteVersion(ctx, tx, op)
			case op.Kind == store.OpSecretPut:
				var v []byte
				if v, err = s.seal(op.ID, op.Body); err == nil {
					_, err = tx.Exec(ctx, `INSERT INTO tether_secret (name, value) VALUES ($1, $2)
						ON CONFLICT (name) DO UPDATE SET value = excluded.value`, op.ID, v)
				}
			case op.Kind == store.OpSecretDelete:
				_, err = tx.Exec(ctx, "DELETE FROM tether_secret WHERE name = $1", op.ID)
			}
			if err == nil && !done && op.Request != "" {
				err = remember(ctx, tx, op, res[i])
			}
			if isRefusal(err) {
				res[i].Err, err = err, nil
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("pgstore: apply %d records and %d data ops: %w", len(recs), len(ops), err)
	}
	return res, nil
}

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
		if op.Kind == store.OpBundle || op.Lease == 0 {
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
			if _, err := s.gcm(); err != nil {
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

func insertVersion(ctx context.Context, tx pgx.Tx, m store.DataMeta) error {
	enc, err := json.Marshal(m)
	if err != nil {
		return err
	}
	var sha *string
	if m.SHA256 != "" {
		sha = &m.SHA256
	}
	_, err = tx.Exec(ctx, "INSERT INTO tether_data (id, version, created_ns, sha, meta) VALUES ($1, $2, $3, $4, $5)",
		m.ID, int64(m.Version), nanos(m.Created), sha, enc)
	return err
}

func (s *Store) putVersion(ctx context.Context, tx pgx.Tx, op store.DataOp) (store.DataMeta, error) {
	latest, err := latestVersion(ctx, tx, op.ID)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return store.DataMeta{}, err
	}
	if err := s.pinned(op.Blob); err != nil {
		return store.DataMeta{}, err
	}
	m := store.DataMeta{
		ID: op.ID, Version: latest.Version + 1, Size: op.Blob.Size, SHA256: op.Blob.SHA256,
		Created: op.At.UTC(), Worker: op.Worker, Lease: op.Lease, Run: op.Run, Step: op.Step,
		Attributes: op.Attributes,
	}
	return m, insertVersion(ctx, tx, m)
}

// deleteVersion stores a tombstone as the next version of op.ID.
func deleteVersion(ctx context.Context, tx pgx.Tx, op store.DataOp) (store.DataMeta, error) {
	latest, err := latestVersion(ctx, tx, op.ID)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return store.DataMeta{}, fmt.Errorf("%w: data %q has no version to delete", store.ErrNotFound, op.ID)
		}
		return store.DataMeta{}, err
	}
	if latest.Deleted {
		return store.DataMeta{}, fmt.Errorf("%w: data %q is already deleted (version %d)", store.ErrNotFound, op.ID, latest.Version)
	}
	m := store.DataMeta{
		ID: op.ID, Version: latest.Version + 1, Created: op.At.UTC(), Worker: op.Worker, Lease: op.Lease,
		Run: op.Run, Step: op.Step, Deleted: true,
	}
	return m, insertVersion(ctx, tx, m)
}

func appendStream(ctx context.Context, tx pgx.Tx, op store.DataOp) (store.AppendResult, error) {
	var m store.StreamMeta
	var v []byte
	err := tx.QueryRow(ctx, "SELECT meta FROM tether_stream WHERE id = $1 FOR UPDATE", op.ID).Scan(&v)
	switch {
	case err == nil:
		if err := json.Unmarshal(v, &m); err != nil {
			return store.AppendResult{}, fmt.Errorf("stream %q: %w", op.ID, err)
		}
	case !errors.Is(err, pgx.ErrNoRows):
		return store.AppendResult{}, err
	}
	size := int64(len(op.Body))
	if op.MaxStream > 0 && m.Length+size > op.MaxStream {
		return store.AppendResult{}, fmt.Errorf("%w: stream %q holds %d bytes, %d more would pass %d", store.ErrStreamFull, op.ID, m.Length, size, op.MaxStream)
	}
	r := store.AppendResult{ID: op.ID, Offset: m.Length, Size: size, Length: m.Length + size}
	m = store.StreamMeta{ID: op.ID, Length: r.Length, Appends: m.Appends + 1, Updated: op.At.UTC()}
	enc, err := json.Marshal(m)
	if err != nil {
		return store.AppendResult{}, err
	}
	b := &pgx.Batch{}
	b.Queue("INSERT INTO tether_stream_chunk (id, off, bytes) VALUES ($1, $2, $3)", op.ID, r.Offset, op.Body)
	b.Queue(`INSERT INTO tether_stream (id, updated_ns, meta) VALUES ($1, $2, $3)
		ON CONFLICT (id) DO UPDATE SET updated_ns = excluded.updated_ns, meta = excluded.meta`, op.ID, nanos(m.Updated), enc)
	return r, tx.SendBatch(ctx, b).Close()
}

func (s *Store) putBundle(ctx context.Context, tx pgx.Tx, op store.DataOp) (store.BundleMeta, error) {
	fp := op.Blob.SHA256
	var v []byte
	err := tx.QueryRow(ctx, "SELECT meta FROM tether_bundle WHERE fp = $1", fp).Scan(&v)
	if err == nil {
		var m store.BundleMeta
		if err := json.Unmarshal(v, &m); err != nil {
			return store.BundleMeta{}, fmt.Errorf("bundle %s: %w", fp, err)
		}
		m.Existed = true
		return m, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return store.BundleMeta{}, err
	}
	if err := s.pinned(op.Blob); err != nil {
		return store.BundleMeta{}, err
	}
	m := store.BundleMeta{Fingerprint: fp, Size: op.Blob.Size, Created: op.At.UTC(), Tar: op.Files != nil, Files: len(op.Files)}
	enc, err := json.Marshal(m)
	if err != nil {
		return store.BundleMeta{}, err
	}
	paths := make([]string, 0, len(op.Files))
	for p := range op.Files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	offs, sizes := make([]int64, len(paths)), make([]int64, len(paths))
	for i, p := range paths {
		offs[i], sizes[i] = op.Files[p].Offset, op.Files[p].Size
	}
	b := &pgx.Batch{}
	b.Queue("INSERT INTO tether_bundle (fp, created_ns, meta) VALUES ($1, $2, $3)", fp, nanos(m.Created), enc)
	if len(paths) > 0 {
		b.Queue(`INSERT INTO tether_bundle_file (fp, path, off, size) SELECT $1, * FROM unnest($2::text[], $3::bigint[], $4::bigint[])`,
			fp, paths, offs, sizes)
	}
	return m, tx.SendBatch(ctx, b).Close()
}

// repeated answers an op whose (lease, request id) already has an entry:
// done, with the first answer.
func repeated(ctx context.Context, tx pgx.Tx, op store.DataOp) (store.DataResult, bool, error) {
	var v []byte
	err := tx.QueryRow(ctx, "SELECT entry FROM tether_request WHERE lease = $1 AND id = $2", int64(op.Lease), op.Request).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		if op.RepeatOnly {
			return store.DataResult{}, true, fmt.Errorf("%w: request %q of lease %d; send it again", store.ErrRequestLost, op.Request, op.Lease)
		}
		return store.DataResult{}, false, roomFor(ctx, tx, op)
	}
	if err != nil {
		return store.DataResult{}, true, err
	}
	var e store.RequestEntry
	if err := json.Unmarshal(v, &e); err != nil {
		return store.DataResult{}, true, fmt.Errorf("request %q of lease %d: %w", op.Request, op.Lease, err)
	}
	if e.Kind != op.Kind || e.ID != op.ID {
		return store.DataResult{}, true, fmt.Errorf("%w: request %q of lease %d was for %s", store.ErrRequestReused, op.Request, op.Lease, describe(e))
	}
	return e.Result(), true, nil
}

func describe(e store.RequestEntry) string {
	switch e.Kind {
	case store.OpPut:
		return "a put of " + strconv.Quote(e.ID)
	case store.OpAppend:
		return "an append to " + strconv.Quote(e.ID)
	case store.OpDelete:
		return "a delete of " + strconv.Quote(e.ID)
	}
	return "another write"
}

// Request counts: tether_request_count holds each lease's, and the total
// under lease 0 (a request id needs a lease, so no lease is 0).
func requestCounts(ctx context.Context, tx pgx.Tx, lease uint64) (n, total int64, err error) {
	err = tx.QueryRow(ctx, `SELECT coalesce((SELECT n FROM tether_request_count WHERE lease = $1), 0),
		coalesce((SELECT n FROM tether_request_count WHERE lease = 0), 0)`, int64(lease)).Scan(&n, &total)
	return n, total, err
}

// roomFor refuses a new entry over the bounds.
func roomFor(ctx context.Context, tx pgx.Tx, op store.DataOp) error {
	n, total, err := requestCounts(ctx, tx, op.Lease)
	switch {
	case err != nil:
		return err
	case n >= store.MaxRequestsPerLease:
		return fmt.Errorf("%w: lease %d has %d, at most %d (nothing was written)", store.ErrRequestsFull, op.Lease, n, store.MaxRequestsPerLease)
	case total >= store.MaxRequests:
		return fmt.Errorf("%w: the store holds %d, at most %d until retention removes old ones (nothing was written)", store.ErrRequestsFull, total, store.MaxRequests)
	}
	return nil
}

// remember stores op's answer under its (lease, request id).
func remember(ctx context.Context, tx pgx.Tx, op store.DataOp, r store.DataResult) error {
	e := store.RequestEntry{Worker: op.Worker, Kind: op.Kind, ID: op.ID, At: op.At.UTC()}
	switch op.Kind {
	case store.OpPut, store.OpDelete:
		e.Data = &r.Data
	case store.OpAppend:
		e.Append = &r.Append
	default:
		return fmt.Errorf("%w: a request id on op kind %d", store.ErrBadOp, op.Kind)
	}
	enc, err := json.Marshal(e)
	if err != nil {
		return err
	}
	b := &pgx.Batch{}
	b.Queue("INSERT INTO tether_request (lease, id, at_ns, entry) VALUES ($1, $2, $3, $4)", int64(op.Lease), op.Request, nanos(e.At), enc)
	b.Queue(`INSERT INTO tether_request_count (lease, n) VALUES ($1, 1), (0, 1)
		ON CONFLICT (lease) DO UPDATE SET n = tether_request_count.n + 1`, int64(op.Lease))
	return tx.SendBatch(ctx, b).Close()
}

// Request returns the remembered answer of (lease, request id), if any.
func (s *Store) Request(lease uint64, id string) (store.RequestEntry, bool, error) {
	var v []byte
	err := s.read(func(ctx context.Context, tx pgx.Tx) error {
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
	err := s.read(func(ctx context.Context, tx pgx.Tx) error {
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
	err := s.read(func(ctx context.Context, tx pgx.Tx) error {
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
	err := s.read(func(ctx context.Context, tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT id, version, meta FROM tether_data
			WHERE starts_with(id, $1) AND (id, version) > ($2, $3) ORDER BY id, version LIMIT $4`,
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
			if matches(q, m) {
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

func matches(q store.DataQuery, m store.DataMeta) bool {
	switch {
	case q.Run != "" && m.Run != q.Run, q.Step != "" && m.Step != q.Step,
		!q.Since.IsZero() && m.Created.Before(q.Since), !q.Until.IsZero() && !m.Created.Before(q.Until):
		return false
	}
	for k, v := range q.Attrs {
		if m.Attributes[k] != v {
			return false
		}
	}
	return true
}

// Stream returns the metadata of id's append stream.
func (s *Store) Stream(id string) (store.StreamMeta, error) {
	if err := store.ValidateID(id); err != nil {
		return store.StreamMeta{}, err
	}
	var ms []store.StreamMeta
	err := s.read(func(ctx context.Context, tx pgx.Tx) error {
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
	err := s.read(func(ctx context.Context, tx pgx.Tx) error {
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
	err := s.read(func(ctx context.Context, tx pgx.Tx) error {
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
	return &streamReader{s: s, id: id, pos: offset, end: end}
}

type streamReader struct {
	s        *Store
	id       string
	pos, end int64
	buf      []byte
	bufAt    int64
}

func (r *streamReader) Read(p []byte) (int, error) {
	if r.pos >= r.end {
		return 0, io.EOF
	}
	if r.buf == nil || r.pos < r.bufAt || r.pos >= r.bufAt+int64(len(r.buf)) {
		err := r.s.read(func(ctx context.Context, tx pgx.Tx) error {
			// The append that holds pos started at or before it.
			return tx.QueryRow(ctx, "SELECT off, bytes FROM tether_stream_chunk WHERE id = $1 AND off <= $2 ORDER BY off DESC LIMIT 1",
				r.id, r.pos).Scan(&r.bufAt, &r.buf)
		})
		if errors.Is(err, pgx.ErrNoRows) || err == nil && (r.pos < r.bufAt || r.pos >= r.bufAt+int64(len(r.buf))) {
			return 0, fmt.Errorf("pgstore: stream %q has no bytes at %d", r.id, r.pos)
		}
		if err != nil {
			return 0, err
		}
	}
	from := r.pos - r.bufAt
	n := copy(p, r.buf[from:min(int64(len(r.buf)), r.end-r.bufAt)])
	r.pos += int64(n)
	return n, nil
}
