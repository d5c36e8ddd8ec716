package store

import (
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/tether-run/tether/core"
)

// bktAudit holds the audit log (SPEC §15a): "audit/<seq>" → a
// core.AuditEntry, appended by the core's batches and never rewritten.
// Load does not read it (it is not state); Audit reads it newest first and
// PruneAudit deletes its oldest entries once the retention has passed.
var bktAudit = []byte("audit")

// AuditScanLimit bounds the entries one Audit call examines: a filter that
// matches little returns a short page and a cursor to go on from.
const AuditScanLimit = 10000

// AuditQuery selects audit entries: those with a sequence number below
// Before (0: from the newest), at or after Since (zero: any), of Actor and
// Action when set; at most Limit (1 to 1000; 0 means 100).
type AuditQuery struct {
	Before        uint64
	Since         time.Time
	Actor, Action string
	Limit         int
}

// Audit returns the entries q selects, newest first, and the cursor of
// the next page (0: none; pass it as Before).
func (s *Store) Audit(q AuditQuery) (entries []core.AuditEntry, next uint64, err error) {
	if q.Limit <= 0 {
		q.Limit = 100
	}
	q.Limit = min(q.Limit, 1000)
	entries = []core.AuditEntry{}
	err = s.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(bktAudit).Cursor()
		var k, v []byte
		if q.Before == 0 {
			k, v = c.Last()
		} else {
			c.Seek([]byte(core.AuditKey(q.Before)))
			k, v = c.Prev()
		}
		for scanned := 0; k != nil; k, v = c.Prev() {
			var e core.AuditEntry
			if err := json.Unmarshal(v, &e); err != nil {
				return fmt.Errorf("audit entry %q: %w", k, err)
			}
			if !q.Since.IsZero() && e.At.Before(q.Since) {
				return nil // older entries are older still: the core's clock never runs back
			}
			if len(entries) == q.Limit || scanned == AuditScanLimit {
				next = e.Seq + 1
				return nil
			}
			scanned++
			if (q.Actor == "" || e.Actor == q.Actor) && (q.Action == "" || e.Action == q.Action) {
				entries = append(entries, e)
			}
		}
		return nil
	})
	if err != nil {
		return nil, 0, fmt.Errorf("store: audit: %w", s.mapErr(err))
	}
	return entries, next, nil
}

// PruneAudit deletes the audit entries recorded before cutoff, oldest
// first, at most budget deletions per transaction (SPEC §7a).
func (s *Store) PruneAudit(cutoff time.Time, budget int) (PruneStats, error) {
	return s.prune(budget, []pruneStep{func(tx *bolt.Tx, p *pruneTx, _ *[]byte) (bool, error) {
		b := tx.Bucket(bktAudit)
		c := b.Cursor()
		var victims [][]byte
		more := false
		for k, v := c.First(); k != nil; k, v = c.Next() {
			var e struct{ At time.Time }
			if err := json.Unmarshal(v, &e); err != nil {
				return false, fmt.Errorf("audit entry %q: %w", k, err)
			}
			if !e.At.Before(cutoff) {
				break
			}
			if len(victims) >= p.left {
				more = true
				break
			}
			victims = append(victims, append([]byte(nil), k...))
		}
		for _, k := range victims {
			if err := b.Delete(k); err != nil {
				return false, err
			}
		}
		p.left -= len(victims)
		p.Audit += len(victims)
		return more, nil
	}})
}

// checkAudit: every audit entry decodes, under the key of its sequence
// number, in the order of its time.
func checkAudit(c *checker) {
	var last time.Time
	c.each(bktAudit, func(k, v []byte) {
		c.count("audit entries", 1)
		var e core.AuditEntry
		if err := json.Unmarshal(v, &e); err != nil {
			c.problem(core.Quote(string(k)), "does not decode: %v", err)
			return
		}
		if string(k) != core.AuditKey(e.Seq) {
			c.problem(core.Quote(string(k)), "holds entry %d", e.Seq)
		}
		if e.At.Before(last) {
			c.problem(core.Quote(string(k)), "is older than the entry before it")
		}
		last = e.At
	})
}
