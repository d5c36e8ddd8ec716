package core

import (
	"fmt"
	"sort"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// The ready queue (sorted tails, merges, a moving head, compaction) must
// always hand out exactly the ready set, oldest first, then by id.
func TestReadyQueueOrder(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		o := NewOrchestrator(Config{})
		var ids []StepID
		for i := range 40 {
			id := StepID(fmt.Sprintf("run-1/s%d", i))
			ids = append(ids, id)
			o.specOf[id] = &StepSpec{}
		}
		now := t0
		for range rapid.IntRange(1, 400).Draw(t, "ops") {
			switch rapid.IntRange(0, 9).Draw(t, "op") {
			case 0, 1, 2, 3: // queue a step now, or (rarely) at an older time
				at := now
				if rapid.IntRange(0, 9).Draw(t, "old") == 0 {
					at = now.Add(-time.Duration(rapid.IntRange(0, 5).Draw(t, "back")) * time.Second)
				}
				o.indexReady(&StepRecord{ID: rapid.SampledFrom(ids).Draw(t, "id"), State: StateQueued, QueuedAt: at})
			case 4, 5: // a step leaves the ready set
				o.indexReady(&StepRecord{ID: rapid.SampledFrom(ids).Draw(t, "id"), State: StateRunning})
			case 6, 7: // dispatch takes the first live entry
				for _, e := range o.readyQueue() {
					if o.readyLive(e) {
						o.indexReady(&StepRecord{ID: e.id, State: StateQueued, QueuedAt: e.at, Lease: 1})
						break
					}
				}
			default:
				now = now.Add(time.Duration(rapid.IntRange(0, 2).Draw(t, "tick")) * time.Second)
			}
			var got []readyEntry
			for _, e := range o.readyQueue() {
				if o.readyLive(e) && (len(got) == 0 || got[len(got)-1] != e) {
					got = append(got, e)
				}
			}
			var want []readyEntry
			for id, at := range o.ready {
				want = append(want, readyEntry{at: at, id: id})
			}
			sort.Slice(want, func(i, j int) bool { return want[i].less(want[j]) })
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("queue hands out\n%v\nready set in order is\n%v", got, want)
			}
		}
	})
}
