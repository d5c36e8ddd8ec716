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
}

// NewIdempotency returns an empty memory.
func NewIdempotency() *Idempotency {
	return &Idempotency{answers: map[idemKey]core.Verdict{}}
}

// Clone returns an independent copy.
func (p *Idempotency) Clone() *Idempotency {
	return &Idempotency{answers: maps.Clone(p.answers)}
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
	return sum
}

// Len is how many answered reports it remembers.
func (p *Idempotency) Len() int { return len(p.answers) }
