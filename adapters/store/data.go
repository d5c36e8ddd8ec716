package store

// The data plane's records live in the same bbolt file as the core's, in
// buckets of their own, so that a batch of records and the data writes
// fenced against it commit in ONE transaction (ApplyWithData). The bytes of
// a PUT and of a bundle are not in the transaction: they are a blob
// (blob.go), written and synced before, and the record names it. Appends
// (at most 1 MiB each) are stored inside the transaction:
//
//	data         id 0x00 be64(version)           → DataMeta (JSON); its bytes are the blob DataMeta.SHA256
//	stream       id                              → StreamMeta (JSON)
//	stream.chunk id 0x00 be64(offset)            → the bytes of one append, starting at offset
//	bundle       fingerprint                     → BundleMeta (JSON); its bytes are the blob of that name
//	bundle.file  fingerprint 0x00 relPath        → be64(offset) be64(size) of a file in a tar bundle
//	blob         sha256                          → be64(size): a record names this blob
//	request      be64(lease) requestID           → RequestEntry (JSON): a write's first answer (request.go)
//	request.count be64(lease) | "total"          → be64(entries)
//
// Stores written before blobs kept the bytes of a version or a bundle in
// ChunkSize pieces inside the file (data.chunk: id 0x00 be64(version)
// be32(n); bundle.chunk: fingerprint be32(n)); they are read as they are
// (a version whose SHA-256 names no blob is read from its chunks) and never
// written any more.
//
// Data is versioned-immutable: a put creates the next version and nothing
// ever rewrites one, so a reader may read a version's bytes outside any
// transaction (a long one would hold off bbolt's remapping, and with it
// every commit) and still see one consistent value.

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/tether-run/tether/adapters/dataplane"
	"github.com/tether-run/tether/core"
)

// ChunkSize is the size of the pieces a version or a bundle was stored in
// before blobs (read-only now).
const ChunkSize = 1 << 20

// Data-plane limits of the store.
const (
	// MaxIDLength bounds a data id.
	MaxIDLength = 128
	// MaxTarFiles bounds the files indexed in a tar bundle; a tar with more
	// is stored as an opaque bundle.
	MaxTarFiles = 100_000
	// maxRelPath bounds a path inside a bundle.
	maxRelPath = 1024
)

var (
	bktData        = []byte("data")
	bktDataChunk   = []byte("data.chunk")
	bktStream      = []byte("stream")
	bktStreamChunk = []byte("stream.chunk")
	bktBundle      = []byte("bundle")
	bktBundleChunk = []byte("bundle.chunk")
	bktBundleFile  = []byte("bundle.file")
	dataBuckets    = [][]byte{bktData, bktDataChunk, bktStream, bktStreamChunk, bktBundle, bktBundleChunk, bktBundleFile, bktRequest, bktRequestCount}
)

var (
	// ErrNotFound is returned when a data version, stream, bundle or bundle
	// file does not exist.
	ErrNotFound = errors.New("store: not found")
	// ErrBadID is returned when a data id is not 1-128 characters of
	// [A-Za-z0-9._-] starting with a letter or digit.
	ErrBadID = errors.New("store: bad data id")
	// ErrBadFingerprint is returned when a bundle fingerprint is not 64
	// lowercase hex digits (a SHA-256).
	ErrBadFingerprint = errors.New("store: bad bundle fingerprint")
	// ErrBadPath is returned when a path inside a bundle is empty, absolute,
	// not clean, or climbs out with "..".
	ErrBadPath = errors.New("store: bad path inside a bundle")
	// ErrBadOp is returned when a data operation is malformed (unknown kind,
	// an empty append).
	ErrBadOp = errors.New("store: malformed data operation")
	// ErrStreamFull is returned, in a DataResult, when an append would make
	// its stream longer than the op's MaxStream; nothing of it is written.
	ErrStreamFull = errors.New("store: stream length limit reached")
)

// DataOpKind says what a DataOp does.
type DataOpKind uint8

// Data operations.
const (
	// OpPut stores Body as the next version of ID.
	OpPut DataOpKind = iota + 1
	// OpAppend appends Body to ID's stream.
	OpAppend
	// OpBundle stores Body as a content-addressed bundle (its SHA-256).
	OpBundle
	// OpDelete stores a tombstone as the next version of ID.
	OpDelete
	// OpSecretPut seals Body as the value of secret ID (secrets.go).
	OpSecretPut
	// OpSecretDelete removes secret ID's value.
	OpSecretDelete
)

// DataOp is one data-plane write, applied in the transaction of a batch of
// records (ApplyWithData).
type DataOp struct {
	Kind DataOpKind
	ID   string // data id (OpPut, OpAppend)
	// Blob holds the bytes of an OpPut or an OpBundle: written with
	// WriteBlob before, and pinned until the op was applied or refused.
	Blob BlobRef
	// Body is the bytes of an OpAppend.
	Body []byte
	// Files is the tar index of a bundle (see TarIndex); nil for an opaque one.
	Files map[string]FileSpan
	// MaxStream bounds the stream's length after an append; zero: no bound.
	MaxStream int64
	// Provenance, kept with the version or stream.
	Worker string
	Lease  uint64
	At     time.Time
	Run    string // the lease's run and step (a version keeps them)
	Step   string
	// Attributes are kept with the version an OpPut creates.
	Attributes map[string]string
	// Request, if set, is the write's request id: the first op of (Lease,
	// Request) stores its answer with it, and a later one writes nothing
	// and gets that answer (DataResult.Repeated). RepeatOnly ops only look
	// the answer up: they were admitted as repeats of an op not yet
	// durable, and fail (ErrRequestLost) if that one stored nothing.
	Request    string
	RepeatOnly bool
}

// DataResult is the outcome of one DataOp.
type DataResult struct {
	// Err is set when the op was refused (ErrStreamFull, ErrNoBlob);
	// nothing of it was written, and the rest of the transaction was
	// applied.
	Err    error
	Data   DataMeta     // OpPut, OpDelete: the new version
	Append AppendResult // OpAppend
	Bundle BundleMeta   // OpBundle
	// Repeated says the op repeated an earlier one's request id: nothing
	// was written, and Data or Append is that one's answer.
	Repeated bool
}

// The data plane's answers are its protocol's types (adapters/dataplane),
// kept as they are answered: a record is the JSON of one of these.
type (
	// DataMeta describes one immutable version of a data item.
	DataMeta = dataplane.Version
	// StreamMeta describes a data item's append stream.
	StreamMeta = dataplane.Stream
	// AppendResult is where one append landed.
	AppendResult = dataplane.Appended
	// BundleMeta describes a stored bundle.
	BundleMeta = dataplane.Bundle
)

// FileSpan is where a file's bytes lie inside a tar bundle.
type FileSpan struct {
	Offset int64
	Size   int64
}

// ValidateID checks a data id: 1-128 characters of [A-Za-z0-9._-], the
// first a letter or a digit (so "." and ".." are never ids).
func ValidateID(id string) error {
	if id == "" || len(id) > MaxIDLength {
		return fmt.Errorf("%w %q: want 1-%d characters", ErrBadID, id, MaxIDLength)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || c != '.' && c != '_' && c != '-') {
			return fmt.Errorf("%w %q: want letters, digits, '.', '_' or '-', starting with a letter or digit", ErrBadID, id)
		}
	}
	return nil
}

// ValidateFingerprint checks a bundle fingerprint: 64 lowercase hex digits.
func ValidateFingerprint(fp string) error {
	if len(fp) != 2*sha256.Size {
		return fmt.Errorf("%w %q: want the 64 hex digits of a SHA-256", ErrBadFingerprint, fp)
	}
	for i := 0; i < len(fp); i++ {
		if c := fp[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return fmt.Errorf("%w %q: want the 64 lowercase hex digits of a SHA-256", ErrBadFingerprint, fp)
		}
	}
	return nil
}

// ValidateRelPath checks a path inside a bundle: relative, clean, without
// "..", at most 1024 bytes.
func ValidateRelPath(p string) error {
	switch {
	case p == "" || len(p) > maxRelPath:
		return fmt.Errorf("%w %q: want 1-%d bytes", ErrBadPath, p, maxRelPath)
	case strings.HasPrefix(p, "/") || path.Clean(p) != p || p == ".." || strings.HasPrefix(p, "../") || strings.ContainsRune(p, 0):
		return fmt.Errorf("%w %q: want a clean relative path", ErrBadPath, p)
	}
	return nil
}

// TarIndex indexes an uncompressed tar archive held in memory; see
// TarIndexReader.
func TarIndex(b []byte) (files map[string]FileSpan, ok bool) {
	return TarIndexReader(bytes.NewReader(b), int64(len(b)))
}

// TarIndexReader indexes an uncompressed tar archive of size bytes: each
// regular file's path (cleaned, relative) and where its bytes lie. ok is
// false when it is not a tar archive this can index (not a tar, compressed,
// sparse files, more than MaxTarFiles files, a path that is not clean and
// relative, no regular file at all), and files nil; such a bundle is stored
// as opaque bytes. It seeks over the files' bytes rather than reading them.
func TarIndexReader(rs io.ReadSeeker, size int64) (files map[string]FileSpan, ok bool) {
	r := &countingReader{r: rs}
	tr := tar.NewReader(r)
	files = map[string]FileSpan{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			if len(files) == 0 {
				return nil, false
			}
			return files, true
		}
		if err != nil {
			return nil, false
		}
		switch h.Typeflag {
		case tar.TypeReg:
		case tar.TypeDir, tar.TypeSymlink, tar.TypeLink:
			continue
		default:
			return nil, false // sparse and other kinds: not byte ranges of the archive
		}
		name := strings.TrimPrefix(path.Clean(h.Name), "./")
		if ValidateRelPath(name) != nil || len(files) >= MaxTarFiles || r.n+h.Size > size {
			return nil, false
		}
		// tar.Reader reads headers in whole blocks and never ahead, so the
		// file's bytes start where the reader stands now.
		files[name] = FileSpan{Offset: r.n, Size: h.Size}
	}
}

// countingReader knows where it stands in the archive, reading or seeking
// (tar.Reader seeks over file bytes when it can).
type countingReader struct {
	r io.ReadSeeker
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func (c *countingReader) Seek(off int64, whence int) (int64, error) {
	n, err := c.r.Seek(off, whence)
	if err == nil {
		c.n = n
	}
	return n, err
}

func versionKey(id string, v uint64) []byte {
	k := make([]byte, 0, len(id)+9)
	k = append(append(k, id...), 0)
	return binary.BigEndian.AppendUint64(k, v)
}

func chunkKey(prefix []byte, n int) []byte {
	return binary.BigEndian.AppendUint32(append([]byte(nil), prefix...), uint32(n))
}

func offsetKey(id string, off int64) []byte { return versionKey(id, uint64(off)) }

// ApplyWithData is Apply plus data-plane writes, all in one transaction:
// when it returns nil the records and every accepted op are on stable
// storage, and after a crash either all of them or none are there. A
// refused op (its DataResult.Err) writes nothing and does not abort the
// rest. Ops apply in order: two puts of one id get consecutive versions.
func (s *Store) ApplyWithData(recs []core.Record, ops []DataOp) ([]DataResult, error) {
	if err := checkRecords(recs); err != nil {
		return nil, err
	}
	for i, op := range ops {
		if err := s.checkOp(op); err != nil {
			return nil, fmt.Errorf("store: data op %d of %d: %w", i+1, len(ops), err)
		}
	}
	var res []DataResult
	err := s.update(func(tx *bolt.Tx) error {
		if err := putRecords(tx, recs, s); err != nil {
			return err
		}
		res = make([]DataResult, len(ops))
		for i, op := range ops {
			var err error
			var done bool
			if op.Request != "" {
				res[i], done, err = repeated(tx, op)
			}
			switch {
			case done || err != nil:
			case op.Kind == OpPut:
				res[i].Data, err = s.putVersion(tx, op)
			case op.Kind == OpAppend:
				res[i].Append, err = appendStream(tx, op)
			case op.Kind == OpBundle:
				res[i].Bundle, err = s.putBundle(tx, op)
			case op.Kind == OpDelete:
				res[i].Data, err = deleteVersion(tx, op)
			case op.Kind == OpSecretPut:
				err = s.putSecret(tx, op)
			case op.Kind == OpSecretDelete:
				err = deleteSecret(tx, op.ID)
			}
			if err == nil && !done && op.Request != "" {
				err = remember(tx, op, res[i])
			}
			if errors.Is(err, ErrStreamFull) || errors.Is(err, ErrNoBlob) || errors.Is(err, ErrNotFound) ||
				errors.Is(err, ErrRequestsFull) || errors.Is(err, ErrRequestReused) || errors.Is(err, ErrRequestLost) {
				res[i].Err, err = err, nil
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: apply %d records and %d data ops: %w", len(recs), len(ops), s.mapErr(err))
	}
	return res, nil
}

func (s *Store) checkOp(op DataOp) error {
	if op.Request != "" {
		if err := ValidateRequestID(op.Request); err != nil {
			return err
		}
		if op.Kind == OpBundle || op.Lease == 0 {
			return fmt.Errorf("%w: a request id names a fenced write (put, append, delete)", ErrBadOp)
		}
	}
	switch op.Kind {
	case OpPut:
		if err := ValidateFingerprint(op.Blob.SHA256); err != nil {
			return fmt.Errorf("%w: a put names no blob (%v)", ErrBadOp, err)
		}
		if err := ValidateAttributes(op.Attributes); err != nil {
			return err
		}
		return ValidateID(op.ID)
	case OpAppend:
		if len(op.Body) == 0 {
			return fmt.Errorf("%w: an empty append", ErrBadOp)
		}
		return ValidateID(op.ID)
	case OpDelete:
		return ValidateID(op.ID)
	case OpBundle:
		if err := ValidateFingerprint(op.Blob.SHA256); err != nil {
			return fmt.Errorf("%w: a bundle names no blob (%v)", ErrBadOp, err)
		}
		for p := range op.Files {
			if err := ValidateRelPath(p); err != nil {
				return err
			}
		}
		return nil
	case OpSecretPut, OpSecretDelete:
		if op.ID == "" || (op.Kind == OpSecretPut && len(op.Body) == 0) {
			return fmt.Errorf("%w: a secret op with no name or value", ErrBadOp)
		}
		if op.Kind == OpSecretPut {
			if err := s.keys.Keyed(); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("%w: kind %d", ErrBadOp, op.Kind)
}

func (s *Store) putVersion(tx *bolt.Tx, op DataOp) (DataMeta, error) {
	latest, err := latestVersion(tx, op.ID)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return DataMeta{}, err
	}
	m := DataMeta{
		ID: op.ID, Version: latest.Version + 1, Size: op.Blob.Size, SHA256: op.Blob.SHA256,
		Created: op.At.UTC(), Worker: op.Worker, Lease: op.Lease, Run: op.Run, Step: op.Step,
		Attributes: op.Attributes,
	}
	if err := s.nameBlob(tx, op.Blob, dataOwner(op.ID, m.Version)); err != nil {
		return DataMeta{}, err
	}
	return m, putJSON(tx.Bucket(bktData), versionKey(op.ID, m.Version), m)
}

func putJSON(b *bolt.Bucket, key []byte, v any) error {
	enc, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return b.Put(key, enc)
}

func appendStream(tx *bolt.Tx, op DataOp) (AppendResult, error) {
	b := tx.Bucket(bktStream)
	var m StreamMeta
	if v := b.Get([]byte(op.ID)); v != nil {
		if err := json.Unmarshal(v, &m); err != nil {
			return AppendResult{}, fmt.Errorf("stream %q: %w", op.ID, err)
		}
	}
	size := int64(len(op.Body))
	if op.MaxStream > 0 && m.Length+size > op.MaxStream {
		return AppendResult{}, fmt.Errorf("%w: stream %q holds %d bytes, %d more would pass %d", ErrStreamFull, op.ID, m.Length, size, op.MaxStream)
	}
	r := AppendResult{ID: op.ID, Offset: m.Length, Size: size, Length: m.Length + size}
	if err := tx.Bucket(bktStreamChunk).Put(offsetKey(op.ID, m.Length), op.Body); err != nil {
		return AppendResult{}, err
	}
	m = StreamMeta{ID: op.ID, Length: r.Length, Appends: m.Appends + 1, Updated: op.At.UTC()}
	return r, putJSON(b, []byte(op.ID), m)
}

func (s *Store) putBundle(tx *bolt.Tx, op DataOp) (BundleMeta, error) {
	fp := op.Blob.SHA256
	b := tx.Bucket(bktBundle)
	if v := b.Get([]byte(fp)); v != nil {
		var m BundleMeta
		if err := json.Unmarshal(v, &m); err != nil {
			return BundleMeta{}, fmt.Errorf("bundle %s: %w", fp, err)
		}
		m.Existed = true
		return m, nil
	}
	m := BundleMeta{Fingerprint: fp, Size: op.Blob.Size, Created: op.At.UTC(), Tar: op.Files != nil, Files: len(op.Files)}
	if err := s.nameBlob(tx, op.Blob, bundleOwner(fp)); err != nil {
		return BundleMeta{}, err
	}
	fb := tx.Bucket(bktBundleFile)
	paths := make([]string, 0, len(op.Files))
	for p := range op.Files {
		paths = append(paths, p)
	}
	sort.Strings(paths) // bbolt inserts fastest in key order
	for _, p := range paths {
		span := op.Files[p]
		v := binary.BigEndian.AppendUint64(nil, uint64(span.Offset))
		v = binary.BigEndian.AppendUint64(v, uint64(span.Size))
		if err := fb.Put([]byte(fp+"\x00"+p), v); err != nil {
			return BundleMeta{}, err
		}
	}
	return m, putJSON(b, []byte(fp), m)
}

// latestVersion finds the greatest version of id inside tx.
func latestVersion(tx *bolt.Tx, id string) (DataMeta, error) {
	c := tx.Bucket(bktData).Cursor()
	prefix := append([]byte(id), 0)
	k, v := seekAtOrBefore(c, versionKey(id, ^uint64(0)))
	if k == nil || !bytes.HasPrefix(k, prefix) || len(k) != len(prefix)+8 {
		return DataMeta{}, fmt.Errorf("%w: data %q", ErrNotFound, id)
	}
	var m DataMeta
	if err := json.Unmarshal(v, &m); err != nil {
		return DataMeta{}, fmt.Errorf("data %q: %w", id, err)
	}
	return m, nil
}

// seekAtOrBefore moves c to the greatest key <= key.
func seekAtOrBefore(c *bolt.Cursor, key []byte) ([]byte, []byte) {
	k, v := c.Seek(key)
	switch {
	case k == nil:
		return c.Last()
	case !bytes.Equal(k, key):
		return c.Prev()
	}
	return k, v
}

// Data returns the metadata of a version of id; version 0 means the latest.
func (s *Store) Data(id string, version uint64) (DataMeta, error) {
	if err := ValidateID(id); err != nil {
		return DataMeta{}, err
	}
	var m DataMeta
	err := s.view(func(tx *bolt.Tx) error {
		if version == 0 {
			var err error
			if m, err = latestVersion(tx, id); err == nil && m.Deleted {
				return fmt.Errorf("%w: data %q was deleted (version %d is its tombstone)", ErrNotFound, id, m.Version)
			}
			return err
		}
		v := tx.Bucket(bktData).Get(versionKey(id, version))
		if v == nil {
			return fmt.Errorf("%w: data %q version %d", ErrNotFound, id, version)
		}
		if err := json.Unmarshal(v, &m); err != nil {
			return err
		}
		if m.Deleted {
			return fmt.Errorf("%w: data %q version %d is a deletion (a tombstone has no bytes)", ErrNotFound, id, version)
		}
		return nil
	})
	if err != nil {
		return DataMeta{}, s.mapErr(err)
	}
	return m, nil
}

// Versions lists every version of id, oldest first (none: an empty list).
func (s *Store) Versions(id string) ([]DataMeta, error) {
	if err := ValidateID(id); err != nil {
		return nil, err
	}
	var out []DataMeta
	err := s.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(bktData).Cursor()
		prefix := append([]byte(id), 0)
		for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			var m DataMeta
			if err := json.Unmarshal(v, &m); err != nil {
				return fmt.Errorf("data %q: %w", id, err)
			}
			out = append(out, m)
		}
		return nil
	})
	if err != nil {
		return nil, s.mapErr(err)
	}
	return out, nil
}

// Stream returns the metadata of id's append stream.
func (s *Store) Stream(id string) (StreamMeta, error) {
	if err := ValidateID(id); err != nil {
		return StreamMeta{}, err
	}
	var m StreamMeta
	err := s.view(func(tx *bolt.Tx) error {
		v := tx.Bucket(bktStream).Get([]byte(id))
		if v == nil {
			return fmt.Errorf("%w: stream %q", ErrNotFound, id)
		}
		return json.Unmarshal(v, &m)
	})
	if err != nil {
		return StreamMeta{}, s.mapErr(err)
	}
	return m, nil
}

// Bundle returns the metadata of a bundle.
func (s *Store) Bundle(fp string) (BundleMeta, error) {
	if err := ValidateFingerprint(fp); err != nil {
		return BundleMeta{}, err
	}
	var m BundleMeta
	err := s.view(func(tx *bolt.Tx) error {
		v := tx.Bucket(bktBundle).Get([]byte(fp))
		if v == nil {
			return fmt.Errorf("%w: bundle %s", ErrNotFound, fp)
		}
		return json.Unmarshal(v, &m)
	})
	if err != nil {
		return BundleMeta{}, s.mapErr(err)
	}
	return m, nil
}

// BundleFile returns where a file of a tar bundle lies.
func (s *Store) BundleFile(fp, relPath string) (FileSpan, error) {
	if err := ValidateFingerprint(fp); err != nil {
		return FileSpan{}, err
	}
	if err := ValidateRelPath(relPath); err != nil {
		return FileSpan{}, err
	}
	var span FileSpan
	err := s.view(func(tx *bolt.Tx) error {
		v := tx.Bucket(bktBundleFile).Get([]byte(fp + "\x00" + relPath))
		if len(v) != 16 {
			return fmt.Errorf("%w: file %q in bundle %s", ErrNotFound, relPath, fp)
		}
		span = FileSpan{Offset: int64(binary.BigEndian.Uint64(v)), Size: int64(binary.BigEndian.Uint64(v[8:]))}
		return nil
	})
	if err != nil {
		return FileSpan{}, s.mapErr(err)
	}
	return span, nil
}

// DataReader reads the bytes of a version (its metadata from Data): from
// its blob, or from the chunks of a store written before blobs. The caller
// closes it.
func (s *Store) DataReader(m DataMeta) io.ReadCloser {
	return s.blobOrChunks(m.SHA256, 0, m.Size, func() io.Reader {
		return &chunkReader{s: s, bucket: bktDataChunk, prefix: versionKey(m.ID, m.Version), end: m.Size}
	})
}

// BundleReader reads size bytes of a bundle from offset (the whole bundle,
// or a file's span). The caller closes it.
func (s *Store) BundleReader(m BundleMeta, offset, size int64) io.ReadCloser {
	end := min(offset+size, m.Size)
	offset = min(offset, end)
	return s.blobOrChunks(m.Fingerprint, offset, end-offset, func() io.Reader {
		return &chunkReader{s: s, bucket: bktBundleChunk, prefix: []byte(m.Fingerprint), pos: offset, end: end}
	})
}

// blobOrChunks reads n bytes from off of the blob sha if a record names it,
// else from legacy chunks. It opens nothing until the first Read.
func (s *Store) blobOrChunks(sha string, off, n int64, legacy func() io.Reader) io.ReadCloser {
	return &lazyReader{open: func() (io.Reader, io.Closer, error) {
		named, err := s.blobNamed(sha)
		if err != nil {
			return nil, nil, err
		}
		if !named {
			return legacy(), nil, nil
		}
		f, err := s.blobs.Open(sha)
		if err != nil {
			return nil, nil, err
		}
		if _, err := f.Seek(off, io.SeekStart); err != nil {
			f.Close()
			return nil, nil, err
		}
		return io.LimitReader(f, n), f, nil
	}}
}

// lazyReader opens its source at the first Read.
type lazyReader struct {
	open func() (io.Reader, io.Closer, error)
	r    io.Reader
	c    io.Closer
	err  error
}

func (l *lazyReader) Read(p []byte) (int, error) {
	if l.r == nil && l.err == nil {
		l.r, l.c, l.err = l.open()
	}
	if l.err != nil {
		return 0, l.err
	}
	return l.r.Read(p)
}

func (l *lazyReader) Close() error {
	if l.c != nil {
		return l.c.Close()
	}
	return nil
}

// chunkReader reads [pos, end) of a value stored in ChunkSize pieces, one
// short read transaction per piece.
type chunkReader struct {
	s        *Store
	bucket   []byte
	prefix   []byte
	pos, end int64
	buf      []byte // the current piece, from bufAt
	bufAt    int64
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if r.pos >= r.end {
		return 0, io.EOF
	}
	if r.buf == nil || r.pos < r.bufAt || r.pos >= r.bufAt+int64(len(r.buf)) {
		n := int(r.pos / ChunkSize)
		err := r.s.view(func(tx *bolt.Tx) error {
			v := tx.Bucket(r.bucket).Get(chunkKey(r.prefix, n))
			if v == nil {
				return fmt.Errorf("store: chunk %d of %q is missing", n, r.prefix)
			}
			r.buf = append(r.buf[:0], v...) // bbolt's slice is valid only inside the transaction
			return nil
		})
		if err != nil {
			return 0, r.s.mapErr(err)
		}
		r.bufAt = int64(n) * ChunkSize
	}
	from := r.pos - r.bufAt
	n := copy(p, r.buf[from:min(int64(len(r.buf)), r.end-r.bufAt)])
	r.pos += int64(n)
	return n, nil
}

// StreamReader reads id's stream from offset up to end (a length from
// Stream: what was appended later is not read), one short read transaction
// per append read.
func (s *Store) StreamReader(id string, offset, end int64) io.Reader {
	return AppendReader(id, offset, end, func(pos int64, buf []byte) (int64, []byte, error) { return s.streamChunk(id, pos, buf) })
}

// streamChunk reads the append of stream id that holds pos.
func (s *Store) streamChunk(id string, pos int64, buf []byte) (int64, []byte, error) {
	var at int64
	err := s.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(bktStreamChunk).Cursor()
		k, v := seekAtOrBefore(c, offsetKey(id, pos)) // the append that holds pos started at or before it
		prefix := append([]byte(id), 0)
		if k == nil || !bytes.HasPrefix(k, prefix) || len(k) != len(prefix)+8 {
			return ErrNotFound
		}
		at = int64(binary.BigEndian.Uint64(k[len(prefix):]))
		buf = append(buf[:0], v...)
		return nil
	})
	return at, buf, s.mapErr(err)
}

// AppendReader reads a stream's bytes in [offset, end) one append at a
// time: fetch(pos, buf) returns the append holding pos (its offset, its
// bytes, reusing buf) or ErrNotFound if none does. Every backend reads its
// streams with it.
func AppendReader(id string, offset, end int64, fetch func(pos int64, buf []byte) (int64, []byte, error)) io.Reader {
	return &appendReader{id: id, pos: offset, end: end, fetch: fetch}
}

type appendReader struct {
	id       string
	pos, end int64
	buf      []byte
	bufAt    int64
	fetch    func(pos int64, buf []byte) (int64, []byte, error)
}

func (r *appendReader) Read(p []byte) (int, error) {
	if r.pos >= r.end {
		return 0, io.EOF
	}
	if r.buf == nil || r.pos < r.bufAt || r.pos >= r.bufAt+int64(len(r.buf)) {
		at, buf, err := r.fetch(r.pos, r.buf)
		if errors.Is(err, ErrNotFound) || err == nil && (r.pos < at || r.pos >= at+int64(len(buf))) {
			return 0, fmt.Errorf("store: stream %q has no bytes at %d", r.id, r.pos)
		}
		if err != nil {
			return 0, err
		}
		r.bufAt, r.buf = at, buf
	}
	from := r.pos - r.bufAt
	n := copy(p, r.buf[from:min(int64(len(r.buf)), r.end-r.bufAt)])
	r.pos += int64(n)
	return n, nil
}
