package pgstore

// Blobs (SPEC §14) in the database: a blob is a row of tether_blob (its
// SHA-256, its size, the name of its chunks) and its bytes in ChunkSize
// rows of tether_blob_chunk, so no value is one huge bytea. WriteBlob
// streams a body off the driver's loop, hashing as it goes, each chunk in
// a short transaction of its own under a new random name (no connection
// is held while the body arrives), then names the blob in one more: its
// row is inserted, or, when the same bytes are there already, the new
// chunks are deleted. A blob is named when a data version or a bundle
// names it; one no record names and no write pins is collected, as the
// bbolt store's are. Pins are this process's (only the leader writes);
// Open removes the chunks no blob row names (writes a crash or a
// deposed leader left unfinished).

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5"

	"github.com/tether-run/tether/adapters/store"
)

// ChunkSize is the size of a blob's chunks.
const ChunkSize = 512 << 10

// WriteBlob streams r into a durable blob (at most limit bytes, else
// store.ErrTooLarge) and pins it until ReleaseBlob.
func (s *Store) WriteBlob(r io.Reader, limit int64) (store.BlobRef, error) {
	s.blobMu.Lock()
	s.creating++ // no sweep of every blob (CollectBlobs) while one is written
	s.blobMu.Unlock()
	pinned := false
	ref, err := s.createBlob(r, limit, func(ref store.BlobRef) {
		// Pinned before it is named: collection, which runs while other
		// writes stream, never removes it (or the blob of the same bytes
		// it joins) from then on.
		s.blobMu.Lock()
		s.pins[ref.SHA256]++
		s.blobMu.Unlock()
		pinned = true
	})
	s.blobMu.Lock()
	defer s.blobMu.Unlock()
	s.creating--
	if err != nil && pinned {
		s.unpinLocked(ref.SHA256)
	}
	s.collectLocked()
	return ref, err
}

// unpinLocked takes one pin off a blob; one no write pins any more may be
// collected (blobMu held).
func (s *Store) unpinLocked(sha string) {
	if s.pins[sha]--; s.pins[sha] <= 0 {
		delete(s.pins, sha)
		s.unsure[sha] = true
	}
}

func (s *Store) createBlob(r io.Reader, limit int64, pin func(store.BlobRef)) (store.BlobRef, error) {
	var id [16]byte
	rand.Read(id[:])
	chunks := hex.EncodeToString(id[:])
	drop := func() { // best effort: Open collects what is left
		s.tx(false, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "DELETE FROM tether_blob_chunk WHERE chunks = $1", chunks)
			return err
		})
	}
	h := sha256.New()
	buf := make([]byte, ChunkSize)
	var n int64
	for i := 0; ; i++ {
		k, err := io.ReadFull(r, buf)
		if k > 0 {
			if n += int64(k); n > limit {
				drop()
				return store.BlobRef{}, fmt.Errorf("%w of %d bytes", store.ErrTooLarge, limit)
			}
			h.Write(buf[:k])
			werr := s.tx(false, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, "INSERT INTO tether_blob_chunk (chunks, n, bytes) VALUES ($1, $2, $3)", chunks, i, buf[:k])
				return err
			})
			if werr != nil {
				drop()
				return store.BlobRef{}, blobErr(werr)
			}
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			break
		}
		if err != nil {
			drop()
			return store.BlobRef{}, err // the reader's error, as it is
		}
	}
	ref := store.BlobRef{SHA256: hex.EncodeToString(h.Sum(nil)), Size: n}
	pin(ref)
	err := s.tx(false, func(ctx context.Context, tx pgx.Tx) error {
		// Same name, same bytes: a blob already there is kept as it is.
		tag, err := tx.Exec(ctx, "INSERT INTO tether_blob (sha, size, chunks) VALUES ($1, $2, $3) ON CONFLICT (sha) DO NOTHING", ref.SHA256, n, chunks)
		if err == nil && tag.RowsAffected() == 0 {
			_, err = tx.Exec(ctx, "DELETE FROM tether_blob_chunk WHERE chunks = $1", chunks)
		}
		return err
	})
	if err != nil {
		drop()
		return ref, blobErr(err) // ref: the caller unpins it
	}
	return ref, nil
}

func blobErr(err error) error {
	if errors.Is(err, store.ErrClosed) || errors.Is(err, store.ErrDeposed) {
		return err
	}
	return fmt.Errorf("pgstore: write blob: %w", err)
}

// ReleaseBlob unpins a blob WriteBlob returned; a blob no record names and
// no other write pinned is then removed.
func (s *Store) ReleaseBlob(ref store.BlobRef) {
	s.blobMu.Lock()
	defer s.blobMu.Unlock()
	if s.pins[ref.SHA256] == 0 {
		return
	}
	s.unpinLocked(ref.SHA256)
	s.collectLocked()
}

// pinned refuses an op naming a blob no write pins.
func (s *Store) pinned(ref store.BlobRef) error {
	s.blobMu.Lock()
	defer s.blobMu.Unlock()
	if s.pins[ref.SHA256] == 0 {
		return fmt.Errorf("%w: %s", store.ErrNoBlob, ref.SHA256)
	}
	return nil
}

// collectLocked removes the released blobs no record names and no write
// pins (a write pins its blob before naming it, so one streaming now holds
// up nothing of the others).
func (s *Store) collectLocked() {
	if len(s.unsure) == 0 || s.closed.Load() {
		return
	}
	for sha := range s.unsure {
		if s.pins[sha] == 0 {
			if _, err := s.removeUnnamed([]string{sha}); err != nil {
				return // try again at the next call
			}
		}
		delete(s.unsure, sha)
	}
}

// removeUnnamed removes those of shas no data version or bundle names,
// returning how many.
func (s *Store) removeUnnamed(shas []string) (int, error) {
	var n int
	err := s.tx(false, func(ctx context.Context, tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `DELETE FROM tether_blob b WHERE sha = ANY($1::text[])
			AND NOT EXISTS (SELECT 1 FROM tether_data d WHERE d.sha = b.sha)
			AND NOT EXISTS (SELECT 1 FROM tether_bundle u WHERE u.fp = b.sha) RETURNING chunks`, shas)
		if err != nil {
			return err
		}
		gone, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		n = len(gone)
		if n > 0 {
			_, err = tx.Exec(ctx, "DELETE FROM tether_blob_chunk WHERE chunks = ANY($1::text[])", gone)
		}
		return err
	})
	return n, err
}

// CollectBlobs removes every blob no record names (and the chunks of
// writes that never finished); Open calls it. It returns how many blobs it
// removed.
func (s *Store) CollectBlobs() (int, error) {
	s.blobMu.Lock()
	defer s.blobMu.Unlock()
	if s.creating > 0 || len(s.pins) > 0 {
		return 0, nil
	}
	var all []string
	err := s.readData(func(ctx context.Context, tx pgx.Tx) error {
		rows, err := tx.Query(ctx, "SELECT sha FROM tether_blob")
		if err != nil {
			return err
		}
		all, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("pgstore: list blobs: %w", err)
	}
	n, err := s.removeUnnamed(all)
	if err != nil {
		return 0, fmt.Errorf("pgstore: collect blobs: %w", err)
	}
	return n, nil
}

// OpenBlob opens a blob for reading.
func (s *Store) OpenBlob(sha string) (io.ReadSeekCloser, error) {
	if err := store.ValidateFingerprint(sha); err != nil {
		return nil, err
	}
	var size int64
	var chunks string
	err := s.readData(func(ctx context.Context, tx pgx.Tx) error {
		return tx.QueryRow(ctx, "SELECT size, chunks FROM tether_blob WHERE sha = $1", sha).Scan(&size, &chunks)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: blob %s", store.ErrNotFound, sha)
	}
	if err != nil {
		return nil, err
	}
	return &blobReader{s: s, sha: sha, chunks: chunks, size: size}, nil
}

// section reads n bytes of blob sha from off.
func (s *Store) section(sha string, off, n int64) io.ReadCloser {
	return &blobReader{s: s, sha: sha, size: off + n, pos: off}
}

// blobReader reads a blob a chunk (one query) at a time; it finds the
// name of the blob's chunks at its first read when not given it.
type blobReader struct {
	s         *Store
	sha       string
	chunks    string
	size, pos int64
	buf       []byte
	bufAt     int64
}

func (r *blobReader) Read(p []byte) (int, error) {
	if r.pos >= r.size {
		return 0, io.EOF
	}
	if r.buf == nil || r.pos < r.bufAt || r.pos >= r.bufAt+int64(len(r.buf)) {
		n := r.pos / ChunkSize
		err := r.s.readData(func(ctx context.Context, tx pgx.Tx) error {
			if r.chunks == "" {
				if err := tx.QueryRow(ctx, "SELECT chunks FROM tether_blob WHERE sha = $1", r.sha).Scan(&r.chunks); err != nil {
					return err
				}
			}
			return tx.QueryRow(ctx, "SELECT bytes FROM tether_blob_chunk WHERE chunks = $1 AND n = $2", r.chunks, n).Scan(&r.buf)
		})
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, fmt.Errorf("pgstore: chunk %d of blob %s is missing", n, r.sha)
		}
		if err != nil {
			return 0, err
		}
		r.bufAt = n * ChunkSize
	}
	k := copy(p, r.buf[r.pos-r.bufAt:min(int64(len(r.buf)), r.size-r.bufAt)])
	if k == 0 {
		return 0, io.ErrUnexpectedEOF
	}
	r.pos += int64(k)
	return k, nil
}

func (r *blobReader) Seek(off int64, whence int) (int64, error) {
	switch whence {
	case io.SeekCurrent:
		off += r.pos
	case io.SeekEnd:
		off += r.size
	}
	if off < 0 {
		return 0, errors.New("pgstore: seek before the start of a blob")
	}
	r.pos = off
	return off, nil
}

func (r *blobReader) Close() error { return nil }
