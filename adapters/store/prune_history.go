package store

import (
	"bytes"
	"encoding/binary"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/tether-run/tether/core"
)

// bktPruning notes the leases of a pruned run whose log lines are still to
// delete: run id → be64 lease ids. A run leaves the history (its record and
// both indexes) in one transaction that writes its note; its lines go after,
// in bounded transactions, and the note goes with the last of them: a crash
// in between leaves the note for the next pass.
var bktPruning = []byte("pruning")

// PruneHistory deletes the archived runs that finished before cutoff, with
// their events (in the history record) and log lines, at most budget
// deletions per transaction (SPEC §7a). Live runs are not in the history:
// pruning never touches one.
func (s *Store) PruneHistory(cutoff time.Time, budget int) (PruneStats, error) {
	return s.prune(budget, []pruneStep{
		func(tx *bolt.Tx, p *pruneTx, _ *[]byte) (bool, error) { return pruneRuns(tx, p, cutoff, s) },
		func(tx *bolt.Tx, p *pruneTx, _ *[]byte) (bool, error) { return pruneNotedLogs(tx, p) },
	})
}

// pruneRuns moves the runs that finished before cutoff out of the history,
// oldest first, noting their leases.
func pruneRuns(tx *bolt.Tx, p *pruneTx, cutoff time.Time, s *Store) (bool, error) {
	end := finishKey(cutoff, "")
	var victims [][]byte
	c := tx.Bucket(bktRunsByFinish).Cursor()
	more := false
	for k, _ := c.First(); k != nil && bytes.Compare(k[:8], end[:8]) < 0; k, _ = c.Next() {
		if len(victims) >= p.left {
			more = true
			break
		}
		victims = append(victims, append([]byte(nil), k...))
	}
	notes := tx.Bucket(bktPruning)
	for _, k := range victims {
		id := core.RunID(k[8:])
		p.spend(1)
		v := tx.Bucket(bktHistory).Get([]byte(id))
		if v == nil {
			// An index entry without its history: drop the entry.
			if err := tx.Bucket(bktRunsByFinish).Delete(k); err != nil {
				return false, err
			}
			continue
		}
		if h, err := s.decodeHistory(id, v); err == nil && len(h.Leases) > 0 {
			note := make([]byte, 0, 8*len(h.Leases))
			for _, l := range h.Leases {
				note = binary.BigEndian.AppendUint64(note, uint64(l.ID))
			}
			if err := notes.Put([]byte(id), note); err != nil {
				return false, err
			}
		}
		if err := putRecords(tx, []core.Record{{Key: core.HistoryKey(id), Delete: true}}, nil); err != nil {
			return false, err
		}
		p.Runs++
	}
	return more, nil
}

// pruneNotedLogs deletes the log lines of the noted leases.
func pruneNotedLogs(tx *bolt.Tx, p *pruneTx) (bool, error) {
	notes, logs := tx.Bucket(bktPruning), tx.Bucket(bktLogs)
	c := notes.Cursor()
	for k, v := c.First(); k != nil; k, v = c.First() {
		run := append([]byte(nil), k...)
		left := append([]byte(nil), v...)
		for len(left) >= 8 {
			prefix := leaseLogPrefix(core.LeaseID(binary.BigEndian.Uint64(left)))
			lc := logs.Cursor()
			for lk, _ := lc.Seek(prefix); lk != nil && bytes.HasPrefix(lk, prefix); lk, _ = lc.Seek(prefix) {
				if !p.spend(1) {
					return true, notes.Put(run, left)
				}
				if err := logs.Delete(append([]byte(nil), lk...)); err != nil {
					return false, err
				}
				p.LogLines++
			}
			left = left[8:]
		}
		if err := notes.Delete(run); err != nil {
			return false, err
		}
	}
	return false, nil
}
