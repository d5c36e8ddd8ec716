package store

// Blobs hold the data plane's large bytes (SPEC §14): a PUT's body and a
// bundle. A body is streamed and hashed into a content-addressed blob OFF
// the driver's loop (WriteBlob: the file, then its directory entry, fsynced);
// the loop then fences the write and commits a record naming the blob (its
// SHA-256 and size) in the transaction of its group (ApplyWithData), which
// also marks the blob referenced (bucket "blob": sha256 → be64(size)). A blob
// no record names — a refused or failed write, a crash between the blob and
// the commit — is collected: at Open, and when the last write that pinned it
// is released (ReleaseBlob). Appends (at most 1 MiB) stay inside the record
// transaction.
//
// Blobs is the layer's interface, so another store (a database, an archive)
// can carry the same design; dirBlobs is the one on a local directory,
// "<store file>.blobs/", one file per blob named by its SHA-256.

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	bolt "go.etcd.io/bbolt"
)

var (
	// ErrTooLarge is returned by WriteBlob when the bytes pass its limit;
	// nothing of them is kept.
	ErrTooLarge = errors.New("store: body larger than the limit")
	// ErrNoBlob is returned, in a DataResult, when an op names a blob that
	// was not written with WriteBlob or was already released; nothing of
	// the op is written.
	ErrNoBlob = errors.New("store: the op names no pinned blob")
)

var bktBlob = []byte("blob") // sha256 → be64(size): the blobs records name

// blobCopyBytes is the buffer a blob is streamed through: the memory one
// write holds, whatever its size.
const blobCopyBytes = 64 << 10

// BlobRef names a blob: the SHA-256 of its bytes (64 lowercase hex digits)
// and their length.
type BlobRef struct {
	SHA256 string
	Size   int64
}

// Blobs is a content-addressed store of immutable byte strings. It knows
// nothing of records: the Store decides which blobs are named.
type Blobs interface {
	// Create streams r into a blob, hashing it, reading at most limit
	// bytes: more is ErrTooLarge and nothing is kept. It returns once the
	// blob's bytes and its name are on stable storage. The same bytes
	// twice are one blob. Once the bytes are hashed and before the blob
	// takes its name, it calls pin with its ref (so that a collector
	// keeps it, or a blob of the same bytes it was about to remove, from
	// then on); the caller undoes the pin when Create then fails.
	Create(r io.Reader, limit int64, pin func(BlobRef)) (BlobRef, error)
	// Open opens a blob for reading.
	Open(sha string) (io.ReadSeekCloser, error)
	// Remove deletes a blob; a missing one is no error.
	Remove(sha string) error
	// List returns every blob's SHA-256 and removes what is left of
	// Creates that never finished (a crash).
	List() ([]string, error)
}

// dirBlobs keeps blobs as files of a directory.
type dirBlobs struct{ dir string }

const blobTempPrefix = ".tmp-"

func openDirBlobs(dir string) (*dirBlobs, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	return &dirBlobs{dir: dir}, syncDir(filepath.Dir(dir))
}

func (b *dirBlobs) Create(r io.Reader, limit int64, pin func(BlobRef)) (ref BlobRef, err error) {
	f, err := os.CreateTemp(b.dir, blobTempPrefix+"*")
	if err != nil {
		return BlobRef{}, fmt.Errorf("store: create blob: %w", err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	h := sha256.New()
	n, err := io.CopyBuffer(io.MultiWriter(f, h), io.LimitReader(r, limit+1), make([]byte, blobCopyBytes))
	switch {
	case err != nil:
		return BlobRef{}, err // the reader's error, as it is: the caller knows what it read from
	case n > limit:
		return BlobRef{}, fmt.Errorf("%w of %d bytes", ErrTooLarge, limit)
	}
	if err := f.Sync(); err != nil {
		return BlobRef{}, fmt.Errorf("store: sync blob: %w", err)
	}
	if err := f.Close(); err != nil {
		return BlobRef{}, fmt.Errorf("store: close blob: %w", err)
	}
	ref = BlobRef{SHA256: hex.EncodeToString(h.Sum(nil)), Size: n}
	pin(ref)
	// Same name, same bytes: replacing an existing blob changes nothing.
	if err := os.Rename(f.Name(), filepath.Join(b.dir, ref.SHA256)); err != nil {
		return BlobRef{}, fmt.Errorf("store: name blob: %w", err)
	}
	if err := syncDir(b.dir); err != nil {
		return BlobRef{}, fmt.Errorf("store: sync blob directory: %w", err)
	}
	return ref, nil
}

func (b *dirBlobs) Open(sha string) (io.ReadSeekCloser, error) {
	if err := ValidateFingerprint(sha); err != nil {
		return nil, err
	}
	f, err := os.Open(filepath.Join(b.dir, sha))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: blob %s", ErrNotFound, sha)
	}
	return f, err
}

func (b *dirBlobs) Remove(sha string) error {
	if err := ValidateFingerprint(sha); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(b.dir, sha)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

func (b *dirBlobs) List() ([]string, error) {
	ents, err := os.ReadDir(b.dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		switch name := e.Name(); {
		case strings.HasPrefix(name, blobTempPrefix):
			if err := os.Remove(filepath.Join(b.dir, name)); err != nil {
				return nil, err
			}
		case ValidateFingerprint(name) == nil:
			out = append(out, name)
		}
	}
	return out, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// ---- the Store's side: pins and collection ----

// WriteBlob streams r into a blob (at most limit bytes, else ErrTooLarge)
// and pins it: it is not collected until ReleaseBlob, so a DataOp may name
// it. Call it off the driver's loop: it reads the body and syncs a file.
func (s *Store) WriteBlob(r io.Reader, limit int64) (BlobRef, error) {
	s.blobMu.Lock()
	s.creating++ // no sweep of the directory (CollectBlobs) while a blob's temporary file is written
	s.blobMu.Unlock()
	var pinned *BlobRef
	ref, err := s.blobs.Create(r, limit, func(ref BlobRef) {
		// Pinned before it takes its name: collection, which runs
		// while other writes stream, never removes it from then on.
		s.blobMu.Lock()
		s.pins[ref.SHA256]++
		s.blobMu.Unlock()
		pinned = &ref
	})
	s.blobMu.Lock()
	defer s.blobMu.Unlock()
	s.creating--
	if err != nil && pinned != nil {
		s.unpinLocked(*pinned)
	}
	s.collectLocked()
	return ref, err
}

// unpinLocked takes one pin off a blob; one no write pins any more may be
// collected (blobMu held).
func (s *Store) unpinLocked(ref BlobRef) {
	if s.pins[ref.SHA256]--; s.pins[ref.SHA256] <= 0 {
		delete(s.pins, ref.SHA256)
		s.unsure[ref.SHA256] = true
	}
}

// ReleaseBlob unpins a blob WriteBlob returned, once the write that names
// it was answered (committed or refused); a blob no record names and no
// other write pinned is removed.
func (s *Store) ReleaseBlob(ref BlobRef) {
	s.blobMu.Lock()
	defer s.blobMu.Unlock()
	if s.pins[ref.SHA256] == 0 {
		return // not written by WriteBlob, or already released
	}
	s.unpinLocked(ref)
	s.collectLocked()
}

// OpenBlob opens a blob for reading.
func (s *Store) OpenBlob(sha string) (io.ReadSeekCloser, error) { return s.blobs.Open(sha) }

// collectLocked removes the released blobs no record names and no write
// pins (a Create pins its blob before naming it, so one streaming now
// holds up nothing of the others), unless a Backup is under way (its
// snapshot may name one): then they wait for the next call.
func (s *Store) collectLocked() {
	if s.holds > 0 || len(s.unsure) == 0 {
		return
	}
	for sha := range s.unsure {
		if s.pins[sha] > 0 {
			delete(s.unsure, sha)
			continue
		}
		named, err := s.blobNamed(sha)
		if err != nil {
			return // closed, or a read error: try again later
		}
		if !named {
			if err := s.blobs.Remove(sha); err != nil {
				return
			}
		}
		delete(s.unsure, sha)
	}
}

// blobNamed says whether a record names the blob. The blob index is
// written by ApplyWithData only, never through the log (wal.go), so this
// read needs no barrier; it must not wait for one, as it holds blobMu,
// which ApplyWithData's transaction takes, and the applier waits for that
// transaction.
func (s *Store) blobNamed(sha string) (bool, error) {
	named := false
	err := s.db.View(func(tx *bolt.Tx) error {
		named = tx.Bucket(bktBlob).Get([]byte(sha)) != nil
		return nil
	})
	return named, s.mapErr(err)
}

// CollectBlobs removes every blob no record names (and what is left of
// unfinished writes); Open calls it, when nothing can be pinned. It returns
// how many blobs it removed.
func (s *Store) CollectBlobs() (int, error) {
	s.blobMu.Lock()
	defer s.blobMu.Unlock()
	if s.creating > 0 || s.holds > 0 || len(s.pins) > 0 {
		return 0, nil
	}
	all, err := s.blobs.List()
	if err != nil {
		return 0, fmt.Errorf("store: list blobs: %w", err)
	}
	removed := 0
	for _, sha := range all {
		named, err := s.blobNamed(sha)
		if err != nil {
			return removed, err
		}
		if !named {
			if err := s.blobs.Remove(sha); err != nil {
				return removed, fmt.Errorf("store: remove blob: %w", err)
			}
			removed++
		}
	}
	return removed, nil
}

// nameBlob marks a pinned blob referenced by the record owner (blobOwner),
// inside the transaction that commits the record.
func (s *Store) nameBlob(tx *bolt.Tx, ref BlobRef, owner []byte) error {
	if err := ValidateFingerprint(ref.SHA256); err != nil {
		return err
	}
	s.blobMu.Lock()
	pinned := s.pins[ref.SHA256] > 0
	s.blobMu.Unlock()
	if !pinned {
		return fmt.Errorf("%w: %s", ErrNoBlob, ref.SHA256)
	}
	if err := tx.Bucket(bktBlobBy).Put(blobByKey(ref.SHA256, owner), nil); err != nil {
		return err
	}
	return tx.Bucket(bktBlob).Put([]byte(ref.SHA256), binary.BigEndian.AppendUint64(nil, uint64(ref.Size)))
}
