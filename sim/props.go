package sim

import (
	"fmt"
	"strings"
	"time"

	"github.com/tether-run/tether/core"
	"github.com/tether-run/tether/spec"
)

// The properties beyond spec's invariants (spec.PropGraceWindow,
// spec.PropInFlightHonoured) need facts only the simulated world has: the
// workers' configured reconnect delays and what a worker said in its Hello.
// The code is spec's, shared with the explorer; the world keeps the state.

// The properties of the failover fault (failover.go), each one condition.
const (
	// PropOneWriterPerEpoch: at most one instance commits in any epoch,
	// and no commit (nor proof of leadership) lands with an epoch older
	// than the store's. Judged at the shared store (observeCommit).
	PropOneWriterPerEpoch = "failover-one-writer-per-epoch"
	// PropTimeoutNotEarly: no step or run timeout is armed, or fires,
	// earlier in true time than its window after the step's START or the
	// run's submission — the window measured on the clock of the instance
	// that started it (hosts' clocks differ by offsets, not rates),
	// whichever instance holds it (SPEC §7). Fires are judged at every
	// batch, the deadlines a restore or takeover armed at once (in the
	// leader's clock, converted to true time). Applies to every seed.
	PropTimeoutNotEarly = "timeout-not-early"
)

// checkTimeoutNotEarly is PropTimeoutNotEarly over one batch: it learns
// STARTs and submissions (in true time) and judges the timers' fires.
func (w *world) checkTimeoutNotEarly(rd core.Ready) {
	for _, t := range rd.Transitions {
		if t.To == core.StateRunning && t.From == core.StateQueued {
			w.startedTrue[t.Step] = w.now
		}
	}
	for _, e := range rd.Events {
		switch {
		case e.Step == "" && e.Kind == "run-submitted":
			w.submittedTrue[e.Run] = w.now
		case e.Step != "" && e.Cause == core.CauseStepTimeout: // the timer's (a worker's own timed-out report has none)
			start, ok := w.startedTrue[e.Step]
			sp, ok2 := w.view().StepSpecOf(e.Step)
			if ok && ok2 && w.now.Sub(start) < sp.Timeout {
				w.fail(PropTimeoutNotEarly, fmt.Sprintf("step %s timed out %s after its START, before its timeout of %s (event %q)", e.Step, w.now.Sub(start), sp.Timeout, e.Message))
				return
			}
		case e.Step == "" && e.Kind == "run-cancel":
			sub, ok := w.submittedTrue[e.Run]
			r, _, ok2 := w.view().Run(e.Run)
			if ok && ok2 && r.CancelClass == core.ClassRunTimeout && w.now.Sub(sub) < r.Spec.Timeout {
				w.fail(PropTimeoutNotEarly, fmt.Sprintf("run %s cancelled for its timeout of %s only %s after its submission", e.Run, r.Spec.Timeout, w.now.Sub(sub)))
				return
			}
		}
	}
}

// checkArmedTimeouts is PropTimeoutNotEarly over the deadlines a restore
// (or a takeover) armed: each, converted from the leader's clock to true
// time, is no earlier than its window after the START or the submission.
func (w *world) checkArmedTimeouts() {
	v := w.view()
	fires := func(d time.Time) time.Time {
		if !d.After(w.onow()) {
			return w.now // due: it fires at the next batch
		}
		return w.trueAt(d)
	}
	for _, s := range v.StepsIn(core.StateRunning, core.StateRecovering) {
		sp, ok := v.StepSpecOf(s.ID)
		start, ok2 := w.startedTrue[s.ID]
		if !ok || !ok2 || sp.Timeout <= 0 || s.StartedAt.IsZero() {
			continue
		}
		d := s.StartedAt.Add(sp.Timeout)
		if s.TimeoutAt.After(d) {
			d = s.TimeoutAt
		}
		if at := fires(d); at.Sub(start) < sp.Timeout {
			w.fail(PropTimeoutNotEarly, fmt.Sprintf("the restored step %s's timeout is armed to fire %s after its START, before its timeout of %s (leader clock offset %s)", s.ID, at.Sub(start), sp.Timeout, w.skew))
			return
		}
	}
	for _, id := range v.RunIDs() {
		r, _, ok := v.Run(id)
		sub, ok2 := w.submittedTrue[id]
		if !ok || !ok2 || r.Finished || r.CancelReason != "" || r.Deadline.IsZero() {
			continue
		}
		if at := fires(r.Deadline); at.Sub(sub) < r.Spec.Timeout {
			w.fail(PropTimeoutNotEarly, fmt.Sprintf("the restored run %s's timeout is armed to fire %s after its submission, before its timeout of %s (leader clock offset %s)", id, at.Sub(sub), r.Spec.Timeout, w.skew))
			return
		}
	}
}

// props tracks what the properties need across batches.
type props struct {
	recoverAt map[core.StepID]time.Time // when each recovering step went recovering
	timeouts  *spec.Timeouts            // deadlines of running steps and runs (spec.PropTimeoutsFire)
	dispatch  *spec.Dispatches          // misses and silences (spec.PropMissedNotRedispatched); made at the first batch
	pool      *spec.Pool                // the world's view of workers and leases (spec.PropUnmatchedVerdict, PropScalerNoGrace, PropWelcomeCancel)
	held      *spec.HeldLeases          // leases held ahead (spec.PropHeldNotSilent); made at the first batch
	in        core.Input                // the input of the batch being stepped (nil for a restore's)
}

func newProps() *props {
	return &props{recoverAt: map[core.StepID]time.Time{}, timeouts: spec.NewTimeouts()}
}

// heldReported lists, for a reconnect Hello, the reported leases that are
// current right before the orchestrator handles it.
func (w *world) heldReported(in core.Input) map[core.StepID]core.LeaseID {
	w.props.in = in
	return spec.HeldReported(w.orch.o, in)
}

// checkBatch runs the properties over one batch, made for an input from
// worker from (empty for any other input). The recovery window is 2 × the
// workers' maximum reconnect delay (SPEC §4).
func (w *world) checkBatch(held map[core.StepID]core.LeaseID, from core.WorkerID, rd core.Ready) {
	p := w.props
	for _, t := range rd.Transitions {
		if t.Event == core.EvRetry {
			w.retries++
		}
	}
	now := w.onow()
	entered, left := spec.RecoveryChanges(rd)
	for _, id := range entered {
		p.recoverAt[id] = now
	}
	w.checkTimeoutNotEarly(rd)
	if v := spec.CheckProps(rd, now, 2*w.opt.MaxDelayWork, p.recoverAt, held); v != nil {
		w.fail(v.Invariant, v.Detail)
	}
	if p.in != nil {
		if v := spec.CheckUnmatchedRecords(w.view(), rd); v != nil {
			w.fail(v.Invariant, v.Detail)
		}
	}
	if v := spec.CheckReuse(w.view(), rd); v != nil {
		w.fail(v.Invariant, v.Detail)
	}
	if v := spec.CheckNoWriteFailures(w.view(), rd); v != nil {
		w.fail(v.Invariant, v.Detail)
	}
	if v := p.timeouts.Check(w.view(), rd, now); v != nil {
		w.fail(v.Invariant, v.Detail)
	}
	if p.dispatch == nil {
		p.dispatch = spec.NewDispatches(w.orch.o.Config().HeartbeatInterval)
	}
	if v := p.dispatch.Check(rd, now, from, w.workerOfConn); v != nil {
		w.fail(v.Invariant, v.Detail)
	}
	w.checkGrants(rd)
	if p.held == nil {
		p.held = spec.NewHeldLeases(w.orch.o.Config().HeartbeatInterval)
	}
	if r, ok := p.in.(core.Received); ok {
		switch m := r.Msg.(type) {
		case core.Held:
			w.ahead.Held++
			if w.heldBeyondSlots(m.Lease) {
				w.ahead.Beyond++
			}
		case core.Start:
			if p.held.Seen(m.Lease) {
				w.ahead.Started++
			}
		}
	}
	for _, e := range rd.Events {
		if e.Cause == core.CauseDispatchMissed && p.held.Seen(e.Lease) {
			w.ahead.Silent++
		}
	}
	if p.in != nil {
		p.held.Input(p.in)
	}
	if v := p.held.Check(w.orch.o, now); v != nil {
		w.fail(v.Invariant, v.Detail)
	}
	if v := spec.CheckChildRuns(w.view(), rd); v != nil {
		w.fail(v.Invariant, v.Detail)
	}
	if w.opt.Locks {
		if v := spec.CheckGroupCaps(w.orch.o); v != nil {
			w.fail(v.Invariant, v.Detail)
		}
		for _, e := range rd.Events {
			switch {
			case e.Kind == "run-group-wait":
				w.locks.Waits++
			case e.Kind == "run-group-admitted":
				w.locks.Admitted++
			case e.Kind == "run-cancel" && strings.HasPrefix(e.Message, "superseded"):
				w.locks.Superseded++
			case e.Kind == "run-scheduled":
				w.locks.Fired++
				w.fired = true
			}
		}
	}
	if v := p.poolView(w).Check(w.view(), now, p.in, rd); v != nil {
		w.fail(v.Invariant, v.Detail)
	}
	p.in = nil
	for _, id := range left {
		delete(p.recoverAt, id)
	}
}

// poolView returns the world's view of the pool, made at first use.
func (p *props) poolView(w *world) *spec.Pool {
	if p.pool == nil {
		p.pool = spec.NewPool()
	}
	return p.pool
}

// workerOfConn names the worker at the other end of a connection.
// heldBeyondSlots says whether the worker holding lease l holds more
// current leases than twice its slots, so more held ahead than its slots
// (at most its slots of them started, SPEC §3): ahead is not bounded by the
// slots.
func (w *world) heldBeyondSlots(l core.LeaseID) bool {
	lv, ok := w.orch.o.Lease(l)
	if !ok {
		return false
	}
	for _, wv := range w.orch.o.Workers() {
		if wv.ID == lv.Worker {
			return wv.Leases > 2*wv.Slots
		}
	}
	return false
}

func (w *world) workerOfConn(c core.ConnID) core.WorkerID {
	if cn := w.conns[c]; cn != nil {
		return w.workers[cn.worker].id
	}
	return ""
}

// inputFrom names the worker a message input comes from: the Hello's
// instance, or the worker of the connection; empty for other inputs.
func (w *world) inputFrom(in core.Input) core.WorkerID {
	r, ok := in.(core.Received)
	if !ok {
		return ""
	}
	if h, ok := r.Msg.(core.Hello); ok {
		return h.Worker
	}
	return w.workerOfConn(r.Conn)
}
