package spec

import (
	"fmt"
	"maps"

	"github.com/tether-run/tether/core"
)

// PropIdempotentReport: an exact duplicate of a report — the same worker,
// lease, request id, step and outcome — gets the same verdict as the first
// copy that was answered (SPEC §3: a report is retransmitted until
// answered, and a lease's answered reports are recorded so that a
// retransmission or a duplicated delivery is answered alike). A different
// verdict for the same request would let a worker that missed the first
// answer act on another (retry a committed step, or drop a result).
//
// One exception follows SPEC §7a: once a lease's run is archived and its
// worker has let go of the lease — a Hello or a heartbeat of that worker,
// after the archival, does not list it — the closed-lease table may drop
// it, and the lease is then unknown: a stale copy of a report on it that
// arrives later (a network duplicate trailing the original) may be answered
// REJECTED. The worker awaits no answer for a lease it no longer lists, so
// no verdict can mislead it.
const PropIdempotentReport = "IdempotentReport"

// idemKey identifies a report exactly.
type idemKey struct {
	worker  core.WorkerID
	lease   core.LeaseID
	request uint64
	step    core.StepID
	outcome core.Outcome
}

// Idempotency remembers the verdict of every answered report, by its exact
// identity. The zero value is not usable: NewIdempotency. Worlds that
// branch (the explorer) Clone it on write; it is part of their state.
type Idempotency struct {
	answers map[idemKey]core.Verdict
	leases  map[workerLease]bool // a worker's leases with an answered report: false, true once let go (SPEC §7a)
}

type workerLease struct {
	worker core.WorkerID
	lease  core.LeaseID
}

// NewIdempotency returns an empty memory.
func NewIdempotency() *Idempotency {
	return &Idempotency{answers: map[idemKey]core.Verdict{}, leases: map[workerLease]bool{}}
}

// Clone returns an independent copy.
func (p *Idempotency) Clone() *Idempotency {
	return &Idempotency{answers: maps.Clone(p.answers), leases: maps.Clone(p.leases)}
}

// Listing notes, before the orchestrator handles in, a Hello or heartbeat
// of worker from: a lease of an archived run (archived, by the history
// records seen before this input) it has an answered report on and does
// not list is let go (PropIdempotentReport's exception). It says whether
// in is such a listing.
func (p *Idempotency) Listing(in core.Input, from core.WorkerID, archived func(core.LeaseID) bool) bool {
	r, ok := in.(core.Received)
	if !ok || from == "" {
		return false
	}
	var refs []core.LeaseRef
	switch m := r.Msg.(type) {
	case core.Hello:
		refs = m.InFlight
	case core.Heartbeat:
		refs = m.InFlight
	default:
		return false
	}
	for k, gone := range p.leases {
		if k.worker != from || gone || !archived(k.lease) {
			continue
		}
		listed := false
		for _, ref := range refs {
			if ref.Lease == k.lease {
				listed = true
				break
			}
		}
		if !listed {
			p.leases[k] = true
		}
	}
	return true
}

// Check checks one orchestrator batch against PropIdempotentReport: in is
// the batch's input, from is the worker the input's connection belongs to
// (the one the orchestrator authenticated on it; empty if none). It
// records the verdict of a report answered for the first time, and says
// whether the input was an exact duplicate of a report already answered
// (a sometimes property).
func (p *Idempotency) Check(in core.Input, from core.WorkerID, rd core.Ready) (dup bool, v *Violation) {
	dup, first, v := p.Judge(in, from, rd)
	if first != nil {
		p.Record(*first)
	}
	return dup, v
}

// IdemAnswer is a report's identity and the verdict of its first answer.
type IdemAnswer struct {
	key     idemKey
	verdict core.Verdict
}

// Judge is Check without recording: it returns, for a report answered for
// the first time, what Record must remember. A world whose batches can be
// lost to a crash records an answer only once its batch is durable (an
// answer that never left may differ from the one a restarted orchestrator
// gives, and SPEC §3 promises the recorded answer, not a lost one).
func (p *Idempotency) Judge(in core.Input, from core.WorkerID, rd core.Ready) (dup bool, first *IdemAnswer, v *Violation) {
	r, ok := in.(core.Received)
	if !ok || from == "" {
		return false, nil, nil
	}
	m, ok := r.Msg.(core.Report)
	if !ok {
		return false, nil, nil
	}
	var got core.Verdict
	answered := false
	for _, e := range rd.Messages {
		if a, ok := e.Msg.(core.Answer); ok && e.Conn == r.Conn && a.Lease == m.Lease && a.Request == m.Request {
			got, answered = a.Verdict, true
			break
		}
	}
	if !answered {
		return false, nil, nil
	}
	k := idemKey{worker: from, lease: m.Lease, request: m.Request, step: m.Step, outcome: m.Outcome}
	prev, seen := p.answers[k]
	if !seen {
		return false, &IdemAnswer{k, got}, nil
	}
	if got != prev && got == core.Rejected && p.leases[workerLease{from, m.Lease}] {
		return true, nil, nil // a stale copy on a lease its worker let go of (SPEC §7a)
	}
	if got != prev {
		return true, nil, &Violation{Invariant: PropIdempotentReport, Detail: fmt.Sprintf(
			"worker %s's report of step %s under lease %d (request %d, outcome %v) was answered %s, and an exact duplicate of it %s",
			from, m.Step, m.Lease, m.Request, m.Outcome.Status, prev, got)}
	}
	return true, nil, nil
}

// Record remembers a first answer Judge returned (the first recorded stays).
func (p *Idempotency) Record(a IdemAnswer) {
	if _, seen := p.answers[a.key]; !seen {
		p.answers[a.key] = a.verdict
		if k := (workerLease{a.key.worker, a.key.lease}); !p.leases[k] {
			p.leases[k] = false
		}
	}
}

// hash is an order-independent hash of the memory (the explorer's state).
func (p *Idempotency) hash() uint64 {
	if p == nil {
		return 0
	}
	var sum uint64
	for k, v := range p.answers {
		sum += entry(func(h *hz) {
			h.s(string(k.worker), string(k.step), k.outcome.Message)
			h.u(uint64(k.lease), k.request, uint64(k.outcome.Status), uint64(int64(k.outcome.ExitCode)), uint64(v))
		})
	}
	for k, gone := range p.leases {
		sum += entry(func(h *hz) {
			h.s(string(k.worker))
			h.u(uint64(k.lease))
			h.b(gone)
		})
	}
	return sum
}

// Len is how many answered reports it remembers.
func (p *Idempotency) Len() int { return len(p.answers) }
