package core

import (
	"fmt"
	"strings"
	"testing"
)

// leafSpec is a one-step run.
func leafSpec() RunSpec {
	return RunSpec{Steps: []StepSpec{{Name: "a", Command: "x", Hold: true}}}
}

// nest wraps spec in n levels of workflow steps.
func nest(spec RunSpec, n int) RunSpec {
	for range n {
		c := spec
		spec = RunSpec{Steps: []StepSpec{{Name: "w", Workflow: &c}}}
	}
	return spec
}

// TestChildLimits: a tree is at most MaxRunDepth runs deep, whether a
// submission nests it or the API's parent chain does; one submission holds
// at most MaxChildRuns runs below its root; the API gives a run at most
// MaxChildRuns children (SPEC §2, §12). Each refusal creates nothing.
func TestChildLimits(t *testing.T) {
	if err := nest(leafSpec(), MaxRunDepth-1).Validate(); err != nil {
		t.Fatalf("a tree %d runs deep is refused: %v", MaxRunDepth, err)
	}
	if err := nest(leafSpec(), MaxRunDepth).Validate(); err == nil || !strings.Contains(err.Error(), "nest 5 runs deep, at most 4") {
		t.Fatalf("a tree %d runs deep: %v", MaxRunDepth+1, err)
	}
	wide := RunSpec{}
	for i := range MaxChildRuns + 1 {
		c := leafSpec()
		wide.Steps = append(wide.Steps, StepSpec{Name: fmt.Sprintf("w%d", i), Workflow: &c})
	}
	if err := wide.Validate(); err == nil || !strings.Contains(err.Error(), "starts 65 child runs") {
		t.Fatalf("65 child runs: %v", err)
	}
	wide.Steps = wide.Steps[:MaxChildRuns]
	if err := wide.Validate(); err != nil {
		t.Fatalf("64 child runs: %v", err)
	}

	o := NewOrchestrator(DefaultConfig())
	call := CallID(0)
	submit := func(spec RunSpec, parent RunID) APIAnswer {
		call++
		rd := o.Step(t0, Submit{Call: call, Spec: spec, Parent: parent})
		return rd.Answers[0]
	}
	// An API chain: run-1 ← run-2 ← run-3 ← run-4 is 4 deep; a fifth is refused,
	// and so is a two-run tree below run-3.
	parent := RunID("")
	for range MaxRunDepth {
		a := submit(leafSpec(), parent)
		if a.Err != "" {
			t.Fatalf("depth %d: %s", o.runs[parent].Depth+1, a.Err)
		}
		parent = a.Run
	}
	seq := o.meta.RunSeq
	if a := submit(leafSpec(), parent); a.Code != CodeInvalid || !strings.Contains(a.Err, "at most 4 deep") {
		t.Errorf("a fifth run down the chain: %+v", a)
	}
	if a := submit(nest(leafSpec(), 1), "run-3"); a.Code != CodeInvalid || !strings.Contains(a.Err, "at most 4 deep") {
		t.Errorf("a two-run tree below the third: %+v", a)
	}
	if o.meta.RunSeq != seq {
		t.Errorf("a refused run was created")
	}
	for range MaxChildRuns - 1 {
		if a := submit(leafSpec(), "run-1"); a.Err != "" {
			t.Fatal(a.Err)
		}
	}
	seq = o.meta.RunSeq
	if a := submit(leafSpec(), "run-1"); a.Code != CodeConflict || !strings.Contains(a.Err, "has 64 child runs") {
		t.Errorf("a 65th child: %+v", a)
	}
	if o.meta.RunSeq != seq {
		t.Errorf("a refused child created a run")
	}
}

// TestChildTreeSizes: a tree's runs count together against one run's
// expanded steps (SPEC §12): all of them may be created in one batch.
func TestChildTreeSizes(t *testing.T) {
	items := make([]string, 600)
	for i := range items {
		items[i] = fmt.Sprint(i)
	}
	fan := RunSpec{Steps: []StepSpec{{Name: "f", Command: "x", ForEach: items}}}
	two := RunSpec{Steps: []StepSpec{{Name: "a", Workflow: &fan}, {Name: "b", Workflow: &fan}}}
	if err := two.Validate(); err == nil || !strings.Contains(err.Error(), "run expands to 1202 steps (its child runs' included), at most 1000") {
		t.Fatalf("two children of 600 steps: %v", err)
	}
	if err := (RunSpec{Steps: two.Steps[:1]}).Validate(); err != nil {
		t.Fatalf("one child of 600 steps: %v", err)
	}
}

// TestChildTreeDeclarationBytes: every string of a child's steps counts
// against the tree's one declaration limit (SPEC §2, §12), outputs and
// secret lists included, as the root's own steps' do.
func TestChildTreeDeclarationBytes(t *testing.T) {
	child := RunSpec{}
	for s := range 10 {
		st := StepSpec{Name: fmt.Sprintf("c%d", s), Command: "x", Writes: true}
		for k := range 64 {
			st.Outputs = append(st.Outputs, fmt.Sprintf("o%d_%s", k, strings.Repeat("x", 40)))
		}
		child.Steps = append(child.Steps, st)
	}
	if err := child.Validate(); err != nil {
		t.Fatalf("one child alone (about 29 KB): %v", err)
	}
	tree := RunSpec{}
	for i := range MaxChildRuns {
		tree.Steps = append(tree.Steps, StepSpec{Name: fmt.Sprintf("w%d", i), Workflow: &child})
	}
	if err := tree.Validate(); err == nil || !strings.Contains(err.Error(), "the run's declaration holds") {
		t.Fatalf("64 such children (about 1.8 MB of outputs): %v, want the declaration limit", err)
	}
}

// TestValidationQuotesBounded: an error quotes at most 128 bytes of any
// input and lists at most 10 items (SPEC §2), however large the input.
func TestValidationQuotesBounded(t *testing.T) {
	long := strings.Repeat("t", 5000)
	for _, s := range []StepSpec{
		{Name: "a", Command: "x", Type: long},
		{Name: "a", Command: "x", Type: "script", Runner: long},
		{Name: "a", Command: "x", Type: "docker", Runner: long},
	} {
		err := (RunSpec{Steps: []StepSpec{s}}).Validate()
		if err == nil || len(err.Error()) > 400 {
			t.Errorf("type %d bytes, runner %d bytes: %d-byte error %.200q, want a refusal of at most 400 bytes", len(s.Type), len(s.Runner), len(fmt.Sprint(err)), fmt.Sprint(err))
		}
	}
	cyc := RunSpec{}
	for i := range 50 {
		cyc.Steps = append(cyc.Steps, StepSpec{Name: fmt.Sprintf("s%d", i), Command: "x", DependsOn: []string{fmt.Sprintf("s%d", (i+1)%50)}})
	}
	err := cyc.Validate()
	if err == nil || !strings.Contains(err.Error(), "dependency cycle of 50 steps") || strings.Count(err.Error(), " -> ") > 10 {
		t.Errorf("a 50-step cycle: %v, want at most 10 of its steps listed", err)
	}
}

// TestValidationRefusesNUL: a command or a forEach item (a process's
// $TETHER_ITEM) with a NUL byte is refused, as an env value with one is
// (SPEC §12): no process can be given it.
func TestValidationRefusesNUL(t *testing.T) {
	for _, s := range []StepSpec{
		{Name: "a", Command: "echo \x00 hi"},
		{Name: "a", Command: "echo $TETHER_ITEM", ForEach: []string{"x", "y\x00z"}},
	} {
		if err := (RunSpec{Steps: []StepSpec{s}}).Validate(); err == nil || !strings.Contains(err.Error(), "NUL byte") {
			t.Errorf("command %q, forEach %q: %v, want refused", s.Command, s.ForEach, err)
		}
	}
}
