package spec

import (
	"os"
	"strings"
	"testing"

	"github.com/tether-run/tether/core"
)

// TestTableAgreesWithSpecAndCore keeps three copies of the transition table
// equal: SPEC.md §1 (normative), Table (what the checkers use), and
// core.Transitions (what the core runs). Each row is compared by name.
func TestTableAgreesWithSpecAndCore(t *testing.T) {
	src, err := os.ReadFile("SPEC.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(src)
	start := strings.Index(text, "## 1.")
	end := strings.Index(text, "## 2.")
	if start < 0 || end < start {
		t.Fatal("SPEC.md has no §1")
	}
	name := func(r Row) string { return r.From.String() + " " + r.Event.String() + " " + r.To.String() }
	spec := map[string]bool{}
	for _, line := range strings.Split(text[start:end], "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 5 || strings.TrimSpace(cells[1]) == "from" || strings.HasPrefix(strings.TrimSpace(cells[1]), "---") {
			continue
		}
		from, ok1 := core.ParseState(strings.TrimSpace(cells[1]))
		ev, ok2 := core.ParseEvent(strings.TrimSpace(cells[2]))
		to, ok3 := core.ParseState(strings.TrimSpace(cells[3]))
		if !ok1 || !ok2 || !ok3 {
			t.Fatalf("SPEC.md §1 row does not parse: %s", line)
		}
		spec[name(Row{from, ev, to})] = true
	}
	mine := map[string]bool{}
	for _, r := range Table {
		mine[name(r)] = true
	}
	theirs := map[string]bool{}
	for _, r := range core.Transitions {
		theirs[name(Row{r.From, r.Event, r.To})] = true
	}
	for _, cmp := range []struct {
		a, b         map[string]bool
		aName, bName string
	}{{spec, mine, "SPEC.md", "spec.Table"}, {mine, spec, "spec.Table", "SPEC.md"}, {mine, theirs, "spec.Table", "core.Transitions"}, {theirs, mine, "core.Transitions", "spec.Table"}} {
		for r := range cmp.a {
			if !cmp.b[r] {
				t.Errorf("%s has row %q, %s does not", cmp.aName, r, cmp.bName)
			}
		}
	}
	if len(spec) != 28 || len(Table) != 28 {
		t.Errorf("SPEC.md has %d rows, Table %d; want 28", len(spec), len(Table))
	}
	// Every other pair is refused.
	for from := core.StatePending; from <= core.StateSkipped; from++ {
		for ev := core.EvEnqueue; ev <= core.EvReuse; ev++ {
			for to := core.StatePending; to <= core.StateSkipped; to++ {
				if InTable(from, ev, to) != mine[name(Row{from, ev, to})] {
					t.Errorf("InTable(%s, %s, %s) disagrees with Table", from, ev, to)
				}
			}
			if Terminal(from) {
				if _, ok := tableIndex[rowKey{from, ev}]; ok {
					t.Errorf("terminal state %s has a row for %s", from, ev)
				}
			}
		}
	}
}

func TestSpecRequiredTags(t *testing.T) {
	cases := []struct {
		sp   core.StepSpec
		want string
		ok   bool
	}{
		{core.StepSpec{}, "", true},
		{core.StepSpec{Tags: []string{"gpu", "gpu"}}, "gpu", true},
		{core.StepSpec{Type: "script"}, "script", true},
		{core.StepSpec{Type: "script", Runner: "local"}, "script", true},
		{core.StepSpec{Type: "script", Runner: "docker"}, "docker,script", true},
		{core.StepSpec{Type: "script", Runner: "pod", Tags: []string{"arm"}}, "arm,kubernetes,script", true},
		{core.StepSpec{Type: "docker"}, "docker", true},
		{core.StepSpec{Type: "pod"}, "kubernetes", true},
		{core.StepSpec{Type: "task", Tags: []string{"x"}}, "", true},
		{core.StepSpec{Type: "docker", Runner: "pod"}, "", false},
		{core.StepSpec{Type: "vm"}, "", false},
		{core.StepSpec{Runner: "local"}, "", false},
	}
	for _, c := range cases {
		got, ok := SpecRequiredTags(c.sp)
		if strings.Join(got, ",") != c.want || ok != c.ok {
			t.Errorf("%+v: got %v %v, want %q %v", c.sp, got, ok, c.want, c.ok)
		}
		// The core agrees wherever both know the step.
		if coreTags, err := core.RequiredTags(c.sp); (err == nil) != ok || (ok && strings.Join(coreTags, ",") != c.want) {
			t.Errorf("%+v: core derives %v (%v)", c.sp, coreTags, err)
		}
	}
}

func TestMatches(t *testing.T) {
	w := WorkerTraits{Name: "w1", Tags: []string{"docker", "script"}, Labels: map[string]string{"zone": "a"}, Platform: "linux"}
	cases := []struct {
		sp  core.StepSpec
		req []string
		ok  bool
	}{
		{core.StepSpec{}, nil, true},
		{core.StepSpec{Target: "w1"}, nil, true},
		{core.StepSpec{Target: "w2"}, nil, false},
		{core.StepSpec{Labels: map[string]string{"zone": "a"}}, nil, true},
		{core.StepSpec{Labels: map[string]string{"zone": "b"}}, nil, false},
		{core.StepSpec{Labels: map[string]string{"rack": ""}}, nil, false},
		{core.StepSpec{Platform: "linux"}, nil, true},
		{core.StepSpec{Platform: "darwin"}, nil, false},
		{core.StepSpec{}, []string{"docker"}, true},
		{core.StepSpec{}, []string{"docker", "kubernetes"}, false},
	}
	for _, c := range cases {
		if ok, why := Matches(c.sp, c.req, w); ok != c.ok {
			t.Errorf("%+v %v: got %v (%s)", c.sp, c.req, ok, why)
		}
	}
}
