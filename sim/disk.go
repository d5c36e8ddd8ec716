package sim

import (
	"slices"

	"github.com/tether-run/tether/core"
)

// simDisk is the orchestrator's durable store: a core.Disk that keeps its
// keys sorted as batches land, so that a restore (SPEC §7) does not sort
// every key of a store that only grows (archived runs' log lines stay).
type simDisk struct {
	core.Disk
	keys  []string // sorted: the keys as of the last Records, deleted ones among them
	added []string // keys new since
}

func newSimDisk() *simDisk { return &simDisk{Disk: core.Disk{}} }

// Apply applies a batch's records in order.
func (d *simDisk) Apply(recs []core.Record) {
	for _, r := range recs {
		if _, had := d.Disk[r.Key]; !had && !r.Delete {
			d.added = append(d.added, r.Key) // perhaps again: Records drops repeats
		}
	}
	d.Disk.Apply(recs)
}

// Records is every record on the disk, in key order: core.Disk.Records.
func (d *simDisk) Records() []core.Record {
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
	recs := make([]core.Record, 0, len(d.Disk))
	live := d.keys[:0]
	for _, key := range d.keys {
		v, ok := d.Disk[key]
		if !ok || (len(live) > 0 && live[len(live)-1] == key) {
			continue // deleted, or added again after a delete
		}
		live = append(live, key)
		recs = append(recs, core.Record{Key: key, Value: v})
	}
	d.keys = live
	return recs
}
