package sim

import (
	"container/heap"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestEvHeapIsContainerHeap: the event queue's push and pop leave the
// slice exactly as container/heap's Push and Pop do over the order as it
// was written before (refHeap; script.go reads the queue's order), and pop
// the same events, over random interleavings with equal instants (ordered
// by sequence number).
func TestEvHeapIsContainerHeap(t *testing.T) {
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for seed := uint64(1); seed <= 200; seed++ {
		r := rand.New(rand.NewPCG(seed, 0))
		var a evHeap
		var b refHeap
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
			if !slices.Equal(a, evHeap(b)) {
				t.Fatalf("seed %d: the queue's order differs from container/heap's", seed)
			}
		}
	}
}

// refHeap is the event queue as it was: container/heap over the order
// written with time.Time's Equal and Before.
type refHeap []*event

func (h refHeap) Len() int { return len(h) }
func (h refHeap) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].seq < h[j].seq
}
func (h refHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *refHeap) Push(x any)   { *h = append(*h, x.(*event)) }
func (h *refHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}
