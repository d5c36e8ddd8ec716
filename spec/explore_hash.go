package spec

// State identity for the explorer: a 64-bit hash of everything that can
// change a future step or a future verdict.
//
// The Checker keeps history (every lease ever seen, which token strings the
// API issued, which write-bearing step's process started under which lease,
// whether a COMMITTED answer already reached its worker, …). Two paths that
// reach the same machines and network can differ there, and then their
// futures can get different verdicts: so the monitor state is part of the
// state (checkerHash), everything except its counters and scratch space.
// That is sound; it costs little, because nearly all of that history is a
// function of the machines' own state anyway.

import (
	"hash/fnv"
	"slices"
	"time"

	"github.com/tether-run/tether/core"
)

func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// hz accumulates an ordered hash.
type hz struct{ v uint64 }

func (h *hz) u(xs ...uint64) {
	for _, x := range xs {
		h.v = mix64(h.v ^ (x + 0x9e3779b97f4a7c15))
	}
}

func (h *hz) s(xs ...string) {
	for _, x := range xs {
		h.u(strHash(x))
	}
}

func (h *hz) b(xs ...bool) {
	for _, x := range xs {
		if x {
			h.u(1)
		} else {
			h.u(2)
		}
	}
}

func (h *hz) t(ts ...time.Time) {
	for _, t := range ts {
		if t.IsZero() {
			h.u(0)
		} else {
			h.u(uint64(t.UnixNano()))
		}
	}
}

func strHash(s string) uint64 {
	var h uint64 = 14695981039346656037
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// entry hashes one map entry for an order-independent sum.
func entry(f func(h *hz)) uint64 {
	var h hz
	f(&h)
	return mix64(h.v)
}

func recordsHash(recs []core.Record) uint64 {
	f := fnv.New64a()
	for _, r := range recs {
		f.Write([]byte(r.Key))
		f.Write([]byte{0})
		f.Write(r.Value)
		f.Write([]byte{1})
	}
	return f.Sum64()
}

// hash is the state's identity.
func (x *explorer) hash(s *xstate) uint64 { return x.hashWith(s, s.used.pack()) }

// completionHash is the hash without the fault budgets spent: a
// completion takes no fault, so two states that differ only there have
// the same completion.
func (x *explorer) completionHash(s *xstate) uint64 {
	return x.hashWith(s, uint64(s.used.identityRestarts)<<56)
}

func (x *explorer) hashWith(s *xstate, used uint64) uint64 {
	var h hz
	h.t(s.now)
	if s.o != nil {
		h.u(1, s.o.Fingerprint())
		h.t(s.oDL)
	} else {
		h.u(2, s.diskHash)
	}
	for _, w := range s.ws {
		h.b(w.alive, w.dialing)
		h.u(uint64(w.inst), uint64(w.tok), uint64(w.conn))
		h.t(w.deadline)
		if w.m != nil {
			h.u(w.fp)
		}
	}
	multi := x.sc.Network == NetMultiset
	queue := func(q []xmsg) {
		h.u(uint64(len(q)))
		if multi && len(q) > 1 {
			hs := make([]uint64, len(q))
			for i, m := range q {
				hs[i] = m.h
			}
			slices.Sort(hs)
			h.u(hs...)
			return
		}
		for _, m := range q {
			h.u(m.h)
		}
	}
	h.u(uint64(len(s.conns)))
	for _, c := range s.conns {
		h.u(uint64(c.id), uint64(c.w))
		h.b(c.orchOpen, c.workerOpen, c.broken, c.wClosed, c.oClosed, c.abrupt)
		queue(c.toO)
		queue(c.toW)
	}
	h.u(uint64(len(s.procs)))
	for _, p := range s.procs {
		h.u(uint64(p.w), uint64(p.lease), uint64(p.lines))
		h.s(string(p.step))
		h.b(p.writes, p.termed)
	}
	h.u(s.chkHash)
	var rec uint64
	for id, at := range s.recoverAt {
		rec += entry(func(h *hz) { h.s(string(id)); h.t(at) })
	}
	h.u(rec, used, uint64(s.revoked)|uint64(s.used.identityRestarts)<<32)
	h.b(s.archRestart)
	h.u(s.idem.hash())
	return h.v
}

// stateHash hashes the Checker's monitor state: everything a future verdict
// can depend on (not its counters, not its scratch space, not the pointer
// to the live orchestrator).
func (c *Checker) stateHash() uint64 {
	var h hz
	for i, f := range c.found {
		if f != nil {
			h.u(uint64(i))
			h.s(f.Invariant, f.Detail)
		}
	}
	var sum uint64
	for id, st := range c.steps {
		sum += entry(func(h *hz) { h.s(string(id)); h.u(uint64(st)) })
	}
	h.u(sum)
	sum = 0
	for id, v := range c.cancel {
		sum += entry(func(h *hz) { h.s(string(id)); h.b(v) })
	}
	h.u(sum)
	sum = 0
	for id, f := range c.commits {
		sum += entry(func(h *hz) {
			h.s(string(id), f.outcome.Message)
			h.u(uint64(f.lease), f.request, uint64(f.outcome.Status), uint64(int64(f.outcome.ExitCode)))
			h.b(f.hasOutcome, f.durable, f.delivered)
		})
	}
	h.u(sum)
	sum = 0
	for l, id := range c.byLease {
		sum += entry(func(h *hz) { h.u(uint64(l)); h.s(string(id)) })
	}
	h.u(sum)
	sum = 0
	for l, ow := range c.current {
		sum += entry(func(h *hz) { h.u(uint64(l)); h.s(string(ow.step), string(ow.worker)) })
	}
	h.u(sum, uint64(c.maxLease))
	sum = 0
	for id, w := range c.workers {
		sum += entry(func(h *hz) {
			h.s(string(id), w.Name, w.Platform)
			h.s(w.Tags...)
			h.u(uint64(len(w.Labels)), uint64(w.slots))
			if w.ahead != 0 {
				h.u(uint64(w.ahead))
			}
			h.b(w.active, w.revoked)
		})
	}
	h.u(sum)
	sum = 0
	for name, t := range c.tokens {
		sum += entry(func(h *hz) { h.s(name); h.t(t.expires); h.b(t.consumed, t.revoked) })
	}
	h.u(sum)
	sum = 0
	for l, m := range c.leases {
		sum += entry(func(h *hz) {
			h.u(uint64(l), uint64(m.ack))
			h.s(string(m.step), string(m.worker), string(m.ackTo))
			h.b(m.writes)
		})
	}
	h.u(sum)
	sum = 0
	for name, tok := range c.issued {
		sum += entry(func(h *hz) { h.s(name, tok) })
	}
	h.u(sum)
	sum = 0
	for cn, w := range c.conns {
		sum += entry(func(h *hz) { h.u(uint64(cn)); h.s(string(w)) })
	}
	h.u(sum)
	sum = 0
	for id, p := range c.wstarted {
		sum += entry(func(h *hz) { h.s(string(id), string(p.worker)); h.u(uint64(p.lease)) })
	}
	h.u(sum)
	sum = 0
	for id, l := range c.writer {
		sum += entry(func(h *hz) { h.s(string(id)); h.u(uint64(l)) })
	}
	h.u(sum)
	sum = 0
	for l, w := range c.procs {
		sum += entry(func(h *hz) { h.u(uint64(l)); h.s(string(w)) })
	}
	h.u(sum, uint64(len(c.pending)), uint64(len(c.journal)))
	// The archive: which history records were written, and what they hold.
	if c.arch != nil {
		h.u(uint64(len(c.arch.runs)), c.arch.sum)
	}
	if c.archFound != nil {
		h.s(c.archFound.Invariant, c.archFound.Detail)
	}
	return h.v
}
