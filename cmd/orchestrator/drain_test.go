package main

// Drain and stop with the real worker binary (§4, §10): SIGTERM drains,
// a second SIGTERM stops the steps, SIGHUP is ignored, and a worker killed
// with SIGKILL takes its steps' process trees with it.

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/tether-run/tether/core"
)

// draining says whether the named worker is draining.
func draining(name string) func(o coreView) bool {
	return func(o coreView) bool {
		for _, wv := range o.Workers() {
			if wv.Name == name && wv.Draining {
				return true
			}
		}
		return false
	}
}

// TestWorkerDrainsOnSIGTERM: a worker that gets SIGTERM while it runs a
// write-bearing step lets the step finish (success), takes no new step
// though it has a free slot (a step submitted meanwhile waits for, and runs
// on, a second worker), and exits 0 once its step is reported.
func TestWorkerDrainsOnSIGTERM(t *testing.T) {
	r := startBinRig(t)
	dir := t.TempDir()
	w1 := r.startWorker("w1", "--slots", "2")
	run := r.submit(core.RunSpec{Name: "drain", Steps: []core.StepSpec{
		{Name: "slow", Writes: true, Command: fmt.Sprintf("touch %s/started; sleep 3; echo done", dir)},
	}})
	slow := stepID(run, "slow")
	r.waitFor("the write-bearing step to run", func(o coreView) bool {
		return stepIs(slow, core.StateRunning)(o) && exists(filepath.Join(dir, "started"))
	})
	w1.signal(t, syscall.SIGTERM)
	r.waitFor("w1 to say it drains", draining("w1"))

	// Dispatch happens in the batch of the submit, before its answer: a step
	// still unleased now was not given to w1's free slot.
	later := r.submit(core.RunSpec{Name: "later", Steps: []core.StepSpec{{Name: "later", Command: "echo later"}}})
	if v := r.view(later); v.steps[stepID(later, "later")].Lease != 0 {
		t.Fatalf("a step submitted while w1 drains was dispatched:\n%s", v)
	}
	r.startWorker("w2")
	r.waitFor("the later run to finish", runFinished(later))
	if code := w1.wait(t, r.ctx); code != 0 {
		t.Fatalf("the drained worker exited %d, want 0", code)
	}
	r.waitFor("the run to finish", runFinished(run))
	v := r.view(run)
	if s := v.steps[slow]; s.State != core.StateSuccess || s.Attempts != 1 {
		t.Fatalf("the write-bearing step: %s after %d attempts; want success on the first:\n%s", s.State, s.Attempts, v)
	}
	lv := r.view(later)
	if ls := lv.leasesOf(stepID(later, "later")); len(ls) != 1 || lv.names[ls[0].Worker] != "w2" || lv.status != "success" {
		t.Fatalf("the later step: want one lease, on w2, success:\n%s", lv)
	}
	if !strings.Contains(w1.stderr.String(), "worker drained") {
		t.Errorf("w1 does not log that it drained:\n%s", w1.stderr)
	}
	poll(t, r.ctx, "every report's answer to pass the proxy", func() bool { return r.rec.Pending() == 0 })
	checkHistory(t, r.rec)
}

// TestWorkerStoppedBySecondSIGTERM: a second SIGTERM stops the running
// steps; the worker reports them with the worker-stopped outcome and exits
// 0. A stopped write-bearing step fails, class worker-stopped, and is never
// re-dispatched.
func TestWorkerStoppedBySecondSIGTERM(t *testing.T) {
	r := startBinRig(t)
	dir := t.TempDir()
	r.startWorker("w1")
	r.startWorker("w2")
	run := r.submit(core.RunSpec{Name: "stop", Steps: []core.StepSpec{
		{Name: "long", Writes: true, Command: fmt.Sprintf("touch %s/started; sleep 30", dir)},
	}})
	long := stepID(run, "long")
	var name string
	r.waitFor("the write-bearing step to run", func(o coreView) bool {
		name = holder(o, long)
		return stepIs(long, core.StateRunning)(o) && exists(filepath.Join(dir, "started"))
	})
	victim := r.workers[name]
	victim.signal(t, syscall.SIGTERM)
	r.waitFor(name+" to say it drains", draining(name))
	victim.signal(t, syscall.SIGTERM)
	if code := victim.wait(t, r.ctx); code != 0 {
		t.Fatalf("the stopped worker exited %d, want 0", code)
	}
	r.waitFor("the run to finish", runFinished(run))
	v := r.view(run)
	s := v.steps[long]
	if s.State != core.StateFailed || s.Class != core.ClassWorkerStopped || s.Attempts != 1 ||
		s.Outcome == nil || s.Outcome.Status != core.OutcomeWorkerStopped {
		t.Fatalf("the stopped write-bearing step: %s class %q after %d attempts; want failed, class worker-stopped, once:\n%s", s.State, s.Class, s.Attempts, v)
	}
	poll(t, r.ctx, "every report's answer to pass the proxy", func() bool { return r.rec.Pending() == 0 })
	checkHistory(t, r.rec)
}

// TestWorkerIgnoresSIGHUP: SIGHUP neither stops nor drains a worker.
func TestWorkerIgnoresSIGHUP(t *testing.T) {
	r := startBinRig(t)
	dir := t.TempDir()
	w1 := r.startWorker("w1")
	run := r.submit(core.RunSpec{Name: "hup", Steps: []core.StepSpec{
		{Name: "a", Writes: true, Command: fmt.Sprintf("touch %s/started; sleep 1", dir)},
		{Name: "b", DependsOn: []string{"a"}, Command: "echo b"},
	}})
	r.waitFor("the first step to run", func(o coreView) bool { return exists(filepath.Join(dir, "started")) })
	w1.signal(t, syscall.SIGHUP)
	r.waitFor("the run to finish", runFinished(run))
	if v := r.view(run); v.status != "success" {
		t.Fatalf("run is %s after SIGHUP, want success:\n%s", v.status, v)
	}
	select {
	case <-w1.done:
		t.Fatalf("the worker exited %d on SIGHUP", w1.code)
	default:
	}
	r.waitFor("w1 still connected and not draining", func(o coreView) bool {
		for _, wv := range o.Workers() {
			if wv.Name == "w1" {
				return wv.Connected && !wv.Draining
			}
		}
		return false
	})
}

// TestWorkerKilledTakesItsStepTreeDown: kill -9 a worker mid
// `sleep 60 & sleep 60; wait`: every process of that step is gone within
// seconds (its shim leads the step's group and kills it when the worker
// goes, §10).
func TestWorkerKilledTakesItsStepTreeDown(t *testing.T) {
	r := startBinRig(t)
	dir := t.TempDir()
	w1 := r.startWorker("w1")
	run := r.submit(core.RunSpec{Name: "tree", Steps: []core.StepSpec{
		{Name: "tree", Command: fmt.Sprintf("echo $$ > %s/sh.pid; sleep 60 & sleep 60; wait", dir)},
	}})
	r.waitFor("the step to run", func(o coreView) bool {
		return stepIs(stepID(run, "tree"), core.StateRunning)(o) && exists(filepath.Join(dir, "sh.pid"))
	})
	pid := readPID(t, filepath.Join(dir, "sh.pid"))
	pg := stepGroup(t, pid)
	var tree []int
	poll(t, r.ctx, "the step's shell and both sleeps", func() bool {
		tree = groupMembers(pg)
		return len(tree) >= 3 // and the shim, which leads the group
	})
	w1.signal(t, syscall.SIGKILL)
	w1.wait(t, r.ctx)
	checkTreeGone(t, r.ctx, pg, tree)
}
