package store

// History: the archived runs (SPEC §7a) and the log lines, out of the live
// records' bucket.
//
// Apply routes a record by its key's kind; it decides nothing:
//
//	records         live state (run/, step/, lease/, event/, meta, closed/, ...)
//	logs            log/<020d lease>/<010d index> → the line, as the core wrote it
//	history         <run id> → 'F' + flate(JSON of core.RunHistory)
//	runs_by_seq     be64(run number) → JSON of a RunSummary (listing, newest first)
//	runs_by_finish  be64(finish time, Unix ns) + run id → nothing (retention)
//	history_stats   "runs" → be64(how many runs the history holds)
//
// The two indexes are derived from the history record when it is applied
// (decoded once). Load reads "records" and seeks "logs" lease by lease for
// the live leases only, so a restart costs the live state, not the history.
// Every read of history is a short read transaction: bbolt cannot reuse the
// pages freed after a reader began, so a long reader makes the file grow.

import (
	"bytes"
	"compress/flate"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/tether-run/tether/core"
)

var (
	bktLogs         = []byte("logs")
	bktHistory      = []byte("history")
	bktRunsBySeq    = []byte("runs_by_seq")
	bktRunsByFinish = []byte("runs_by_finish")
	bktHistoryStats = []byte("history_stats")

	// statRuns counts the runs in history (bktHistoryStats), so that
	// a restart reports it without walking the index.
	statRuns = []byte("runs")

	leasePrefix = []byte(core.KindLease + "/")
)

// Limits of the history reads: a page of ListRuns scans at most
// ListScanLimit index entries (a filter that matches little answers a short
// page with a cursor rather than holding the transaction), and a page of
// HistoryLogs holds at most MaxLogPage lines.
const (
	ListScanLimit = 10000
	MaxLogPage    = 10000
	// migrateBatch is how many records one migration transaction moves.
	migrateBatch = 5000
)

// historyFlate marks a history value as the flate of its JSON.
const historyFlate = 'F'

func isLogKey(key string) bool { return strings.HasPrefix(key, core.KindLog+"/") }

// logPrefix is the key prefix of a lease's log lines, from the lease's
// key id (20 digits).
func logPrefix(leaseID []byte) []byte {
	return append(append([]byte(core.KindLog+"/"), leaseID...), '/')
}

func leaseLogPrefix(id core.LeaseID) []byte {
	return logPrefix([]byte(fmt.Sprintf("%020d", uint64(id))))
}

// RunSummary is an archived run as the listing shows it: the runs_by_seq
// index's value.
type RunSummary struct {
	ID           core.RunID     `json:"id"`
	Seq          uint64         `json:"seq"`
	Name         string         `json:"name"`
	Status       string         `json:"status"`
	Parent       core.RunID     `json:"parent,omitempty"`
	SubmittedAt  time.Time      `json:"submitted"`
	FinishedAt   time.Time      `json:"finished,omitzero"`
	Deadline     time.Time      `json:"deadline,omitzero"`
	CancelReason string         `json:"cancel_reason,omitempty"`
	Steps        int            `json:"steps"`
	States       map[string]int `json:"states"` // steps per state
	Archived     bool           `json:"archived"`
}

// RunSeq is the number of a run id "run-<n>" (core's submit numbers runs
// from 1), or false.
func RunSeq(id core.RunID) (uint64, bool) {
	n, ok := strings.CutPrefix(string(id), "run-")
	if !ok {
		return 0, false
	}
	seq, err := strconv.ParseUint(n, 10, 64)
	if err != nil || seq == 0 || "run-"+strconv.FormatUint(seq, 10) != string(id) {
		return 0, false
	}
	return seq, true
}

// Summarize is a history's summary: its head, derived from the rest of it.
func Summarize(h *core.RunHistory) RunSummary { return summaryOfHead(h.DeriveHead()) }

// summaryOfHead is the summary a history's head says.
func summaryOfHead(hd core.HistoryHead) RunSummary {
	if hd.States == nil {
		hd.States = map[string]int{}
	}
	seq, _ := RunSeq(hd.Run)
	return RunSummary{ID: hd.Run, Seq: seq, Name: hd.Name, Status: hd.Status, Parent: hd.Parent, SubmittedAt: hd.SubmittedAt,
		FinishedAt: hd.FinishedAt, Deadline: hd.Deadline, CancelReason: hd.CancelReason, Steps: hd.Steps, States: hd.States, Archived: true}
}

// slimHistory is the part of a core.RunHistory that Summarize reads.
type slimHistory struct {
	Run struct {
		ID   core.RunID
		Spec struct {
			Name string
		}
		Parent       core.RunID
		SubmittedAt  time.Time
		Deadline     time.Time
		CancelReason string
		Steps        []core.StepID
		Finished     bool
		FinishedAt   time.Time
	}
	Status string
	Steps  []struct {
		State core.State
	}
}

// summaryOf is Summarize of the history a record's value holds, read on
// the loop's commit path: from its head alone, the first field, when it has
// one (the decoder stops after it); else (a history written before heads,
// or a zero head) from a slim decode of the run's own fields and each
// step's state.
func summaryOf(v []byte) (RunSummary, error) {
	if sum, ok, err := headSummary(v); ok || err != nil {
		return sum, err
	}
	var h slimHistory
	if err := json.Unmarshal(v, &h); err != nil {
		return RunSummary{}, err
	}
	return h.summary(), nil
}

// SummaryOf is the summary of the history a history record's value (its
// JSON, as the core wrote it) holds, as Apply indexes it: another backend
// (adapters/pgstore) derives the same listing.
func SummaryOf(v []byte) (RunSummary, error) { return summaryOf(v) }

// headSummary is the summary from a history value's head; false when it
// has none (or a zero one: the record was not made by archiving).
func headSummary(v []byte) (RunSummary, bool, error) {
	hd, ok, err := DecodeHead(v)
	if !ok || err != nil {
		return RunSummary{}, false, err
	}
	return summaryOfHead(hd), true, nil
}

// DecodeHead reads only the head of a history record's value (it comes
// first); false when it has none (or a zero one: the record was not made
// by archiving).
func DecodeHead(v []byte) (core.HistoryHead, bool, error) {
	dec := json.NewDecoder(bytes.NewReader(v))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return core.HistoryHead{}, false, fmt.Errorf("not a JSON object")
	}
	if t, err := dec.Token(); err != nil || t != "Head" {
		return core.HistoryHead{}, false, nil
	}
	var hd core.HistoryHead
	if err := dec.Decode(&hd); err != nil {
		return core.HistoryHead{}, false, fmt.Errorf("head: %w", err)
	}
	if hd.Run == "" {
		return core.HistoryHead{}, false, nil
	}
	return hd, true, nil
}

// summary is Summarize of the whole history this is part of.
func (h *slimHistory) summary() RunSummary {
	full := core.RunHistory{Status: h.Status, Steps: make([]core.StepRecord, len(h.Steps))}
	full.Run.ID, full.Run.Spec.Name, full.Run.Parent = h.Run.ID, h.Run.Spec.Name, h.Run.Parent
	full.Run.SubmittedAt, full.Run.Deadline, full.Run.CancelReason = h.Run.SubmittedAt, h.Run.Deadline, h.Run.CancelReason
	full.Run.Steps, full.Run.Finished, full.Run.FinishedAt = h.Run.Steps, h.Run.Finished, h.Run.FinishedAt
	for i, s := range h.Steps {
		full.Steps[i].State = s.State
	}
	return Summarize(&full)
}

func be64(n uint64) []byte { return binary.BigEndian.AppendUint64(nil, n) }

func finishKey(t time.Time, id core.RunID) []byte {
	ns := t.UnixNano()
	if t.IsZero() || ns < 0 {
		ns = 0
	}
	return append(be64(uint64(ns)), id...)
}

// flater is the one flate writer history is compressed with: history is
// written by the store's write transactions, one at a time, and a writer
// is large (a sync.Pool would lose it at every garbage collection, and
// under load make a new one for nearly every run archived).
var flater struct {
	sync.Mutex
	w *flate.Writer
}

func compressHistory(js []byte) []byte {
	var buf bytes.Buffer
	buf.Grow(len(js)/4 + 16)
	buf.WriteByte(historyFlate)
	flater.Lock()
	defer flater.Unlock()
	if flater.w == nil {
		flater.w, _ = flate.NewWriter(nil, flate.BestSpeed) // BestSpeed is a valid level
	}
	flater.w.Reset(&buf)
	flater.w.Write(js) // a bytes.Buffer does not fail
	flater.w.Close()
	return buf.Bytes()
}

func decodeHistory(v []byte) (core.RunHistory, error) {
	var h core.RunHistory
	if len(v) == 0 || v[0] != historyFlate {
		return h, fmt.Errorf("history value of unknown encoding")
	}
	js, err := io.ReadAll(flate.NewReader(bytes.NewReader(v[1:])))
	if err != nil {
		return h, fmt.Errorf("history value: %w", err)
	}
	if err := json.Unmarshal(js, &h); err != nil {
		return h, fmt.Errorf("history value: %w", err)
	}
	return h, nil
}

// prepareHistory checks a history record and makes what putHistory
// writes: the compressed (and sealed) history, its summary, its finish key.
func prepareHistory(r core.Record, sl *Store) (prep, error) {
	id := core.RunID(strings.TrimPrefix(r.Key, core.KindHistory+"/"))
	if _, ok := RunSeq(id); !ok {
		return prep{}, fmt.Errorf("history of run %q, which has no run number", id)
	}
	if r.Delete {
		return prep{key: r.Key, del: true, hist: true}, nil
	}
	sum, err := summaryOf(r.Value)
	if err != nil {
		return prep{}, fmt.Errorf("history value: %w", err)
	}
	if sum.ID != id {
		return prep{}, fmt.Errorf("history record of %s holds run %q", id, sum.ID)
	}
	sj, err := json.Marshal(sum)
	if err != nil {
		return prep{}, err
	}
	v := compressHistory(r.Value)
	if sl.sealsRecord(r.Key) { // a run's history carries its env: (secrets.go)
		if v, err = sl.keys.Seal(r.Key, v); err != nil {
			return prep{}, err
		}
	}
	return prep{key: r.Key, val: v, hist: true, sum: sj, finish: finishKey(sum.FinishedAt, id)}, nil
}

// putHistory applies a prepared history record: the history and both
// indexes.
func putHistory(tx *bolt.Tx, p prep) error {
	id := core.RunID(strings.TrimPrefix(p.key, core.KindHistory+"/"))
	seq, ok := RunSeq(id)
	if !ok {
		return fmt.Errorf("history of run %q, which has no run number", id)
	}
	hb, sb, fb := tx.Bucket(bktHistory), tx.Bucket(bktRunsBySeq), tx.Bucket(bktRunsByFinish)
	// A run archived again (a replayed batch) or deleted drops its old
	// finish-time entry first.
	old := sb.Get(be64(seq))
	if old != nil {
		var s RunSummary
		if err := json.Unmarshal(old, &s); err != nil {
			return fmt.Errorf("index runs_by_seq of %s: %w", id, err)
		}
		if err := fb.Delete(finishKey(s.FinishedAt, id)); err != nil {
			return err
		}
	}
	if p.del {
		if old == nil {
			return nil
		}
		if err := addRuns(tx, -1); err != nil {
			return err
		}
		if err := sb.Delete(be64(seq)); err != nil {
			return err
		}
		return hb.Delete([]byte(id))
	}
	if old == nil {
		if err := addRuns(tx, 1); err != nil {
			return err
		}
	}
	if err := hb.Put([]byte(id), p.val); err != nil {
		return err
	}
	if err := sb.Put(be64(seq), p.sum); err != nil {
		return err
	}
	return fb.Put(p.finish, nil)
}

// History returns an archived run; ErrNotFound if the store has no history
// of it (it is live, or unknown).
func (s *Store) History(run core.RunID) (core.RunHistory, error) {
	var v []byte
	err := s.view(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bktHistory).Get([]byte(run)); b != nil {
			v = append([]byte{}, b...)
		}
		return nil
	})
	if err != nil {
		return core.RunHistory{}, fmt.Errorf("store: history of %s: %w", run, s.mapErr(err))
	}
	if v == nil {
		return core.RunHistory{}, fmt.Errorf("%w: no history of run %s", ErrNotFound, run)
	}
	h, err := s.decodeHistory(run, v)
	if err != nil {
		return core.RunHistory{}, fmt.Errorf("store: run %s: %w", run, err)
	}
	return h, nil
}

// HistoryLogs returns a page of the stored log lines of leases, lease by
// lease in id order, each lease's in index order: at most limit lines
// (capped at MaxLogPage) after the cursor (empty: from the first line).
// next is the cursor of the following page, empty when there is none.
func (s *Store) HistoryLogs(leases []core.LeaseID, after string, limit int) (lines []core.StepLogLine, next string, err error) {
	if limit <= 0 || limit > MaxLogPage {
		limit = MaxLogPage
	}
	ids := append([]core.LeaseID(nil), leases...)
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	var recs []core.Record
	err = s.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(bktLogs).Cursor()
		for _, id := range ids {
			prefix := leaseLogPrefix(id)
			k, v := c.Seek(prefix)
			if after != "" {
				if string(prefix) < after && !strings.HasPrefix(after, string(prefix)) {
					continue // a lease before the cursor's
				}
				if strings.HasPrefix(after, string(prefix)) {
					k, v = c.Seek([]byte(after))
					if k != nil && string(k) == after {
						k, v = c.Next()
					}
				}
			}
			for ; k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
				if len(recs) == limit {
					next = recs[len(recs)-1].Key
					return nil
				}
				recs = append(recs, core.Record{Key: string(k), Value: append([]byte{}, v...)})
			}
		}
		return nil
	})
	if err != nil {
		return nil, "", fmt.Errorf("store: history logs: %w", s.mapErr(err))
	}
	for _, r := range recs {
		v, err := core.DecodeRecord(r)
		if err != nil {
			return nil, "", fmt.Errorf("store: history logs: %w", err)
		}
		ln, ok := v.(*core.StepLogLine)
		if !ok {
			return nil, "", fmt.Errorf("store: history logs: record %q is not a log line", r.Key)
		}
		lines = append(lines, *ln)
	}
	return lines, next, nil
}

// RunFilter selects runs of a listing; zero fields select every run.
type RunFilter struct {
	Status string    // the derived status: success, failed, cancelled, ...
	Name   string    // the workflow's name
	Since  time.Time // submitted at or after
}

// Match reports whether a run of this status, name and submission time
// passes the filter.
func (f RunFilter) Match(status, name string, submitted time.Time) bool {
	return (f.Status == "" || status == f.Status) && (f.Name == "" || name == f.Name) &&
		(f.Since.IsZero() || !submitted.Before(f.Since))
}

// ListRuns returns archived runs matching f, newest (highest run number)
// first, whose number is below cursor (0: from the newest): at most limit
// of them. next is the cursor of the following page: every archived run
// numbered in [next, cursor) was examined; 0 when none is left. A page may
// be short (even empty) with a non-zero next when the filter matched little
// of the ListScanLimit entries one transaction examines. Runs are numbered
// in submission order and the core's clock never goes back, so the scan
// stops at the first run submitted before f.Since.
func (s *Store) ListRuns(f RunFilter, cursor uint64, limit int) (runs []RunSummary, next uint64, err error) {
	if limit <= 0 {
		return nil, cursor, nil
	}
	err = s.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(bktRunsBySeq).Cursor()
		var k, v []byte
		if cursor == 0 {
			k, v = c.Last()
		} else {
			k, v = c.Seek(be64(cursor))
			if k == nil {
				k, v = c.Last()
			} else {
				k, v = c.Prev()
			}
		}
		for scanned := 0; k != nil; k, v = c.Prev() {
			seq := binary.BigEndian.Uint64(k)
			if len(runs) == limit || scanned == ListScanLimit {
				next = seq + 1 // this one is not examined yet
				return nil
			}
			scanned++
			var sum RunSummary
			if err := json.Unmarshal(v, &sum); err != nil {
				return fmt.Errorf("index runs_by_seq %d: %w", seq, err)
			}
			if !f.Since.IsZero() && sum.SubmittedAt.Before(f.Since) {
				return nil
			}
			if f.Match(sum.Status, sum.Name, sum.SubmittedAt) {
				runs = append(runs, sum)
			}
		}
		return nil
	})
	if err != nil {
		return nil, 0, fmt.Errorf("store: list runs: %w", s.mapErr(err))
	}
	return runs, next, nil
}

// addRuns changes the count of runs in history by delta.
func addRuns(tx *bolt.Tx, delta int64) error {
	b := tx.Bucket(bktHistoryStats)
	var n uint64
	if v := b.Get(statRuns); len(v) == 8 {
		n = binary.BigEndian.Uint64(v)
	}
	return b.Put(statRuns, be64(uint64(int64(n)+delta)))
}

// ArchivedRuns returns how many runs the history holds (a counter, not a
// walk of the index).
func (s *Store) ArchivedRuns() (int, error) {
	var n int
	err := s.view(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bktHistoryStats).Get(statRuns); len(v) == 8 {
			n = int(binary.BigEndian.Uint64(v))
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("store: count archived runs: %w", s.mapErr(err))
	}
	return n, nil
}

// migrate moves the log and history records of a store written before
// archival (every kind in "records"), and the live runs and the meta record
// of one written before they had buckets of their own, to their buckets,
// migrateBatch records
// per transaction. Each transaction moves its records whole, so a crash
// leaves a store that the next Open finishes migrating; on a migrated store
// it is two seeks.
func migrate(db *bolt.DB) error {
	for _, prefix := range []string{core.KindLog + "/", core.KindHistory + "/", core.KindMeta, core.KindRun + "/"} {
		for {
			moved := 0
			err := db.Update(func(tx *bolt.Tx) error {
				var recs []core.Record
				c := tx.Bucket(bucket).Cursor()
				for k, v := c.Seek([]byte(prefix)); k != nil && bytes.HasPrefix(k, []byte(prefix)) && len(recs) < migrateBatch; k, v = c.Next() {
					recs = append(recs, core.Record{Key: string(k), Value: append([]byte{}, v...)})
				}
				if err := putRecords(tx, recs, nil); err != nil {
					return err
				}
				b := tx.Bucket(bucket)
				for _, r := range recs {
					if err := b.Delete([]byte(r.Key)); err != nil {
						return err
					}
				}
				moved = len(recs)
				return nil
			})
			if err != nil {
				return err
			}
			if moved < migrateBatch {
				break
			}
		}
	}
	return nil
}
