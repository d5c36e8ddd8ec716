package core

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Orchestrator is the pure state machine that owns all durable truth: runs,
// steps, leases, the worker pool and tokens. It is not safe for concurrent use;
// one driver goroutine owns it. It does no I/O and reads no clock: every input
// comes with the orchestrator's time, and every effect is returned in a Ready.
type Orchestrator struct {
	cfg Config
	now time.Time
	why why // the cause stamped on the events of one step (because)

	// Durable state (every field below is reflected in Records).
	meta    MetaRecord
	runs    map[RunID]*RunRecord
	steps   map[StepID]*StepRecord
	leases  map[LeaseID]*LeaseRecord
	workers map[WorkerID]*WorkerRecord
	tokens  map[string]*TokenRecord
	// operators are the operator tokens (operators.go).
	operators map[string]*OperatorRecord
	// schedules are the cron schedules (schedules.go, SPEC §8a).
	schedules map[string]*ScheduleRecord
	events    map[RunID][]ServerEvent
	logs      map[LeaseID][]StepLogLine

	// secrets are the secrets' records, never their values (secrets.go).
	secrets map[string]*SecretRecord

	// Derived indexes, rebuilt by load.
	specOf       map[StepID]*StepSpec
	dependents   map[StepID][]StepID
	ready        map[StepID]time.Time // queued, no lease, not a task step → its QueuedAt
	readyQ       []readyEntry         // readyQ[readyHead:]: ready steps in dispatch order, with stale entries (see readyQueue)
	readyHead    int                  // entries before it were dispatched or went stale
	readySorted  int                  // readyQ[readyHead:readySorted] is in order; the rest was appended since
	open         map[RunID]int        // non-terminal steps per run
	workerLeases map[WorkerID]map[LeaseID]bool
	missed       map[WorkerID]map[StepID]bool // worker → steps whose MissedBy names it
	logSeen      map[LeaseID]*logDedup        // the stored lines of each lease with logs, for deduplication

	// restoredAt is when this process restored (zero if it never did): the
	// unmatched wait of a queued step starts over then (SPEC §7, §5), as
	// its QueuedAt may be another host's clock.
	restoredAt time.Time

	// Connections are not durable: after a restart every worker is disconnected.
	conns  map[ConnID]WorkerID
	connOf map[WorkerID]ConnID
	connV1 map[ConnID]bool // connections whose Hello declared protocol version 1 (§9)

	timers timerHeap
	// timersKept is len(timers) after its last compaction (timers.go).
	timersKept int

	// enc caches every record's encoding (the last value emitted) and fp is
	// the order-independent sum of their hashes: Fingerprint costs only the
	// records changed since the last one. A record is hashed lazily, when
	// Fingerprint next runs (a real driver never asks): unhashed lists the
	// keys whose entry in enc has no hash yet (and perhaps some that were
	// hashed or deleted since; those are skipped).
	enc      map[string]encEntry
	fp       uint64
	unhashed []string

	// The batch being built by the current Step.
	rd      Ready
	dirty   map[string]bool
	appends []Record
	scratch []byte   // encoding buffer, reused
	keys    []string // finish's sorted dirty keys, reused

	// archive's lists of a run's live steps and leases, reused (emptied after each use).
	archiveSteps  []*StepRecord
	archiveLeases []*LeaseRecord

	// Archival (archive.go) and the closed-lease table (closed.go).
	stepLeases    map[StepID][]LeaseID     // every lease of a step, in grant order (derived)
	archiveQ      map[RunID]bool           // runs that may have become archivable in this batch
	history       []Record                 // this batch's history records (never cached)
	audits        []Record                 // this batch's audit entries (never cached: not state)
	closedBy      map[WorkerID]*closedList // the table's entries, by worker
	closedLive    int                      // entries in the table
	closedAdds    []ClosedLease            // this batch's additions to the log
	closedDrops   []LeaseID                // this batch's drops
	closedLo      uint64                   // the log's records are closed/<closedLo..closedHi-1>
	closedHi      uint64
	closedDead    int  // entries dropped or superseded since the log was last rewritten
	closedLogged  int  // adds and drops in the log
	closedCompact bool // the sweep asked for a rewrite

	// depsOK[s] = n: s.Deps[:n] are known to have succeeded (a terminal
	// state), so promote resumes there instead of rescanning them (SPEC
	// §12: a fan-in's promotion is linear in its edges). A derived index,
	// not persisted: 0 is always a correct start.
	depsOK map[StepID]int

	// Concurrency groups (groups.go, SPEC §8a), derived: a run group's
	// unfinished members in submit order, and a step group's steps holding
	// a lease. crons caches each schedule's parsed expression.
	groupRuns map[string][]RunID
	groupHeld map[string]map[StepID]bool
	crons     map[string]Cron
	noAdmit   string // a run group being cleared by cancel_in_progress: admit nobody yet
	// groupWaits are this batch's run-group-wait events, recorded by finish.
	groupWaits []groupWait
}

// NewOrchestrator returns an empty orchestrator.
func NewOrchestrator(cfg Config) *Orchestrator {
	o := &Orchestrator{cfg: cfg.withDefaults()}
	o.init()
	return o
}

func (o *Orchestrator) init() {
	o.runs = map[RunID]*RunRecord{}
	o.steps = map[StepID]*StepRecord{}
	o.leases = map[LeaseID]*LeaseRecord{}
	o.workers = map[WorkerID]*WorkerRecord{}
	o.tokens = map[string]*TokenRecord{}
	o.operators = map[string]*OperatorRecord{}
	o.secrets = map[string]*SecretRecord{}
	o.schedules = map[string]*ScheduleRecord{}
	o.groupRuns = map[string][]RunID{}
	o.groupHeld = map[string]map[StepID]bool{}
	o.crons = map[string]Cron{}
	o.events = map[RunID][]ServerEvent{}
	o.logs = map[LeaseID][]StepLogLine{}
	o.specOf = map[StepID]*StepSpec{}
	o.dependents = map[StepID][]StepID{}
	o.depsOK = map[StepID]int{}
	o.ready = map[StepID]time.Time{}
	o.readyQ, o.readyHead, o.readySorted = nil, 0, 0
	o.open = map[RunID]int{}
	o.workerLeases = map[WorkerID]map[LeaseID]bool{}
	o.missed = map[WorkerID]map[StepID]bool{}
	o.logSeen = map[LeaseID]*logDedup{}
	o.conns = map[ConnID]WorkerID{}
	o.connOf = map[WorkerID]ConnID{}
	o.connV1 = map[ConnID]bool{}
	o.dirty = map[string]bool{}
	o.stepLeases = map[StepID][]LeaseID{}
	o.archiveQ = map[RunID]bool{}
	o.closedBy = map[WorkerID]*closedList{}
	o.enc = map[string]encEntry{}
	o.fp = 0
	o.unhashed = nil
}

// encEntry is a record's last encoding and, once hashed, its hash (in fp).
type encEntry struct {
	value  []byte
	hash   uint64
	hashed bool
}

// cache keeps enc and fp in step with one record.
func (o *Orchestrator) cache(r Record) {
	if o.cfg.NoStateCache {
		return
	}
	old, ok := o.enc[r.Key]
	if ok && old.hashed {
		o.fp -= old.hash
	}
	if r.Delete {
		delete(o.enc, r.Key)
		return
	}
	if isClosedKey(r.Key) {
		// The closed-lease log is hashed at once and its value not kept:
		// it is as long as the table, which the core holds compactly
		// (closed.go), and nothing reads it back but Restore.
		h := recordHash(r.Key, r.Value)
		o.enc[r.Key] = encEntry{hash: h, hashed: true}
		o.fp += h
		return
	}
	o.enc[r.Key] = encEntry{value: r.Value}
	if !ok || old.hashed {
		o.unhashed = append(o.unhashed, r.Key)
		if len(o.unhashed) > 2*len(o.enc)+1024 {
			o.trimUnhashed()
		}
	}
}

// trimUnhashed keeps unhashed in proportion to the state: a driver that
// never asks for a Fingerprint would otherwise hold the key of every record
// ever written. Only the keys still cached and not hashed stay, once each,
// in the order they came.
func (o *Orchestrator) trimUnhashed() {
	seen := make(map[string]bool, len(o.enc))
	kept := o.unhashed[:0]
	for _, k := range o.unhashed {
		if e, ok := o.enc[k]; ok && !e.hashed && !seen[k] {
			seen[k] = true
			kept = append(kept, k)
		}
	}
	clear(o.unhashed[len(kept):])
	o.unhashed = kept
}

// hashPending adds the hashes of the records changed since the last call
// to fp.
func (o *Orchestrator) hashPending() {
	if len(o.unhashed) == 0 {
		return // nothing to do, and nothing written: a settled machine's Fingerprint only reads
	}
	for _, k := range o.unhashed {
		if e, ok := o.enc[k]; ok && !e.hashed {
			e.hash, e.hashed = recordHash(k, e.value), true
			o.enc[k] = e
			o.fp += e.hash
		}
	}
	clear(o.unhashed)
	o.unhashed = o.unhashed[:0]
}

// Config returns the effective configuration (defaults filled in).
func (o *Orchestrator) Config() Config { return o.cfg }

// Now returns the time of the last input.
func (o *Orchestrator) Now() time.Time { return o.now }

// Step applies one input at time now and returns the resulting batch. Time
// never runs backwards inside the core: an earlier now is treated as the
// last one seen. Timers strictly overdue fire before the input; then the input
// is applied; then timers due at now fire (so an input and a timer at the same
// instant are ordered by which the driver delivers first); then ready steps
// are dispatched.
func (o *Orchestrator) Step(now time.Time, in Input) Ready {
	if now.Before(o.now) {
		now = o.now
	}
	o.now = now
	o.compactTimers()
	if o.meta.NextSweep.IsZero() {
		o.meta.NextSweep = now.Add(o.cfg.SweepInterval)
		o.arm(o.meta.NextSweep, tSweep, "")
		o.markMeta()
	}
	o.fireTimers(now, true)
	switch in := in.(type) {
	case Tick:
	case Received:
		o.receive(in)
	case Disconnected:
		if w, ok := o.conns[in.Conn]; ok {
			o.disconnect(w, "connection closed")
		}
	case Submit:
		o.submit(in)
	case CancelRun:
		o.apiCancelRun(in)
	case Approve:
		o.gate(in.Call, in.Actor, in.Step, EvApprove)
	case RejectGate:
		o.gate(in.Call, in.Actor, in.Step, EvReject)
	case CreateToken:
		o.createToken(in)
	case RevokeToken:
		o.revokeToken(in)
	case CreateOperator:
		o.createOperator(in)
	case RevokeOperator:
		o.revokeOperator(in)
	case SetAdmin:
		o.setAdmin(in)
	case Audit:
		o.auditInput(in)
	case CreateSchedule:
		o.createSchedule(in)
	case ChangeSchedule:
		o.changeSchedule(in)
	case DataWrite:
		// SPEC §14: a write is decided after every timer due by now has
		// fired, those due at this very instant too.
		o.fireTimers(now, false)
		o.dataWrite(in)
	case PutSecret:
		o.putSecret(in)
	case RemoveSecret:
		o.removeSecret(in)
	case SecretWrite:
		o.fireTimers(now, false) // as a DataWrite (SPEC §14a)
		o.secretWrite(in)
	default:
		panic(fmt.Sprintf("core: unknown input %T", in))
	}
	o.fireTimers(now, false)
	o.dispatch()
	return o.finish()
}

// finish collects the batch: dirty entities become records, sorted by key.
func (o *Orchestrator) finish() Ready {
	o.flushGroupWaits()
	o.archiveQueued()
	o.flushClosed()
	keys := o.keys[:0]
	for k := range o.dirty {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	recs := make([]Record, 0, len(keys)+len(o.appends))
	for _, k := range keys {
		recs = append(recs, o.recordFor(k))
	}
	clear(keys)
	o.keys = keys[:0]
	recs = append(recs, o.appends...)
	slices.SortStableFunc(recs, byKey)
	if !o.cfg.NoStateCache { // the real driver's core keeps no cache: nothing to walk
		for _, r := range recs {
			if o.cacheable(r.Key) {
				o.cache(r)
			}
		}
	}
	if len(o.history) > 0 {
		recs = append(recs, o.history...)
		slices.SortStableFunc(recs, byKey)
		o.history = nil
	}
	if len(o.audits) > 0 {
		recs = append(recs, o.audits...) // their keys sort after every other kind's but closed/…
		slices.SortStableFunc(recs, byKey)
		o.audits = nil
	}
	rd := o.rd
	rd.Records = recs
	if t, ok := o.nextTimer(); ok {
		rd.Deadline = t.at
	}
	o.rd = Ready{}
	if len(o.dirty) > 64 {
		// clear keeps a map's capacity, and ranging over it costs that
		// capacity: after a large batch (a submit), start afresh.
		o.dirty = map[string]bool{}
	} else {
		clear(o.dirty)
	}
	o.appends = nil
	return rd
}

// cacheable says whether a record of this batch is state: a log line of a
// lease that was archived in this very batch is not (it stays in the store,
// outside the state).
func (o *Orchestrator) cacheable(key string) bool {
	if l, ok := logKeyLease(key); ok {
		return o.leases[l] != nil
	}
	return true
}

// byKey orders records by key (a stable sort keeps a key's records in
// the order they were made).
func byKey(a, b Record) int { return strings.Compare(a.Key, b.Key) }

// logKeyLease is the lease a log line's key (logKey) names.
func logKeyLease(key string) (LeaseID, bool) {
	if d, ok := logKeyDigits(key); ok {
		return parseLeaseKey(d), true
	}
	return 0, false
}

// logKeyDigits is the lease's 20 digits in a log line's key, unparsed.
func logKeyDigits(key string) (string, bool) {
	if len(key) > len(KindLog)+21 && key[:len(KindLog)+1] == KindLog+"/" {
		return key[len(KindLog)+1 : len(KindLog)+21], true
	}
	return "", false
}

func (o *Orchestrator) recordFor(key string) Record {
	kind, id, _ := strings.Cut(key, "/")
	var v any
	switch kind {
	case KindMeta:
		v = o.meta
	case KindRun:
		if r := o.runs[RunID(id)]; r != nil {
			v = r
		}
	case KindStep:
		if s := o.steps[StepID(id)]; s != nil {
			v = s
		}
	case KindLease:
		if l := o.leases[parseLeaseKey(id)]; l != nil {
			v = l
		}
	case KindWorker:
		if w := o.workers[WorkerID(id)]; w != nil {
			w.LastHeartbeat = w.clock // the clock reaches the record with another change (§8)
			v = w
		}
	case KindToken:
		if t := o.tokens[id]; t != nil {
			v = t
		}
	case KindOperator:
		if t := o.operators[id]; t != nil {
			v = t
		}
	case KindSecret:
		if t := o.secrets[id]; t != nil {
			v = t
		}
	case KindSchedule:
		if sc := o.schedules[id]; sc != nil {
			v = sc
		}
	default:
		panic("core: dirty key of unknown kind " + key)
	}
	if v == nil {
		return Record{Key: key, Delete: true}
	}
	return Record{Key: key, Value: encodeScratch(&o.scratch, v)}
}

// leaseKeyID is a lease id padded so that text order is numeric order.
func leaseKeyID(id LeaseID) string { return string(appendPadded(make([]byte, 0, 20), uint64(id), 20)) }

func parseLeaseKey(s string) LeaseID {
	n, _ := strconv.ParseUint(s, 10, 64)
	return LeaseID(n)
}

func (o *Orchestrator) markMeta()            { o.dirty[metaKey()] = true }
func (o *Orchestrator) markRun(r *RunRecord) { o.dirty[runKey(r.ID)] = true }
func (o *Orchestrator) markLease(l *LeaseRecord) {
	o.dirty[leaseKey(l.ID)] = true
}
func (o *Orchestrator) markWorker(w *WorkerRecord) { o.dirty[workerKey(w.ID)] = true }
func (o *Orchestrator) markToken(t *TokenRecord)   { o.dirty[tokenKey(t.Name)] = true }

// markStep records a change to a step and keeps the ready set in step.
func (o *Orchestrator) markStep(s *StepRecord) {
	o.dirty[stepKey(s.ID)] = true
	o.indexReady(s)
	o.indexHeld(s)
}

// readyEntry orders the ready queue: oldest queued first, then by step id.
type readyEntry struct {
	at time.Time
	id StepID
}

func (a readyEntry) less(b readyEntry) bool {
	if !a.at.Equal(b.at) {
		return a.at.Before(b.at)
	}
	return a.id < b.id
}

// indexReady keeps the ready set and its ordered queue in step with s. The
// queue is append-mostly (steps are queued at the current time); an entry
// whose step left the set or was queued again is stale and skipped.
func (o *Orchestrator) indexReady(s *StepRecord) {
	if sp := o.specOf[s.ID]; s.State != StateQueued || s.Lease != 0 || sp.Type == "task" || sp.Workflow != nil {
		delete(o.ready, s.ID)
		return
	}
	if at, ok := o.ready[s.ID]; ok && at.Equal(s.QueuedAt) {
		return
	}
	o.ready[s.ID] = s.QueuedAt
	e := readyEntry{at: s.QueuedAt, id: s.ID}
	if n := len(o.readyQ); o.readySorted == n && (n == o.readyHead || !e.less(o.readyQ[n-1])) {
		o.readySorted++ // still in order
	}
	o.readyQ = append(o.readyQ, e)
}

// readyQueue returns the ready queue in order, with stale entries among
// the live ones (dispatch skips them), sorting and compacting it first when
// needed. Dispatch calls it on every Step that could grant, so it must
// cost little more than the entries it hands out.
func (o *Orchestrator) readyQueue() []readyEntry {
	if o.readySorted < len(o.readyQ) {
		o.sortReady()
	}
	if len(o.readyQ)-o.readyHead > 2*len(o.ready)+64 {
		live := o.readyQ[:0]
		for i, e := range o.readyQ[o.readyHead:] {
			// Sorted, so duplicates an at-time-order round trip may have
			// left are adjacent.
			if o.readyLive(e) && (i == 0 || e != o.readyQ[o.readyHead+i-1]) {
				live = append(live, e)
			}
		}
		o.readyQ, o.readyHead, o.readySorted = live, 0, len(live)
	}
	// Dispatch takes entries from the front, so stale ones gather there:
	// step past them, or every step would rescan them (quadratic in the
	// queue), and move the queue down once the dead front is half of it.
	for o.readyHead < len(o.readyQ) && !o.readyLive(o.readyQ[o.readyHead]) {
		o.readyHead++
	}
	if o.readyHead > 64 && o.readyHead > len(o.readyQ)/2 {
		n := copy(o.readyQ, o.readyQ[o.readyHead:])
		clear(o.readyQ[n:])
		o.readyQ, o.readySorted, o.readyHead = o.readyQ[:n], o.readySorted-o.readyHead, 0
	}
	return o.readyQ[o.readyHead:]
}

// sortReady puts the queue in order. Entries are appended in time order
// (queued at the current time), so only those appended since the last sort
// need sorting (the steps of one submit share their time and are ordered by
// id), then merging into the rest when they do not simply follow it.
func (o *Orchestrator) sortReady() {
	q, p := o.readyQ, o.readySorted
	tail := q[p:]
	sort.Slice(tail, func(i, j int) bool { return tail[i].less(tail[j]) })
	if p > o.readyHead && tail[0].less(q[p-1]) {
		// Merge from the back, the tail moved aside.
		t := append([]readyEntry(nil), tail...)
		i, j, k := p-1, len(t)-1, len(q)-1
		for j >= 0 {
			if i >= o.readyHead && t[j].less(q[i]) {
				q[k] = q[i]
				i--
			} else {
				q[k] = t[j]
				j--
			}
			k--
		}
	}
	o.readySorted = len(q)
}

// readyLive reports whether a ready-queue entry is current.
func (o *Orchestrator) readyLive(e readyEntry) bool {
	at, ok := o.ready[e.id]
	return ok && at.Equal(e.at)
}

func (o *Orchestrator) send(c ConnID, m Msg) {
	o.rd.Messages = append(o.rd.Messages, Envelope{Conn: c, Msg: m})
}

func (o *Orchestrator) sendTo(w WorkerID, m Msg) {
	if c, ok := o.connOf[w]; ok {
		o.send(c, m)
	}
}

func (o *Orchestrator) answer(a APIAnswer) { o.rd.Answers = append(o.rd.Answers, a) }

func (o *Orchestrator) logf(level, msg string, kv ...string) {
	e := LogEntry{Level: level, Msg: msg}
	for i := 0; i+1 < len(kv); i += 2 {
		e.Fields = append(e.Fields, Field{kv[i], kv[i+1]})
	}
	o.rd.Logs = append(o.rd.Logs, e)
}

// event records a server event on a run (durably, as an appended record).
func (o *Orchestrator) event(run RunID, step StepID, kind, msg string) {
	r := o.runs[run]
	if r == nil {
		return
	}
	// The sequence is derived from the events themselves (appended records),
	// so recording an event never rewrites the run's record.
	ev := ServerEvent{Run: run, Seq: len(o.events[run]) + 1, At: o.now, Step: step, Kind: kind, Message: msg}
	if step != "" && step == o.why.step {
		ev.Cause, ev.Worker, ev.Lease = o.why.cause, o.why.worker, o.why.lease
	}
	o.events[run] = append(o.events[run], ev)
	o.rd.Events = append(o.rd.Events, ev)
	o.appends = append(o.appends, Record{Key: eventKey(run, ev.Seq), Value: encodeScratch(&o.scratch, ev)})
}

// why is what the events recorded on one step are stamped with while a
// handler acts for one cause (because).
type why struct {
	cause  Cause
	step   StepID
	worker WorkerID
	lease  LeaseID
}

// because stamps the events recorded on step from now on with cause and
// lease l's worker and id (l may be nil), until the function it returns is
// called; the caller defers it or calls it when the cause's handling ends.
// Events of other steps (a cascade's skips, the run's) are not stamped.
func (o *Orchestrator) because(cause Cause, step StepID, l *LeaseRecord) func() {
	prev := o.why
	o.why = why{cause: cause, step: step}
	if l != nil {
		o.why.worker, o.why.lease = l.Worker, l.ID
	}
	return func() { o.why = prev }
}

func (o *Orchestrator) connected(w WorkerID) bool {
	_, ok := o.connOf[w]
	return ok
}

// ---- the step state machine ----

// transition applies event e to step s. The table refusing the pair here is
// a bug in the orchestrator, never a consequence of input: callers check the
// state first. Entering a terminal state ends the step's lease and cascades.
func (o *Orchestrator) transition(s *StepRecord, e Event) {
	to, ok := Next(s.State, e)
	if !ok {
		panic(fmt.Sprintf("core: step %s: %s refused in state %s", s.ID, e, s.State))
	}
	from := s.State
	s.State = to
	if to.Terminal() && !from.Terminal() {
		o.open[s.Run]--
	}
	o.rd.Transitions = append(o.rd.Transitions, StepTransition{Step: s.ID, From: from, Event: e, To: to})
	switch {
	case to == StateQueued:
		s.QueuedAt = o.now
	case to == StateRunning && from == StateQueued:
		s.StartedAt, s.TimeoutAt = o.now, time.Time{}
		s.EverStarted = true
	}
	if to == StateRunning {
		// Armed on every entry to running: a step reclaimed past its
		// deadline times out at once (§5).
		o.arm(o.stepDeadline(s), tStepTimeout, string(s.ID))
	}
	if to.Terminal() && len(s.MissedBy) > 0 {
		o.unmiss(s)
	}
	if to != StateCancelling {
		s.ForceAt = time.Time{}
	}
	if to.Terminal() {
		s.FinishedAt = o.now
		if s.Lease != 0 {
			o.endLease(o.leases[s.Lease], "step "+to.String())
		}
	}
	o.markStep(s)
	if to.Terminal() {
		o.afterTerminal(s)
	}
}

func (o *Orchestrator) fail(s *StepRecord, class FailureClass, msg string) {
	s.Class, s.Message = class, msg
	// The failure is recorded before the cascade it causes (run-failed,
	// skips, run-finished), so the run's events read in causal order.
	o.event(s.Run, s.ID, "step-failed", string(class)+": "+msg)
	o.transition(s, EvFail)
}

// retryOrFail settles a running step's failure: COMMITTED failure report or
// step timeout. When its policy names the failure (retries), tries remain,
// and the step may run again — no writes, or idempotent ones — it goes
// waiting for its backoff (RETRY, SPEC §1) and TIMER_DONE queues its next
// try with a fresh grant budget (§3); otherwise it fails.
func (o *Orchestrator) retryOrFail(s *StepRecord, class FailureClass, msg string, retries bool) {
	sp := o.specOf[s.ID]
	p := sp.Retry
	if !retries || p == nil || s.Tries >= p.Attempts || (sp.Writes && !sp.Idempotent) {
		o.fail(s, class, msg)
		return
	}
	s.Tries++
	delay := p.RetryDelay(s.Tries)
	s.Message = fmt.Sprintf("try %d of %d failed: %s: %s", s.Tries, p.Attempts+1, class, msg)
	o.event(s.Run, s.ID, "step-retrying", fmt.Sprintf("try %d of %d in %s; %s", s.Tries+1, p.Attempts+1, DescribeDuration(delay), s.Message))
	if s.Lease != 0 {
		o.endLease(o.leases[s.Lease], "step retrying")
	}
	s.Attempts, s.EverStarted, s.Outcome, s.StartedAt, s.TimeoutAt = 0, false, nil, time.Time{}, time.Time{}
	s.WaitUntil = o.now.Add(delay)
	o.arm(s.WaitUntil, tWait, string(s.ID))
	o.transition(s, EvRetry)
}

// endLease takes authority away from a lease. It is never given back.
func (o *Orchestrator) endLease(l *LeaseRecord, reason string) {
	if l == nil || !l.Current {
		return
	}
	if s := o.steps[l.Step]; s != nil {
		o.queueArchive(s.Run) // its run may have been waiting for this lease
	}
	l.Current = false
	l.EndReason = reason
	l.Deadline = time.Time{}
	o.markLease(l)
	delete(o.workerLeases[l.Worker], l.ID)
	if s := o.steps[l.Step]; s != nil && s.Lease == l.ID {
		s.Lease = 0
		o.markStep(s)
	}
}

// afterTerminal cascades a finished step to its dependents and its run.
func (o *Orchestrator) afterTerminal(s *StepRecord) {
	r := o.runs[s.Run]
	if s.State == StateFailed && !r.Failed {
		r.Failed = true
		o.markRun(r)
		o.event(r.ID, s.ID, "run-failed", fmt.Sprintf("run failed: step %s failed", s.ID))
		if r.Parent != "" {
			o.event(r.Parent, "", "child-run-failed", fmt.Sprintf("child run %s failed at step %s", r.ID, s.ID))
		}
	}
	if s.State != StateSuccess {
		// A skipped step names the step whose failure (or cancellation)
		// skipped it, however far upstream (SPEC §2).
		root, why := s.ID, fmt.Sprintf("skipped: dependency %s %s", s.ID, s.State)
		if s.State == StateSkipped && s.SkippedBy != "" {
			root = s.SkippedBy
			why = fmt.Sprintf("skipped: dependency %s was skipped after %s %s", s.ID, root, o.steps[root].State)
		}
		for _, d := range o.dependents[s.ID] {
			ds := o.steps[d]
			if ds.State == StatePending {
				ds.SkippedBy, ds.Message = root, why
				o.event(r.ID, ds.ID, "step-skipped", ds.Message)
				o.transition(ds, EvSkip)
			}
		}
	} else {
		for _, d := range o.dependents[s.ID] {
			o.promote(o.steps[d])
		}
	}
	o.checkRunFinished(r)
}

func (o *Orchestrator) checkRunFinished(r *RunRecord) {
	if r.Finished || o.open[r.ID] > 0 {
		return
	}
	r.Finished = true
	r.FinishedAt = o.now
	o.markRun(r)
	defer o.leaveGroup(r) // after this run's events: the admitted run's follow
	o.queueArchive(r.ID)
	st := o.runStatus(r)
	o.event(r.ID, "", "run-finished", "run "+st)
	if r.Parent != "" {
		o.event(r.Parent, "", "child-run-finished", fmt.Sprintf("child run %s %s", r.ID, st))
	}
	if ps := o.steps[r.ParentStep]; ps != nil && ps.Child == r.ID && (ps.State == StateRunning || ps.State == StateCancelling) {
		o.childFinished(ps, r, st)
	}
}

// childFinished gives a workflow step its child run's outcome (SPEC §2), in
// the batch that finished the child: success SUCCEED, failed FAIL,
// cancelled CANCEL; a step being cancelled completes its cancel (COMPLETE).
// So the child is archived no sooner than its parent step has its outcome,
// and a parent run never finishes before the children its steps started.
func (o *Orchestrator) childFinished(s *StepRecord, child *RunRecord, status string) {
	if s.State == StateCancelling {
		o.event(s.Run, s.ID, "step-cancelled", fmt.Sprintf("child run %s %s", child.ID, status))
		o.transition(s, EvComplete)
		return
	}
	switch status {
	case "success":
		s.Outcome = &Outcome{Status: OutcomeSuccess}
		o.event(s.Run, s.ID, "step-succeeded", fmt.Sprintf("child run %s succeeded", child.ID))
		o.transition(s, EvSucceed)
	case "failed":
		o.fail(s, ClassChild, fmt.Sprintf("child run %s failed", child.ID))
	default:
		s.Class, s.Message = ClassChild, fmt.Sprintf("child run %s was cancelled", child.ID)
		if child.CancelReason != "" {
			s.Message += ": " + child.CancelReason
		}
		o.event(s.Run, s.ID, "step-cancelled", s.Message)
		o.transition(s, EvCancel)
	}
}

// promote moves a pending step whose dependencies all succeeded through its
// gate (held, waiting) or into the queue.
func (o *Orchestrator) promote(s *StepRecord) {
	if s.State != StatePending {
		return
	}
	if o.runs[s.Run].GroupWait {
		return // its run waits for room in its concurrency group (SPEC §8a)
	}
	n := o.depsOK[s.ID]
	for n < len(s.Deps) && o.steps[s.Deps[n]].State == StateSuccess {
		n++
	}
	if n < len(s.Deps) {
		o.depsOK[s.ID] = n
		return
	}
	delete(o.depsOK, s.ID)
	sp := o.specOf[s.ID]
	switch {
	case sp.Hold:
		if sp.HoldExpiry > 0 {
			s.HoldUntil = o.now.Add(sp.HoldExpiry)
			o.arm(s.HoldUntil, tHold, string(s.ID))
		}
		o.transition(s, EvHold)
		o.event(s.Run, s.ID, "step-held", "waiting for an operator's approval")
	case sp.Wait > 0:
		s.WaitUntil = o.now.Add(sp.Wait)
		o.arm(s.WaitUntil, tWait, string(s.ID))
		o.event(s.Run, s.ID, "step-waiting", fmt.Sprintf("waiting %s before queueing", DescribeDuration(sp.Wait)))
		o.transition(s, EvWait)
	default:
		o.enqueue(s)
	}
}

func (o *Orchestrator) enqueue(s *StepRecord) {
	o.transition(s, EvEnqueue)
	o.afterQueued(s)
}

// afterQueued runs a task step on the orchestrator itself: it has no command
// to ship, so it starts and succeeds at once.
func (o *Orchestrator) afterQueued(s *StepRecord) {
	if sp := o.specOf[s.ID]; sp.Workflow != nil {
		o.startChild(s, sp)
		return
	}
	if o.specOf[s.ID].Type != "task" {
		return
	}
	o.transition(s, EvStart)
	s.Outcome = &Outcome{Status: OutcomeSuccess}
	o.event(s.Run, s.ID, "task-step", "task step completed on the orchestrator")
	o.transition(s, EvSucceed)
}

// startChild starts a queued workflow step and, in the same batch, the
// child run of its workflow (SPEC §2). The child was validated with its
// parent's submission.
func (o *Orchestrator) startChild(s *StepRecord, sp *StepSpec) {
	o.transition(s, EvStart)
	parent := o.runs[s.Run]
	r := o.createRun(ChildSpec(sp), parent, s.ID, "", 0)
	s.Child = r.ID
	o.markStep(s)
	o.event(s.Run, s.ID, "child-run-started", fmt.Sprintf("child run %s started", r.ID))
	o.promoteAll(r)
}

// ---- operator API ----

func (o *Orchestrator) submit(in Submit) {
	act := ActionSubmit
	if in.RerunOf != "" {
		act = ActionRerun
	}
	deny := func(msg string) { o.deny(in.Call, in.Actor, act, in.Spec.Name, CodeInvalid, msg) }
	if err := in.Spec.Validate(); err != nil {
		deny(err.Error())
		return
	}
	if err := in.Spec.CheckDispatchSizes(o.cfg.Env); err != nil {
		deny(err.Error())
		return
	}
	var parent *RunRecord
	if in.Parent != "" {
		parent = o.runs[in.Parent]
		if msg := o.checkParent(in.Parent, parent, in.Spec); msg != "" {
			code := CodeInvalid
			if parent == nil && !o.archived(in.Parent) {
				code = CodeNotFound
			} else if parent == nil || parent.Finished || parent.CancelReason != "" || len(parent.Children) >= MaxChildRuns {
				code = CodeConflict // the parent's state, not the run, refuses it (SPEC §12: 409)
			}
			o.deny(in.Call, in.Actor, act, in.Spec.Name, code, msg)
			return
		}
	}
	if err := checkReuse(in); err != nil {
		deny(err.Error())
		return
	}
	r := o.createRun(in.Spec, parent, "", in.RerunOf, len(in.Reuse))
	o.reuse(r, in.Reuse)
	o.promoteAll(r)
	o.accept(in.Actor, act, string(r.ID))
	o.answer(APIAnswer{Call: in.Call, Run: r.ID})
}

// checkParent says why a run of spec may not be submitted as a child of
// run id (p, nil when not live), or "" (SPEC §2): the parent is live and
// not finished or cancelling, the tree stays within MaxRunDepth, and the
// API gave the parent fewer than MaxChildRuns children.
func (o *Orchestrator) checkParent(id RunID, p *RunRecord, spec RunSpec) string {
	switch {
	case p == nil && o.archived(id):
		return fmt.Sprintf("parent run %s already finished (archived)", id)
	case p == nil:
		return fmt.Sprintf("unknown parent run %q", id)
	case p.Finished:
		return fmt.Sprintf("parent run %s already finished (%s)", id, o.runStatus(p))
	case p.CancelReason != "":
		return fmt.Sprintf("parent run %s is being cancelled", id)
	case p.Depth+1+spec.TreeDepth() > MaxRunDepth:
		return fmt.Sprintf("parent run %s is %d runs deep and the run nests %d: a tree of runs is at most %d deep", id, p.Depth+1, spec.TreeDepth(), MaxRunDepth)
	case len(p.Children) >= MaxChildRuns:
		return fmt.Sprintf("parent run %s has %d child runs, at most %d", id, len(p.Children), MaxChildRuns)
	}
	return ""
}

// createRun creates a run of spec (validated) below parent (nil: none),
// started by parent's workflow step ps (empty: submitted through the API).
// Its steps are promoted by promoteAll. A rerun (rerunOf set, SPEC §2)
// says so in its run-submitted event, with the number of steps it reuses.
func (o *Orchestrator) createRun(spec RunSpec, parent *RunRecord, ps StepID, rerunOf RunID, reused int) *RunRecord {
	o.meta.RunSeq++
	o.markMeta()
	r := &RunRecord{ID: RunID(fmt.Sprintf("run-%d", o.meta.RunSeq)), Spec: spec, ParentStep: ps, SubmittedAt: o.now, RerunOf: rerunOf}
	if parent != nil {
		r.Parent, r.Depth = parent.ID, parent.Depth+1
	}
	if parent != nil && ps == "" {
		// A workflow step's child is named by the step (Child): the
		// parent's record, its whole spec with it, is not rewritten.
		parent.Children = append(parent.Children, r.ID)
		o.markRun(parent)
	}
	if spec.Timeout > 0 {
		r.Deadline = o.now.Add(spec.Timeout)
		o.arm(r.Deadline, tRunTimeout, string(r.ID))
	}
	o.runs[r.ID] = r
	o.indexRun(r, true)
	o.open[r.ID] = len(r.Steps)
	o.joinGroup(r) // its concurrency group may hold it back: promote waits (SPEC §8a)
	o.markRun(r)
	msg := fmt.Sprintf("run submitted with %d step%s", len(r.Steps), plural(len(r.Steps)))
	if r.RerunOf != "" {
		msg += fmt.Sprintf(" (rerun of %s, %d reused)", r.RerunOf, reused)
	}
	if ps != "" {
		msg += fmt.Sprintf(" by step %s", ps)
	}
	o.event(r.ID, "", "run-submitted", msg)
	for _, id := range r.Steps {
		o.markStep(o.steps[id])
	}
	return r
}

// promoteAll promotes the steps of a new run.
func (o *Orchestrator) promoteAll(r *RunRecord) {
	for _, id := range r.Steps {
		o.promote(o.steps[id])
	}
}

// instanceIDs lists the step ids a spec step expands to.
func instanceIDs(run RunID, sp *StepSpec) []StepID {
	if len(sp.ForEach) == 0 {
		return []StepID{StepID(string(run) + "/" + sp.Name)}
	}
	ids := make([]StepID, len(sp.ForEach))
	for i := range sp.ForEach {
		ids[i] = StepID(string(run) + "/" + sp.Name + "[" + strconv.Itoa(i) + "]") // fmt's "%s/%s[%d]", without its cost
	}
	return ids
}

// indexRun builds the derived indexes of a run; with create it also creates
// the run's steps (on submit, not on load).
func (o *Orchestrator) indexRun(r *RunRecord, create bool) {
	byName := make(map[string]int, len(r.Spec.Steps)) // a lookup, not a scan per dependency (SPEC §12)
	for i := range r.Spec.Steps {
		byName[r.Spec.Steps[i].Name] = i
	}
	for i := range r.Spec.Steps {
		sp := &r.Spec.Steps[i]
		var deps []StepID
		for _, d := range sp.DependsOn {
			if k, ok := byName[d]; ok {
				deps = append(deps, instanceIDs(r.ID, &r.Spec.Steps[k])...)
			}
		}
		for idx, id := range instanceIDs(r.ID, sp) {
			o.specOf[id] = sp
			for _, d := range deps {
				o.dependents[d] = append(o.dependents[d], id)
			}
			if !create {
				continue
			}
			req, _ := RequiredTags(*sp)
			s := &StepRecord{ID: id, Run: r.ID, Name: sp.Name, Index: -1, Deps: deps, RequiredTags: req}
			if len(sp.ForEach) > 0 {
				s.Index, s.Item = idx, sp.ForEach[idx]
			}
			o.steps[id] = s
			r.Steps = append(r.Steps, id)
		}
	}
}

func (o *Orchestrator) apiCancelRun(in CancelRun) {
	r := o.runs[in.Run]
	deny := func(code, msg string) { o.deny(in.Call, in.Actor, ActionCancel, string(in.Run), code, msg) }
	switch {
	case r == nil && o.archived(in.Run):
		deny(CodeConflict, fmt.Sprintf("run %s already finished (archived)", in.Run))
		return
	case r == nil:
		deny(CodeNotFound, fmt.Sprintf("unknown run %q", in.Run))
		return
	case r.Finished:
		deny(CodeConflict, fmt.Sprintf("run %s already finished (%s)", r.ID, o.runStatus(r)))
		return
	}
	reason := in.Reason
	if reason == "" {
		reason = "cancelled by operator"
	}
	o.cancelRun(r, ClassOperator, reason)
	o.accept(in.Actor, ActionCancel, string(r.ID))
	o.answer(APIAnswer{Call: in.Call, Run: r.ID})
}

func (o *Orchestrator) cancelRun(r *RunRecord, class FailureClass, reason string) {
	if r.CancelReason == "" {
		r.CancelReason, r.CancelClass = reason, class
		o.markRun(r)
		o.event(r.ID, "", "run-cancel", reason)
	}
	for _, id := range r.Steps {
		o.cancelStep(o.steps[id], class, reason)
	}
	// The cascade (SPEC §6): the runs the API submitted below r, not yet
	// finished, transitively, in submit order (its workflow steps' children
	// were cancelled with their steps).
	for _, c := range r.Children {
		if cr := o.runs[c]; cr != nil && !cr.Finished {
			o.cancelRun(cr, class, fmt.Sprintf("parent run %s cancelled: %s", r.ID, reason))
		}
	}
}

// cancelStep cancels one step (SPEC §6): a running step on a connected worker is
// cancelled gracefully; anything else non-terminal is cancelled at once.
func (o *Orchestrator) cancelStep(s *StepRecord, class FailureClass, reason string) {
	if s.State == StateRunning && s.Child != "" {
		// A workflow step is cancelling until its child run, cancelled
		// with it, has finished (childFinished: COMPLETE), as a step's
		// process is until its worker reports (SPEC §6).
		s.Class, s.Message = class, reason
		o.transition(s, EvCancelGraceful)
		o.event(s.Run, s.ID, "step-cancelling", reason)
		o.cancelRun(o.runs[s.Child], class, fmt.Sprintf("parent step %s cancelled: %s", s.ID, reason))
		return
	}
	switch s.State {
	case StateRunning:
		l := o.leases[s.Lease]
		if o.connected(l.Worker) {
			s.Class, s.Message = class, reason
			s.ForceAt = o.now.Add(o.cfg.ForceCancel)
			o.arm(s.ForceAt, tForce, string(s.ID))
			o.transition(s, EvCancelGraceful)
			o.sendTo(l.Worker, Cancel{Lease: l.ID, Reason: reason})
			o.event(s.Run, s.ID, "step-cancelling", reason)
			return
		}
		fallthrough
	case StatePending, StateQueued, StateRecovering, StateHeld, StateWaiting:
		if s.Lease != 0 {
			l := o.leases[s.Lease]
			o.sendTo(l.Worker, Cancel{Lease: l.ID, Reason: reason})
		}
		s.Class, s.Message = class, reason
		o.event(s.Run, s.ID, "step-cancelled", reason)
		o.transition(s, EvCancel)
	}
}

func (o *Orchestrator) gate(call CallID, actor string, id StepID, e Event) {
	s := o.steps[id]
	action := ActionApprove
	if e == EvReject {
		action = ActionReject
	}
	deny := func(code, msg string) { o.deny(call, actor, action, string(id), code, msg) }
	if run, _, ok := strings.Cut(string(id), "/"); s == nil && ok && o.archived(RunID(run)) {
		deny(CodeConflict, fmt.Sprintf("step %s: run %s already finished (archived)", id, run))
		return
	}
	if s == nil {
		deny(CodeNotFound, fmt.Sprintf("unknown step %q", id))
		return
	}
	if _, ok := Next(s.State, e); !ok || s.State != StateHeld {
		deny(CodeConflict, fmt.Sprintf("step %s is %s, not held: %s refused", id, s.State, e))
		return
	}
	if e == EvReject {
		s.Class, s.Message = ClassGate, "rejected by reviewer"
	}
	s.HoldUntil = time.Time{}
	if e == EvApprove {
		o.event(s.Run, s.ID, "step-approved", "approved by reviewer")
		o.transition(s, e)
		o.afterQueued(s)
	} else {
		o.event(s.Run, s.ID, "step-rejected", "rejected by reviewer")
		o.transition(s, e)
	}
	o.accept(actor, action, string(id))
	o.answer(APIAnswer{Call: call, Run: s.Run})
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func hashSecret(b []byte) [32]byte { return sha256.Sum256(b) }

func (o *Orchestrator) createToken(in CreateToken) {
	if in.Lease != 0 || in.Credential != "" {
		// A step mints it (SPEC §14a): a write of IntoSecret under its lease.
		if in.Actor == "" {
			in.Actor = fmt.Sprintf("lease %d", in.Lease) // refused: not yet known to be the step's
		}
		if in.IntoSecret == "" {
			o.deny(in.Call, in.Actor, ActionTokenCreate, in.Name, CodeInvalid, "a step mints a token only into a secret it declares in put_secrets:")
			return
		}
		a := o.CheckSecret(o.now, in.Credential, in.Lease, in.IntoSecret, true)
		if a.Refusal != WriteAdmitted {
			code := CodeConflict
			if a.Refusal == RefusedSecretNotDeclared {
				code = CodeForbidden
			}
			o.deny(in.Call, in.Actor, ActionTokenCreate, in.Name, code, a.Err().Error())
			return
		}
		in.Actor = "step " + string(o.leases[in.Lease].Step)
	}
	deny := func(code, msg string) { o.deny(in.Call, in.Actor, ActionTokenCreate, in.Name, code, msg) }
	if err := CheckName("token name", in.Name); err != nil { // SPEC §9, §12
		deny(CodeInvalid, err.Error())
		return
	}
	switch {
	case in.Name == "" || len(in.Name) > MaxNameLength || strings.ContainsAny(in.Name, ". /\t\n"):
		deny(CodeInvalid, fmt.Sprintf("token name %q must be 1-%d characters without '.', '/' or spaces", in.Name, MaxNameLength))
		return
	case o.tokens[in.Name] != nil:
		deny(CodeConflict, fmt.Sprintf("token %q already exists", in.Name))
		return
	case in.TTL <= 0:
		deny(CodeInvalid, "token TTL must be positive")
		return
	}
	secret := hex.EncodeToString(in.Secret[:])
	if in.IntoSecret != "" {
		size := len(in.Name) + 1 + len(secret)
		switch err := CheckSecretName(in.IntoSecret); {
		case err != nil:
			deny(CodeInvalid, err.Error())
			return
		case checkSecretSize(size) != "":
			deny(CodeInvalid, checkSecretSize(size))
			return
		case o.secrets[in.IntoSecret] == nil && len(o.secrets) >= MaxSecrets:
			deny(CodeConflict, fmt.Sprintf("at most %d secrets", MaxSecrets))
			return
		}
		o.setSecret(in.IntoSecret, size, actorOr(in.Actor))
		o.accept(in.Actor, ActionSecretPut, in.IntoSecret)
	}
	t := &TokenRecord{Name: in.Name, Hash: hashSecret([]byte(secret)), CreatedAt: o.now, ExpiresAt: o.now.Add(in.TTL)}
	o.tokens[t.Name] = t
	o.markToken(t)
	o.logf("info", "enrollment token created", "token", t.Name, "expires_in", DescribeDuration(in.TTL))
	o.accept(in.Actor, ActionTokenCreate, t.Name)
	if in.IntoSecret != "" {
		o.answer(APIAnswer{Call: in.Call}) // the token is the secret's value, never an answer
		return
	}
	o.answer(APIAnswer{Call: in.Call, Token: t.Name + "." + secret})
}

func (o *Orchestrator) revokeToken(in RevokeToken) {
	t := o.tokens[in.Name]
	if t == nil {
		o.deny(in.Call, in.Actor, ActionTokenRevoke, in.Name, CodeNotFound, fmt.Sprintf("unknown token %q", in.Name))
		return
	}
	if !t.Revoked {
		t.Revoked = true
		o.markToken(t)
		o.logf("info", "enrollment token revoked", "token", t.Name)
		if w := o.workers[t.Worker]; w != nil && !w.Revoked {
			w.Revoked, w.Active = true, false
			w.GraceUntil = time.Time{}
			if o.connected(w.ID) {
				w.DisconnectedAt = o.now // gone from now on: retention runs from here
			}
			o.markWorker(w)
			o.triageAll(w, CauseRevoked)
			if c, ok := o.connOf[w.ID]; ok {
				o.send(c, Close{Reason: "enrollment token revoked", Code: ClosePolicy, Cause: CauseTokenRevoked})
				o.dropConn(c)
			}
		}
	}
	o.accept(in.Actor, ActionTokenRevoke, t.Name)
	o.answer(APIAnswer{Call: in.Call})
}

// ---- queries ----

// RunStatus is a run's status derived from its steps: running, failing (a
// step failed, others still going), cancelling, or, once every step is
// terminal, success, failed or cancelled.
func (o *Orchestrator) runStatus(r *RunRecord) string {
	if !r.Finished {
		return r.LiveStatus()
	}
	cancelled := false
	for _, id := range r.Steps {
		switch o.steps[id].State {
		case StateFailed:
			return "failed"
		case StateCancelled:
			cancelled = true
		}
	}
	if cancelled {
		return "cancelled"
	}
	return "success"
}

// ---- helpers for credentials ----

func checkSecret(hash [32]byte, secret string) bool {
	h := hashSecret([]byte(secret))
	return subtle.ConstantTimeCompare(h[:], hash[:]) == 1
}
