package sim

import (
	"slices"
	"strconv"
	"strings"

	"github.com/tether-run/tether/core"
)

// simDisk is the orchestrator's durable store: a core.Disk that keeps its
// keys sorted as batches land, so that a restore (SPEC §7) does not sort
// every key of a store that only grows (archived runs' log lines stay).
// Log lines are kept apart, by the lease their key names
// (core.LogKeyLease), so that a restore visits the lines of live leases
// only: RestoreRecords.
type simDisk struct {
	core.Disk
	keys  []string // sorted: the keys but log lines' as of the last sort, deleted ones among them
	added []string // keys but log lines' new since
	lines map[core.LeaseID]*leaseLines
}

// leaseLines is the keys of one lease's log lines, deleted ones among them.
type leaseLines struct {
	keys   []string
	sorted bool // keys is sorted (repeats may follow a delete)
}

func newSimDisk() *simDisk {
	return &simDisk{Disk: core.Disk{}, lines: map[core.LeaseID]*leaseLines{}}
}

// Apply applies a batch's records in order (core.Disk.Apply), noting the
// keys it adds: one map operation a record, the map's size telling a new
// key from an overwritten one.
func (d *simDisk) Apply(recs []core.Record) {
	for _, r := range recs {
		if r.Delete {
			delete(d.Disk, r.Key)
			continue
		}
		n := len(d.Disk)
		if d.Disk[r.Key] = r.Value; len(d.Disk) == n {
			continue // overwritten
		}
		if id, ok := core.LogKeyLease(r.Key); ok {
			g := d.lines[id]
			if g == nil {
				g = &leaseLines{sorted: true}
				d.lines[id] = g
			}
			if n := len(g.keys); n > 0 && g.keys[n-1] >= r.Key {
				g.sorted = false
			}
			g.keys = append(g.keys, r.Key) // perhaps again: live drops repeats
			continue
		}
		d.added = append(d.added, r.Key) // perhaps again: sortKeys drops repeats
	}
}

// sortKeys merges the keys added since into the sorted keys and drops the
// deleted ones and repeats.
func (d *simDisk) sortKeys() {
	if len(d.added) > 0 {
		slices.Sort(d.added)
		merged := make([]string, 0, len(d.keys)+len(d.added))
		i, j := 0, 0
		for i < len(d.keys) || j < len(d.added) {
			switch {
			case j == len(d.added) || (i < len(d.keys) && d.keys[i] < d.added[j]):
				merged = append(merged, d.keys[i])
				i++
			default:
				merged = append(merged, d.added[j])
				j++
			}
		}
		d.keys, d.added = merged, d.added[:0]
	}
	d.keys = d.live(d.keys)
}

// live sorts nothing: it drops from sorted keys those deleted and repeats.
func (d *simDisk) live(keys []string) []string {
	out := keys[:0]
	for _, key := range keys {
		if _, ok := d.Disk[key]; !ok || (len(out) > 0 && out[len(out)-1] == key) {
			continue // deleted, or added again after a delete
		}
		out = append(out, key)
	}
	return out
}

// lineKeys is lease id's log line keys on the disk, sorted.
func (d *simDisk) lineKeys(id core.LeaseID) []string {
	g := d.lines[id]
	if g == nil {
		return nil
	}
	if !g.sorted {
		slices.Sort(g.keys)
		g.sorted = true
	}
	g.keys = d.live(g.keys)
	return g.keys
}

// Records is every record on the disk, in key order: core.Disk.Records.
func (d *simDisk) Records() []core.Record {
	d.sortKeys()
	ids := make([]core.LeaseID, 0, len(d.lines))
	for id := range d.lines {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	keys := slices.Clone(d.keys)
	for _, id := range ids {
		keys = append(keys, d.lineKeys(id)...)
	}
	slices.Sort(keys) // a log line's key is its lease's digits: nearly in order already
	recs := make([]core.Record, 0, len(keys))
	for _, key := range keys {
		recs = append(recs, core.Record{Key: key, Value: d.Disk[key]})
	}
	return recs
}

// RestoreRecords is what core.Restore reads of the disk, in key order:
// every record but history and audit records and the log lines of leases
// whose lease record is not on the disk (archived leases'), which Restore
// skips (SPEC §7a, core.LogKeyLease). TestRestoreRecords holds it to that:
// Restore from these and from Records give the same orchestrator.
func (d *simDisk) RestoreRecords() []core.Record {
	d.sortKeys()
	recs := make([]core.Record, 0, len(d.keys))
	// A lease's record ("lease/<20 digits>") sorts before every log line
	// ("log/<20 digits>/<index>"), which sort after it together: each live
	// lease's lines go in there, in the lease keys' order.
	at := len(d.keys)
	if i, _ := slices.BinarySearch(d.keys, core.KindLog+"/"); i < at {
		at = i
	}
	for _, key := range d.keys[:at] {
		if !core.IsHistoryKey(key) && !core.IsAuditKey(key) {
			recs = append(recs, core.Record{Key: key, Value: d.Disk[key]})
		}
	}
	for _, key := range d.keys[:at] {
		id, ok := leaseKeyID(key)
		if !ok {
			continue
		}
		for _, lk := range d.lineKeys(id) {
			recs = append(recs, core.Record{Key: lk, Value: d.Disk[lk]})
		}
	}
	for _, key := range d.keys[at:] {
		if !core.IsHistoryKey(key) && !core.IsAuditKey(key) {
			recs = append(recs, core.Record{Key: key, Value: d.Disk[key]})
		}
	}
	return recs
}

// leaseKeyID is the lease a lease record's key names, as Restore reads it
// (the record's own id, which the core writes under this key).
func leaseKeyID(key string) (core.LeaseID, bool) {
	digits, ok := strings.CutPrefix(key, core.KindLease+"/")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(digits, 10, 64)
	if err != nil {
		return 0, false
	}
	return core.LeaseID(n), true
}
