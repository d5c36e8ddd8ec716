package sim

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/tether-run/tether/core"
)

// TestSimDiskRecords: the simulator's disk, which keeps its keys sorted as
// batches land, gives exactly core.Disk's Records after any sequence of
// batches — keys added, overwritten, deleted, added again after a delete,
// within one batch or across Records calls — and its RestoreRecords
// exactly those of them restoreFilter keeps: log lines of a few leases,
// their lease records present or not, among other keys.
func TestSimDiskRecords(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 200; round++ {
		d, ref := newSimDisk(), core.Disk{}
		for b := 0; b < 30; b++ {
			var recs []core.Record
			for range r.IntN(6) {
				key := diskTestKey(r)
				recs = append(recs, core.Record{Key: key, Value: []byte{byte(b)}, Delete: r.IntN(3) == 0})
			}
			d.Apply(recs)
			ref.Apply(recs)
			if r.IntN(4) == 0 {
				if got, want := d.Records(), ref.Records(); !reflect.DeepEqual(got, want) {
					t.Fatalf("round %d batch %d: records\n%v\nwant\n%v", round, b, got, want)
				}
			}
			if r.IntN(4) == 0 {
				if got, want := d.RestoreRecords(), restoreFilter(ref.Records()); !reflect.DeepEqual(got, want) {
					t.Fatalf("round %d batch %d: restore records\n%v\nwant\n%v", round, b, got, want)
				}
			}
		}
		if got, want := d.Records(), ref.Records(); !reflect.DeepEqual(got, want) {
			t.Fatalf("round %d: records\n%v\nwant\n%v", round, got, want)
		}
		if got, want := d.RestoreRecords(), restoreFilter(ref.Records()); !reflect.DeepEqual(got, want) {
			t.Fatalf("round %d: restore records\n%v\nwant\n%v", round, got, want)
		}
	}
}

// diskTestKey draws a key: another kind's, a history or audit record, a
// lease record or a log line of one of a few leases (out of order).
func diskTestKey(r *rand.Rand) string {
	switch lease := uint64(r.IntN(4) + 1); r.IntN(6) {
	case 0:
		return fmt.Sprintf("k/%02d", r.IntN(25))
	case 1:
		return fmt.Sprintf("%s/%02d", []string{core.KindHistory, core.KindAudit, core.KindMeta, core.KindWorker}[r.IntN(4)], r.IntN(3))
	case 2:
		return fmt.Sprintf("%s/%020d", core.KindLease, lease)
	default:
		return fmt.Sprintf("%s/%020d/%010d", core.KindLog, lease, r.IntN(8))
	}
}

// restoreFilter is what Restore reads of sorted records, written plainly:
// no history or audit records, and a log line only if the record of the
// lease its key names is among them (SPEC §7a).
func restoreFilter(recs []core.Record) []core.Record {
	have := map[string]bool{}
	for _, r := range recs {
		have[r.Key] = true
	}
	out := []core.Record{}
	for _, r := range recs {
		if core.IsHistoryKey(r.Key) || core.IsAuditKey(r.Key) {
			continue
		}
		if id, ok := core.LogKeyLease(r.Key); ok && !have[fmt.Sprintf("%s/%020d", core.KindLease, id)] {
			continue
		}
		out = append(out, r)
	}
	return out
}

// TestRestoreRecords: at every restore of many seeds' runs (plain and
// drifted), core.Restore from the disk's RestoreRecords (archived leases'
// log lines, history and audit records withheld) gives the orchestrator
// that Restore from every record gives: the same fingerprint, the same
// records of its state (every live lease's log lines among them), the same
// restore batch (records, messages, transitions, events) and error. And the
// filter withheld something: log lines of archived leases at most
// restores, while passing live leases' lines.
func TestRestoreRecords(t *testing.T) {
	seeds := uint64(24)
	if testing.Short() {
		seeds = 6
	}
	var restores, withheld, lines int
	for seed := uint64(1); seed <= seeds; seed++ {
		for _, drift := range []bool{false, true} {
			cfg := Config{Redrift: drift}
			cfg.restoring = func(cc core.Config, now time.Time, d *simDisk) {
				cc.NoStateCache = false // Fingerprint needs the cache
				full, part := d.Records(), d.RestoreRecords()
				a, ra, errA := core.Restore(cc, now, full)
				b, rb, errB := core.Restore(cc, now, part)
				restores++
				withheld += len(full) - len(part)
				for _, r := range part {
					if _, ok := core.LogKeyLease(r.Key); ok {
						lines++
					}
				}
				if (errA == nil) != (errB == nil) || (errA != nil && errA.Error() != errB.Error()) {
					t.Fatalf("seed %#x (drift %v): Restore's error from every record %v, from RestoreRecords %v", seed, drift, errA, errB)
				}
				if errA != nil {
					return
				}
				if fa, fb := a.Fingerprint(), b.Fingerprint(); fa != fb {
					t.Fatalf("seed %#x (drift %v): restored fingerprint %x from every record, %x from RestoreRecords", seed, drift, fa, fb)
				}
				if !reflect.DeepEqual(a.Records(), b.Records()) {
					t.Fatalf("seed %#x (drift %v): restored state differs between every record and RestoreRecords", seed, drift)
				}
				if !reflect.DeepEqual(ra, rb) {
					t.Fatalf("seed %#x (drift %v): the restore batch differs between every record and RestoreRecords:\n%+v\n%+v", seed, drift, ra, rb)
				}
			}
			Simulate(seed, Swarm(seed), cfg)
		}
	}
	t.Logf("%d restores compared; %d records withheld, %d live log lines passed", restores, withheld, lines)
	if restores < 20 || withheld == 0 || lines == 0 {
		t.Fatalf("%d restores, %d records withheld, %d live log lines passed: the comparison proves little", restores, withheld, lines)
	}
}
