package sim

import (
	"container/heap"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestEvHeapIsContainerHeap: the event queue's push and pop leave the
// slice exactly as container/heap's Push and Pop do (script.go reads its
// order), and pop the same events, over random interleavings with equal
// instants (ordered by sequence number).
func TestEvHeapIsContainerHeap(t *testing.T) {
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for seed := uint64(1); seed <= 200; seed++ {
		r := rand.New(rand.NewPCG(seed, 0))
		var a, b evHeap
		var seq uint64
		for range 400 {
			if len(a) == 0 || r.IntN(3) > 0 {
				seq++
				e := &event{at: base.Add(time.Duration(r.IntN(20)) * time.Millisecond), seq: seq}
				a.push(e)
				heap.Push(&b, e)
			} else if x, y := a.pop(), heap.Pop(&b).(*event); x != y {
				t.Fatalf("seed %d: pop gave event %d, container/heap %d", seed, x.seq, y.seq)
			}
			if !slices.Equal(a, b) {
				t.Fatalf("seed %d: the queue's order differs from container/heap's", seed)
			}
		}
	}
}
