package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tether-run/tether/client"
)

// writeTree writes name → content under the world's directory.
func (w *cliWorld) writeTree(files map[string]string) {
	w.t.Helper()
	for name, src := range files {
		p := filepath.Join(w.dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			w.t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(src), 0o600); err != nil {
			w.t.Fatal(err)
		}
	}
}

func (w *cliWorld) detail(run string) client.RunDetail {
	w.t.Helper()
	var d client.RunDetail
	if err := json.Unmarshal([]byte(w.must(exitOK, "run", "show", run, "-o", "json")), &d); err != nil {
		w.t.Fatal(err)
	}
	return d
}

// TestChildRunsCLI: a step's `workflow: FILE` (relative to the file naming
// it) starts a child run through a real worker; `with:` overrides the
// child's own env; the parent step takes the child's outcome (SPEC §2); run
// show shows the tree in JSON and as a table; --parent makes an API child
// that cancelling its parent cancels; a cycle of files is refused.
func TestChildRunsCLI(t *testing.T) {
	w := newCLIWorld(t, true)
	w.writeTree(map[string]string{
		"top.yaml": "name: top\nsteps:\n  - name: build\n    run: echo built\n  - name: deploy\n    depends_on: build\n    workflow: sub/deploy.yaml\n    with:\n      TARGET: prod\n",
		// The child fails unless with: won over its own env.
		"sub/deploy.yaml": "name: deploy\nenv:\n  TARGET: staging\nsteps:\n  - name: push\n    run: test \"$TARGET\" = prod\n",
		"bad.yaml":        "name: bad\nsteps:\n  - name: deploy\n    workflow: sub/fails.yaml\n",
		"sub/fails.yaml":  "name: fails\nsteps:\n  - name: push\n    run: exit 3\n",
		"a.yaml":          "steps:\n  - name: x\n    workflow: b.yaml\n",
		"b.yaml":          "steps:\n  - name: y\n    workflow: a.yaml\n",
	})
	at := func(f string) string { return filepath.Join(w.dir, f) }

	if out := w.must(exitOK, "run", "submit", at("top.yaml"), "--wait"); strings.TrimSpace(out) != "run-1" {
		t.Fatalf("submit printed %q", out)
	}
	top, child := w.detail("run-1"), w.detail("run-2")
	if !slices.Equal(top.Children, []string{"run-2"}) || top.Steps[1].Child != "run-2" || top.Steps[1].State != "success" {
		t.Errorf("run-1's tree: children %v, deploy step %+v", top.Children, top.Steps[1])
	}
	if child.Run.Parent != "run-1" || child.ParentStep != "run-1/deploy" || child.Status != "success" {
		t.Errorf("run-2: parent %q step %q status %s", child.Run.Parent, child.ParentStep, child.Status)
	}
	table := w.must(exitOK, "run", "show", "run-1")
	if !strings.Contains(table, "Child runs:") || !strings.Contains(table, "run-2  success  step run-1/deploy") {
		t.Errorf("run show's table has no tree:\n%s", table)
	}
	if !strings.Contains(w.must(exitOK, "run", "show", "run-2"), "Parent run run-1 (started by step run-1/deploy)") {
		t.Errorf("run show of the child does not name its parent")
	}

	// A failing child fails the step that started it, class child-run.
	w.must(exitRunFailed, "run", "submit", at("bad.yaml"), "--wait")
	if d := w.detail("run-3"); d.Steps[0].State != "failed" || d.Steps[0].Class != "child-run" || d.Steps[0].Child != "run-4" {
		t.Errorf("the failed child's parent step: %+v", d.Steps[0])
	}

	// --parent: cancelling the parent cancels the child.
	held := w.workflow("held", "  - name: a\n    run: echo never\n    hold: true\n")
	w.must(exitOK, "run", "submit", held)
	w.must(exitOK, "run", "submit", held, "--parent", "run-5")
	if d := w.detail("run-6"); d.Run.Parent != "run-5" || d.ParentStep != "" {
		t.Errorf("run-6 submitted with --parent: %+v", d.Run)
	}
	w.must(exitOK, "run", "cancel", "run-5")
	w.waitStatus("run-6", "cancelled")
	if _, errOut, code := w.cli("run", "submit", held, "--parent", "run-5"); code != exitRefused || !strings.Contains(errOut, "already finished") {
		t.Errorf("--parent of a finished run: exit %d, %s", code, errOut)
	}
	if _, errOut, code := w.cli("run", "submit", held, "--parent", "run-99"); code != exitRefused || !strings.Contains(errOut, "unknown parent run") {
		t.Errorf("--parent of an unknown run: exit %d, %s", code, errOut)
	}

	// A cycle of files is refused before anything is sent.
	if _, errOut, code := w.cli("run", "submit", at("a.yaml")); code != exitRefused || !strings.Contains(errOut, fmt.Sprintf("starts a cycle of files: %q -> %q -> %q", at("a.yaml"), at("b.yaml"), at("a.yaml"))) {
		t.Errorf("a cycle of files: exit %d, %s", code, errOut)
	}
}

// TestChildExample: examples/children/release.yaml starts two child runs of
// deploy.yaml, each with its own TARGET, and succeeds through a real
// worker (the child's verify step fails unless with: reached it).
func TestChildExample(t *testing.T) {
	w := newCLIWorld(t, true)
	w.must(exitOK, "run", "submit", "examples/children/release.yaml", "--wait")
	d := w.detail("run-1")
	if !slices.Equal(d.Children, []string{"run-2", "run-3"}) {
		t.Fatalf("release's children: %v", d.Children)
	}
	for _, c := range d.Children {
		if cd := w.detail(c); cd.Status != "success" || cd.Run.Name != "deploy" {
			t.Errorf("child %s: %s %s", c, cd.Run.Name, cd.Status)
		}
	}
}
