package sim

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"time"

	"github.com/tether-run/tether/core"
	"github.com/tether-run/tether/spec"
)

// The simulated data plane (SPEC §14). A step process writes its output
// (appends and puts) through its worker's step endpoint, which forwards
// each write with the worker's session credential and the process's lease;
// the orchestrator steps it as a core.DataWrite, the same input the real
// driver steps, and stores the write only if the core admits it, once the
// group it was decided in is durable (a crash before keeps neither).
//
// Zombies come of the world's faults: a paused worker forwards its
// processes' writes only when it resumes, a partitioned or clogged link
// holds a request (TCP retransmits it) for up to the data plane's request
// deadline, and a process runs on while its worker is cut off and its step
// is triaged or re-dispatched. Some writes name another worker's lease (a
// forged lease header), some a lease their own worker holds but has not
// started (a process naming its worker's lease held ahead, or still waiting
// for its StartAck: refused for a write-bearing step, SPEC §14). Every decision is checked against the Checker's
// own view of leases (spec.PropFencedWrites), never the core's answer; and
// at the end, every stored write was made under a lease current and held
// by its writer when it was stored.

// Declared writes (SPEC §14): some write-bearing steps declare outputs
// (workload.go); their processes mostly write inside them and sometimes
// outside, and every other process writes anywhere. An admitted write by
// a step that declares outputs must name one of them, by the world's own
// record of what it submitted (spec.OutputDeclared), never the core's.

// dataDeadline bounds one data-plane request: a request the network holds
// longer is lost (workers do not retry writes, SPEC §14).
const dataDeadline = 5 * time.Minute

// DataStats says how much of the data plane a run exercised.
type DataStats struct {
	Writes         int // writes that reached the orchestrator
	Admitted       int
	Stored         int // admitted writes made durable
	Zombie         int // writes under the writer's own lease, not current (or the writer not in the pool) when they arrived
	ZombieRefused  int
	Foreign        int // writes naming another worker's lease
	ForeignRefused int
	Unstarted      int // writes naming a lease the writer's worker holds and has started no process under
	UnstartedRef   int // of those, refused
	Lost           int // requests lost: the orchestrator down, or held past the deadline
	Undeclared     int // writes under the writer's current lease to an id its step does not declare
	UndeclaredRef  int // of those, refused

	Secrets SecretStats // secret reads (sim/secrets.go)
}

func (s *DataStats) add(o DataStats) {
	s.Writes += o.Writes
	s.Admitted += o.Admitted
	s.Stored += o.Stored
	s.Zombie += o.Zombie
	s.ZombieRefused += o.ZombieRefused
	s.Foreign += o.Foreign
	s.ForeignRefused += o.ForeignRefused
	s.Unstarted += o.Unstarted
	s.UnstartedRef += o.UnstartedRef
	s.Lost += o.Lost
	s.Undeclared += o.Undeclared
	s.UndeclaredRef += o.UndeclaredRef
	s.Secrets.add(o.Secrets)
}

func (s DataStats) String() string {
	return fmt.Sprintf("data writes: %d (admitted %d, stored %d; zombie %d, refused %d; another worker's lease %d, refused %d; a lease not started %d, refused %d; lost %d; undeclared %d, refused %d)",
		s.Writes, s.Admitted, s.Stored, s.Zombie, s.ZombieRefused, s.Foreign, s.ForeignRefused, s.Unstarted, s.UnstartedRef, s.Lost, s.Undeclared, s.UndeclaredRef) + "; " + s.Secrets.String()
}

// dataPlane is the world's data-plane state; its randomness is its own
// stream, so the writes change nothing else the seed decides.
type dataPlane struct {
	r       *rand.Rand
	early   *rand.Rand // picks the writes naming a lease not started: a stream apart, so the others draw as before
	req     uint64
	stored  []storedWrite
	stats   DataStats
	outputs map[string][]string // "run/name" → the step's declared outputs, as submitted
}

// declared records the outputs of a submitted run's steps.
func (w *world) declared(run core.RunID, rs core.RunSpec) {
	d := w.dataState()
	if d.outputs == nil {
		d.outputs = map[string][]string{}
	}
	for _, s := range rs.Steps {
		if len(s.Outputs) > 0 {
			d.outputs[string(run)+"/"+s.Name] = s.Outputs
		}
	}
}

// outputsOf is what a step ("run-1/a", "run-1/a[0]") declared it writes.
func (d *dataPlane) outputsOf(step core.StepID) []string {
	id, _, _ := strings.Cut(string(step), "[")
	return d.outputs[id]
}

// dataID picks the id a process of step writes: mostly inside the step's
// declared outputs, if it has any; one write in four outside them.
func (d *dataPlane) dataID(step core.StepID) string {
	outs := d.outputsOf(step)
	if len(outs) == 0 || d.r.IntN(4) == 0 {
		return fmt.Sprintf("any-%d", d.r.IntN(100))
	}
	o := outs[d.r.IntN(len(outs))]
	if p, ok := strings.CutSuffix(o, "*"); ok {
		return fmt.Sprintf("%s%d", p, d.r.IntN(10))
	}
	return o
}

// storedWrite is one durable write: who wrote under which lease, and
// whether, by the Checker's view, that lease was current and the writer's
// when the write was stored.
type storedWrite struct {
	worker core.WorkerID
	lease  core.LeaseID
	held   bool
}

func (w *world) dataState() *dataPlane {
	if w.data == nil {
		w.data = &dataPlane{r: rand.New(rand.NewPCG(w.seed, 0xda7a)), early: rand.New(rand.NewPCG(w.seed, 0xea51))}
	}
	return w.data
}

// dataWrites schedules the writes of a process that runs for dur: one to
// three, at random times during its run. A scripted run (the explorer's
// counterexamples) has no data plane.
func (w *world) dataWrites(wn *workerNode, p *proc, dur time.Duration) {
	if w.script != nil {
		return
	}
	d := w.dataState()
	gen := wn.gen
	w.secretRead(wn, p, dur) // SPEC §14a (sim/secrets.go)
	for i := 0; i < 1+d.r.IntN(3); i++ {
		off := time.Duration(d.r.Int64N(int64(dur) + 1))
		lease := p.lease
		id := d.dataID(p.step)
		w.after(off, evProc, wn.idx, nil, "data write", func() {
			if wn.gen != gen || p.done {
				return
			}
			if d.r.IntN(20) == 0 {
				lease = w.foreignLease(wn, lease)
			}
			if d.early.IntN(20) == 0 {
				lease = w.unstartedLease(wn, lease)
			}
			w.forwardWrite(wn, gen, lease, id, w.now)
		})
	}
}

// foreignLease picks the lease of a process running on another worker (a
// forged lease header), or keeps own if there is none.
func (w *world) foreignLease(wn *workerNode, own core.LeaseID) core.LeaseID {
	var ids []core.LeaseID
	for _, o := range w.workers {
		if o == wn || !o.alive {
			continue
		}
		for id, p := range o.procs {
			if !p.done {
				ids = append(ids, id)
			}
		}
	}
	if len(ids) == 0 {
		return own
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids[w.dataState().r.IntN(len(ids))]
}

// writeAtStart is, now and then, a write under a lease its worker is
// about to start (its Start just sent): a step endpoint that forwards a
// write before the StartAck, racing the Start to the orchestrator.
func (w *world) writeAtStart(wn *workerNode, l core.LeaseID) {
	if w.script != nil {
		return
	}
	d := w.dataState()
	if d.early.IntN(4) != 0 {
		return
	}
	w.forwardWrite(wn, wn.gen, l, fmt.Sprintf("any-%d", d.early.IntN(100)), w.now)
}

// unstartedLease picks a lease worker wn holds with no process started
// under it (held ahead, or waiting for its StartAck), or keeps l if there
// is none.
func (w *world) unstartedLease(wn *workerNode, l core.LeaseID) core.LeaseID {
	var ids []core.LeaseID
	for _, ref := range wn.m.InFlight() { // sorted by lease
		if wn.procs[ref.Lease] == nil {
			ids = append(ids, ref.Lease)
		}
	}
	if len(ids) == 0 {
		return l
	}
	return ids[w.dataState().early.IntN(len(ids))]
}

// forwardWrite is the worker's step endpoint forwarding a write issued at
// issued: a paused worker forwards it when it resumes; then the network
// carries it, holding it while the link is cut or clogged, until the
// request's deadline.
func (w *world) forwardWrite(wn *workerNode, gen int, lease core.LeaseID, id string, issued time.Time) {
	if wn.gen != gen || !wn.alive {
		return
	}
	d := w.dataState()
	if w.now.Before(wn.pausedUntil) || len(wn.deferred) > 0 {
		at := maxTime(wn.pausedUntil, w.now.Add(time.Millisecond))
		w.at(at, evWorkerTick, wn.idx, nil, "data write forwarded after a pause", func() {
			w.forwardWrite(wn, gen, lease, id, issued)
		})
		return
	}
	lk := &wn.link
	if lk.cutUp || lk.clogUntil.After(w.now) {
		if w.now.Sub(issued) >= dataDeadline {
			d.stats.Lost++
			return
		}
		w.after(time.Second+time.Duration(d.r.Int64N(int64(4*time.Second))), evWorkerTick, wn.idx, nil, "data write retransmitted", func() {
			w.forwardWrite(wn, gen, lease, id, issued)
		})
		return
	}
	cred := wn.m.Credential()
	if cred == "" {
		return // not enrolled: it has no lease to write under
	}
	delay := time.Duration(float64(w.opt.DelayMin+time.Duration(d.r.Int64N(int64(w.opt.DelayMax-w.opt.DelayMin)+1))) * lk.scale)
	d.req++
	req := d.req
	w.after(delay, evToOrch, wn.idx, nil, fmt.Sprintf("data write lease=%d", lease), func() {
		w.arriveWrite(wn.id, core.DataWrite{Req: req, Credential: cred, Lease: lease, ID: id})
	})
}

// arriveWrite is a data-plane write reaching the orchestrator: the core
// decides it; the decision is checked against the Checker's view; an
// admitted write is stored once its group is durable.
func (w *world) arriveWrite(writer core.WorkerID, in core.DataWrite) {
	d := w.dataState()
	if !w.orch.up || w.orchFrozen() {
		d.stats.Lost++
		return
	}
	foreign, unstarted := false, false
	for _, o := range w.workers {
		if p := o.procs[in.Lease]; p != nil && o.id != writer {
			foreign = true
		}
		if o.id == writer && o.procs[in.Lease] == nil {
			for _, ref := range o.m.InFlight() {
				unstarted = unstarted || ref.Lease == in.Lease
			}
		}
	}
	rd := w.orchInput(in)
	if w.failure != nil {
		return
	}
	var a *core.DataAnswer
	for i := range rd.Writes {
		if rd.Writes[i].Req == in.Req {
			a = &rd.Writes[i]
		}
	}
	if a == nil {
		w.fail(spec.PropFencedWrites, fmt.Sprintf("the batch that stepped data write %d (worker %s, lease %d) did not answer it", in.Req, writer, in.Lease))
		return
	}
	held := w.chk.LeaseHeldBy(writer, in.Lease)
	step, _ := w.chk.LeaseStep(in.Lease)
	declared := !held || spec.OutputDeclared(d.outputsOf(step), in.ID)
	if !declared {
		d.stats.Undeclared++
	}
	d.stats.Writes++
	zombie := !held && !foreign
	if zombie {
		d.stats.Zombie++
	}
	if foreign {
		d.stats.Foreign++
	}
	if unstarted {
		d.stats.Unstarted++
	}
	if a.Refusal != core.WriteAdmitted {
		if unstarted {
			d.stats.UnstartedRef++
		}
		if !declared {
			d.stats.UndeclaredRef++
		}
		if zombie {
			d.stats.ZombieRefused++
		}
		if foreign {
			d.stats.ForeignRefused++
		}
		return
	}
	d.stats.Admitted++
	if v := w.chk.WriteDecided(writer, in.Lease, *a); v != nil {
		w.fail(v.Invariant, v.Detail)
		return
	}
	if !declared {
		w.fail(spec.PropFencedWrites, fmt.Sprintf("a data-plane write by worker %s under lease %d (step %s) to %q was admitted, but the step declares outputs %q", writer, in.Lease, step, in.ID, d.outputsOf(step)))
		return
	}
	sw := storedWrite{worker: writer, lease: in.Lease, held: held}
	w.orchRead(func() {
		d.stored = append(d.stored, sw)
		d.stats.Stored++
	})
}

// checkStoredWrites is the end-of-run half of spec.PropFencedWrites:
// nothing stored came from a lease that was not current, or not its
// writer's, when it was stored.
func (w *world) checkStoredWrites() {
	if w.data == nil {
		return
	}
	for _, s := range w.data.stored {
		if !s.held {
			w.fail(spec.PropFencedWrites, fmt.Sprintf("the data store holds a write by worker %s under lease %d, which was not current and its own when stored", s.worker, s.lease))
			return
		}
	}
}

// dataStats is what the run's data plane did (zero when it had none).
func (w *world) dataStats() DataStats {
	if w.data == nil {
		return DataStats{}
	}
	return w.data.stats
}
