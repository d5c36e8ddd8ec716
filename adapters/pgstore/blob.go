package pgstore

// Blobs (SPEC §14) in the database: a blob is a row of tether_blob (its
// SHA-256 and size) and its bytes in ChunkSize rows of tether_blob_chunk,
// so no value is one huge bytea. WriteBlob streams a body into chunks in
// one transaction of its own, off the driver's loop, hashing as it goes;
// the chunks are written under a temporary name and renamed to the
// SHA-256 at the end, or dropped if that blob is already there. A blob is
// named when a data version or a bundle names it; one no record names and
// no write pins is collected, as the bbolt store's are (pins and the
// collection are this process's: only the leader writes).

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
	s.creating++ // no collection while a blob may be named but not yet pinned
	s.blobMu.Unlock()
	ref, err := s.createBlob(r, limit)
	s.blobMu.Lock()
	defer s.blobMu.Unlock()
	s.creating--
	if err == nil {
		s.pins[ref.SHA256]++
	}
	s.collectLocked()
	return ref, err
}

func (s *Store) createBlob(r io.Reader, limit int64) (store.BlobRef, error) {
	var tmp [16]byte
	rand.Read(tmp[:])
	name := "tmp-" + hex.EncodeToString(tmp[:])
	var ref store.BlobRef
	err := s.write(func(ctx context.Context, tx pgx.Tx) error {
		h := sha256.New()
		buf := make([]byte, ChunkSize)
		var n int64
		for i := 0; ; i++ {
			k, err := io.ReadFull(r, buf)
			if k > 0 {
				n += int64(k)
				if n > limit {
					return fmt.Errorf("%w of %d bytes", store.ErrTooLarge, limit)
				}
				h.Write(buf[:k])
				if _, err := tx.Exec(ctx, "INSERT INTO tether_blob_chunk (sha, n, bytes) VALUES ($1, $2, $3)", name, i, buf[:k]); err != nil {
					return err
				}
			}
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				break
			}
			if err != nil {
				return readErr{err}
			}
		}
		ref = store.BlobRef{SHA256: hex.EncodeToString(h.Sum(nil)), Size: n}
		// Same name, same bytes: a blob already there is kept as it is.
		tag, err := tx.Exec(ctx, "INSERT INTO tether_blob (sha, size) VALUES ($1, $2) ON CONFLICT (sha) DO NOTHING", ref.SHA256, n)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			_, err = tx.Exec(ctx, "DELETE FROM tether_blob_chunk WHERE sha = $1", name)
		} else {
			_, err = tx.Exec(ctx, "UPDATE tether_blob_chunk SET sha = $1 WHERE sha = $2", ref.SHA256, name)
		}
		return err
	})
	var re readErr
	if errors.As(err, &re) {
		return store.BlobRef{}, re.err // the reader's error, as it is
	}
	if err != nil {
		if errors.Is(err, store.ErrTooLarge) || errors.Is(err, store.ErrClosed) || errors.Is(err, store.ErrDeposed) {
			return store.BlobRef{}, err
		}
		return store.BlobRef{}, fmt.Errorf("pgstore: write blob: %w", err)
	}
	return ref, nil
}

// readErr is the body reader's error, passed through the transaction.
type readErr struct{ err error }

func (e readErr) Error() string { return e.err.Error() }

// ReleaseBlob unpins a blob WriteBlob returned; a blob no record names and
// no other write pinned is then removed.
func (s *Store) ReleaseBlob(ref store.BlobRef) {
	s.blobMu.Lock()
	defer s.blobMu.Unlock()
	if s.pins[ref.SHA256] == 0 {
		return
	}
	if s.pins[ref.SHA256]--; s.pins[ref.SHA256] == 0 {
		delete(s.pins, ref.SHA256)
		s.unsure[ref.SHA256] = true
	}
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

// collectLocked removes the released blobs no record names, unless a
// WriteBlob is under way (its blob may be one of them, not yet pinned).
func (s *Store) collectLocked() {
	if s.creating > 0 || len(s.unsure) == 0 || s.closed.Load() {
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
	err := s.write(func(ctx context.Context, tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `DELETE FROM tether_blob b WHERE sha = ANY($1::text[])
			AND NOT EXISTS (SELECT 1 FROM tether_data d WHERE d.sha = b.sha)
			AND NOT EXISTS (SELECT 1 FROM tether_bundle u WHERE u.fp = b.sha) RETURNING sha`, shas)
		if err != nil {
			return err
		}
		gone, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		n = len(gone)
		if n > 0 {
			_, err = tx.Exec(ctx, "DELETE FROM tether_blob_chunk WHERE sha = ANY($1::text[])", gone)
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
	err := s.read(func(ctx context.Context, tx pgx.Tx) error {
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
	err := s.read(func(ctx context.Context, tx pgx.Tx) error {
		return tx.QueryRow(ctx, "SELECT size FROM tether_blob WHERE sha = $1", sha).Scan(&size)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: blob %s", store.ErrNotFound, sha)
	}
	if err != nil {
		return nil, err
	}
	return &blobReader{s: s, sha: sha, size: size}, nil
}

// section reads n bytes of blob sha from off.
func (s *Store) section(sha string, off, n int64) io.ReadCloser {
	return &blobReader{s: s, sha: sha, size: off + n, pos: off}
}

// blobReader reads a blob a chunk (one query) at a time.
type blobReader struct {
	s         *Store
	sha       string
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
		err := r.s.read(func(ctx context.Context, tx pgx.Tx) error {
			return tx.QueryRow(ctx, "SELECT bytes FROM tether_blob_chunk WHERE sha = $1 AND n = $2", r.sha, n).Scan(&r.buf)
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
