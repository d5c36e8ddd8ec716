package core

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"sort"
	"time"
)

// The closed-lease table (SPEC §7a). When a run is archived its leases leave
// the core, but a worker may still present one of them: a report whose
// answer was lost, a START that crossed a cancel, an in-flight list. Each is
// answered as SPEC §3 answers it for a lease that is still in the core, from
// a compact entry: whose lease it was, which step (a hash), whether it
// committed, and the first report it answered (the committed one when it
// committed), as a request id and an outcome hash.
//
// An entry is kept while its worker could still present the lease, and
// dropped once it cannot:
//  1. the worker's Hello does not list it (a Hello lists every lease the
//     worker holds, and lease ids are never reused);
//  2. the worker showed it held the lease (a START, a report, a listing) and
//     a later heartbeat does not list it: it let go of it;
//  3. the worker is revoked or no longer enrolled;
//  4. the time bound: credential lifetime + heartbeat timeout + the worker's
//     grace after the entry was made or the orchestrator last restarted
//     (a restart gives every credential a fresh lifetime), whichever is later.
//
// Durably, the table is a log of records "closed/<seq>", each adding entries
// or dropping leases, replayed in order by Restore; the sweep rewrites it as
// a snapshot once more of it is dead than alive.

// KindClosed is the record kind of the closed-lease table's log.
const KindClosed = "closed"

func closedKey(seq uint64) string { return fmt.Sprintf("%s/%020d", KindClosed, seq) }

// ClosedLease is one entry of the closed-lease table.
type ClosedLease struct {
	Lease     LeaseID
	Worker    WorkerID
	Step      uint32 // StepHash of the lease's step
	Held      bool   // the worker showed it held the lease (rule 2 applies)
	Committed bool
	Answered  bool   // Request and Outcome are set
	Rejected  bool   // that answer was REJECTED: its exact duplicate is answered REJECTED again (§3)
	Request   uint64 // the first answered report's request id (the committed one when Committed)
	Outcome   uint64 // OutcomeHash of that report's outcome
	ClosedAt  int64  // Unix seconds of the batch that archived the lease
}

// ClosedChunk is one record of the closed-lease table's log: entries to add
// (replacing any entry of the same lease), then leases to drop.
type ClosedChunk struct {
	Adds  []ClosedLease
	Drops []LeaseID
}

// StepHash is the 32-bit FNV-1a hash of a step id.
func StepHash(id StepID) uint32 {
	h := fnv.New32a()
	h.Write([]byte(id))
	return h.Sum32()
}

// OutcomeHash is a 64-bit hash of an outcome (status, exit code, message).
func OutcomeHash(out Outcome) uint64 {
	h := fnv.New64a()
	var b [9]byte
	b[0] = byte(out.Status)
	binary.LittleEndian.PutUint64(b[1:], uint64(int64(out.ExitCode)))
	h.Write(b[:])
	h.Write([]byte(out.Message))
	return h.Sum64()
}

// maxClosedPerRecord bounds the entries of one snapshot record.
const maxClosedPerRecord = 4096

// closedCompactMin is how long the log must be before the sweep rewrites it.
const closedCompactMin = 16

// closeLease makes an entry for a lease of a run being archived.
func (o *Orchestrator) closeLease(l *LeaseRecord) {
	c := ClosedLease{Lease: l.ID, Worker: l.Worker, Step: StepHash(l.Step), Held: l.Started || len(l.Answers) > 0,
		Committed: l.Committed, ClosedAt: o.now.Unix()}
	for _, a := range l.Answers {
		if !c.Answered || (l.Committed && a.Verdict == Committed) {
			c.Answered, c.Request, c.Outcome = true, a.Request, OutcomeHash(a.Outcome)
			c.Rejected = a.Verdict == Rejected
		}
	}
	o.addClosed(c)
}

// addClosed puts an entry in the table and in this batch's log record.
func (o *Orchestrator) addClosed(c ClosedLease) {
	if _, ok := o.closed[c.Lease]; ok {
		o.closedDead++ // superseded
	} else {
		o.closedBy[c.Worker] = append(o.closedBy[c.Worker], c.Lease)
	}
	o.closed[c.Lease] = c
	o.closedAdds = append(o.closedAdds, c)
}

// dropClosed removes an entry from the table (closedBy is pruned by the
// caller or lazily) and logs the drop.
func (o *Orchestrator) dropClosed(id LeaseID) {
	if _, ok := o.closed[id]; !ok {
		return
	}
	delete(o.closed, id)
	o.closedDead++
	o.closedDrops = append(o.closedDrops, id)
}

// closedFor returns worker w's entries that are still in the table, pruning
// its index of those that are not.
func (o *Orchestrator) closedFor(w WorkerID) []LeaseID {
	ids := o.closedBy[w]
	kept := ids[:0]
	for _, id := range ids {
		if c, ok := o.closed[id]; ok && c.Worker == w {
			kept = append(kept, id)
		}
	}
	if len(kept) == 0 {
		delete(o.closedBy, w)
		return nil
	}
	o.closedBy[w] = kept
	return kept
}

// closedListed applies rules 1 and 2 to an in-flight list of worker w: on a
// Hello (fresh) every entry it does not list goes, on a heartbeat every held
// one. A listed entry is held from now on.
func (o *Orchestrator) closedListed(w WorkerID, inflight []LeaseRef, fresh bool) {
	ids := o.closedFor(w)
	if len(ids) == 0 {
		return
	}
	listed := make(map[LeaseID]bool, len(inflight))
	for _, r := range inflight {
		listed[r.Lease] = true
	}
	for _, id := range ids {
		c := o.closed[id]
		switch {
		case listed[id] && !c.Held:
			c.Held = true
			o.addClosed(c)
		case !listed[id] && (fresh || c.Held):
			o.dropClosed(id)
		}
	}
}

// expireClosed applies rules 3 and 4 (at every sweep), then decides whether
// the log is due for a rewrite.
func (o *Orchestrator) expireClosed() {
	if len(o.closed) > 0 {
		ids := make([]LeaseID, 0, len(o.closed))
		for id := range o.closed {
			ids = append(ids, id)
		}
		sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
		base := o.meta.RestoredAt.Unix()
		for _, id := range ids {
			c := o.closed[id]
			w := o.workers[c.Worker]
			if w == nil || w.Revoked {
				o.dropClosed(id)
				continue
			}
			from := max(c.ClosedAt, base)
			window := o.cfg.CredentialTTL + o.cfg.HeartbeatTimeout + w.Grace
			if !o.now.Before(time.Unix(from, 0).Add(window)) {
				o.dropClosed(id)
			}
		}
	}
	if o.closedHi-o.closedLo >= closedCompactMin && o.closedDead >= len(o.closed) {
		o.closedCompact = true
	}
	if o.closedHi > o.closedLo && len(o.closed) == 0 {
		o.closedCompact = true
	}
}

// flushClosed writes this batch's changes to the table's log: an add record
// and a drop record, or, when the sweep asked for it, a rewrite: every
// record of the log deleted and the live entries written afresh.
func (o *Orchestrator) flushClosed() {
	if o.closedCompact {
		o.closedCompact = false
		for seq := o.closedLo; seq < o.closedHi; seq++ {
			o.appends = append(o.appends, Record{Key: closedKey(seq), Delete: true})
		}
		o.closedLo = o.closedHi
		ids := make([]LeaseID, 0, len(o.closed))
		for id := range o.closed {
			ids = append(ids, id)
		}
		sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
		for len(ids) > 0 {
			n := min(len(ids), maxClosedPerRecord)
			var ch ClosedChunk
			for _, id := range ids[:n] {
				ch.Adds = append(ch.Adds, o.closed[id])
			}
			ids = ids[n:]
			o.writeClosed(ch)
		}
		o.closedDead = 0
		o.closedAdds, o.closedDrops = o.closedAdds[:0], o.closedDrops[:0]
		return
	}
	if len(o.closedAdds) > 0 {
		o.writeClosed(ClosedChunk{Adds: o.closedAdds})
		o.closedAdds = nil
	}
	if len(o.closedDrops) > 0 {
		sort.Slice(o.closedDrops, func(i, j int) bool { return o.closedDrops[i] < o.closedDrops[j] })
		o.writeClosed(ClosedChunk{Drops: o.closedDrops})
		o.closedDrops = nil
	}
}

func (o *Orchestrator) writeClosed(ch ClosedChunk) {
	o.appends = append(o.appends, Record{Key: closedKey(o.closedHi), Value: encodeClosed(ch)})
	o.closedHi++
}

// loadClosed replays the table's log (records sorted by key).
func (o *Orchestrator) loadClosed(recs []Record) error {
	sort.Slice(recs, func(i, j int) bool { return recs[i].Key < recs[j].Key })
	added := 0
	for i, r := range recs {
		seq, err := parseClosedKey(r.Key)
		if err != nil {
			return err
		}
		if i == 0 {
			o.closedLo = seq
		}
		o.closedHi = seq + 1
		ch, err := decodeClosed(r.Value)
		if err != nil {
			return fmt.Errorf("%w: key %q: %v", ErrBadRecord, r.Key, err)
		}
		for _, c := range ch.Adds {
			o.closed[c.Lease] = c
			added++
		}
		for _, id := range ch.Drops {
			delete(o.closed, id)
		}
	}
	o.closedDead = added - len(o.closed)
	ids := make([]LeaseID, 0, len(o.closed))
	for id := range o.closed {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		w := o.closed[id].Worker
		o.closedBy[w] = append(o.closedBy[w], id)
	}
	return nil
}

func parseClosedKey(key string) (uint64, error) {
	var seq uint64
	if _, err := fmt.Sscanf(key, KindClosed+"/%d", &seq); err != nil || closedKey(seq) != key {
		return 0, fmt.Errorf("%w: malformed closed-lease key %q", ErrBadRecord, key)
	}
	return seq, nil
}

// closedRecords returns the table's log records as last emitted.
func (o *Orchestrator) closedRecords() []Record {
	var recs []Record
	for seq := o.closedLo; seq < o.closedHi; seq++ {
		if e, ok := o.enc[closedKey(seq)]; ok {
			recs = append(recs, Record{Key: closedKey(seq), Value: e.value})
		}
	}
	return recs
}

// The log's binary encoding: a version byte, the number of adds and each
// add, the number of drops and each drop, all integers as uvarints (the
// closing time as a varint), strings length-prefixed, flags in one byte.
const closedVersion = 1

var errClosedShort = errors.New("truncated closed-lease record")

func encodeClosed(ch ClosedChunk) []byte {
	b := make([]byte, 0, 1+len(ch.Adds)*32+len(ch.Drops)*4)
	b = append(b, closedVersion)
	b = binary.AppendUvarint(b, uint64(len(ch.Adds)))
	for _, c := range ch.Adds {
		b = binary.AppendUvarint(b, uint64(c.Lease))
		b = binary.AppendUvarint(b, uint64(len(c.Worker)))
		b = append(b, c.Worker...)
		b = binary.LittleEndian.AppendUint32(b, c.Step)
		var f byte
		if c.Held {
			f |= 1
		}
		if c.Committed {
			f |= 2
		}
		if c.Answered {
			f |= 4
		}
		if c.Rejected {
			f |= 8
		}
		b = append(b, f)
		b = binary.AppendUvarint(b, c.Request)
		b = binary.LittleEndian.AppendUint64(b, c.Outcome)
		b = binary.AppendVarint(b, c.ClosedAt)
	}
	b = binary.AppendUvarint(b, uint64(len(ch.Drops)))
	for _, id := range ch.Drops {
		b = binary.AppendUvarint(b, uint64(id))
	}
	return b
}

func decodeClosed(b []byte) (ClosedChunk, error) {
	var ch ClosedChunk
	if len(b) == 0 || b[0] != closedVersion {
		return ch, fmt.Errorf("unknown closed-lease record version")
	}
	b = b[1:]
	uv := func() (uint64, error) {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return 0, errClosedShort
		}
		b = b[n:]
		return v, nil
	}
	n, err := uv()
	if err != nil {
		return ch, err
	}
	if n > uint64(len(b)) {
		return ch, errClosedShort
	}
	ch.Adds = make([]ClosedLease, 0, n)
	for range n {
		var c ClosedLease
		id, err := uv()
		if err != nil {
			return ch, err
		}
		c.Lease = LeaseID(id)
		wl, err := uv()
		if err != nil || wl > uint64(len(b)) {
			return ch, errClosedShort
		}
		c.Worker = WorkerID(b[:wl])
		b = b[wl:]
		if len(b) < 5 {
			return ch, errClosedShort
		}
		c.Step = binary.LittleEndian.Uint32(b)
		f := b[4]
		b = b[5:]
		c.Held, c.Committed, c.Answered, c.Rejected = f&1 != 0, f&2 != 0, f&4 != 0, f&8 != 0
		if c.Request, err = uv(); err != nil {
			return ch, err
		}
		if len(b) < 8 {
			return ch, errClosedShort
		}
		c.Outcome = binary.LittleEndian.Uint64(b)
		b = b[8:]
		at, k := binary.Varint(b)
		if k <= 0 {
			return ch, errClosedShort
		}
		c.ClosedAt = at
		b = b[k:]
		ch.Adds = append(ch.Adds, c)
	}
	n, err = uv()
	if err != nil {
		return ch, err
	}
	if n > uint64(len(b)) {
		return ch, errClosedShort
	}
	for range n {
		id, err := uv()
		if err != nil {
			return ch, err
		}
		ch.Drops = append(ch.Drops, LeaseID(id))
	}
	if len(b) != 0 {
		return ch, fmt.Errorf("%d trailing bytes in closed-lease record", len(b))
	}
	return ch, nil
}

// ---- answering from the table ----

// committedTo says whether lease id is worker w's lease of step s whose
// report was COMMITTED: a worker still listing it lost the answer, and its
// re-sent report is answered COMMITTED again, so it is neither cancelled nor
// lost. The lease may be in the core or in the closed-lease table.
func (o *Orchestrator) committedTo(id LeaseID, w WorkerID, s StepID) bool {
	if l := o.leases[id]; l != nil {
		return l.Committed && l.Worker == w && l.Step == s
	}
	c, ok := o.closed[id]
	return ok && c.Committed && c.Worker == w && c.Step == StepHash(s)
}

// reportClosed answers a report on a lease of an archived run exactly as
// report answers it on a lease in the core (SPEC §3): the worker's exact
// duplicate of its committed report gets COMMITTED again, of the report the
// entry keeps answered REJECTED (a write-bearing step reported without a
// recorded START) REJECTED again, a conflicting
// duplicate or any other report on a committed lease REJECTED, and any
// other report of the lease's worker on its step CANCELLED (the lease lost
// its authority before its run finished).
func (o *Orchestrator) reportClosed(w *WorkerRecord, c ClosedLease, m Report, reply func(Verdict, string)) {
	switch {
	case c.Worker != w.ID:
		reply(Rejected, fmt.Sprintf("lease %d belongs to another worker", c.Lease))
		return
	case c.Step != StepHash(m.Step):
		reply(Rejected, fmt.Sprintf("lease %d is not a lease of step %s", c.Lease, m.Step))
		return
	}
	if !c.Held {
		c.Held = true
		o.addClosed(c)
	}
	sameRequest := c.Answered && c.Request == m.Request
	switch {
	case sameRequest && c.Outcome != OutcomeHash(m.Outcome):
		reply(Rejected, "conflicting duplicate: request already answered with a different outcome")
	case c.Committed && sameRequest:
		reply(Committed, "")
	case c.Rejected && sameRequest:
		reply(Rejected, "exact duplicate of a report answered REJECTED")
	case c.Committed:
		reply(Rejected, "a different completion for this lease was already committed")
	default:
		reply(Cancelled, "lease lost authority: it ended before its run finished")
	}
}
