package spec

// The depth-first search: Scope.Parallel workers (GOMAXPROCS by default;
// one is the sequential search) expand states from a shared frontier, each
// depth-first on a stack of its own, with one visited set shared by all.
//
// A worker's stack holds states and the actions still to try from each;
// when another worker is idle and the frontier is empty, a worker hands the
// deepest-in-history frame it has not finished (the bottom of its stack:
// the largest subtree) to the frontier, where the idle one takes it. States
// are never changed once built (a successor copies what it changes), so two
// workers may expand siblings of one parent at once; only the Checker
// counts its checks as it runs them, so a handed frame takes a copy of it
// (the parts of a state a worker's successors share with it stay that
// worker's).
//
// The visited set keeps, for every state, the smallest depth it was
// expanded at, and a state met again at a smaller depth is expanded again
// (its bounded future is longer), as the sequential search does. So,
// whatever the scheduling, every state within the bounds is reached at its
// smallest depth and expanded there: when no budget stops the search, the
// set of states reached — States and Pruned — is the breadth-first
// search's, every run; so is every expansion and completion the
// breadth-first search makes. Transitions, completions and the
// counterexample (if several states break an invariant, whichever a worker
// meets first) vary from run to run, and a state first met at the depth
// bound is completed there even if it is later expanded at a smaller one,
// so the sometimes properties shown are at least the breadth-first
// search's. When the state or time budget stops the search, which states
// it reached depends on the scheduling; that it was cut short does not.

import (
	"sync"
	"sync/atomic"
	"time"
)

// visitedSet is the shared visited set: state hash → the smallest depth
// it was expanded at, in shards with a lock each.
type visitedSet struct {
	shards [256]visitedShard
}

type visitedShard struct {
	mu sync.Mutex
	m  map[uint64]int32
	_  [40]byte // a cache line each
}

func newVisitedSet() *visitedSet {
	v := &visitedSet{}
	for i := range v.shards {
		v.shards[i].m = make(map[uint64]int32, 1<<10)
	}
	return v
}

// visit records h met at depth: first says it was never met before,
// expand that it must be expanded (never met, or only at greater depths).
func (v *visitedSet) visit(h uint64, depth int32) (first, expand bool) {
	s := &v.shards[mix64(h)%uint64(len(v.shards))]
	s.mu.Lock()
	d, seen := s.m[h]
	if !seen || depth < d {
		s.m[h] = depth
		expand = true
	}
	s.mu.Unlock()
	return !seen, expand
}

// pathLink is a state's way in: the action that led to it and the way in
// of the state it was applied to (nil: the initial state).
type pathLink struct {
	up  *pathLink
	act action
}

func (p *pathLink) actions() []action {
	var out []action
	for ; p != nil; p = p.up {
		out = append(out, p.act)
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

// dfsFrame is a state on a worker's stack, or handed to the frontier.
type dfsFrame struct {
	s     *xstate
	acts  []action
	next  int
	depth int32
	path  *pathLink
}

// pdfs is the shared state of one parallel depth-first search.
type pdfs struct {
	x       *explorer
	visited *visitedSet

	mu       sync.Mutex
	cond     *sync.Cond
	frontier []dfsFrame
	idle     int // workers waiting for the frontier
	workers  int
	handoffs int           // frames given to the frontier by share
	waited   time.Duration // summed time workers waited in take
	hungry   atomic.Bool   // some worker waits and the frontier is empty
	stop     atomic.Bool   // a violation or a budget ended the search

	states, transitions, pruned atomic.Int64
	maxDepth                    atomic.Int32
	depthBounded, truncated     atomic.Bool
	hits                        atomic.Uint32

	violMu sync.Mutex
	viol   *foundViolation // the first one a worker met
}

// foundViolation is a violation as a worker meets it: the path to the
// state, and a completion's actions past it.
type foundViolation struct {
	path, tail []action
	v          *Violation
}

func (x *explorer) pdfs(par int) Result {
	var res Result
	init, err := x.initial()
	if err != nil {
		res.Violation = &Counterexample{Invariant: "Setup", Detail: err.Error()}
		return res
	}
	p := &pdfs{x: x, visited: newVisitedSet(), workers: par}
	p.cond = sync.NewCond(&p.mu)
	p.visited.visit(x.hash(init), 0)
	p.states.Store(1)
	acts := x.actions(init)
	if x.needsCompletion(init, acts) {
		c := x.complete(init)
		x.hits |= c.hits
		if c.viol != nil {
			res.States = 1
			res.Violation = x.completionExample(nil, c.tail, c.viol)
			return res
		}
	}
	p.frontier = append(p.frontier, dfsFrame{s: init, acts: acts})
	var wg sync.WaitGroup
	for range par {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.work()
		}()
	}
	wg.Wait()
	res.States = int(p.states.Load())
	res.Transitions = int(p.transitions.Load())
	res.Pruned = int(p.pruned.Load())
	res.MaxDepth = int(p.maxDepth.Load())
	res.DepthBounded = p.depthBounded.Load()
	res.Truncated = p.truncated.Load()
	res.Handoffs, res.Idle = p.handoffs, p.waited
	x.hits |= p.hits.Load()
	if f := p.viol; f != nil {
		// Rendered once every worker has stopped: a counterexample replays
		// its path from a fresh initial state, which sets the explorer's
		// fields (tokens, the run) again.
		res.Violation = x.completionExample(f.path, f.tail, f.v)
	}
	return res
}

// take waits for a frame from the frontier; false once the search is over
// (stopped, or every worker idle with the frontier empty).
func (p *pdfs) take() (dfsFrame, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.frontier) == 0 || p.stop.Load() {
		if p.stop.Load() {
			return dfsFrame{}, false
		}
		p.idle++
		if p.idle == p.workers {
			p.stop.Store(true) // nothing left anywhere
			p.cond.Broadcast()
			return dfsFrame{}, false
		}
		p.hungry.Store(true)
		t := time.Now()
		p.cond.Wait()
		p.waited += time.Since(t)
		p.idle--
	}
	f := p.frontier[len(p.frontier)-1]
	p.frontier = p.frontier[:len(p.frontier)-1]
	p.hungry.Store(p.idle > 0 && len(p.frontier) == 0)
	return f, true
}

// give hands a frame to the frontier.
func (p *pdfs) give(f dfsFrame) {
	p.mu.Lock()
	p.frontier = append(p.frontier, f)
	p.handoffs++
	p.hungry.Store(false)
	p.cond.Signal()
	p.mu.Unlock()
}

// halt ends the search for every worker.
func (p *pdfs) halt() {
	p.mu.Lock()
	p.stop.Store(true)
	p.cond.Broadcast()
	p.mu.Unlock()
}

// violated ends the search at a successor that breaks an invariant (at
// depth, counted as reached, as the breadth-first search counts it).
func (p *pdfs) violated(path *pathLink, a action, sc *xsucc, depth int32) {
	p.violMu.Lock()
	first := p.viol == nil
	if first {
		p.viol = &foundViolation{path: append(path.actions(), a), tail: sc.tail, v: sc.viol}
	}
	p.violMu.Unlock()
	if first {
		p.states.Add(1)
		p.raiseDepth(depth)
	}
	p.halt()
}

func (p *pdfs) work() {
	x := p.x
	var stack []dfsFrame
	for {
		f, ok := p.take()
		if !ok {
			return
		}
		stack = append(stack[:0], f)
		for len(stack) > 0 && !p.stop.Load() {
			if p.hungry.Load() {
				p.share(stack)
			}
			f := &stack[len(stack)-1]
			if f.next >= len(f.acts) {
				stack = stack[:len(stack)-1]
				continue
			}
			a := f.acts[f.next]
			f.next++
			p.transitions.Add(1)
			sc := x.apply(f.s, a, false)
			depth := f.depth + 1
			if sc.viol != nil {
				p.hits.Or(sc.hits)
				p.violated(f.path, a, sc, depth)
				return
			}
			p.hits.Or(sc.hits)
			first, expand := p.visited.visit(sc.hash, depth)
			if !expand {
				continue
			}
			n := p.states.Load()
			if first {
				n = p.states.Add(1)
				if sc.pruned {
					p.pruned.Add(1)
				}
				if x.sc.Progress != nil && n%1_000_000 == 0 {
					x.sc.Progress(int(depth), int(n), len(stack), time.Since(x.start))
				}
			}
			if x.outOfBudget(int(n)) {
				p.truncated.Store(true)
				p.halt()
				return
			}
			p.raiseDepth(depth)
			leaf := x.sc.MaxDepth > 0 && int(depth) >= x.sc.MaxDepth
			var acts []action
			if !sc.pruned && !leaf {
				acts = x.actions(sc.s)
			}
			if sc.pruned || leaf || x.needsCompletion(sc.s, acts) {
				x.completeSucc(sc)
				p.hits.Or(sc.hits)
				if sc.viol != nil {
					p.violated(f.path, a, sc, depth)
					return
				}
			}
			if sc.pruned {
				continue
			}
			if leaf {
				p.depthBounded.Store(true)
				continue
			}
			stack = append(stack, dfsFrame{s: sc.s, acts: acts, depth: depth, path: &pathLink{up: f.path, act: a}})
		}
	}
}

// raiseDepth records that a state at depth was reached.
func (p *pdfs) raiseDepth(depth int32) {
	for m := p.maxDepth.Load(); depth > m && !p.maxDepth.CompareAndSwap(m, depth); m = p.maxDepth.Load() {
	}
}

// share hands work to an idle worker: from the bottom-most frame with
// actions left (the largest subtree), the second half of them, or its last
// one if it is not the frame being worked on.
func (p *pdfs) share(stack []dfsFrame) {
	for i := range stack {
		g := &stack[i]
		left := len(g.acts) - g.next
		if left >= 2 || (left == 1 && i < len(stack)-1) {
			mid := g.next + left/2
			// The checker is the one part of a state whose reads write
			// (its counters): the frame goes with a copy of its own.
			s := *g.s
			s.chk = g.s.chk.Clone()
			p.give(dfsFrame{s: &s, acts: g.acts[mid:], depth: g.depth, path: g.path})
			g.acts = g.acts[:mid]
			return
		}
	}
}
