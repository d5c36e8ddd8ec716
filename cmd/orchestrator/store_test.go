package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/tether-run/tether/adapters/orchestrator"
)

// serveAt starts serve on a free port over dataDir and returns it with its
// HTTP and WebSocket URLs.
func serveAt(t *testing.T, ctx context.Context, name, orchBin, dataDir string) (p *proc, httpURL, wsURL string) {
	t.Helper()
	p = start(t, ctx, name, orchBin, "serve", "--addr", "127.0.0.1:0", "--data-dir", dataDir)
	re := regexp.MustCompile(`workers connect to: (ws://127\.0\.0\.1:\d+/control)`)
	poll(t, ctx, name+" to print its address", func() bool {
		select {
		case <-p.done:
			t.Fatalf("%s exited %d:\n%s", name, p.code, p.stderr)
		default:
		}
		if m := re.FindStringSubmatch(p.stdout.String()); m != nil {
			wsURL = m[1]
			return true
		}
		return false
	})
	return p, "http://" + strings.TrimSuffix(strings.TrimPrefix(wsURL, "ws://"), "/control"), wsURL
}

// orchCLI runs the orchestrator binary with args and returns its output and
// exit code.
func orchCLI(t *testing.T, ctx context.Context, orchBin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.CommandContext(ctx, orchBin, args...)
	cmd.Env = append(os.Environ(), "TETHER_ADMIN_TOKEN=")
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var xe *exec.ExitError
	if err != nil && !errors.As(err, &xe) {
		t.Fatalf("orchestrator %q: %v", args, err)
	}
	return o.String(), e.String(), cmd.ProcessState.ExitCode()
}

// A backup taken from a serving orchestrator with a finished run and a
// bundle restores to a working orchestrator: the run and the bundle are
// there, and a new run completes on a new worker. The store tools refuse a
// served store (exit 1), a backup never overwrites (exit 2), compact
// shrinks a store with free pages, and check finds a planted inconsistency
// (exit 4).
func TestStoreBackupRestoresAWorkingOrchestrator(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binaries")
	}
	ctx, cancel := context.WithTimeout(t.Context(), e2eTimeout)
	defer cancel()
	orchBin, workerBin := buildBinaries(t, ctx)
	dataDir := filepath.Join(t.TempDir(), "data")
	serve, httpURL, wsURL := serveAt(t, ctx, "orchestrator serve", orchBin, dataDir)
	client := func(url, dir string) func(args ...string) string {
		return func(args ...string) string {
			t.Helper()
			out, errOut, code := orchCLI(t, ctx, orchBin, append(args, "--url", url, "--data-dir", dir)...)
			if code != 0 {
				t.Fatalf("orchestrator %q: exit %d\n%s", args, code, errOut)
			}
			return out
		}
	}
	cli := client(httpURL, dataDir)
	runDone := func(cli func(...string) string, run string) orchestrator.APIRunDetail {
		var det orchestrator.APIRunDetail
		poll(t, ctx, run+" to finish", func() bool {
			if err := json.Unmarshal([]byte(cli("run", "show", run, "--json")), &det); err != nil {
				t.Fatal(err)
			}
			return !det.Run.FinishedAt.IsZero()
		})
		return det
	}

	tok := strings.TrimSpace(cli("token", "create", "w1"))
	start(t, ctx, "worker w1", workerBin, "connect", "--url", wsURL, "--token", tok, "--no-reconnect")
	run := strings.TrimSpace(cli("run", "submit", "examples/dag.yaml"))
	if det := runDone(cli, run); det.Status != "success" {
		t.Fatalf("%s finished %s", run, det.Status)
	}
	bundleFile := filepath.Join(t.TempDir(), "tool.sh")
	os.WriteFile(bundleFile, []byte("#!/bin/sh\necho from the bundle\n"), 0o600)
	fp := strings.TrimSpace(cli("bundle", "put", bundleFile))

	// The tools that need the store to themselves refuse a served one.
	for _, args := range [][]string{{"store", "check"}, {"store", "compact"}, {"store", "backup", filepath.Join(t.TempDir(), "x.db"), "--offline"}} {
		_, errOut, code := orchCLI(t, ctx, orchBin, append(args, "--data-dir", dataDir)...)
		if code != exitError || !strings.Contains(errOut, "locked") {
			t.Errorf("%q on a served store: exit %d, want 1 saying it is locked:\n%s", args, code, errOut)
		}
	}

	// Online backup.
	backupDir := filepath.Join(t.TempDir(), "restored")
	os.Mkdir(backupDir, 0o700)
	backup := filepath.Join(backupDir, storeFile)
	if out := cli("store", "backup", backup); !strings.Contains(out, "1 blobs") {
		t.Errorf("store backup printed %q, want it to count the bundle's blob", out)
	}
	if _, errOut, code := orchCLI(t, ctx, orchBin, "store", "backup", backup, "--url", httpURL, "--data-dir", dataDir); code != exitUsage || !strings.Contains(errOut, "never overwrites") {
		t.Errorf("a backup over an existing file: exit %d, want 2:\n%s", code, errOut)
	}
	// The backup holds its runs sealed and not the key (SPEC §14a): the
	// tools refuse it until the key file is put next to it.
	if _, errOut, code := orchCLI(t, ctx, orchBin, "store", "check", backup); code == 0 || !strings.Contains(errOut, ".secrets-key") {
		t.Errorf("store check of the backup without its key: exit %d, want a refusal naming the key file\n%s", code, errOut)
	}
	key, err := os.ReadFile(filepath.Join(dataDir, storeFile+".secrets-key"))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(backup+".secrets-key", key, 0o600)
	if out, errOut, code := orchCLI(t, ctx, orchBin, "store", "check", backup); code != 0 || !strings.Contains(out, "sound") {
		t.Errorf("store check of the backup: exit %d\n%s%s", code, out, errOut)
	}

	serve.signal(t, syscall.SIGTERM)
	if code := serve.wait(t, ctx); code != 0 {
		t.Fatalf("orchestrator exited %d on SIGTERM:\n%s", code, serve.stderr)
	}

	// The backup serves: the run and the bundle are there, and a new run
	// completes on a new worker.
	restored, httpURL2, wsURL2 := serveAt(t, ctx, "orchestrator serve (the backup)", orchBin, backupDir)
	cli2 := client(httpURL2, backupDir)
	if det := runDone(cli2, run); det.Status != "success" || len(det.Steps) != 4 {
		t.Errorf("the restored %s is %s with %d steps, want success with 4", run, det.Status, len(det.Steps))
	}
	if out := cli2("run", "logs", run); !strings.Contains(out, "packaged tether-1.4.2.tar.gz") {
		t.Errorf("the restored run's logs:\n%s", out)
	}
	tok3 := strings.TrimSpace(cli2("token", "create", "w3"))
	start(t, ctx, "worker w3", workerBin, "connect", "--url", wsURL2, "--token", tok3, "--no-reconnect")
	run2 := strings.TrimSpace(cli2("run", "submit", "examples/dag.yaml"))
	if run2 == run {
		t.Errorf("the restored orchestrator reused the run id %s", run)
	}
	det := runDone(cli2, run2)
	if det.Status != "success" {
		t.Errorf("a new run on the restored orchestrator finished %s", det.Status)
	}
	for _, s := range det.Steps {
		if s.Worker != "w3" {
			t.Errorf("step %s ran on %q, want w3", s.ID, s.Worker)
		}
	}
	var again struct {
		Fingerprint string `json:"fingerprint"`
		Existed     bool   `json:"existed"`
	}
	if err := json.Unmarshal([]byte(cli2("bundle", "put", bundleFile, "--json")), &again); err != nil || again.Fingerprint != fp || !again.Existed {
		t.Errorf("the bundle again on the backup: %+v (%v), want %s already stored", again, err, fp)
	}
	restored.signal(t, syscall.SIGTERM)
	if code := restored.wait(t, ctx); code != 0 {
		t.Fatalf("restored orchestrator exited %d on SIGTERM:\n%s", code, restored.stderr)
	}

	// Offline: compact, then check; a planted inconsistency is found.
	out, errOut, code := orchCLI(t, ctx, orchBin, "store", "compact", "--data-dir", dataDir)
	if code != 0 || !regexp.MustCompile(`compacted .*: \d+ bytes before, \d+ after`).MatchString(out) {
		t.Fatalf("store compact: exit %d\n%s%s", code, out, errOut)
	}
	if out, errOut, code := orchCLI(t, ctx, orchBin, "store", "check", "--data-dir", dataDir); code != 0 {
		t.Fatalf("store check after compact: exit %d\n%s%s", code, out, errOut)
	}
	db, err := bolt.Open(filepath.Join(dataDir, storeFile), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The run finished, so it is archived (SPEC §7a): plant its history
	// record gone while its index entries stay.
	err = db.Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte("history")).Delete([]byte(run)) })
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	out, errOut, code = orchCLI(t, ctx, orchBin, "store", "check", "--data-dir", dataDir)
	if code != exitUnsound || !strings.Contains(out, "lists a run with no history") || !strings.Contains(out, "UNSOUND") {
		t.Errorf("store check of a store whose run's history is gone: exit %d, want 4 naming the index entries without a history:\n%s%s", code, out, errOut)
	}
}
