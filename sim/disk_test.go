package sim

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/tether-run/tether/core"
)

// TestSimDiskRecords: the simulator's disk, which keeps its keys sorted as
// batches land, gives exactly core.Disk's Records after any sequence of
// batches — keys added, overwritten, deleted, added again after a delete,
// within one batch or across Records calls.
func TestSimDiskRecords(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 200; round++ {
		d, ref := newSimDisk(), core.Disk{}
		for b := 0; b < 30; b++ {
			var recs []core.Record
			for range r.IntN(6) {
				key := fmt.Sprintf("k/%02d", r.IntN(25))
				recs = append(recs, core.Record{Key: key, Value: []byte{byte(b)}, Delete: r.IntN(3) == 0})
			}
			d.Apply(recs)
			ref.Apply(recs)
			if r.IntN(4) == 0 {
				if got, want := d.Records(), ref.Records(); !reflect.DeepEqual(got, want) {
					t.Fatalf("round %d batch %d: records\n%v\nwant\n%v", round, b, got, want)
				}
			}
		}
		if got, want := d.Records(), ref.Records(); !reflect.DeepEqual(got, want) {
			t.Fatalf("round %d: records\n%v\nwant\n%v", round, got, want)
		}
	}
}
