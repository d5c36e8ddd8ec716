package spec

// The exhaustive explorer: a model checker over the real core.Orchestrator
// and core.Worker in an abstract world (see explore_world.go for the model
// and its soundness argument, explore_hash.go for state identity).

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tether-run/tether/core"
)

// NetworkModel says how the explorer's network may treat messages in flight.
type NetworkModel uint8

const (
	// NetFIFO is what the real transport does (a WebSocket over TCP): each
	// direction of a connection delivers in order; a loss is a reset of the
	// whole connection (everything still in flight either way is gone, and
	// each end notices on its own schedule). A message may also be delivered
	// twice in a row (a retransmitting proxy, as the simulator's "duplicate"
	// fault), within MaxDups.
	NetFIFO NetworkModel = iota
	// NetMultiset is harsher than any real transport: a connection's messages
	// in flight are a multiset per direction; any of them may be delivered
	// next (reorder), dropped alone without a reset (MaxDrops) or duplicated
	// (MaxDups). A violation found only here may be one TCP cannot produce;
	// the counterexample says which network it needed.
	NetMultiset
)

func (n NetworkModel) String() string {
	if n == NetMultiset {
		return "multiset"
	}
	return "fifo"
}

// Scope bounds one exploration: the world (workers, the run, the network
// model, the timing knobs) and the budgets of every nondeterministic choice.
type Scope struct {
	Name    string
	Workers int               // static workers, one slot each unless Slots says otherwise
	Slots   int               // slots per worker (default 1)
	Steps   []core.StepSpec   // the one run submitted at the start
	Network NetworkModel      // NetFIFO (the real transport) or NetMultiset
	Config  core.Config       // the orchestrator's knobs (zero fields: core's defaults)
	Worker  core.WorkerConfig // template for every worker (ID, Name, Token and Slots are filled in)
	// WorkerTags are the tags each worker slot declares in its Hello (slot
	// i gets WorkerTags[i]; a missing entry: none). ScalerWorker, if not 0,
	// is the 1-based slot of a scaler-managed worker (Hello.Scaler: single
	// use, no grace window, SPEC §4).
	WorkerTags   [][]string
	ScalerWorker int
	// Require lists sometimes properties this scope must show besides
	// SometimesProperties (what the scope exists to reach).
	Require []string
	// Enrolled starts from a world where every worker has enrolled (connect,
	// Hello, Welcome, in worker order) and the first dispatches are in
	// flight, so that the depth budget goes to the run instead of to
	// enrollment interleavings. Off, enrollment is explored too.
	Enrolled bool

	MaxDepth  int           // actions on a path; 0 = unbounded
	MaxStates int           // distinct states; 0 = unbounded (the result says Truncated when hit)
	MaxTime   time.Duration // wall time; 0 = unbounded (the result says Truncated when hit)
	Horizon   time.Duration // no timer fires later than start + Horizon (abstract time is bounded)

	MaxDisconnects    int          // connection resets (drop = reset in NetFIFO)
	MaxOrchCrashes    int          // orchestrator crashes (each followed by a possible restart)
	MaxWorkerCrashes  int          // worker process crashes
	MaxWorkerRestarts int          // fresh worker instances booted in a dead worker's place, with a new token or replaying the dead one's
	MaxCancels        int          // operator CancelRun calls
	MaxRevokes        int          // operator RevokeToken calls
	MaxDups           int          // duplicated deliveries
	MaxDrops          int          // single-message drops without a reset (NetMultiset only)
	MaxInFlight       int          // messages per connection direction; a state beyond it is checked but not expanded (0 = no bound)
	MaxLease          core.LeaseID // a state that granted a greater lease id is checked but not expanded (0 = no bound)
	MaxLogLines       int          // log lines a step process may print
	// MaxDelays bounds how often time may pass while a message could be
	// delivered (a network slower than a timer: the dispatch-ack race, a
	// retransmit, a report overtaken by a grace expiry). Time passing over
	// an idle network (a slow process, a worker backing off) is free. A
	// negative value is no bound: every timing is explored.
	MaxDelays int
	// MaxIdentityRestarts bounds worker processes restarted keeping their
	// identity (SPEC §9): the process dies with its step processes and boots
	// again at once with its saved instance id and session credential.
	MaxIdentityRestarts int

	DFS      bool // depth-first (for deep bounds; the counterexample is then not necessarily shortest)
	Parallel int  // goroutines expanding a BFS level, or searching depth-first (explore_pdfs.go); default GOMAXPROCS
	Verify   bool // the Checker's costly cross-checks after every batch
	// Progress, if set, is told of every finished BFS level (depth-first:
	// of every millionth state, with the stack's depth and size).
	Progress func(depth, states, frontier int, elapsed time.Duration)

	// Mutate, if set, doctors every batch the orchestrator produces (the
	// restore's included) before the Checker sees it and the driver sends
	// its messages; the durable store keeps the records the core emitted.
	// For tests that plant a bug the explorer must catch.
	Mutate func(rd *core.Ready)
	// Planted names the PlantedBugs entry Mutate is, if any (PlantedBug.Plant
	// sets both): a counterexample's Script carries the name, so that the
	// simulator plants the same bug when it replays it.
	Planted string
}

// Result is what one exploration found.
type Result struct {
	Scope       string
	States      int // distinct states reached (the initial one included)
	Transitions int // actions applied (edges explored, duplicates included)
	MaxDepth    int // the deepest state reached
	Pruned      int // states checked but not expanded (in-flight or lease bound)
	// DepthBounded says states at MaxDepth were checked but not expanded:
	// the result covers every path of at most MaxDepth actions.
	DepthBounded bool
	MemoHits     int  // orchestrator steps reused from an equal orchestrator
	MemoMisses   int  // orchestrator steps computed (a core Clone each, but a completion's on its own copy)
	Truncated    bool // MaxStates or MaxTime stopped the search before it covered its bounds
	// Completions counts the states completed past the bounds
	// (explore_complete.go), CompletionActs the actions they took (both
	// vary a little from run to run: parallel completions that meet stop
	// where another already went; what they find does not).
	Completions, CompletionActs int
	// Goroutines searched (Scope.Parallel or GOMAXPROCS). Depth-first
	// (explore_pdfs.go), Handoffs counts the frames a goroutine handed to
	// an idle one and Idle sums the time goroutines waited for one.
	Goroutines int
	Handoffs   int
	Idle       time.Duration
	Duration   time.Duration // wall time
	Violation  *Counterexample
	// Sometimes says, for every SometimesProperties entry (and a few
	// informational ones), whether some explored transition showed it.
	Sometimes map[string]bool
	// Required is SometimesProperties and the scope's own Require.
	Required []string
}

// Missing lists the required sometimes properties no transition showed.
func (r Result) Missing() []string {
	var miss []string
	for _, k := range r.Required {
		if !r.Sometimes[k] {
			miss = append(miss, k)
		}
	}
	return miss
}

// StatesPerSecond is States / Duration.
func (r Result) StatesPerSecond() float64 {
	if r.Duration <= 0 {
		return 0
	}
	return float64(r.States) / r.Duration.Seconds()
}

// Summary is the one-line report of an exploration.
func (r Result) Summary() string {
	s := fmt.Sprintf("explore %s: %d states, %d transitions, max depth %d, %.0f states/s (%s)",
		r.Scope, r.States, r.Transitions, r.MaxDepth, r.StatesPerSecond(), r.Duration.Round(time.Millisecond))
	if r.Pruned > 0 {
		s += fmt.Sprintf(", %d pruned by bounds", r.Pruned)
	}
	if r.Completions > 0 {
		s += fmt.Sprintf(", %d completed without faults (%d actions)", r.Completions, r.CompletionActs)
	}
	if r.Goroutines > 1 && r.Handoffs > 0 {
		s += fmt.Sprintf(", %d goroutines (%d hand-offs, %s idle)", r.Goroutines, r.Handoffs, r.Idle.Round(time.Millisecond))
	}
	switch {
	case r.Truncated:
		s += ", cut short by the state or time budget"
	case r.DepthBounded:
		s += fmt.Sprintf(", every path of up to %d actions", r.MaxDepth)
	default:
		s += ", every reachable state"
	}
	if miss := r.Missing(); len(miss) > 0 {
		s += ", never reached: " + strings.Join(miss, " ")
	}
	if r.Violation != nil {
		s += ", VIOLATION " + r.Violation.Invariant
	}
	return s
}

// Counterexample is a path from the initial state to a state that breaks an
// invariant: one action per line.
type Counterexample struct {
	Invariant string
	Detail    string
	Scope     string // the scope's name and bounds
	Start     string // what the initial state already did
	Path      []string
	// SimNote says how to meet the same behaviour in the simulator: the
	// options and faults a seed needs, and the path as simulator events.
	SimNote string
	// Replay is a Go snippet that re-executes the path with Replay.
	Replay string
	// Completion is how many of the path's last actions are a fault-free
	// completion past the explored bounds (explore_complete.go), if the
	// violation was found there.
	Completion int
	// Script is the initial world and the path as plain values, for the
	// simulator to re-execute in its own world (sim.RunScript; saved with
	// Script.WriteFile, replayed by the command ScriptReplayCommand gives).
	Script *Script

	shortest string
}

func (c *Counterexample) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "invariant %s violated: %s\n", c.Invariant, c.Detail)
	fmt.Fprintf(&b, "scope %s\nstart: %s\n", c.Scope, c.Start)
	fmt.Fprintf(&b, "path (%d action(s), one per line%s):\n", len(c.Path), c.shortest)
	for i, p := range c.Path {
		fmt.Fprintf(&b, "  %3d. %s\n", i+1, p)
	}
	if c.SimNote != "" {
		b.WriteString(c.SimNote)
		if !strings.HasSuffix(c.SimNote, "\n") {
			b.WriteString("\n")
		}
	}
	if c.Replay != "" {
		b.WriteString("replay: " + c.Replay + "\n")
	}
	if c.Script != nil {
		fmt.Fprintf(&b, "replay in the simulator: ce.Script.WriteFile(FILE), then %s\n", ScriptReplayCommand("FILE"))
	}
	return b.String()
}

// SometimesProperties must each be shown by some explored transition, or
// the bounded model is vacuous where it matters.
var SometimesProperties = []string{
	SomeWriteStepFailedByTriage,
	SomeNoWriteStepRedispatched,
	SomeReportCancelled,
	SomeRunSucceeded,
}

// The sometimes properties (and informational ones, reported but not required).
const (
	SomeWriteStepFailedByTriage   = "write-step-failed-by-triage"  // a started write-bearing step failed for a lost/revoked worker
	SomeNoWriteStepRedispatched   = "no-write-step-redispatched"   // a started no-write step was dispatched again (a new lease)
	SomeReportCancelled           = "report-cancelled"             // a report was answered CANCELLED
	SomeRunSucceeded              = "run-succeeded"                // the run finished with success
	SomeStepReclaimed             = "step-reclaimed"               // a recovering step was reclaimed by its reconnecting worker
	SomeOrchestratorRestored      = "orchestrator-restored"        // the orchestrator was rebuilt by Restore
	SomeCancelForced              = "cancel-forced"                // a cancelling step was forced
	SomeDispatchRejected          = "dispatch-rejected"            // a worker rejected a dispatch
	SomeWorkerRefused             = "worker-refused"               // a Hello was refused
	SomeLeaseCancelledOnWelcome   = "lease-cancelled-on-reconnect" // a Welcome told a worker to drop a lease
	SomeStepFailedUnmatched       = "step-failed-unmatched"        // a step failed as unmatched (SPEC §5)
	SomeCredentialRefreshed       = "credential-refreshed"         // a Refresh was answered Refreshed (SPEC §7)
	SomeCredentialExpired         = "credential-expired"           // an enrolled worker's session credential lapsed (SPEC §7)
	SomeStaleWorker               = "stale-worker"                 // a step failed because its worker went stale (SPEC §8)
	SomeCascadeSkip               = "cascade-skip"                 // a step was skipped because a dependency did not succeed
	SomeScalerLeaseTriaged        = "scaler-lease-triaged"         // a started lease triaged in the very batch of its worker's disconnect (no grace: SPEC §4)
	SomeDuplicateReport           = "duplicate-report"             // an exact duplicate report reached the orchestrator (PropIdempotentReport)
	SomeRunArchived               = "run-archived"                 // a run left the core as a history record (SPEC §7a)
	SomeReportAfterArchive        = "report-after-archive"         // a report of an archived run's lease was answered from the closed-lease table (SPEC §7a)
	SomeReportAfterArchiveRestart = "report-after-archive-restart" // the same, the orchestrator restarted since the run was archived
	SomeChildRunFinished          = "child-run-finished"           // a workflow step took its child run's outcome (SPEC §2)
	SomeStepGroupWait             = "step-group-wait"              // a queued step waited for its step group while another member held a lease (SPEC §8a)
	SomeHeldStarted               = "held-started"                 // a lease held ahead started when its worker's slot freed (SPEC §3)
)

var sometimesAll = []string{
	SomeWriteStepFailedByTriage, SomeNoWriteStepRedispatched, SomeReportCancelled, SomeRunSucceeded,
	SomeStepReclaimed, SomeOrchestratorRestored, SomeCancelForced, SomeDispatchRejected,
	SomeWorkerRefused, SomeLeaseCancelledOnWelcome, SomeStepFailedUnmatched, SomeCredentialRefreshed,
	SomeCredentialExpired, SomeStaleWorker, SomeCascadeSkip, SomeScalerLeaseTriaged, SomeDuplicateReport,
	SomeRunArchived, SomeReportAfterArchive, SomeReportAfterArchiveRestart, SomeChildRunFinished, SomeStepGroupWait,
	SomeHeldStarted,
}

func sometimesBit(name string) uint32 {
	for i, n := range sometimesAll {
		if n == name {
			return 1 << i
		}
	}
	panic("spec: unknown sometimes property " + name)
}

// exploreConfig is the orchestrator's knobs in every scope: the defaults of
// SPEC §12 except the heartbeat, which quiet scopes push past the horizon.
func exploreConfig(heartbeat time.Duration) core.Config {
	return core.Config{
		DispatchAck:       10 * time.Second,
		HeartbeatInterval: heartbeat,
		HeartbeatTimeout:  120 * time.Second,
		SweepInterval:     60 * time.Second,
		UnmatchedTimeout:  30 * time.Second,
		ForceCancel:       30 * time.Second,
		KillGrace:         10 * time.Second,
		CredentialTTL:     15 * time.Minute,
		MaxAttempts:       5,
	}
}

// exploreWorker is the worker template: a short backoff (1 s, 2 s, 4 s, so
// the grace window is 8 s), no jitter (backoff instants are part of the
// state), and the given retransmit and dial timeouts.
func exploreWorker(timeout time.Duration) core.WorkerConfig {
	return core.WorkerConfig{
		BackoffBase:    time.Second,
		BackoffFactor:  2,
		BackoffMax:     4 * time.Second,
		BackoffJitter:  -1,
		RequestTimeout: timeout,
		RequestRetries: 2,
		KillGrace:      10 * time.Second,
		DialTimeout:    timeout,
	}
}

// DefaultScope is what `go test ./spec` explores, breadth-first: 2 enrolled
// workers with one slot each; a 3-step run (a write-bearing step a, a
// no-write step b, and c depending on both); the real transport (FIFO, a
// drop is a reset); at most 1 disconnect, 1 orchestrator crash and restart,
// 1 operator cancel; a fast network (no delay budget: time passes only over
// an idle network); every path of up to 14 actions (the shortest successful
// run takes 14) within 20 s of abstract time, in which the dispatch-ack
// deadline (10 s), the grace window (8 s), the backoff (1-4 s) and the kill
// grace (10 s) fall, while heartbeats, retransmits and dial timeouts (60 s)
// do not.
func DefaultScope() Scope {
	return Scope{
		Name:    "default",
		Workers: 2,
		Slots:   1,
		Steps: []core.StepSpec{
			{Name: "a", Command: "write a", Writes: true},
			{Name: "b", Command: "read b"},
			{Name: "c", Command: "read c", DependsOn: []string{"a", "b"}},
		},
		Network:  NetFIFO,
		Enrolled: true,
		Config:   exploreConfig(60 * time.Second),
		Worker:   exploreWorker(60 * time.Second),

		MaxDepth:       14,
		Horizon:        20 * time.Second,
		MaxDisconnects: 1,
		MaxOrchCrashes: 1,
		MaxCancels:     1,
		MaxInFlight:    6,
		MaxLease:       6,
	}
}

// FaultsScope is every action the explorer has, shallow: enrollment
// explored, 2 disconnects, orchestrator and worker crashes, a worker
// restarted as a fresh instance (with a new token, or replaying the used
// one), a worker restarted keeping its identity, cancel, revoke, a
// duplicated delivery, a slow network (one delay), a log line, the real
// retransmit, heartbeat and dial timers. `go test ./spec` runs it too.
func FaultsScope() Scope {
	sc := DefaultScope()
	sc.Name = "faults"
	sc.Enrolled = false
	sc.Config = exploreConfig(30 * time.Second)
	sc.Worker = exploreWorker(10 * time.Second)
	sc.MaxDepth = 7
	sc.Horizon = 40 * time.Second
	sc.MaxDisconnects = 2
	sc.MaxWorkerCrashes = 1
	sc.MaxWorkerRestarts = 1
	sc.MaxIdentityRestarts = 1
	sc.MaxRevokes = 1
	sc.MaxDups = 1
	sc.MaxDelays = 1
	sc.MaxLogLines = 1
	return sc
}

// IdentityScope is the default world with one worker restarted keeping its
// identity (SPEC §9) in place of the orchestrator crash: its process dies
// with its step processes and boots again at once with its saved id and
// credential, at any point of the run; with 1 disconnect, every path of up
// to 14 actions, and 1 operator cancel (without which no report is
// answered CANCELLED). (The faults scope has the action too, but its depth
// is spent on enrollment.)
func IdentityScope() Scope {
	sc := DefaultScope()
	sc.Name = "identity"
	sc.MaxOrchCrashes = 0
	sc.MaxCancels = 1
	sc.MaxIdentityRestarts = 1
	sc.MaxDepth = 14
	return sc
}

// SlowScope is the default world over a slow real transport: one message
// may stay in flight while a timer fires (the dispatch-ack race, a report
// overtaken by a grace expiry), every path of up to 11 actions.
func SlowScope() Scope {
	sc := DefaultScope()
	sc.Name = "slow"
	sc.MaxDelays = 1
	sc.MaxDepth = 11
	return sc
}

// MultisetScope is the default world over the adversarial network (reorder,
// lone drops, duplicates), shallower.
func MultisetScope() Scope {
	sc := DefaultScope()
	sc.Name = "multiset"
	sc.Network = NetMultiset
	sc.MaxDrops = 1
	sc.MaxDups = 1
	sc.MaxDepth = 8
	return sc
}

// LargeScope is `-explore.scope=large` (make explore): the default world
// with larger fault budgets — 2 disconnects, 1 orchestrator crash, 1
// worker crash, 1 cancel, 1 token revocation — every path of up to 14
// actions, depth-first (its memory is the visited set and a stack per
// worker, not a BFS level), on every core (explore_pdfs.go);
// stopped after 100 million states or 10 minutes (it then says so; make
// explore EXPLOREFLAGS=-explore.time=1h searches longer).
func LargeScope() Scope {
	sc := DefaultScope()
	sc.Name = "large"
	sc.DFS = true
	sc.MaxDisconnects = 2
	sc.MaxWorkerCrashes = 1
	sc.MaxRevokes = 1
	sc.MaxStates = 100_000_000
	sc.MaxTime = 10 * time.Minute
	return sc
}

// TimersScope is the default world with the orchestrator's timers short
// enough to fire within the horizon: a sweep every 4 s, heartbeats every 4
// s and a worker stale after 8 s without one, a step unmatched for 4 s
// failed, a session credential valid 9 s (refreshed every 3 s). Step c
// requires the tag gpu, which only w1 holds, so that losing w1 (a crash or
// a revocation) makes c unmatched. With 1 disconnect, 1 worker crash, 1
// revocation, 1 cancel. It must show an unmatched failure and a credential
// both refreshed and expired.
func TimersScope() Scope {
	sc := DefaultScope()
	sc.Name = "timers"
	sc.Steps = []core.StepSpec{
		{Name: "a", Command: "write a", Writes: true},
		{Name: "b", Command: "read b"},
		{Name: "c", Command: "read c", DependsOn: []string{"a", "b"}, Tags: []string{"gpu"}},
	}
	sc.WorkerTags = [][]string{{"gpu"}, nil}
	sc.Config.SweepInterval = 4 * time.Second
	sc.Config.HeartbeatInterval = 4 * time.Second
	sc.Config.HeartbeatTimeout = 8 * time.Second
	sc.Config.UnmatchedTimeout = 4 * time.Second
	sc.Config.CredentialTTL = 9 * time.Second
	sc.MaxOrchCrashes = 0
	sc.MaxWorkerCrashes = 1
	sc.MaxRevokes = 1
	sc.MaxDepth = 10
	sc.Require = []string{SomeStepFailedUnmatched, SomeCredentialRefreshed, SomeCredentialExpired}
	return sc
}

// TagsScope is the default world with required tags: w1 holds gpu and x,
// w2 only x; step a requires x (both match), b requires gpu and x (only w1
// matches: w2 holds one of the two, which is no match, SPEC §8), c none. A
// revocation of w1 leaves b unmatched. With 1
// disconnect, 1 orchestrator crash, 1 cancel, 1 revocation. It must show a
// step failed as unmatched.
func TagsScope() Scope {
	sc := DefaultScope()
	sc.Name = "tags"
	sc.Steps = []core.StepSpec{
		{Name: "a", Command: "write a", Writes: true, Tags: []string{"x"}},
		{Name: "b", Command: "read b", Tags: []string{"gpu", "x"}},
		{Name: "c", Command: "read c", DependsOn: []string{"a", "b"}},
	}
	sc.WorkerTags = [][]string{{"gpu", "x"}, {"x"}}
	sc.MaxRevokes = 1
	sc.MaxDepth = 11
	sc.Require = []string{SomeStepFailedUnmatched}
	return sc
}

// ChainScope is a transitive DAG a → b → c (a write-bearing, b and c not),
// so that a failure or a cancel cascades over two levels. The default
// budgets. It must show a cascade skip.
func ChainScope() Scope {
	sc := DefaultScope()
	sc.Name = "chain"
	sc.Steps = []core.StepSpec{
		{Name: "a", Command: "write a", Writes: true},
		{Name: "b", Command: "read b", DependsOn: []string{"a"}},
		{Name: "c", Command: "read c", DependsOn: []string{"b"}},
	}
	sc.MaxDepth = 12
	sc.Require = []string{SomeCascadeSkip}
	return sc
}

// ScalerScope is the default world with w2 scaler-managed (Hello.Scaler):
// on its disconnect there is no grace window, its leases are triaged in
// that same batch (SPEC §4), and it never comes back. It must show a
// started scaler lease triaged so.
func ScalerScope() Scope {
	sc := DefaultScope()
	sc.Name = "scaler"
	sc.ScalerWorker = 2
	sc.MaxDepth = 12
	sc.Require = []string{SomeScalerLeaseTriaged}
	return sc
}

// ArchiveScope is archival and late reports (SPEC §7a): one worker with
// two slots, a run of a write-bearing step a and a no-write step b, so that
// the run leaves the core in the batch of its last report; 1 disconnect and
// 1 orchestrator crash, either of which can lose that report's answer, and
// 1 operator cancel (a report answered CANCELLED); after a lost answer
// the worker reconnects listing the lease and re-sends the report,
// answered from the closed-lease table (the crash: after a restore that
// replayed the table). It must show the run archived, and a report after
// the archival answered from the table, with and without a restart between.
func ArchiveScope() Scope {
	sc := DefaultScope()
	sc.Name = "archive"
	sc.Workers = 1
	sc.Slots = 2
	sc.Steps = []core.StepSpec{
		{Name: "a", Command: "write a", Writes: true},
		{Name: "b", Command: "read b"},
	}
	sc.MaxDepth = 14
	sc.Require = []string{SomeRunArchived, SomeReportAfterArchive, SomeReportAfterArchiveRestart}
	return sc
}

// ChildScope is child runs (SPEC §2): one worker with two slots, a run of
// a workflow step p whose child run holds a write-bearing step k and a
// no-write step j; 1 disconnect, 1 orchestrator crash and 1 operator
// cancel (of the parent: the cascade, p cancelling until its child has
// finished). It must show p taking its child's outcome.
func ChildScope() Scope {
	sc := DefaultScope()
	sc.Name = "child"
	sc.Workers = 1
	sc.Slots = 2
	sc.Steps = []core.StepSpec{
		{Name: "p", Workflow: &core.RunSpec{Name: "kid", Steps: []core.StepSpec{
			{Name: "k", Command: "write k", Writes: true},
			{Name: "j", Command: "read j"},
		}}},
	}
	sc.MaxDepth = 12
	sc.Require = []string{SomeChildRunFinished}
	return sc
}

// LocksScope is a step group (SPEC §8a): two independent steps of one
// group of max 1 and two free workers, so the second step must wait for
// the first's lease to end — through a crash, a disconnect and a cancel.
// GroupCapHeld is checked in every state.
func LocksScope() Scope {
	sc := DefaultScope()
	sc.Name = "locks"
	db := core.ConcurrencyGroup{Name: "db", Max: 1}
	sc.Steps = []core.StepSpec{
		{Name: "a", Command: "migrate a", Writes: true, Group: db},
		{Name: "b", Command: "migrate b", Group: db},
	}
	sc.MaxDepth = 12
	sc.Require = []string{SomeStepGroupWait}
	return sc
}

// AheadScope is lease-ahead (SPEC §3): one worker with one slot and one
// lease ahead, a run of two independent steps, a write-bearing a and a
// no-write b, so one of them is held while the other runs; 1 disconnect,
// 1 orchestrator crash and 1 operator cancel reach a held lease (listed
// held on reconnect, kept held by a restore, cancelled while held). It
// must show a held lease started when the slot freed.
func AheadScope() Scope {
	sc := DefaultScope()
	sc.Name = "ahead"
	sc.Workers = 1
	sc.Worker.Ahead = 1
	sc.Steps = []core.StepSpec{
		{Name: "a", Command: "write a", Writes: true},
		{Name: "b", Command: "read b"},
	}
	sc.MaxDepth = 12
	sc.Require = []string{SomeHeldStarted}
	return sc
}

// ScopeNames lists every named scope, in the order the tests run them.
var ScopeNames = []string{"default", "faults", "identity", "slow", "multiset", "timers", "tags", "chain", "scaler", "archive", "child", "locks", "ahead", "large"}

// ScopeByName returns a named scope (ScopeNames).
func ScopeByName(name string) (Scope, bool) {
	switch name {
	case "", "default":
		return DefaultScope(), true
	case "faults":
		return FaultsScope(), true
	case "identity":
		return IdentityScope(), true
	case "slow":
		return SlowScope(), true
	case "multiset":
		return MultisetScope(), true
	case "large":
		return LargeScope(), true
	case "timers":
		return TimersScope(), true
	case "tags":
		return TagsScope(), true
	case "chain":
		return ChainScope(), true
	case "scaler":
		return ScalerScope(), true
	case "archive":
		return ArchiveScope(), true
	case "child":
		return ChildScope(), true
	case "locks":
		return LocksScope(), true
	case "ahead":
		return AheadScope(), true
	}
	return Scope{}, false
}

// Explore explores every state reachable within the scope's bounds, checks
// each against the invariants, and returns the figures, the sometimes
// properties reached, and a counterexample if some state breaks an
// invariant: breadth-first, the shortest one.
func Explore(sc Scope) Result {
	res, _ := explore(sc)
	return res
}

// explore is Explore, and the explorer it used (for tests of its caches).
func explore(sc Scope) (Result, *explorer) {
	x := newExplorer(sc)
	defer debug.SetGCPercent(debug.SetGCPercent(exploreGOGC))
	x.start = time.Now()
	var res Result
	par := sc.Parallel
	if par <= 0 {
		par = runtime.GOMAXPROCS(0)
	}
	if sc.DFS {
		res = x.pdfs(par) // one goroutine or several: explore_pdfs.go
	} else {
		res = x.bfs()
	}
	res.Scope = sc.Name
	res.Goroutines = par
	res.Duration = time.Since(x.start)
	res.MemoHits, res.MemoMisses = x.memo.stats()
	res.Completions, res.CompletionActs = int(x.completions.Load()), int(x.completionActs.Load())
	res.Sometimes = map[string]bool{}
	for i, n := range sometimesAll {
		res.Sometimes[n] = x.hits&(1<<i) != 0
	}
	res.Required = append(slices.Clone(SometimesProperties), sc.Require...)
	return res, x
}

// outOfBudget says whether the state or time budget is spent.
func (x *explorer) outOfBudget(states int) bool {
	return (x.sc.MaxStates > 0 && states >= x.sc.MaxStates) ||
		(x.sc.MaxTime > 0 && time.Since(x.start) >= x.sc.MaxTime)
}

// ---- breadth-first ----

// pathNode is one state's way in: its BFS parent and the action from it.
// Labels are computed again, by replaying the actions, only for a
// counterexample (rendering every label costs more than the step itself).
type pathNode struct {
	parent int32
	act    action
}

type expansion struct {
	succ []*xsucc
	acts []action
	self completion // the expanded state's own completion, if it needed one
}

func (x *explorer) bfs() Result {
	var res Result
	init, err := x.initial()
	if err != nil {
		res.Violation = &Counterexample{Invariant: "Setup", Detail: err.Error()}
		return res
	}
	visited := make(map[uint64]int32, 1<<16)
	visited[x.hash(init)] = 0
	nodes := []pathNode{{parent: -1}}
	res.States = 1
	type item struct {
		s  *xstate
		id int32
	}
	frontier := []item{{init, 0}}
	par := x.sc.Parallel
	if par <= 0 {
		par = runtime.GOMAXPROCS(0)
	}
	const chunk = 1024
	out := make([]expansion, chunk)
	for depth := 0; len(frontier) > 0; depth++ {
		if x.sc.MaxDepth > 0 && depth >= x.sc.MaxDepth {
			res.DepthBounded = true
			break
		}
		last := x.sc.MaxDepth > 0 && depth+1 >= x.sc.MaxDepth // successors are checked, never expanded
		var nf []item
		// Expand the level a chunk at a time, in parallel, and merge each
		// chunk in parent order: the result is deterministic, and only one
		// chunk's successors are held at once.
		for lo := 0; lo < len(frontier); lo += chunk {
			hi := min(lo+chunk, len(frontier))
			var wg sync.WaitGroup
			var next atomic.Int64
			next.Store(int64(lo))
			for range par {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						j := int(next.Add(1) - 1)
						if j >= hi {
							return
						}
						out[j-lo] = x.expand(frontier[j].s, !last)
						frontier[j].s = nil // the parent is not needed any more
					}
				}()
			}
			wg.Wait()
			for i := lo; i < hi; i++ {
				e := out[i-lo]
				out[i-lo] = expansion{}
				res.Transitions += len(e.acts)
				x.hits |= e.self.hits
				if v := e.self.viol; v != nil {
					res.Violation = x.completionExample(actionsTo(nodes, frontier[i].id), e.self.tail, v)
					return res
				}
				for k, sc := range e.succ {
					x.hits |= sc.hits
					if sc.viol != nil {
						// The first violation in BFS order ends a shortest path
						// (or, found by a completion, a shortest explored prefix).
						nodes = append(nodes, pathNode{parent: frontier[i].id, act: e.acts[k]})
						res.States++
						res.MaxDepth = depth + 1
						res.Violation = x.completionExample(actionsTo(nodes, int32(len(nodes)-1)), sc.tail, sc.viol)
						return res
					}
					if _, seen := visited[sc.hash]; seen {
						continue
					}
					id := int32(len(nodes))
					visited[sc.hash] = id
					nodes = append(nodes, pathNode{parent: frontier[i].id, act: e.acts[k]})
					res.States++
					res.MaxDepth = depth + 1
					switch {
					case sc.pruned:
						res.Pruned++
					case last:
						res.DepthBounded = true
					default:
						nf = append(nf, item{sc.s, id})
					}
				}
				if x.outOfBudget(res.States) {
					res.Truncated = true
					return res
				}
			}
		}
		frontier = nf
		if x.sc.Progress != nil {
			x.sc.Progress(depth+1, res.States, len(frontier), time.Since(x.start))
		}
	}
	return res
}

// expand computes every successor of s. keep says they will be expanded in
// turn: their checkers are then packed for the frontier.
func (x *explorer) expand(s *xstate, keep bool) expansion {
	if s.chk == nil {
		s.chk = s.pchk.unpack(s.o)
	}
	acts := x.actions(s)
	e := expansion{succ: make([]*xsucc, 0, len(acts)), acts: acts}
	if x.needsCompletion(s, acts) {
		e.self = x.complete(s)
	}
	for _, a := range acts {
		sc := x.apply(s, a, false)
		if sc.viol == nil && (!keep || sc.pruned) {
			// Its future is not explored: complete it.
			x.completeSucc(sc)
		}
		switch {
		case !keep || sc.viol != nil || sc.pruned:
			sc.s = nil
		case sc.s.chk == s.chk && s.pchk != nil:
			sc.s.chk = nil // untouched: it shares its parent's pack
		default:
			sc.s.pchk = x.packs.intern(sc.s.chkHash, packChecker(sc.s.chk))
			sc.s.chk = nil
		}
		e.succ = append(e.succ, sc)
	}
	return e
}

// ---- counterexamples ----

func actionsTo(nodes []pathNode, id int32) []action {
	var p []action
	for n := id; n > 0; n = nodes[n].parent {
		p = append(p, nodes[n].act)
	}
	slices.Reverse(p)
	return p
}

// completeSucc completes a successor whose future the search does not
// explore, and takes on what the completion found.
func (x *explorer) completeSucc(sc *xsucc) {
	c := x.complete(sc.s)
	sc.hits |= c.hits
	if c.viol != nil {
		sc.viol, sc.tail = c.viol, c.tail
	}
}

// completionExample renders a violation found by the search (tail empty)
// or by a completion after the explored prefix.
func (x *explorer) completionExample(prefix, tail []action, v *Violation) *Counterexample {
	ce := x.counterexample(append(slices.Clone(prefix), tail...), v.Invariant, v.Detail)
	if len(tail) > 0 {
		ce.Completion = len(tail)
		ce.shortest = fmt.Sprintf("; the last %d are a fault-free completion past the explored bounds", len(tail))
		if !x.sc.DFS {
			ce.shortest += ", after a shortest explored prefix"
		}
	}
	return ce
}

// counterexample renders a path of actions: it replays them from the
// initial state, this time with labels and simulator notes.
func (x *explorer) counterexample(acts []action, inv, detail string) *Counterexample {
	ce := &Counterexample{Invariant: inv, Detail: detail, Scope: x.sc.Name + ": " + x.sc.describe()}
	if !x.sc.DFS {
		ce.shortest = "; breadth-first: no shorter path breaks an invariant"
	}
	ce.Start = "tokens created, the run submitted, every worker booted"
	if x.sc.Enrolled {
		ce.Start += " and enrolled (connect, hello, welcome, in worker order)"
	}
	faults := map[string]bool{}
	var sim []string
	var steps []ScriptStep
	if s, err := x.initial(); err == nil {
		for _, a := range acts {
			sc := x.apply(s, a, true)
			ce.Path = append(ce.Path, sc.label)
			steps = append(steps, sc.step)
			sim = append(sim, sc.sim)
			if sc.fault != "" {
				faults[sc.fault] = true
			}
			s = sc.s
		}
	}
	var fs []string
	for f := range faults {
		fs = append(fs, f)
	}
	slices.Sort(fs)
	var b strings.Builder
	fmt.Fprintf(&b, "simulator note: to meet this in the simulator (sim.Options) a seed needs %d workers with BackoffMax %s (MaxDelayWork) and ",
		x.sc.Workers, x.sc.Worker.BackoffMax)
	if len(fs) == 0 {
		b.WriteString("no fault (an ordinary interleaving)")
	} else {
		b.WriteString(strings.Join(fs, "; "))
	}
	b.WriteString("; the path as simulator events (sim/world.go vocabulary):\n")
	for _, e := range sim {
		b.WriteString("  " + e + "\n")
	}
	ce.SimNote = b.String()
	ce.Script = x.script(steps, inv, detail)
	ce.Replay = fmt.Sprintf("sc, _ := spec.ScopeByName(%q); v, err := spec.Replay(sc, ce.Path)", x.sc.Name)
	return ce
}

// Replay re-executes a counterexample's path (its labels) from the initial
// state of sc and returns the violation it reaches, or an error naming the
// first label that no enabled action has.
func Replay(sc Scope, path []string) (*Violation, error) {
	x := newExplorer(sc)
	s, err := x.initial()
	if err != nil {
		return nil, err
	}
	for i, want := range path {
		var found *xsucc
		acts := x.actions(s)
		if a, _, ok := x.completionNext(s); ok {
			acts = append(acts, a) // a completion's step past the bounds
		}
		for _, a := range acts {
			if sc := x.apply(s, a, true); sc.label == want {
				found = sc
				break
			}
		}
		if found == nil {
			return nil, fmt.Errorf("step %d: no enabled action is %q", i+1, want)
		}
		if found.viol != nil {
			return found.viol, nil
		}
		s = found.s
	}
	return nil, nil
}

// describe renders a scope's bounds on one line.
func (sc Scope) describe() string {
	mode := "bfs"
	if sc.DFS {
		mode = "dfs"
	}
	return fmt.Sprintf("%s, %d workers, %d steps, %s network, depth<=%d, horizon %s, disconnects<=%d, orchestrator crashes<=%d, worker crashes<=%d, restarts<=%d, identity restarts<=%d, cancels<=%d, revokes<=%d, dups<=%d, drops<=%d, delays<=%d, log lines<=%d",
		mode, sc.Workers, len(sc.Steps), sc.Network, sc.MaxDepth, sc.Horizon, sc.MaxDisconnects, sc.MaxOrchCrashes,
		sc.MaxWorkerCrashes, sc.MaxWorkerRestarts, sc.MaxIdentityRestarts, sc.MaxCancels, sc.MaxRevokes, sc.MaxDups, sc.MaxDrops, sc.MaxDelays, sc.MaxLogLines)
}

// exploreGOGC is the GC percent while Explore runs: the search makes many
// short-lived machine copies while a large frontier stays live, so it
// collects less often than the default 100 (measured on the default scope:
// 150 costs ~1.5x the live heap in RSS and saves ~20% of the time).
var exploreGOGC = 150
