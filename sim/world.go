// Package sim is Tether's seeded deterministic simulator: one orchestrator
// and a fleet of workers — the real core machines — in a simulated world of
// virtual time, a faulty network, skewed clocks, a disk that loses what was
// not synced, crashing and pausing processes, and an operator. One seed
// decides everything; every invariant of spec/ is checked after every event.
package sim

import (
	"bytes"
	"fmt"
	"hash"
	"hash/fnv"
	"io"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/tether-run/tether/core"
	"github.com/tether-run/tether/spec"
)

// t0 is the simulated epoch.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Limits: a simulation that runs away is a failure, not a hang.
const (
	maxEvents  = 2_000_000
	lastEvents = 50
)

// evKind names what an event is, for the trace hash and the failure report.
type evKind uint8

const (
	evOrchTick evKind = iota
	evPersist
	evToOrch
	evToWorker
	evOrchNotice
	evWorkerNotice
	evDial
	evWorkerTick
	evProc
	evFault
	evOperator
	evHeal
)

var evNames = [...]string{"orch-tick", "persist", "→orch", "→worker", "orch-notices-drop", "worker-notices-drop",
	"dial", "worker-tick", "process", "fault", "operator", "heal"}

type event struct {
	at   time.Time
	seq  uint64
	kind evKind
	node int // worker index, -1 for the orchestrator or the world
	msg  core.Msg
	note string
	fn   func()
	// For a scripted run (script.go), which picks events rather than popping
	// them: the connection a network event belongs to, whether running it
	// now would do anything (nil: it would), and whether it completes the
	// step that scheduled it (an fsync, a process's external write: the
	// explorer folds it into that action, so a scripted run runs it at
	// once). Not part of the trace.
	conn core.ConnID
	live func() bool
	fold bool
}

type evHeap []*event

func (h evHeap) Len() int           { return len(h) }
func (h evHeap) Less(i, j int) bool { return evLess(h[i], h[j]) }

// evLess orders events by instant, then sequence number (unique: a total
// order).
func evLess(a, b *event) bool {
	if c := a.at.Compare(b.at); c != 0 {
		return c < 0
	}
	return a.seq < b.seq
}
func (h evHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *evHeap) Push(x any)   { *h = append(*h, x.(*event)) }
func (h *evHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// push and pop are container/heap's Push and Pop, step for step (the
// slice's order is the same after each, which script.go reads), without
// its calls through an interface: the event loop's hottest lines.
func (h *evHeap) push(e *event) {
	*h = append(*h, e)
	q := *h
	j := len(q) - 1
	for {
		i := (j - 1) / 2 // parent
		if i == j || !evLess(q[j], q[i]) {
			break
		}
		q[i], q[j] = q[j], q[i]
		j = i
	}
}

func (h *evHeap) pop() *event {
	q := *h
	n := len(q) - 1
	q[0], q[n] = q[n], q[0]
	i := 0
	for {
		j1 := 2*i + 1
		if j1 >= n || j1 < 0 { // j1 < 0 after int overflow
			break
		}
		j := j1 // left child
		if j2 := j1 + 1; j2 < n && evLess(q[j2], q[j1]) {
			j = j2 // = 2*i + 2  // right child
		}
		if !evLess(q[j], q[i]) {
			break
		}
		q[i], q[j] = q[j], q[i]
		i = j
	}
	e := q[n]
	q[n] = nil
	*h = q[:n]
	return e
}

// Result summarises one simulated run.
type Result struct {
	Seed       uint64
	Events     uint64
	SimTime    time.Duration
	Faults     map[string]int
	Buggified  map[string]int
	Checks     uint64
	PorcOps    int
	TraceHash  uint64
	Failure    *Failure
	Options    Options
	RunsDone   int
	StepsTotal int
	WorkerLogs map[string]int // the workers' own log lines by level
	Output     OutputStats
	Archive    ArchiveStats  // archival and late reports (archive.go)
	Data       DataStats     // the data plane's writes (sim/data.go)
	Retries    int           // RETRY transitions seen (SPEC §1), a lost batch's included
	Reruns     int           // reruns accepted, their successes reused (SPEC §2)
	ChildRuns  int           // child runs started by workflow steps, durably (sim/child.go)
	Locks      LockStats     // concurrency groups and schedules (Options.Locks)
	Ahead      AheadStats    // leases held ahead (Options.Ahead)
	Failover   FailoverStats // the failover fault (Options.Failover)
	// Inconclusive, if set, says why the end-of-run linearizability check
	// could not judge the history (spec.CheckSteps): the seed neither
	// passed nor violated it. Failure is nil then.
	Inconclusive string
	// LargestStep is the most operations one step's history held.
	LargestStep int
}

// LockStats says how much of SPEC §8a a run exercised: runs that waited
// for their group and were admitted, runs superseded by cancel_in_progress,
// runs a schedule started, fires that caught up missed fire times (after
// the orchestrator was down), and restarts between two fires.
// AheadStats counts what lease-ahead (SPEC §3) did in a run: Held answers
// the orchestrator took (Beyond: of them, those taken while their worker
// held more leases ahead than its slots), held leases it saw started, and
// held leases it requeued because their worker turned silent.
type AheadStats struct {
	Held, Beyond, Started, Silent int
}

func (s *AheadStats) add(o AheadStats) {
	s.Held += o.Held
	s.Beyond += o.Beyond
	s.Started += o.Started
	s.Silent += o.Silent
}

type LockStats struct {
	Waits, Admitted, Superseded, Fired, CaughtUp, Restarts int
}

func (s *LockStats) add(o LockStats) {
	s.Waits += o.Waits
	s.Admitted += o.Admitted
	s.Superseded += o.Superseded
	s.Fired += o.Fired
	s.CaughtUp += o.CaughtUp
	s.Restarts += o.Restarts
}

func (s LockStats) String() string {
	return fmt.Sprintf("locks: group waits=%d admitted=%d superseded=%d scheduled runs=%d catch-ups=%d restarts between fires=%d",
		s.Waits, s.Admitted, s.Superseded, s.Fired, s.CaughtUp, s.Restarts)
}

// OutputStats says how much of the output path a run exercised (SPEC §10).
type OutputStats struct {
	Paused      int // times a reader found its lease's output paused with lines in the pipe
	DropMarkers int // drop markers stored for committed leases (the cap, exactly)
	AcksLost    int // LogAcks lost with a connection or a crash
}

// Failure is a violated property with everything needed to replay it.
type Failure struct {
	Seed      uint64
	Invariant string
	Detail    string
	At        time.Duration
	Last      []string
	Options   string
	VizPath   string
	Script    string // a scripted run (RunScript): the script's scope, instead of a seed
	Flags     string // TestSim flags the replay needs beyond the seed ("-sim.shift")
}

// ReplayCommand is the one line that reproduces a failure.
func (f *Failure) ReplayCommand() string {
	if f.Script != "" {
		return spec.ScriptReplayCommand("FILE") + "   # FILE: the script, saved with spec.Script.WriteFile"
	}
	flags := ""
	if f.Flags != "" {
		flags = " " + f.Flags
	}
	return fmt.Sprintf("go test ./sim -run 'TestSim$' -sim.seed=%#x%s -v", f.Seed, flags)
}

func (f *Failure) String() string {
	who := fmt.Sprintf("seed %#x", f.Seed)
	if f.Script != "" {
		who = "script " + f.Script
	}
	s := fmt.Sprintf("%s violated %s at +%s: %s\n", who, f.Invariant, f.At, f.Detail)
	s += "swarm options:\n" + f.Options + "\n"
	s += fmt.Sprintf("last %d events:\n", len(f.Last))
	for _, l := range f.Last {
		s += "  " + l + "\n"
	}
	if f.VizPath != "" {
		s += "porcupine visualization: " + f.VizPath + "\n"
	}
	s += "reproduce with: " + f.ReplayCommand() + "\n"
	return s
}

// Config tunes a simulation beyond its seed.
type Config struct {
	Canary bool      // fail on 1 seed in 100, to prove the failure path works
	VizDir string    // where a linearizability failure writes its HTML
	Trace  io.Writer // if set, every event is written here, one per line

	// ShiftClocks moves every worker's clock by an offset of its own,
	// between ShiftMin and ShiftMax either way, drawn from a stream of its
	// own so that no other draw of the seed moves. Time is the
	// orchestrator's (SPEC §11): the run, its trace hash included, must
	// be the same as without it (TestSim's second run).
	ShiftClocks bool
	// Redrift gives every worker a clock rate error of its own, within
	// ±RedriftMax, drawn from a stream of its own instead of the seed's:
	// the durations workers measure change, so the schedule does, but the
	// seed's verdict must not (TestSim's drift run).
	Redrift bool
	// StreamLinks makes every link what the real transport is (a WebSocket
	// over TCP): a frame is never lost while its connection stays up, so a
	// one-way partition breaks the connection at the first frame it eats
	// instead of swallowing frames silently, and workers are told their
	// link loses no frames (core.WorkerConfig.LinkLosesFrames false). The
	// seed's draws are the same either way.
	StreamLinks bool
	// MaxStepOps bounds the operations of one step's history that the
	// linearizability check takes on (0: spec.MaxStepOps).
	MaxStepOps int

	sums *[]traceSum // if set, the trace hash after every event (diverge)
	// traceOnly skips the end-of-run checks (liveness, stored writes, log
	// continuity, linearizability), which come after the trace hash: for
	// TestSim's shifted run, judged by its trace alone (it must be the
	// plain run's, whose end-of-run checks ran).
	traceOnly bool
	// restoring, if set, is called at every restore of the orchestrator,
	// before it, with the disk it restores from (TestRestoreRecords).
	restoring func(cfg core.Config, now time.Time, d *simDisk)
}

// The clock perturbations of Config.ShiftClocks and Config.Redrift.
const (
	ShiftMin   = time.Hour
	ShiftMax   = 12 * time.Hour
	RedriftMax = 0.05
)

// traceSum is the trace hash after one event, the event, and the digests
// of the orchestrator batches it produced, one item a line.
type traceSum struct {
	sum   uint64
	text  string
	batch string
}

type world struct {
	seed    uint64
	opt     Options
	fires   *spec.ScheduleFires // ScheduleFiresOnce's memory, across restarts (Options.Locks)
	locks   LockStats
	fired   bool // a schedule fired since the last restart
	cfg     Config
	r       *rand.Rand
	clockR  *rand.Rand // worker clocks only
	shiftR  *rand.Rand // Config.ShiftClocks' offsets only
	driftR  *rand.Rand // Config.Redrift's drifts only
	aheadR  *rand.Rand // Options.Ahead's lease-aheads only
	now     time.Time
	retries int // RETRY transitions seen (Result.Retries)
	reruns  int // reruns accepted (Result.Reruns)
	seq     uint64
	q       evHeap

	events uint64
	trace  uint64
	hash   hash.Hash64 // of every event run so far; trace is its sum
	hbuf   [24]byte    // step's scratch for an event's bytes (a local would escape through hash.Write)
	last   [lastEvents]*event
	lastN  int
	free   []*event // events run and gone from last: nothing else holds them (at's callers annotate an event at once), so at reuses them

	chk     *spec.Checker
	orch    *orchNode
	workers []*workerNode
	conns   map[core.ConnID]*conn
	connSeq core.ConnID
	callSeq core.CallID
	calls   map[core.CallID]*apiCall

	faults    map[string]int
	buggified map[string]int
	wlogs     map[string]int // the workers' own log lines by level
	healed    bool
	hist      *history
	props     *props
	failure   *Failure
	runsSent  int
	faultEnd  time.Time
	deadline  time.Time

	out     OutputStats
	orchCfg core.Config // the orchestrator's knobs (zero: core's defaults)
	script  *scriptRun  // a scripted run (script.go): events are picked, not popped
	data    *dataPlane  // the simulated data plane (data.go), made at its first write

	// inconclusive says why a check could not judge the run (Result.Inconclusive).
	inconclusive string
	batchText    strings.Builder // with Config.sums: this event's batch digests
	digestBuf    []byte          // digest's scratch
	grants       grantProps      // spec.Grants and what it needs (grants.go)
	arch         archiveState    // archival's counters and memories (archive.go)
	ahead        AheadStats      // Result.Ahead
	childRuns    int             // child runs started, durably (child.go)

	// The failover fault (failover.go): the instances and the shared
	// store's leader row (nil: one orchestrator); the leader's clock
	// offset; the orchestrator's time so far (its clock never goes back).
	ha     *haCluster
	skew   time.Duration
	ofloor time.Time
	// When each step last started and each run was submitted, in true
	// time (PropTimeoutNotEarly).
	startedTrue   map[core.StepID]time.Time
	submittedTrue map[core.RunID]time.Time
}

func newWorld(seed uint64, opt Options, cfg Config) *world {
	w := &world{
		seed: seed, opt: opt, cfg: cfg,
		r:         rand.New(rand.NewPCG(seed, seed^0xa5a5a5a5a5a5a5a5)),
		clockR:    rand.New(rand.NewPCG(seed, 0xc10c)),
		shiftR:    rand.New(rand.NewPCG(seed, 0x5417f7)),
		driftR:    rand.New(rand.NewPCG(seed, 0xd71f7)),
		aheadR:    rand.New(rand.NewPCG(seed, 0xa4ead)),
		now:       t0,
		chk:       spec.NewChecker(),
		conns:     map[core.ConnID]*conn{},
		calls:     map[core.CallID]*apiCall{},
		faults:    map[string]int{},
		buggified: map[string]int{},
		wlogs:     map[string]int{},
		hash:      fnv.New64a(),

		startedTrue:   map[core.StepID]time.Time{},
		submittedTrue: map[core.RunID]time.Time{},
	}
	w.hist = newHistory()
	w.props = newProps()
	w.faultEnd = t0.Add(opt.FaultPhase)
	return w
}

// at schedules fn at time t (never in the past).
func (w *world) at(t time.Time, kind evKind, node int, msg core.Msg, note string, fn func()) *event {
	if t.Before(w.now) {
		t = w.now
	}
	w.seq++
	var e *event
	if n := len(w.free); n > 0 {
		e, w.free = w.free[n-1], w.free[:n-1]
		*e = event{at: t, seq: w.seq, kind: kind, node: node, msg: msg, note: note, fn: fn}
	} else {
		e = &event{at: t, seq: w.seq, kind: kind, node: node, msg: msg, note: note, fn: fn}
	}
	w.q.push(e)
	return e
}

func (w *world) after(d time.Duration, kind evKind, node int, msg core.Msg, note string, fn func()) *event {
	return w.at(w.now.Add(d), kind, node, msg, note, fn)
}

// on annotates an event for a scripted run: its connection and whether
// running it would do anything (the same condition its fn tests).
func (e *event) on(conn core.ConnID, live func() bool) *event {
	e.conn, e.live = conn, live
	return e
}

// folded marks an event as completing the step that scheduled it.
func (e *event) folded() *event {
	e.fold = true
	return e
}

// uniform draws a duration in [lo, hi].
func (w *world) uniform(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(w.r.Int64N(int64(hi-lo)+1))
}

// exp draws an exponential duration with the given mean.
func (w *world) exp(mean time.Duration) time.Duration {
	return time.Duration(w.r.ExpFloat64() * float64(mean))
}

func (w *world) chance(p float64) bool { return p > 0 && w.r.Float64() < p }

// buggify reports whether an active BUGGIFY site fires here.
func (w *world) buggify(site string) bool {
	if w.healed || !w.opt.Buggify[site] || !w.chance(0.25) {
		return false
	}
	w.buggified[site]++
	return true
}

func (w *world) fault(kind string) {
	w.faults[kind]++
	w.hist.notes = append(w.hist.notes, porcupine.Annotation{Tag: "faults", Start: nanos(w.now), Description: kind})
}

// run is the event loop: pop, hash, execute, check — until the queue is
// empty, the deadline passes, or a property fails.
func (w *world) run() {
	for len(w.q) > 0 && w.failure == nil {
		e := w.q.pop()
		if !w.deadline.IsZero() && e.at.After(w.deadline) {
			break
		}
		w.now = e.at
		w.step(e)
	}
	w.trace = w.hash.Sum64()
}

// step runs one event at w.now: count, hash, execute, check.
func (w *world) step(e *event) {
	w.events++
	if w.events > maxEvents {
		w.fail("event-budget", fmt.Sprintf("more than %d events: the simulation ran away", maxEvents))
		return
	}
	// The instant, the sequence number, the kind and node, each 8 bytes
	// little-endian: one Write of the three is the same FNV as three.
	put := func(i int, x uint64) {
		for j := range 8 {
			w.hbuf[8*i+j] = byte(x >> (8 * j))
		}
	}
	put(0, uint64(e.at.UnixNano()))
	put(1, e.seq)
	put(2, uint64(e.kind)<<32|uint64(uint32(int32(e.node))))
	w.hash.Write(w.hbuf[:])
	if old := w.last[w.lastN%lastEvents]; old != nil && len(w.free) < 1024 {
		*old = event{} // its closure and message go with it
		w.free = append(w.free, old)
	}
	w.last[w.lastN%lastEvents] = e
	w.lastN++
	if w.cfg.Trace != nil {
		fmt.Fprintln(w.cfg.Trace, w.describe(e))
	}
	w.execEvent(e)
	if w.cfg.sums != nil {
		*w.cfg.sums = append(*w.cfg.sums, traceSum{sum: w.hash.Sum64(), text: w.describe(e), batch: w.batchText.String()})
		w.batchText.Reset()
	}
	if w.failure != nil {
		return
	}
	if v := w.chk.Check(); v != nil {
		w.fail(v.Invariant, v.Detail)
	}
	if w.cfg.Canary && w.seed%100 == 42 && w.events == 1000 {
		w.fail("canary", "the canary check fails on every seed ≡ 42 mod 100 (enabled with -sim.canary)")
	}
}

// exec runs one event; a panic (a core assertion, or a bug in the world) is
// a failure of the seed like any violated invariant.
func (w *world) execEvent(e *event) {
	defer func() {
		if r := recover(); r != nil {
			w.fail("panic", fmt.Sprint(r))
		}
	}()
	e.fn()
}

func (w *world) fail(inv, detail string) {
	if w.failure != nil {
		return
	}
	f := &Failure{Seed: w.seed, Invariant: inv, Detail: detail, At: w.now.Sub(t0), Options: w.opt.Describe()}
	n := min(w.lastN, lastEvents)
	for i := w.lastN - n; i < w.lastN; i++ {
		f.Last = append(f.Last, w.describe(w.last[i%lastEvents]))
	}
	w.failure = f
}

func (w *world) describe(e *event) string {
	return fmt.Sprintf("+%s #%d %s", e.at.Sub(t0), e.seq, w.eventText(e))
}

// eventText is an event without its time and sequence number: its kind,
// node, message and note.
func (w *world) eventText(e *event) string {
	s := evNames[e.kind]
	if e.node >= 0 && e.node < len(w.workers) {
		s += " " + string(w.workers[e.node].id)
	}
	if e.msg != nil {
		s += " " + core.DescribeMsg(e.msg)
	}
	if e.note != "" {
		s += " " + e.note
	}
	return s
}

// digest adds an orchestrator batch's decisions to the trace hash, so that
// the hash covers the core's outputs and not only the world's schedule: the
// records (each stored log line without its At, the one thing the
// orchestrator keeps as a worker stamped it), the transitions, the messages
// with their connections, the answers, the server events' kinds and the next
// deadline. Its own structured log lines are observability and left out.
func (w *world) digest(rd core.Ready) {
	b := w.digestBuf[:0]
	for _, r := range rd.Records {
		b = append(b, "record "...)
		b = append(b, r.Key...)
		b = append(b, " delete="...)
		b = strconv.AppendBool(b, r.Delete)
		b = append(b, ' ')
		if strings.HasPrefix(r.Key, core.KindLog+"/") {
			b = appendWithoutAt(b, r.Value)
		} else {
			b = append(b, r.Value...)
		}
		b = append(b, '\n')
	}
	for _, t := range rd.Transitions {
		b = appendTransition(b, t)
	}
	for _, m := range rd.Messages {
		b = appendMessage(b, m)
	}
	for _, a := range rd.Answers {
		b = appendAnswer(b, a)
	}
	for _, e := range rd.Events {
		b = appendEvent(b, e)
	}
	b = append(b, "deadline "...)
	b = strconv.AppendInt(b, rd.Deadline.UnixNano(), 10)
	b = append(b, '\n')
	w.hash.Write(b)
	if w.cfg.sums != nil {
		w.batchText.Write(b)
	}
	w.digestBuf = b
}

// appendTransition, appendAnswer and appendEvent append what
// fmt.Appendf does with the formats in their comments, byte for byte (the
// stored trace hashes fix them; TestDigestFormatsMatchFmt).

// appendTransition: "transition %s %s %s %s\n", t.Step, t.From, t.Event, t.To.
func appendTransition(b []byte, t core.StepTransition) []byte {
	b = append(b, "transition "...)
	b = append(b, t.Step...)
	b = append(b, ' ')
	b = append(b, t.From.String()...)
	b = append(b, ' ')
	b = append(b, t.Event.String()...)
	b = append(b, ' ')
	b = append(b, t.To.String()...)
	return append(b, '\n')
}

// appendMessage: "message conn=%d %s %+v\n", m.Conn, m.Msg.Kind(), m.Msg;
// the messages of every batch by hand, the rarer ones through fmt.
func appendMessage(b []byte, m core.Envelope) []byte {
	b = append(b, "message conn="...)
	b = strconv.AppendUint(b, uint64(m.Conn), 10)
	b = append(b, ' ')
	b = append(b, m.Msg.Kind()...)
	b = append(b, ' ')
	switch v := m.Msg.(type) {
	case core.LogAck:
		b = append(b, "{Lease:"...)
		b = strconv.AppendUint(b, uint64(v.Lease), 10)
		b = append(b, " Lines:"...)
		b = strconv.AppendUint(b, v.Lines, 10)
		b = append(b, " Events:"...)
		b = strconv.AppendUint(b, v.Events, 10)
	case core.StartAck:
		b = append(b, "{Lease:"...)
		b = strconv.AppendUint(b, uint64(v.Lease), 10)
		b = append(b, " Request:"...)
		b = strconv.AppendUint(b, v.Request, 10)
		b = append(b, " OK:"...)
		b = strconv.AppendBool(b, v.OK)
		b = append(b, " Reason:"...)
		b = append(b, v.Reason...)
	case core.Answer:
		b = append(b, "{Lease:"...)
		b = strconv.AppendUint(b, uint64(v.Lease), 10)
		b = append(b, " Request:"...)
		b = strconv.AppendUint(b, v.Request, 10)
		b = append(b, " Verdict:"...)
		b = append(b, v.Verdict.String()...)
		b = append(b, " Reason:"...)
		b = append(b, v.Reason...)
	case core.Cancel:
		b = append(b, "{Lease:"...)
		b = strconv.AppendUint(b, uint64(v.Lease), 10)
		b = append(b, " Reason:"...)
		b = append(b, v.Reason...)
	case core.Dispatch:
		b = append(b, "{Lease:"...)
		b = strconv.AppendUint(b, uint64(v.Lease), 10)
		b = append(b, " Step:"...)
		b = append(b, v.Step...)
		b = append(b, " Run:"...)
		b = append(b, v.Run...)
		b = append(b, " Command:"...)
		b = append(b, v.Command...)
		b = append(b, " Env:map["...)
		for i, k := range slices.Sorted(maps.Keys(v.Env)) {
			if i > 0 {
				b = append(b, ' ')
			}
			b = append(append(append(b, k...), ':'), v.Env[k]...)
		}
		b = append(b, "] Writes:"...)
		b = strconv.AppendBool(b, v.Writes)
		b = append(b, " Timeout:"...)
		b = append(b, v.Timeout.String()...)
		b = append(b, " Attempt:"...)
		b = strconv.AppendInt(b, int64(v.Attempt), 10)
		b = append(b, " Secrets:["...)
		for i, sec := range v.Secrets {
			if i > 0 {
				b = append(b, ' ')
			}
			b = append(b, sec...)
		}
		b = append(b, "] SecretsAs:"...)
		b = append(b, v.SecretsAs...)
	default:
		return fmt.Appendf(b, "%+v\n", m.Msg)
	}
	return append(b, "}\n"...)
}

// appendAnswer: "answer call=%d err=%q run=%s token=%q\n", a.Call, a.Err, a.Run, a.Token.
func appendAnswer(b []byte, a core.APIAnswer) []byte {
	b = append(b, "answer call="...)
	b = strconv.AppendUint(b, uint64(a.Call), 10)
	b = append(b, " err="...)
	b = strconv.AppendQuote(b, a.Err)
	b = append(b, " run="...)
	b = append(b, a.Run...)
	b = append(b, " token="...)
	b = strconv.AppendQuote(b, a.Token)
	return append(b, '\n')
}

// appendEvent: "event %s #%d at=%d %s %s\n", e.Run, e.Seq, e.At.UnixNano(), e.Step, e.Kind.
func appendEvent(b []byte, e core.ServerEvent) []byte {
	b = append(b, "event "...)
	b = append(b, e.Run...)
	b = append(b, " #"...)
	b = strconv.AppendInt(b, int64(e.Seq), 10)
	b = append(b, " at="...)
	b = strconv.AppendInt(b, e.At.UnixNano(), 10)
	b = append(b, ' ')
	b = append(b, e.Step...)
	b = append(b, ' ')
	b = append(b, e.Kind...)
	return append(b, '\n')
}

// appendWithoutAt appends a stored log line's canonical JSON
// (core.StepLogLine) without the value of its line's "At" (the worker's
// stamp). JSON escapes every quote inside a string, so the first `"At":"`
// is the field.
func appendWithoutAt(b, v []byte) []byte {
	i := bytes.Index(v, []byte(`"At":"`))
	if i < 0 {
		return append(b, v...)
	}
	j := bytes.IndexByte(v[i+6:], '"')
	if j < 0 {
		return append(b, v...)
	}
	return append(append(b, v[:i+6]...), v[i+6+j:]...)
}

// diverge runs a seed twice, with cfg a and cfg b, and describes the first
// event after which their trace hashes differ, with the events before it in
// each run and the first item of the orchestrator's batches there that
// differs ("" if they never do); and the second run's last events up to
// that one.
func diverge(seed uint64, opt Options, a, b Config) (string, []string) {
	var sa, sb []traceSum
	a.sums, b.sums = &sa, &sb
	a.VizDir, b.VizDir, a.Trace, b.Trace = "", "", nil, nil
	Simulate(seed, opt, a)
	Simulate(seed, opt, b)
	for i := 0; i < len(sa) && i < len(sb); i++ {
		if sa[i].sum == sb[i].sum {
			continue
		}
		var last []string
		for k := max(0, i+1-lastEvents); k <= i; k++ {
			last = append(last, sb[k].text)
		}
		var out strings.Builder
		fmt.Fprintf(&out, "the runs first differ after event %d (the event itself, or the orchestrator's batch for it):\n", i+1)
		for _, r := range []struct {
			name string
			s    []traceSum
		}{{"first run", sa}, {"second run", sb}} {
			fmt.Fprintf(&out, "  %s:\n", r.name)
			for k := max(0, i-4); k <= i; k++ {
				fmt.Fprintf(&out, "    %s\n", r.s[k].text)
			}
		}
		la, lb := strings.Split(sa[i].batch, "\n"), strings.Split(sb[i].batch, "\n")
		for k := 0; k < len(la) || k < len(lb); k++ {
			var x, y string
			if k < len(la) {
				x = la[k]
			}
			if k < len(lb) {
				y = lb[k]
			}
			if x != y {
				fmt.Fprintf(&out, "  the orchestrator's batches there first differ in:\n    first run:  %s\n    second run: %s\n", x, y)
				break
			}
		}
		return out.String(), last
	}
	if len(sa) != len(sb) {
		return fmt.Sprintf("one run has %d events, the other %d, identical as far as both go", len(sa), len(sb)), nil
	}
	return "", nil
}
