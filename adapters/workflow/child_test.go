package workflow

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// writeFiles writes name → content under a fresh directory.
func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, src := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestChildFiles: `workflow: FILE` is read relative to the file naming it,
// embedded with its own children, `with:` kept on the step; the inlined
// definition parses, through the API's Parse, to the very same run (SPEC §2).
func TestChildFiles(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"top.yaml":          "name: top\nsteps:\n  - name: build\n    run: make\n  - name: deploy\n    depends_on: build\n    workflow: sub/deploy.yaml\n    with:\n      TARGET: prod\n",
		"sub/deploy.yaml":   "name: deploy\nenv:\n  TARGET: staging\nsteps:\n  - name: push\n    run: push $TARGET\n  - name: verify\n    depends_on: push\n    workflow: ../checks/verify.yml\n",
		"checks/verify.yml": "steps:\n  - name: probe\n    run: curl -f $URL\n",
	})
	spec, inlined, err := ParseFile(filepath.Join(dir, "top.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	d := spec.Steps[1]
	if d.Workflow == nil || d.Workflow.Name != "deploy" || d.With["TARGET"] != "prod" || d.Workflow.Env["TARGET"] != "staging" {
		t.Fatalf("deploy step: %+v", d)
	}
	v := d.Workflow.Steps[1]
	if v.Workflow == nil || len(v.Workflow.Steps) != 1 || v.Workflow.Steps[0].Command != "curl -f $URL" {
		t.Fatalf("verify step (../checks/verify.yml, relative to sub/): %+v", v)
	}
	if strings.Contains(string(inlined), ".yaml") || strings.Contains(string(inlined), ".yml") {
		t.Fatalf("inlined definition still names a file:\n%s", inlined)
	}
	again, err := Parse("top.yaml", inlined)
	if err != nil {
		t.Fatalf("the inlined definition does not parse: %v\n%s", err, inlined)
	}
	if !reflect.DeepEqual(again, spec) {
		t.Fatalf("inlined definition parses to another run:\n got %+v\nwant %+v", again, spec)
	}
}

// TestChildErrors: a cycle of files is refused naming the chain; a tree
// deeper than core.MaxRunDepth, a name (no registry), a path through the
// API, a workflow step with a command, and with: without workflow are refused
// with file:line; a child file's own error names the child file.
func TestChildErrors(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"a.yaml":      "steps:\n  - name: x\n    workflow: b.yaml\n",
		"b.yaml":      "steps:\n  - name: y\n    workflow: a.yaml\n",
		"d1.yaml":     "steps:\n  - name: x\n    workflow: d2.yaml\n",
		"d2.yaml":     "steps:\n  - name: x\n    workflow: d3.yaml\n",
		"d3.yaml":     "steps:\n  - name: x\n    workflow: d4.yaml\n",
		"d4.yaml":     "steps:\n  - name: x\n    workflow: d5.yaml\n",
		"d5.yaml":     "steps:\n  - name: x\n    run: deep\n",
		"name.yaml":   "steps:\n  - name: x\n    workflow: deploy-prod\n",
		"cmd.yaml":    "steps:\n  - name: x\n    run: make\n    workflow: d5.yaml\n",
		"with.yaml":   "steps:\n  - name: x\n    run: make\n    with:\n      A: b\n",
		"bad.yaml":    "steps:\n  - name: x\n    workflow: broken.yaml\n",
		"broken.yaml": "steps:\n  - name: y\n    run: z\n    retries: 3\n",
		"gone.yaml":   "steps:\n  - name: x\n    workflow: missing.yaml\n",
	})
	at := func(f string) string { return filepath.Join(dir, f) }
	cases := []struct{ file, want string }{
		{"a.yaml", at("b.yaml") + `:3:15: step "y": workflow "a.yaml" starts a cycle of files: ` + at("a.yaml") + " -> " + at("b.yaml") + " -> " + at("a.yaml")},
		{"d1.yaml", at("d4.yaml") + `:3:15: step "x": workflow: child workflows nest more than 4 runs deep`},
		{"name.yaml", `:3:15: step "x": workflow "deploy-prod" is not a file path (ending .yaml or .yml): running a stored workflow by name is not supported`},
		{"cmd.yaml", `step "x": a workflow step runs no process of its own: command is not allowed`},
		{"with.yaml", `step "x": with without workflow`},
		{"bad.yaml", at("broken.yaml") + `:4:5: step "y": unknown field "retries"`},
		{"gone.yaml", `:3:15: step "x": workflow "missing.yaml": open ` + at("missing.yaml")},
	}
	for _, c := range cases {
		_, _, err := ParseFile(at(c.file))
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v\nwant an error containing %q", c.file, err, c.want)
		}
	}
	// The API has no files: a path is refused, an inline mapping parsed.
	if _, err := Parse("x.yaml", []byte("steps:\n  - name: x\n    workflow: d5.yaml\n")); err == nil || !strings.Contains(err.Error(), "which only the client can read") {
		t.Errorf("Parse with a file path: %v", err)
	}
	spec, err := Parse("x.yaml", []byte("steps:\n  - name: x\n    workflow:\n      steps:\n        - name: y\n          run: z\n    with: {K: v}\n"))
	if err != nil || spec.Steps[0].Workflow == nil || spec.Steps[0].Workflow.Steps[0].Command != "z" || spec.Steps[0].With["K"] != "v" {
		t.Errorf("Parse with an inline child: %+v, %v", spec, err)
	}
}
