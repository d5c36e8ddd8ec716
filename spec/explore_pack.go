package spec

import (
	"github.com/tether-run/tether/core"
)

// checkerPack is a Checker at rest in the BFS frontier: the same monitor
// state in exact-size slices instead of maps (a Checker's fifteen small maps
// cost about 5 KB; this is several times smaller, and the frontier holds
// hundreds of thousands of them). unpack gives back an equivalent Checker.
type checkerPack struct {
	verify   bool
	found    [numInv]*Violation
	counts   [numInv]uint64
	checks   uint64
	live     uint64
	checked  [numInv]uint64
	maxLease core.LeaseID
	arch     *Archive // immutable: shared with the checker it was packed from
	archF    *Violation
	archE    uint64

	steps    []kv[core.StepID, core.State]
	cancel   []core.StepID
	commits  []kv[core.StepID, commitFact]
	byLease  []kv[core.LeaseID, core.StepID]
	current  []kv[core.LeaseID, leaseOwner]
	workers  []kv[core.WorkerID, workerInfo]
	tokens   []kv[string, tokenInfo]
	leases   []kv[core.LeaseID, leaseMeta]
	issued   []kv[string, string]
	conns    []kv[core.ConnID, core.WorkerID]
	wstarted []kv[core.StepID, processFact]
	writer   []kv[core.StepID, core.LeaseID]
	procs    []kv[core.LeaseID, core.WorkerID]
}

type kv[K comparable, V any] struct {
	k K
	v V
}

func packMap[K comparable, V any](m map[K]V) []kv[K, V] {
	if len(m) == 0 {
		return nil
	}
	out := make([]kv[K, V], 0, len(m))
	for k, v := range m {
		out = append(out, kv[K, V]{k, v})
	}
	return out
}

func unpackMap[K comparable, V any](s []kv[K, V]) map[K]V {
	m := make(map[K]V, len(s))
	for _, e := range s {
		m[e.k] = e.v
	}
	return m
}

// packChecker packs c, which must be between batches (nothing pending).
func packChecker(c *Checker) *checkerPack {
	if len(c.pending) > 0 || len(c.journal) > 0 {
		panic("spec: explorer: packing a checker with batches pending")
	}
	p := &checkerPack{verify: c.Verify, found: c.found, counts: c.counts, checks: c.checks, live: c.live,
		checked: c.checked, maxLease: c.maxLease, arch: c.arch, archF: c.archFound, archE: c.archEvals}
	p.steps = packMap(c.steps)
	for id, v := range c.cancel {
		if v {
			p.cancel = append(p.cancel, id)
		}
	}
	p.commits = packMap(c.commits)
	p.byLease = packMap(c.byLease)
	p.current = packMap(c.current)
	p.workers = packMap(c.workers)
	p.tokens = packMap(c.tokens)
	p.leases = packMap(c.leases)
	p.issued = packMap(c.issued)
	p.conns = packMap(c.conns)
	p.wstarted = packMap(c.wstarted)
	p.writer = packMap(c.writer)
	p.procs = packMap(c.procs)
	return p
}

// unpack rebuilds the Checker; o is the orchestrator of the state (nil
// while it is down), which is the one the checker saw last.
func (p *checkerPack) unpack(o *core.Orchestrator) *Checker {
	c := &Checker{Verify: p.verify, found: p.found, counts: p.counts, checks: p.checks, live: p.live,
		checked: p.checked, maxLease: p.maxLease, o: o, arch: p.arch, archFound: p.archF, archEvals: p.archE}
	c.steps = unpackMap(p.steps)
	c.cancel = make(map[core.StepID]bool, len(p.cancel))
	for _, id := range p.cancel {
		c.cancel[id] = true
	}
	c.commits = unpackMap(p.commits)
	c.byLease = unpackMap(p.byLease)
	c.current = unpackMap(p.current)
	c.held = map[core.WorkerID]int{}
	for _, e := range p.current {
		c.held[e.v.worker]++
	}
	c.workers = unpackMap(p.workers)
	c.tokens = unpackMap(p.tokens)
	c.leases = unpackMap(p.leases)
	c.issued = unpackMap(p.issued)
	c.conns = unpackMap(p.conns)
	c.wstarted = unpackMap(p.wstarted)
	c.writer = unpackMap(p.writer)
	c.procs = unpackMap(p.procs)
	return c
}
