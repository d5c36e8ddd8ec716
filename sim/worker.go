package sim

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tether-run/tether/core"
)

// workerNode is one worker process: the real core.Worker, a skewed clock,
// its step processes, and its network link.
type workerNode struct {
	idx     int
	id      core.WorkerID
	m       *core.Worker
	alive   bool
	gen     int // bumped on crash/exit: events of a dead process are moot
	conn    core.ConnID
	link    link
	scaler  bool
	allTags bool

	// Clock: local(t) = t + offset + drift×(t−t0) + jumps + wobble·sin(2π(t−t0)/period).
	offset time.Duration
	drift  float64
	jumps  time.Duration
	wobble time.Duration
	period time.Duration

	pausedUntil time.Time
	deferred    []core.WorkerInput // inputs that arrived while paused, in order
	pumping     bool               // pump is running: do not re-enter it
	tickAt      time.Time
	procs       map[core.LeaseID]*proc
	procIDs     []core.LeaseID // procs' keys, ascending
	pumpIDs     []core.LeaseID // pump's copy of procIDs
	revoked     bool
	replay      bool // booted with a replayed token: must be refused, is not replaced
}

// proc is one simulated step process.
type proc struct {
	lease   core.LeaseID
	step    core.StepID
	writes  bool
	done    bool
	ignTerm bool
	termed  bool // SIGTERM was sent
	// The pipe between the process and the worker's reader (SPEC §10): what
	// it printed and the reader has not read yet, and its exit, reported
	// once the pipe is drained (after all of its output, as the driver does).
	pipe []string
	exit *core.WExecExited
	held bool // the reader is held: lines in the pipe, output paused
}

// pipeBatch is the most lines the simulated reader takes at once.
const pipeBatch = 50

// local is the worker's clock reading at simulated time t. It is strictly
// increasing (wobble's slope stays far below 1), so deadlines can be mapped
// back by bisection.
func (wn *workerNode) local(t time.Time) time.Time {
	el := t.Sub(t0)
	d := wn.offset + time.Duration(float64(el)*wn.drift) + wn.jumps
	if wn.wobble != 0 {
		d += time.Duration(float64(wn.wobble) * math.Sin(2*math.Pi*float64(el)/float64(wn.period)))
	}
	return t.Add(d)
}

// simTimeFor maps a local deadline back to simulated time (the first
// simulated instant whose local reading is at or after it): a bisection
// from now to past the deadline down to a microsecond. Its answer is that
// of comparing local(mid) with the deadline at every midpoint (traces
// depend on it to the nanosecond); most comparisons are decided without
// evaluating the clock (bisect).
func (wn *workerNode) simTimeFor(now time.Time, local time.Time) time.Time {
	ln := wn.local(now)
	if !ln.Before(local) {
		return now
	}
	if wn.drift == 0 && wn.wobble == 0 {
		return local.Add(-wn.offset - wn.jumps) // exact: only an offset
	}
	return wn.bisect(now, local, ln, wn.slopeMin())
}

// slopeMin is a lower bound of the clock's rate against simulated time:
// 1 − |drift| − the wobble's steepest slope.
func (wn *workerNode) slopeMin() float64 {
	s := 1 - math.Abs(wn.drift)
	if wn.wobble != 0 {
		s -= 2 * math.Pi * float64(wn.wobble) / float64(wn.period)
	}
	return s
}

// clockSlack bounds how far two readings of local may fall from the line
// of slope slopeMin through them: the truncations to nanoseconds and the
// floating-point error, a few nanoseconds, with a wide margin.
const clockSlack = 128 * time.Nanosecond

// bisect is simTimeFor's bisection, given the clock's reading ln at now.
// Once the clock has been read at a with local(a) < deadline,
// local(mid) < deadline for every mid with slope·(a − mid) > clockSlack,
// as the clock's rate is at least slope; likewise above a reading b at or
// after the deadline. So it first reads the clock at a few points
// converging on the crossing (secant steps) and one on its other side,
// and then reads it only at midpoints too near a or b to be decided. With
// slope at or below one half (never with the workload's clocks), it reads
// every midpoint. Times are offsets from now, which is exact: the
// bisection adds and halves nanoseconds.
func (wn *workerNode) bisect(now, local, ln time.Time, slope float64) time.Time {
	gap := local.Sub(ln)
	var lo, hi time.Duration = 0, 2*gap + time.Hour
	exact := slope <= 0.5
	// a, b: the nearest readings below and at or after the deadline, and
	// the clock's distance from it there.
	a, fa := time.Duration(0), -gap
	var b, fb time.Duration
	haveB := false
	read := func(x time.Duration) (time.Duration, bool) {
		f := wn.local(now.Add(x)).Sub(local)
		if f < 0 {
			if x > a {
				a, fa = x, f
			}
			return f, true
		}
		if !haveB || x < b {
			b, fb, haveB = x, f, true
		}
		return f, false
	}
	margin := time.Duration(float64(clockSlack) / slope)
	if !exact {
		// Secant steps towards the crossing, kept inside the bracket; a
		// few reach within nanoseconds of it.
		x := time.Duration(float64(gap) / (1 + wn.drift))
		for range 6 {
			if x <= a || (haveB && x >= b) || x > hi {
				break
			}
			if f, _ := read(x); -clockSlack < f && f < clockSlack {
				break
			}
			if haveB {
				x = a + time.Duration(float64(b-a)*float64(-fa)/float64(fb-fa))
			} else {
				x = a + time.Duration(float64(-fa)/(1+wn.drift))
			}
		}
		// Bracket the crossing tightly from the reading nearer to it: the
		// clock gains at least slope·d over any d.
		if !haveB || b-a > 4*margin {
			if !haveB || -fa <= fb {
				if x := a + time.Duration(float64(-fa)/slope) + 2*margin; x < hi {
					read(x)
				}
			} else if x := b - time.Duration(float64(fb)/slope) - 2*margin; x > 0 {
				read(x)
			}
		}
	}
	for hi-lo > time.Microsecond {
		mid := lo + (hi-lo)/2
		var before bool
		switch {
		case !exact && mid+margin < a:
			before = true
		case !exact && haveB && mid > b+margin:
			before = false
		default:
			_, before = read(mid)
		}
		if before {
			lo = mid
		} else {
			hi = mid
		}
	}
	return now.Add(hi)
}

// workerTags are the tags the workload's steps require (SPEC §8), and
// tagSets every set of them a worker may declare: each worker draws one, so
// most hold some of the tags a step requires and not all (the last set, all
// of them, is the all-tags worker's that keeps every run able to finish).
var workerTags = []string{"arm", "docker", "gpu"}

var tagSets = [][]string{nil, {"arm"}, {"docker"}, {"gpu"}, {"arm", "docker"}, {"arm", "gpu"}, {"docker", "gpu"}, {"arm", "docker", "gpu"}}

// spawnWorker boots a new worker instance with an enrollment token.
func (w *world) spawnWorker(token string, scaler, allTags bool) *workerNode {
	idx := len(w.workers)
	wn := &workerNode{idx: idx, id: core.WorkerID(fmt.Sprintf("w%d", idx+1)), alive: true, scaler: scaler,
		allTags: allTags, procs: map[core.LeaseID]*proc{}}
	wn.link.scale = 0.5 + 2.5*w.r.Float64()
	if !w.healed {
		// Clocks draw from their own stream, so a clock change alters nothing
		// else about the run.
		cr := w.clockR
		wn.offset = time.Duration(cr.Int64N(2*int64(w.opt.ClockOffsetMax)+1)) - w.opt.ClockOffsetMax
		wn.drift = (2*cr.Float64() - 1) * w.opt.DriftMax
		wn.wobble = time.Duration(cr.Int64N(int64(w.opt.WobbleAmp) + 1))
		wn.period = 5*time.Minute + time.Duration(cr.Int64N(int64(15*time.Minute)))
	}
	if w.cfg.ShiftClocks {
		// Hours either way, every worker its own (SPEC §11: the run must
		// not change).
		d := ShiftMin + time.Duration(w.shiftR.Int64N(int64(ShiftMax-ShiftMin)+1))
		if w.shiftR.IntN(2) == 0 {
			d = -d
		}
		wn.offset += d
	}
	if w.cfg.Redrift {
		wn.drift = (2*w.driftR.Float64() - 1) * RedriftMax
	}
	tags := tagSets[w.r.IntN(len(tagSets))]
	if allTags {
		tags = tagSets[len(tagSets)-1]
	}
	cfg := core.WorkerConfig{
		ID: wn.id, Name: string(wn.id), Token: token, Tags: tags,
		Slots: 1 + w.r.IntN(w.opt.SlotsMax), Scaler: scaler,
		NoReconnect: !scaler && !allTags && !w.healed && w.chance(w.opt.NoReconnectFrac),
		Seed:        w.r.Uint64(), BackoffMax: w.opt.MaxDelayWork,
		LogWindowLines: w.opt.LogWindow, OutputCapBytes: w.opt.OutputCap, DrainTimeout: w.opt.DrainTimeout,
		LinkLosesFrames: !w.cfg.StreamLinks,
	}
	if w.opt.Ahead && !scaler {
		cfg.Ahead = w.aheadR.IntN(max(cfg.Slots, 4) + 1)
	}
	w.bootWorker(wn, cfg)
	return wn
}

// bootWorker starts a worker process with its configuration.
func (w *world) bootWorker(wn *workerNode, cfg core.WorkerConfig) {
	wn.m = core.NewWorker(cfg)
	w.workers = append(w.workers, wn)
	w.stepWorker(wn, core.WBoot{})
	w.scheduleWorkerFaults(wn)
}

// stepWorker feeds one input to a worker (deferred while it is paused).
func (w *world) stepWorker(wn *workerNode, in core.WorkerInput) {
	if !wn.alive {
		return
	}
	if w.now.Before(wn.pausedUntil) || len(wn.deferred) > 0 {
		// A paused process reads its inputs later, in the order they came.
		wn.deferred = append(wn.deferred, in)
		if len(wn.deferred) == 1 {
			gen := wn.gen
			w.at(wn.pausedUntil, evWorkerTick, wn.idx, nil, "resumes", func() {
				if wn.gen == gen {
					w.resume(wn)
				}
			})
		}
		return
	}
	rd := wn.m.Step(wn.local(w.now), in)
	w.applyWorker(wn, rd)
	w.pump(wn) // an ack or a released lease may let a reader read on
}

// resume feeds a paused worker what it missed, in order.
func (w *world) resume(wn *workerNode) {
	for len(wn.deferred) > 0 && wn.alive && !w.now.Before(wn.pausedUntil) {
		in := wn.deferred[0]
		wn.deferred = wn.deferred[1:]
		w.applyWorker(wn, wn.m.Step(wn.local(w.now), in))
	}
	w.pump(wn)
	if len(wn.deferred) > 0 && wn.alive {
		gen := wn.gen
		w.at(wn.pausedUntil, evWorkerTick, wn.idx, nil, "resumes", func() {
			if wn.gen == gen {
				w.resume(wn)
			}
		})
	}
}

func (w *world) applyWorker(wn *workerNode, rd core.WorkerReady) {
	for _, m := range rd.Send {
		switch m := m.(type) {
		case core.Report:
			w.hist.reportSent(w.now, wn.id, m)
			if w.orch.up && w.buggify("cancel-race") {
				run, _, _ := strings.Cut(string(m.Step), "/")
				w.cancelRun(core.RunID(run))
			}
			w.sendToOrch(wn, m)
			if w.buggify("report-twice") {
				w.sendToOrch(wn, m)
			}
			if w.buggify("drop-after-send") {
				if c := w.conns[wn.conn]; c != nil {
					w.breakConn(c, true)
				}
			}
			continue
		case core.Heartbeat:
			if w.buggify("late-heartbeat") {
				gen, c := wn.gen, wn.conn
				w.after(w.uniform(time.Minute, 3*time.Minute), evWorkerTick, wn.idx, m, "late", func() {
					if wn.gen == gen && wn.conn == c {
						w.sendToOrch(wn, m)
					}
				})
				continue
			}
		case core.Start:
			w.writeAtStart(wn, m.Lease)
			if w.buggify("late-start") {
				gen, c := wn.gen, wn.conn
				w.after(w.uniform(10*time.Second, 30*time.Second), evWorkerTick, wn.idx, m, "late", func() {
					if wn.gen == gen && wn.conn == c {
						w.sendToOrch(wn, m)
					}
				})
				continue
			}
		}
		w.sendToOrch(wn, m)
	}
	if rd.Close {
		if c := w.conns[wn.conn]; c != nil {
			c.broken, c.brokenAt = true, w.now
			if c.orchOpen {
				epoch := w.orch.epoch
				live := func() bool { return w.orch.epoch == epoch && c.orchOpen && w.orch.up }
				w.after(w.uniform(0, time.Second), evOrchNotice, wn.idx, nil, "worker closed", func() {
					if live() {
						c.orchOpen = false
						w.orchInput(core.Disconnected{Conn: c.id})
					}
				}).on(c.id, live)
			}
		}
		wn.conn = 0
	}
	if rd.Dial {
		w.dial(wn)
	}
	for _, x := range rd.Exec {
		w.exec(wn, x)
	}
	for _, l := range rd.Logs {
		switch l.Level {
		case core.LevelInfo, core.LevelWarn, core.LevelError:
		default:
			w.fail("log-level", fmt.Sprintf("worker %s logged %q at unknown level %q", wn.id, l.Msg, l.Level))
		}
		w.wlogs[l.Level]++
		if w.cfg.Trace != nil {
			fmt.Fprintf(w.cfg.Trace, "    worker %s log %s: %s\n", wn.id, l.Level, l.Msg)
		}
	}
	if rd.Exit != nil {
		w.exitWorker(wn, fmt.Sprintf("exit %d: %s", rd.Exit.Code, rd.Exit.Reason))
		return
	}
	if !rd.Deadline.IsZero() {
		at := wn.simTimeFor(w.now, rd.Deadline)
		if wn.tickAt.IsZero() || wn.tickAt.Before(w.now) || at.Before(wn.tickAt) {
			wn.tickAt = at
			gen := wn.gen
			live := func() bool { return wn.gen == gen && wn.tickAt.Equal(at) }
			w.at(at, evWorkerTick, wn.idx, nil, "", func() {
				if live() {
					wn.tickAt = time.Time{}
					w.stepWorker(wn, core.WTick{})
				}
			}).on(0, live)
		}
	}
}

// exec carries out an executor command with a simulated process.
func (w *world) exec(wn *workerNode, x core.ExecCommand) {
	switch x.Op {
	case core.ExecStart:
		if p := wn.procs[x.Lease]; p != nil && !p.done {
			w.fail("executor", fmt.Sprintf("worker %s started lease %d twice", wn.id, x.Lease))
			return
		}
		// Whether the process writes is its command's nature (the step as
		// submitted), whatever the dispatch said.
		writes := w.hist.writes(x.Step)
		p := &proc{lease: x.Lease, step: x.Step, writes: writes, ignTerm: w.chance(w.opt.IgnoreTermP)}
		if _, had := wn.procs[x.Lease]; !had {
			i, _ := slices.BinarySearch(wn.procIDs, x.Lease)
			wn.procIDs = slices.Insert(wn.procIDs, i, x.Lease)
		}
		wn.procs[x.Lease] = p
		w.chk.ProcessStarted(w.now, wn.id, x.Lease, x.Step, writes)
		dur := w.uniform(w.opt.ExecMin, w.opt.ExecMax)
		gen := wn.gen
		alive := func() bool { return wn.gen == gen && !p.done }
		lines := 0
		if w.opt.LinesMax > 0 {
			lines = w.r.IntN(w.opt.LinesMax + 1)
		}
		offs := make([]time.Duration, lines)
		for i := range offs {
			offs[i] = w.uniform(0, dur)
		}
		slices.Sort(offs)
		// Each burst's size drawn in turn (nothing else draws meanwhile),
		// then every line of the process, "line 1", "line 2", …, as
		// substrings of one string: two allocations a process, not one a line.
		bursts := make([]int, len(offs))
		total := 0
		for i := range bursts {
			bursts[i] = 1
			if w.opt.BurstMax > 1 {
				bursts[i] = 1 + w.r.IntN(w.opt.BurstMax)
			}
			total += bursts[i]
		}
		buf := make([]byte, 0, total*len("line 1000"))
		ends := make([]int, total)
		for i := range ends {
			buf = strconv.AppendInt(append(buf, "line "...), int64(i+1), 10)
			ends[i] = len(buf)
		}
		all, allTexts, start := string(buf), make([]string, total), 0
		for i, end := range ends {
			allTexts[i], start = all[start:end], end
		}
		for i, off := range offs {
			texts := allTexts[:bursts[i]:bursts[i]] // capped: an append never reaches the next burst's
			allTexts = allTexts[bursts[i]:]
			w.after(off, evProc, wn.idx, nil, "output", func() {
				if alive() {
					w.procOutput(wn, p, texts...)
				}
			}).on(0, alive)
		}
		if p.writes {
			for i := 0; i < 1+w.r.IntN(3); i++ {
				w.after(w.uniform(0, dur), evProc, wn.idx, nil, "external write", func() {
					if alive() {
						w.chk.ExternalWrite(w.now, wn.id, x.Lease, x.Step)
					}
				}).on(0, alive).folded()
			}
		}
		w.dataWrites(wn, p, dur)
		code := 0
		if w.chance(w.opt.FailProb) {
			code = 1
		}
		if code == 0 && x.Command == flakyCommand && w.chance(0.5) {
			code = 1
		}
		w.after(dur, evProc, wn.idx, nil, "exits", func() {
			if alive() {
				w.procExit(wn, p, code, false)
			}
		}).on(0, alive)
	case core.ExecTerm:
		p := wn.procs[x.Lease]
		if p == nil || p.done {
			return
		}
		p.termed = true
		if p.ignTerm {
			return
		}
		gen := wn.gen
		live := func() bool { return wn.gen == gen && !p.done }
		w.after(w.uniform(0, 2*time.Second), evProc, wn.idx, nil, "exits on SIGTERM", func() {
			if live() {
				w.procExit(wn, p, 143, true)
			}
		}).on(0, live)
	case core.ExecKill:
		if p := wn.procs[x.Lease]; p != nil && !p.done {
			w.procExit(wn, p, 137, true)
		}
	}
}

// procOutput: the process prints lines into its pipe; the worker's reader
// takes them when the lease's output is not paused.
func (w *world) procOutput(wn *workerNode, p *proc, texts ...string) {
	for _, t := range texts {
		w.hist.printed(wn.id, p.lease, t)
	}
	p.pipe = append(p.pipe, texts...)
	w.pump(wn)
}

func (w *world) procExit(wn *workerNode, p *proc, code int, signaled bool) {
	p.done = true
	w.chk.ProcessStopped(w.now, wn.id, p.lease)
	p.exit = &core.WExecExited{Lease: p.lease, ExitCode: code, Signaled: signaled}
	w.pump(wn)
}

// pump is the worker's pipe readers (SPEC §10): for each process, in lease
// order, it feeds what waits in the pipe, at most pipeBatch lines an input,
// while the core does not report the lease's output paused; a drained pipe
// gives way to the process's exit. A paused worker process reads nothing.
func (w *world) pump(wn *workerNode) {
	if wn.pumping {
		return
	}
	wn.pumping = true
	defer func() { wn.pumping = false }()
	for progress := true; progress; {
		progress = false
		// A copy: a step may start processes.
		wn.pumpIDs = append(wn.pumpIDs[:0], wn.procIDs...)
		for _, id := range wn.pumpIDs {
			p := wn.procs[id]
			if !wn.alive || w.now.Before(wn.pausedUntil) || len(wn.deferred) > 0 {
				return
			}
			paused := wn.m.OutputPaused(id)
			if paused && len(p.pipe) > 0 && !p.held {
				w.out.Paused++
			}
			p.held = paused && len(p.pipe) > 0
			switch {
			case len(p.pipe) > 0 && !paused:
				n := min(len(p.pipe), pipeBatch)
				lines := append([]string(nil), p.pipe[:n]...)
				p.pipe = p.pipe[n:]
				wn.applyStep(w, core.WExecOutput{Lease: id, Lines: lines})
				progress = true
			case len(p.pipe) == 0 && p.exit != nil:
				x := *p.exit
				p.exit = nil
				wn.applyStep(w, x)
				progress = true
			}
		}
	}
}

// applyStep steps the worker machine and applies its Ready (not paused).
func (wn *workerNode) applyStep(w *world, in core.WorkerInput) {
	w.applyWorker(wn, wn.m.Step(wn.local(w.now), in))
}

// killProcs ends every process of a dead worker (they die with it).
func (w *world) killProcs(wn *workerNode) {
	for _, id := range slices.Clone(wn.procIDs) {
		if p := wn.procs[id]; !p.done {
			p.done = true
			w.chk.ProcessStopped(w.now, wn.id, id)
		}
	}
}

// exitWorker ends a worker process (it exited, or crashed).
func (w *world) exitWorker(wn *workerNode, why string) {
	if !wn.alive {
		return
	}
	w.killWorker(wn)
	if wn.replay {
		return
	}
	// The fleet replaces lost capacity with a new instance and a new token.
	w.after(w.uniform(5*time.Second, 2*time.Minute), evFault, wn.idx, nil, "replacement after "+why, func() {
		w.replace(wn)
	})
}

// killWorker ends a worker process: its step processes die with it, its
// socket breaks, and nothing it scheduled happens any more.
func (w *world) killWorker(wn *workerNode) {
	wn.alive = false
	wn.gen++
	wn.deferred = nil
	w.killProcs(wn)
	if c := w.conns[wn.conn]; c != nil {
		w.breakConn(c, false)
	}
	wn.conn = 0
}

// restartWorker kills a worker process and has its supervisor start it
// again a little later with the identity it saved (SPEC §9): the same
// instance id and session credential, booted with nothing in flight. The
// orchestrator triages the leases the dead process held as lost when it
// reconnects (or by the grace window, if that ends first). A restarted
// worker whose credential is refused (revoked, expired, scaler-managed)
// exits, and is replaced like a crashed one.
func (w *world) restartWorker(wn *workerNode) {
	cfg := w.savedIdentity(wn)
	w.killWorker(wn)
	gen := wn.gen
	w.after(w.uniform(100*time.Millisecond, 10*time.Second), evFault, wn.idx, nil, "restarted by its supervisor", func() {
		if wn.gen == gen && !wn.alive {
			w.rebootWorker(wn, cfg)
		}
	})
}

// savedIdentity is what a worker's supervisor restarts it with: its
// configuration (id, token, seed) and the session credential it saved.
func (w *world) savedIdentity(wn *workerNode) core.WorkerConfig {
	cfg := wn.m.Config()
	cfg.Credential = wn.m.Credential()
	return cfg
}

// rebootWorker boots a dead worker's process again in its node.
func (w *world) rebootWorker(wn *workerNode, cfg core.WorkerConfig) {
	wn.alive = true
	wn.pausedUntil, wn.tickAt = time.Time{}, time.Time{}
	wn.m = core.NewWorker(cfg)
	w.stepWorker(wn, core.WBoot{})
	w.scheduleWorkerFaults(wn)
}

// replace boots a fresh instance in a dead worker's place.
func (w *world) replace(dead *workerNode) {
	w.requestToken(func(token string) {
		w.spawnWorker(token, dead.scaler, dead.allTags)
	})
}

func (w *world) scheduleWorkerFaults(wn *workerNode) {
	gen := wn.gen
	if w.opt.WorkerCrashEvery > 0 {
		w.after(w.exp(w.opt.WorkerCrashEvery), evFault, wn.idx, nil, "crash", func() {
			if wn.gen == gen && !w.healed && wn.alive {
				w.fault("worker-crash")
				w.exitWorker(wn, "crash")
			}
		})
	}
	if w.opt.WorkerRestartEvery > 0 {
		w.after(w.exp(w.opt.WorkerRestartEvery), evFault, wn.idx, nil, "restart", func() {
			// Only an enrolled worker has an identity to keep.
			if wn.gen == gen && !w.healed && wn.alive && wn.m.Credential() != "" {
				w.fault("worker-restart")
				w.restartWorker(wn)
			}
		})
	}
	if w.opt.WorkerPauseEvery > 0 {
		var pause func()
		pause = func() {
			if wn.gen != gen || w.healed || !wn.alive {
				return
			}
			w.fault("worker-pause")
			wn.pausedUntil = w.now.Add(w.uniform(time.Second, w.opt.PauseMax))
			w.after(w.exp(w.opt.WorkerPauseEvery), evFault, wn.idx, nil, "pause", pause)
		}
		w.after(w.exp(w.opt.WorkerPauseEvery), evFault, wn.idx, nil, "pause", pause)
	}
	if w.opt.DrainEvery > 0 {
		// An operator stops the worker with SIGTERM (§10): it drains and
		// exits 0 once its steps are answered; sometimes a second signal
		// stops its steps first. The fleet replaces it like any exit.
		w.after(w.exp(w.opt.DrainEvery), evFault, wn.idx, nil, "drain", func() {
			if wn.gen != gen || w.healed || !wn.alive {
				return
			}
			w.fault("worker-drain")
			w.stepWorker(wn, core.WDrain{})
			if w.chance(w.opt.DrainStopP) {
				w.after(w.uniform(0, 30*time.Second), evFault, wn.idx, nil, "drain stop", func() {
					if wn.gen == gen && wn.alive {
						w.fault("worker-drain-stop")
						w.stepWorker(wn, core.WDrain{})
					}
				})
			}
		})
	}
	if w.opt.JumpEvery > 0 {
		var jump func()
		jump = func() {
			if wn.gen != gen || w.healed || !wn.alive {
				return
			}
			w.fault("clock-jump")
			wn.jumps += w.uniform(time.Second, 10*time.Minute)
			wn.tickAt = time.Time{}
			w.stepWorker(wn, core.WTick{}) // its deadlines moved closer
			w.after(w.exp(w.opt.JumpEvery), evFault, wn.idx, nil, "clock jump", jump)
		}
		w.after(w.exp(w.opt.JumpEvery), evFault, wn.idx, nil, "clock jump", jump)
	}
}
