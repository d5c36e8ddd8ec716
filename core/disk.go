package core

import "sort"

// Disk is what a store holds, in memory: the records of every durable batch
// applied in order, a Delete removing its key. The simulator and the tests
// keep the orchestrator's disk in one, and restore from its Records after a
// crash (SPEC §7).
type Disk map[string][]byte

// Apply applies a batch's records in order.
func (d Disk) Apply(recs []Record) {
	for _, r := range recs {
		if r.Delete {
			delete(d, r.Key)
		} else {
			d[r.Key] = r.Value
		}
	}
}

// Records is every record on the disk, in key order, for Restore.
func (d Disk) Records() []Record {
	recs := make([]Record, 0, len(d))
	for k, v := range d {
		recs = append(recs, Record{Key: k, Value: v})
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].Key < recs[j].Key })
	return recs
}
