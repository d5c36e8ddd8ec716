package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/client"
	"github.com/tether-run/tether/core"
)

// badWorkflows are definitions with the errors of finding 12 of the
// hostile-input review, each with the message the parser must give (after
// "FILE:"): line and column, what is wrong, what to change (SPEC §2).
var badWorkflows = []struct{ name, src, want string }{
	{"cycle", "steps:\n  - name: a\n    run: x\n    depends_on: [c]\n  - name: b\n    run: y\n    depends_on: [a]\n  - name: c\n    run: z\n    depends_on: [b]\n",
		`2:5: dependency cycle: "a" (line 2) -> "c" (line 8) -> "b" (line 5) -> "a" (line 2), each depending on the next: remove one of these depends_on entries`},
	{"empty", "", "1:1: the file holds no workflow (it is empty, or only comments): write a mapping with `steps:`"},
	{"tab", "steps:\n  - name: a\n    run: x\n\tdepends_on: b\n", "4:1: YAML syntax: found a tab character that violates indentation: indent with spaces, not tabs"},
	{"colon", "steps:\n  - name: a\n    run: echo: hi\n", `3:14: YAML syntax: mapping values are not allowed in this context: a value that holds ": " must be quoted`},
}

// TestWorkflowErrorsAtTheSocket: a workflow with a cycle, an empty one and
// two YAML syntax errors, posted to the real API and submitted with the
// real CLI, are refused with file:line:column and what to change, while a
// genuine worker runs a workflow to success.
func TestWorkflowErrorsAtTheSocket(t *testing.T) {
	const admin = "workflow-errors-admin"
	r := startBinRigWith(t, faultTimeout, orchestrator.Options{AdminToken: admin})
	orchBin, _ := buildBinaries(t, r.ctx)
	r.startWorker("genuine")
	run := r.submit(core.RunSpec{Name: "genuine", Steps: []core.StepSpec{{Name: "a", Command: "echo a"}, {Name: "b", Command: "echo b", DependsOn: []string{"a"}}}})

	dir := t.TempDir()
	for _, w := range badWorkflows {
		req, err := http.NewRequestWithContext(r.ctx, http.MethodPost, r.d.APIURL()+"/runs?file=bad.yaml", bytes.NewReader([]byte(w.src)))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+admin)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", w.name, err)
		}
		var e orchestrator.APIError
		json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || e.Code != client.CodeInvalid || !strings.Contains(e.Message, "bad.yaml:"+w.want) {
			t.Errorf("%s: POST /api/runs answered %d %q (%s), want 400 invalid with %q", w.name, resp.StatusCode, e.Message, e.Code, "bad.yaml:"+w.want)
		}

		file := filepath.Join(dir, w.name+".yaml")
		if err := os.WriteFile(file, []byte(w.src), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.CommandContext(r.ctx, orchBin, "run", "submit", file, "--url", "http://"+r.d.Addr(), "--admin-token", admin)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err = cmd.Run()
		if code := cmd.ProcessState.ExitCode(); code != exitRefused || !strings.Contains(stderr.String(), w.name+".yaml:"+w.want) {
			t.Errorf("%s: run submit exited %d (%v), stderr %q; want %d with %q", w.name, code, err, stderr.String(), exitRefused, w.name+".yaml:"+w.want)
		}
	}

	r.waitFor("the genuine run to finish", runFinished(run))
	if v := r.view(run); v.status != "success" {
		t.Errorf("the genuine run ended %s:\n%s", v.status, v)
	}
	if err := (coreViewer{r.d}).Snapshot(r.ctx, func(o coreView) {
		if n := len(o.Steps()); n != 2 {
			t.Errorf("%d steps exist, want the genuine run's 2: a refused workflow created steps", n)
		}
	}); err != nil {
		t.Fatal(err)
	}
}
