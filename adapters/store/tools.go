package store

// The store tools (SPEC §7): a backup taken while the orchestrator serves,
// an offline compaction, and a read-only consistency check (check.go).
//
// A backup is a tar stream: the entry "store" is the bbolt file as one read
// transaction saw it, then "store.blobs/<sha256>" for every blob that
// snapshot names. Unpack turns it back into a store file and its blob
// directory.

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Names inside a backup's tar stream.
const (
	backupStore   = "store"
	backupBlobDir = "store.blobs/"
)

// compactTxBytes is how much bbolt's Compact copies per transaction.
const compactTxBytes = 64 << 20

// ErrExists is returned when a backup or a compaction would overwrite a file.
var ErrExists = errors.New("store: file exists")

// Backup writes a consistent snapshot of the store to w, as a tar stream,
// while the store is in use. The bbolt file is copied from one read
// transaction into an unnamed spool file next to the store (a read
// transaction held while a slow reader drains the stream would hold off
// bbolt's remapping, and with it every commit), then streamed with the
// blobs the snapshot names. Blob collection waits until Backup returns: a
// blob the snapshot names may no longer be named by the live store, and
// must stay until it is copied.
func (s *Store) Backup(w io.Writer) error {
	s.blobMu.Lock()
	s.holds++
	s.blobMu.Unlock()
	defer func() {
		s.blobMu.Lock()
		s.holds--
		s.collectLocked()
		s.blobMu.Unlock()
	}()
	if s.log != nil {
		if err := s.log.barrier(); err != nil { // everything acknowledged is in the snapshot
			return fmt.Errorf("store: backup: %w", err)
		}
	}
	return backup(s.db, s.blobs, filepath.Dir(s.Path()), w)
}

// BackupFile writes a backup, as Backup does, of the store file at path,
// which no process may hold open (ErrLocked if an orchestrator serves it).
// Nothing of it is changed, except that a log a crash left unapplied is
// replayed into the file first (SPEC §7), as Open would.
func BackupFile(path string, w io.Writer) error {
	db, err := openReadOnly(path)
	if err != nil {
		return err
	}
	defer db.Close()
	return backup(db, &dirBlobs{dir: path + ".blobs"}, filepath.Dir(path), w)
}

func backup(db *bolt.DB, blobs Blobs, spoolDir string, w io.Writer) error {
	spool, err := os.CreateTemp(spoolDir, ".backup-*")
	if err != nil {
		return fmt.Errorf("store: backup spool: %w", err)
	}
	defer spool.Close()
	// Unnamed at once: a crash leaves nothing behind.
	if err := os.Remove(spool.Name()); err != nil {
		return fmt.Errorf("store: backup spool: %w", err)
	}
	var refs []BlobRef
	err = db.View(func(tx *bolt.Tx) error {
		if _, err := tx.WriteTo(spool); err != nil {
			return fmt.Errorf("snapshot: %w", err)
		}
		if b := tx.Bucket(bktBlob); b != nil {
			return b.ForEach(func(k, v []byte) error {
				if len(v) != 8 || ValidateFingerprint(string(k)) != nil {
					return fmt.Errorf("blob index entry %q is malformed (run store check)", k)
				}
				refs = append(refs, BlobRef{SHA256: string(k), Size: int64(binary.BigEndian.Uint64(v))})
				return nil
			})
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("store: backup: %w", err)
	}
	size, err := spool.Seek(0, io.SeekCurrent)
	if err == nil {
		_, err = spool.Seek(0, io.SeekStart)
	}
	if err != nil {
		return fmt.Errorf("store: backup spool: %w", err)
	}
	now := time.Now()
	tw := tar.NewWriter(w)
	if err := tarCopy(tw, backupStore, size, now, spool); err != nil {
		return fmt.Errorf("store: backup: %w", err)
	}
	for _, ref := range refs {
		if err := tarBlob(tw, blobs, ref, now); err != nil {
			return fmt.Errorf("store: backup: blob %s: %w", ref.SHA256, err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("store: backup: %w", err)
	}
	return nil
}

func tarCopy(tw *tar.Writer, name string, size int64, mod time.Time, r io.Reader) error {
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: size, ModTime: mod, Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	n, err := io.CopyBuffer(tw, io.LimitReader(r, size), make([]byte, blobCopyBytes))
	if err == nil && n != size {
		err = fmt.Errorf("%s: %d bytes where %d were expected", name, n, size)
	}
	return err
}

func tarBlob(tw *tar.Writer, blobs Blobs, ref BlobRef, mod time.Time) error {
	f, err := blobs.Open(ref.SHA256)
	if err != nil {
		return err
	}
	defer f.Close()
	size, err := f.Seek(0, io.SeekEnd)
	if err == nil {
		_, err = f.Seek(0, io.SeekStart)
	}
	if err != nil {
		return err
	}
	if size != ref.Size {
		return fmt.Errorf("the file holds %d bytes, the index says %d (run store check)", size, ref.Size)
	}
	return tarCopy(tw, backupBlobDir+ref.SHA256, size, mod, f)
}

// Unpack writes the backup read from r as the store file path and its blob
// directory path+".blobs". It refuses (ErrExists) if either exists, checks
// every blob's SHA-256 against its name, and names the store file only once
// everything is on stable storage: on error nothing is left at path.
func Unpack(r io.Reader, path string) (err error) {
	blobDir := path + ".blobs"
	for _, p := range []string{path, blobDir, walPath(path)} {
		if _, err := os.Lstat(p); err == nil {
			if p == blobDir {
				if _, err := os.Lstat(path); errors.Is(err, os.ErrNotExist) {
					return fmt.Errorf("%w: %s, without its store file %s: an unpack stopped midway leaves it so; remove it and unpack again", ErrExists, p, path)
				}
			}
			return fmt.Errorf("%w: %s; a backup never overwrites", ErrExists, p)
		}
	}
	dir := filepath.Dir(path)
	if err := os.Mkdir(blobDir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("%w: %s; a backup never overwrites", ErrExists, blobDir)
		}
		return fmt.Errorf("store: unpack: %w", err)
	}
	// This call made the blob directory, so no other unpack to path is
	// under way: a store file an unpack killed midway left half written is
	// nobody's.
	removeLeftovers(dir, filepath.Base(path)+".tmp-")
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".tmp-*")
	if err != nil {
		os.Remove(blobDir)
		return fmt.Errorf("store: unpack: %w", err)
	}
	defer func() {
		tmp.Close()
		os.Remove(tmp.Name())
		if err != nil {
			os.RemoveAll(blobDir)
		}
	}()
	tr := tar.NewReader(r)
	sawStore := false
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("store: unpack: %w", err)
		}
		switch name := h.Name; {
		case name == backupStore && !sawStore:
			sawStore = true
			if _, err := io.CopyBuffer(tmp, tr, make([]byte, blobCopyBytes)); err != nil {
				return fmt.Errorf("store: unpack: %w", err)
			}
		case strings.HasPrefix(name, backupBlobDir) && ValidateFingerprint(strings.TrimPrefix(name, backupBlobDir)) == nil:
			if err := unpackBlob(tr, blobDir, strings.TrimPrefix(name, backupBlobDir)); err != nil {
				return fmt.Errorf("store: unpack: %w", err)
			}
		default:
			return fmt.Errorf("store: unpack: unexpected entry %q: not a backup of a store", name)
		}
	}
	if !sawStore {
		return fmt.Errorf("store: unpack: the stream holds no store file: not a backup of a store")
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("store: unpack: %w", err)
	}
	// The snapshot is whole without the log it was taken beside: the
	// store unpacked starts a log of its own (wal.go).
	if err := forgetLog(tmp.Name()); err != nil {
		return fmt.Errorf("store: unpack: %w", err)
	}
	if err := syncDir(blobDir); err != nil {
		return fmt.Errorf("store: unpack: %w", err)
	}
	// A link, unlike a rename, never replaces a file that appeared meanwhile.
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("%w: %s; a backup never overwrites", ErrExists, path)
		}
		return fmt.Errorf("store: unpack: %w", err)
	}
	return syncDir(dir)
}

func unpackBlob(r io.Reader, dir, sha string) error {
	f, err := os.CreateTemp(dir, blobTempPrefix+"*")
	if err != nil {
		return err
	}
	defer func() {
		f.Close()
		os.Remove(f.Name())
	}()
	h := sha256.New()
	if _, err := io.CopyBuffer(io.MultiWriter(f, h), r, make([]byte, blobCopyBytes)); err != nil {
		return err
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != sha {
		return fmt.Errorf("blob %s: its bytes hash to %s", sha, got)
	}
	if err := f.Sync(); err != nil {
		return err
	}
	return os.Rename(f.Name(), filepath.Join(dir, sha))
}

// Compact rewrites the store file at path without its free pages: bbolt's
// Compact into a temporary file of the same directory, synced, renamed over
// path while path is still locked. No process may hold the store
// (ErrLocked). It returns the file's size before and after.
func Compact(path string) (before, after int64, err error) {
	st, err := os.Stat(path)
	if err != nil {
		return 0, 0, fmt.Errorf("store: compact: %w", err)
	}
	before = st.Size()
	src, err := openLocked(path, false)
	if err != nil {
		return 0, 0, err
	}
	defer src.Close()
	// A copy a compaction killed midway left (as large as the store) is
	// nobody's: this process holds the store's lock.
	removeLeftovers(filepath.Dir(path), filepath.Base(path)+".compact-")
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".compact-*")
	if err != nil {
		return 0, 0, fmt.Errorf("store: compact: %w", err)
	}
	tmp := f.Name()
	f.Close()
	defer os.Remove(tmp) // after the rename, a no-op
	dst, err := bolt.Open(tmp, 0o600, &bolt.Options{NoSync: true})
	if err != nil {
		return 0, 0, fmt.Errorf("store: compact: %w", err)
	}
	err = bolt.Compact(dst, src, compactTxBytes)
	if err == nil {
		err = dst.Sync()
	}
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, 0, fmt.Errorf("store: compact: %w", err)
	}
	if st, err = os.Stat(tmp); err != nil {
		return 0, 0, fmt.Errorf("store: compact: %w", err)
	}
	after = st.Size()
	if err := os.Rename(tmp, path); err != nil {
		return 0, 0, fmt.Errorf("store: compact: %w", err)
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		return 0, 0, fmt.Errorf("store: compact: %w", err)
	}
	return before, after, nil
}

// openReadOnly opens an existing store file read-only, sharing bbolt's lock
// with other readers (a serving orchestrator holds it exclusively:
// ErrLocked). A file whose log may hold batches not yet in it (a crash)
// has them replayed first (wal.go), the one change made to it.
func openReadOnly(path string) (*bolt.DB, error) {
	db, err := openLocked(path, true)
	if err != nil {
		return nil, err
	}
	var st walState
	db.View(func(tx *bolt.Tx) error { st = readWALState(tx); return nil })
	if st.clean {
		return db, nil
	}
	db.Close()
	if db, err = openLocked(path, false); err != nil {
		return nil, err
	}
	_, err = recoverLog(db, path, false)
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	return openLocked(path, true)
}

// forgetLog removes the log's bucket from the bbolt file at path, which no
// log is beside.
func forgetLog(path string) error {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: openTimeout})
	if err != nil {
		return err
	}
	err = db.Update(func(tx *bolt.Tx) error {
		if tx.Bucket(bktWAL) == nil {
			return nil
		}
		return tx.DeleteBucket(bktWAL)
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	return err
}

func openLocked(path string, readOnly bool) (*bolt.DB, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("store: %w", err) // bbolt would create it
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: openTimeout, ReadOnly: readOnly})
	if errors.Is(err, bolt.ErrTimeout) {
		return nil, fmt.Errorf("%w: %s is held open by another process (an orchestrator serving it?) "+
			"and its lock was not free within %s; stop it, or take an online backup and use that", ErrLocked, path, openTimeout)
	}
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	return db, nil
}
