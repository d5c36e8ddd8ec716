package core

import (
	"testing"

	"pgregory.net/rapid"
)

// TestLogDedupIsASet: logDedup answers as the plain set of every stored
// lineID it replaced, and its watermark is the highest n such that
// sequence numbers 1..n of the kind are all stored, over random arrival
// orders with duplicates, gaps and gap markers (sequence 0).
func TestLogDedupIsASet(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var d logDedup
		set := map[lineID]bool{}
		n := rapid.IntRange(0, 200).Draw(t, "n")
		for range n {
			k := lineID{event: rapid.Bool().Draw(t, "event"), seq: rapid.Uint64Range(0, 24).Draw(t, "seq")}
			if k.seq == 0 {
				k.at = rapid.Int64Range(0, 3).Draw(t, "at")
				k.text = rapid.SampledFrom([]string{"", "gap"}).Draw(t, "text")
			}
			if got, want := d.has(k), set[k]; got != want {
				t.Fatalf("has(%+v) = %v, the set says %v", k, got, want)
			}
			if !set[k] {
				d.add(k)
				set[k] = true
			}
			for i, ev := range []bool{false, true} {
				var want uint64
				for set[lineID{event: ev, seq: want + 1}] {
					want++
				}
				if d.mark[i] != want {
					t.Fatalf("watermark of kind %d = %d, want %d", i, d.mark[i], want)
				}
			}
		}
		if len(d.above) > len(set) {
			t.Fatalf("%d lines above the watermarks, %d stored", len(d.above), len(set))
		}
	})
}
