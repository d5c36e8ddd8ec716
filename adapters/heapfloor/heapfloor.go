// Package heapfloor keeps the Go collector's heap goal at or above a floor
// (SPEC §12, "The heap floor").
//
// The collector starts a cycle when the heap has grown by GOGC percent
// (100 by default) over what the last cycle left live. An orchestrator
// holding little state lives in a small heap, so under load it collects
// every few tens of milliseconds, and each cycle lengthens the driver
// loop's batches that meet it: the loop is preempted to scan its stack and
// waits behind the mark worker, and it assists the marking. A floor makes
// those cycles rarer while the live heap is small, and changes nothing once
// the live heap is half the floor or more: the memory it costs is about the
// floor (a cycle's goal is set from what the cycle before left live, so
// after the live heap jumps one goal may overshoot until the next cycle
// sets it again). cmd/orchestrator's serve keeps one when told to
// (--heap-floor).
//
// Start watches the end of every cycle (a finalizer re-armed each cycle, so
// it costs nothing between cycles) and sets the collector's percentage for
// the next one (Percent). It is process-wide: one floor at a time.
package heapfloor

import (
	"errors"
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// ErrStarted is returned by Start when a floor is already kept.
var ErrStarted = errors.New("heapfloor: a heap floor is already kept in this process")

// Percent returns the collector's percentage that puts the next heap
// goal at floor or above, and never less than base (GOGC's): base itself
// once that goal reaches the floor. The goal is live + (live + roots) ×
// percent/100, where live is the heap the last cycle left live and roots
// the goroutine stacks and globals, which the collector counts with it;
// but never under the runtime's heap minimum, 4 MiB × percent/100, so the
// percentage is at most the one that puts that minimum at the floor.
func Percent(live, roots, floor uint64, base int) int {
	floor = min(floor, FloorMax)
	if floor <= live {
		return base
	}
	counted := max(live+roots, 1)
	p := ((floor-live)*100 + counted - 1) / counted // rounded up: the goal reaches the floor
	p = min(p, (floor*100+heapMinimum-1)/heapMinimum)
	return max(int(p), base)
}

// FloorMax is the largest floor Start keeps (1 TiB): a larger one is taken
// as this. It keeps Percent's arithmetic far from overflow and the
// percentage far under the int32 the runtime holds it in (at most about
// 2.6 million).
const FloorMax = 1 << 40

// heapMinimum is the Go runtime's heap goal at GOGC=100 however small the
// heap (its defaultHeapMinimum), scaled like the goal by the percentage.
const heapMinimum = 4 << 20

var (
	mu      sync.Mutex
	running *keeper
)

// keeper is one Start's state.
type keeper struct {
	floor   uint64
	base    int
	stopped bool // under mu, as everything here: a finalizer still pending after stop reads it
	last    int
	sample  []metrics.Sample
}

// sentinel is the object whose finalizer runs after each cycle. It is
// larger than the tiny allocator's 16 bytes: a tiny object's finalizer may
// never run.
type sentinel struct{ _ [32]byte }

// Start keeps the heap goal at or above floor bytes (at most FloorMax)
// until the returned stop is called, which gives the collector back the
// percentage it had. That percentage (GOGC's, or what debug.SetGCPercent
// last set) is also the least the floor sets; with the collector off, or
// a zero floor, Start does nothing. Under a memory limit (GOMEMLIMIT) the
// floor is at most half the limit, so the limit, not the floor, decides
// near it.
func Start(floor uint64) (stop func(), err error) {
	pct := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(pct)
	if pct[0].Value.Uint64() > math.MaxInt32 { // off: the runtime holds -1
		return func() {}, nil
	}
	base := int(pct[0].Value.Uint64())
	if limit := debug.SetMemoryLimit(-1); limit != math.MaxInt64 && limit > 0 {
		floor = min(floor, uint64(limit)/2)
	}
	if floor == 0 {
		return func() {}, nil
	}
	mu.Lock()
	defer mu.Unlock()
	if running != nil {
		return nil, ErrStarted
	}
	k := &keeper{floor: floor, base: base, last: base,
		sample: []metrics.Sample{
			{Name: "/gc/heap/live:bytes"},
			{Name: "/memory/classes/heap/objects:bytes"},
			{Name: "/gc/scan/stack:bytes"},
			{Name: "/gc/scan/globals:bytes"},
		}}
	running = k
	k.adjust()
	k.arm()
	return func() {
		mu.Lock()
		defer mu.Unlock()
		if k.stopped {
			return
		}
		k.stopped = true
		running = nil
		debug.SetGCPercent(k.base)
	}, nil
}

// arm drops a sentinel whose finalizer, run once the next cycle has found
// it unreachable, adjusts the percentage and arms again; a stopped keeper's
// does neither.
func (k *keeper) arm() {
	runtime.SetFinalizer(new(sentinel), func(*sentinel) {
		mu.Lock()
		defer mu.Unlock()
		if k.stopped {
			return
		}
		k.adjust()
		k.arm()
	})
}

// adjust sets the percentage for the next cycle from what the last one
// left live; before any cycle, from the heap's objects, garbage included.
// The caller holds mu.
func (k *keeper) adjust() {
	metrics.Read(k.sample)
	live := k.sample[0].Value.Uint64()
	if live == 0 {
		live = k.sample[1].Value.Uint64()
	}
	roots := k.sample[2].Value.Uint64() + k.sample[3].Value.Uint64()
	if p := Percent(live, roots, k.floor, k.base); p != k.last {
		debug.SetGCPercent(p)
		k.last = p
	}
}
