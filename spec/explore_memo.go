package spec

import (
	"fmt"
	"slices"
	"sync"

	"github.com/tether-run/tether/core"
)

// orchMemo remembers orchestrator transitions: (fingerprint, now, input) →
// (the resulting orchestrator, its batch). Interleavings combine the same
// orchestrator state with many worker and network states, so most
// orchestrator steps were already computed from an equal orchestrator;
// reusing the result saves a Clone, the explorer's dominant cost (core's
// Clone round-trips every record through JSON). The results are immutable
// from then on: a successor that steps one again clones it first.
type orchMemo struct {
	shards [16]memoShard
	limit  int
}

type memoShard struct {
	mu         sync.Mutex
	m, old     map[memoKey]memoVal // two generations: recent entries survive a turnover
	hits, miss int
}

type memoKey struct {
	fp, in uint64
	now    int64
}

type memoVal struct {
	o  *core.Orchestrator
	rd core.Ready
	fp uint64 // o's fingerprint when stored: shared, it never changes
}

func newOrchMemo(limit int) *orchMemo {
	m := &orchMemo{}
	m.limit = max(limit/len(m.shards), 1)
	for i := range m.shards {
		m.shards[i].m = map[memoKey]memoVal{}
	}
	return m
}

func (m *orchMemo) shard(k memoKey) *memoShard {
	return &m.shards[mix64(k.fp^k.in)%uint64(len(m.shards))]
}

func (m *orchMemo) get(k memoKey) (memoVal, bool) {
	s := m.shard(k)
	s.mu.Lock()
	v, ok := s.m[k]
	if !ok {
		if v, ok = s.old[k]; ok {
			s.m[k] = v
		}
	}
	if ok {
		s.hits++
	} else {
		s.miss++
	}
	s.mu.Unlock()
	return v, ok
}

func (m *orchMemo) put(k memoKey, v memoVal) {
	s := m.shard(k)
	s.mu.Lock()
	if len(s.m) >= m.limit {
		// A cache, not a record: the older generation goes.
		s.old, s.m = s.m, make(map[memoKey]memoVal, m.limit)
	}
	s.m[k] = v
	s.mu.Unlock()
}

// copy gives a Ready its own slices (the Checker tells batches apart by
// their backing arrays, and Mutate may write to them).
func readyCopy(rd core.Ready) core.Ready {
	rd.Records = slices.Clone(rd.Records)
	rd.Messages = slices.Clone(rd.Messages)
	rd.Answers = slices.Clone(rd.Answers)
	rd.Events = slices.Clone(rd.Events)
	rd.Logs = slices.Clone(rd.Logs)
	rd.Transitions = slices.Clone(rd.Transitions)
	return rd
}

// inputHash identifies an orchestrator input.
func inputHash(in core.Input) uint64 {
	var h hz
	switch in := in.(type) {
	case core.Tick:
		h.u(1)
	case core.Received:
		h.u(2, uint64(in.Conn), msgHash(in.Msg))
		h.s(string(in.Entropy[:]))
	case core.Disconnected:
		h.u(3, uint64(in.Conn))
	default:
		h.u(4)
		h.s(fmt.Sprintf("%T %+v", in, in))
	}
	return h.v
}

// changed counts the entries whose orchestrator's fingerprint is no longer
// the one it was stored with: one was stepped in place while shared.
func (m *orchMemo) changed() int {
	n := 0
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		for _, g := range []map[memoKey]memoVal{s.m, s.old} {
			for _, v := range g {
				if v.o.Fingerprint() != v.fp {
					n++
				}
			}
		}
		s.mu.Unlock()
	}
	return n
}

func (m *orchMemo) stats() (hits, miss int) {
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		hits += s.hits
		miss += s.miss
		s.mu.Unlock()
	}
	return hits, miss
}

// internTable shares equal immutable values between states: a worker machine
// or a packed checker reached by many paths is kept once (by its
// fingerprint) instead of once per state in the frontier. Like the memo it
// is a cache of two generations, so it never grows without bound; losing an
// entry costs memory, never correctness.
type internTable[T any] struct {
	shards [16]internShard[T]
	limit  int
}

type internShard[T any] struct {
	mu     sync.Mutex
	m, old map[uint64]T
}

func newInternTable[T any](limit int) *internTable[T] {
	t := &internTable[T]{}
	t.limit = max(limit/len(t.shards), 1)
	for i := range t.shards {
		t.shards[i].m = map[uint64]T{}
	}
	return t
}

// each calls f with every value kept, and the hash it was kept under.
func (t *internTable[T]) each(f func(h uint64, v T)) {
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		for _, g := range []map[uint64]T{s.m, s.old} {
			for h, v := range g {
				f(h, v)
			}
		}
		s.mu.Unlock()
	}
}

// intern returns the value kept for h, or keeps v and returns it.
func (t *internTable[T]) intern(h uint64, v T) T {
	s := &t.shards[mix64(h)%uint64(len(t.shards))]
	s.mu.Lock()
	defer s.mu.Unlock()
	if got, ok := s.m[h]; ok {
		return got
	}
	if got, ok := s.old[h]; ok {
		s.m[h] = got
		return got
	}
	if len(s.m) >= t.limit {
		s.old, s.m = s.m, make(map[uint64]T, t.limit)
	}
	s.m[h] = v
	return v
}
