package workflow

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
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
// with file:line; a child file's own error names the child file, at its own
// line (YAML syntax and a second document too); a path in an error is
// quoted (core.Quote).
func TestChildErrors(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"a.yaml":          "steps:\n  - name: x\n    workflow: b.yaml\n",
		"b.yaml":          "steps:\n  - name: y\n    workflow: a.yaml\n",
		"d1.yaml":         "steps:\n  - name: x\n    workflow: d2.yaml\n",
		"d2.yaml":         "steps:\n  - name: x\n    workflow: d3.yaml\n",
		"d3.yaml":         "steps:\n  - name: x\n    workflow: d4.yaml\n",
		"d4.yaml":         "steps:\n  - name: x\n    workflow: d5.yaml\n",
		"d5.yaml":         "steps:\n  - name: x\n    run: deep\n",
		"name.yaml":       "steps:\n  - name: x\n    workflow: deploy-prod\n",
		"cmd.yaml":        "steps:\n  - name: x\n    run: make\n    workflow: d5.yaml\n",
		"with.yaml":       "steps:\n  - name: x\n    run: make\n    with:\n      A: b\n",
		"bad.yaml":        "steps:\n  - name: x\n    workflow: broken.yaml\n",
		"broken.yaml":     "steps:\n  - name: y\n    run: z\n    retries: 3\n",
		"gone.yaml":       "steps:\n  - name: x\n    workflow: missing.yaml\n",
		"syn.yaml":        "steps:\n  - name: x\n    workflow: synbad.yaml\n",
		"synbad.yaml":     "steps: [\n",
		"two.yaml":        "steps:\n  - name: x\n    workflow: twodocs.yaml\n  - name: w\n    workflow: twobroken.yaml\n",
		"twodocs.yaml":    "steps:\n  - name: y\n    run: z\n---\nsteps: []\n",
		"twobroken.yaml":  "steps:\n  - name: y\n    run: z\n---\nsteps: [\n",
		"nul.yaml":        "steps:\n  - name: x\n    workflow: nulbad.yaml\n",
		"nulbad.yaml":     "steps:\n  - name: y\n    run: \"z\x00\"\n",
		"alias.yaml":      "steps:\n  - name: x\n    workflow: aliasbad.yaml\n",
		"aliasbad.yaml":   "env: &e {A: b}\nsteps:\n  - name: y\n    run: z\n    env: *e\n",
		"dir.yaml":        "steps:\n  - name: x\n    workflow: sub.yaml\n",
		"sub.yaml/f":      "",
		"esc.yaml":        "steps:\n  - name: x\n    workflow: \"\\e[2Jgone.yaml\"\n",
		"escbad.yaml":     "steps:\n  - name: x\n    workflow: \"\\e[2Jbad.yaml\"\n",
		"\x1b[2Jbad.yaml": "steps:\n  - name: y\n    run: z\n    retries: 3\n",
	})
	at := func(f string) string { return filepath.Join(dir, f) }
	q := strconv.Quote
	cases := []struct{ file, want string }{
		{"a.yaml", at("b.yaml") + `:3:15: step "y": workflow "a.yaml" starts a cycle of files: ` + q(at("a.yaml")) + " -> " + q(at("b.yaml")) + " -> " + q(at("a.yaml"))},
		{"d1.yaml", at("d4.yaml") + `:3:15: step "x": workflow: child workflows nest 5 runs deep, at most 4 (` + q(at("d1.yaml")) + " -> " + q(at("d2.yaml")) + " -> " + q(at("d3.yaml")) + " -> " + q(at("d4.yaml")) + ")"},
		{"name.yaml", `:3:15: step "x": workflow "deploy-prod" is not a file path (ending .yaml or .yml): running a stored workflow by name is not supported`},
		{"cmd.yaml", `step "x": a workflow step runs no process of its own: command is not allowed`},
		{"with.yaml", `step "x": with without workflow`},
		{"bad.yaml", at("broken.yaml") + `:4:5: step "y": unknown field "retries"`},
		{"gone.yaml", `:3:15: step "x": workflow "missing.yaml": stat ` + q(at("missing.yaml")) + ": no such file or directory"},
		{"syn.yaml", at("synbad.yaml") + ":1:8: YAML syntax: did not find expected node content: a flow list"},
		{"two.yaml", at("twodocs.yaml") + ":4:1: more than one YAML document; a file holds one workflow"},
		{"two.yaml", at("twobroken.yaml") + ":4:1: more than one YAML document; a file holds one workflow"},
		{"nul.yaml", at("nulbad.yaml") + ":3:12: YAML syntax: control characters are not allowed: U+0000 here"},
		{"alias.yaml", at("aliasbad.yaml") + `:5:10: alias "*e": YAML aliases and anchors are not supported`},
		{"dir.yaml", `:3:15: step "x": workflow "sub.yaml": ` + q(at("sub.yaml")) + " is a directory: name a workflow file"},
		{"esc.yaml", `:3:15: step "x": workflow "\x1b[2Jgone.yaml": stat ` + q(at("\x1b[2Jgone.yaml")) + ": no such file or directory"},
		{"escbad.yaml", q(at("\x1b[2Jbad.yaml")) + `:4:5: step "y": unknown field "retries"`},
	}
	for _, c := range cases {
		_, _, err := ParseFile(at(c.file))
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v\nwant an error containing %q", c.file, err, c.want)
		}
		if err != nil && strings.ContainsRune(err.Error(), 0x1b) {
			t.Errorf("%s: the error holds a raw escape: %q", c.file, err)
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

// TestChildFileOnce: each file is opened once per ParseFile, however many
// steps name it, and not again to inline it (SPEC §2); the top file too.
func TestChildFileOnce(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"top.yaml": "steps:\n  - name: a\n    workflow: c.yaml\n  - name: b\n    workflow: ./c.yaml\n  - name: c\n    workflow: sub/../c.yaml\n    with: {K: v}\n",
		"c.yaml":   "steps:\n  - name: x\n    workflow: d.yaml\n",
		"d.yaml":   "steps:\n  - name: y\n    run: echo $K\n",
	})
	opens := map[string]int{}
	spec, inlined, err := parseFiles(filepath.Join(dir, "top.yaml"), func(p string) (fs.File, error) {
		opens[p]++
		return os.Open(p)
	})
	if err != nil {
		t.Fatal(err)
	}
	for p, n := range opens {
		if n != 1 {
			t.Errorf("%s opened %d times", p, n)
		}
	}
	if len(opens) != 3 {
		t.Errorf("opened %v, want the three files", opens)
	}
	for _, s := range spec.Steps {
		if s.Workflow == nil || s.Workflow.Steps[0].Workflow == nil || s.Workflow.Steps[0].Workflow.Steps[0].Command != "echo $K" {
			t.Fatalf("step %s: %+v", s.Name, s.Workflow)
		}
	}
	again, err := Parse("top.yaml", inlined)
	if err != nil || !reflect.DeepEqual(again, spec) {
		t.Fatalf("the inlined definition parses to %+v, %v\nwant %+v\n%s", again, err, spec, inlined)
	}
}

// endless is a file that says it is small and never ends.
type endless struct {
	info fs.FileInfo
	read int
}

func (e *endless) Stat() (fs.FileInfo, error) { return e.info, nil }
func (e *endless) Close() error               { return nil }
func (e *endless) Read(b []byte) (int, error) {
	for i := range b {
		b[i] = '#'
	}
	e.read += len(b)
	return len(b), nil
}

// TestChildFileSize: the workflow's files, the top one's included, are at
// most 1 MiB in all (SPEC §2, §12); the file that passes it is named, with
// its size; no file is read past what is left of the limit and a byte.
func TestChildFileSize(t *testing.T) {
	pad := func(n int) string { // n bytes of comments
		line := "# " + strings.Repeat("x", 97) + "\n"
		return strings.Repeat(line, n/len(line)) + strings.Repeat("#", n%len(line))
	}
	top := pad(600<<10) + "\nsteps:\n  - name: a\n    workflow: big.yaml\n"
	big := pad(500<<10) + "\nsteps:\n  - name: b\n    run: x\n"
	dir := writeFiles(t, map[string]string{
		"top.yaml":   top,
		"big.yaml":   big,
		"small.yaml": "steps:\n  - name: a\n    workflow: big.yaml\n",
		"huge.yaml":  pad(MaxSize + 1),
	})
	at := func(f string) string { return filepath.Join(dir, f) }
	_, _, err := ParseFile(at("top.yaml"))
	want := fmt.Sprintf("%s:%d:15: step \"a\": workflow \"big.yaml\": %q is %d bytes, and the workflow files read before it %d: a workflow's files are at most 1048576 bytes in all", at("top.yaml"), strings.Count(top, "\n"), at("big.yaml"), len(big), len(top))
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
		t.Errorf("top and child past 1 MiB: got %v\nwant an error containing %q", err, want)
	}
	if _, _, err := ParseFile(at("small.yaml")); err != nil {
		t.Errorf("the child alone: %v", err)
	}
	_, _, err = ParseFile(at("huge.yaml"))
	if want := fmt.Sprintf("%q is %d bytes, at most %d", at("huge.yaml"), MaxSize+1, MaxSize); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
		t.Errorf("a top file past 1 MiB: got %v\nwant an error containing %q", err, want)
	}
	// A file whose size says little and that never ends.
	info, err := os.Stat(at("big.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	e := &endless{info: info}
	_, _, err = parseFiles(at("small.yaml"), func(p string) (fs.File, error) {
		if p == at("big.yaml") {
			return e, nil
		}
		return os.Open(p)
	})
	left := MaxSize - len("steps:\n  - name: a\n    workflow: big.yaml\n")
	if want := fmt.Sprintf("%q is more than %d bytes", at("big.yaml"), left); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("an endless file: got %v\nwant an error containing %q", err, want)
	}
	if e.read > left+1 {
		t.Errorf("read %d bytes of an endless file, %d left", e.read, left)
	}
}

// TestChildNotRegular: a device is refused as not a workflow file, without
// reading it (/dev/zero never ends).
func TestChildNotRegular(t *testing.T) {
	if _, err := os.Stat("/dev/zero"); err != nil {
		t.Skip("no /dev/zero")
	}
	dir := writeFiles(t, map[string]string{"top.yaml": "steps:\n  - name: a\n    workflow: zero.yaml\n"})
	if err := os.Symlink("/dev/zero", filepath.Join(dir, "zero.yaml")); err != nil {
		t.Skip(err)
	}
	want := strconv.Quote(filepath.Join(dir, "zero.yaml")) + " is a device: name a workflow file"
	if err := parseWithin(t, filepath.Join(dir, "top.yaml")); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("got %v\nwant an error containing %q", err, want)
	}
}

// parseWithin is ParseFile's error, failing the test if it takes more than
// 10 s (a FIFO it opened and waits on).
func parseWithin(t *testing.T, path string) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, _, err := ParseFile(path)
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("ParseFile(%s) did not return in 10 s", path)
		return nil
	}
}
