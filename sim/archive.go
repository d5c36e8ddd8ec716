package sim

import (
	"slices"
	"strings"

	"github.com/tether-run/tether/core"
	"github.com/tether-run/tether/spec"
)

// Archival (SPEC §7a): a finished run leaves the core in the batch that
// finishes it. The world reads finished runs through the checker's archive
// (the history records of the batches it saw, those a crash took back
// forgotten), and the stored log lines of archived leases from its disk,
// where they stay.

// ArchiveStats says how much of archival a run exercised.
type ArchiveStats struct {
	Archived int // runs archived (history records made durable)
	// Late counts reports of leases of archived runs, answered from the
	// closed-lease table (a worker re-sending a report whose answer it
	// lost, or a late duplicate); Restarted, those of them that reached
	// an orchestrator restarted since the lease's run was archived.
	Late, Restarted int
	Listed          int // Hellos and heartbeats listing a lease of an archived run
}

func (s *ArchiveStats) add(o ArchiveStats) {
	s.Archived += o.Archived
	s.Late += o.Late
	s.Restarted += o.Restarted
	s.Listed += o.Listed
}

// archiveState is what the world keeps of archival.
type archiveState struct {
	stats ArchiveStats
	epoch map[core.LeaseID]int                // a lease of an archived run → the incarnation in which its archival became durable
	idem  *spec.Idempotency                   // spec.PropIdempotentReport's memory of durable answers
	logs  map[core.LeaseID][]core.StepLogLine // the disk's log lines by lease, read once at the end
}

// view is the orchestrator's live state merged with the archive.
func (w *world) view() spec.View { return w.chk.View(w.orch.o) }

// noteLate counts an input about a lease of an archived run, just before
// the orchestrator handles it.
func (w *world) noteLate(in core.Input) {
	r, ok := in.(core.Received)
	if !ok {
		return
	}
	who, _ := w.orch.o.ConnWorker(r.Conn)
	if h, ok := r.Msg.(core.Hello); ok {
		who = h.Worker
	}
	closed := func(id core.LeaseID) bool {
		_, ok := w.orch.o.ClosedLease(who, id)
		return ok
	}
	switch m := r.Msg.(type) {
	case core.Report:
		if closed(m.Lease) {
			w.arch.stats.Late++
			if e, ok := w.arch.epoch[m.Lease]; ok && e < w.orch.epoch {
				w.arch.stats.Restarted++
			}
		}
	case core.Hello:
		for _, l := range m.InFlight {
			if closed(l.Lease) {
				w.arch.stats.Listed++
			}
		}
	case core.Heartbeat:
		for _, l := range m.InFlight {
			if closed(l.Lease) {
				w.arch.stats.Listed++
			}
		}
	}
}

// persistedArchive counts a durable batch's history records and notes the
// incarnation that made each of its leases' archival durable.
func (w *world) persistedArchive(rd core.Ready) {
	for _, r := range rd.Records {
		if !core.IsHistoryKey(r.Key) {
			continue
		}
		w.arch.stats.Archived++
		// The checker decoded it when it saw the batch.
		h, ok := w.chk.Archive().Run(core.RunID(strings.TrimPrefix(r.Key, core.KindHistory+"/")))
		if !ok || core.HistoryKey(h.Run.ID) != r.Key {
			continue // the checker reports it (spec.PropArchivedWhenDone)
		}
		if w.arch.epoch == nil {
			w.arch.epoch = map[core.LeaseID]int{}
		}
		for _, l := range h.Leases {
			w.arch.epoch[l.ID] = w.orch.epoch
		}
	}
}

// storedLogs returns the stored log lines of lease l: the core's for a
// live lease, the disk's for a lease of an archived run (its log records
// stay in the store under the lease, SPEC §7a).
func (w *world) storedLogs(l core.LeaseRecord) []core.StepLogLine {
	if _, live := w.orch.o.StepByID(l.Step); live {
		var out []core.StepLogLine
		for _, ln := range w.orch.o.StepLogs(l.Step) {
			if ln.Lease == l.ID {
				out = append(out, ln)
			}
		}
		return out
	}
	if w.arch.logs == nil {
		w.arch.logs = map[core.LeaseID][]core.StepLogLine{}
		recs := w.orch.disk.Records() // sorted: a lease's records in index (arrival) order
		lo, _ := slices.BinarySearchFunc(recs, core.KindLog+"/", func(r core.Record, k string) int { return strings.Compare(r.Key, k) })
		for _, r := range recs[lo:] {
			if !strings.HasPrefix(r.Key, core.KindLog+"/") {
				break
			}
			v, err := core.DecodeRecord(r)
			if ln, ok := v.(*core.StepLogLine); err == nil && ok {
				w.arch.logs[ln.Lease] = append(w.arch.logs[ln.Lease], *ln)
			}
		}
	}
	return w.arch.logs[l.ID]
}

func (w *world) idem() *spec.Idempotency {
	if w.arch.idem == nil {
		w.arch.idem = spec.NewIdempotency()
	}
	return w.arch.idem
}

// checkIdempotent judges a report's answer against the durable answers of
// its exact duplicates (spec.PropIdempotentReport), the closed-lease
// table's among them; a first answer is remembered once its batch is
// durable.
func (w *world) checkIdempotent(in core.Input, from core.WorkerID, pb *pendingBatch) {
	_, first, v := w.idem().Judge(in, from, pb.rd)
	if v != nil {
		w.fail(v.Invariant, v.Detail)
	}
	pb.idem = first
}
