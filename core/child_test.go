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
	if err := nest(leafSpec(), MaxRunDepth).Validate(); err == nil || !strings.Contains(err.Error(), "nest more than 4 runs deep") {
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
