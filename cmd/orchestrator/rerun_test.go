package main

// Retries and reruns with the real binaries (SPEC §1 RETRY and REUSE, §2):
// `orchestrator serve`, a `worker connect` process, shell steps that count
// their own runs in files, and the CLI's `run rerun` and `run show`.

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runs reads how many times a step appended to its counter file.
func runs(t *testing.T, file string) int {
	t.Helper()
	b, err := os.ReadFile(file)
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "x")
}

func TestRetryAndRerunBinaries(t *testing.T) {
	r := startServeWithConfig(t, "  sweep_interval_secs: 60\n")
	r.worker("w1", "--slots", "2")
	dir := t.TempDir()
	flaky, once, gate, marker := filepath.Join(dir, "flaky"), filepath.Join(dir, "once"), filepath.Join(dir, "gate"), filepath.Join(dir, "marker")

	// A retry policy on a write-bearing step without idempotent: refused at
	// its line.
	_, err := r.api.client().Submit(r.ctx, "bad.yaml", []byte("steps:\n  - name: w\n    run: true\n    writes: true\n    retry: {attempts: 2}\n"))
	if err == nil || !strings.Contains(err.Error(), "bad.yaml:5:5:") || !strings.Contains(err.Error(), "idempotent: true") {
		t.Fatalf("retry on a write-bearing step: %v; want refused at bad.yaml:5:5 naming idempotent: true", err)
	}

	// flaky (write-bearing, idempotent: each try goes through the start
	// handshake) exits 3 on its first two tries and succeeds on its third
	// (the last its policy allows); gate fails until the marker exists.
	src := fmt.Sprintf(`name: retries
steps:
  - name: flaky
    writes: true
    idempotent: true
    retry: {attempts: 2, backoff: 100ms, on: [3]}
    run: echo -n x >> %[1]s; test $(wc -c < %[1]s) -ge 3 || exit 3
  - name: once
    run: echo -n x >> %[2]s
  - name: gate
    run: echo -n x >> %[3]s; test -f %[4]s
  - name: after
    depends_on: [once, gate, flaky]
    run: "true"
`, flaky, once, gate, marker)
	run := r.submit(src)
	det := r.waitFinished(run)
	steps := map[string]string{}
	for _, s := range det.Steps {
		steps[s.Name] = s.State
		if s.Name == "flaky" && (s.Try != 3 || s.TryLimit != 3) {
			t.Errorf("flaky shows try %d of %d, want 3 of 3", s.Try, s.TryLimit)
		}
	}
	if det.Status != "failed" || steps["flaky"] != "success" || steps["once"] != "success" || steps["gate"] != "failed" || steps["after"] != "skipped" {
		t.Fatalf("run %s: %s %v; want failed with flaky and once succeeded, gate failed, after skipped\n%s", run, det.Status, steps, r.cli("run", "show", run))
	}
	if n := runs(t, flaky); n != 3 {
		t.Fatalf("flaky ran %d times, want 3 (two retries)", n)
	}
	show := r.cli("run", "show", run)
	if !strings.Contains(show, "(try 3/3)") {
		t.Errorf("run show does not show flaky's tries:\n%s", show)
	}
	retrying := 0
	for _, ev := range det.Events {
		if ev.Kind == "step-retrying" {
			retrying++
		}
	}
	if retrying != 2 {
		t.Errorf("%d step-retrying events, want 2", retrying)
	}

	// The run is finished, so archived: rerun --failed-only reads it from
	// its history, reuses flaky and once, runs gate and after.
	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	rerun := strings.TrimSpace(r.cli("run", "rerun", run, "--failed-only"))
	det = r.waitFinished(rerun)
	if det.Status != "success" || det.Run.RerunOf != run {
		t.Fatalf("rerun %s: %s, rerun of %q; want success, rerun of %s\n%s", rerun, det.Status, det.Run.RerunOf, run, r.cli("run", "show", rerun))
	}
	if a, b, c := runs(t, flaky), runs(t, once), runs(t, gate); a != 3 || b != 1 || c != 2 {
		t.Fatalf("after the failed-only rerun flaky ran %d times, once %d, gate %d; want 3, 1, 2 (the successes reused)", a, b, c)
	}
	for _, s := range det.Steps {
		if (s.Name == "flaky" || s.Name == "once") && s.Attempts != 0 {
			t.Errorf("reused step %s shows %d attempts, want 0", s.Name, s.Attempts)
		}
	}
	if show := r.cli("run", "show", rerun); !strings.Contains(show, "Rerun of "+run) || !strings.Contains(show, "reused the success of "+run+"/once") {
		t.Errorf("run show of the rerun:\n%s", show)
	}

	// A plain rerun runs every step again (flaky's counter is past 3: it
	// succeeds at once).
	again := strings.TrimSpace(r.cli("run", "rerun", run))
	if det = r.waitFinished(again); det.Status != "success" {
		t.Fatalf("plain rerun %s: %s", again, det.Status)
	}
	if a, b := runs(t, flaky), runs(t, once); a != 4 || b != 2 {
		t.Fatalf("after the plain rerun flaky ran %d times, once %d; want 4, 2", a, b)
	}
	if _, err := r.api.client().Rerun(r.ctx, "run-999", false); err == nil || !strings.Contains(err.Error(), "unknown run") {
		t.Errorf("rerun of an unknown run: %v", err)
	}
}
