package sim

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"time"

	"github.com/tether-run/tether/core"
)

// Options is one run's world: its faults and its workload. Swarm testing: each
// seed draws its own Options (see Swarm), so seeds differ in kind, not only in
// luck — one seed partitions a lot and never crashes, another crashes the
// orchestrator every few minutes on a fast network.
type Options struct {
	Workers         int     // static workers at start
	Scalers         int     // scaler-managed single-use workers alive at once
	NoReconnectFrac float64 // chance a static worker runs with --no-reconnect
	SlotsMax        int
	// Ahead: each static worker declares a lease-ahead of 0..max(its slots,
	// 4) (SPEC §3: ahead is not bounded by the slots), drawn from its own
	// stream.
	Ahead bool

	DelayMin, DelayMax time.Duration // per-message network delay
	TailProb           float64       // chance of a long tail delay (×20)
	DupProb            float64       // a retransmitting proxy delivers a message twice
	LossProb           float64       // a lost message resets its connection
	NoticeMax          time.Duration // how late each end notices a dead socket

	PartitionEvery time.Duration // mean time between partitions; 0 = none
	PartitionMin   time.Duration
	PartitionMax   time.Duration
	ClogEvery      time.Duration // mean time between swizzle-clogs; 0 = none

	ClockOffsetMax time.Duration // worker clock offset
	DriftMax       float64       // worker clock rate error (0.05 = ±5%)
	JumpEvery      time.Duration // mean time between forward clock jumps; 0 = none
	WobbleAmp      time.Duration // periodic wobble amplitude

	FsyncMin, FsyncMax time.Duration

	WorkerCrashEvery time.Duration // per worker; 0 = never
	WorkerPauseEvery time.Duration // per worker; 0 = never
	PauseMax         time.Duration
	OrchCrashEvery   time.Duration // 0 = never
	FsyncCrashP      float64       // chance the orchestrator dies inside an fsync
	OrchDownMax      time.Duration

	// WorkerRestartEvery: per worker, its process dies (its step processes
	// with it) and its supervisor starts it again with the saved identity
	// (SPEC §9); 0 = never.
	WorkerRestartEvery time.Duration

	Runs        int
	SubmitEvery time.Duration
	StepsMax    int
	WriteFrac   float64
	FailProb    float64
	ExecMin     time.Duration
	ExecMax     time.Duration
	LinesMax    int
	TagFrac     float64
	ForEachFrac float64
	HoldFrac    float64
	WaitFrac    float64
	TimeoutFrac float64
	// RetryFrac is the share of steps with a `retry:` policy; they run a
	// flaky command that fails half the time (SPEC §1 RETRY).
	RetryFrac float64
	// RerunEvery: the operator reruns a finished run, its successes
	// reused (run rerun --failed-only, SPEC §2); 0 = never.
	RerunEvery   time.Duration
	ChildFrac    float64       // a step is a workflow step starting a child run (SPEC §2)
	CancelEvery  time.Duration // operator cancels a random run; 0 = never
	RevokeEvery  time.Duration // operator revokes a random worker's token; 0 = never
	QueryEvery   time.Duration // operator queries a random step
	ReplayEvery  time.Duration // someone boots a worker with an already-used token; 0 = never
	IgnoreTermP  float64       // a process ignores SIGTERM
	DrainEvery   time.Duration // per worker: mean time until it is told to drain (SIGTERM, §10); 0 = never
	DrainStopP   float64       // chance a drain is followed by a second signal that stops the steps
	DrainTimeout time.Duration // the workers' drain timeout (0: the core's default)
	FaultPhase   time.Duration // faults happen only during this phase
	Buggify      map[string]bool
	LogWindow    int           // worker LogWindowLines (small values stress backpressure)
	OutputCap    int64         // worker OutputCapBytes; 0 = the default (small values stress the cap)
	BurstMax     int           // a process prints up to this many lines at once (floods)
	MaxDelayWork time.Duration // the workers' max reconnect delay (grace = 2×)
	// CredentialTTL is the orchestrator's session credential TTL (0: the
	// core's 15 min). A short one makes workers that are away longer than
	// it (partitions, pauses) find their credential expired (SPEC §9).
	CredentialTTL time.Duration
	// Locks: runs and steps join concurrency groups and a cron schedule
	// starts runs (SPEC §8a); catch-up is the schedule's policy.
	Locks   bool
	CatchUp string

	// Failover: this many orchestrator instances (2 or 3) over one shared
	// store with a leader row (failover.go); 0 = one orchestrator.
	// LeaderLease is the lease a standby waits out before it takes over;
	// HostSkewMax bounds each instance's clock offset either way;
	// FailoverEvery is the mean time between pauses of the leader and cuts
	// between it and the store.
	Failover      int
	LeaderLease   time.Duration
	HostSkewMax   time.Duration
	FailoverEvery time.Duration

	// Mutate, if set, plants a bug in the orchestrator's driver: it doctors
	// every batch the orchestrator produces, as spec.Scope.Mutate does in
	// the explorer (see doctor). Tests only (spec.PlantedBugs).
	Mutate func(rd *core.Ready)
}

// Swarm draws a seed's Options.
func Swarm(seed uint64) Options {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	dur := func(lo, hi time.Duration) time.Duration {
		return lo + time.Duration(r.Int64N(int64(hi-lo)+1))
	}
	maybe := func(p float64, d time.Duration) time.Duration {
		if r.Float64() < p {
			return d
		}
		return 0
	}
	o := Options{
		Workers:          2 + r.IntN(4),
		Scalers:          r.IntN(2),
		NoReconnectFrac:  []float64{0, 0, 0.2}[r.IntN(3)],
		SlotsMax:         1 + r.IntN(3),
		DelayMin:         dur(100*time.Microsecond, 5*time.Millisecond),
		TailProb:         []float64{0, 0.001, 0.01}[r.IntN(3)],
		DupProb:          []float64{0, 0, 0.01, 0.05}[r.IntN(4)],
		LossProb:         []float64{0, 0.0005, 0.002, 0.01}[r.IntN(4)],
		NoticeMax:        dur(time.Second, 60*time.Second),
		PartitionEvery:   maybe(0.5, dur(5*time.Minute, 30*time.Minute)),
		PartitionMin:     dur(time.Second, 30*time.Second),
		ClogEvery:        maybe(0.3, dur(5*time.Minute, 30*time.Minute)),
		ClockOffsetMax:   dur(0, time.Hour),
		DriftMax:         []float64{0, 0.001, 0.05}[r.IntN(3)],
		JumpEvery:        maybe(0.3, dur(10*time.Minute, 60*time.Minute)),
		WobbleAmp:        maybe(0.3, dur(0, 2*time.Second)),
		FsyncMin:         dur(50*time.Microsecond, 500*time.Microsecond),
		WorkerCrashEvery: maybe(0.6, dur(10*time.Minute, 90*time.Minute)),
		WorkerPauseEvery: maybe(0.4, dur(10*time.Minute, 60*time.Minute)),
		PauseMax:         dur(5*time.Second, 5*time.Minute),
		OrchCrashEvery:   maybe(0.5, dur(10*time.Minute, 60*time.Minute)),
		OrchDownMax:      dur(time.Second, 5*time.Minute),
		FsyncCrashP:      []float64{0, 0.002, 0.01}[r.IntN(3)],
		Runs:             20 + r.IntN(40),
		SubmitEvery:      dur(10*time.Second, 2*time.Minute),
		StepsMax:         2 + r.IntN(6),
		WriteFrac:        r.Float64(),
		FailProb:         []float64{0, 0.05, 0.2}[r.IntN(3)],
		ExecMin:          dur(100*time.Millisecond, 5*time.Second),
		LinesMax:         r.IntN(40),
		TagFrac:          []float64{0, 0.2}[r.IntN(2)],
		ForEachFrac:      []float64{0, 0.2}[r.IntN(2)],
		HoldFrac:         []float64{0, 0.1}[r.IntN(2)],
		WaitFrac:         []float64{0, 0.1}[r.IntN(2)],
		TimeoutFrac:      []float64{0, 0.2}[r.IntN(2)],
		CancelEvery:      maybe(0.4, dur(5*time.Minute, 30*time.Minute)),
		RevokeEvery:      maybe(0.2, dur(20*time.Minute, 90*time.Minute)),
		QueryEvery:       dur(10*time.Second, 2*time.Minute),
		ReplayEvery:      maybe(0.3, dur(5*time.Minute, 30*time.Minute)),
		IgnoreTermP:      []float64{0, 0.2}[r.IntN(2)],
		FaultPhase:       dur(20*time.Minute, 90*time.Minute),
		LogWindow:        []int{1000, 1000, 4}[r.IntN(3)],
		OutputCap:        []int64{0, 0, 120}[r.IntN(3)],
		BurstMax:         []int{1, 1, 30}[r.IntN(3)],
		MaxDelayWork:     []time.Duration{60 * time.Second, 60 * time.Second, 10 * time.Second}[r.IntN(3)],
	}
	o.DelayMax = o.DelayMin + dur(0, 50*time.Millisecond)
	o.PartitionMax = o.PartitionMin + dur(0, 5*time.Minute)
	o.FsyncMax = o.FsyncMin + dur(0, 20*time.Millisecond)
	o.ExecMax = o.ExecMin + dur(0, 3*time.Minute)
	o.Buggify = map[string]bool{}
	for _, site := range BuggifySites {
		if r.Float64() < 0.25 {
			o.Buggify[site] = true
		}
	}
	// Drawn last, so the options above are what they were before drains.
	o.DrainEvery = maybe(0.3, dur(10*time.Minute, 60*time.Minute))
	o.DrainStopP = []float64{0, 0.5}[r.IntN(2)]
	o.DrainTimeout = []time.Duration{0, 30 * time.Second}[r.IntN(2)]
	o.WorkerRestartEvery = maybe(0.4, dur(10*time.Minute, 60*time.Minute))
	// Drawn last, so the options above are what they were before it.
	o.CredentialTTL = maybe(0.3, dur(time.Minute, 5*time.Minute))
	// Drawn last, so the options above are what they were before it: the
	// archival site (SPEC §7a), active like the others for a quarter of
	// the seeds.
	if r.Float64() < 0.25 {
		o.Buggify[SiteCrashAfterArchive] = true
	}
	// Drawn last, so the options above are what they were before it:
	// the share of steps with a retry policy (SPEC §1 RETRY).
	o.RetryFrac = []float64{0, 0.3}[r.IntN(2)]
	// Drawn last, so the options above are what they were before it.
	o.RerunEvery = maybe(0.5, dur(5*time.Minute, 20*time.Minute))
	// Drawn last, so the options above are what they were before it; a
	// seed without child runs draws nothing for them (randomRun), so its
	// world is what it was before them.
	o.ChildFrac = []float64{0, 0.15}[r.IntN(2)]
	// concurrency groups and a schedule (SPEC §8a) for 40% of the seeds.
	if r.Float64() < 0.4 {
		o.Locks = true
		o.CatchUp = []string{core.CatchUpNone, core.CatchUpOne, core.CatchUpAll}[r.IntN(3)]
	}
	// Drawn last, so the options above are what they were before it: the
	// failover fault for 40% of the seeds, hosts up to minutes apart.
	if r.Float64() < 0.4 {
		o.Failover = 2 + r.IntN(2)
		o.LeaderLease = dur(5*time.Second, 30*time.Second)
		o.HostSkewMax = []time.Duration{0, 30 * time.Second, 5 * time.Minute}[r.IntN(3)]
		o.FailoverEvery = dur(3*time.Minute, 20*time.Minute)
	}
	// Drawn last, so the options above are what they were before it:
	// lease-ahead (SPEC §3) for half the seeds.
	o.Ahead = r.Float64() < 0.5
	return o
}

// SiteCrashAfterArchive is a buggify site drawn apart from BuggifySites
// (after every other option, so that adding it changed no other draw): the
// orchestrator dies right after the fsync of a group that archived a run,
// before any of its messages leave, so the answers to the reports that
// finished the run are lost, and their workers re-send them to a restarted
// orchestrator, which answers them from the closed-lease table.
const SiteCrashAfterArchive = "crash-after-archive"

// BuggifySites are the edge paths worth stressing. A site is active for a
// seed with p=0.25 and then fires with p=0.25 each time it is reached.
var BuggifySites = []string{
	"report-twice",    // a worker's report leaves twice
	"late-heartbeat",  // a heartbeat is held back for a minute or more
	"slow-fsync",      // an fsync takes seconds
	"late-start",      // a Start is held back past the dispatch-ack deadline
	"drop-after-send", // the socket dies right after a report leaves
	"cancel-race",     // the operator cancels a run just as one of its steps reports
}

// Describe renders the options one per line, sorted, for failure reports.
func (o Options) Describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "workers=%d scalers=%d no-reconnect=%.2f slots<=%d ahead=%v\n", o.Workers, o.Scalers, o.NoReconnectFrac, o.SlotsMax, o.Ahead)
	fmt.Fprintf(&b, "net delay=%s..%s tail=%.3f dup=%.3f loss=%.4f notice<=%s\n", o.DelayMin, o.DelayMax, o.TailProb, o.DupProb, o.LossProb, o.NoticeMax)
	fmt.Fprintf(&b, "partition every=%s for %s..%s clog every=%s\n", o.PartitionEvery, o.PartitionMin, o.PartitionMax, o.ClogEvery)
	fmt.Fprintf(&b, "clock offset<=%s drift<=%.3f jump every=%s wobble=%s\n", o.ClockOffsetMax, o.DriftMax, o.JumpEvery, o.WobbleAmp)
	fmt.Fprintf(&b, "crash worker every=%s restart every=%s pause every=%s (<=%s) orchestrator every=%s (down<=%s)\n", o.WorkerCrashEvery, o.WorkerRestartEvery, o.WorkerPauseEvery, o.PauseMax, o.OrchCrashEvery, o.OrchDownMax)
	fmt.Fprintf(&b, "drain every=%s stop=%.2f timeout=%s\n", o.DrainEvery, o.DrainStopP, o.DrainTimeout)
	fmt.Fprintf(&b, "retry=%.2f rerun every=%s child runs=%.2f\n", o.RetryFrac, o.RerunEvery, o.ChildFrac)
	fmt.Fprintf(&b, "credential ttl=%s\n", o.CredentialTTL)
	fmt.Fprintf(&b, "locks=%v catch-up=%s\n", o.Locks, o.CatchUp)
	fmt.Fprintf(&b, "failover instances=%d lease=%s host skew<=%s pause/cut every=%s\n", o.Failover, o.LeaderLease, o.HostSkewMax, o.FailoverEvery)
	fmt.Fprintf(&b, "runs=%d steps<=%d writes=%.2f fail=%.2f exec=%s..%s fault phase=%s\n", o.Runs, o.StepsMax, o.WriteFrac, o.FailProb, o.ExecMin, o.ExecMax, o.FaultPhase)
	fmt.Fprintf(&b, "output lines<=%d burst<=%d window=%d cap=%d\n", o.LinesMax, o.BurstMax, o.LogWindow, o.OutputCap)
	sites := make([]string, 0, len(o.Buggify))
	for s := range o.Buggify {
		sites = append(sites, s)
	}
	sort.Strings(sites)
	fmt.Fprintf(&b, "buggify=%s", strings.Join(sites, ","))
	return b.String()
}
