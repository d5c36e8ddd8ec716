package sim

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tether-run/tether/core"
	"github.com/tether-run/tether/spec"
)

var flagScript = flag.String("sim.script", "", "TestReplayScript: a counterexample script saved by the explorer (spec.Script.WriteFile), replayed in the simulator")

// withoutBug says what the simulator does with a planted bug's
// counterexample when the bug is not planted: the core's own batches.
var withoutBug = map[string]struct {
	clean    bool   // every step replays and nothing breaks
	diverges string // or: the last step diverges, the simulator's message being this one
}{
	// The doctored verdict is in the last batch only: every step replays,
	// and the stale report is answered CANCELLED as it should be.
	"stale-report-committed": {clean: true},
	// The doctored Dispatch is the last step's message: the core's own says
	// the step writes, so the worker's next message is not the script's.
	"no-start-handshake": {diverges: "dispatch lease=1 step=run-1/a attempt=1 writes=true"},
}

// TestReplayCounterexamples: a counterexample the explorer finds for a
// planted bug, saved and loaded as a script, replays in the simulator's own
// world (its network, its write-ahead pipeline, its worker and process code)
// to the same invariant violation at the same step; without the planted bug
// the same script replays to the end without a violation, or diverges at
// exactly the step whose message the bug doctored — so the replay is
// faithful, not vacuous.
func TestReplayCounterexamples(t *testing.T) {
	for _, bug := range spec.PlantedBugs {
		t.Run(bug.Name, func(t *testing.T) {
			want, ok := withoutBug[bug.Name]
			if !ok {
				t.Fatalf("no expectation for %s without the bug: add one to withoutBug", bug.Name)
			}
			sc := bug.Plant(spec.DefaultScope())
			sc.MaxDepth = 8
			res := spec.Explore(sc)
			ce := res.Violation
			if ce == nil || ce.Script == nil {
				t.Fatalf("the explorer found no counterexample with a script: %s", res.Summary())
			}
			if !strings.Contains(ce.String(), "TestReplayScript") {
				t.Errorf("the counterexample does not say how to replay it in the simulator:\n%s", ce)
			}
			file := filepath.Join(t.TempDir(), "ce.json")
			if err := ce.Script.WriteFile(file); err != nil {
				t.Fatal(err)
			}
			script, err := spec.ReadScript(file)
			if err != nil {
				t.Fatal(err)
			}
			if script.Planted != bug.Name || script.Invariant != ce.Invariant || len(script.Steps) != script.Setup+len(ce.Path) {
				t.Fatalf("the script (planted %q, invariant %q, %d steps of which %d setup) does not match the counterexample (%s, %d actions)",
					script.Planted, script.Invariant, len(script.Steps), script.Setup, ce.Invariant, len(ce.Path))
			}
			n := len(script.Steps)

			got := RunScript(script, bug.Mutate, Config{})
			t.Logf("explorer:\n%s\nsimulator, bug planted:\n%s", ce, got)
			switch {
			case got.Diverged != nil:
				t.Fatalf("the simulator could not replay the counterexample: %v", got.Diverged)
			case got.Failure == nil:
				t.Fatalf("the simulator replayed all %d steps and saw no violation; the explorer saw %s", got.Steps, ce.Invariant)
			case got.Failure.Invariant != ce.Invariant:
				t.Errorf("the simulator saw %s, the explorer %s", got.Failure.Invariant, ce.Invariant)
			case got.Steps != n:
				t.Errorf("the simulator saw %s at step %d, the explorer at step %d", got.Failure.Invariant, got.Steps, n)
			}

			clean := RunScript(script, nil, Config{})
			t.Logf("simulator, no bug:\n%s", clean)
			if clean.Failure != nil {
				t.Fatalf("without the planted bug the simulator still saw %s at step %d: %s", clean.Failure.Invariant, clean.Steps, clean.Failure.Detail)
			}
			switch d := clean.Diverged; {
			case want.clean && d != nil:
				t.Errorf("without the bug the script was expected to replay to the end: %v", d)
			case want.clean && clean.Steps != n:
				t.Errorf("without the bug %d of %d steps replayed", clean.Steps, n)
			case !want.clean && d == nil:
				t.Errorf("without the bug the last step was expected to diverge (the simulator's message being %s), but every step replayed", want.diverges)
			case !want.clean && (d.Step != n || !strings.Contains(d.Reason, want.diverges) || d.Label != script.Steps[n-1].Label):
				t.Errorf("without the bug step %d (%s) diverged: %s; want step %d, the simulator's message being %s", d.Step, d.Label, d.Reason, n, want.diverges)
			}
		})
	}
}

// TestReplayWalks: random paths through the explorer's worlds replay in the
// simulator step for step, and both worlds agree that nothing breaks. The
// walks take only actions the simulator's network has an equivalent for
// (not a duplicate towards a worker, not a lone loss). Over the default
// scope's world every path replays to its end; with more faults a path may
// only stop at one known difference between the worlds: the simulator loses
// what a worker sent just before it closed its connection or died, while the
// explorer, like TCP and the real driver (which writes what it queued before
// its close frame), may still deliver it.
func TestReplayWalks(t *testing.T) {
	all := []string{"deliver-to-orch", "deliver-to-worker", "dup-to-orch", "reset", "orch-notices", "worker-notices", "connect", "dial-fail",
		"tick-orch", "tick-worker", "process-exit(0)", "process-exit(1)", "process-exit(143)", "process-output",
		"crash-orch", "restart-orch", "crash-worker", "restart-worker", "restart-same-worker", "cancel", "revoke"}
	for _, tc := range []struct {
		name      string
		scope     spec.Scope
		walks     int
		mayDiffer []spec.ScriptKind
		minFull   int      // walks that must replay to their end
		kinds     []string // step kinds some walk must have replayed (process-exit by code)
	}{
		{name: "default", scope: spec.DefaultScope(), walks: 150, minFull: 150,
			kinds: []string{"cancel", "crash-orch", "restart-orch", "reset", "tick-orch", "process-exit(0)", "process-exit(1)", "process-exit(143)"}},
		{name: "default-all-faults", scope: allFaults(spec.DefaultScope()), walks: 150, minFull: 75, kinds: all,
			mayDiffer: []spec.ScriptKind{spec.ScriptDeliverToOrch, spec.ScriptDupToOrch}},
		{name: "faults", scope: spec.FaultsScope(), walks: 150, minFull: 100,
			kinds:     []string{"dial-fail", "crash-worker", "restart-worker", "restart-same-worker", "revoke", "dup-to-orch"},
			mayDiffer: []spec.ScriptKind{spec.ScriptDeliverToOrch, spec.ScriptDupToOrch}},
	} {
		name := tc.name
		t.Run(name, func(t *testing.T) {
			sc := tc.scope
			full, steps := 0, 0
			differ := map[spec.ScriptKind]int{}
			took := map[string]int{} // script step kinds replayed (exits by code)
			for seed := uint64(1); seed <= uint64(tc.walks); seed++ {
				r := rand.New(rand.NewPCG(seed, 0x3a1c))
				script, v, err := spec.Walk(sc, 40, simulable(r))
				if err != nil {
					t.Fatal(err)
				}
				if v != nil {
					t.Fatalf("walk %d: the explorer saw %s", seed, v)
				}
				res := RunScript(script, nil, Config{})
				steps += res.Steps
				for _, st := range script.Steps[:res.Steps] {
					k := string(st.Kind)
					if st.Kind == spec.ScriptExit {
						k += fmt.Sprintf("(%d)", st.Code)
					}
					took[k]++
				}
				if res.Failure != nil {
					t.Fatalf("walk %d: the simulator saw %s where the explorer saw nothing:\n%s", seed, res.Failure.Invariant, res)
				}
				if d := res.Diverged; d != nil {
					k := script.Steps[d.Step-1].Kind
					ok := false
					for _, m := range tc.mayDiffer {
						ok = ok || m == k
					}
					if !ok {
						t.Fatalf("walk %d: %v", seed, res)
					}
					if k == spec.ScriptDeliverToOrch || k == spec.ScriptDupToOrch {
						// Lost with the connection its worker closed or died
						// with: the orchestrator has yet to notice that.
						lost := strings.HasPrefix(d.Reason, "nothing is in flight") || strings.HasPrefix(d.Reason, "the network offers no copy")
						noticing := slices.ContainsFunc(d.Pending, func(p string) bool {
							return strings.HasPrefix(p, "orch-notices-drop "+string(script.Steps[d.Step-1].Worker)+" ")
						})
						if !lost || !noticing {
							t.Fatalf("walk %d: a message towards the orchestrator differs, and not by a closed connection's loss: %v", seed, res)
						}
					}
					differ[k]++
					continue
				}
				if res.Steps != len(script.Steps) {
					t.Fatalf("walk %d: %d of %d steps replayed, and no divergence", seed, res.Steps, len(script.Steps))
				}
				full++
			}
			t.Logf("%s: %d of %d walks replayed to their end (%d steps replayed in all); stopped at a known difference: %v", name, full, tc.walks, steps, differ)
			t.Logf("steps replayed by kind: %v", took)
			if full < tc.minFull {
				t.Errorf("only %d walks replayed to their end, want at least %d", full, tc.minFull)
			}
			for _, k := range tc.kinds {
				if took[k] == 0 {
					t.Errorf("no walk replayed a %s step", k)
				}
			}
		})
	}
}

// simulable picks, at random, an explorer action the simulator's network
// has an equivalent for (not a duplicate towards a worker, not a lone loss).
func simulable(r *rand.Rand) func(next []spec.ScriptStep) int {
	return func(next []spec.ScriptStep) int {
		var ok []int
		for i, st := range next {
			switch st.Kind {
			case spec.ScriptDupToWorker, spec.ScriptDropToOrch, spec.ScriptDropToWorker:
			default:
				ok = append(ok, i)
			}
		}
		if len(ok) == 0 {
			return -1
		}
		return ok[r.IntN(len(ok))]
	}
}

// allFaults is sc with every fault, the log lines and the operator's
// revocations (each at most once or twice).
func allFaults(sc spec.Scope) spec.Scope {
	sc.MaxDisconnects, sc.MaxWorkerCrashes, sc.MaxWorkerRestarts, sc.MaxRevokes = 2, 1, 1, 1
	sc.MaxIdentityRestarts = 1
	sc.MaxDups, sc.MaxLogLines = 1, 2
	return sc
}

// TestReplayDeterministic: a scripted run is a pure function of its script.
func TestReplayDeterministic(t *testing.T) {
	sc := spec.FaultsScope()
	r := rand.New(rand.NewPCG(7, 0x3a1c))
	script, _, err := spec.Walk(sc, 40, simulable(r))
	if err != nil {
		t.Fatal(err)
	}
	a, b := RunScript(script, nil, Config{}), RunScript(script, nil, Config{})
	if a.Events == 0 || a.TraceHash != b.TraceHash || a.Events != b.Events || strings.Join(a.Trace, "\n") != strings.Join(b.Trace, "\n") {
		t.Fatalf("two runs of one script differ: %d/%d events, trace %#x/%#x", a.Events, b.Events, a.TraceHash, b.TraceHash)
	}
}

// TestReplayDivergenceReported: a step the simulator's world cannot take
// ends the run with an error naming the step and what was pending.
func TestReplayDivergenceReported(t *testing.T) {
	bug := spec.PlantedBugs[0]
	sc := bug.Plant(spec.DefaultScope())
	sc.MaxDepth = 8
	ce := spec.Explore(sc).Violation
	if ce == nil {
		t.Fatal("no counterexample")
	}
	script := *ce.Script
	script.Steps = append([]spec.ScriptStep(nil), script.Steps...)
	k := script.Setup // the first step of the path: a delivery
	st := &script.Steps[k]
	if st.Kind != spec.ScriptDeliverToWorker && st.Kind != spec.ScriptDeliverToOrch {
		t.Fatalf("the path starts with %s, not a delivery", st.Kind)
	}
	real := st.Msg
	st.Msg = "heartbeat in-flight=[]"
	res := RunScript(&script, bug.Mutate, Config{})
	d := res.Diverged
	if d == nil || res.Failure != nil {
		t.Fatalf("a doctored step replayed: %s", res)
	}
	msg := d.Error()
	for _, want := range []string{fmt.Sprintf("script step %d", k+1), st.Label, "heartbeat", real, "pending:"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the divergence does not say %q:\n%s", want, msg)
		}
	}
	if res.Steps != k {
		t.Errorf("%d steps replayed before the divergence, want %d", res.Steps, k)
	}
}

// TestReplayScript replays a counterexample script saved by the explorer
// (go test ./spec prints the command): it fails if the simulator sees an
// invariant broken, or cannot take a step of the script.
func TestReplayScript(t *testing.T) {
	if *flagScript == "" {
		t.Skip("no -sim.script file")
	}
	script, err := spec.ReadScript(*flagScript)
	if err != nil {
		t.Fatal(err)
	}
	var mutate func(*core.Ready)
	if script.Planted != "" {
		bug, ok := spec.PlantedBugByName(script.Planted)
		if !ok {
			t.Fatalf("the script was found with planted bug %q, which spec.PlantedBugs does not have", script.Planted)
		}
		mutate = bug.Mutate
		t.Logf("planting %s, as the explorer did", bug.Name)
	}
	cfg := Config{}
	if *flagTrace {
		cfg.Trace = os.Stdout
	}
	res := RunScript(script, mutate, cfg)
	if res.Failure != nil || res.Diverged != nil {
		t.Fatalf("the explorer saw %s at step %d; %s", script.Invariant, len(script.Steps), res)
	}
	t.Logf("the explorer saw %s at step %d; %s", script.Invariant, len(script.Steps), res)
}
