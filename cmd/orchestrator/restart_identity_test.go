package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-run/tether/adapters/netfault"
	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/core"
)

// workerExitStateLocked is cmd/worker's exit code for a state directory
// another worker process holds.
const workerExitStateLocked = 4

// TestFaultWorkerRestartKeepsIdentity: a worker process under a supervisor
// is SIGKILLed mid-run and started again with the same --state-dir (and
// the same, already used, --token, as a unit file would hold). It is the
// same worker to the orchestrator — same id and name in `worker list`, one
// worker, not two — and the leases the dead process held are triaged as
// lost on its reconnect (SPEC §4): the started write-bearing step fails,
// class disconnect, and never runs again; the no-write step is re-dispatched
// and the run goes on to finish. A second process on the same state
// directory is refused (exit 4) while the first holds it. Finally, a
// revoked token disables the saved identity: the restarted process says so
// and exits 3, and a new token enrolls a new instance into the same
// directory. The report/answer history seen at the proxy is linearizable.
func TestFaultWorkerRestartKeepsIdentity(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binaries")
	}
	ctx, cancel := context.WithTimeout(t.Context(), faultTimeout)
	defer cancel()
	orchBin, workerBin := buildBinaries(t, ctx)
	dataDir := filepath.Join(t.TempDir(), "data")
	serve := startServe(t, ctx, orchBin, "orchestrator serve", "127.0.0.1:0", dataDir)
	admin, err := os.ReadFile(filepath.Join(dataDir, adminTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	api := apiClient{t: t, ctx: ctx, base: "http://" + serve.addr + "/api", token: strings.TrimSpace(string(admin))}
	rec := netfault.NewRecorder()
	p, err := netfault.Listen(serve.addr, rec.Tap())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	dir := t.TempDir()
	gate := filepath.Join(dir, "gate")
	stateDir := filepath.Join(t.TempDir(), "state")

	tok := api.enroll("builder")
	// Grace is 10 s: the restart (well under a second) falls inside it, so
	// the steps are triaged by the reconnect, not by the grace window.
	args := []string{"connect", "--url", "ws://" + p.Addr() + "/control", "--token", tok,
		"--state-dir", stateDir, "--max-reconnect-delay", "5s", "--slots", "2"}

	// workerList is `orchestrator worker list --json`.
	workerList := func() []orchestrator.APIWorker {
		t.Helper()
		cmd := exec.CommandContext(ctx, orchBin, "worker", "list", "--json", "--url", "http://"+serve.addr, "--data-dir", dataDir)
		cmd.Env = append(os.Environ(), "TETHER_ADMIN_TOKEN=")
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		if err := cmd.Run(); err != nil {
			t.Fatalf("worker list: %v\n%s", err, e.String())
		}
		var ws orchestrator.APIWorkerList
		if err := json.Unmarshal(o.Bytes(), &ws); err != nil {
			t.Fatalf("worker list --json: %v\n%s", err, o.String())
		}
		return ws.Workers
	}
	connectedAs := func(what string, want func(w orchestrator.APIWorker) bool) orchestrator.APIWorker {
		t.Helper()
		var got orchestrator.APIWorker
		poll(t, ctx, what, func() bool {
			for _, w := range workerList() {
				if w.Connected && want(w) {
					got = w
					return true
				}
			}
			return false
		})
		return got
	}

	w := start(t, ctx, "worker builder", workerBin, args...)
	first := connectedAs("the worker to enroll", func(w orchestrator.APIWorker) bool { return w.Name == "builder" })
	// The API shows the worker connected once its Welcome is durable and
	// sent; the worker saves its identity when the Welcome arrives, a
	// moment later.
	var fi os.FileInfo
	poll(t, ctx, "the worker to save its identity", func() bool {
		fi, err = os.Stat(filepath.Join(stateDir, "worker.json"))
		return err == nil
	})
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("state file mode %v; want 0600", fi.Mode().Perm())
	}

	// Two processes never share an identity: the second exits 4 at once.
	twin := start(t, ctx, "worker builder (twin)", workerBin, args...)
	if code := twin.wait(t, ctx); code != workerExitStateLocked {
		t.Fatalf("a second worker on the same state directory exited %d, want %d", code, workerExitStateLocked)
	}
	if !strings.Contains(twin.stderr.String(), "locked by another worker process") {
		t.Errorf("the second worker does not say why it exits:\n%s", twin.stderr)
	}

	script := func(name string) string {
		return fmt.Sprintf("echo $$ >> %[1]s/%[2]s.runs; while [ ! -e %[3]s ]; do sleep 0.02; done; echo %[2]s done", dir, name, gate)
	}
	src := fmt.Sprintf(`name: restart
steps:
  - name: write
    writes: true
    run: %s
  - name: nowrite
    run: %s
  - name: last
    depends_on: [nowrite]
    run: echo last
`, strconv.Quote(script("write")), strconv.Quote(script("nowrite")))
	call := time.Now()
	run := core.RunID(api.submit("restart.yaml", src))
	rec.Submit(call, time.Now(), []core.StepID{stepID(run, "write"), stepID(run, "nowrite"), stepID(run, "last")}, "")
	runs := func(name string) string { return filepath.Join(dir, name+".runs") }
	poll(t, ctx, "both steps to run", func() bool { return exists(runs("write")) && exists(runs("nowrite")) })
	for _, n := range []string{"write", "nowrite"} {
		pid := readPID(t, runs(n))
		t.Cleanup(func() { syscall.Kill(-pid, syscall.SIGKILL) }) // the killed worker's orphans
	}

	// kill -9, and the supervisor starts it again.
	w.signal(t, syscall.SIGKILL)
	w.wait(t, ctx)
	w = start(t, ctx, "worker builder (restarted)", workerBin, args...)
	again := connectedAs("the restarted worker to reconnect", func(w orchestrator.APIWorker) bool { return w.Name == "builder" })
	if again.ID != first.ID {
		t.Errorf("the restarted worker is %s, want the same instance %s", again.ID, first.ID)
	}
	if ws := workerList(); len(ws) != 1 {
		t.Errorf("worker list shows %d workers after the restart, want the one: %+v", len(ws), ws)
	}
	poll(t, ctx, "the no-write step to be re-dispatched", func() bool { return lineCount(t, runs("nowrite")) == 2 })
	os.WriteFile(gate, nil, 0o600)
	var det orchestrator.APIRunDetail
	poll(t, ctx, "the run to finish", func() bool {
		det = api.run(string(run))
		return !det.Run.FinishedAt.IsZero()
	})
	if s := apiStep(det, "write"); s.State != "failed" || s.Class != string(core.ClassDisconnect) ||
		!strings.Contains(s.Message, "reconnected without this step") || s.Attempts != 1 {
		t.Errorf("write: %s class=%s attempts=%d %q; want failed, class disconnect, lost on the reconnect, one attempt",
			s.State, s.Class, s.Attempts, s.Message)
	}
	for _, n := range []string{"nowrite", "last"} {
		if s := apiStep(det, n); s.State != "success" || s.WorkerID != first.ID {
			t.Errorf("%s: %s on %s, want success on %s", n, s.State, s.WorkerID, first.ID)
		}
	}
	if n := lineCount(t, runs("write")); n != 1 {
		t.Errorf("the write-bearing step ran %d times, want once", n)
	}
	checkHistory(t, rec)

	// A revoked token disables the saved identity (a stolen state file is
	// revoked this way). The restarted process says so; its --token is the
	// revoked one, so it cannot enroll anew either: exit 3.
	api.check("revoke builder", api.client().RevokeToken(ctx, "builder"))
	w.wait(t, ctx) // closed by the revocation: refused on its reconnect
	w = start(t, ctx, "worker builder (revoked)", workerBin, args...)
	if code := w.wait(t, ctx); code != exitRefused {
		t.Fatalf("the worker with a revoked identity exited %d, want %d", code, exitRefused)
	}
	if e := w.stderr.String(); !strings.Contains(e, "saved identity was refused") || !strings.Contains(e, "revoked") {
		t.Errorf("the refused restart does not say that the saved identity was refused, and why:\n%s", e)
	}
	// A new token enrolls a new instance, saved in the same directory.
	args[4] = api.enroll("builder-2")
	start(t, ctx, "worker builder-2", workerBin, args...)
	second := connectedAs("the new instance to enroll", func(w orchestrator.APIWorker) bool { return w.Name == "builder-2" })
	// The worker saves its credential when the Welcome reaches it, which
	// the API may show connected a moment before.
	var b []byte
	poll(t, ctx, "the new instance's identity to be saved", func() bool {
		b, _ = os.ReadFile(filepath.Join(stateDir, "worker.json"))
		return strings.Contains(string(b), second.ID)
	})
	if second.ID == first.ID || !strings.Contains(string(b), second.ID) {
		t.Errorf("the new instance %s (old %s) is not the one saved:\n%s", second.ID, first.ID, b)
	}
}
