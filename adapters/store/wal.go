package store

// The log in front of bbolt (SPEC §11): one fdatasync per commit.
//
// A bbolt commit writes the pages it changed and syncs, then writes its
// meta page and syncs again. With the log, Apply appends the batch, as the
// store will keep it (prepare: sealed, compressed), as one entry to the file
// <store>.wal and fdatasyncs it: that is the durable point, and Apply
// returns then. A goroutine, the applier, then applies every entry logged
// and not yet applied in ONE bbolt transaction, synced as before (once 1 MiB
// or 256 entries gathered, the ring passed its turning point, or a caller
// waits for them: its two syncs share the disk with the appends'), which
// also records the last applied sequence number (bucket "wal"): a crash
// between the two replays, at Open, the entries after it, in one
// transaction, before anything is served. The records are keyed snapshots
// (an upsert puts a whole value, a delete removes a key), so an entry
// applied twice would leave what applying it once does; it is not, as the
// applied number moves in the transaction that applies it. For the same
// reason a transaction puts only the last of one key's records in the
// entries it applies (applyPayloads).
//
// Every read of the store first waits until the applier has applied every
// entry that was durable when the read was called (barrier): a read never
// sees less than what Apply acknowledged. ApplyWithData and the other
// writes of the store (pruning, secrets) do the same, then commit their own
// synced bbolt transaction as before.
//
// The file: a header (magic, the store's log id), then entries, each
// length (u32), CRC32C (u32), sequence number (u64), group (u64: the
// sequence number of the first entry of the write it came in), payload;
// the CRC covers all but itself. The file is one preallocated ring rather
// than segments: it is grown by zero-filled chunks (so that an append
// overwrites written blocks and fdatasync has no extent or size to
// journal), and writing starts again after the header once every entry in
// it is applied, which needs no file to be created, renamed or removed.
// It does not grow past the limit (Options.LogLimit): an append that would
// waits for the applier (backpressure), never drops; the one exception is a
// single write larger than the limit, which is written whole at the start
// of the ring and grows the file to hold it. Several Apply calls
// at once share one write and one fdatasync (group commit).
//
// Open reads the entries after the applied number: they follow one another
// by sequence number from the header on. A bad entry (a torn write, or bits
// that changed) ends the log there if no good entry of a later group
// follows it anywhere in the file (a write is synced before the next one
// starts, so only the last write can be torn: its entries are cut with
// it); a good entry of a later group after it is an error, never a silent
// loss. Entries left from an earlier turn of the ring have smaller numbers
// than any written since, so they end the log too.
//
// Every Open that appends starts a fresh file under a fresh id, once the
// old one is replayed, so that no entry of an earlier log is ever read as
// this one's (a copied older store file beside a newer log of the same
// store, say).
//
// The "wal" bucket also says whether the log may hold entries not yet
// applied ("clean" is set by Close, and cleared by Open before the first
// append): the tools that read the file without the orchestrator (Check,
// BackupFile) replay a log that is not clean first, and a store whose log
// is clean opens without it.

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/bits"
	"os"
	"path/filepath"
	"strings"
	"sync"

	bolt "go.etcd.io/bbolt"

	"github.com/tether-run/tether/core"
)

const (
	walMagic      = "TETHWAL\x01"
	walHeaderSize = 32 // magic, log id (16), reserved
	walEntryHead  = 24 // length, CRC32C, sequence number, group
	walChunk      = 1 << 20
	// DefaultLogLimit is the log's largest size (Options.LogLimit).
	DefaultLogLimit = 64 << 20
	// MinLogLimit is the smallest limit Options.LogLimit sets: one chunk.
	MinLogLimit = walChunk
	walMaxEntry = 1 << 31
	// The applier lets entries gather (each bbolt commit syncs twice, on
	// the disk the appends sync on) until this many bytes or entries wait,
	// the ring is past its turning point, or a caller waits for them.
	applyBytes   = 1 << 20
	applyEntries = 256
)

var (
	bktWAL        = []byte("wal")
	walKeyID      = []byte("id")
	walKeyApplied = []byte("applied")
	walKeyClean   = []byte("clean")
	castagnoli    = crc32.MakeTable(crc32.Castagnoli)
	walZeros      = make([]byte, walChunk)
)

// ErrLog is returned (wrapped, saying what) when the log beside a store file
// cannot be read as a log of that store: a bad entry followed by good ones,
// entries missing, another store's log, or a log that is gone while the
// store says it may hold entries not yet applied.
var ErrLog = errors.New("store: log")

// Options are the choices of OpenWith; the zero value is Open's.
type Options struct {
	// NoLog commits each Apply as its own synced bbolt transaction (two
	// syncs), as the store did before the log: for comparison only.
	NoLog bool
	// LogLimit bounds the log file's size; 0 is DefaultLogLimit, and a
	// limit under MinLogLimit is MinLogLimit.
	LogLimit int64
}

// walPath is the log's file beside the store file path.
func walPath(path string) string { return path + ".wal" }

// walEntry is one logged batch: its header room, then its payload.
type walEntry struct {
	seq uint64
	buf []byte // walEntryHead bytes, then the payload
}

// wlog is the log of a Store and its applier.
type wlog struct {
	db    *bolt.DB
	f     *os.File
	limit int64
	wrap  int64 // a write starts again after the header past here, if all is applied
	size  int64 // the file's size: zeros past what was written (the writer's)
	pos   int64 // where the next write goes (the writer's)

	mu      sync.Mutex
	cond    sync.Cond
	next    uint64     // the last sequence number given
	queue   []walEntry // given a number, not yet written
	writing bool       // a writer is writing (and syncing) a group
	durable uint64     // every entry up to it is on stable storage
	ready   []walEntry // durable, not yet applied
	applied uint64     // every entry up to it is applied and recorded in bbolt
	err     error      // the first failure to write, sync or apply: sticky
	closed  bool
	hold    bool          // the applier waits (tests: a crash before it applied)
	waited  int           // writes that waited for the applier (tests)
	writes  int           // writes (each one fdatasync) so far (tests)
	urgent  int           // callers waiting for the applier (barrier, backpressure)
	readyN  int64         // bytes in ready
	done    chan struct{} // the applier has returned
}

// encodePayload encodes prepared records after walEntryHead bytes of room.
func encodePayload(ps []prep) []byte {
	n := walEntryHead + binary.MaxVarintLen64
	for _, p := range ps {
		n += 1 + 4*binary.MaxVarintLen64 + len(p.key) + len(p.val) + len(p.sum) + len(p.finish)
	}
	b := payloadBuf(n)[:walEntryHead] // its head is written whole by writeAt
	b = binary.AppendUvarint(b, uint64(len(ps)))
	for _, p := range ps {
		var flags byte
		if p.del {
			flags |= 1
		}
		if p.hist {
			flags |= 2
		}
		b = append(b, flags)
		b = binary.AppendUvarint(b, uint64(len(p.key)))
		b = append(b, p.key...)
		if p.del {
			continue
		}
		b = binary.AppendUvarint(b, uint64(len(p.val)))
		b = append(b, p.val...)
		if p.hist {
			b = binary.AppendUvarint(b, uint64(len(p.sum)))
			b = append(b, p.sum...)
			b = binary.AppendUvarint(b, uint64(len(p.finish)))
			b = append(b, p.finish...)
		}
	}
	return b
}

// payloadPool holds entry buffers the applier is done with (run): a
// commit's entry is tens of kilobytes, otherwise allocated afresh for each
// commit (SPEC §12, the loop's longest step).
var payloadPool sync.Pool // of *[]byte

// payloadBuf returns an empty buffer of at least n bytes' capacity. New
// buffers are sized in powers of two, so that one freed fits the next
// entries of about its size.
func payloadBuf(n int) []byte {
	if p, ok := payloadPool.Get().(*[]byte); ok && cap(*p) >= n {
		return (*p)[:0]
	}
	return make([]byte, 0, 1<<bits.Len(uint(n-1)))
}

// eachRecord decodes an entry's payload and calls f with each record (its
// key left empty) and the key's bytes. Its values are slices of payload,
// which outlives the transaction that puts them.
func eachRecord(payload []byte, f func(p prep, key []byte) error) error {
	r := bytes.NewReader(payload)
	bytesOf := func() ([]byte, error) {
		n, err := binary.ReadUvarint(r)
		if err != nil || n > uint64(r.Len()) {
			return nil, fmt.Errorf("%w: an entry's payload does not decode", ErrLog)
		}
		off := len(payload) - r.Len()
		r.Seek(int64(n), io.SeekCurrent)
		return payload[off : off+int(n) : off+int(n)], nil
	}
	count, err := binary.ReadUvarint(r)
	if err != nil {
		return fmt.Errorf("%w: an entry's payload does not decode", ErrLog)
	}
	for range count {
		flags, err := r.ReadByte()
		if err != nil {
			return fmt.Errorf("%w: an entry's payload does not decode", ErrLog)
		}
		p := prep{del: flags&1 != 0, hist: flags&2 != 0}
		key, err := bytesOf()
		if err != nil {
			return err
		}
		if !p.del {
			if p.val, err = bytesOf(); err != nil {
				return err
			}
			if p.hist {
				if p.sum, err = bytesOf(); err != nil {
					return err
				}
				if p.finish, err = bytesOf(); err != nil {
					return err
				}
			}
		}
		if err := f(p, key); err != nil {
			return err
		}
	}
	return nil
}

// lastOf is what applyPayloads keeps between calls (the applier's: one
// goroutine), so that its index costs no allocation once grown.
type lastOf struct {
	last map[string]int // a key's last record, by number
	keys []string       // each record's key, by number
}

// applyPayloads puts the records of payloads, in their order, in tx;
// seq(i) is payloads[i]'s sequence number (for errors). A record is a
// keyed snapshot (SPEC §11), so of one key's records only the last decides
// what the transaction leaves, and only it is put: a step granted, started,
// reported and archived within the entries is one delete, not five writes.
func applyPayloads(tx *bolt.Tx, payloads [][]byte, seq func(i int) uint64, lo *lastOf) error {
	if lo.last == nil || len(lo.keys) > 1<<16 {
		*lo = lastOf{last: map[string]int{}} // clearing keeps a map's size, and costs it: after a large one, start afresh
	}
	clear(lo.last)
	clear(lo.keys)
	lo.keys = lo.keys[:0]
	for i, payload := range payloads {
		err := eachRecord(payload, func(_ prep, key []byte) error {
			k := string(key)
			lo.last[k] = len(lo.keys)
			lo.keys = append(lo.keys, k)
			return nil
		})
		if err != nil {
			return fmt.Errorf("entry %d: %w", seq(i), err)
		}
	}
	n := 0
	for i, payload := range payloads {
		err := eachRecord(payload, func(p prep, _ []byte) error {
			p.key = lo.keys[n]
			n++
			if lo.last[p.key] != n-1 {
				return nil // a later record of its key follows
			}
			if err := p.put(tx); err != nil {
				return fmt.Errorf("record %q: %w", p.key, err)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("entry %d: %w", seq(i), err)
		}
	}
	return nil
}

// walState is what the "wal" bucket says.
type walState struct {
	id      []byte // nil: the store never had a log
	applied uint64
	clean   bool
}

func readWALState(tx *bolt.Tx) walState {
	b := tx.Bucket(bktWAL)
	if b == nil {
		return walState{clean: true}
	}
	st := walState{clean: len(b.Get(walKeyClean)) == 1 && b.Get(walKeyClean)[0] == 1}
	if id := b.Get(walKeyID); len(id) == 16 {
		st.id = append([]byte(nil), id...)
	} else {
		st.clean = true
	}
	if v := b.Get(walKeyApplied); len(v) == 8 {
		st.applied = binary.BigEndian.Uint64(v)
	}
	return st
}

func putWALState(tx *bolt.Tx, st walState) error {
	b, err := tx.CreateBucketIfNotExists(bktWAL)
	if err != nil {
		return err
	}
	clean := []byte{0}
	if st.clean {
		clean[0] = 1
	}
	if err := b.Put(walKeyID, st.id); err != nil {
		return err
	}
	if err := b.Put(walKeyApplied, be64(st.applied)); err != nil {
		return err
	}
	return b.Put(walKeyClean, clean)
}

// parseEntry reads the entry at off of buf, if it is whole and its CRC holds.
func parseEntry(buf []byte, off int64) (seq, group uint64, payload []byte, ok bool) {
	if off+walEntryHead > int64(len(buf)) {
		return 0, 0, nil, false
	}
	h := buf[off : off+walEntryHead]
	n := int64(binary.LittleEndian.Uint32(h[0:4]))
	if n == 0 || off+walEntryHead+n > int64(len(buf)) {
		return 0, 0, nil, false
	}
	seq, group = binary.LittleEndian.Uint64(h[8:16]), binary.LittleEndian.Uint64(h[16:24])
	if seq == 0 || group == 0 || group > seq {
		return 0, 0, nil, false
	}
	payload = buf[off+walEntryHead : off+walEntryHead+n]
	if entryCRC(h, payload) != binary.LittleEndian.Uint32(h[4:8]) {
		return 0, 0, nil, false
	}
	return seq, group, payload, true
}

func entryCRC(head, payload []byte) uint32 {
	c := crc32.Update(0, castagnoli, head[0:4])
	c = crc32.Update(c, castagnoli, head[8:walEntryHead])
	return crc32.Update(c, castagnoli, payload)
}

// scanLog returns the payloads of the entries after applied, in order, and
// the last sequence number the log holds (applied if none follows it).
func scanLog(buf []byte, applied uint64) (payloads [][]byte, last uint64, err error) {
	last = applied
	off := int64(walHeaderSize)
	var expect uint64 // the number the next entry must have; 0 before the first
	for {
		seq, _, payload, ok := parseEntry(buf, off)
		if !ok || (expect != 0 && seq != expect) {
			break
		}
		if expect == 0 && seq > applied+1 {
			return nil, 0, fmt.Errorf("%w: it starts at entry %d but the store applied only up to %d: entries are missing", ErrLog, seq, applied)
		}
		if seq > applied {
			payloads = append(payloads, payload)
			last = seq
		}
		expect = seq + 1
		off += walEntryHead + int64(len(payload))
	}
	// The log ends at off, where entry b should be. A good entry the store
	// needs past it, written after b was synced (of a later group, or b
	// itself as the first of its own write), means that b went bad after
	// it was synced; one of b's own write was torn with it. Without any
	// entry from the header on, b is the first after the applied one: the
	// ring starts again at the header only once all is applied. Nor is it
	// ever one the store applied: when the first page of the write that
	// turned the ring was torn, the scan followed the turn before's
	// entries (numbered at most applied) into the middle of that write,
	// whose second entry is then b's own write, torn with it, not an
	// entry written after it was synced (the applier applies whole
	// writes, so applied+1 begins one).
	b := max(expect, applied+1)
	for o := off + 1; o+walEntryHead <= int64(len(buf)); o++ {
		if binary.LittleEndian.Uint32(buf[o:o+4]) == 0 {
			continue
		}
		seq := binary.LittleEndian.Uint64(buf[o+8 : o+16])
		group := binary.LittleEndian.Uint64(buf[o+16 : o+24])
		if seq <= applied || seq < b || group > seq || (group < b || (group == b && seq != b)) {
			continue
		}
		// Entries b..seq-1 would lie between: each takes more than a head.
		if seq-b > uint64(o-off)/(walEntryHead+1) {
			continue
		}
		if s, _, _, ok := parseEntry(buf, o); ok {
			return nil, 0, fmt.Errorf("%w: the entry at offset %d (number %d) is bad but entry %d, written after it was synced, follows at offset %d",
				ErrLog, off, b, s, o)
		}
	}
	return payloads, last, nil
}

// newLogFile writes a log file for id: the header and one chunk of zeros,
// synced, named only then.
func newLogFile(path string, id []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	hd := make([]byte, walChunk)
	copy(hd, walMagic)
	copy(hd[len(walMagic):], id)
	if _, err := tmp.Write(hd); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	return syncDir(filepath.Dir(path))
}

// recoverLog brings db up to date with the log beside it (path is the
// store file's) and returns what the "wal" bucket then says, with the
// log's last number in applied. With keep, the log is left ready for
// appends (created if there was none, Open's case) and marked not clean;
// without it (NoLog, the offline tools) it is marked clean and not
// needed again.
func recoverLog(db *bolt.DB, path string, keep bool) (walState, error) {
	var st walState
	if err := db.View(func(tx *bolt.Tx) error { st = readWALState(tx); return nil }); err != nil {
		return st, err
	}
	lp := walPath(path)
	var payloads [][]byte
	last := st.applied
	if !st.clean {
		buf, err := os.ReadFile(lp)
		if errors.Is(err, os.ErrNotExist) {
			return st, fmt.Errorf("%w: %s is missing, and the store %s says it may hold committed batches not yet in the store file; "+
				"put it back beside the store file", ErrLog, lp, path)
		}
		if err != nil {
			return st, fmt.Errorf("%w: %w", ErrLog, err)
		}
		if len(buf) < walHeaderSize || string(buf[:len(walMagic)]) != walMagic || !bytes.Equal(buf[len(walMagic):len(walMagic)+16], st.id) {
			return st, fmt.Errorf("%w: %s is not the log of the store %s (another store's, or damaged); it may hold committed batches not yet in the store file",
				ErrLog, lp, path)
		}
		if payloads, last, err = scanLog(buf, st.applied); err != nil {
			return st, fmt.Errorf("%s: %w", lp, err)
		}
	}
	if !keep && st.clean {
		return st, nil
	}
	// Replay, and mark the log as no longer needed: everything in it is
	// now in the store file.
	next := walState{id: st.id, applied: last, clean: true}
	if !st.clean {
		err := db.Update(func(tx *bolt.Tx) error {
			if err := applyPayloads(tx, payloads, func(i int) uint64 { return st.applied + 1 + uint64(i) }, &lastOf{}); err != nil {
				return err
			}
			return putWALState(tx, next)
		})
		if err != nil {
			return st, fmt.Errorf("store: replay the log %s: %w", lp, err)
		}
	}
	if !keep {
		return next, nil
	}
	// Every open that appends starts a fresh log with a fresh id, written
	// and named before the bucket names it: entries of an earlier log can
	// never be read as this one's, even beside a copied older store file
	// of the same store whose log has since moved on.
	next.id = make([]byte, 16)
	rand.Read(next.id)
	// A log file being made when an earlier process died (newLogFile's
	// temporary), or a compaction's copy of the store (Compact's), is
	// nobody's: this process holds the store's lock.
	removeLeftovers(filepath.Dir(lp), filepath.Base(lp)+".tmp-", filepath.Base(path)+".compact-")
	if err := newLogFile(lp, next.id); err != nil {
		return st, fmt.Errorf("%w: create %s: %w", ErrLog, lp, err)
	}
	next.clean = false
	if err := db.Update(func(tx *bolt.Tx) error { return putWALState(tx, next) }); err != nil {
		return st, fmt.Errorf("store: open the log %s: %w", lp, err)
	}
	return next, nil
}

// openLog opens the log of a store whose file recoverLog brought up to date.
func openLog(db *bolt.DB, path string, st walState, limit int64) (*wlog, error) {
	if limit <= 0 {
		limit = DefaultLogLimit
	}
	limit = max(limit, MinLogLimit)
	f, err := os.OpenFile(walPath(path), os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrLog, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%w: %w", ErrLog, err)
	}
	l := &wlog{db: db, f: f, limit: limit, wrap: max(limit/16, walChunk), size: fi.Size(), pos: walHeaderSize,
		next: st.applied, durable: st.applied, applied: st.applied, done: make(chan struct{})}
	l.cond.L = &l.mu
	go l.run()
	return l, nil
}

// failed returns what every call must answer once the log is closed or
// broken: ErrClosed, the error that broke it, or nil.
func (l *wlog) failed() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	return l.err
}

// append logs one entry (walEntryHead bytes of room, then its payload) and
// returns once it is durable.
func (l *wlog) append(buf []byte) error {
	if int64(len(buf)) > walMaxEntry {
		return fmt.Errorf("store: a batch of %d bytes: larger than the log takes", len(buf))
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	if l.err != nil {
		return l.err
	}
	l.next++
	seq := l.next
	l.queue = append(l.queue, walEntry{seq: seq, buf: buf})
	for l.durable < seq {
		switch {
		case l.err != nil:
			return l.err
		case l.writing:
			l.cond.Wait()
		default:
			l.write()
		}
	}
	return nil
}

// write writes and syncs the queued entries as one group. Called with mu
// held; releases it while writing.
func (l *wlog) write() {
	group := l.queue
	l.queue = nil
	l.writing = true
	defer func() { l.writing = false; l.cond.Broadcast() }()
	var n int64
	for _, e := range group {
		n += int64(len(e.buf))
	}
	// Backpressure: past the limit, wait until every entry is applied.
	if l.pos > walHeaderSize && l.pos+n > l.limit && l.applied < l.durable {
		l.waited++
		l.urgent++
		l.cond.Broadcast()
		for l.applied < l.durable && l.err == nil {
			l.cond.Wait()
		}
		l.urgent--
	}
	if l.err != nil {
		return
	}
	if l.pos > walHeaderSize && l.applied == l.durable && (l.pos+n > l.limit || l.pos >= l.wrap) {
		l.pos = walHeaderSize // every entry in the file is applied: start again
	}
	pos := l.pos
	l.mu.Unlock()
	err := l.writeAt(group, pos, n)
	l.mu.Lock()
	if err != nil {
		l.err = fmt.Errorf("store: append to the log: %w", err)
		return
	}
	l.pos = pos + n
	l.writes++
	l.durable = group[len(group)-1].seq
	l.ready = append(l.ready, group...)
	l.readyN += n
}

func (l *wlog) writeAt(group []walEntry, pos, n int64) error {
	first := group[0].seq
	for _, e := range group {
		h := e.buf[:walEntryHead]
		binary.LittleEndian.PutUint32(h[0:4], uint32(len(e.buf)-walEntryHead))
		binary.LittleEndian.PutUint64(h[8:16], e.seq)
		binary.LittleEndian.PutUint64(h[16:24], first)
		binary.LittleEndian.PutUint32(h[4:8], entryCRC(h, e.buf[walEntryHead:]))
	}
	if end := pos + n; end > l.size {
		// Zeros first, so that the file's blocks are written (not merely
		// allocated) and later appends change no metadata.
		grown := (end + walChunk - 1) / walChunk * walChunk
		for off := l.size; off < grown; off += walChunk {
			if _, err := l.f.WriteAt(walZeros[:min(walChunk, grown-off)], off); err != nil {
				return err
			}
		}
		l.size = grown
	}
	if len(group) == 1 {
		if _, err := l.f.WriteAt(group[0].buf, pos); err != nil {
			return err
		}
	} else {
		b := make([]byte, 0, n)
		for _, e := range group {
			b = append(b, e.buf...)
		}
		if _, err := l.f.WriteAt(b, pos); err != nil {
			return err
		}
	}
	return fdatasync(l.f)
}

// run is the applier: every durable entry not yet applied goes into one
// bbolt transaction, which records the last one's number.
func (l *wlog) run() {
	defer close(l.done)
	var lo lastOf
	var payloads [][]byte
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		for !l.due() && l.err == nil && !(l.closed && !l.writing && len(l.queue) == 0 && len(l.ready) == 0) {
			l.cond.Wait()
		}
		if l.err != nil || len(l.ready) == 0 {
			return
		}
		batch := l.ready
		l.ready, l.readyN = nil, 0
		last := batch[len(batch)-1].seq
		l.mu.Unlock()
		payloads = payloads[:0]
		for _, e := range batch {
			payloads = append(payloads, e.buf[walEntryHead:])
		}
		err := l.db.Update(func(tx *bolt.Tx) error {
			if err := applyPayloads(tx, payloads, func(i int) uint64 { return batch[i].seq }, &lo); err != nil {
				return err
			}
			b := tx.Bucket(bktWAL)
			return b.Put(walKeyApplied, be64(last))
		})
		clear(payloads) // the entries' buffers are no longer needed
		if err == nil { // committed: nothing of the transaction refers to them
			for i := range batch {
				b := batch[i].buf[:0]
				batch[i].buf = nil
				payloadPool.Put(&b)
			}
		}
		l.mu.Lock()
		if err != nil {
			l.err = fmt.Errorf("store: apply the log: %w", err)
			l.cond.Broadcast()
			return
		}
		l.applied = last
		l.cond.Broadcast()
	}
}

// due says whether the applier should apply what is ready now.
func (l *wlog) due() bool {
	return len(l.ready) > 0 && !l.hold &&
		(l.urgent > 0 || l.closed || l.readyN >= applyBytes || len(l.ready) >= applyEntries || l.pos >= l.wrap)
}

// barrier waits until every entry durable when it was called is applied.
func (l *wlog) barrier() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.durable
	if l.applied < t {
		l.urgent++
		l.cond.Broadcast()
		for l.applied < t && l.err == nil {
			l.cond.Wait()
		}
		l.urgent--
	}
	return l.err
}

// close stops appends, lets the applier apply what is logged, marks the log
// clean and closes its file. Closing twice is harmless.
func (l *wlog) close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		<-l.done
		return nil
	}
	l.closed = true
	l.cond.Broadcast()
	l.mu.Unlock()
	<-l.done
	err := l.err
	if err == nil {
		err = l.db.Update(func(tx *bolt.Tx) error {
			return tx.Bucket(bktWAL).Put(walKeyClean, []byte{1})
		})
	}
	if cerr := l.f.Close(); err == nil {
		err = cerr
	}
	return err
}

// checkWAL checks the "wal" bucket's entries (Check replayed the log first).
func checkWAL(c *checker) {
	c.each(bktWAL, func(k, v []byte) {
		want := map[string]int{string(walKeyID): 16, string(walKeyApplied): 8, string(walKeyClean): 1}[string(k)]
		switch {
		case want == 0:
			c.warn("log "+core.Quote(string(k)), "no check reads this entry")
		case len(v) != want:
			c.problem("log "+core.Quote(string(k)), "holds %d bytes where %d belong", len(v), want)
		}
	})
}

// removeLeftovers removes the files of dir whose names start with one of
// prefixes: temporaries a process killed midway left (its caller holds
// what they were made for, so nothing else is writing them).
func removeLeftovers(dir string, prefixes ...string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		for _, p := range prefixes {
			if strings.HasPrefix(e.Name(), p) {
				os.Remove(filepath.Join(dir, e.Name()))
				break
			}
		}
	}
}
