package core

import (
	"container/heap"
	"time"
)

// timerKind orders timers that fall due at the same instant.
type timerKind uint8

const (
	tSweep timerKind = iota
	tLease           // lease ack deadline or recovery (grace) deadline
	tGrace           // worker grace window ends: deregistered (inactive)
	tCred            // connected worker's credential expires
	tForce           // cancelling step's force deadline
	tWait            // waiting step's timer
	tHold            // held step's expiry
)

// Timeouts are timers too (§5), after the others at one instant.
const (
	tStepTimeout = tHold + 1 + iota // running step's timeout: START + its timeout
	tRunTimeout                     // run's timeout: submit + its timeout
	tSchedule                       // a schedule's next fire time (SPEC §8a)
)

type timer struct {
	at   time.Time
	kind timerKind
	key  string // entity id
}

func (a timer) less(b timer) bool {
	if !a.at.Equal(b.at) {
		return a.at.Before(b.at)
	}
	if a.kind != b.kind {
		return a.kind < b.kind
	}
	return a.key < b.key
}

// timerHeap is a min-heap with lazy deletion: an entry is valid only while the
// entity still holds that deadline (see Orchestrator.timerValid), so moving a
// deadline is a push and stale entries are discarded when they surface. The
// heap is derived state: Restore and Clone rebuild it from the entities.
type timerHeap []timer

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].less(h[j]) }
func (h timerHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)        { *h = append(*h, x.(timer)) }
func (h *timerHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = timer{} // let its key go
	*h = old[:len(old)-1]
	return t
}

func (o *Orchestrator) arm(at time.Time, kind timerKind, key string) {
	if at.IsZero() {
		return
	}
	heap.Push(&o.timers, timer{at: at, kind: kind, key: key})
}

// timerValid reports whether a heap entry still matches its entity.
func (o *Orchestrator) timerValid(t timer) bool {
	switch t.kind {
	case tSweep:
		return o.meta.NextSweep.Equal(t.at)
	case tLease:
		l := o.leases[parseLeaseKey(t.key)]
		return l != nil && l.Current && l.Deadline.Equal(t.at)
	case tGrace:
		w := o.workers[WorkerID(t.key)]
		return w != nil && !o.connected(w.ID) && w.Active && w.GraceUntil.Equal(t.at)
	case tCred:
		w := o.workers[WorkerID(t.key)]
		return w != nil && o.connected(w.ID) && w.CredExpiry.Equal(t.at)
	case tForce:
		s := o.steps[StepID(t.key)]
		return s != nil && s.State == StateCancelling && s.ForceAt.Equal(t.at)
	case tWait:
		s := o.steps[StepID(t.key)]
		return s != nil && s.State == StateWaiting && s.WaitUntil.Equal(t.at)
	case tHold:
		s := o.steps[StepID(t.key)]
		return s != nil && s.State == StateHeld && s.HoldUntil.Equal(t.at)
	case tStepTimeout:
		s := o.steps[StepID(t.key)]
		return s != nil && s.State == StateRunning && o.stepDeadline(s).Equal(t.at)
	case tRunTimeout:
		// A cancelled run (by the operator or its timeout) already
		// cancelled every step: the timeout would add nothing.
		r := o.runs[RunID(t.key)]
		return r != nil && !r.Finished && r.CancelReason == "" && r.Deadline.Equal(t.at)
	case tSchedule:
		sc := o.schedules[t.key]
		return sc != nil && !sc.Paused && sc.NextFire.Equal(t.at)
	}
	return false
}

// nextTimer returns the earliest valid timer, discarding stale entries.
func (o *Orchestrator) nextTimer() (timer, bool) {
	for len(o.timers) > 0 {
		t := o.timers[0]
		if o.timerValid(t) {
			return t, true
		}
		heap.Pop(&o.timers)
	}
	return timer{}, false
}

// fireTimers fires every valid timer due at or before limit (strictly before
// when strict), in (time, kind, key) order.
func (o *Orchestrator) fireTimers(limit time.Time, strict bool) {
	for {
		t, ok := o.nextTimer()
		if !ok || t.at.After(limit) || (strict && t.at.Equal(limit)) {
			return
		}
		heap.Pop(&o.timers)
		o.fire(t)
	}
}

// timerSlack is how many entries the heap may hold beyond twice what its
// last compaction kept before the next one: small, so that the simulator's
// small heaps are compacted often too (a compaction is O(heap) once the heap
// has doubled: O(1) per arm whatever the slack).
const timerSlack = 1

// compactTimers drops the heap's stale entries once it has more than
// doubled since the last compaction. An entry goes stale when its entity
// moves on (a lease's dispatch-ack deadline once its START arrives, 10 s
// later in the heap: under load most entries are stale), and is otherwise
// dropped only when it reaches the top: the heap would hold a deadline's
// worth of every lease granted. An entity that needs a timer again is armed
// again, so dropping an entry that is stale now changes nothing (rebuilding
// the heap after a Restore or a Clone relies on the same). Called between
// inputs, when every entity is consistent; amortized O(1) per arm.
func (o *Orchestrator) compactTimers() {
	if len(o.timers) <= 2*o.timersKept+timerSlack {
		return
	}
	kept := o.timers[:0]
	for _, t := range o.timers {
		if o.timerValid(t) {
			kept = append(kept, t)
		}
	}
	clear(o.timers[len(kept):]) // let the keys go
	if cap(kept) > 4*len(kept)+timerSlack {
		kept = append(make(timerHeap, 0, 2*len(kept)+timerSlack), kept...) // and a burst's array
	}
	o.timers = kept
	heap.Init(&o.timers)
	o.timersKept = len(o.timers)
}

// rebuildTimers re-arms the heap from the entities (after load).
func (o *Orchestrator) rebuildTimers() {
	o.timers = o.timers[:0]
	o.arm(o.meta.NextSweep, tSweep, "")
	for _, l := range o.leases {
		if l.Current {
			o.arm(l.Deadline, tLease, leaseKeyID(l.ID))
		}
	}
	for _, w := range o.workers {
		o.arm(w.GraceUntil, tGrace, string(w.ID))
		o.arm(w.CredExpiry, tCred, string(w.ID))
	}
	for _, s := range o.steps {
		o.arm(s.ForceAt, tForce, string(s.ID))
		o.arm(s.WaitUntil, tWait, string(s.ID))
		o.arm(s.HoldUntil, tHold, string(s.ID))
		if s.State == StateRunning {
			o.arm(o.stepDeadline(s), tStepTimeout, string(s.ID))
		}
	}
	for _, r := range o.runs {
		if !r.Finished && r.CancelReason == "" {
			o.arm(r.Deadline, tRunTimeout, string(r.ID))
		}
	}
	for _, sc := range o.schedules {
		if !sc.Paused {
			o.arm(sc.NextFire, tSchedule, sc.Name)
		}
	}
	heap.Init(&o.timers)
	o.timersKept = len(o.timers)
}

// stepDeadline is when a started step with a timeout times out: START +
// its timeout (§5), or later if a restore re-armed it (TimeoutAt, §7); zero
// for a step without one.
func (o *Orchestrator) stepDeadline(s *StepRecord) time.Time {
	sp := o.specOf[s.ID]
	if sp == nil || sp.Timeout <= 0 || s.StartedAt.IsZero() {
		return time.Time{}
	}
	return latestTime(s.StartedAt.Add(sp.Timeout), s.TimeoutAt)
}

func latestTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
