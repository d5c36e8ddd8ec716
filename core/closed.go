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
// or dropping leases, replayed in order by Restore. It is rewritten as a
// snapshot by the sweep once more of it is dead than alive, and by any batch
// once it holds more than twice the live entries plus closedLogSlack.

// KindClosed is the record kind of the closed-lease table's log.
const KindClosed = "closed"

func closedKey(seq uint64) string {
	return string(appendPadded(append(make([]byte, 0, len(KindClosed)+21), KindClosed+"/"...), seq, 20))
}

func isClosedKey(k string) bool {
	return len(k) > len(KindClosed) && k[len(KindClosed)] == '/' && k[:len(KindClosed)] == KindClosed
}

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

// closedLogSlack is how many entries the log may hold beyond twice the live
// ones before a batch rewrites it (each rewrite writes the live entries
// once, and comes after at least that many more: linear in all).
const closedLogSlack = 4096

// closedEntry is a ClosedLease in memory, kept in its worker's list: a
// report, START, listing or write is looked up only among its own worker's
// entries (another worker's archived lease is unknown to it: REJECTED all
// the same). 40 bytes.
type closedEntry struct {
	lease    LeaseID
	request  uint64
	outcome  uint64
	closedAt int64
	step     uint32
	flags    uint8
}

const (
	cHeld uint8 = 1 << iota
	cCommitted
	cAnswered
	cRejected
	cDropped // in memory only: the entry is gone, its slot not yet reclaimed
)

// closedList is one worker's entries, in the order they were made; dropped
// ones are reclaimed once they are half of it. The order never shows: what
// the table writes is sorted by lease.
type closedList struct {
	e    []closedEntry
	dead int
}

func (c *closedEntry) public(w WorkerID) ClosedLease {
	return ClosedLease{Lease: c.lease, Worker: w, Step: c.step, Held: c.flags&cHeld != 0, Committed: c.flags&cCommitted != 0,
		Answered: c.flags&cAnswered != 0, Rejected: c.flags&cRejected != 0, Request: c.request, Outcome: c.outcome, ClosedAt: c.closedAt}
}

func entryOf(c ClosedLease) closedEntry {
	e := closedEntry{lease: c.Lease, request: c.Request, outcome: c.Outcome, closedAt: c.ClosedAt, step: c.Step}
	if c.Held {
		e.flags |= cHeld
	}
	if c.Committed {
		e.flags |= cCommitted
	}
	if c.Answered {
		e.flags |= cAnswered
	}
	if c.Rejected {
		e.flags |= cRejected
	}
	return e
}

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
	list := o.closedBy[c.Worker]
	if list == nil {
		list = &closedList{}
		o.closedBy[c.Worker] = list
	}
	list.e = append(list.e, entryOf(c))
	o.closedLive++
	o.closedAdds = append(o.closedAdds, c)
}

// closedFind returns worker w's entry for lease id, if it has one.
func (o *Orchestrator) closedFind(w WorkerID, id LeaseID) *closedEntry {
	list := o.closedBy[w]
	if list == nil {
		return nil
	}
	for i := len(list.e) - 1; i >= 0; i-- {
		if e := &list.e[i]; e.lease == id && e.flags&cDropped == 0 {
			return e
		}
	}
	return nil
}

// closedHold marks an entry held (the worker showed it holds the lease) and
// logs it again.
func (o *Orchestrator) closedHold(w WorkerID, e *closedEntry) {
	if e.flags&cHeld != 0 {
		return
	}
	e.flags |= cHeld
	o.closedDead++ // its earlier add is superseded
	o.closedAdds = append(o.closedAdds, e.public(w))
}

// closedDrop removes an entry from the table and logs the drop.
func (o *Orchestrator) closedDrop(list *closedList, e *closedEntry) {
	if e.flags&cDropped != 0 {
		return
	}
	e.flags |= cDropped
	list.dead++
	o.closedLive--
	o.closedDead++
	o.closedDrops = append(o.closedDrops, e.lease)
}

// closedReclaim drops the slots of dropped entries once they are half of a
// list, and the list once it is empty.
func (o *Orchestrator) closedReclaim(w WorkerID) {
	list := o.closedBy[w]
	if list == nil || list.dead*2 < len(list.e) {
		return
	}
	kept := list.e[:0]
	for _, e := range list.e {
		if e.flags&cDropped == 0 {
			kept = append(kept, e)
		}
	}
	if len(kept) == 0 {
		delete(o.closedBy, w)
		return
	}
	list.e = append([]closedEntry(nil), kept...) // let a long list's array go
	list.dead = 0
}

// closedHeldBy reports whether worker w has entries in the table.
func (o *Orchestrator) closedHeldBy(w WorkerID) bool {
	list := o.closedBy[w]
	return list != nil && list.dead < len(list.e)
}

// closedListed applies rules 1 and 2 to an in-flight list of worker w: on a
// Hello (fresh) every entry it does not list goes, on a heartbeat every held
// one. A listed entry is held from now on.
func (o *Orchestrator) closedListed(w WorkerID, inflight []LeaseRef, fresh bool) {
	list := o.closedBy[w]
	if list == nil {
		return
	}
	listed := make(map[LeaseID]bool, len(inflight))
	for _, r := range inflight {
		listed[r.Lease] = true
	}
	for i := range list.e {
		e := &list.e[i]
		if e.flags&cDropped != 0 {
			continue
		}
		switch {
		case listed[e.lease]:
			o.closedHold(w, e)
		case fresh || e.flags&cHeld != 0:
			o.closedDrop(list, e)
		}
	}
	o.closedReclaim(w)
}

// expireClosed applies rules 3 and 4 (at every sweep), then decides whether
// the log is due for a rewrite.
func (o *Orchestrator) expireClosed() {
	base := o.meta.RestoredAt.Unix()
	for _, wid := range sortedKeys(o.closedBy) {
		list := o.closedBy[wid]
		w := o.workers[wid]
		for i := range list.e {
			e := &list.e[i]
			if e.flags&cDropped != 0 {
				continue
			}
			if w == nil || w.Revoked {
				o.closedDrop(list, e)
				continue
			}
			from := max(e.closedAt, base)
			window := o.cfg.CredentialTTL + o.cfg.HeartbeatTimeout + w.Grace
			if !o.now.Before(time.Unix(from, 0).Add(window)) {
				o.closedDrop(list, e)
			}
		}
		o.closedReclaim(wid)
	}
	if o.closedHi-o.closedLo >= closedCompactMin && o.closedDead >= o.closedLive {
		o.closedCompact = true
	}
	if o.closedHi > o.closedLo && o.closedLive == 0 {
		o.closedCompact = true
	}
}

// closedAll returns every live entry, sorted by lease.
func (o *Orchestrator) closedAll() []ClosedLease {
	out := make([]ClosedLease, 0, o.closedLive)
	for _, w := range sortedKeys(o.closedBy) {
		for i := range o.closedBy[w].e {
			if e := &o.closedBy[w].e[i]; e.flags&cDropped == 0 {
				out = append(out, e.public(w))
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Lease < out[j].Lease })
	return out
}

// flushClosed writes this batch's changes to the table's log: an add record
// and a drop record, or, when the sweep asked for it, a rewrite: every
// record of the log deleted and the live entries written afresh. Both are
// sorted by lease, so the log never depends on the order entries were made.
func (o *Orchestrator) flushClosed() {
	o.closedLogged += len(o.closedAdds) + len(o.closedDrops)
	if o.closedLogged > 2*o.closedLive+closedLogSlack {
		o.closedCompact = true
	}
	if o.closedCompact {
		o.closedCompact = false
		for seq := o.closedLo; seq < o.closedHi; seq++ {
			o.appends = append(o.appends, Record{Key: closedKey(seq), Delete: true})
		}
		o.closedLo = o.closedHi
		all := o.closedAll()
		for len(all) > 0 {
			n := min(len(all), maxClosedPerRecord)
			o.writeClosed(ClosedChunk{Adds: all[:n]})
			all = all[n:]
		}
		o.closedDead = 0
		o.closedLogged = o.closedLive
		o.closedAdds, o.closedDrops = nil, nil
		return
	}
	if len(o.closedAdds) > 0 {
		adds := o.closedAdds
		sort.SliceStable(adds, func(i, j int) bool { return adds[i].Lease < adds[j].Lease })
		// A lease added twice in one batch: the later add stands.
		kept := adds[:0]
		for i, c := range adds {
			if i+1 < len(adds) && adds[i+1].Lease == c.Lease {
				continue
			}
			kept = append(kept, c)
		}
		o.writeClosed(ClosedChunk{Adds: kept})
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
	table := map[LeaseID]ClosedLease{}
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
			table[c.Lease] = c
			added++
		}
		for _, id := range ch.Drops {
			delete(table, id)
		}
	}
	o.closedLive = len(table)
	o.closedDead = added - len(table)
	o.closedLogged = added
	for _, id := range sortedKeys(table) {
		c := table[id]
		list := o.closedBy[c.Worker]
		if list == nil {
			list = &closedList{}
			o.closedBy[c.Worker] = list
		}
		list.e = append(list.e, entryOf(c))
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

// closedRecords returns the table as a log of its own: its live entries,
// sorted by lease, in records of at most maxClosedPerRecord from
// closed/<closedLo>. The log as emitted is not kept in memory (only its
// records' hashes, for the fingerprint): this is what a rewrite would write,
// and Restore builds the same table from it.
func (o *Orchestrator) closedRecords() []Record {
	var recs []Record
	all := o.closedAll()
	for seq := o.closedLo; len(all) > 0; seq++ {
		n := min(len(all), maxClosedPerRecord)
		recs = append(recs, Record{Key: closedKey(seq), Value: encodeClosed(ClosedChunk{Adds: all[:n]})})
		all = all[n:]
	}
	return recs
}

// cloneClosed makes c's closed-lease table, and the hashes of its log, a
// copy of o's.
func (c *Orchestrator) cloneClosed(o *Orchestrator) {
	for w, list := range o.closedBy {
		c.closedBy[w] = &closedList{e: append([]closedEntry(nil), list.e...), dead: list.dead}
	}
	c.closedLive, c.closedLo, c.closedHi = o.closedLive, o.closedLo, o.closedHi
	c.closedDead, c.closedLogged, c.closedCompact = o.closedDead, o.closedLogged, o.closedCompact
	c.closedAdds = append([]ClosedLease(nil), o.closedAdds...)
	c.closedDrops = append([]LeaseID(nil), o.closedDrops...)
	for k, e := range o.enc {
		if isClosedKey(k) {
			c.enc[k] = e
			c.fp += e.hash
		}
	}
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

// EncodeClosed is the value of a closed-lease record (for tools and tests;
// DecodeRecord reads it back).
func EncodeClosed(ch ClosedChunk) []byte { return encodeClosed(ch) }

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
	e := o.closedFind(w, id)
	return e != nil && e.flags&cCommitted != 0 && e.step == StepHash(s)
}

// reportClosed answers a report on a lease of an archived run exactly as
// report answers it on a lease in the core (SPEC §3): the worker's exact
// duplicate of its committed report gets COMMITTED again, of the report the
// entry keeps answered REJECTED (a write-bearing step reported without a
// recorded START) REJECTED again, a conflicting duplicate or any other
// report on a committed lease REJECTED, and any other report of the lease's
// worker on its step CANCELLED (the lease lost its authority before its run
// finished).
func (o *Orchestrator) reportClosed(w *WorkerRecord, e *closedEntry, m Report, reply func(Verdict, string)) {
	if e.step != StepHash(m.Step) {
		reply(Rejected, fmt.Sprintf("lease %d is not a lease of step %s", e.lease, m.Step))
		return
	}
	o.closedHold(w.ID, e)
	sameRequest := e.flags&cAnswered != 0 && e.request == m.Request
	committed := e.flags&cCommitted != 0
	switch {
	case sameRequest && e.outcome != OutcomeHash(m.Outcome):
		reply(Rejected, "conflicting duplicate: request already answered with a different outcome")
	case committed && sameRequest:
		reply(Committed, "")
	case e.flags&cRejected != 0 && sameRequest:
		reply(Rejected, "exact duplicate of a report answered REJECTED")
	case committed:
		reply(Rejected, "a different completion for this lease was already committed")
	default:
		reply(Cancelled, "lease lost authority: it ended before its run finished")
	}
}
