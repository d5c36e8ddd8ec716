package store

// Idempotent writes, deletion and queries of the data plane (SPEC §14).
//
// A write that names a request id (Tether-Request-Id) stores its answer in
// the transaction that makes it durable, under (lease, request id); a
// later op with the same key writes nothing and gets that answer, so a
// write retried after a lost answer never makes a second version or a
// second append. The entries are bounded (MaxRequestsPerLease per lease,
// MaxRequests in all: request.count keeps both counts) and leave with
// retention (PruneData: an entry older than the cutoff).

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	bolt "go.etcd.io/bbolt"
)

// Bounds of the remembered answers, and of a version's attributes.
const (
	MaxRequestsPerLease = 10_000
	MaxRequests         = 1_000_000
	MaxRequestID        = 64
	MaxAttributes       = 16
	MaxAttributeKey     = 64
	MaxAttributeValue   = 256
	// MaxQueryLimit bounds a query's page; DefaultQueryLimit is its default.
	MaxQueryLimit     = 1000
	DefaultQueryLimit = 100
	// MaxQueryScan bounds the versions one query page examines: a filter
	// that matches little answers a short page and a cursor.
	MaxQueryScan = 10_000
)

var (
	bktRequest      = []byte("request")
	bktRequestCount = []byte("request.count")
	totalKey        = []byte("total")

	// ErrRequestsFull is returned, in a DataResult, when a write's answer
	// cannot be remembered: its lease, or the store, holds as many as the
	// bound. Nothing of the write was written.
	ErrRequestsFull = errors.New("store: too many remembered request ids")
	// ErrRequestReused is returned, in a DataResult, when a request id of
	// the lease was first used for another write (kind or id).
	ErrRequestReused = errors.New("store: request id reused for another write")
	// ErrRequestLost is returned, in a DataResult, for a repeat admitted
	// while the write it repeats was on its way, when that one stored
	// nothing (it was refused): send it again.
	ErrRequestLost = errors.New("store: the write this request repeats was not stored")
	// ErrBadRequestID is returned for a request id that is not 1-64 of
	// [A-Za-z0-9._-].
	ErrBadRequestID = errors.New("store: bad request id")
	// ErrBadAttribute is returned for attributes over the bounds.
	ErrBadAttribute = errors.New("store: bad attribute")
)

// RequestEntry is a write's remembered first answer.
type RequestEntry struct {
	Worker string        `json:"worker"`
	Kind   DataOpKind    `json:"kind"`
	ID     string        `json:"id"`
	At     time.Time     `json:"at"`
	Data   *DataMeta     `json:"data,omitempty"`   // OpPut, OpDelete
	Append *AppendResult `json:"append,omitempty"` // OpAppend
}

// Result is the entry as the op's result.
func (e RequestEntry) Result() DataResult {
	r := DataResult{Repeated: true}
	if e.Data != nil {
		r.Data = *e.Data
	}
	if e.Append != nil {
		r.Append = *e.Append
	}
	return r
}

// ValidateRequestID checks a request id: 1-64 of [A-Za-z0-9._-].
func ValidateRequestID(id string) error {
	if id == "" || len(id) > MaxRequestID {
		return fmt.Errorf("%w %q: want 1-%d characters", ErrBadRequestID, id, MaxRequestID)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("%w %q: want letters, digits, '.', '_' or '-'", ErrBadRequestID, id)
		}
	}
	return nil
}

// ValidateAttributes checks a version's attributes: at most MaxAttributes,
// each key 1-64 of [A-Za-z0-9._-], each value at most 256 bytes of
// printable UTF-8.
func ValidateAttributes(a map[string]string) error {
	if len(a) > MaxAttributes {
		return fmt.Errorf("%w: %d attributes, at most %d", ErrBadAttribute, len(a), MaxAttributes)
	}
	keys := make([]string, 0, len(a))
	for k := range a {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if len(k) > MaxAttributeKey || ValidateRequestID(k) != nil {
			return fmt.Errorf("%w: key %q: want 1-%d of [A-Za-z0-9._-]", ErrBadAttribute, k, MaxAttributeKey)
		}
		v := a[k]
		if len(v) > MaxAttributeValue || !utf8.ValidString(v) || strings.IndexFunc(v, func(r rune) bool { return r != ' ' && !unicode.IsPrint(r) }) >= 0 { // as core.CheckName: C1 controls and bidi overrides too
			return fmt.Errorf("%w: %s: want at most %d bytes of printable UTF-8", ErrBadAttribute, k, MaxAttributeValue)
		}
	}
	return nil
}

func requestKey(lease uint64, id string) []byte {
	return append(binary.BigEndian.AppendUint64(nil, lease), id...)
}

func reqLeaseKey(lease uint64) []byte { return binary.BigEndian.AppendUint64(nil, lease) }

// repeated answers an op whose (lease, request id) already has an entry:
// done, with the first answer.
func repeated(tx *bolt.Tx, op DataOp) (DataResult, bool, error) {
	v := tx.Bucket(bktRequest).Get(requestKey(op.Lease, op.Request))
	if v == nil {
		if op.RepeatOnly {
			return DataResult{}, true, fmt.Errorf("%w: request %q of lease %d; send it again", ErrRequestLost, op.Request, op.Lease)
		}
		return DataResult{}, false, roomFor(tx, op) // refused before anything is written
	}
	var e RequestEntry
	if err := json.Unmarshal(v, &e); err != nil {
		return DataResult{}, true, fmt.Errorf("request %q of lease %d: %w", op.Request, op.Lease, err)
	}
	if e.Kind != op.Kind || e.ID != op.ID {
		return DataResult{}, true, fmt.Errorf("%w: request %q of lease %d was %s", ErrRequestReused, op.Request, op.Lease, e.describe())
	}
	return e.Result(), true, nil
}

func (e RequestEntry) describe() string {
	switch e.Kind {
	case OpPut:
		return "a put of " + strconv.Quote(e.ID)
	case OpAppend:
		return "an append to " + strconv.Quote(e.ID)
	case OpDelete:
		return "a delete of " + strconv.Quote(e.ID)
	}
	return "another write"
}

// roomFor refuses a new entry over the bounds.
func roomFor(tx *bolt.Tx, op DataOp) error {
	cb := tx.Bucket(bktRequestCount)
	n, total := count(cb.Get(reqLeaseKey(op.Lease))), count(cb.Get(totalKey))
	switch {
	case n >= MaxRequestsPerLease:
		return fmt.Errorf("%w: lease %d has %d, at most %d (nothing was written)", ErrRequestsFull, op.Lease, n, MaxRequestsPerLease)
	case total >= MaxRequests:
		return fmt.Errorf("%w: the store holds %d, at most %d until retention removes old ones (nothing was written)", ErrRequestsFull, total, MaxRequests)
	}
	return nil
}

// remember stores op's answer under its (lease, request id); roomFor
// checked the bounds before the write.
func remember(tx *bolt.Tx, op DataOp, r DataResult) error {
	cb := tx.Bucket(bktRequestCount)
	lk := reqLeaseKey(op.Lease)
	n, total := count(cb.Get(lk)), count(cb.Get(totalKey))
	e := RequestEntry{Worker: op.Worker, Kind: op.Kind, ID: op.ID, At: op.At.UTC()}
	switch op.Kind {
	case OpPut, OpDelete:
		e.Data = &r.Data
	case OpAppend:
		e.Append = &r.Append
	default:
		return fmt.Errorf("%w: a request id on op kind %d", ErrBadOp, op.Kind)
	}
	if err := putJSON(tx.Bucket(bktRequest), requestKey(op.Lease, op.Request), e); err != nil {
		return err
	}
	if err := cb.Put(lk, binary.BigEndian.AppendUint64(nil, n+1)); err != nil {
		return err
	}
	return cb.Put(totalKey, binary.BigEndian.AppendUint64(nil, total+1))
}

func count(v []byte) uint64 {
	if len(v) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(v)
}

// Request returns the remembered answer of (lease, request id), if any.
func (s *Store) Request(lease uint64, id string) (RequestEntry, bool, error) {
	var e RequestEntry
	var found bool
	err := s.view(func(tx *bolt.Tx) error {
		b := tx.Bucket(bktRequest)
		if b == nil {
			return nil
		}
		v := b.Get(requestKey(lease, id))
		if v == nil {
			return nil
		}
		found = true
		return json.Unmarshal(v, &e)
	})
	if err != nil {
		return RequestEntry{}, false, s.mapErr(err)
	}
	return e, found, nil
}

// deleteVersion stores a tombstone as the next version of op.ID; an id
// with no version, or whose newest is a tombstone, has nothing to delete.
func deleteVersion(tx *bolt.Tx, op DataOp) (DataMeta, error) {
	latest, err := latestVersion(tx, op.ID)
	if err != nil {
		return DataMeta{}, fmt.Errorf("%w: data %q has no version to delete", ErrNotFound, op.ID)
	}
	if latest.Deleted {
		return DataMeta{}, fmt.Errorf("%w: data %q is already deleted (version %d)", ErrNotFound, op.ID, latest.Version)
	}
	m := DataMeta{
		ID: op.ID, Version: latest.Version + 1, Created: op.At.UTC(), Worker: op.Worker, Lease: op.Lease,
		Run: op.Run, Step: op.Step, Deleted: true,
	}
	return m, putJSON(tx.Bucket(bktData), versionKey(op.ID, m.Version), m)
}

// DataQuery selects versions (GET /data?…): every field set must match.
type DataQuery struct {
	Prefix       string            // id prefix
	Run, Step    string            // the writer's run and step
	Since, Until time.Time         // Created in [Since, Until)
	Attrs        map[string]string // each pair must be the version's
	Limit        int               // 1..MaxQueryLimit; 0: DefaultQueryLimit
	After        string            // a cursor: the page starts after it
}

// QueryCursor is the cursor naming version v of id.
func QueryCursor(id string, v uint64) string { return id + ":" + strconv.FormatUint(v, 10) }

// parseCursor reads a cursor ("" is the start).
func parseCursor(c string) (string, uint64, error) {
	if c == "" {
		return "", 0, nil
	}
	id, v, ok := strings.Cut(c, ":")
	n, err := strconv.ParseUint(v, 10, 64)
	if !ok || err != nil || ValidateID(id) != nil {
		return "", 0, fmt.Errorf("%w: bad cursor %q: pass the next of the page before", ErrBadID, c)
	}
	return id, n, nil
}

// QueryData answers a query: the matching versions sorted by (id,
// version), at most q.Limit, and the cursor of the next page ("" when none
// is left). It examines at most MaxQueryScan versions per call.
func (s *Store) QueryData(q DataQuery) ([]DataMeta, string, error) {
	if q.Limit <= 0 {
		q.Limit = DefaultQueryLimit
	}
	q.Limit = min(q.Limit, MaxQueryLimit)
	aid, av, err := parseCursor(q.After)
	if err != nil {
		return nil, "", err
	}
	out := []DataMeta{}
	next := ""
	err = s.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(bktData).Cursor()
		start := []byte(q.Prefix)
		if aid != "" {
			if ak := versionKey(aid, av+1); av != ^uint64(0) && bytes.Compare(ak, start) > 0 {
				start = ak
			}
		}
		scanned := 0
		for k, v := c.Seek(start); k != nil && bytes.HasPrefix(k, []byte(q.Prefix)); k, v = c.Next() {
			if scanned >= MaxQueryScan || len(out) >= q.Limit {
				if id, ver, ok := splitIDKey(k); ok && ver > 0 {
					next = QueryCursor(id, ver-1)
				}
				return nil
			}
			scanned++
			var m DataMeta
			if err := json.Unmarshal(v, &m); err != nil {
				return fmt.Errorf("data %q: %w", k, err)
			}
			if q.Matches(m) {
				out = append(out, m)
			}
		}
		return nil
	})
	if err != nil {
		return nil, "", s.mapErr(err)
	}
	return out, next, nil
}

// Matches says whether version m passes q's filters other than the id
// prefix (run, step, time range, attributes).
func (q DataQuery) Matches(m DataMeta) bool {
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

// pruneRequests deletes the remembered answers older than cutoff, and
// counts them out.
func pruneRequests(tx *bolt.Tx, p *pruneTx, from *[]byte, cutoff time.Time) (bool, error) {
	victims, more := pick(tx, bktRequest, p, from, func(_, v []byte) bool {
		var e RequestEntry
		return json.Unmarshal(v, &e) == nil && e.At.Before(cutoff)
	})
	cb := tx.Bucket(bktRequestCount)
	for _, kv := range victims {
		if err := tx.Bucket(bktRequest).Delete(kv[0]); err != nil {
			return false, err
		}
		p.spend(1)
		lk := kv[0][:8]
		if n := count(cb.Get(lk)); n > 1 {
			if err := cb.Put(lk, binary.BigEndian.AppendUint64(nil, n-1)); err != nil {
				return false, err
			}
		} else if err := cb.Delete(lk); err != nil {
			return false, err
		}
		if t := count(cb.Get(totalKey)); t > 0 {
			if err := cb.Put(totalKey, binary.BigEndian.AppendUint64(nil, t-1)); err != nil {
				return false, err
			}
		}
	}
	return more, nil
}
