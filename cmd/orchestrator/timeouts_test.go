package main

// Real binaries against a hung worker and against step and run timeouts:
// `orchestrator serve` with a config file that shortens the heartbeat
// interval and the dispatch-ack deadline, `worker connect` processes, one of
// them stopped with SIGSTOP (its socket stays open), and the CLI.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-run/tether/adapters/orchestrator"
)

// hungRig is a serve process started with a config file, and its API.
type hungRig struct {
	t         *testing.T
	ctx       context.Context
	orchBin   string
	workerBin string
	dataDir   string
	serve     *proc
	addr      string
	api       apiClient
}

func startServeWithConfig(t *testing.T, recovery string) *hungRig {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the binaries")
	}
	ctx, cancel := context.WithTimeout(t.Context(), faultTimeout)
	t.Cleanup(cancel)
	orchBin, workerBin := buildBinaries(t, ctx)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "server-config.yaml")
	if err := os.WriteFile(cfg, []byte("recovery:\n"+recovery), 0o600); err != nil {
		t.Fatal(err)
	}
	return serveRig(t, ctx, orchBin, workerBin, filepath.Join(dir, "data"), "--config", cfg)
}

// serveRig starts `orchestrator serve` (orchBin) on dataDir with extra
// flags and returns it with an API client holding its admin token.
func serveRig(t *testing.T, ctx context.Context, orchBin, workerBin, dataDir string, extra ...string) *hungRig {
	t.Helper()
	sp := startServe(t, ctx, orchBin, "orchestrator serve", "127.0.0.1:0", dataDir, extra...)
	admin, err := os.ReadFile(filepath.Join(dataDir, adminTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	return &hungRig{t: t, ctx: ctx, orchBin: orchBin, workerBin: workerBin, dataDir: dataDir, serve: sp.proc, addr: sp.addr,
		api: apiClient{t: t, ctx: ctx, base: "http://" + sp.addr + "/api", token: strings.TrimSpace(string(admin))}}
}

// worker enrolls and starts a worker process and waits until it is connected.
func (r *hungRig) worker(name string, args ...string) *proc {
	r.t.Helper()
	w := start(r.t, r.ctx, "worker "+name, r.workerBin, append([]string{"connect", "--url", "ws://" + r.addr + "/control",
		"--token", r.api.enroll(name)}, args...)...)
	poll(r.t, r.ctx, "worker "+name+" to connect", func() bool {
		for _, wv := range r.api.workers() {
			if wv.Name == name && wv.Connected {
				return true
			}
		}
		return false
	})
	return w
}

func (r *hungRig) submit(src string) string {
	r.t.Helper()
	return r.api.submit("workflow.yaml", src)
}

func (r *hungRig) waitFinished(run string) orchestrator.APIRunDetail {
	r.t.Helper()
	var det orchestrator.APIRunDetail
	poll(r.t, r.ctx, run+" to finish", func() bool {
		det = r.api.run(run)
		return !det.Run.FinishedAt.IsZero()
	})
	return det
}

// cli runs a client command of the orchestrator binary against the rig.
func (r *hungRig) cli(args ...string) string {
	r.t.Helper()
	cmd := exec.CommandContext(r.ctx, r.orchBin, append(args, "--url", "http://"+r.addr, "--data-dir", r.dataDir)...)
	cmd.Env = append(os.Environ(), "TETHER_ADMIN_TOKEN=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		r.t.Fatalf("orchestrator %q: %v\n%s", args, err, out)
	}
	return string(out)
}

// TestFaultStoppedWorkerBurnsNoAttempts: a worker process stopped with
// SIGSTOP keeps its connection open but answers nothing. With a 1 s
// dispatch-ack deadline and a 3 s heartbeat interval, the steps dispatched
// to it in the seconds before it counts as silent each miss the deadline
// once: a step that missed is not sent to it again (SPEC §3, §8), and once
// it has been silent for 2 heartbeat intervals it gets no new work. All 20
// steps succeed on the other worker, none after more than 2 attempts. At the
// end the stopped worker is continued (it is heard from again and changes
// no result) and killed.
func TestFaultStoppedWorkerBurnsNoAttempts(t *testing.T) {
	r := startServeWithConfig(t, "  heartbeat_interval_secs: 3\n  dispatch_ack_secs: 1\n")
	r.worker("w1")
	hung := r.worker("w2", "--slots", "4")
	hung.signal(t, syscall.SIGSTOP)
	t.Cleanup(func() { hung.cmd.Process.Signal(syscall.SIGCONT) }) // before its own cleanup kills it

	var src strings.Builder
	src.WriteString("name: hung\nsteps:\n")
	for i := range 20 {
		fmt.Fprintf(&src, "  - name: s%02d\n    run: sleep 0.2; echo s%02d\n", i, i)
	}
	run := r.submit(src.String())
	det := r.waitFinished(run)
	missed := 0
	for _, s := range det.Steps {
		if s.State != "success" || s.Worker != "w1" || s.Attempts > 2 {
			t.Errorf("step %s: %s on %q after %d attempts (%s %s); want success on w1 within 2 attempts",
				s.ID, s.State, s.Worker, s.Attempts, s.Class, s.Message)
		}
		if s.Attempts == 2 {
			missed++
		}
	}
	if det.Status != "success" || len(det.Steps) != 20 {
		t.Fatalf("run %s: %s with %d steps, want success with 20:\n%s", run, det.Status, len(det.Steps), r.cli("run", "show", run))
	}
	if missed == 0 {
		t.Errorf("no step was ever dispatched to the stopped worker: the test did not exercise the rule\n%s", r.cli("run", "show", run))
	}
	t.Logf("%d of 20 steps missed a dispatch ack on the stopped worker once", missed)

	// Continued, the worker finds its stale dispatches: each Start is refused
	// (the lease is no longer current) and nothing it says changes a result.
	continued := time.Now()
	hung.signal(t, syscall.SIGCONT)
	poll(t, r.ctx, "the continued worker to be heard from", func() bool {
		for _, w := range r.api.workers() {
			if w.Name == "w2" && w.Connected && w.LastHeartbeat.After(continued) {
				return true
			}
		}
		return false
	})
	again := r.api.run(run)
	for i, s := range again.Steps {
		if s.State != det.Steps[i].State || s.Attempts != det.Steps[i].Attempts || s.Worker != det.Steps[i].Worker {
			t.Errorf("after SIGCONT step %s is %s after %d attempts on %s, was %s after %d on %s",
				s.ID, s.State, s.Attempts, s.Worker, det.Steps[i].State, det.Steps[i].Attempts, det.Steps[i].Worker)
		}
	}
	hung.signal(t, syscall.SIGKILL)
	hung.wait(t, r.ctx)
}

// TestStepAndRunTimeoutsBinaries: a step with `timeout: 2s` running `sleep
// 10` fails with class step-timeout within a few seconds (the worker stops it
// at its own deadline and reports timed-out, or the orchestrator's timer at
// START + 2 s fires first and cancels it; either way not at the next 60 s
// sweep), its process is gone, and `run show` says so; a run with `timeout:
// 2s` is cancelled with class run-timeout as promptly.
func TestStepAndRunTimeoutsBinaries(t *testing.T) {
	r := startServeWithConfig(t, "  sweep_interval_secs: 60\n")
	r.worker("w1", "--slots", "2")

	dir := t.TempDir()
	pidFile := filepath.Join(dir, "slow.pid")
	submitted := time.Now()
	stepRun := r.submit(fmt.Sprintf("name: step-timeout\nsteps:\n  - name: slow\n    timeout: 2s\n    run: echo $$ > %s; exec sleep 10\n", pidFile))
	runRun := r.submit("name: run-timeout\ntimeout: 2s\nsteps:\n  - name: slow\n    run: sleep 10\n")

	det := r.waitFinished(stepRun)
	if d := time.Since(submitted); d > 6*time.Second {
		t.Errorf("the step-timeout run took %s to finish; want about 2 s", d)
	}
	s := apiStep(det, "slow")
	// Measured from the submit: the worker's own deadline runs from its
	// process start, which comes before the orchestrator records START, so
	// whichever deadline fires first, the step ends at least 2 s after the
	// submit, but may end just under 2 s after START.
	took := s.FinishedAt.Sub(det.Run.SubmittedAt)
	if det.Status != "failed" || s.State != "failed" || s.Class != "step-timeout" || took < 2*time.Second || took > 5*time.Second {
		t.Errorf("step with timeout 2s: run %s, step %s class %q %q %s after the submit; want failed, step-timeout, within 2-5 s",
			det.Status, s.State, s.Class, s.Message, took)
	}
	t.Logf("the step with timeout 2s ended %s after the submit, %s after its START: %s, %s", took, s.FinishedAt.Sub(s.StartedAt), s.Class, s.Message)
	// Its process is stopped too, not left to sleep out its 10 s.
	pid := readPID(t, pidFile)
	t.Cleanup(func() { syscall.Kill(-pid, syscall.SIGKILL) })
	poll(t, r.ctx, "the timed-out step's process to be gone", func() bool {
		st, err := readProc(pid)
		return err != nil || st.state == 'Z' || st.state == 'X'
	})
	if d := time.Since(submitted); d > 6*time.Second {
		t.Errorf("the timed-out step's process lived %s after the submit; want it stopped at about 2 s", d)
	} else {
		t.Logf("the timed-out step's process was gone %s after the submit", d)
	}
	show := r.cli("run", "show", stepRun)
	if !strings.Contains(show, "step-timeout") || !strings.Contains(show, "exceeded its timeout of 2s") {
		t.Errorf("run show does not say the step timed out:\n%s", show)
	}

	det = r.waitFinished(runRun)
	took = det.Run.FinishedAt.Sub(det.Run.SubmittedAt)
	s = apiStep(det, "slow")
	if det.Status != "cancelled" || s.State != "cancelled" || s.Class != "run-timeout" || took < 2*time.Second || took > 5*time.Second {
		t.Errorf("run with timeout 2s: %s, step %s class %q %q, finished %s after submit; want cancelled, run-timeout, within 2-5 s",
			det.Status, s.State, s.Class, s.Message, took)
	}
	t.Logf("the run with timeout 2s finished %s after its submit: %s", took, det.Status)
	if show := r.cli("run", "show", runRun); !strings.Contains(show, "run-timeout") {
		t.Errorf("run show does not say the run timed out:\n%s", show)
	}
}
