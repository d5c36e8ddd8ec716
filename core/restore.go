package core

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"sort"
	"time"
)

// Restore rebuilds an orchestrator from its persisted records after a restart
// (SPEC §7) at time now. Every worker starts disconnected with a fresh grace
// window; every live lease gets a fresh deadline (now + its worker's grace);
// running steps go to recovering; cancelling steps keep cancelling with a fresh
// force deadline. The returned Ready holds the records of that re-arming and
// must be handled like any other batch.
func Restore(cfg Config, now time.Time, recs []Record) (*Orchestrator, Ready, error) {
	o := &Orchestrator{cfg: cfg.withDefaults()}
	o.init()
	if err := o.load(recs); err != nil {
		return nil, Ready{}, err
	}
	if now.Before(o.now) {
		now = o.now
	}
	o.now = now
	o.restoredAt = now
	o.rearm()
	// A store written before archival (SPEC §7a) holds finished runs: they
	// leave the core in this first batch.
	for id, r := range o.runs {
		if r.Finished {
			o.queueArchive(id)
		}
	}
	o.rebuildTimers()
	o.dispatch()
	return o, o.finish(), nil
}

// LogKeyLease is the lease a log line's key names, and whether key has a
// log line's form. Restore reads a line of that form only if a record of
// the lease it names is among its records (load, below): the lines of
// archived leases are not state (SPEC §7a), and a store may withhold them
// from Restore, as it may history and audit records.
func LogKeyLease(key string) (LeaseID, bool) { return logKeyLease(key) }

// load applies records to an empty orchestrator and rebuilds derived indexes.
func (o *Orchestrator) load(recs []Record) error {
	var closed []Record
	type logRec struct {
		lease LeaseID
		r     Record
	}
	var odd []logRec // log lines whose key is not of logKey's form
	for _, r := range recs {
		if r.Delete || IsHistoryKey(r.Key) || IsAuditKey(r.Key) {
			continue // history and the audit log are not state (archive.go, operators.go)
		}
		if isClosedKey(r.Key) {
			o.cache(r)
			closed = append(closed, r)
			continue
		}
		if _, ok := logKeyDigits(r.Key); ok {
			// Decoded below, once the leases are known: the lines of
			// archived leases, most of a long-lived store, are not state.
			continue
		}
		v, err := DecodeRecord(r)
		if err != nil {
			return err
		}
		switch v := v.(type) {
		case *MetaRecord:
			o.meta = *v
		case *RunRecord:
			o.runs[v.ID] = v
		case *StepRecord:
			o.steps[v.ID] = v
		case *LeaseRecord:
			o.leases[v.ID] = v
		case *WorkerRecord:
			o.workers[v.ID] = v
		case *TokenRecord:
			o.tokens[v.Name] = v
		case *OperatorRecord:
			o.operators[v.Name] = v
		case *SecretRecord:
			o.secrets[v.Name] = v
		case *ScheduleRecord:
			o.schedules[v.Name] = v
		case *ServerEvent:
			o.events[v.Run] = append(o.events[v.Run], *v)
		case *StepLogLine:
			odd = append(odd, logRec{v.Lease, r})
			continue
		}
		o.cache(r)
	}
	if err := o.loadClosed(closed); err != nil {
		return err
	}
	// Log lines of archived leases stay in the store; they are not state,
	// and are not decoded.
	line := func(r Record) error {
		v, err := DecodeRecord(r)
		if err != nil {
			return err
		}
		if ln := v.(*StepLogLine); o.leases[ln.Lease] != nil {
			o.logs[ln.Lease] = append(o.logs[ln.Lease], *ln)
			o.cache(r)
		}
		return nil
	}
	// A lease's lines are adjacent in key order: their lease is parsed and
	// looked up once, not once a line.
	var digits string
	var live bool
	for _, r := range recs {
		d, ok := logKeyDigits(r.Key)
		if !ok || r.Delete {
			continue
		}
		if d != digits {
			digits, live = d, o.leases[parseLeaseKey(d)] != nil
		}
		if live {
			if err := line(r); err != nil {
				return err
			}
		}
	}
	for _, lr := range odd {
		if o.leases[lr.lease] != nil {
			if err := line(lr.r); err != nil {
				return err
			}
		}
	}
	for _, id := range sortedKeys(o.leases) {
		l := o.leases[id]
		o.stepLeases[l.Step] = append(o.stepLeases[l.Step], id)
	}
	for _, id := range sortedKeys(o.runs) {
		r := o.runs[id]
		o.indexRun(r, false)
		for _, sid := range r.Steps {
			if o.steps[sid] == nil {
				return fmt.Errorf("%w: run %s names missing step %s", ErrBadRecord, r.ID, sid)
			}
		}
		sort.Slice(o.events[id], func(i, j int) bool { return o.events[id][i].Seq < o.events[id][j].Seq })
	}
	for id, s := range o.steps {
		if o.specOf[id] == nil {
			return fmt.Errorf("%w: step %s has no run", ErrBadRecord, id)
		}
		o.markStepIndex(s)
	}
	o.indexGroups()
	for _, l := range o.leases {
		if !l.Current {
			continue
		}
		if o.workers[l.Worker] == nil || o.steps[l.Step] == nil {
			return fmt.Errorf("%w: lease %d names a missing worker or step", ErrBadRecord, l.ID)
		}
		if o.workerLeases[l.Worker] == nil {
			o.workerLeases[l.Worker] = map[LeaseID]bool{}
		}
		o.workerLeases[l.Worker][l.ID] = true
	}
	for id, lines := range o.logs {
		sort.Slice(lines, func(i, j int) bool { return lines[i].Index < lines[j].Index })
		seen := &logDedup{}
		for _, ln := range lines {
			if k := idOf(ln.Line, ln.Event); !seen.has(k) {
				seen.add(k)
			}
		}
		o.logSeen[id] = seen
	}
	for _, w := range o.workers {
		w.clock = w.LastHeartbeat // Restore restarts it at now (rearm); Clone sets it
		if w.LastHeartbeat.After(o.now) {
			o.now = w.LastHeartbeat
		}
	}
	return nil
}

// markStepIndex updates the derived indexes of a loaded step without
// marking it dirty.
func (o *Orchestrator) markStepIndex(s *StepRecord) {
	o.indexReady(s)
	o.indexMissed(s)
	o.indexHeld(s)
	if !s.State.Terminal() {
		o.open[s.Run]++
	}
}

// rearm is SPEC §7: nothing the previous process promised is dropped; every
// promise gets a fresh deadline from now.
func (o *Orchestrator) rearm() {
	for _, id := range sortedKeys(o.workers) {
		w := o.workers[id]
		w.clock = o.now // a restart is not the worker's silence: its record gets it too
		if w.Active && !w.Revoked {
			// The outage was the orchestrator's: a worker that was in the
			// pool must be able to come back even if its credential would
			// have lapsed while nobody could refresh it.
			if exp := o.now.Add(o.cfg.CredentialTTL); w.CredExpiry.Before(exp) {
				w.CredExpiry = exp
			}
			w.DisconnectedAt = o.now
			if w.Grace > 0 {
				w.GraceUntil = o.now.Add(w.Grace)
			} else {
				w.GraceUntil = o.now
			}
		}
		if w.DisconnectedAt.IsZero() {
			// Inactive but never seen to go (marked stale while its
			// connection stayed open): no worker is connected after a
			// restart, so it is gone from now at the latest, and the
			// retention can delete it once it cannot come back (SPEC §7a).
			w.DisconnectedAt = o.now
		}
		o.markWorker(w)
	}
	for _, id := range sortedKeys(o.leases) {
		l := o.leases[id]
		if !l.Current {
			continue
		}
		w := o.workers[l.Worker]
		s := o.steps[l.Step]
		l.Deadline = o.now.Add(w.Grace)
		if l.Held {
			// A held lease's window is the worker's silence (§3), and its
			// heartbeat clock restarts now: a full window from now.
			l.Deadline = w.clock.Add(MaxSilentHeartbeats * o.cfg.HeartbeatInterval)
		}
		o.markLease(l)
		switch s.State {
		case StateRunning:
			done := o.because(CauseRestarted, s.ID, l)
			o.transition(s, EvRecover)
			o.event(s.Run, s.ID, "step-recovering",
				fmt.Sprintf("orchestrator restarted; holding the step for worker %s for %s", w.ID, DescribeDuration(w.Grace)))
			done()
		case StateCancelling:
			l.Deadline = time.Time{}
			s.ForceAt = o.now.Add(o.cfg.ForceCancel)
			o.markStep(s)
		}
	}
	// Timeouts (SPEC §7): the recorded instants are another clock's (the
	// process before, perhaps on another host, minutes apart from this
	// one), so a remainder computed from them could be short by the skew,
	// and a deadline they say has passed may not have. What holds on any
	// clock is that the window began no later than now: every armed
	// timeout is re-armed for its full window from now if that is later.
	// A restore may lengthen a window (by at most what had run of it),
	// never shorten it.
	for _, id := range sortedKeys(o.steps) {
		s := o.steps[id]
		if s.State != StateRunning && s.State != StateRecovering {
			continue
		}
		d := o.stepDeadline(s)
		if d.IsZero() {
			continue
		}
		if full := o.now.Add(o.specOf[id].Timeout); full.After(d) {
			s.TimeoutAt = full
			o.markStep(s)
		}
	}
	for _, id := range sortedKeys(o.runs) {
		r := o.runs[id]
		if r.Finished || r.CancelReason != "" || r.Deadline.IsZero() {
			continue
		}
		if full := o.now.Add(r.Spec.Timeout); full.After(r.Deadline) {
			r.Deadline = full
			o.markRun(r)
		}
	}
	// A restart gives every credential a fresh lifetime: the closed-lease
	// table's time bound runs from here too (closed.go, rule 4).
	o.meta.RestoredAt = o.now
	o.markMeta()
	// A sweep overdue, or due at this very instant (a takeover whose clock
	// is behind restores at the latest recorded time), waits a full
	// interval: the unmatched waits start over (SPEC §7).
	if !o.meta.NextSweep.After(o.now) {
		o.meta.NextSweep = o.now.Add(o.cfg.SweepInterval)
		o.markMeta()
	}
}

// Records returns every record of the current state, sorted by key: what a
// store holding every batch so far would hold, minus history (archived runs'
// history records and log lines, which Restore does not read).
func (o *Orchestrator) Records() []Record {
	var recs []Record
	add := func(key string, v any) { recs = append(recs, Record{Key: key, Value: encode(v)}) }
	add(metaKey(), o.meta)
	for _, id := range sortedKeys(o.runs) {
		add(runKey(id), o.runs[id])
		for _, ev := range o.events[id] {
			add(eventKey(id, ev.Seq), ev)
		}
	}
	for _, id := range sortedKeys(o.steps) {
		add(stepKey(id), o.steps[id])
	}
	for _, id := range sortedKeys(o.leases) {
		add(leaseKey(id), o.leases[id])
		for _, ln := range o.logs[id] {
			add(logKey(id, ln.Index), ln)
		}
	}
	for _, id := range sortedKeys(o.workers) {
		add(workerKey(id), o.workers[id])
	}
	for _, id := range sortedKeys(o.tokens) {
		add(tokenKey(id), o.tokens[id])
	}
	for _, id := range sortedKeys(o.operators) {
		add(operatorKey(id), o.operators[id])
	}
	for _, id := range sortedKeys(o.secrets) {
		add(secretKey(id), o.secrets[id])
	}
	for _, id := range sortedKeys(o.schedules) {
		add(scheduleKey(id), o.schedules[id])
	}
	recs = append(recs, o.closedRecords()...)
	sort.Slice(recs, func(i, j int) bool { return recs[i].Key < recs[j].Key })
	return recs
}

// Clone returns an independent deep copy, connections included.
func (o *Orchestrator) Clone() *Orchestrator {
	if o.cfg.NoStateCache {
		panic("core: Clone needs the state cache (Config.NoStateCache is set)")
	}
	c := &Orchestrator{cfg: o.cfg}
	c.init()
	if err := c.load(o.cachedRecords()); err != nil {
		panic("core: clone: " + err.Error())
	}
	c.cloneClosed(o)
	for id, w := range o.workers { // the heartbeat clocks are in no record (§8)
		c.workers[id].clock = w.clock
	}
	c.cfg.Env = copyMap(o.cfg.Env)
	c.now, c.restoredAt = o.now, o.restoredAt
	for k, v := range o.conns {
		c.conns[k] = v
	}
	for k, v := range o.connOf {
		c.connOf[k] = v
	}
	for k, v := range o.connV1 {
		c.connV1[k] = v
	}
	c.rebuildTimers()
	return c
}

// cachedRecords returns the records as last emitted, sorted by key, but
// for the closed-lease log, whose values are not kept (cloneClosed copies
// the table itself).
func (o *Orchestrator) cachedRecords() []Record {
	recs := make([]Record, 0, len(o.enc))
	for k, e := range o.enc {
		if !isClosedKey(k) {
			recs = append(recs, Record{Key: k, Value: e.value})
		}
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].Key < recs[j].Key })
	return recs
}

// recordHash mixes one record into 64 bits (FNV-1a, then a splitmix64
// finalizer so that summing hashes does not let similar records cancel).
func recordHash(key string, value []byte) uint64 {
	h := fnv.New64a()
	h.Write([]byte(key))
	h.Write([]byte{0})
	h.Write(value)
	x := h.Sum64()
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// Fingerprint is a canonical 64-bit hash of the state: the sum of the hashes
// of every record (so map and emission order cannot matter), mixed with the
// connections (sorted) and the time. Equal states give equal fingerprints.
// It hashes the records changed since it last ran, so the first call after
// a Step writes (like Step, it must not run concurrently with other
// methods); once it has run, further calls until the next Step only read.
func (o *Orchestrator) Fingerprint() uint64 {
	if o.cfg.NoStateCache {
		panic("core: Fingerprint needs the state cache (Config.NoStateCache is set)")
	}
	h := fnv.New64a()
	var b [8]byte
	put := func(x uint64) {
		binary.LittleEndian.PutUint64(b[:], x)
		h.Write(b[:])
	}
	o.hashPending()
	put(uint64(o.now.UnixNano()))
	put(uint64(o.restoredAt.UnixNano()))
	put(o.fp)
	put(o.clocksHash())
	conns := make([]ConnID, 0, len(o.conns))
	for c := range o.conns {
		conns = append(conns, c)
	}
	sort.Slice(conns, func(i, j int) bool { return conns[i] < conns[j] })
	for _, c := range conns {
		put(uint64(c))
		h.Write([]byte(o.conns[c]))
		h.Write([]byte{0})
		if o.connV1[c] {
			h.Write([]byte{1})
		}
	}
	return h.Sum64()
}

// clocksHash mixes the workers' heartbeat clocks, which are state but in no
// record (SPEC §8): the sum of each worker's hash, so map order cannot
// matter.
func (o *Orchestrator) clocksHash() uint64 {
	var sum uint64
	var b [8]byte
	for id, w := range o.workers {
		binary.LittleEndian.PutUint64(b[:], uint64(w.clock.UnixNano()))
		sum += recordHash(string(id), b[:])
	}
	return sum
}
