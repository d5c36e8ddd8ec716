package orchestrator

import (
	"math/bits"
	"sync"
	"time"
)

// LoopStats says how long batches held the driver's loop (SPEC §12). One
// measurement is one batch: from the moment the loop has gathered the batch
// of inputs (after waiting for the first) to the moment process returns:
// every input stepped and, if the group before had landed (or had to: the
// group is full, or the batch reads the state), that group released —
// every message handed to its connection's writer, every API call answered
// and every queued snapshot query run — and the next group handed to the
// store. A group that lands while the loop is idle is released as a batch
// of no inputs. The idle wait for input is not counted. Quantiles are read from a histogram
// with power-of-two microsecond buckets, so a quantile is an upper bound
// at most twice the true value; Max is exact.
type LoopStats struct {
	Batches     int64         // batches measured
	Max         time.Duration // the longest batch
	MaxInputs   int           // inputs in the longest batch
	P50, P99    time.Duration // upper bounds (bucket edges)
	P999        time.Duration
	Total       time.Duration // time the loop was busy
	TotalInputs int64
}

// loopBuckets: bucket i counts batches of less than 2^i µs (the last one
// everything longer).
const loopBuckets = 32

type loopStats struct {
	mu     sync.Mutex
	n      int64
	inputs int64
	total  time.Duration
	max    time.Duration
	maxIn  int
	hist   [loopBuckets]int64
}

func (s *loopStats) add(d time.Duration, inputs int) {
	us := uint64(d / time.Microsecond)
	b := min(bits.Len64(us), loopBuckets-1)
	s.mu.Lock()
	s.n++
	s.inputs += int64(inputs)
	s.total += d
	if d > s.max {
		s.max, s.maxIn = d, inputs
	}
	s.hist[b]++
	s.mu.Unlock()
}

// quantile returns the upper edge of the bucket holding quantile q.
func (s *loopStats) quantile(q float64) time.Duration {
	if s.n == 0 {
		return 0
	}
	rank := int64(q*float64(s.n) + 0.5)
	rank = max(rank, 1)
	var seen int64
	for i, c := range s.hist {
		seen += c
		if seen >= rank {
			return min(time.Duration(uint64(1)<<i)*time.Microsecond, s.max)
		}
	}
	return s.max
}

// LoopStats returns the loop's measurements since Start (or the last
// ResetLoopStats).
func (d *Driver) LoopStats() LoopStats {
	s := &d.stats
	s.mu.Lock()
	defer s.mu.Unlock()
	return LoopStats{Batches: s.n, Max: s.max, MaxInputs: s.maxIn, P50: s.quantile(0.5), P99: s.quantile(0.99),
		P999: s.quantile(0.999), Total: s.total, TotalInputs: s.inputs}
}

// ResetLoopStats forgets the measurements so far (a benchmark measures one
// phase).
func (d *Driver) ResetLoopStats() {
	s := &d.stats
	s.mu.Lock()
	s.n, s.inputs, s.total, s.max, s.maxIn, s.hist = 0, 0, 0, 0, 0, [loopBuckets]int64{}
	s.mu.Unlock()
}
