package core

import (
	"slices"
	"strconv"
	"strings"
	"time"
)

// Archival (SPEC §7a): a run whose steps are all terminal and none of whose
// leases is current leaves the core in the batch that made it so. The
// batch deletes its live records (run, steps, leases, events) and writes one
// history record holding all of them as they were; its log records stay
// where they are, named by lease, and the history record lists the leases.
// The core keeps of it only what answering a late message about one of its
// leases needs (closed.go).

// KindHistory is the record kind of an archived run: key "history/<run>",
// value the JSON of a RunHistory. The core writes it and never reads it back:
// Restore skips it, and it is not among Records (it is history, not state).
const KindHistory = "history"

// HistoryKey is the key of run id's history record.
func HistoryKey(id RunID) string { return KindHistory + "/" + string(id) }

// IsHistoryKey reports whether key names a history record.
func IsHistoryKey(key string) bool { return strings.HasPrefix(key, KindHistory+"/") }

// RunHistory is an archived run: everything the operator API shows of it, as
// it was in the batch that archived it. Steps are in the run's order, leases
// and events in id and sequence order. Log lines are not in it: they stay in
// their own records ("log/<lease>/<index>") for the leases listed here.
type RunHistory struct {
	Head   HistoryHead // first, so that a reader that needs only a listing's line stops after it
	Run    RunRecord
	Status string // the derived status: success, failed, cancelled
	Steps  []StepRecord
	Leases []LeaseRecord
	Events []ServerEvent
}

// HistoryHead is what a listing shows of an archived run, derived from the
// rest of its RunHistory when it is archived (the store indexes it without
// reading the steps, leases and events).
type HistoryHead struct {
	Run          RunID
	Name         string
	Status       string
	Parent       RunID `json:",omitempty"`
	SubmittedAt  time.Time
	FinishedAt   time.Time `json:",omitzero"`
	Deadline     time.Time `json:",omitzero"`
	CancelReason string    `json:",omitempty"`
	Steps        int
	States       map[string]int // steps per state (State.String)
}

// DeriveHead derives h.Head from the rest of h.
func (h *RunHistory) DeriveHead() HistoryHead {
	return historyHead(&h.Run, h.Status, pointers(h.Steps))
}

// historyHead is the head of the history of run r, of status status, whose
// steps are steps.
func historyHead(r *RunRecord, status string, steps []*StepRecord) HistoryHead {
	hd := HistoryHead{Run: r.ID, Name: r.Spec.Name, Status: status, Parent: r.Parent, SubmittedAt: r.SubmittedAt,
		Deadline: r.Deadline, CancelReason: r.CancelReason, Steps: len(r.Steps), States: map[string]int{}}
	if r.Finished {
		hd.FinishedAt = r.FinishedAt
	}
	for _, s := range steps {
		hd.States[s.State.String()]++
	}
	return hd
}

// Step returns the archived step with id, if the run has it.
func (h *RunHistory) Step(id StepID) (StepRecord, bool) {
	for _, s := range h.Steps {
		if s.ID == id {
			return s, true
		}
	}
	return StepRecord{}, false
}

// archived reports whether id names a run that was submitted here and is no
// longer in the core: run ids are "run-<n>", numbered from 1 (submit).
func (o *Orchestrator) archived(id RunID) bool {
	n, ok := strings.CutPrefix(string(id), "run-")
	if !ok || o.runs[id] != nil {
		return false
	}
	seq, err := strconv.ParseUint(n, 10, 64)
	return err == nil && seq >= 1 && seq <= o.meta.RunSeq && "run-"+strconv.FormatUint(seq, 10) == string(id)
}

// queueArchive notes that run id may be archivable; finish decides.
func (o *Orchestrator) queueArchive(id RunID) { o.archiveQ[id] = true }

// archivable reports whether run r may leave the core: finished, and no
// lease of any of its steps current.
func (o *Orchestrator) archivable(r *RunRecord) bool {
	if r == nil || !r.Finished || o.open[r.ID] > 0 {
		return false
	}
	for _, sid := range r.Steps {
		for _, lid := range o.stepLeases[sid] {
			if l := o.leases[lid]; l != nil && l.Current {
				return false
			}
		}
	}
	return true
}

// archiveQueued archives every queued run that is archivable, in id order
// (the order of a batch's records never depends on map order).
func (o *Orchestrator) archiveQueued() {
	if len(o.archiveQ) == 0 {
		return
	}
	ids := sortedKeys(o.archiveQ)
	clear(o.archiveQ)
	for _, id := range ids {
		if r := o.runs[id]; o.archivable(r) {
			o.archive(r)
		}
	}
}

// archive moves run r out of the core: its history record is written, its
// live records deleted, and its leases enter the closed-lease table.
func (o *Orchestrator) archive(r *RunRecord) {
	// The history is encoded from the live records, which are dropped just
	// after: nothing is copied (a 200-step run's steps and leases are
	// ~130 KB of structs, for a record read once).
	steps := o.archiveSteps[:0]
	for _, sid := range r.Steps {
		steps = append(steps, o.steps[sid])
	}
	var leases []LeaseID
	for _, sid := range r.Steps {
		leases = append(leases, o.stepLeases[sid]...)
	}
	slices.Sort(leases)
	ls := o.archiveLeases[:0]
	for _, lid := range leases {
		ls = append(ls, o.leases[lid])
	}
	status := o.runStatus(r)
	head := historyHead(r, status, steps)
	run := *r // an empty list is written null, as a RunHistory's copy of it was
	if len(run.Steps) == 0 {
		run.Steps = nil
	}
	if len(run.Children) == 0 {
		run.Children = nil
	}
	o.history = append(o.history, Record{Key: HistoryKey(r.ID), Value: encodeHistory(&o.scratch, &head, &run, status, steps, ls, o.events[r.ID])})
	for _, l := range ls {
		o.closeLease(l)
	}
	clear(steps)
	clear(ls)
	o.archiveSteps, o.archiveLeases = steps[:0], ls[:0]

	// Forget it: every live record is deleted, the log records are left
	// where they are (dropped from the cache without a delete; finish does
	// not cache those of this batch). Events recorded in this very batch
	// are not written at all.
	evPrefix := KindEvent + "/" + string(r.ID) + "/"
	kept := o.appends[:0]
	for _, a := range o.appends {
		if !strings.HasPrefix(a.Key, evPrefix) {
			kept = append(kept, a)
		}
	}
	o.appends = kept
	for _, ev := range o.events[r.ID] {
		o.appends = append(o.appends, Record{Key: eventKey(r.ID, ev.Seq), Delete: true})
	}
	delete(o.events, r.ID)
	for _, lid := range leases {
		for _, ln := range o.logs[lid] {
			o.uncache(logKey(lid, ln.Index))
		}
		delete(o.logs, lid)
		delete(o.logSeen, lid)
		delete(o.leases, lid)
		o.dirty[leaseKey(lid)] = true
	}
	for _, sid := range r.Steps {
		s := o.steps[sid]
		if len(s.MissedBy) > 0 {
			for _, w := range s.MissedBy {
				if m := o.missed[w]; m != nil {
					delete(m, sid)
					if len(m) == 0 {
						delete(o.missed, w)
					}
				}
			}
		}
		delete(o.steps, sid)
		delete(o.ready, sid)
		delete(o.specOf, sid)
		delete(o.dependents, sid)
		delete(o.depsOK, sid)
		delete(o.stepLeases, sid)
		o.dirty[stepKey(sid)] = true
	}
	delete(o.runs, r.ID)
	delete(o.open, r.ID)
	o.dirty[runKey(r.ID)] = true
}

// uncache drops a record from the cache (and the fingerprint) without
// emitting anything: the record stays in the store, outside the state.
func (o *Orchestrator) uncache(key string) {
	if e, ok := o.enc[key]; ok {
		if e.hashed {
			o.fp -= e.hash
		}
		delete(o.enc, key)
	}
}

// pruneGone deletes the workers that can never come back and the tokens
// that can never be used again, once the retention has passed (SPEC §7a):
// a worker not connected, holding no current lease and no closed-lease
// entry, revoked or with its credential expired, gone (disconnected, and
// its credential expired) for at least the retention; a token revoked,
// used or expired, past its expiry by the retention, whose worker (if any)
// is gone from the records.
func (o *Orchestrator) pruneGone() {
	for _, id := range sortedKeys(o.workers) {
		w := o.workers[id]
		if o.connected(id) || len(o.workerLeases[id]) > 0 || o.closedHeldBy(id) || w.DisconnectedAt.IsZero() {
			continue
		}
		if !w.Revoked && o.now.Before(w.CredExpiry) {
			continue // it may still reconnect
		}
		since := w.DisconnectedAt
		if !w.Revoked && w.CredExpiry.After(since) {
			since = w.CredExpiry
		}
		if o.now.Before(since.Add(o.cfg.Retention)) {
			continue
		}
		delete(o.workers, id)
		delete(o.workerLeases, id)
		delete(o.closedBy, id) // only dropped slots are left
		o.markWorker(w)
		o.logf("info", "worker pruned", FieldWorker, string(id), "gone_since", since.UTC().Format(time.RFC3339))
	}
	for _, name := range sortedKeys(o.tokens) {
		t := o.tokens[name]
		if !(t.Revoked || t.Consumed || !o.now.Before(t.ExpiresAt)) || o.now.Before(t.ExpiresAt.Add(o.cfg.Retention)) {
			continue
		}
		if t.Worker != "" && o.workers[t.Worker] != nil {
			continue
		}
		delete(o.tokens, name)
		o.markToken(t)
		o.logf("info", "enrollment token pruned", "token", name)
	}
}
