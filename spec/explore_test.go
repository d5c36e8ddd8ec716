package spec

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tether-run/tether/core"
)

var (
	flagExploreScope    = flag.String("explore.scope", "default", "explorer scope for TestExplore: "+strings.Join(ScopeNames, ", "))
	flagExploreDepth    = flag.Int("explore.depth", 0, "override the scope's depth bound (0: the scope's own)")
	flagExploreReplay   = flag.String("explore.replay", "", "TestExploreReplay: a file holding a counterexample's path, one action per line, replayed in -explore.scope")
	flagExploreProgress = flag.Bool("explore.progress", false, "print a line per finished BFS level")
	flagExploreTime     = flag.Duration("explore.time", 0, "override the scope's wall-time budget (0: the scope's own)")
	flagExploreStates   = flag.Int("explore.states", 0, "override the scope's state budget (0: the scope's own)")
)

func exploreScope(t *testing.T) Scope {
	t.Helper()
	sc, ok := ScopeByName(*flagExploreScope)
	if !ok {
		t.Fatalf("unknown -explore.scope %q (want one of %s)", *flagExploreScope, strings.Join(ScopeNames, ", "))
	}
	if *flagExploreDepth > 0 {
		sc.MaxDepth = *flagExploreDepth
	}
	if *flagExploreTime > 0 {
		sc.MaxTime = *flagExploreTime
	}
	if *flagExploreStates > 0 {
		sc.MaxStates = *flagExploreStates
	}
	if *flagExploreProgress {
		sc.Progress = func(depth, states, frontier int, el time.Duration) {
			fmt.Printf("explore %s: depth %d, %d states, frontier/stack %d, %s\n", sc.Name, depth, states, frontier, el.Round(time.Millisecond))
		}
	}
	return sc
}

// report prints the one-line summary (t.Log, and stdout because go test
// hides a passing test's log) and fails on a violation, leaving its path in
// a file that TestExploreReplay replays.
func report(t *testing.T, sc Scope, res Result) {
	t.Helper()
	line := res.Summary()
	t.Log(line)
	fmt.Println(line)
	if res.Violation == nil {
		return
	}
	file := filepath.Join(os.TempDir(), fmt.Sprintf("tether-explore-%s.path", sc.Name))
	msg := ""
	if err := os.WriteFile(file, []byte(strings.Join(res.Violation.Path, "\n")+"\n"), 0o644); err == nil {
		msg = fmt.Sprintf("replay: go test ./spec -run 'TestExploreReplay$' -explore.scope=%s -explore.replay=%s -v\n", sc.Name, file)
	}
	if res.Violation.Script != nil {
		script := filepath.Join(os.TempDir(), fmt.Sprintf("tether-explore-%s.script.json", sc.Name))
		if err := res.Violation.Script.WriteFile(script); err == nil {
			msg += "replay in the simulator: " + ScriptReplayCommand(script) + "\n"
		}
	}
	t.Fatalf("\n%s%s", res.Violation, msg)
}

// TestExplore explores a scope (-explore.scope, default: the default scope)
// exhaustively within its bounds: no invariant may break, and every
// sometimes property must be shown (else the bounds made the model vacuous).
func TestExplore(t *testing.T) {
	sc := exploreScope(t)
	if testing.Short() && sc.Name == "default" {
		sc.MaxOrchCrashes = 0 // the same depth (the shortest success takes 14 actions), fewer faults
	}
	res := Explore(sc)
	report(t, sc, res)
	miss := res.Missing()
	switch {
	case len(miss) > 0 && res.Truncated:
		t.Logf("scope %s was cut short by its budget before it showed %s", sc.Name, strings.Join(miss, ", "))
	case len(miss) > 0:
		t.Errorf("scope %s never showed %s: the bounded model is vacuous there (%s)", sc.Name, strings.Join(miss, ", "), sc.describe())
	}
	if sc.Name == "default" && !testing.Short() && *flagExploreDepth == 0 && res.States < 100_000 {
		t.Errorf("the default scope reached only %d states; it is meant to reach at least 100,000", res.States)
	}
}

// smallDepths is the depth each scope is explored to in TestExploreScopes
// (make test): shallower than the scope's own, its fault budgets
// unchanged; every required sometimes property is still shown there
// (completions carry every leaf to the end of the run).
var smallDepths = map[string]int{
	"faults": 7, "identity": 10, "slow": 9, "multiset": 7,
	"timers": 8, "tags": 11, "chain": 12, "scaler": 9, "archive": 12, "child": 10, "locks": 10, "ahead": 11,
}

// TestExploreScopes explores a small budget of every named scope but the
// default one (TestExplore) and large (make explore), with the
// reachability check on: no invariant may break, and each scope must show
// every sometimes property it requires. `go test ./spec -run
// 'TestExplore$' -explore.scope=S` explores scope S to its own depth.
func TestExploreScopes(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	for _, name := range ScopeNames {
		d, ok := smallDepths[name]
		if !ok {
			continue
		}
		t.Run(name, func(t *testing.T) {
			sc, _ := ScopeByName(name)
			sc.MaxDepth = d
			res := Explore(sc)
			report(t, sc, res)
			if miss := res.Missing(); len(miss) > 0 {
				t.Errorf("scope %s never showed %s: the bounded model is vacuous there (%s)", name, strings.Join(miss, ", "), sc.describe())
			}
		})
	}
}

// TestSmallDepthsCoverScopes: every scope but default and large has a
// small budget in TestExploreScopes, no deeper than its own.
func TestSmallDepthsCoverScopes(t *testing.T) {
	for _, name := range ScopeNames {
		sc, ok := ScopeByName(name)
		if !ok {
			t.Fatalf("ScopeNames lists %q, which ScopeByName does not know", name)
		}
		d, ok := smallDepths[name]
		switch {
		case name == "default" || name == "large":
			if ok {
				t.Errorf("scope %s has a small depth; it runs in its own test or target", name)
			}
		case !ok:
			t.Errorf("scope %s has no small depth: make test would not explore it", name)
		case d > sc.MaxDepth:
			t.Errorf("scope %s: small depth %d is deeper than its own %d", name, d, sc.MaxDepth)
		}
	}
}

// TestExploreReplay replays a counterexample's path saved by TestExplore.
func TestExploreReplay(t *testing.T) {
	if *flagExploreReplay == "" {
		t.Skip("no -explore.replay file")
	}
	b, err := os.ReadFile(*flagExploreReplay)
	if err != nil {
		t.Fatal(err)
	}
	var path []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			path = append(path, l)
		}
	}
	v, err := Replay(exploreScope(t), path)
	switch {
	case err != nil:
		t.Fatal(err)
	case v == nil:
		t.Fatalf("the %d actions replay without a violation", len(path))
	}
	t.Logf("replayed %d actions: %s", len(path), v)
}

// TestExploreCatchesPlantedBugs shows the explorer catching planted bugs:
// each counterexample breaks one of the expected invariants, is printed one
// action per line, replays to the same violation, and is shortest (the same
// search one action shallower finds nothing within its bound, and nothing
// shorter past it).
func TestExploreCatchesPlantedBugs(t *testing.T) {
	for _, m := range PlantedBugs {
		t.Run(m.Name, func(t *testing.T) {
			sc := m.Plant(DefaultScope())
			sc.MaxDepth = 8
			res := Explore(sc)
			ce := res.Violation
			if ce == nil {
				t.Fatalf("the planted bug was not caught: %s", res.Summary())
			}
			text := ce.String()
			t.Logf("caught:\n%s", text)
			found := false
			for _, inv := range m.Invariants {
				found = found || ce.Invariant == inv
			}
			if !found {
				t.Errorf("violation of %s, want one of %v", ce.Invariant, m.Invariants)
			}
			if len(ce.Path) == 0 || len(ce.Path) > sc.MaxDepth {
				t.Fatalf("path of %d actions", len(ce.Path))
			}
			for i, p := range ce.Path {
				if p == "" || !strings.Contains(text, fmt.Sprintf("%3d. %s\n", i+1, p)) {
					t.Errorf("action %d (%q) is not printed on its own line", i+1, p)
				}
			}
			if !strings.Contains(ce.SimNote, "simulator") || ce.Replay == "" {
				t.Errorf("no simulator note or replay snippet: %q, %q", ce.SimNote, ce.Replay)
			}
			checkScript(t, sc, ce)
			v, err := Replay(sc, ce.Path)
			if err != nil || v == nil || v.Invariant != ce.Invariant {
				t.Errorf("replaying the path gave %v, %v; want a violation of %s", v, err, ce.Invariant)
			}
			if len(ce.Path) > 1 { // (the initial state itself is checked before any search)
				shallower := sc
				shallower.MaxDepth = len(ce.Path) - 1
				// (A completion past the shallower bound may still meet the
				// bug, by a longer path.)
				if r := Explore(shallower); r.Violation != nil && (r.Violation.Completion == 0 || len(r.Violation.Path) < len(ce.Path)) {
					t.Errorf("a %d-action path breaks %s too: the counterexample is not shortest", len(r.Violation.Path), r.Violation.Invariant)
				}
			}
		})
	}
}

// checkScript: a counterexample's script is its path as plain values — one
// step per action, labelled alike, after the initial state's enrollment —
// with the scope's world, and it survives a save and a load.
func checkScript(t *testing.T, sc Scope, ce *Counterexample) {
	t.Helper()
	s := ce.Script
	if s == nil {
		t.Fatal("no script")
	}
	if s.Planted != sc.Planted || s.Invariant != ce.Invariant || s.Scope != sc.Name || len(s.Workers) != sc.Workers || len(s.Run.Steps) != len(sc.Steps) {
		t.Errorf("the script's world (scope %q, planted %q, invariant %q, %d workers, %d steps) is not the scope's", s.Scope, s.Planted, s.Invariant, len(s.Workers), len(s.Run.Steps))
	}
	if want := 3 * sc.Workers; sc.Enrolled && s.Setup != want {
		t.Errorf("the script's setup has %d steps, want %d (connect, hello, welcome per worker)", s.Setup, want)
	}
	if len(s.Steps) != s.Setup+len(ce.Path) {
		t.Fatalf("%d script steps after the setup, %d actions", len(s.Steps)-s.Setup, len(ce.Path))
	}
	for i, p := range ce.Path {
		if st := s.Steps[s.Setup+i]; st.Label != p || st.Kind == "" {
			t.Errorf("script step %d is %s %q, the action %q", s.Setup+i+1, st.Kind, st.Label, p)
		}
	}
	file := filepath.Join(t.TempDir(), "script.json")
	if err := s.WriteFile(file); err != nil {
		t.Fatal(err)
	}
	back, err := ReadScript(file)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprintf("%+v", *back) != fmt.Sprintf("%+v", *s) {
		t.Errorf("the script changed in a save and a load:\n%+v\n%+v", *s, *back)
	}
	if !strings.Contains(ce.String(), ScriptReplayCommand("FILE")) {
		t.Errorf("the counterexample does not print the simulator's replay command")
	}
}

// TestExploreWalk: a walk's steps are the explorer's own actions (their
// labels replay), and a walk stops at a violation.
func TestExploreWalk(t *testing.T) {
	violations := 0
	for seed := uint64(1); seed <= 20; seed++ {
		sc := DefaultScope()
		if seed%2 == 0 {
			sc = PlantedBugs[1].Plant(sc)
		}
		r := rand.New(rand.NewPCG(seed, 1))
		s, v, err := Walk(sc, 30, func(next []ScriptStep) int { return r.IntN(len(next)) })
		if err != nil {
			t.Fatal(err)
		}
		var path []string
		for _, st := range s.Steps[s.Setup:] {
			path = append(path, st.Label)
		}
		rv, err := Replay(sc, path)
		switch {
		case err != nil:
			t.Fatalf("walk %d does not replay: %v", seed, err)
		case (v == nil) != (rv == nil) || (v != nil && (v.Invariant != rv.Invariant || s.Invariant != v.Invariant)):
			t.Fatalf("walk %d reached %v (script: %q), its replay %v", seed, v, s.Invariant, rv)
		case v != nil && len(path) == 0:
			t.Fatalf("walk %d: a violation without an action", seed)
		}
		if v != nil {
			violations++
		}
	}
	if violations == 0 {
		t.Error("no walk with the planted bug reached its violation")
	}
}

// TestExploreDFSMatchesBFS: depth-first with re-expansion of states met
// again at a smaller depth reaches exactly the states breadth-first does,
// on one goroutine or several sharing a frontier (explore_pdfs.go), and
// shows every sometimes property breadth-first shows.
func TestExploreDFSMatchesBFS(t *testing.T) {
	sc := DefaultScope()
	sc.MaxDepth = 8
	bfs := Explore(sc)
	t.Logf("bfs: %s", bfs.Summary())
	for _, par := range []int{1, 4} {
		sc.DFS, sc.Parallel = true, par
		dfs := Explore(sc)
		t.Logf("dfs, %d goroutines: %s", par, dfs.Summary())
		if bfs.Violation != nil || dfs.Violation != nil {
			t.Fatalf("violation: %v %v", bfs.Violation, dfs.Violation)
		}
		if bfs.States != dfs.States || bfs.MaxDepth != dfs.MaxDepth || bfs.Pruned != dfs.Pruned {
			t.Errorf("bfs reached %d states (depth %d, %d pruned), dfs on %d goroutines %d (depth %d, %d pruned)",
				bfs.States, bfs.MaxDepth, bfs.Pruned, par, dfs.States, dfs.MaxDepth, dfs.Pruned)
		}
		for k, v := range bfs.Sometimes {
			if v && !dfs.Sometimes[k] {
				t.Errorf("bfs showed %s, dfs on %d goroutines did not", k, par)
			}
		}
	}
	// A planted bug: the parallel search finds it, and its path replays.
	bug := PlantedBugs[0]
	sc = bug.Plant(sc)
	sc.Parallel = 4
	res := Explore(sc)
	if res.Violation == nil || !slices.Contains(bug.Invariants, res.Violation.Invariant) {
		t.Fatalf("dfs on 4 goroutines with %s planted: %s", bug.Name, res.Summary())
	}
	v, err := Replay(sc, res.Violation.Path)
	if err != nil || v == nil || v.Invariant != res.Violation.Invariant {
		t.Fatalf("the counterexample of dfs on 4 goroutines does not replay: %v, %v\n%s", v, err, res.Violation)
	}
}

// TestExploreDeterministic: the parallel search gives the same figures and
// the same counterexample every time.
func TestExploreDeterministic(t *testing.T) {
	sc := DefaultScope()
	sc.MaxDepth = 7
	a, b := Explore(sc), Explore(sc)
	if a.States != b.States || a.Transitions != b.Transitions || a.MaxDepth != b.MaxDepth || a.Pruned != b.Pruned {
		t.Errorf("two explorations differ:\n%s\n%s", a.Summary(), b.Summary())
	}
	sc.Mutate = PlantedBugs[0].Mutate
	sc.Parallel = 1
	c := Explore(sc)
	sc.Parallel = 4
	d := Explore(sc)
	if c.Violation == nil || d.Violation == nil || strings.Join(c.Violation.Path, "\n") != strings.Join(d.Violation.Path, "\n") {
		t.Errorf("counterexamples differ between 1 and 4 goroutines:\n%v\n%v", c.Violation, d.Violation)
	}
}

// TestExploreVerify runs the Checker's full cross-checks (its view against
// the orchestrator's whole state after every batch) over a shallow default
// scope: the explorer drives the Checker the way it expects.
func TestExploreVerify(t *testing.T) {
	sc := DefaultScope()
	sc.Verify = true
	sc.MaxDepth = 8
	sc.MaxDelays = 1
	res := Explore(sc)
	t.Log(res.Summary())
	if res.Violation != nil {
		t.Fatalf("\n%s", res.Violation)
	}
}

// TestExploreStateIdentity: the hash sees every part of the state — two
// different successors of one state never share a hash unless they are the
// same state (checked on the initial state's successors by comparing the
// machines' own fingerprints).
func TestExploreStateIdentity(t *testing.T) {
	x := newExplorer(DefaultScope())
	s, err := x.initial()
	if err != nil {
		t.Fatal(err)
	}
	byHash := map[uint64]*xsucc{}
	for _, a := range x.actions(s) {
		sc := x.apply(s, a, true)
		if o, ok := byHash[sc.hash]; ok {
			same := (o.s.o == nil) == (sc.s.o == nil) && o.s.now.Equal(sc.s.now)
			if same && o.s.o != nil {
				same = o.s.o.Fingerprint() == sc.s.o.Fingerprint()
			}
			for i := range o.s.ws {
				same = same && o.s.ws[i].fp == sc.s.ws[i].fp && o.s.ws[i].alive == sc.s.ws[i].alive
			}
			if !same {
				t.Errorf("%q and %q lead to different states with one hash", o.label, sc.label)
			}
		}
		byHash[sc.hash] = sc
	}
	if len(byHash) < 2 {
		t.Errorf("the initial state has %d distinct successors", len(byHash))
	}
}

// TestExploreSharedMachinesUnchanged: an orchestrator in the memo, and a
// worker in the intern table, are shared by every state that reuses them,
// so no step may change one in place — a completion's neither, though it
// steps its own copies in place (explore_complete.go).
func TestExploreSharedMachinesUnchanged(t *testing.T) {
	for _, dfs := range []bool{false, true} {
		sc := DefaultScope()
		sc.MaxDepth = 7
		sc.DFS = dfs
		res, x := explore(sc)
		if res.Violation != nil {
			t.Fatalf("\n%s", res.Violation)
		}
		if n := x.memo.changed(); n > 0 {
			t.Errorf("dfs %v: %d orchestrators in the memo changed after they were shared", dfs, n)
		}
		x.workers.each(func(h uint64, w *core.Worker) {
			if w.Fingerprint() != h {
				t.Errorf("dfs %v: a worker in the intern table changed after it was shared", dfs)
			}
		})
	}
}
