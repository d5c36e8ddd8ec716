package main

// Fault tests with the real binaries: workers (and, in one test, the
// orchestrator) are processes killed with SIGKILL. Every control connection
// goes through a netfault.Proxy whose recorder keeps the report/answer
// history seen at the socket; each test checks that history against the
// spec's porcupine model, and that a doctored copy of it fails the check.

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-run/tether/adapters/netfault"
	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/adapters/store"
	"github.com/tether-run/tether/client"
	"github.com/tether-run/tether/core"
)

// faultTimeout bounds each fault test; the waits inside are polls.
const faultTimeout = 60 * time.Second

// grace is the grace window of the tests' workers: twice
// --max-reconnect-delay.
const (
	maxReconnectDelay = time.Second
	grace             = 2 * maxReconnectDelay
)

// checkHistory checks a recorded history with the porcupine model, and that
// the same history with a second COMMITTED for a step fails the check.
func checkHistory(t *testing.T, rec *netfault.Recorder) {
	t.Helper()
	if err := netfault.Verify(rec); err != nil {
		t.Error(err)
	}
}

// procState is what /proc says of a process.
type procState struct {
	state      byte // R, S, Z, ...
	ppid, pgrp int
}

func readProc(pid int) (procState, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procState{}, err
	}
	// "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
	rest := string(b[bytes.LastIndexByte(b, ')')+1:])
	f := strings.Fields(rest)
	if len(f) < 3 {
		return procState{}, fmt.Errorf("/proc/%d/stat: %q", pid, b)
	}
	ppid, _ := strconv.Atoi(f[1])
	pgrp, _ := strconv.Atoi(f[2])
	return procState{state: f[0][0], ppid: ppid, pgrp: pgrp}, nil
}

func readPID(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		t.Fatalf("%s holds %q, not a pid", path, b)
	}
	return pid
}

// stepGroup returns the process group of a running step process: its
// shim's, which leads the step's group (§10).
func stepGroup(t *testing.T, pid int) int {
	t.Helper()
	st, err := readProc(pid)
	if err != nil {
		t.Fatalf("the step process %d: %v", pid, err)
	}
	t.Cleanup(func() { syscall.Kill(-st.pgrp, syscall.SIGKILL) }) // if the test fails
	return st.pgrp
}

// groupMembers lists the live (not zombie) processes of process group pg.
func groupMembers(pg int) []int {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var pids []int
	for _, f := range stats {
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(f)))
		if err != nil {
			continue
		}
		if st, err := readProc(pid); err == nil && st.pgrp == pg && st.state != 'Z' && st.state != 'X' {
			pids = append(pids, pid)
		}
	}
	return pids
}

// checkTreeGone asserts what becomes of a step's processes when their worker
// was SIGKILLed (§10): the step's shim takes its whole process group down
// with the worker, so within seconds no process of the group is left, and
// none of the pids seen in it lives on (elsewhere).
func checkTreeGone(t *testing.T, ctx context.Context, pg int, pids []int) {
	t.Helper()
	poll(t, ctx, fmt.Sprintf("every process of the dead worker's step (group %d, pids %v) to be gone", pg, pids), func() bool {
		if len(groupMembers(pg)) > 0 {
			return false
		}
		for _, pid := range pids {
			if st, err := readProc(pid); err == nil && st.state != 'Z' && st.state != 'X' {
				return false
			}
		}
		return true
	})
}

// binRig is an in-process orchestrator driver behind a recording proxy,
// with worker processes.
type binRig struct {
	t         *testing.T
	ctx       context.Context
	d         *orchestrator.Driver
	p         *netfault.Proxy
	rec       *netfault.Recorder
	workerBin string
	workers   map[string]*proc
}

func startBinRig(t *testing.T) *binRig {
	t.Helper()
	return startBinRigFor(t, faultTimeout)
}

// startBinRigFor is startBinRig for a test that needs longer than
// faultTimeout in all.
func startBinRigFor(t *testing.T, timeout time.Duration) *binRig {
	t.Helper()
	return startBinRigWith(t, timeout, orchestrator.Options{})
}

// startBinRigWith is startBinRigFor with driver options (its address, store
// and logger are the rig's).
func startBinRigWith(t *testing.T, timeout time.Duration, opts orchestrator.Options) *binRig {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the binaries")
	}
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	t.Cleanup(cancel)
	_, workerBin := buildBinaries(t, ctx)
	opts.Addr = "127.0.0.1:0"
	opts.StorePath = filepath.Join(t.TempDir(), "tether.db")
	opts.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo})).With("side", "orchestrator")
	d, err := orchestrator.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	rec := netfault.NewRecorder()
	p, err := netfault.Listen(d.Addr(), rec.Tap())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return &binRig{t: t, ctx: ctx, d: d, p: p, rec: rec, workerBin: workerBin, workers: map[string]*proc{}}
}

// startWorker starts a worker process connected through the proxy and waits
// until it is connected.
func (r *binRig) startWorker(name string, extra ...string) *proc {
	r.t.Helper()
	tok, err := r.d.CreateToken(r.ctx, name, time.Minute)
	if err != nil {
		r.t.Fatal(err)
	}
	w := start(r.t, r.ctx, "worker "+name, r.workerBin, append([]string{"connect", "--url", "ws://" + r.p.Addr() + "/control", "--token", tok,
		"--max-reconnect-delay", maxReconnectDelay.String()}, extra...)...)
	r.workers[name] = w
	r.waitFor("worker "+name+" to connect", func(o coreView) bool {
		for _, wv := range o.Workers() {
			if wv.Name == name && wv.Connected {
				return true
			}
		}
		return false
	})
	return w
}

func (r *binRig) waitFor(what string, cond func(o coreView) bool) {
	r.t.Helper()
	poll(r.t, r.ctx, what, func() bool {
		ok := false
		if err := (coreViewer{r.d}).Snapshot(r.ctx, func(o coreView) { ok = cond(o) }); err != nil {
			r.t.Fatalf("waiting for %s: %v", what, err)
		}
		return ok
	})
}

// submit submits a run and records one submit operation per step.
func (r *binRig) submit(spec core.RunSpec) core.RunID {
	r.t.Helper()
	call := time.Now()
	run, err := r.d.Submit(r.ctx, spec)
	ret := time.Now()
	if err != nil {
		r.t.Fatal(err)
	}
	var steps []core.StepID
	for _, s := range spec.Steps {
		steps = append(steps, stepID(run, s.Name))
	}
	r.rec.Submit(call, ret, steps, "")
	return run
}

func stepID(run core.RunID, name string) core.StepID { return core.StepID(string(run) + "/" + name) }

// snapshot reads the orchestrator; reads of steps are recorded as queries.
type view struct {
	steps  map[core.StepID]core.StepRecord
	leases []core.LeaseRecord
	events []core.ServerEvent
	names  map[core.WorkerID]string
	status string
}

func (r *binRig) view(run core.RunID) view {
	r.t.Helper()
	v := view{steps: map[core.StepID]core.StepRecord{}, names: map[core.WorkerID]string{}}
	call := time.Now()
	err := (coreViewer{r.d}).Snapshot(r.ctx, func(o coreView) {
		rr, st, _ := o.Run(run)
		v.status = st
		for _, id := range rr.Steps {
			v.steps[id], _ = o.StepByID(id)
		}
		for _, l := range o.Leases() {
			if v.steps[l.Step].ID != "" {
				v.leases = append(v.leases, l)
			}
		}
		v.events = o.Events(run)
		for _, w := range o.Workers() {
			v.names[w.ID] = w.Name
		}
	})
	ret := time.Now()
	if err != nil {
		r.t.Fatal(err)
	}
	for id, s := range v.steps {
		r.rec.Query(call, ret, id, s.State, s.Outcome)
	}
	return v
}

func (v view) leasesOf(step core.StepID) []core.LeaseRecord {
	var out []core.LeaseRecord
	for _, l := range v.leases {
		if l.Step == step {
			out = append(out, l)
		}
	}
	return out
}

func (v view) event(step core.StepID, kind string) (core.ServerEvent, bool) {
	for _, ev := range v.events {
		if ev.Step == step && ev.Kind == kind {
			return ev, true
		}
	}
	return core.ServerEvent{}, false
}

func (v view) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "run %s", v.status)
	for _, s := range v.steps {
		fmt.Fprintf(&b, "\n  step %s %s attempts=%d %s %s", s.ID, s.State, s.Attempts, s.Class, s.Message)
	}
	for _, l := range v.leases {
		fmt.Fprintf(&b, "\n  lease %d %s on %s current=%v started=%v committed=%v %s", l.ID, l.Step, v.names[l.Worker], l.Current, l.Started, l.Committed, l.EndReason)
	}
	for _, ev := range v.events {
		fmt.Fprintf(&b, "\n  event %s %s %s %s", ev.At.Format("15:04:05.000"), ev.Step, ev.Kind, ev.Message)
	}
	return b.String()
}

func stepIs(step core.StepID, st core.State) func(o coreView) bool {
	return func(o coreView) bool {
		s, _ := o.StepByID(step)
		return s.State == st
	}
}

func runFinished(run core.RunID) func(o coreView) bool {
	return func(o coreView) bool {
		r, _, ok := o.Run(run)
		return ok && r.Finished
	}
}

// holder returns the name of the worker holding a step's current lease.
func holder(o coreView, step core.StepID) string {
	s, _ := o.StepByID(step)
	for _, l := range o.Leases() {
		if l.ID == s.Lease {
			for _, w := range o.Workers() {
				if w.ID == l.Worker {
					return w.Name
				}
			}
		}
	}
	return ""
}

func exists(path string) bool { _, err := os.Stat(path); return err == nil }

func lineCount(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "\n")
}

// checkGraceHeld asserts that a step was held for the whole grace window:
// its recovery ended (failed or requeued) no sooner than grace after its
// worker's disconnect, by the orchestrator's own clock.
func checkGraceHeld(t *testing.T, v view, step core.StepID, endKind string) {
	t.Helper()
	rec, ok1 := v.event(step, "step-recovering")
	end, ok2 := v.event(step, endKind)
	switch {
	case !ok1 || !ok2:
		t.Errorf("events step-recovering and %s for %s missing:\n%s", endKind, step, v)
	case !strings.Contains(rec.Message, "holding the step for "+core.DescribeDuration(grace)):
		t.Errorf("step-recovering %q: want the worker's grace of %s (twice --max-reconnect-delay)", rec.Message, grace)
	case end.At.Sub(rec.At) < grace:
		t.Errorf("%s came %s after the disconnect, before the %s grace window ended", endKind, end.At.Sub(rec.At), grace)
	}
}

// TestFaultWorkerKilledMidWriteStep: a worker process is SIGKILLed while it
// runs a write-bearing step. The orchestrator holds the step for the grace
// window, then fails it (class disconnect) and never dispatches it again,
// though another worker is idle; the run fails. The step's process dies
// with its worker (its shim takes the process group down, §10).
func TestFaultWorkerKilledMidWriteStep(t *testing.T) {
	r := startBinRig(t)
	dir := t.TempDir()
	stop := filepath.Join(dir, "stop")
	t.Cleanup(func() { os.WriteFile(stop, nil, 0o600) }) // ends the step if the test stops early
	r.startWorker("w1")
	r.startWorker("w2")
	run := r.submit(core.RunSpec{Name: "kill-write", Steps: []core.StepSpec{
		{Name: "first", Command: "echo first"},
		{Name: "write", DependsOn: []string{"first"}, Writes: true,
			Command: fmt.Sprintf("echo $$ > %[1]s/write.pid; echo run >> %[1]s/write.runs; echo writing; while [ ! -e %[2]s ]; do sleep 0.05; done", dir, stop)},
	}})
	write := stepID(run, "write")
	var name string
	r.waitFor("the write-bearing step to run", func(o coreView) bool {
		name = holder(o, write)
		return stepIs(write, core.StateRunning)(o) && exists(filepath.Join(dir, "write.pid"))
	})
	pid := readPID(t, filepath.Join(dir, "write.pid"))
	pg := stepGroup(t, pid)
	victim := r.workers[name]
	victim.signal(t, syscall.SIGKILL)
	if code := victim.wait(t, r.ctx); code != -1 {
		t.Fatalf("worker %s exited %d after SIGKILL", name, code)
	}
	checkTreeGone(t, r.ctx, pg, []int{pid})

	r.waitFor("the run to finish", runFinished(run))
	v := r.view(run)
	s := v.steps[write]
	if s.State != core.StateFailed || s.Class != core.ClassDisconnect ||
		!strings.Contains(s.Message, "did not reconnect within the recovery window") || !strings.Contains(s.Message, "not re-dispatched") {
		t.Fatalf("write-bearing step: %s %s %q; want failed, class disconnect:\n%s", s.State, s.Class, s.Message, v)
	}
	if v.status != "failed" {
		t.Errorf("run is %s, want failed", v.status)
	}
	if ls := v.leasesOf(write); len(ls) != 1 || s.Attempts != 1 || ls[0].Committed || ls[0].Current {
		t.Errorf("write-bearing step: %d leases, attempts %d; want its one lease, ended uncommitted:\n%s", len(ls), s.Attempts, v)
	}
	if n := lineCount(t, filepath.Join(dir, "write.runs")); n != 1 {
		t.Errorf("the write-bearing step's process ran %d times, want once", n)
	}
	checkGraceHeld(t, v, write, "step-failed")
	if first := v.steps[stepID(run, "first")]; first.State != core.StateSuccess {
		t.Errorf("first is %s, want success", first.State)
	}
	poll(t, r.ctx, "every report's answer to pass the proxy", func() bool { return r.rec.Pending() == 0 })
	checkHistory(t, r.rec)
}

// TestFaultWorkerKilledMidNoWriteStep: a worker process is SIGKILLed while
// it runs a no-write step. After the grace window the step is re-dispatched
// from the beginning to the other worker and succeeds there; the first
// attempt's lease ended uncommitted. The first attempt's process dies with
// its worker, as above.
func TestFaultWorkerKilledMidNoWriteStep(t *testing.T) {
	r := startBinRig(t)
	dir := t.TempDir()
	stop := filepath.Join(dir, "stop")
	t.Cleanup(func() { os.WriteFile(stop, nil, 0o600) })
	r.startWorker("w1")
	r.startWorker("w2")
	// The first attempt claims a directory and waits; any later one succeeds.
	script := fmt.Sprintf(`if mkdir %[1]s/claimed 2>/dev/null; then
  echo $$ > %[1]s/first.pid; echo "first attempt"; while [ ! -e %[2]s ]; do sleep 0.05; done
else
  echo "second attempt"
fi`, dir, stop)
	run := r.submit(core.RunSpec{Name: "kill-nowrite", Steps: []core.StepSpec{
		{Name: "first", Command: "echo first"},
		{Name: "nowrite", DependsOn: []string{"first"}, Command: script},
	}})
	step := stepID(run, "nowrite")
	var name string
	r.waitFor("the no-write step to run", func(o coreView) bool {
		name = holder(o, step)
		return stepIs(step, core.StateRunning)(o) && exists(filepath.Join(dir, "first.pid"))
	})
	pid := readPID(t, filepath.Join(dir, "first.pid"))
	pg := stepGroup(t, pid)
	victim := r.workers[name]
	victim.signal(t, syscall.SIGKILL)
	victim.wait(t, r.ctx)
	checkTreeGone(t, r.ctx, pg, []int{pid})

	r.waitFor("the run to finish", runFinished(run))
	v := r.view(run)
	s := v.steps[step]
	if s.State != core.StateSuccess || s.Attempts != 2 || v.status != "success" {
		t.Fatalf("no-write step: %s after %d attempts (run %s); want success on the second:\n%s", s.State, s.Attempts, v.status, v)
	}
	ls := v.leasesOf(step)
	if len(ls) != 2 || v.names[ls[0].Worker] != name || ls[0].Committed || ls[0].Current ||
		v.names[ls[1].Worker] == name || v.names[ls[1].Worker] == "" || !ls[1].Committed {
		t.Fatalf("leases of the no-write step: want the first on %s ended uncommitted, the second on the other worker committed:\n%s", name, v)
	}
	checkGraceHeld(t, v, step, "step-requeued")
	if ev, _ := v.event(step, "step-requeued"); !strings.Contains(ev.Message, "re-dispatched from the beginning") {
		t.Errorf("step-requeued says %q", ev.Message)
	}
	var logs []string
	(coreViewer{r.d}).Snapshot(r.ctx, func(o coreView) {
		for _, l := range o.StepLogs(step) {
			if l.Lease == ls[1].ID {
				logs = append(logs, l.Line.Text)
			}
		}
	})
	if len(logs) != 1 || logs[0] != "second attempt" {
		t.Errorf("the second lease's log is %q, want the second attempt's line", logs)
	}
	poll(t, r.ctx, "every report's answer to pass the proxy", func() bool { return r.rec.Pending() == 0 })
	checkHistory(t, r.rec)
}

// ---- the orchestrator binary, killed and restarted ----

// serveProc is an `orchestrator serve` process.
type serveProc struct {
	*proc
	addr string // host:port of its control plane and API
}

var serveURLRE = regexp.MustCompile(`workers connect to: ws://(127\.0\.0\.1:\d+)/control`)

// startServe starts `orchestrator serve` on addr with extra flags and waits
// until it prints its address.
func startServe(t *testing.T, ctx context.Context, bin, name, addr, dataDir string, extra ...string) serveProc {
	t.Helper()
	p := start(t, ctx, name, bin, append([]string{"serve", "--addr", addr, "--data-dir", dataDir, "--log-level", "debug"}, extra...)...)
	var got string
	poll(t, ctx, name+" to print its address", func() bool {
		select {
		case <-p.done:
			t.Fatalf("%s exited %d:\n%s", name, p.code, p.stderr)
		default:
		}
		if m := serveURLRE.FindStringSubmatch(p.stdout.String()); m != nil {
			got = m[1]
			return true
		}
		return false
	})
	return serveProc{proc: p, addr: got}
}

// apiClient calls the operator API.
// apiClient is the operator's API client (package client) for a test:
// each call fails the test on an error.
type apiClient struct {
	t     *testing.T
	ctx   context.Context
	base  string
	token string
}

func (a apiClient) client() *client.Client {
	a.t.Helper()
	c, err := client.New(a.base, a.token)
	if err != nil {
		a.t.Fatal(err)
	}
	return c
}

func (a apiClient) check(what string, err error) {
	a.t.Helper()
	if err != nil {
		a.t.Fatalf("%s: %v", what, err)
	}
}

// enroll creates an enrollment token valid for 10 minutes.
func (a apiClient) enroll(name string) string {
	a.t.Helper()
	tok, err := a.client().CreateToken(a.ctx, name, 10*time.Minute)
	a.check("create token "+name, err)
	return tok.Token
}

func (a apiClient) submit(file, src string) string {
	a.t.Helper()
	run, err := a.client().Submit(a.ctx, file, []byte(src))
	a.check("submit", err)
	return run
}

func (a apiClient) run(id string) client.RunDetail {
	a.t.Helper()
	det, err := a.client().Run(a.ctx, id)
	a.check("run "+id, err)
	return *det
}

func (a apiClient) runs() client.RunList {
	a.t.Helper()
	l, err := a.client().Runs(a.ctx, client.RunsOptions{})
	a.check("runs", err)
	return *l
}

func (a apiClient) workers() []client.Worker {
	a.t.Helper()
	l, err := a.client().Workers(a.ctx)
	a.check("workers", err)
	return l.Workers
}

func (a apiClient) tokens() []client.Token {
	a.t.Helper()
	l, err := a.client().Tokens(a.ctx)
	a.check("tokens", err)
	return l.Tokens
}

func apiStep(det orchestrator.APIRunDetail, name string) orchestrator.APIStep {
	for _, s := range det.Steps {
		if s.Name == name {
			return s
		}
	}
	return orchestrator.APIStep{}
}

// readStore reads the steps and leases of a stopped orchestrator's store,
// live and archived (SPEC §7a); the read of every step is recorded as a
// query.
func readStore(t *testing.T, path string, rec *netfault.Recorder) (map[core.StepID]core.StepRecord, []core.LeaseRecord) {
	t.Helper()
	call := time.Now()
	st, err := store.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	recs, err := st.Load()
	if err != nil {
		t.Fatal(err)
	}
	var hist []core.RunHistory
	for cursor := uint64(0); ; {
		runs, next, err := st.ListRuns(store.RunFilter{}, cursor, 1000)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range runs {
			h, err := st.History(r.ID)
			if err != nil {
				t.Fatal(err)
			}
			hist = append(hist, h)
		}
		if next == 0 {
			break
		}
		cursor = next
	}
	ret := time.Now()
	steps := map[core.StepID]core.StepRecord{}
	var leases []core.LeaseRecord
	for _, h := range hist {
		for _, s := range h.Steps {
			steps[s.ID] = s
			rec.Query(call, ret, s.ID, s.State, s.Outcome)
		}
		leases = append(leases, h.Leases...)
	}
	for _, r := range recs {
		if !strings.HasPrefix(r.Key, core.KindStep+"/") && !strings.HasPrefix(r.Key, core.KindLease+"/") {
			continue
		}
		v, err := core.DecodeRecord(r)
		if err != nil {
			t.Fatal(err)
		}
		switch v := v.(type) {
		case *core.StepRecord:
			steps[v.ID] = *v
			rec.Query(call, ret, v.ID, v.State, v.Outcome)
		case *core.LeaseRecord:
			leases = append(leases, *v)
		}
	}
	return steps, leases
}

// committed is a step's committed result, as stored.
type committed struct {
	state    core.State
	outcome  core.Outcome
	finished time.Time
}

// checkCommitted asserts that every result committed before still is, unchanged,
// and returns the committed results now.
func checkCommitted(t *testing.T, when string, before map[core.StepID]committed, steps map[core.StepID]core.StepRecord) map[core.StepID]committed {
	t.Helper()
	now := map[core.StepID]committed{}
	for id, s := range steps {
		if s.Outcome != nil {
			now[id] = committed{s.State, *s.Outcome, s.FinishedAt}
		}
	}
	for id, c := range before {
		if got, ok := now[id]; !ok || got.state != c.state || got.outcome != c.outcome || !got.finished.Equal(c.finished) {
			t.Errorf("%s: the committed result of %s changed: was %+v, now %+v (present %v)", when, id, c, got, ok)
		}
	}
	return now
}

// TestFaultOrchestratorKilledAndRestarted runs the orchestrator binary and
// two worker processes, and SIGKILLs the orchestrator twice mid-run,
// restarting it each time on the same store and address:
//
//  1. the moment a COMMITTED answer has passed the proxy: that result is in
//     the store when the process is dead (it was durable before the answer
//     left), and in the API after the restart;
//  2. while a write-bearing and a no-write step run on the workers: after
//     the restart both are reclaimed when their workers reconnect (events
//     step-reclaimed), and each step's process ran exactly once.
//
// The run then succeeds, and no committed result ever changed: the stored
// outcomes are compared after each kill and at the end.
func TestFaultOrchestratorKilledAndRestarted(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binaries")
	}
	ctx, cancel := context.WithTimeout(t.Context(), faultTimeout)
	defer cancel()
	orchBin, workerBin := buildBinaries(t, ctx)
	dataDir := filepath.Join(t.TempDir(), "data")
	storePath := filepath.Join(dataDir, storeFile)
	dir := t.TempDir()
	gate := filepath.Join(dir, "gate")
	t.Cleanup(func() { os.WriteFile(gate, nil, 0o600) }) // ends the steps if the test stops early

	serve := startServe(t, ctx, orchBin, "orchestrator serve", "127.0.0.1:0", dataDir)
	addr := serve.addr
	admin, err := os.ReadFile(filepath.Join(dataDir, adminTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	api := apiClient{t: t, ctx: ctx, base: "http://" + addr + "/api", token: strings.TrimSpace(string(admin))}
	rec := netfault.NewRecorder()
	p, err := netfault.Listen(addr, rec.Tap())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	// Workers reconnect after at most 5 s; their grace is 10 s, ample for a
	// restart that takes well under a second.
	for _, name := range []string{"w1", "w2"} {
		start(t, ctx, "worker "+name, workerBin, "connect", "--url", "ws://"+p.Addr()+"/control", "--token", api.enroll(name),
			"--max-reconnect-delay", "5s")
	}
	connected := func() bool {
		n := 0
		for _, w := range api.workers() {
			if w.Connected {
				n++
			}
		}
		return n == 2
	}
	poll(t, ctx, "both workers to connect", connected)

	wait := func(name string) string {
		return fmt.Sprintf("echo $$ >> %[1]s/%[2]s.runs; while [ ! -e %[3]s ]; do sleep 0.02; done; echo %[2]s done", dir, name, gate)
	}
	src := fmt.Sprintf(`name: restart
steps:
  - name: first
    run: echo first
  - name: write
    depends_on: [first]
    writes: true
    run: %s
  - name: nowrite
    depends_on: [first]
    run: %s
  - name: last
    depends_on: [write, nowrite]
    run: echo last
`, strconv.Quote(wait("write")), strconv.Quote(wait("nowrite")))
	call := time.Now()
	run := core.RunID(api.submit("faults.yaml", src))
	var steps []core.StepID
	for _, n := range []string{"first", "write", "nowrite", "last"} {
		steps = append(steps, stepID(run, n))
	}
	rec.Submit(call, time.Now(), steps, "")

	// Kill 1: as soon as a COMMITTED answer (first's) has passed the proxy.
	var answered core.Answer
	poll(t, ctx, "a COMMITTED answer", func() bool {
		for _, f := range rec.Frames() {
			if a, ok := f.Msg.(core.Answer); ok && a.Verdict == core.Committed {
				answered = a
				return true
			}
		}
		return false
	})
	serve.signal(t, syscall.SIGKILL)
	serve.wait(t, ctx)
	stored, leases := readStore(t, storePath, rec)
	var committedStep core.StepID
	for _, l := range leases {
		if l.ID == answered.Lease {
			committedStep = l.Step
		}
	}
	if s := stored[committedStep]; committedStep != steps[0] || s.State != core.StateSuccess || s.Outcome == nil {
		t.Fatalf("after kill 1 the store has %s (of the COMMITTED lease %d) as %s, want first, success with its outcome", committedStep, answered.Lease, s.State)
	}
	results := checkCommitted(t, "after kill 1", nil, stored)

	serve = startServe(t, ctx, orchBin, "orchestrator serve (restart 1)", addr, dataDir)
	if s := apiStep(api.run(string(run)), "first"); s.State != "success" || s.ExitCode == nil || *s.ExitCode != results[steps[0]].outcome.ExitCode {
		t.Errorf("after restart 1 the API shows first as %s (exit %v), want its committed success", s.State, s.ExitCode)
	}

	// Kill 2: both waiting steps running (START durable: the API reads the
	// durable state) and their processes started.
	var events int // the run's events before kill 2
	poll(t, ctx, "write and nowrite to run", func() bool {
		det := api.run(string(run))
		events = len(det.Events)
		return apiStep(det, "write").State == "running" && apiStep(det, "nowrite").State == "running" &&
			exists(filepath.Join(dir, "write.runs")) && exists(filepath.Join(dir, "nowrite.runs"))
	})
	serve.signal(t, syscall.SIGKILL)
	serve.wait(t, ctx)
	stored, _ = readStore(t, storePath, rec)
	results = checkCommitted(t, "after kill 2", results, stored)
	for _, id := range steps[1:3] {
		if s := stored[id]; s.State != core.StateRunning {
			t.Fatalf("after kill 2 the store has %s as %s, want running", id, s.State)
		}
	}

	serve = startServe(t, ctx, orchBin, "orchestrator serve (restart 2)", addr, dataDir)
	// Restart 2 holds both steps (recovering) until their workers come back
	// and reclaim them (events after kill 2 only).
	poll(t, ctx, "write and nowrite to be held and reclaimed", func() bool {
		det := api.run(string(run))
		seen := map[string]bool{}
		for _, ev := range det.Events {
			if ev.Seq > events {
				seen[ev.Kind+" "+ev.Step] = true
			}
		}
		for _, id := range steps[1:3] {
			if !seen["step-recovering "+string(id)] || !seen["step-reclaimed "+string(id)] {
				return false
			}
		}
		return apiStep(det, "write").State == "running" && apiStep(det, "nowrite").State == "running"
	})
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var det orchestrator.APIRunDetail
	poll(t, ctx, "the run to finish", func() bool {
		det = api.run(string(run))
		return !det.Run.FinishedAt.IsZero()
	})
	if det.Status != "success" {
		t.Fatalf("run finished %s: %+v", det.Status, det.Steps)
	}
	poll(t, ctx, "every report's answer to pass the proxy", func() bool { return rec.Pending() == 0 })

	serve.signal(t, syscall.SIGTERM)
	if code := serve.wait(t, ctx); code != 0 {
		t.Errorf("orchestrator exited %d on SIGTERM, want 0", code)
	}
	stored, leases = readStore(t, storePath, rec)
	checkCommitted(t, "at the end", results, stored)
	for _, id := range steps {
		if s := stored[id]; s.State != core.StateSuccess || s.Outcome == nil {
			t.Errorf("store at the end: %s is %s, want success with an outcome", id, s.State)
		}
	}
	started := 0
	for _, l := range leases {
		if l.Step == steps[1] && l.Started {
			started++
		}
	}
	if started != 1 {
		t.Errorf("the write-bearing step has %d started leases, want exactly 1", started)
	}
	for _, name := range []string{"write", "nowrite"} {
		if n := lineCount(t, filepath.Join(dir, name+".runs")); n != 1 {
			t.Errorf("step %s's process ran %d times, want once (reclaimed, not re-run)", name, n)
		}
	}
	checkHistory(t, rec)
}
