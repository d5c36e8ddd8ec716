package sim

import (
	"errors"
	"slices"
	"sort"
	"time"

	"github.com/tether-run/tether/adapters/commit"
	"github.com/tether-run/tether/core"
	"github.com/tether-run/tether/spec"
)

// orchNode is the orchestrator process: the real core machine behind the same
// driver discipline the real adapters follow (core/doc.go): a batch's records
// are synced to disk BEFORE any of its messages or answers leave. Inputs that
// arrive while an fsync is in flight are stepped and grouped into the next
// commit (group commit).
type orchNode struct {
	o     *core.Orchestrator
	up    bool
	epoch int // incarnation; a crash makes every older event moot
	disk  *simDisk

	pending    []*pendingBatch // stepped, not yet being persisted
	persisting []*pendingBatch // in the fsync now
	tickAt     time.Time

	// With the failover fault (failover.go): the instance running this
	// process and the epoch it leads with.
	inst  *haInstance
	fence uint64
	woke  time.Time // the end of the last pause its properties have seen
}

// pendingBatch is one stepped batch, or a read answered only once everything
// stepped before it is durable.
type pendingBatch struct {
	rd   core.Ready
	read func()
	idem *spec.IdemAnswer // a report's first answer, remembered once durable
}

// orchInput steps one input through the orchestrator and returns its batch
// (empty while the orchestrator is down).
func (w *world) orchInput(in core.Input) core.Ready {
	n := w.orch
	if !n.up {
		return core.Ready{}
	}
	if w.orchFrozen() {
		// A paused process reads nothing: the input waits for it to wake,
		// and dies with it if it is deposed meanwhile.
		epoch := n.epoch
		w.at(n.inst.pausedUntil, evToOrch, -1, nil, "after a pause", func() {
			if n.epoch == epoch && n.up {
				w.orchInput(in)
			}
		})
		return core.Ready{}
	}
	now := w.onow()
	if n.inst != nil && !n.inst.pausedUntil.IsZero() && !n.woke.Equal(n.inst.pausedUntil) {
		n.woke = n.inst.pausedUntil
		w.props.timeouts.Woke(now)
		w.props.poolView(w).Woke(now)
	}
	w.chk.Input(now, in)
	held := w.heldReported(in)
	from := w.inputFrom(in)
	w.noteLate(in)
	arch := w.chk.Archive() // the history seen before this input
	w.idem().Listing(in, from, func(l core.LeaseID) bool { _, ok := arch.Lease(l); return ok })
	rd := n.o.Step(now, in)
	w.ofloor = n.o.Now()
	w.doctor(&rd)
	w.chk.Batch(now, n.o, rd)
	w.checkBatch(held, from, rd)
	pb := &pendingBatch{rd: rd}
	w.checkIdempotent(in, from, pb)
	w.queueBatch(pb)
	return rd
}

// queueBatch queues a batch for the write-ahead pipeline.
func (w *world) queueBatch(pb *pendingBatch) {
	n := w.orch
	w.digest(pb.rd)
	n.pending = append(n.pending, pb)
	w.scheduleOrchTick(pb.rd.Deadline)
	w.maybePersist()
}

// orchRead answers a read once everything stepped so far is durable: a
// reader never sees state a crash could take back.
func (w *world) orchRead(fn func()) {
	n := w.orch
	n.pending = append(n.pending, &pendingBatch{read: fn})
	w.maybePersist()
}

func (w *world) maybePersist() {
	n := w.orch
	if len(n.persisting) > 0 || len(n.pending) == 0 {
		return
	}
	n.persisting, n.pending = n.pending, nil
	d := w.uniform(w.opt.FsyncMin, w.opt.FsyncMax)
	if w.buggify("slow-fsync") {
		d += w.uniform(500*time.Millisecond, 5*time.Second)
	}
	epoch := n.epoch
	live := func() bool { return n.epoch == epoch && n.up }
	var fsynced func()
	fsynced = func() {
		if !live() {
			return
		}
		if w.orchFrozen() {
			w.at(n.inst.pausedUntil, evPersist, -1, nil, "after a pause", fsynced)
			return
		}
		group := n.persisting
		n.persisting = nil
		if archives(group) && w.buggify(SiteCrashAfterArchive) {
			// Synced, and the process dies before anything of it leaves.
			if w.ha == nil || w.storeCheck(n.inst, n.fence) == nil {
				w.persist(group)
			}
			w.crashOrchAt("orchestrator-crash-after-archive")
			return
		}
		w.commit(group)
		w.maybePersist()
	}
	w.after(d, evPersist, -1, nil, "", fsynced).on(0, live).folded()
}

// archives says whether a group archives a run (SPEC §7a).
func archives(group []*pendingBatch) bool {
	for _, pb := range group {
		for _, r := range pb.rd.Records {
			if core.IsHistoryKey(r.Key) {
				return true
			}
		}
	}
	return false
}

// persist makes a group's records durable (one atomic transaction).
func (w *world) persist(group []*pendingBatch) {
	n := w.orch
	for _, pb := range group {
		if pb.read != nil {
			continue
		}
		n.disk.Apply(pb.rd.Records)
		w.chk.Persisted(w.onow(), pb.rd)
		w.props.poolView(w).Persisted()
		w.persistedArchive(pb.rd)
		w.persistedChildren(pb.rd)
		w.persistedSchedules(pb.rd)
		if pb.idem != nil {
			w.idem().Record(*pb.idem)
		}
	}
}

// commit runs the real drivers' write-ahead code (adapters/commit) over a
// group whose fsync just completed: records durable, then messages, then
// answers; then the group's reads are answered.
func (w *world) commit(group []*pendingBatch) {
	var g commit.Group
	for _, pb := range group {
		if pb.read == nil {
			g.Add(pb.rd)
		}
	}
	err := g.Commit(func([]core.Record) error {
		if !w.healed && w.chance(w.opt.FsyncCrashP) {
			return errCrashInFsync // the process dies before the sync completes
		}
		if w.ha != nil {
			// Every group, records or none, is preceded by the epoch
			// check, atomically with its write (SPEC §11).
			if err := w.storeCheck(w.orch.inst, w.orch.fence); err != nil {
				if errors.Is(err, errStoreCut) && w.ha.row.epoch == w.orch.fence && w.chance(0.3) {
					// The link broke after the commit reached the
					// store: it landed, and the leader heard only the
					// failure. Its fate unknown, the leader exits
					// (SPEC §11); the next leader restores it.
					w.observeCommit(w.orch.inst, w.orch.fence)
					w.persist(group)
					w.ha.stats.Unacked++
				}
				return err
			}
		}
		w.persist(group)
		return nil
	}, func(e core.Envelope) { w.sendToWorker(e.Conn, e.Msg) }, w.answered)
	if err != nil {
		// Nothing of the group became durable: it dies with the process.
		w.orch.pending = append(group, w.orch.pending...)
		w.orch.persisting = nil
		switch {
		case errors.Is(err, errStoreCut):
			// The real driver exits when a commit's fate is unknown.
			w.ha.stats.Cut++
			w.crashOrchAt("orchestrator-exits-store-unreachable")
		case errors.Is(err, errDeposed):
			w.ha.stats.Deposed++
			w.crashOrchAt("orchestrator-deposed")
		default:
			w.crashOrchAt("orchestrator-crash-in-fsync")
		}
		return
	}
	for _, pb := range group {
		if pb.read != nil {
			pb.read()
		}
	}
}

func (w *world) scheduleOrchTick(at time.Time) {
	n := w.orch
	if at.IsZero() {
		return
	}
	if !n.tickAt.IsZero() && !n.tickAt.Before(w.onow()) && !at.Before(n.tickAt) {
		return
	}
	n.tickAt = at
	epoch := n.epoch
	live := func() bool { return n.epoch == epoch && n.up && n.tickAt.Equal(at) }
	w.at(w.trueAt(at), evOrchTick, -1, nil, "", func() {
		if !live() {
			return
		}
		n.tickAt = time.Time{}
		w.orchInput(core.Tick{})
	}).on(0, live)
}

var errCrashInFsync = errors.New("orchestrator died during fsync")

// crashOrch kills the orchestrator process: memory, connections and every
// batch not yet synced are gone. An fsync in flight completes or not.
func (w *world) crashOrch() { w.crashOrchAt("orchestrator-crash") }

func (w *world) crashOrchAt(kind string) {
	n := w.orch
	if !n.up {
		return
	}
	w.fault(kind)
	if len(n.persisting) > 0 && w.chance(0.5) && (w.ha == nil || w.storeCheck(n.inst, n.fence) == nil) {
		w.persist(n.persisting) // synced, but nothing of it was sent
		n.persisting = nil
	}
	w.loseOrch()
	if w.ha != nil {
		w.instanceDown(n.inst)
		return
	}
	down := w.uniform(time.Second, max(time.Second, w.opt.OrchDownMax))
	if w.healed {
		down = time.Second
	}
	w.after(down, evFault, -1, nil, "orchestrator restarts", w.restartOrch)
}

// loseOrch: the orchestrator process is gone from the world: memory,
// connections (what it had sent still arrives), every batch not synced.
func (w *world) loseOrch() {
	n := w.orch
	n.up = false
	n.epoch++
	n.pending, n.persisting = nil, nil
	n.tickAt = time.Time{}
	w.chk.Crash(w.onow())
	w.props.poolView(w).Crash()
	for _, c := range w.sortedConns() {
		if c.orchOpen {
			c.orchOpen = false
			w.flushAndBreak(c)
		}
	}
	for _, call := range w.calls {
		call.lost = true
	}
}

// restartOrch rebuilds the orchestrator from what was durable (SPEC §7).
func (w *world) restartOrch() {
	n := w.orch
	if n.up {
		return
	}
	now := w.onow()
	if w.cfg.restoring != nil {
		w.cfg.restoring(w.coreConfig(), now, n.disk)
	}
	o, rd, err := core.Restore(w.coreConfig(), now, n.disk.RestoreRecords())
	if err != nil {
		w.fail("restore", err.Error())
		return
	}
	n.o = o
	n.up = true
	w.ofloor = o.Now()
	if w.fired {
		w.locks.Restarts++ // a restart after a fire: the next fire must not repeat it
		w.fired = false
	}
	w.doctor(&rd)
	w.chk.Restored(now, o, rd)
	w.checkArmedTimeouts()
	w.props.timeouts.Reset(w.view(), now)
	w.props.poolView(w).Restored(now)
	w.grants.restored = true
	w.checkBatch(nil, "", rd)
	w.queueBatch(&pendingBatch{rd: rd})
}

func (w *world) coreConfig() core.Config { return w.orchCfg }

// doctor plants Options.Mutate's bug in a batch the driver was handed: the
// Checker and the network see the doctored messages, answers, events and
// deadline; the records stay the ones the core emitted, so the durable
// store (and a restore from it) keeps what the core emitted.
func (w *world) doctor(rd *core.Ready) {
	if w.opt.Mutate == nil {
		return
	}
	recs := slices.Clone(rd.Records)
	w.opt.Mutate(rd)
	rd.Records = recs
}

func (w *world) sortedConns() []*conn {
	ids := make([]core.ConnID, 0, len(w.conns))
	for id := range w.conns {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	out := make([]*conn, len(ids))
	for i, id := range ids {
		out[i] = w.conns[id]
	}
	return out
}
