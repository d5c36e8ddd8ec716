package sim

import (
	"errors"
	"fmt"
	"time"

	"github.com/tether-run/tether/core"
)

// The failover fault (Options.Failover): two or three orchestrator
// instances over one shared store that keeps the leader row of the
// PostgreSQL backend — epoch, holder, expiry — judged by the store's clock,
// which is the simulation's true time, never a host's. One instance leads:
// it is the orchestrator process of the world (w.orch); the others are
// standbys polling the row. The leader renews its lease; a standby takes
// over when the lease has lapsed, bumping the epoch, and restores from the
// store exactly as a restarted orchestrator does (SPEC §7). Every commit,
// and every group with no records (the proof of leadership), checks the
// committing instance's epoch against the row atomically with the write.
//
// Each instance has its own clock offset (hosts minutes apart): the
// orchestrator's time is its leader's clock (w.onow). The leader can be
// paused (frozen: no inputs, no timers; what it had sent still arrives) for
// longer than its lease, and cut off from the store (its commits and
// renewals fail; a commit that fails ends the process, as the real one
// exits). A leader whose lease was taken over while it was frozen or cut
// off is a zombie: when it wakes it tries to commit what it had stepped
// (or a tick's batch), the epoch check refuses it, and it stops; every
// stopped instance later comes back as a standby.

// haState is what one instance is doing.
type haState uint8

const (
	haDown    haState = iota // no process: it comes back as a standby
	haStandby                // polling the leader row
	haLeader                 // the world's orchestrator process
	haZombie                 // deposed while frozen or cut off, not yet aware
)

// haInstance is one orchestrator host.
type haInstance struct {
	idx         int
	skew        time.Duration // its clock minus the store's (true time)
	state       haState
	fence       uint64    // the epoch it took over with (leader, zombie)
	pausedUntil time.Time // frozen until then
	cutUntil    time.Time // cut off from the store until then
	gen         int       // bumped at every change of state: its loops stop
}

// leaderRow is the shared store's tether_leader row.
type leaderRow struct {
	epoch   uint64
	holder  int
	expires time.Time
}

// haCluster is the instances and the shared store's leader row.
type haCluster struct {
	row   leaderRow
	inst  []*haInstance
	lease time.Duration
	renew time.Duration
	poll  time.Duration
	// committed remembers which instance committed in each epoch
	// (PropOneWriterPerEpoch).
	committed map[uint64]int
	stats     FailoverStats
}

// FailoverStats says how much of the failover fault a run exercised.
type FailoverStats struct {
	Takeovers   int // a standby took the lead
	Zombies     int // a leader deposed while frozen or cut off
	Deposed     int // a zombie's commit or proof refused by the epoch check
	Cut         int // a leader's commit failed because the store was unreachable
	Unacked     int // of those, commits that landed though the leader heard a failure
	Impaired    int // a standby paused or cut off from the store
	SkewedTimes int // takeovers by an instance whose clock is ahead of the previous leader's
}

func (s *FailoverStats) add(o FailoverStats) {
	s.Takeovers += o.Takeovers
	s.Zombies += o.Zombies
	s.Deposed += o.Deposed
	s.Cut += o.Cut
	s.Unacked += o.Unacked
	s.Impaired += o.Impaired
	s.SkewedTimes += o.SkewedTimes
}

func (s FailoverStats) String() string {
	return fmt.Sprintf("failover: takeovers=%d (by a clock ahead %d) zombies=%d deposed=%d store-cut commits=%d (landed unacknowledged %d) standbys-impaired=%d",
		s.Takeovers, s.SkewedTimes, s.Zombies, s.Deposed, s.Cut, s.Unacked, s.Impaired)
}

var (
	errDeposed  = errors.New("deposed: another instance leads with a newer epoch")
	errStoreCut = errors.New("the store is unreachable")
)

// newCluster starts the instances: the first takes the lead at once (the
// row's expiry is -infinity), the others stand by.
func (w *world) newCluster() {
	o := w.opt
	h := &haCluster{lease: o.LeaderLease, committed: map[uint64]int{}}
	h.renew = h.lease / 4
	h.poll = min(time.Second, h.lease/4)
	for i := 0; i < o.Failover; i++ {
		skew := time.Duration(0)
		if o.HostSkewMax > 0 {
			skew = time.Duration(w.r.Int64N(int64(2*o.HostSkewMax)+1)) - o.HostSkewMax
		}
		h.inst = append(h.inst, &haInstance{idx: i, skew: skew, state: haStandby})
	}
	w.ha = h
	first := h.inst[0]
	first.state = haLeader
	h.row = leaderRow{epoch: 1, holder: 0, expires: w.now.Add(h.lease)}
	first.fence = 1
	w.skew = first.skew
	w.orch.inst, w.orch.fence = first, 1
	w.renewLoop(first)
	for _, in := range h.inst[1:] {
		w.pollLoop(in)
	}
}

// onow is the orchestrator's clock: its leader's host clock, never behind
// what its core has already seen (a restore's time, SPEC §7).
func (w *world) onow() time.Time {
	t := w.now.Add(w.skew)
	if t.Before(w.ofloor) {
		return w.ofloor
	}
	return t
}

// trueAt converts an instant of the orchestrator's clock to true time.
func (w *world) trueAt(t time.Time) time.Time { return t.Add(-w.skew) }

// orchFrozen reports whether the orchestrator process is paused.
func (w *world) orchFrozen() bool {
	return w.ha != nil && w.orch.up && w.orch.inst != nil && w.orch.inst.pausedUntil.After(w.now)
}

// ---- the store's side: the leader row, judged by the store's clock ----

// storeCheck is the epoch check every commit and every proof runs
// atomically with its write (SELECT epoch … FOR KEY SHARE); then it records
// who committed in which epoch for PropOneWriterPerEpoch.
func (w *world) storeCheck(in *haInstance, fence uint64) error {
	if in.cutUntil.After(w.now) {
		return errStoreCut
	}
	if w.ha.row.epoch != fence {
		return errDeposed
	}
	w.observeCommit(in, fence)
	return nil
}

// observeCommit is PropOneWriterPerEpoch, judged at the store: a commit
// lands only with the store's current epoch, and one epoch has one writer.
func (w *world) observeCommit(in *haInstance, fence uint64) {
	h := w.ha
	if fence != h.row.epoch {
		w.fail(PropOneWriterPerEpoch, fmt.Sprintf("instance %d committed with epoch %d, older than the store's %d (held by instance %d)", in.idx, fence, h.row.epoch, h.row.holder))
		return
	}
	if prev, ok := h.committed[fence]; ok && prev != in.idx {
		w.fail(PropOneWriterPerEpoch, fmt.Sprintf("instances %d and %d both committed in epoch %d", prev, in.idx, fence))
		return
	}
	h.committed[fence] = in.idx
}

// ---- the leader's renewals, the standbys' polls ----

func (w *world) renewLoop(in *haInstance) {
	gen := in.gen
	var tick func()
	tick = func() {
		if in.gen != gen || in.state != haLeader {
			return
		}
		switch {
		case in.pausedUntil.After(w.now):
			w.at(in.pausedUntil, evFault, -1, nil, "renewal after a pause", tick)
			return
		case in.cutUntil.After(w.now):
			// The renewal fails; the lease runs out unless the cut heals.
		case w.ha.row.epoch == in.fence:
			w.ha.row.expires = w.now.Add(w.ha.lease)
		}
		w.after(w.ha.renew, evFault, -1, nil, "", tick)
	}
	w.after(w.ha.renew, evFault, -1, nil, "", tick)
}

func (w *world) pollLoop(in *haInstance) {
	gen := in.gen
	var tick func()
	tick = func() {
		if in.gen != gen || in.state != haStandby {
			return
		}
		if !in.pausedUntil.After(w.now) && !in.cutUntil.After(w.now) && !w.ha.row.expires.After(w.now) {
			w.takeOver(in)
			return
		}
		// A poll that finds the lease unexpired changes nothing: the
		// simulation skips to the first poll that can find it lapsed.
		next := w.ha.poll
		if e := w.ha.row.expires.Sub(w.now); e > next {
			next *= (e + next - 1) / next
		}
		w.after(next, evFault, -1, nil, "", tick)
	}
	w.after(w.ha.poll, evFault, -1, nil, "", tick)
}

// takeOver: the lease lapsed; in bumps the epoch and leads. The previous
// leader, if its process still runs (frozen or cut off), becomes a zombie.
func (w *world) takeOver(in *haInstance) {
	h := w.ha
	h.row = leaderRow{epoch: h.row.epoch + 1, holder: in.idx, expires: w.now.Add(h.lease)}
	h.stats.Takeovers++
	w.fault("orchestrator-takeover")
	if old := w.orch.inst; w.orch.up && old != nil {
		w.depose(old)
	}
	if old := w.orch.inst; old == nil || in.skew > old.skew {
		h.stats.SkewedTimes++
	}
	in.gen++
	in.state, in.fence = haLeader, h.row.epoch
	w.skew = in.skew
	w.orch.inst, w.orch.fence = in, in.fence
	w.restartOrch()
	w.renewLoop(in)
}

// depose turns the running leader into a zombie: the world loses the
// process (its connections drop, what it had sent still arrives), but its
// memory and its unsynced groups wait for it to wake.
func (w *world) depose(old *haInstance) {
	n := w.orch
	z := &zombie{inst: old, o: n.o, skew: old.skew, floor: w.ofloor, groups: append(append([]*pendingBatch(nil), n.persisting...), n.pending...)}
	n.persisting = nil
	w.ha.stats.Zombies++
	w.fault("orchestrator-zombie")
	w.loseOrch()
	old.gen++
	old.state = haZombie
	wake := maxTime(w.now, maxTime(old.pausedUntil, old.cutUntil))
	w.at(wake, evFault, -1, nil, "zombie wakes", func() { w.zombieWakes(z) })
}

// zombie is a deposed leader's process, frozen or cut off.
type zombie struct {
	inst   *haInstance
	o      *core.Orchestrator
	skew   time.Duration
	floor  time.Time
	groups []*pendingBatch
}

// zombieWakes: the deposed process resumes and commits what it had stepped
// — or, with nothing pending, its timers' batch — through the same epoch
// check as any commit (a group with no records is the proof); refused, it
// stops, as the real one exits, and comes back as a standby.
func (w *world) zombieWakes(z *zombie) {
	groups := z.groups
	if len(groups) == 0 {
		now := w.now.Add(z.skew)
		if now.Before(z.floor) {
			now = z.floor
		}
		groups = []*pendingBatch{{rd: z.o.Step(now, core.Tick{})}}
	}
	if err := w.storeCheck(z.inst, z.inst.fence); err != nil {
		if errors.Is(err, errDeposed) {
			w.ha.stats.Deposed++
			w.fault("orchestrator-deposed")
		}
		w.instanceDown(z.inst)
		return
	}
	// The check let a deposed instance commit (storeCheck has failed the
	// run already): its records land over the new leader's.
	for _, pb := range groups {
		if pb.read == nil {
			w.orch.disk.Apply(pb.rd.Records)
		}
	}
}

// instanceDown: the instance's process is gone; its supervisor starts it
// again as a standby.
func (w *world) instanceDown(in *haInstance) {
	in.gen++
	in.state = haDown
	in.pausedUntil = time.Time{} // a new process; a cut from the store is the network's and stays
	down := w.uniform(time.Second, max(time.Second, w.opt.OrchDownMax))
	if w.healed {
		down = time.Second
	}
	w.after(down, evFault, -1, nil, "orchestrator instance restarts as a standby", func() {
		if in.state != haDown {
			return
		}
		in.gen++
		in.state = haStandby
		w.pollLoop(in)
	})
}

// ---- faults on the leader ----

// pauseLeader freezes the leading process, often for longer than its lease.
func (w *world) pauseLeader() {
	in := w.orch.inst
	if w.healed || !w.orch.up || in == nil || in.pausedUntil.After(w.now) {
		return
	}
	w.fault("orchestrator-pause")
	in.pausedUntil = w.now.Add(w.uniform(w.ha.lease/2, 3*w.ha.lease+time.Minute))
}

// cutLeader cuts the leading process off from the store.
func (w *world) cutLeader() {
	in := w.orch.inst
	if w.healed || !w.orch.up || in == nil || in.cutUntil.After(w.now) {
		return
	}
	w.fault("orchestrator-store-partition")
	in.cutUntil = w.now.Add(w.uniform(w.ha.lease/2, 3*w.ha.lease+time.Minute))
}

// impairStandby pauses a standby, or cuts it off from the store, for as
// long as a leader's fault lasts: it cannot take over meanwhile, so a
// lapsed lease may wait for another standby or for it to recover.
func (w *world) impairStandby() {
	var standbys []*haInstance // in index order: the draw below decides, never a map
	for _, in := range w.ha.inst {
		if in.state == haStandby && !in.pausedUntil.After(w.now) && !in.cutUntil.After(w.now) {
			standbys = append(standbys, in)
		}
	}
	if w.healed || len(standbys) == 0 {
		return
	}
	in := standbys[w.r.IntN(len(standbys))]
	until := w.now.Add(w.uniform(w.ha.lease/2, 3*w.ha.lease+time.Minute))
	w.ha.stats.Impaired++
	if w.chance(0.5) {
		w.fault("orchestrator-standby-pause")
		in.pausedUntil = until
	} else {
		w.fault("orchestrator-standby-store-partition")
		in.cutUntil = until
	}
}

func (w *world) startFailoverFaults() {
	if w.ha == nil {
		return
	}
	var f func()
	f = func() {
		if w.healed {
			return
		}
		switch r := w.r.Float64(); {
		case r < 0.4:
			w.pauseLeader()
		case r < 0.8:
			w.cutLeader()
		default:
			w.impairStandby()
		}
		w.after(w.exp(w.opt.FailoverEvery), evFault, -1, nil, "failover fault", f)
	}
	w.after(w.exp(w.opt.FailoverEvery), evFault, -1, nil, "failover fault", f)
}
