package spec

// Completion: liveness past the depth bound (SPEC §13, invariants 8 and 9).
//
// The bounded search stops at its depth; a run that needs more actions than
// the bound to finish is never seen finishing, and a run that can never
// finish is not seen at all. So every explored state
// whose future the search does not cover — a state at the depth bound, a
// state pruned by the in-flight or lease bound, and an inner state whose
// next fault-free action is one the search does not take (a timer past the
// horizon) — is completed: driven on deterministically, without any fault,
// to quiescence. A completion delivers what is in flight (the first message
// of the first connection first), lets each end notice a closed connection,
// dials, restarts a crashed orchestrator, lets every step process exit (0,
// or 143 once SIGTERMed), and only when none of that is possible lets time
// pass to the earliest deadline, past the horizon and whatever the delay
// budget. Every state on the way is checked against every invariant, its
// sometimes properties count, and the run must finish: RunsFinish (8) and
// NoWriteStepsSurviveWorkerLoss (9) hold once nothing but a timer can act
// (as CheckLiveness checks them); a completion that reaches a state where
// no machine can act (no message, no process, no timer) with the run
// unfinished breaks RunStuck, and one that takes more than completeMaxActs
// actions or completeMaxTime of abstract time without the run finishing
// breaks RunsFinish.
//
// Completions are deterministic (a state has one completion), so a state a
// finished completion passed through need not be completed again: a
// completion that reaches one stops there. Only completions that ended
// without a violation are remembered, so whether a given state's completion
// breaks an invariant, and the set of sometimes properties shown, do not
// depend on the order the parallel search completes states in.

import (
	"fmt"
	"sync"
	"time"
)

// PropRunStuck names the completion's verdict on a run that nothing can
// move any more.
const PropRunStuck = "RunStuck"

const (
	completeMaxActs = 5000
	completeMaxTime = 6 * time.Hour
)

// completion is what completing one state found.
type completion struct {
	viol *Violation
	tail []action // from the completed state to the violation
	hits uint32
	acts int // actions applied
}

// doneSet holds the hashes of states whose completion ended without a
// violation.
type doneSet struct {
	mu sync.Mutex
	m  map[uint64]struct{}
}

func newDoneSet() *doneSet { return &doneSet{m: make(map[uint64]struct{}, 1<<16)} }

func (d *doneSet) has(h uint64) bool {
	d.mu.Lock()
	_, ok := d.m[h]
	d.mu.Unlock()
	return ok
}

func (d *doneSet) add(hs []uint64) {
	d.mu.Lock()
	for _, h := range hs {
		d.m[h] = struct{}{}
	}
	d.mu.Unlock()
}

func (d *doneSet) len() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.m)
}

// completionNext is the next action of a state's completion, and whether
// it is a tick (time passing). ok is false when no machine can act at all.
func (x *explorer) completionNext(s *xstate) (a action, tick, ok bool) {
	if s.o == nil {
		return action{aRestartO, 0, 0}, false, true
	}
	multi := x.sc.Network == NetMultiset
	for ci, c := range s.conns {
		if c.orchOpen && !c.broken && len(c.toO) > 0 {
			return action{aDeliverO, ci, 0}, false, true
		}
		if c.workerOpen && !c.broken && len(c.toW) > 0 {
			return action{aDeliverW, ci, 0}, false, true
		}
	}
	for ci, c := range s.conns {
		if c.orchOpen && (c.broken || (c.wClosed && (len(c.toO) == 0 || multi || c.abrupt))) {
			return action{aNoticeO, ci, 0}, false, true
		}
		if c.workerOpen && (c.broken || (c.oClosed && (len(c.toW) == 0 || multi || c.abrupt))) {
			return action{aNoticeW, ci, 0}, false, true
		}
	}
	for i, w := range s.ws {
		if w.alive && w.dialing {
			return action{aConnect, i, 0}, false, true
		}
	}
	for pi, p := range s.procs {
		if p.termed {
			return action{aTermExit, pi, 0}, false, true
		}
		return action{aExit0, pi, 0}, false, true
	}
	// Time passes to the earliest deadline (the orchestrator's first on a tie).
	var first time.Time
	if !s.oDL.IsZero() {
		first = s.oDL
	}
	for _, w := range s.ws {
		if w.alive && !w.deadline.IsZero() && (first.IsZero() || w.deadline.Before(first)) {
			first = w.deadline
		}
	}
	if first.IsZero() {
		return action{}, false, false
	}
	if !s.oDL.IsZero() && !s.oDL.After(first) {
		return action{aTickO, 0, 0}, true, true
	}
	for i, w := range s.ws {
		if w.alive && !w.deadline.IsZero() && !w.deadline.After(first) {
			return action{aTickW, i, 0}, true, true
		}
	}
	return action{}, false, false
}

// needsCompletion says whether an expanded state's completion leaves the
// explored graph at once: its next fault-free action is not among the
// actions the search takes from it (a timer past the horizon, or past a
// spent delay budget).
func (x *explorer) needsCompletion(s *xstate, acts []action) bool {
	a, _, ok := x.completionNext(s)
	if !ok {
		return false
	}
	for _, b := range acts {
		if b == a {
			return false
		}
	}
	return true
}

// runFinished says whether the run has finished (an orchestrator that is
// down has not).
func (x *explorer) runFinished(s *xstate) bool {
	if s.o == nil {
		return false
	}
	r, _, ok := s.chk.View(s.o).Run(x.run)
	return ok && r.Finished
}

// complete drives s on without faults until the run has
// finished and only a timer could act, checking every state on the way.
func (x *explorer) complete(s *xstate) completion {
	var c completion
	h := x.completionHash(s)
	if x.done == nil || x.done.has(h) {
		return c
	}
	x.completions.Add(1)
	defer func() { x.completionActs.Add(int64(c.acts)) }()
	hashes := []uint64{h}
	start := s.now
	cur := s
	for {
		a, tick, ok := x.completionNext(cur)
		finished := x.runFinished(cur)
		if finished && (tick || !ok) {
			if v := RunsFinish(cur.chk.View(cur.o)); v != nil {
				c.viol = v
				return c
			}
			if v := NoWriteStepsSurviveWorkerLoss(cur.chk.View(cur.o)); v != nil {
				c.viol = v
				return c
			}
			break
		}
		if !ok || c.acts >= completeMaxActs || cur.now.Sub(start) > completeMaxTime {
			detail := "nothing can act"
			if ok {
				detail = fmt.Sprintf("%d fault-free actions and %s of abstract time later", c.acts, cur.now.Sub(start))
			}
			v := RunsFinish(cur.chk.View(cur.o))
			if v == nil {
				v = &Violation{Invariant: "RunsFinish", Detail: fmt.Sprintf("run %s: the orchestrator is down", x.run)}
			}
			if !ok {
				v.Invariant = PropRunStuck
			}
			v.Detail = fmt.Sprintf("a fault-free completion past the explored depth does not finish the run (%s): %s", detail, v.Detail)
			c.viol = v
			return c
		}
		sc := x.completeStep(cur, a)
		c.acts++
		c.tail = append(c.tail, a)
		c.hits |= sc.hits
		if sc.viol != nil {
			c.viol = sc.viol
			return c
		}
		h := x.completionHash(sc.s)
		if x.done.has(h) {
			break
		}
		hashes = append(hashes, h)
		cur = sc.s
	}
	x.done.add(hashes)
	c.tail = nil
	return c
}
