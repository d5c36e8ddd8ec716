package main

// `worker connect --single-use` with the real binaries (SPEC §10): one step,
// then exit 0.

import (
	"strings"
	"testing"
	"time"

	"github.com/tether-run/tether/core"
)

// TestWorkerSingleUse: a single-use worker takes exactly one of two ready
// steps (it has one slot, and its Drain goes out before that step's
// report, so nothing more is dispatched to it), exits 0 once the step is
// reported, and the other step waits for, and runs on, a second worker.
func TestWorkerSingleUse(t *testing.T) {
	r := startBinRig(t)
	run := r.submit(core.RunSpec{Name: "single", Steps: []core.StepSpec{
		{Name: "a", Command: "echo a"},
		{Name: "b", Command: "echo b"},
	}})
	// Not startWorker: it waits to see w1 connected, and w1 may be gone by then.
	tok, err := r.d.CreateToken(r.ctx, "w1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	w1 := start(t, r.ctx, "worker w1", r.workerBin, "connect", "--url", "ws://"+r.p.Addr()+"/control", "--token", tok, "--single-use")
	if code := w1.wait(t, r.ctx); code != 0 {
		t.Fatalf("the single-use worker exited %d, want 0:\n%s", code, w1.stderr)
	}
	v := r.view(run)
	var onW1 []core.StepID
	for _, name := range []string{"a", "b"} {
		for _, l := range v.leasesOf(stepID(run, name)) {
			if v.names[l.Worker] == "w1" {
				onW1 = append(onW1, l.Step)
			}
		}
	}
	if len(onW1) != 1 {
		t.Fatalf("the single-use worker held %d leases (%v), want exactly 1:\n%s", len(onW1), onW1, v)
	}
	if s := v.steps[onW1[0]]; s.State != core.StateSuccess {
		t.Fatalf("its step %s is %s, want success:\n%s", onW1[0], s.State, v)
	}
	if !strings.Contains(w1.stderr.String(), "single use: lease") {
		t.Errorf("w1 does not log that its step was its only one:\n%s", w1.stderr)
	}
	r.startWorker("w2")
	r.waitFor("the run to finish", runFinished(run))
	if v := r.view(run); v.status != "success" {
		t.Fatalf("run %s, want success:\n%s", v.status, v)
	}
}

// TestWorkerSingleUseUsage: --single-use with more than one slot, or
// without a token, is a usage error (exit 64) that says why.
func TestWorkerSingleUseUsage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binaries")
	}
	ctx := t.Context()
	_, workerBin := buildBinaries(t, ctx)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"connect", "--single-use", "--slots", "2", "--token", "a.b"}, "--slots 2 must be 1"},
		{[]string{"connect", "--single-use"}, "needs an enrollment token"},
	} {
		p := start(t, ctx, "worker", workerBin, c.args...)
		if code := p.wait(t, ctx); code != 64 || !strings.Contains(p.stderr.String(), c.want) {
			t.Errorf("worker %s: exit %d, stderr %q; want 64 and %q", strings.Join(c.args, " "), code, p.stderr, c.want)
		}
	}
}
