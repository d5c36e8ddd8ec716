package sim

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// The recorded traces: for seeds 1–300 of Swarm, what TestSim's runs of the
// seed produced — the plain run's trace hash (every event's time, sequence
// number, kind and node, and every orchestrator batch: records,
// transitions, messages, answers, events, deadline), its event count and
// verdict, and the drift run's trace hash where TestSim runs one. A seed is
// a pure function of itself: a change meant only to make the simulator
// faster must leave every line as it is. A change meant to change what a
// seed does (the workload, a fault, the core) rewrites the file with
// -sim.retrace, and the diff shows which seeds moved.
const tracesFile = "testdata/traces.txt"

var flagTraces = flag.Bool("sim.traces", true, "TestSim: compare the seeds' traces with "+tracesFile+" (the mutation harness turns it off: a planted bug changes what seeds do)")

var flagRetrace = flag.Bool("sim.retrace", false, "TestSim: rewrite "+tracesFile+" with the traces of the seeds run (go test ./sim -run 'TestSim$' -sim.seeds 300 -sim.retrace)")

// traceLine is one seed's line of the recorded traces.
func traceLine(seed uint64, j judged) string {
	verdict := "pass"
	switch {
	case j.f != nil:
		verdict = "fail:" + strings.ReplaceAll(j.f.Invariant, " ", "_")
	case j.a.Inconclusive != "":
		verdict = "inconclusive"
	}
	s := fmt.Sprintf("%d trace=%#x events=%d %s", seed, j.a.TraceHash, j.a.Events, verdict)
	if j.drift && j.f == nil {
		s += fmt.Sprintf(" drift=%#x", j.driftTrace)
	}
	return s
}

// traceCheck compares the lines of the seeds TestSim ran with the recorded
// ones (or, with -sim.retrace, records them). It applies only to TestSim's
// default configuration, the one the file was recorded with.
type traceCheck struct {
	on    bool
	lines map[uint64]string
}

func newTraceCheck(cfg Config) *traceCheck {
	tc := &traceCheck{lines: map[uint64]string{}}
	if !*flagTraces || cfg.Canary || cfg.MaxStepOps != 0 || *flagDriftN != 2 {
		return tc // another configuration: other traces
	}
	tc.on = true
	return tc
}

func (tc *traceCheck) add(seed uint64, j judged) {
	if tc.on {
		tc.lines[seed] = traceLine(seed, j)
	}
}

func (tc *traceCheck) finish(t *testing.T) {
	t.Helper()
	if !tc.on {
		return
	}
	if *flagRetrace {
		seeds := make([]uint64, 0, len(tc.lines))
		for s := range tc.lines {
			seeds = append(seeds, s)
		}
		sort.Slice(seeds, func(i, j int) bool { return seeds[i] < seeds[j] })
		var b strings.Builder
		b.WriteString("# seed, the plain run's trace hash, events and verdict, the drift run's trace hash (sim/traces_test.go)\n")
		for _, s := range seeds {
			b.WriteString(tc.lines[s] + "\n")
		}
		if err := os.WriteFile(tracesFile, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %d seeds' traces to %s", len(seeds), tracesFile)
		return
	}
	want, err := readTraces()
	if err != nil {
		t.Fatal(err)
	}
	var diff []string
	for s, line := range tc.lines {
		if w, ok := want[s]; ok && w != line {
			diff = append(diff, fmt.Sprintf("  recorded: %s\n  now:      %s", w, line))
		}
	}
	if len(diff) > 0 {
		sort.Strings(diff)
		t.Errorf("%d seeds no longer run as recorded in %s (first ones below): a seed is a pure function of itself, so a change meant only to speed the simulator up changed what it simulates; if the change is meant to change the simulation, rewrite the file with go test ./sim -run 'TestSim$' -sim.seeds 300 -sim.retrace\n%s",
			len(diff), tracesFile, strings.Join(diff[:min(len(diff), 5)], "\n"))
	}
}

func readTraces() (map[uint64]string, error) {
	f, err := os.Open(tracesFile)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[uint64]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		seed, err := strconv.ParseUint(strings.Fields(line)[0], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: %q: %v", tracesFile, line, err)
		}
		out[seed] = line
	}
	return out, sc.Err()
}
