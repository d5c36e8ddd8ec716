package core

import (
	"encoding/hex"
	"fmt"
	"sort"
	"strings"
	"time"
)

// receive handles one message from a worker connection.
func (o *Orchestrator) receive(in Received) {
	if h, ok := in.Msg.(Hello); ok {
		o.hello(in.Conn, h, in.Entropy)
		return
	}
	wid, ok := o.conns[in.Conn]
	if !ok {
		// A message before Hello, or on a connection already closed: the
		// connection has no identity, so nothing it says can change state.
		o.send(in.Conn, Close{Reason: fmt.Sprintf("protocol error: %s before hello", in.Msg.Kind()), Code: CloseProtocolError, Cause: CauseProtocol})
		return
	}
	w := o.workers[wid]
	if why := checkMsg(in.Msg); why != "" {
		// Beyond a limit of §12: nothing of it is applied.
		o.send(in.Conn, Close{Reason: "protocol error: " + why, Code: CloseProtocolError, Cause: CauseProtocol})
		o.disconnect(wid, "protocol error")
		return
	}
	o.heard(w)
	switch m := in.Msg.(type) {
	case Heartbeat:
		o.heartbeat(w, m)
	case Start:
		o.start(w, in.Conn, m)
	case Held:
		o.held(w, m.Lease)
	case RejectDispatch:
		o.rejectDispatch(w, m)
	case Report:
		o.report(w, in.Conn, m)
	case Logs:
		o.storeLogs(w, in.Conn, m.Lease, m.Lines, false)
	case Events:
		o.storeLogs(w, in.Conn, m.Lease, m.Events, true)
	case Refresh:
		o.refresh(w, in.Conn, m)
	case Drain:
		o.drain(w)
	default:
		o.send(in.Conn, Close{Reason: fmt.Sprintf("protocol error: unexpected %s from a worker", in.Msg.Kind()), Code: CloseProtocolError, Cause: CauseProtocol})
		o.disconnect(wid, "protocol error")
	}
}

// maxStepIDBytes bounds a step id a worker names (a lease reference, a
// report): "run-<n>/<name>[<i>]" with a name of at most MaxNameLength bytes.
const maxStepIDBytes = MaxNameLength + 64

// checkHello says which limit of SPEC §12 a Hello is beyond, or "".
func checkHello(h Hello) string {
	switch {
	case len(h.Token) > MaxCredentialBytes:
		return fmt.Sprintf("enrollment token of %d bytes, at most %d", len(h.Token), MaxCredentialBytes)
	case len(h.Credential) > MaxCredentialBytes:
		return fmt.Sprintf("session credential of %d bytes, at most %d", len(h.Credential), MaxCredentialBytes)
	case h.Slots < 1 || h.Slots > MaxWorkerSlots:
		return fmt.Sprintf("slots %d out of range 1..%d", h.Slots, MaxWorkerSlots)
	case h.Ahead < 0 || h.Ahead > MaxWorkerAhead:
		return fmt.Sprintf("ahead %d out of range 0..%d", h.Ahead, MaxWorkerAhead)
	case len(h.Tags) > MaxWorkerTags:
		return fmt.Sprintf("%d tags, at most %d", len(h.Tags), MaxWorkerTags)
	case len(h.Labels) > MaxWorkerLabels:
		return fmt.Sprintf("%d labels, at most %d", len(h.Labels), MaxWorkerLabels)
	case len(h.InFlight) > MaxInFlightLeases:
		return fmt.Sprintf("in-flight list of %d leases, at most %d", len(h.InFlight), MaxInFlightLeases)
	case len(h.InFlight) > h.Slots+h.Ahead:
		// A worker holds at most slots + ahead (§3), so a Hello never lists
		// more: a reconnect with fewer slots than it still holds would
		// leave the orchestrator holding more for it than it may. (Not
		// held ahead may be more than slots: a slot frees once its
		// lease's report is sent, before the answer.)
		return fmt.Sprintf("in-flight list of %d leases, more than slots %d + ahead %d", len(h.InFlight), h.Slots, h.Ahead)
	case h.Buffered < 0 || h.Buffered > MaxBufferedItems:
		return fmt.Sprintf("buffered count %d out of range 0..%d", h.Buffered, MaxBufferedItems)
	}
	if err := CheckName("worker instance id", string(h.Worker)); err != nil {
		return err.Error()
	}
	if h.Name != "" { // empty: the token's name (§9)
		if err := CheckName("worker name", h.Name); err != nil {
			return err.Error()
		}
	}
	if h.Platform != "" {
		if err := CheckName("platform", h.Platform); err != nil {
			return err.Error()
		}
	}
	for _, t := range h.Tags {
		if err := CheckName("tag", t); err != nil {
			return err.Error()
		}
	}
	for _, k := range sortedKeys(h.Labels) { // the first bad one, whatever the map order
		if err := CheckName("label key", k); err != nil {
			return err.Error()
		}
		if err := CheckName("label value", h.Labels[k]); err != nil {
			return fmt.Sprintf("label %s: %v", Quote(k), err)
		}
	}
	return checkRefs("hello", h.InFlight)
}

// checkRefs bounds a list of lease references (a Hello's or a Heartbeat's).
func checkRefs(kind string, refs []LeaseRef) string {
	if len(refs) > MaxInFlightLeases {
		return fmt.Sprintf("%s lists %d leases, at most %d", kind, len(refs), MaxInFlightLeases)
	}
	for _, r := range refs {
		if len(r.Step) > maxStepIDBytes {
			return fmt.Sprintf("%s names a step id of %d bytes, at most %d", kind, len(r.Step), maxStepIDBytes)
		}
	}
	return ""
}

// checkMsg says which limit of SPEC §12 a message after the Hello is
// beyond, or "". A report's limits are its own (it is answered REJECTED);
// Logs and Events are bounded by MaxLogLinesPerMessage in storeLogs.
func checkMsg(m Msg) string {
	switch m := m.(type) {
	case Heartbeat:
		return checkRefs("heartbeat", m.InFlight)
	case RejectDispatch:
		if len(m.Reason) > MaxRejectReasonBytes {
			return fmt.Sprintf("reject reason of %d bytes, at most %d", len(m.Reason), MaxRejectReasonBytes)
		}
	}
	return ""
}

func (o *Orchestrator) refuse(c ConnID, cause Cause, reason string, fatal bool) {
	o.send(c, Refused{Reason: reason, Fatal: fatal, Cause: cause})
	o.logf("warn", "connection refused", "reason", reason)
}

// hello enrolls a new instance (Token) or reconnects a known one (Credential).
func (o *Orchestrator) hello(c ConnID, h Hello, entropy [16]byte) {
	if old, ok := o.conns[c]; ok {
		o.send(c, Close{Reason: "protocol error: second hello on one connection", Code: CloseProtocolError, Cause: CauseProtocol})
		o.disconnect(old, "protocol error")
		return
	}
	if h.Version < MinProtocolVersion || h.Version > ProtocolVersion {
		o.refuse(c, CauseProtocol, fmt.Sprintf("protocol version %d not supported (want %d..%d)", h.Version, MinProtocolVersion, ProtocolVersion), true)
		return
	}
	if h.Worker == "" || len(h.Worker) > MaxNameLength {
		o.refuse(c, CauseProtocol, "hello without a valid worker instance id", true)
		return
	}
	if h.MaxDelay < 0 || h.MaxDelay > MaxReconnectDelay {
		// grace = 2 × MaxDelay: bounded, so it can neither overflow nor
		// hold a dead worker's steps for days.
		o.refuse(c, CauseLimit, fmt.Sprintf("max reconnect delay %s out of range 0..%s", h.MaxDelay, MaxReconnectDelay), true)
		return
	}
	if why := checkHello(h); why != "" {
		// Every field within §12's limits, on enrollment and on reconnect
		// alike: what a worker declares is stored and iterated for it.
		o.refuse(c, CauseLimit, why, true)
		return
	}
	if h.Token != "" {
		o.enroll(c, h, entropy)
		return
	}
	w := o.workers[h.Worker]
	wid, secret, _ := strings.Cut(h.Credential, ".")
	switch {
	case w == nil || WorkerID(wid) != h.Worker || !checkSecret(w.CredHash, secret):
		o.refuse(c, CauseBadCredential, "invalid session credential", true)
		return
	case w.Revoked:
		o.refuse(c, CauseTokenRevoked, "worker's enrollment token was revoked", true)
		return
	case !o.now.Before(w.CredExpiry):
		o.refuse(c, CauseCredentialExpired, "session credential expired; enroll again with a new token", true)
		return
	case w.Scaler:
		o.refuse(c, CauseScalerSingleUse, "scaler-managed worker instances are single-use; enroll a new instance", true)
		return
	}
	if oc, ok := o.connOf[w.ID]; ok {
		// The old socket is dead but its close was not seen yet.
		o.send(oc, Close{Reason: "superseded by a new connection", Cause: CauseSuperseded})
		o.disconnect(w.ID, "superseded by a new connection")
	}
	o.attach(c, w, h.Version)
	wasInactive := !w.Active
	w.Active = true
	w.clock = o.now
	w.GraceUntil = time.Time{}
	w.Draining = h.Draining // a restarted process (§9) is not draining
	// Slots and ahead are the process's own (§3): one restarted with a
	// smaller --slots or --ahead must not be sent what it would refuse as
	// busy, at a grant each.
	w.Slots, w.Ahead = h.Slots, h.Ahead
	offline := o.now.Sub(w.DisconnectedAt)
	w.DisconnectedAt = time.Time{}
	o.markWorker(w)
	o.heard(w)
	if wasInactive {
		o.logf("info", "worker reactivated", FieldWorker, string(w.ID))
	}
	cancel, lost := o.reconcile(w, h.InFlight, offline, h.Buffered)
	o.closedListed(w.ID, h.InFlight, true)
	o.send(c, Welcome{Worker: w.ID, CredentialTTL: o.cfg.CredentialTTL, Heartbeat: o.cfg.HeartbeatInterval,
		HeartbeatPhase: heartbeatPhase(o.now, o.cfg.HeartbeatInterval), Cancel: cancel})
	// A step the orchestrator holds for this worker that the worker did not
	// report was lost with its execution: triage it now.
	for _, id := range lost {
		l := o.leases[id]
		o.triage(o.steps[l.Step], l, CauseLost)
	}
	// Cancels of steps that were cancelling before the worker came back.
	for _, id := range o.sortedLeases(w.ID) {
		l := o.leases[id]
		if s := o.steps[l.Step]; s.State == StateCancelling {
			// The force deadline stands: a worker that keeps reconnecting
			// must not push it back.
			o.send(c, Cancel{Lease: l.ID, Reason: s.Message})
		}
	}
}

func (o *Orchestrator) enroll(c ConnID, h Hello, entropy [16]byte) {
	name, secret, ok := strings.Cut(h.Token, ".")
	t := o.tokens[name]
	switch {
	case !ok || name == "" || secret == "":
		o.refuse(c, CauseTokenUnknown, "malformed enrollment token (want <name>.<secret>)", true)
		return
	case t == nil || !checkSecret(t.Hash, secret):
		o.refuse(c, CauseTokenUnknown, "unknown enrollment token", true)
		return
	case t.Revoked:
		o.refuse(c, CauseTokenRevoked, fmt.Sprintf("enrollment token %q was revoked", name), true)
		return
	case t.Consumed:
		o.refuse(c, CauseTokenUsed, fmt.Sprintf("enrollment token %q was already used", name), true)
		return
	case !o.now.Before(t.ExpiresAt):
		o.refuse(c, CauseTokenExpired, fmt.Sprintf("enrollment token %q expired", name), true)
		return
	case o.workers[h.Worker] != nil:
		o.refuse(c, CauseAlreadyEnrolled, fmt.Sprintf("worker instance %s is already enrolled", h.Worker), true)
		return
	}
	cred := hex.EncodeToString(entropy[:])
	w := &WorkerRecord{
		ID: h.Worker, Name: h.Name, Token: name, Tags: sortedCopy(h.Tags), Labels: copyMap(h.Labels),
		Platform: h.Platform, Slots: h.Slots, Ahead: h.Ahead, Scaler: h.Scaler, Active: true,
		CredHash: hashSecret([]byte(cred)), CredExpiry: o.now.Add(o.cfg.CredentialTTL),
		LastHeartbeat: o.now, EnrolledAt: o.now, clock: o.now,
	}
	if w.Name == "" {
		w.Name = name
	}
	if !h.Scaler {
		w.Grace = 2 * h.MaxDelay
	}
	t.Consumed, t.Worker = true, w.ID
	o.markToken(t)
	o.workers[w.ID] = w
	o.markWorker(w)
	o.attach(c, w, h.Version)
	o.logf("info", "worker enrolled", FieldWorker, string(w.ID), "name", w.Name, "token", name)
	cancel := make([]LeaseID, 0, len(h.InFlight))
	for _, r := range h.InFlight {
		cancel = append(cancel, r.Lease)
	}
	sort.Slice(cancel, func(i, j int) bool { return cancel[i] < cancel[j] })
	o.send(c, Welcome{Worker: w.ID, Credential: string(w.ID) + "." + cred, CredentialTTL: o.cfg.CredentialTTL, Heartbeat: o.cfg.HeartbeatInterval,
		HeartbeatPhase: heartbeatPhase(o.now, o.cfg.HeartbeatInterval), Cancel: cancel})
}

func (o *Orchestrator) attach(c ConnID, w *WorkerRecord, version int) {
	o.conns[c] = w.ID
	if version < 2 {
		o.connV1[c] = true // §9: no LogAck on this connection
	} else {
		delete(o.connV1, c)
	}
	o.connOf[w.ID] = c
	o.arm(w.CredExpiry, tCred, string(w.ID))
}

func (o *Orchestrator) dropConn(c ConnID) {
	delete(o.connV1, c)
	if w, ok := o.conns[c]; ok {
		delete(o.conns, c)
		if o.connOf[w] == c {
			delete(o.connOf, w)
		}
	}
}

// reconcile compares a reconnecting worker's in-flight list with the leases
// the orchestrator holds for it (SPEC §4): reported current leases of
// recovering steps are reclaimed (START). It returns the reported leases that
// are not current, which the worker must cancel, and the held leases the
// worker did not report.
func (o *Orchestrator) reconcile(w *WorkerRecord, inflight []LeaseRef, offline time.Duration, buffered int) (cancel, lost []LeaseID) {
	reported := map[LeaseID]bool{}
	for _, r := range inflight {
		if o.committedTo(r.Lease, w.ID, r.Step) {
			// Its report was COMMITTED and the answer lost: the worker
			// re-sends the report and gets the same answer again (§3).
			continue
		}
		l := o.leases[r.Lease]
		if l == nil || l.Worker != w.ID || l.Step != r.Step || !l.Current {
			cancel = append(cancel, r.Lease)
			continue
		}
		reported[l.ID] = true
		s := o.steps[l.Step]
		if r.Held && s.State == StateQueued && !l.Started && !l.Held && w.Ahead > 0 {
			// Its Held was lost with the connection: the Hello says it (§3).
			o.hold(w, l)
		}
		if s.State == StateRecovering {
			l.Deadline = time.Time{}
			o.markLease(l)
			done := o.because(CauseReclaimed, s.ID, l)
			o.transition(s, EvStart)
			msg := fmt.Sprintf("worker %s reconnected after %s; step reclaimed", w.ID, DescribeDuration(offline.Truncate(time.Second)))
			o.event(s.Run, s.ID, "step-reclaimed", msg)
			done()
			o.logf("info", "Job recovered from agent reconnection", "recovery_duration", fmt.Sprint(offline.Milliseconds()),
				FieldWorker, string(w.ID), "step_id", string(s.ID), "run_id", string(s.Run),
				"buffered_messages_count", fmt.Sprint(buffered), FieldLease, fmt.Sprint(l.ID), FieldStep, string(s.ID), FieldRun, string(s.Run))
		}
	}
	for _, id := range o.sortedLeases(w.ID) {
		if !reported[id] {
			lost = append(lost, id)
		}
	}
	sort.Slice(cancel, func(i, j int) bool { return cancel[i] < cancel[j] })
	return cancel, lost
}

func (o *Orchestrator) sortedLeases(w WorkerID) []LeaseID {
	ids := make([]LeaseID, 0, len(o.workerLeases[w]))
	for id := range o.workerLeases[w] {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids
}

// disconnect handles a dropped control connection (SPEC §4).
func (o *Orchestrator) disconnect(wid WorkerID, reason string) {
	c, ok := o.connOf[wid]
	if !ok {
		return
	}
	o.dropConn(c)
	w := o.workers[wid]
	w.DisconnectedAt = o.now
	o.markWorker(w)
	o.logf("info", "worker disconnected", FieldWorker, string(wid), "reason", reason)
	if w.Scaler || w.Grace <= 0 {
		o.triageAll(w, CauseNoGrace)
		w.Active = false
		return
	}
	w.GraceUntil = o.now.Add(w.Grace)
	o.arm(w.GraceUntil, tGrace, string(w.ID))
	for _, id := range o.sortedLeases(wid) {
		l := o.leases[id]
		s := o.steps[l.Step]
		if s.State == StateRunning {
			l.Deadline = w.GraceUntil
			o.markLease(l)
			o.arm(l.Deadline, tLease, leaseKeyID(l.ID))
			done := o.because(CauseDisconnected, s.ID, l)
			o.transition(s, EvRecover)
			o.event(s.Run, s.ID, "step-recovering",
				fmt.Sprintf("worker %s disconnected; holding the step for %s", wid, DescribeDuration(w.Grace)))
			done()
		}
	}
}

// triageAll triages every in-flight step of a lost worker; cause is one of
// CauseGraceExpired, CauseNoGrace, CauseStaleWorker, CauseRevoked.
func (o *Orchestrator) triageAll(w *WorkerRecord, cause Cause) {
	for _, id := range o.sortedLeases(w.ID) {
		l := o.leases[id]
		o.triage(o.steps[l.Step], l, cause)
	}
}

// triage resolves one in-flight step of a lost worker (SPEC §4): never started →
// requeue; started no-write → requeue from the beginning; started
// write-bearing → failed, never re-dispatched. The attempt cap applies to
// requeues. A cancelling step cannot finish its cancel: it is forced.
func (o *Orchestrator) triage(s *StepRecord, l *LeaseRecord, cause Cause) {
	w := o.workers[l.Worker]
	if cause == CauseGraceExpired && (w.Scaler || w.Grace <= 0) {
		// A worker without a grace window (after a restart) had no recovery
		// window to miss: it is a scaler-managed or no-reconnect disconnect.
		cause = CauseNoGrace
	}
	defer o.because(cause, s.ID, l)()
	class, msg := ClassDisconnect, "agent disconnected and did not reconnect within the recovery window"
	switch cause {
	case CauseNoGrace:
		if w.Scaler {
			msg = "scaler-managed agent disconnected mid-execution"
		} else {
			msg = "agent disconnected with --no-reconnect mid-execution"
		}
	case CauseStaleWorker:
		class, msg = ClassStaleWorker, fmt.Sprintf("worker %s sent no heartbeat for %s", w.ID, DescribeDuration(o.now.Sub(w.clock).Truncate(time.Second)))
	case CauseRevoked:
		class, msg = ClassRevoked, fmt.Sprintf("worker %s's enrollment token was revoked", w.ID)
	case CauseLost:
		msg = fmt.Sprintf("worker %s reconnected without this step: its execution was lost", w.ID)
	}
	o.sendTo(w.ID, Cancel{Lease: l.ID, Reason: msg})
	switch s.State {
	case StateQueued:
		o.endLease(l, "never started: "+msg)
		o.requeue(s, msg)
	case StateRunning, StateRecovering:
		if s.State == StateRunning {
			o.transition(s, EvRecover)
		}
		if o.specOf[s.ID].Writes {
			o.fail(s, class, msg+"; write-bearing step not re-dispatched")
			return
		}
		o.redispatchFromStart(s, l, msg)
	case StateCancelling:
		o.event(s.Run, s.ID, "step-cancelled", "cancel forced: "+msg)
		o.transition(s, EvCancelForce)
	default:
		panic(fmt.Sprintf("core: triage of step %s in state %s with current lease %d", s.ID, s.State, l.ID))
	}
}

// requeue puts a never-started queued step (lease already ended) back in the
// ready queue, or fails it when a new grant would exceed the attempt cap.
func (o *Orchestrator) requeue(s *StepRecord, why string) {
	if s.Attempts >= o.cfg.MaxAttempts {
		o.fail(s, ClassAttemptsExhausted, fmt.Sprintf("step was dispatched %d times without completing; last: %s", s.Attempts, why))
		return
	}
	s.QueuedAt = o.now
	o.markStep(s)
	o.event(s.Run, s.ID, "step-requeued", "requeued, never started: "+why)
}

// heartbeat moves the worker's heartbeat clock, in memory only (§8): a
// heartbeat that changes nothing else writes no record.
func (o *Orchestrator) heartbeat(w *WorkerRecord, h Heartbeat) {
	w.clock = o.now
	if !w.Active {
		w.Active = true
		o.markWorker(w)
		o.logf("info", "worker reactivated", FieldWorker, string(w.ID))
	}
	for _, r := range h.InFlight {
		if o.committedTo(r.Lease, w.ID, r.Step) {
			continue // the answer to its report is on its way, or will be again
		}
		l := o.leases[r.Lease]
		if l == nil || l.Worker != w.ID || !l.Current {
			o.sendTo(w.ID, Cancel{Lease: r.Lease, Reason: "lease is no longer current"})
		}
	}
	o.closedListed(w.ID, h.InFlight, false)
}

// leaseFor finds a lease the worker may speak for, or says why not.
func (o *Orchestrator) leaseFor(w *WorkerRecord, id LeaseID) (*LeaseRecord, string) {
	l := o.leases[id]
	switch {
	case l == nil:
		return nil, fmt.Sprintf("unknown lease %d", id)
	case l.Worker != w.ID:
		return nil, fmt.Sprintf("lease %d belongs to another worker", id)
	}
	return l, ""
}

// start is the start handshake: START is recorded (and, by the driver,
// persisted) before the StartAck that lets a write-bearing process run.
func (o *Orchestrator) start(w *WorkerRecord, c ConnID, m Start) {
	l, why := o.leaseFor(w, m.Lease)
	if l == nil {
		if e := o.closedFind(w.ID, m.Lease); e != nil {
			why = "lease is no longer current: its run finished"
			o.closedHold(w.ID, e)
		}
		o.send(c, StartAck{Lease: m.Lease, Request: m.Request, Reason: why})
		return
	}
	if !l.Current {
		o.send(c, StartAck{Lease: m.Lease, Request: m.Request, Reason: "lease is no longer current: " + l.EndReason})
		return
	}
	s := o.steps[l.Step]
	switch s.State {
	case StateQueued:
		l.Started, l.Held = true, false
		l.Deadline = time.Time{}
		o.markLease(l)
		o.transition(s, EvStart)
	case StateRecovering:
		l.Deadline = time.Time{}
		o.markLease(l)
		o.transition(s, EvStart)
	case StateCancelling:
		o.send(c, StartAck{Lease: m.Lease, Request: m.Request, Reason: "step is being cancelled"})
		return
	}
	o.send(c, StartAck{Lease: m.Lease, Request: m.Request, OK: true})
}

// held records that the worker holds a dispatched lease ahead, not started
// (SPEC §3 lease-ahead): the dispatch-ack deadline no longer applies; the
// lease is requeued if the worker turns silent (§8) before starting it.
func (o *Orchestrator) held(w *WorkerRecord, id LeaseID) {
	l, _ := o.leaseFor(w, id)
	if l == nil || !l.Current || l.Started || l.Held {
		return
	}
	if s := o.steps[l.Step]; s.State != StateQueued {
		return
	}
	if w.Ahead == 0 {
		// A worker that declared no ahead cannot shelve a step: the lease
		// keeps its dispatch-ack deadline. (One that declared some holds
		// at most slots + ahead leases, as granted; the count of its held
		// ones is not checked here, as a lost Start can leave a started
		// lease looking held for a while.)
		return
	}
	o.hold(w, l)
}

// hold marks l held: its deadline becomes the instant its worker turns
// silent, re-armed from the worker's heartbeat clock when it fires (fire).
func (o *Orchestrator) hold(w *WorkerRecord, l *LeaseRecord) {
	l.Held = true
	l.Deadline = w.clock.Add(MaxSilentHeartbeats * o.cfg.HeartbeatInterval)
	o.markLease(l)
	o.arm(l.Deadline, tLease, leaseKeyID(l.ID))
}

func (o *Orchestrator) rejectDispatch(w *WorkerRecord, m RejectDispatch) {
	l, _ := o.leaseFor(w, m.Lease)
	if l == nil || !l.Current {
		return
	}
	s := o.steps[l.Step]
	if s.State != StateQueued || l.Started {
		return
	}
	why := fmt.Sprintf("worker %s rejected the dispatch: %s", w.ID, m.Reason)
	defer o.because(CauseDispatchRejected, s.ID, l)()
	s.RejectedBy = w.ID
	o.endLease(l, why)
	o.requeue(s, why)
}

// report answers complete|fail with exactly one of COMMITTED, CANCELLED,
// REJECTED (SPEC §3). Repeats of an answered report get the same answer.
func (o *Orchestrator) report(w *WorkerRecord, c ConnID, m Report) {
	reply := func(v Verdict, reason string) {
		o.send(c, Answer{Lease: m.Lease, Request: m.Request, Verdict: v, Reason: reason})
	}
	if m.Request == 0 || m.Outcome.Status < OutcomeSuccess || m.Outcome.Status > OutcomeTimedOut {
		reply(Rejected, "malformed report")
		return
	}
	if len(m.Outcome.Message) > MaxOutcomeMessageBytes {
		reply(Rejected, fmt.Sprintf("malformed report: outcome message of %d bytes, at most %d", len(m.Outcome.Message), MaxOutcomeMessageBytes))
		return
	}
	if len(m.Step) > maxStepIDBytes {
		reply(Rejected, fmt.Sprintf("malformed report: step id of %d bytes, at most %d", len(m.Step), maxStepIDBytes))
		return
	}
	l, why := o.leaseFor(w, m.Lease)
	if l == nil {
		if e := o.closedFind(w.ID, m.Lease); e != nil {
			o.reportClosed(w, e, m, reply)
			return
		}
		reply(Rejected, why)
		return
	}
	if l.Step != m.Step {
		reply(Rejected, fmt.Sprintf("lease %d is not a lease of step %s", l.ID, m.Step))
		return
	}
	for _, a := range l.Answers {
		if a.Request == m.Request {
			if a.Outcome == m.Outcome {
				reply(a.Verdict, a.Reason)
			} else {
				reply(Rejected, "conflicting duplicate: request already answered with a different outcome")
			}
			return
		}
	}
	record := func(v Verdict, reason string) {
		l.Answers = append(l.Answers, AnsweredReport{Request: m.Request, Outcome: m.Outcome, Verdict: v, Reason: reason})
		o.markLease(l)
		reply(v, reason)
	}
	if l.Committed {
		// Not recorded: a stream of conflicting reports must not grow the lease.
		reply(Rejected, "a different completion for this lease was already committed")
		return
	}
	if !l.Current {
		if len(l.Answers) >= MaxAnswersPerLease {
			// Still the same answer, but a worker inventing request ids
			// for a dead lease must not grow its record.
			reply(Cancelled, "lease lost authority: "+l.EndReason)
			return
		}
		record(Cancelled, "lease lost authority: "+l.EndReason)
		return
	}
	s := o.steps[l.Step]
	sp := o.specOf[s.ID]
	switch s.State {
	case StateCancelling:
		if m.Outcome.Status == OutcomeCleanupFailed {
			o.commitLease(l, c)
			s.Outcome = &m.Outcome
			record(Committed, "")
			o.fail(s, ClassCleanup, "cancel cleanup failed: "+m.Outcome.Message)
			return
		}
		record(Cancelled, "step was cancelled")
		o.event(s.Run, s.ID, "step-cancelled", "worker stopped the step")
		o.transition(s, EvComplete)
		return
	}
	if m.Outcome.Status == OutcomeWorkerStopped {
		o.workerStopped(w, c, s, l, m.Outcome, record)
		return
	}
	switch s.State {
	case StateQueued:
		if sp.Writes {
			record(Rejected, "write-bearing step reported without a recorded start")
			return
		}
		l.Started = true
		o.transition(s, EvStart)
	case StateRecovering:
		o.transition(s, EvStart)
	}
	if s.State != StateRunning {
		panic(fmt.Sprintf("core: report on current lease %d of step %s in state %s", l.ID, s.ID, s.State))
	}
	o.commitLease(l, c)
	s.Outcome = &m.Outcome
	record(Committed, "")
	switch m.Outcome.Status {
	case OutcomeSuccess:
		o.transition(s, EvSucceed)
	case OutcomeCancelled, OutcomeCleanupFailed:
		// The worker stopped a step nobody asked it to cancel: say so rather
		// than claim an exit code it never reported.
		msg := fmt.Sprintf("worker reported the step %s although no cancel was requested", m.Outcome.Status)
		if m.Outcome.Message != "" {
			msg += ": " + m.Outcome.Message
		}
		o.fail(s, ClassExecution, msg)
	case OutcomeTimedOut:
		// The worker enforced the dispatched timeout itself (§10).
		msg := fmt.Sprintf("step exceeded its timeout of %s; its worker stopped it", DescribeDuration(sp.Timeout))
		if m.Outcome.Message != "" {
			msg += ": " + m.Outcome.Message
		}
		o.retryOrFail(s, ClassStepTimeout, msg, sp.Retry != nil && sp.Retry.OnTimeout)
	default:
		msg := fmt.Sprintf("step exited with code %d", m.Outcome.ExitCode)
		if m.Outcome.Message != "" {
			msg += ": " + m.Outcome.Message
		}
		o.retryOrFail(s, ClassExecution, msg, sp.Retry != nil && sp.Retry.RetriesExit(m.Outcome.ExitCode))
	}
}

// commitLease marks l committed by a report that came on connection c.
// Its log closes with it unless c speaks protocol version 1 (SPEC §3): a
// version 2 worker reports only once its output is acknowledged, a version
// 1 worker may replay buffered output after its report.
func (o *Orchestrator) commitLease(l *LeaseRecord, c ConnID) {
	l.Committed = true
	l.LogClosed = !o.connV1[c]
}

// workerStopped settles a current lease whose worker stopped its process
// because the worker itself was stopped (a second SIGTERM, or the drain
// timeout: §4). It is triage by the worker's own word: a step that never
// started is requeued as never started, a started no-write step is requeued
// from the beginning (both answered CANCELLED; the attempt cap applies), and
// a started write-bearing step fails, class worker-stopped (its report is
// COMMITTED): it may have written, so it is never re-dispatched.
func (o *Orchestrator) workerStopped(w *WorkerRecord, c ConnID, s *StepRecord, l *LeaseRecord, out Outcome, record func(Verdict, string)) {
	msg := fmt.Sprintf("worker %s was stopped before the step finished", w.ID)
	defer o.because(CauseWorkerStopped, s.ID, l)()
	if out.Message != "" {
		msg += ": " + out.Message
	}
	switch {
	case s.State == StateQueued:
		record(Cancelled, "worker stopped before the step started")
		o.endLease(l, "never started: "+msg)
		o.requeue(s, msg)
	case o.specOf[s.ID].Writes:
		if s.State == StateRecovering {
			o.transition(s, EvStart)
		}
		o.commitLease(l, c)
		s.Outcome = &out
		record(Committed, "")
		o.fail(s, ClassWorkerStopped, msg+"; write-bearing step not re-dispatched")
	default:
		record(Cancelled, "worker stopped the step; it is re-dispatched")
		if s.State == StateRunning {
			o.transition(s, EvRecover)
		}
		o.redispatchFromStart(s, l, msg)
	}
}

// redispatchFromStart ends a started no-write step's lease (the step is
// recovering) and queues it to run again from the beginning (REQUEUE, §1,
// §4), or fails it when that would need a grant beyond the attempt cap.
func (o *Orchestrator) redispatchFromStart(s *StepRecord, l *LeaseRecord, msg string) {
	o.endLease(l, msg)
	if s.Attempts >= o.cfg.MaxAttempts {
		o.fail(s, ClassAttemptsExhausted, fmt.Sprintf("step was dispatched %d times without completing; last: %s", s.Attempts, msg))
		return
	}
	o.transition(s, EvRequeue)
	o.event(s.Run, s.ID, "step-requeued", "no-write step re-dispatched from the beginning: "+msg)
}

// drain marks a worker draining (§4): dispatch skips it from now on. Its
// leases are untouched: it finishes and reports them.
func (o *Orchestrator) drain(w *WorkerRecord) {
	if w.Draining {
		return // a draining worker says it again after every Welcome
	}
	w.Draining = true
	o.markWorker(w)
	o.logf("info", "worker draining", FieldWorker, string(w.ID), "leases", fmt.Sprint(len(o.workerLeases[w.ID])))
}

// MaxAnswersPerLease bounds the answers remembered for one lease.
const MaxAnswersPerLease = 16

// MaxLogLinesPerMessage bounds one Logs/Events message.
const MaxLogLinesPerMessage = 10000

// lineID identifies a stored line for deduplication: log lines and events
// have separate sequences; a gap marker (sequence 0) is identified by its
// timestamp and text, so a duplicated marker is not counted twice.
type lineID struct {
	event bool
	seq   uint64
	at    int64
	text  string
}

// stepOf returns a lease's step, nil if either is unknown.
func (o *Orchestrator) stepOf(l *LeaseRecord) *StepRecord {
	if l == nil {
		return nil
	}
	return o.steps[l.Step]
}

// LogLinesRefused is the message of the orchestrator's log line for log
// lines it refused (a lease without authority, or too many in one message):
// its fields "lines" and "bytes" count them, and the driver's metrics do too
// (SPEC §16).
const LogLinesRefused = "log lines refused"

func idOf(ln LogLine, event bool) lineID {
	if ln.Seq != 0 {
		return lineID{event: event, seq: ln.Seq}
	}
	return lineID{event: event, at: ln.At.UnixNano(), text: ln.Text}
}

// storeLogs keeps a current lease's log lines and events, deduplicated (see
// lineID), in arrival order. Lines of a lease whose log is closed
// (LeaseRecord.LogOpen) are refused: logs are writes, and writes are
// fenced. A worker sends its report only once all the lease's output is
// acknowledged (§10), so closing the log at the commit loses none of it,
// and a closed log's length is final (a live stream's cursor relies on it,
// SPEC §17).
//
// Every message is answered with a LogAck on its connection (protocol
// version 2, §3): the highest sequence numbers up to which the lease's lines
// and events are all stored. Refused lines are acknowledged as discarded (up
// to the greatest sequence number of the message): a lease that lost
// authority never regains it, so they could never be stored, and the worker
// must not hold them, nor stall on them, forever. The ack is a message of
// this batch: it leaves only once the stored lines are durable (§11).
func (o *Orchestrator) storeLogs(w *WorkerRecord, c ConnID, id LeaseID, lines []LogLine, event bool) {
	l, _ := o.leaseFor(w, id)
	if l != nil && l.Committed && o.allStored(id, lines, event) {
		// A duplicate of stored lines (a network that delivers twice) is
		// answered as it was before the commit, not refused.
		o.ackLogs(c, id, o.logWatermark(id, false), o.logWatermark(id, true))
		return
	}
	if l == nil || !l.LogOpen() || len(lines) > MaxLogLinesPerMessage {
		var size int
		for _, ln := range lines {
			size += LineBytes(ln.Text)
		}
		kv := []string{FieldWorker, string(w.ID), FieldLease, fmt.Sprint(id)}
		if s := o.stepOf(l); s != nil {
			kv = append(kv, FieldStep, string(s.ID), FieldRun, string(s.Run))
		}
		o.logf("warn", LogLinesRefused, append(kv, "lines", fmt.Sprint(len(lines)), "bytes", fmt.Sprint(size))...)
		var top uint64
		for _, ln := range lines {
			top = max(top, ln.Seq)
		}
		if event {
			o.ackLogs(c, id, 0, top)
		} else {
			o.ackLogs(c, id, top, 0)
		}
		return
	}
	seen := o.logSeen[id]
	if seen == nil {
		seen = &logDedup{}
		o.logSeen[id] = seen
	}
	for _, ln := range lines {
		k := idOf(ln, event)
		if seen.has(k) {
			continue
		}
		seen.add(k)
		sl := StepLogLine{Step: l.Step, Lease: id, Index: len(o.logs[id]), Event: event, Line: ln}
		o.logs[id] = append(o.logs[id], sl)
		o.appends = append(o.appends, Record{Key: logKey(id, sl.Index), Value: encodeScratch(&o.scratch, sl)})
	}
	o.ackLogs(c, id, o.logWatermark(id, false), o.logWatermark(id, true))
}

// allStored reports whether every one of lines is stored under lease id.
func (o *Orchestrator) allStored(id LeaseID, lines []LogLine, event bool) bool {
	seen := o.logSeen[id]
	for _, ln := range lines {
		if seen == nil || !seen.has(idOf(ln, event)) {
			return false
		}
	}
	return true
}

// ackLogs sends a LogAck unless the connection speaks protocol version 1.
func (o *Orchestrator) ackLogs(c ConnID, id LeaseID, lines, events uint64) {
	if !o.connV1[c] {
		o.send(c, LogAck{Lease: id, Lines: lines, Events: events})
	}
}

// logWatermark is the highest n such that lines (events) 1..n of the lease
// are all stored: logDedup's watermark.
func (o *Orchestrator) logWatermark(id LeaseID, event bool) uint64 {
	if d := o.logSeen[id]; d != nil {
		return d.mark[lineKind(event)]
	}
	return 0
}

// logDedup is a lease's set of stored lines (lineID): for each kind, a
// watermark below which every sequence number is stored (lines nearly
// always arrive in order, so this is all of them), and a set of the lines
// above it (out of order, and gap markers, whose sequence number is 0).
// has and add answer exactly as a set of every stored lineID would.
type logDedup struct {
	mark  [2]uint64 // lines 1..mark[kind] are all stored; kind 0 lines, 1 events
	above map[lineID]bool
}

func lineKind(event bool) int {
	if event {
		return 1
	}
	return 0
}

func (d *logDedup) has(k lineID) bool {
	if k.seq != 0 && k.seq <= d.mark[lineKind(k.event)] {
		return true
	}
	return d.above[k]
}

// add records k, which has reports absent.
func (d *logDedup) add(k lineID) {
	i := lineKind(k.event)
	if k.seq == 0 || k.seq != d.mark[i]+1 {
		if d.above == nil {
			d.above = map[lineID]bool{}
		}
		d.above[k] = true
		return
	}
	d.mark[i]++
	for len(d.above) > 0 {
		next := lineID{event: k.event, seq: d.mark[i] + 1}
		if !d.above[next] {
			break
		}
		delete(d.above, next)
		d.mark[i]++
	}
}

func (o *Orchestrator) refresh(w *WorkerRecord, c ConnID, m Refresh) {
	if !o.now.Before(w.CredExpiry) {
		o.send(c, Close{Reason: "session credential expired", Code: ClosePolicy, Cause: CauseCredentialExpired})
		o.disconnect(w.ID, "credential expired")
		return
	}
	w.CredExpiry = o.now.Add(o.cfg.CredentialTTL)
	o.markWorker(w)
	o.arm(w.CredExpiry, tCred, string(w.ID))
	o.send(c, Refreshed{Request: m.Request, TTL: o.cfg.CredentialTTL})
}

// ---- timers ----

func (o *Orchestrator) fire(t timer) {
	switch t.kind {
	case tSweep:
		o.sweep()
	case tLease:
		l := o.leases[parseLeaseKey(t.key)]
		s := o.steps[l.Step]
		switch s.State {
		case StateQueued:
			why := fmt.Sprintf("dispatch not started by worker %s within the deadline", l.Worker)
			if l.Held {
				w := o.workers[l.Worker]
				silent := MaxSilentHeartbeats * o.cfg.HeartbeatInterval
				if o.now.Sub(w.clock) < silent {
					o.hold(w, l) // heard from since: watch the new window
					break
				}
				// The hung-worker rule (§3, §8): a held lease of a silent
				// worker is requeued as never started and the step
				// records the miss, as a missed dispatch-ack deadline.
				why = fmt.Sprintf("held ahead by worker %s, silent for %s", l.Worker, DescribeDuration(o.now.Sub(w.clock).Truncate(time.Second)))
			}
			done := o.because(CauseDispatchMissed, s.ID, l)
			o.sendTo(l.Worker, Cancel{Lease: l.ID, Reason: why})
			o.endLease(l, "never started: "+why)
			o.miss(s, l.Worker)
			o.requeue(s, why)
			done()
		case StateRecovering:
			o.triage(s, l, CauseGraceExpired)
		}
	case tGrace:
		w := o.workers[WorkerID(t.key)]
		w.Active = false
		w.GraceUntil = time.Time{}
		o.markWorker(w)
		o.logf("info", "worker deregistered: grace window expired", FieldWorker, string(w.ID))
		o.triageAll(w, CauseGraceExpired)
	case tCred:
		w := o.workers[WorkerID(t.key)]
		o.sendTo(w.ID, Close{Reason: "session credential expired", Code: ClosePolicy, Cause: CauseCredentialExpired})
		o.disconnect(w.ID, "credential expired")
	case tForce:
		s := o.steps[StepID(t.key)]
		if s.Lease != 0 {
			l := o.leases[s.Lease]
			o.sendTo(l.Worker, Cancel{Lease: l.ID, Reason: "cancel forced"})
		}
		o.event(s.Run, s.ID, "step-cancelled", fmt.Sprintf("cancel forced after %s", DescribeDuration(o.cfg.ForceCancel)))
		o.transition(s, EvCancelForce)
	case tSchedule:
		o.fireSchedule(o.schedules[t.key])
	case tWait:
		s := o.steps[StepID(t.key)]
		s.WaitUntil = time.Time{}
		o.transition(s, EvTimerDone)
		o.afterQueued(s)
	case tHold:
		s := o.steps[StepID(t.key)]
		s.HoldUntil = time.Time{}
		s.Class, s.Message = ClassGate, "hold expired without approval"
		o.event(s.Run, s.ID, "step-expired", s.Message)
		o.transition(s, EvExpire)
	case tStepTimeout:
		s := o.steps[StepID(t.key)]
		l := o.leases[s.Lease]
		msg := fmt.Sprintf("step exceeded its timeout of %s", DescribeDuration(o.specOf[s.ID].Timeout))
		o.sendTo(l.Worker, Cancel{Lease: l.ID, Reason: msg})
		done := o.because(CauseStepTimeout, s.ID, l)
		sp := o.specOf[s.ID]
		o.retryOrFail(s, ClassStepTimeout, msg, sp.Retry != nil && sp.Retry.OnTimeout)
		done()
	case tRunTimeout:
		r := o.runs[RunID(t.key)]
		o.cancelRun(r, ClassRunTimeout, fmt.Sprintf("run exceeded its timeout of %s", DescribeDuration(r.Spec.Timeout)))
	}
}

// sweep is the recovery sweeper (SPEC §5), always on, in two phases; step and
// run timeouts are timers of their own (tStepTimeout, tRunTimeout).
func (o *Orchestrator) sweep() {
	o.meta.NextSweep = o.now.Add(o.cfg.SweepInterval)
	o.arm(o.meta.NextSweep, tSweep, "")
	o.markMeta()
	// 1. Stale workers: connected but silent past the heartbeat timeout.
	for _, id := range sortedKeys(o.workers) {
		w := o.workers[id]
		if !w.Active || !o.connected(w.ID) || o.now.Sub(w.clock) < o.cfg.HeartbeatTimeout {
			continue
		}
		w.Active = false
		o.markWorker(w)
		o.logf("warn", "worker marked inactive: no heartbeat", FieldWorker, string(w.ID))
		o.triageAll(w, CauseStaleWorker)
	}
	// 2. Entries of the closed-lease table nobody can present any more,
	// then workers and tokens gone for longer than the retention.
	o.expireClosed()
	o.pruneGone()
	// 3. Unmatched steps.
	for _, id := range sortedKeys(o.ready) {
		s := o.steps[id]
		// The wait starts over at a restore (§7): QueuedAt may be another
		// host's clock, and a skew must not shorten the window.
		if o.now.Sub(latestTime(s.QueuedAt, o.restoredAt)) < o.cfg.UnmatchedTimeout || o.anyActiveMatch(s) {
			continue
		}
		done := o.because(CauseUnmatched, s.ID, nil)
		o.fail(s, ClassUnmatched, "No active worker with required tags to run this step"+o.requirement(s))
		done()
	}
}

func (o *Orchestrator) requirement(s *StepRecord) string {
	sp := o.specOf[s.ID]
	var parts []string
	if len(s.RequiredTags) > 0 {
		parts = append(parts, "tags "+strings.Join(s.RequiredTags, ","))
	}
	if sp.Target != "" {
		parts = append(parts, "target "+sp.Target)
	}
	if len(sp.Labels) > 0 {
		parts = append(parts, "labels "+describeMap(sp.Labels))
	}
	if sp.Platform != "" {
		parts = append(parts, "platform "+sp.Platform)
	}
	if len(parts) == 0 {
		return ""
	}
	return " (needs " + strings.Join(parts, "; ") + ")"
}

func (o *Orchestrator) anyActiveMatch(s *StepRecord) bool {
	for _, w := range o.workers {
		if w.Active && !w.Revoked && o.matches(w, s) {
			return true
		}
	}
	return false
}

// matches is SPEC §8: target → labels → platform → tags ⊆ worker tags.
func (o *Orchestrator) matches(w *WorkerRecord, s *StepRecord) bool {
	sp := o.specOf[s.ID]
	if sp.Target != "" && sp.Target != w.Name {
		return false
	}
	for k, v := range sp.Labels {
		if wv, ok := w.Labels[k]; !ok || wv != v {
			return false
		}
	}
	if sp.Platform != "" && sp.Platform != w.Platform {
		return false
	}
	for _, t := range s.RequiredTags {
		i := sort.SearchStrings(w.Tags, t)
		if i == len(w.Tags) || w.Tags[i] != t {
			return false
		}
	}
	return true
}

// ---- scheduling ----

// dispatch grants leases to ready steps, oldest first (a cross-level ready
// queue), each to the least-loaded matching worker with a free slot.
func (o *Orchestrator) dispatch() {
	if len(o.ready) == 0 {
		return
	}
	// Most inputs of a busy orchestrator free no slot: one pass over the
	// pool finds the free workers, and only they are sorted (by id: ties go
	// to the smaller id, so map order decides nothing).
	var free []*WorkerRecord
	slots := 0 // free slots and room ahead left among the free workers
	silent := MaxSilentHeartbeats * o.cfg.HeartbeatInterval
	for id, w := range o.workers {
		if w.Active && !w.Revoked && !w.Draining && o.connected(id) && len(o.workerLeases[id]) < w.Slots+w.Ahead && o.now.Sub(w.clock) < silent {
			free = append(free, w)
			slots += w.Slots + w.Ahead - len(o.workerLeases[id])
		}
	}
	if len(free) == 0 {
		return
	}
	sort.Slice(free, func(i, j int) bool { return free[i].ID < free[j].ID })
	queue := o.readyQueue()
	inflight := map[string]int{} // forEach group → steps holding a lease
	for i := 0; i < len(queue) && slots > 0; i++ {
		e := queue[i]
		if !o.readyLive(e) {
			continue // stale entry
		}
		s := o.steps[e.id]
		sp := o.specOf[s.ID]
		group := string(s.Run) + "/" + s.Name
		if sp.Concurrency > 0 {
			n, ok := inflight[group]
			if !ok {
				for _, id := range instanceIDs(s.Run, sp) {
					if o.steps[id].Lease != 0 {
						n++
					}
				}
			}
			inflight[group] = n
			if n >= sp.Concurrency {
				continue
			}
		}
		if sp.Group.Name != "" && len(o.groupHeld[sp.Group.Name]) >= sp.Group.limit() {
			continue // its step group is full (SPEC §8a)
		}
		// A worker with a free slot before one with only room ahead (§3);
		// then the least-loaded matching worker wins, ties to the smaller
		// id; the worker that last rejected this step only when no other
		// can take it; a worker that missed its dispatch-ack deadline
		// never (§8).
		var best *WorkerRecord
		better := func(w *WorkerRecord) bool {
			if best == nil {
				return true
			}
			if fw, fb := len(o.workerLeases[w.ID]) < w.Slots, len(o.workerLeases[best.ID]) < best.Slots; fw != fb {
				return fw
			}
			if (w.ID == s.RejectedBy) != (best.ID == s.RejectedBy) {
				return best.ID == s.RejectedBy
			}
			return len(o.workerLeases[w.ID]) < len(o.workerLeases[best.ID])
		}
		for _, w := range free {
			if len(o.workerLeases[w.ID]) < w.Slots+w.Ahead && !missedBy(s, w.ID) && o.matches(w, s) && better(w) {
				best = w
			}
		}
		if best == nil {
			continue
		}
		o.grant(s, best)
		slots--
		if sp.Concurrency > 0 {
			inflight[group]++
		}
	}
}

func (o *Orchestrator) grant(s *StepRecord, w *WorkerRecord) {
	sp := o.specOf[s.ID]
	if sp.Writes && s.EverStarted {
		panic(fmt.Sprintf("core: re-dispatch of started write-bearing step %s", s.ID))
	}
	if s.Attempts >= o.cfg.MaxAttempts {
		panic(fmt.Sprintf("core: grant %d of step %s exceeds the attempt cap", s.Attempts+1, s.ID))
	}
	o.meta.LeaseSeq++
	o.markMeta()
	l := &LeaseRecord{ID: LeaseID(o.meta.LeaseSeq), Step: s.ID, Worker: w.ID, GrantedAt: o.now, Current: true,
		Deadline: o.now.Add(o.cfg.DispatchAck)}
	o.leases[l.ID] = l
	o.stepLeases[s.ID] = append(o.stepLeases[s.ID], l.ID)
	o.markLease(l)
	o.arm(l.Deadline, tLease, leaseKeyID(l.ID))
	if o.workerLeases[w.ID] == nil {
		o.workerLeases[w.ID] = map[LeaseID]bool{}
	}
	o.workerLeases[w.ID][l.ID] = true
	s.Attempts++
	s.Lease = l.ID
	o.markStep(s)
	o.sendTo(w.ID, Dispatch{Lease: l.ID, Step: s.ID, Run: s.Run, Command: sp.Command, Env: o.envFor(s, sp),
		Writes: sp.Writes, Timeout: sp.Timeout, Attempt: s.Attempts, Secrets: sp.Secrets, SecretsAs: sp.SecretsAs})
}

// envFor is the shipped environment: the orchestrator's snapshot, then the
// run's and the step's env, all minus the denylist, plus TETHER_ITEM.
func (o *Orchestrator) envFor(s *StepRecord, sp *StepSpec) map[string]string {
	return DispatchEnv(o.cfg.Env, o.runs[s.Run].Spec, *sp, s.Index, s.Item)
}

func sortedKeys[K ~string | ~uint64, V any](m map[K]V) []K {
	ks := make([]K, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i] < ks[j] })
	return ks
}

func copyMap(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// MaxSilentHeartbeats is how many heartbeat intervals old a connected
// worker's heartbeat clock (WorkerRecord.clock) may grow before the worker is
// silent: not dispatchable until any message from it ends the silence (§8).
const MaxSilentHeartbeats = 2

// heard notes a message from w (§8): it ends a silence (the heartbeat
// clock moves to now, in memory only, as a heartbeat moves it) and lifts
// every dispatch-ack exclusion of w.
func (o *Orchestrator) heard(w *WorkerRecord) {
	if o.now.Sub(w.clock) >= MaxSilentHeartbeats*o.cfg.HeartbeatInterval {
		w.clock = o.now
	}
	steps := o.missed[w.ID]
	if len(steps) == 0 {
		return
	}
	delete(o.missed, w.ID)
	for _, id := range sortedKeys(steps) {
		s := o.steps[id]
		i := sort.Search(len(s.MissedBy), func(i int) bool { return s.MissedBy[i] >= w.ID })
		if i < len(s.MissedBy) && s.MissedBy[i] == w.ID {
			s.MissedBy = append(s.MissedBy[:i:i], s.MissedBy[i+1:]...)
			if len(s.MissedBy) == 0 {
				s.MissedBy = nil
			}
			o.markStep(s)
		}
	}
}

// miss excludes w from step s until w is heard from: it let a dispatch of s
// pass its dispatch-ack deadline (§3, §8).
func (o *Orchestrator) miss(s *StepRecord, w WorkerID) {
	i := sort.Search(len(s.MissedBy), func(i int) bool { return s.MissedBy[i] >= w })
	if i < len(s.MissedBy) && s.MissedBy[i] == w {
		return
	}
	s.MissedBy = append(s.MissedBy[:i:i], append([]WorkerID{w}, s.MissedBy[i:]...)...)
	o.markStep(s)
	o.indexMissed(s)
}

// unmiss drops every exclusion of a step that ended.
func (o *Orchestrator) unmiss(s *StepRecord) {
	for _, w := range s.MissedBy {
		delete(o.missed[w], s.ID)
		if len(o.missed[w]) == 0 {
			delete(o.missed, w)
		}
	}
	s.MissedBy = nil
}

// indexMissed adds s to the exclusion index of every worker it names.
func (o *Orchestrator) indexMissed(s *StepRecord) {
	for _, w := range s.MissedBy {
		if o.missed[w] == nil {
			o.missed[w] = map[StepID]bool{}
		}
		o.missed[w][s.ID] = true
	}
}

func missedBy(s *StepRecord, w WorkerID) bool {
	for _, m := range s.MissedBy {
		if m == w {
			return true
		}
	}
	return false
}
