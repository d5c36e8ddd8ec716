package spec

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/tether-run/tether/core"
)

// Properties beyond the Checker's invariants. They need facts only a world
// knows — the workers' configured reconnect delays, what a worker said in its
// Hello — so the Checker cannot hold them; the simulator and the explorer
// both check them, with this code, after every orchestrator batch.
const (
	// PropGraceWindow: a step triaged for a grace expiry spent at least the
	// recovery window (2 × the worker's maximum reconnect delay, SPEC §4)
	// recovering. A shorter window fails steps whose worker was still within
	// its backoff schedule.
	PropGraceWindow = "GraceWindow"
	// PropInFlightHonoured: a lease a reconnecting worker reported in its
	// Hello, current at that moment, is never triaged as lost.
	PropInFlightHonoured = "InFlightHonoured"
	// PropOnlyReportedReclaimed: a reconnect Hello reclaims (recovering →
	// running) only leases the worker reported in it. A worker restarted
	// with its saved identity reports nothing (its processes died with the
	// old process, SPEC §9): reclaiming its steps would hold them, running,
	// on processes that do not exist.
	PropOnlyReportedReclaimed = "OnlyReportedReclaimed"
)

// HeldReported lists, for an input that is a reconnect Hello, the leases it
// reports that are current in o right before o handles it: none of those
// may be triaged as lost by the batch. Any other input gives nil.
func HeldReported(o *core.Orchestrator, in core.Input) map[core.StepID]core.LeaseID {
	r, ok := in.(core.Received)
	if !ok {
		return nil
	}
	h, ok := r.Msg.(core.Hello)
	if !ok || h.Credential == "" {
		return nil
	}
	held := map[core.StepID]core.LeaseID{}
	for _, ref := range h.InFlight {
		if o.Fence(h.Worker, ref.Lease) == nil {
			held[ref.Step] = ref.Lease
		}
	}
	return held
}

// RecoveryChanges lists the steps a batch sent into recovering and those it
// took out of it, in batch order. A world keeps, per recovering step, when
// it went recovering: it adds the entered steps before CheckProps and
// forgets the left ones after.
func RecoveryChanges(rd core.Ready) (entered, left []core.StepID) {
	for _, t := range rd.Transitions {
		switch {
		case t.Event == core.EvRecover:
			entered = append(entered, t.Step)
		case t.From == core.StateRecovering:
			left = append(left, t.Step)
		}
	}
	return entered, left
}

// CheckProps checks one orchestrator batch, made at now, against the three
// properties. grace is the recovery window; recoverAt says when each
// recovering step went recovering (the steps this batch sent there
// included); held is HeldReported of the batch's input.
func CheckProps(rd core.Ready, now time.Time, grace time.Duration, recoverAt map[core.StepID]time.Time, held map[core.StepID]core.LeaseID) *Violation {
	if held != nil { // a reconnect Hello
		for _, t := range rd.Transitions {
			if _, ok := held[t.Step]; t.From == core.StateRecovering && t.To == core.StateRunning && !ok {
				return &Violation{Invariant: PropOnlyReportedReclaimed, Detail: fmt.Sprintf(
					"step %s was reclaimed by a reconnect hello that did not report it", t.Step)}
			}
		}
	}
	for _, ev := range rd.Events {
		if ev.Step == "" {
			continue
		}
		if ev.Cause == core.CauseGraceExpired {
			if at, ok := recoverAt[ev.Step]; ok {
				if d := now.Sub(at); d < grace {
					return &Violation{Invariant: PropGraceWindow, Detail: fmt.Sprintf(
						"step %s was triaged for a grace expiry after only %s recovering; the window is 2 × %s = %s",
						ev.Step, d, grace/2, grace)}
				}
			}
		}
		if l, ok := held[ev.Step]; ok && ev.Cause == core.CauseLost {
			return &Violation{Invariant: PropInFlightHonoured, Detail: fmt.Sprintf(
				"the worker reported %s@%d, current, in its hello, yet the step was triaged as lost", ev.Step, l)}
		}
	}
	return nil
}

// CheckNoWriteFailures is invariant 9's safety half, checked as it happens:
// a no-write step is never failed for a lost worker (disconnect,
// stale-worker, revoked) — it is re-dispatched instead. A terminal state
// never changes, so this is what NoWriteStepsSurviveWorkerLoss finds at the
// end of a run, found at the batch that did it. o is the orchestrator after
// the batch rd.
func CheckNoWriteFailures(o View, rd core.Ready) *Violation {
	for _, t := range rd.Transitions {
		if t.To != core.StateFailed {
			continue
		}
		if sp, ok := o.StepSpecOf(t.Step); !ok || sp.Writes {
			continue
		}
		st, ok := o.StepByID(t.Step)
		if !ok {
			continue
		}
		if workerLost(st.Class) {
			return &Violation{Invariant: "NoWriteStepsSurviveWorkerLoss", Detail: fmt.Sprintf(
				"no-write step %s failed with class %s after %d attempts: %s", t.Step, st.Class, st.Attempts, st.Message)}
		}
	}
	return nil
}

// workerLost says whether a failure class blames a lost or stopped worker
// (disconnect, stale-worker, revoked, worker-stopped) rather than the step
// itself.
func workerLost(c core.FailureClass) bool {
	return c == core.ClassDisconnect || c == core.ClassStaleWorker || c == core.ClassRevoked || c == core.ClassWorkerStopped
}

// PropTimeoutsFire: a step is never running later than TimeoutSlack past its
// deadline (START + its timeout): by then it has failed step-timeout, or
// ended otherwise; and a run is never left uncancelled and unfinished later
// than TimeoutSlack past its deadline (submit + its timeout). Timeouts are
// timers at their deadlines (SPEC §5), not sweep phases. A deadline that
// passed while the orchestrator was down counts from its restart.
const PropTimeoutsFire = "TimeoutsFire"

// TimeoutSlack is how late past its deadline a timeout may take effect. The
// core fires timers at their deadlines; a world that delivers ticks on time
// sees no lateness at all.
const TimeoutSlack = time.Second

// Timeouts tracks the deadlines PropTimeoutsFire checks, batch by batch.
type Timeouts struct {
	steps map[core.StepID]time.Time // running steps with a timeout → deadline
	runs  map[core.RunID]time.Time  // runs with a timeout, neither cancelled nor finished → deadline
}

// NewTimeouts returns an empty tracker.
func NewTimeouts() *Timeouts {
	return &Timeouts{steps: map[core.StepID]time.Time{}, runs: map[core.RunID]time.Time{}}
}

// Reset forgets everything and learns the deadlines of o, just restored at
// now: a deadline already past counts from now (the orchestrator was down).
func (t *Timeouts) Reset(o View, now time.Time) {
	clear(t.steps)
	clear(t.runs)
	for _, s := range o.StepsIn(core.StateRunning) {
		t.learnStep(o, s.ID, now)
	}
	for _, id := range o.RunIDs() {
		if r, _, ok := o.Run(id); ok && !r.Finished && r.CancelReason == "" && !r.Deadline.IsZero() {
			t.runs[id] = latest(r.Deadline, now)
		}
	}
}

// Woke is the orchestrator process waking from a pause (the simulator's
// failover fault): frozen, it could fire nothing, so what fell due while it
// was is due at now, its first batch awake.
func (t *Timeouts) Woke(now time.Time) {
	for id, d := range t.steps {
		t.steps[id] = latest(d, now)
	}
	for id, d := range t.runs {
		t.runs[id] = latest(d, now)
	}
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func (t *Timeouts) learnStep(o View, id core.StepID, now time.Time) {
	s, ok1 := o.StepByID(id)
	sp, ok2 := o.StepSpecOf(id)
	if ok1 && ok2 && sp.Timeout > 0 && s.State == core.StateRunning {
		t.steps[id] = latest(s.StartedAt.Add(sp.Timeout), s.TimeoutAt) // a restore's re-armed window (SPEC §7)
	}
}

// Check checks batch rd, made at now by o (o as the batch left it): nothing
// tracked before the batch may be overdue by more than TimeoutSlack at now
// (it was running, or uncancelled, all along since the last batch); then it
// learns the batch's transitions and events.
func (t *Timeouts) Check(o View, rd core.Ready, now time.Time) *Violation {
	if id, d, ok := firstOverdue(t.steps, now); ok {
		sp, _ := o.StepSpecOf(id)
		return &Violation{Invariant: PropTimeoutsFire, Detail: fmt.Sprintf(
			"step %s was still running %s after its deadline (START + its timeout of %s)", id, now.Sub(d), sp.Timeout)}
	}
	if id, d, ok := firstOverdue(t.runs, now); ok {
		return &Violation{Invariant: PropTimeoutsFire, Detail: fmt.Sprintf(
			"run %s was neither cancelled nor finished %s after its deadline", id, now.Sub(d))}
	}
	for _, tr := range rd.Transitions {
		switch {
		case tr.To == core.StateRunning:
			t.learnStep(o, tr.Step, now)
		case tr.From == core.StateRunning:
			delete(t.steps, tr.Step)
		}
	}
	// A run is learnt, or forgotten, at its own events (submitted,
	// cancelled, finished), judged from its record, not the event's kind.
	for _, ev := range rd.Events {
		if ev.Step != "" {
			continue
		}
		r, _, ok := o.Run(ev.Run)
		if !ok || r.Finished || r.CancelReason != "" || r.Deadline.IsZero() {
			delete(t.runs, ev.Run)
		} else if _, known := t.runs[ev.Run]; !known {
			t.runs[ev.Run] = r.Deadline
		}
	}
	return nil
}

// firstOverdue returns the smallest id whose deadline is more than
// TimeoutSlack before now: the one a scan in sorted order would report
// first, without sorting every id each batch.
func firstOverdue[K ~string](m map[K]time.Time, now time.Time) (K, time.Time, bool) {
	var first K
	var at time.Time
	found := false
	for k, d := range m {
		if now.Sub(d) > TimeoutSlack && (!found || k < first) {
			first, at, found = k, d, true
		}
	}
	return first, at, found
}

// PropMissedNotRedispatched: a step is never dispatched to a worker that
// missed a dispatch-ack deadline for it and has not been heard from (sent
// any message) since, nor to a worker that has sent nothing for
// core.MaxSilentHeartbeats heartbeat intervals (SPEC §3, §8).
const PropMissedNotRedispatched = "MissedNotRedispatched"

type stepWorker struct {
	step   core.StepID
	worker core.WorkerID
}

// Dispatches tracks, for PropMissedNotRedispatched, the misses not yet lifted
// and when each worker was last heard from.
type Dispatches struct {
	heartbeat time.Duration // the orchestrator's heartbeat interval
	missed    map[stepWorker]bool
	heard     map[core.WorkerID]time.Time
}

// NewDispatches returns an empty tracker for an orchestrator whose heartbeat
// interval is heartbeat.
func NewDispatches(heartbeat time.Duration) *Dispatches {
	return &Dispatches{heartbeat: heartbeat, missed: map[stepWorker]bool{}, heard: map[core.WorkerID]time.Time{}}
}

// Check checks batch rd, made at now for an input from worker from (empty
// for any other input); workerOf names the worker of a connection. A miss
// of worker from in this very batch may have come before or after its
// input, so it is not held against it.
func (d *Dispatches) Check(rd core.Ready, now time.Time, from core.WorkerID, workerOf func(core.ConnID) core.WorkerID) *Violation {
	if from != "" {
		d.heard[from] = now
		for k := range d.missed {
			if k.worker == from {
				delete(d.missed, k)
			}
		}
	}
	for _, ev := range rd.Events {
		// A miss's events (the requeue, or the attempts-exhausted failure)
		// carry the cause and the worker that missed (SPEC §3, §5).
		if ev.Cause != core.CauseDispatchMissed || ev.Worker == "" {
			continue
		}
		if w := ev.Worker; w != from {
			d.missed[stepWorker{ev.Step, w}] = true
		}
	}
	for _, e := range rd.Messages {
		m, ok := e.Msg.(core.Dispatch)
		if !ok {
			continue
		}
		w := workerOf(e.Conn)
		if d.missed[stepWorker{m.Step, w}] {
			return &Violation{Invariant: PropMissedNotRedispatched, Detail: fmt.Sprintf(
				"step %s was dispatched (lease %d) to worker %s, which missed a dispatch-ack deadline for it and was not heard from since", m.Step, m.Lease, w)}
		}
		if at, ok := d.heard[w]; ok && now.Sub(at) >= core.MaxSilentHeartbeats*d.heartbeat {
			return &Violation{Invariant: PropMissedNotRedispatched, Detail: fmt.Sprintf(
				"step %s was dispatched (lease %d) to worker %s, silent for %s (%d heartbeat intervals of %s)", m.Step, m.Lease, w, now.Sub(at), core.MaxSilentHeartbeats, d.heartbeat)}
		}
	}
	return nil
}

// runSucceeded says whether batch rd finished a run whose every step
// ended well (none failed or was cancelled), judged from the steps' states, not from the event's text. o is
// the orchestrator after the batch.
func runSucceeded(o View, rd core.Ready) bool {
	for _, t := range rd.Transitions {
		if !t.To.Terminal() {
			continue
		}
		st, ok := o.StepByID(t.Step)
		if !ok {
			continue
		}
		r, _, ok := o.Run(st.Run)
		if !ok || !r.Finished {
			continue
		}
		all := true
		for _, id := range r.Steps {
			if s, ok := o.StepByID(id); !ok || s.State == core.StateFailed || s.State == core.StateCancelled {
				all = false
				break
			}
		}
		if all {
			return true
		}
	}
	return false
}

// PropHeldNotSilent is SPEC §3's hung-worker rule for leases held ahead: a
// held lease whose worker turns silent (§8: MaxSilentHeartbeats heartbeat
// intervals since its heartbeat clock last moved) is requeued as never
// started when the silence begins, so after every batch no current held
// lease belongs to a silent worker.
const PropHeldNotSilent = "HeldNotSilent"

// HeldLeases tracks the leases a world saw held (a Held, or a Hello
// listing a lease held) and checks PropHeldNotSilent over them.
type HeldLeases struct {
	silent time.Duration
	seen   map[core.LeaseID]bool
}

// NewHeldLeases returns an empty tracker for an orchestrator whose
// heartbeat interval is heartbeat.
func NewHeldLeases(heartbeat time.Duration) *HeldLeases {
	return &HeldLeases{silent: core.MaxSilentHeartbeats * heartbeat, seen: map[core.LeaseID]bool{}}
}

// Input notes the leases input in says are held.
func (h *HeldLeases) Input(in core.Input) {
	r, ok := in.(core.Received)
	if !ok {
		return
	}
	switch m := r.Msg.(type) {
	case core.Held:
		h.seen[m.Lease] = true
	case core.Hello:
		for _, ref := range m.InFlight {
			if ref.Held {
				h.seen[ref.Lease] = true
			}
		}
	}
}

// Seen says whether lease l was seen held and is not forgotten yet.
func (h *HeldLeases) Seen(l core.LeaseID) bool { return h.seen[l] }

// Check checks o after a batch made at now. Leases no longer current and
// held are forgotten.
func (h *HeldLeases) Check(o *core.Orchestrator, now time.Time) *Violation {
	if len(h.seen) == 0 {
		return nil
	}
	for _, id := range slices.Sorted(maps.Keys(h.seen)) {
		l, ok := o.Lease(id)
		if !ok || !l.Current || !l.Held {
			delete(h.seen, id)
			continue
		}
		// Workers' LastHeartbeat; zero for a worker that is gone.
		if hb, _ := o.WorkerClock(l.Worker); now.Sub(hb) >= h.silent {
			return &Violation{Invariant: PropHeldNotSilent, Detail: fmt.Sprintf(
				"lease %d of step %s is still held by worker %s, silent for %s (its heartbeat clock is at %s)", id, l.Step, l.Worker, now.Sub(hb), hb.Format(time.RFC3339Nano))}
		}
	}
	return nil
}
