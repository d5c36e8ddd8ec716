package main

// Workers as a workflow (SPEC §14a): the provisioning example of
// examples/provision/ with the real binaries.

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tether-run/tether/client"
)

// TestProvisionExample: keep-workers.yaml, run on a static worker labelled
// role=ops, mints two enrollment tokens into secrets (never printed: the
// step's log holds no token) and hands them to launcher.sh, which starts two
// single-use workers labelled pool=local outside the step's process tree;
// use-workers.yaml then runs one step on each, and each exits after its
// step (exit 0, "single-use worker done").
func TestProvisionExample(t *testing.T) {
	r := newStepRig(t, nil, "--labels", "role=ops")
	spool := filepath.Join(t.TempDir(), "spool")
	wsURL := strings.Replace(r.httpURL, "http://", "ws://", 1) + "/control"
	launcher := start(t, r.ctx, "launcher", "sh", "examples/provision/launcher.sh", spool,
		r.workerIn, "connect", "--url", wsURL, "--labels", "pool=local", "--name", "local")
	poll(t, r.ctx, "the launcher to watch its spool", func() bool { return strings.Contains(launcher.stderr.String(), "watching") })

	// An operator mints one straight into a secret too: printed nowhere.
	out := r.mustCLI("token", "create", "spare", "--into-secret", "SPARE_TOKEN")
	if !strings.Contains(out, "stored as secret SPARE_TOKEN") || tokenShaped(out) {
		t.Fatalf("token create --into-secret printed %q", out)
	}
	if list := r.mustCLI("secret", "list"); !strings.Contains(list, "SPARE_TOKEN") {
		t.Fatalf("secret list has no SPARE_TOKEN:\n%s", list)
	}

	src, err := os.ReadFile("examples/provision/keep-workers.yaml")
	if err != nil {
		t.Fatal(err)
	}
	keep := strings.Replace(string(src), "LAUNCHER_SPOOL: /run/tether-launcher", "LAUNCHER_SPOOL: "+spool, 1)
	det, logs := r.run(keep)
	if det.Status != "success" {
		t.Fatalf("keep-workers: %s\n%s", det.Status, logs)
	}
	if !strings.Contains(logs, "pool=local: 0 connected, 2 wanted") || strings.Count(logs, "asked the launcher for a worker") != 2 {
		t.Fatalf("keep-workers did not ask for two workers:\n%s", logs)
	}
	if tokenShaped(logs) {
		t.Fatalf("a step's log holds an enrollment token:\n%s", logs)
	}
	poolWorkers := func() []client.Worker {
		var list client.WorkerList
		if err := json.Unmarshal([]byte(r.mustCLI("worker", "list", "-o", "json")), &list); err != nil {
			t.Fatal(err)
		}
		var out []client.Worker
		for _, w := range list.Workers {
			if w.Labels["pool"] == "local" {
				out = append(out, w)
			}
		}
		return out
	}
	poll(t, r.ctx, "two pool=local workers to connect", func() bool {
		n := 0
		for _, w := range poolWorkers() {
			if w.Connected && w.Scaler {
				n++
			}
		}
		return n == 2
	})

	src, err = os.ReadFile("examples/provision/use-workers.yaml")
	if err != nil {
		t.Fatal(err)
	}
	det, logs = r.run(string(src))
	if det.Status != "success" {
		t.Fatalf("use-workers: %s\n%s", det.Status, logs)
	}
	ran := map[string]bool{}
	for _, s := range det.Steps {
		ran[s.WorkerID] = true
	}
	pool := map[string]bool{}
	for _, w := range poolWorkers() {
		pool[w.ID] = true
	}
	if len(ran) != 2 {
		t.Fatalf("use-workers' two steps ran on %d workers, want 2 (one each): %v", len(ran), ran)
	}
	for id := range ran {
		if !pool[id] {
			t.Fatalf("a use-workers step ran on %s, not a pool=local worker %v", id, pool)
		}
	}
	poll(t, r.ctx, "both single-use workers to exit after their step", func() bool {
		return strings.Count(launcher.stderr.String(), "single-use worker done") == 2
	})
	for _, w := range poolWorkers() {
		if w.Connected {
			t.Fatalf("single-use worker %s still connected after its step", w.ID)
		}
	}
}

// tokenShaped says whether s holds NAME.SECRET with a 32-hex-digit secret,
// the shape of an enrollment token.
func tokenShaped(s string) bool {
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ' ' || r == '\n' || r == '"' }) {
		if _, sec, ok := strings.Cut(f, "."); ok && len(sec) == 32 && strings.Trim(sec, "0123456789abcdef") == "" {
			return true
		}
	}
	return false
}
