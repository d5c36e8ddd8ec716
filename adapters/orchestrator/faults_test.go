package orchestrator_test

// Fault tests on real loopback sockets: every connection goes through a
// netfault.Proxy whose recorder keeps the report/answer history seen at the
// socket, and each test ends by checking that history against the spec's
// porcupine model (and that a doctored copy of it fails the check).

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/tether-run/tether/adapters/netfault"
	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/adapters/worker"
	"github.com/tether-run/tether/core"
	"github.com/tether-run/tether/spec"
)

// faultRig is an orchestrator driver behind a recording proxy.
type faultRig struct {
	t   *testing.T
	ctx context.Context
	d   *orchestrator.Driver
	p   *netfault.Proxy
	rec *netfault.Recorder
}

func startFaultRig(t *testing.T) *faultRig {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	t.Cleanup(cancel)
	d := startOrch(t, "127.0.0.1:0", filepath.Join(t.TempDir(), "tether.db"))
	t.Cleanup(func() { d.Close() })
	rec := netfault.NewRecorder()
	p, err := netfault.Listen(d.Addr(), rec.Tap())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return &faultRig{t: t, ctx: ctx, d: d, p: p, rec: rec}
}

// url is the control plane's URL through the proxy.
func (r *faultRig) url() string { return "ws://" + r.p.Addr() + "/control" }

// worker runs a worker driver through the proxy until the test ends.
func (r *faultRig) worker(cfg core.WorkerConfig) *worker.Driver {
	return r.workerWith(worker.Options{}, cfg)
}

// workerWith is worker with more options (URL, Logger and Config are the
// rig's).
func (r *faultRig) workerWith(opts worker.Options, cfg core.WorkerConfig) *worker.Driver {
	r.t.Helper()
	tok, err := r.d.CreateToken(r.ctx, cfg.Name, time.Minute)
	if err != nil {
		r.t.Fatal(err)
	}
	cfg.Token = tok
	opts.URL, opts.Logger, opts.Config = r.url(), testLogger(r.t).With("side", "worker", "name", cfg.Name), cfg
	w, err := worker.New(opts)
	if err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(r.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if code, err := w.Run(ctx); err == nil {
			r.t.Errorf("worker %s exited on its own with code %d", cfg.Name, code)
		}
	}()
	r.t.Cleanup(func() { cancel(); <-done })
	return w
}

// submit submits a run and records one submit operation per step.
func (r *faultRig) submit(spec core.RunSpec) (core.RunID, []core.StepID) {
	r.t.Helper()
	call := time.Now()
	run, err := r.d.Submit(r.ctx, spec)
	ret := time.Now()
	if err != nil {
		r.t.Fatal(err)
	}
	var steps []core.StepID
	viewer{r.d}.Snapshot(r.ctx, func(o view) {
		rr, _, _ := o.Run(run)
		steps = rr.Steps
	})
	r.rec.Submit(call, ret, steps, "")
	return run, steps
}

// query reads steps as an operator would and records each read.
func (r *faultRig) query(steps ...core.StepID) map[core.StepID]core.StepRecord {
	r.t.Helper()
	out := map[core.StepID]core.StepRecord{}
	call := time.Now()
	if err := (viewer{r.d}).Snapshot(r.ctx, func(o view) {
		for _, id := range steps {
			out[id], _ = o.StepByID(id)
		}
	}); err != nil {
		r.t.Fatal(err)
	}
	ret := time.Now()
	for _, id := range steps {
		r.rec.Query(call, ret, id, out[id].State, out[id].Outcome)
	}
	return out
}

// checkHistory waits until every recorded report has its answer (an answer
// can trail the state the test waited for), then checks the history with
// the porcupine model, and that the same history with a second COMMITTED for
// a step fails the check.
func (r *faultRig) checkHistory() {
	r.t.Helper()
	r.poll("every report's answer to pass the proxy", func() bool { return r.rec.Pending() == 0 })
	checkHistory(r.t, r.rec)
}

func checkHistory(t *testing.T, rec *netfault.Recorder) {
	t.Helper()
	if err := netfault.Verify(rec); err != nil {
		t.Error(err)
	}
}

func (r *faultRig) waitFor(what string, cond func(o view) bool) {
	r.t.Helper()
	waitFor(r.t, r.ctx, r.d, what, cond)
}

func (r *faultRig) poll(what string, cond func() bool) {
	r.t.Helper()
	for !cond() {
		select {
		case <-r.ctx.Done():
			r.t.Fatalf("waiting for %s: %v", what, r.ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func touch(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
}

func exists(path string) bool { _, err := os.Stat(path); return err == nil }

func hasEvent(o view, run core.RunID, step core.StepID, kind string) bool {
	for _, ev := range o.Events(run) {
		if ev.Step == step && ev.Kind == kind {
			return true
		}
	}
	return false
}

var gapRE = regexp.MustCompile(`^--- Orchestrator offline for (\d+)s\. Replaying (\d+) buffered events and (\d+) buffered log lines\. ---$`)

// TestFaultCutWithinGrace cuts a worker's connection in the middle of a
// write-bearing step and restores it within the grace window. The step keeps
// running on the same lease (reclaimed, never re-dispatched) and succeeds.
// While cut its output fills the worker's 5-line window of unacknowledged
// lines and the step blocks on write (SPEC §10): nothing is dropped. After
// the reconnect every line is stored exactly once, in order, with at most
// one gap marker, which reports no loss.
func TestFaultCutWithinGrace(t *testing.T) {
	r := startFaultRig(t)
	r.worker(core.WorkerConfig{Name: "w1", LogWindowLines: 5,
		// Reconnect attempts every few tens of ms while cut; grace = 10 s.
		BackoffBase: 20 * time.Millisecond, BackoffMax: 5 * time.Second})

	// The step is driven by files (no sleeping on a guess). It prints
	// "before"; once the link is cut (gate1) it prints its first line of
	// 8 KiB and says so (ack), then 19 more: 160 KiB cannot all wait in a
	// 64 KiB pipe and a 5-line window, so it blocks until the reconnect;
	// then (gate2) it prints "after" and ends.
	const during = 20
	dir := t.TempDir()
	gate1, gate2, ack := filepath.Join(dir, "gate1"), filepath.Join(dir, "gate2"), filepath.Join(dir, "ack")
	script := fmt.Sprintf(`echo before
while [ ! -e %[1]s ]; do sleep 0.01; done
pad=$(printf '%%8192s' '' | tr ' ' x)
i=0; while [ $i -lt %[4]d ]; do echo "during $i $pad"; [ $i -eq 0 ] && touch %[3]s; i=$((i+1)); done
while [ ! -e %[2]s ]; do sleep 0.01; done
echo after`, gate1, gate2, ack, during)
	run, steps := r.submit(core.RunSpec{Name: "cut", Steps: []core.StepSpec{{Name: "s", Command: script, Writes: true}}})
	step := steps[0]

	var lease core.LeaseID
	r.waitFor("the step to run and its first line to arrive", func(o view) bool {
		s, _ := o.StepByID(step)
		lease = s.Lease
		return s.State == core.StateRunning && slices.ContainsFunc(o.StepLogs(step), func(l core.StepLogLine) bool { return l.Line.Text == "before" })
	})
	if n := r.p.Cut(); n != 1 {
		t.Fatalf("Cut severed %d links, want the worker's one", n)
	}
	// The worker dialing again (refused) shows that it noticed the cut, so
	// what the step prints from now on is buffered.
	r.poll("the worker to redial", func() bool { return r.p.Refused() > 0 })
	r.waitFor("the orchestrator to hold the step for the worker", func(o view) bool {
		s, _ := o.StepByID(step)
		return s.State == core.StateRecovering && hasEvent(o, run, step, "step-recovering")
	})
	touch(t, gate1)
	r.poll("the step's output while cut", func() bool { return exists(ack) })
	r.p.Restore()
	r.waitFor("the step to be reclaimed", func(o view) bool {
		s, _ := o.StepByID(step)
		return s.State == core.StateRunning && hasEvent(o, run, step, "step-reclaimed")
	})
	touch(t, gate2)
	r.waitFor("the run to finish", finished(run))

	var (
		s      core.StepRecord
		leases []core.LeaseRecord
		logs   []core.StepLogLine
		status string
	)
	viewer{r.d}.Snapshot(r.ctx, func(o view) {
		s, _ = o.StepByID(step)
		status = describeSteps(o, run)
		logs = o.StepLogs(step)
		for _, l := range o.Leases() {
			if l.Step == step {
				leases = append(leases, l)
			}
		}
	})
	if s.State != core.StateSuccess || s.Outcome == nil || s.Outcome.Status != core.OutcomeSuccess {
		t.Fatalf("the step did not succeed:\n%s", status)
	}
	if len(leases) != 1 || leases[0].ID != lease || !leases[0].Committed || s.Attempts != 1 {
		t.Fatalf("the step has %d leases (attempts %d), want its first lease %d alone, committed:\n%s", len(leases), s.Attempts, lease, status)
	}

	// The log: "before", the outage's lines, "after", each once and in
	// order; at most one gap marker, and it reports no loss.
	var markers []string
	var texts []string
	var seqs []uint64
	for _, l := range logs {
		if l.Event {
			continue
		}
		if l.Line.Seq == 0 {
			markers = append(markers, l.Line.Text)
			continue
		}
		text, _, _ := strings.Cut(l.Line.Text, " x") // drop the padding
		texts = append(texts, text)
		seqs = append(seqs, l.Line.Seq)
	}
	if len(markers) > 1 {
		t.Fatalf("%d gap markers, want at most 1: %q", len(markers), markers)
	}
	for _, m := range markers {
		if gapRE.FindStringSubmatch(m) == nil {
			t.Fatalf("gap marker %q does not read as the spec says", m)
		}
	}
	want := []string{"before"}
	for i := 0; i < during; i++ {
		want = append(want, fmt.Sprintf("during %d", i))
	}
	want = append(want, "after")
	if !slices.Equal(texts, want) {
		t.Errorf("stored lines:\n %q\nwant:\n %q", texts, want)
	}
	if !slices.IsSorted(seqs) || len(seqs) != len(want) || seqs[len(seqs)-1] != during+2 {
		t.Errorf("stored sequence numbers %v: want 1..%d", seqs, during+2)
	}
	r.query(step)
	r.checkHistory()
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// rawDial connects a hand-driven worker through the proxy.
func (r *faultRig) rawDial() rawWorker {
	r.t.Helper()
	ws, _, err := websocket.DefaultDialer.DialContext(r.ctx, r.url(), nil)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { ws.Close() })
	return rawWorker{r.t, ws}
}

// enrollRaw enrolls a hand-driven worker and returns it with its credential.
func (r *faultRig) enrollRaw(name string, id core.WorkerID) (rawWorker, string) {
	r.t.Helper()
	tok, err := r.d.CreateToken(r.ctx, name, time.Minute)
	if err != nil {
		r.t.Fatal(err)
	}
	w := r.rawDial()
	w.send(core.Hello{Version: core.ProtocolVersion, Token: tok, Worker: id, Name: name, Tags: []string{name}, Slots: 1, MaxDelay: time.Second})
	m, ok := w.recv().(core.Welcome)
	if !ok || m.Credential == "" {
		r.t.Fatalf("%s: want a Welcome with a credential, got %s", name, core.DescribeMsg(m))
	}
	return w, m.Credential
}

// answer reads until the answer to (lease, request) arrives.
func (w rawWorker) answer(lease core.LeaseID, request uint64) core.Answer {
	w.t.Helper()
	for {
		if a, ok := w.recv().(core.Answer); ok && a.Lease == lease && a.Request == request {
			return a
		}
	}
}

// stateOf is what a report from another worker must not change.
type stateOf struct {
	Step   core.StepRecord
	Leases []core.LeaseRecord
	Events []core.ServerEvent
}

func (r *faultRig) stateOf(run core.RunID, step core.StepID) stateOf {
	r.t.Helper()
	var s stateOf
	viewer{r.d}.Snapshot(r.ctx, func(o view) {
		s.Step, _ = o.StepByID(step)
		s.Leases = o.Leases()
		s.Events = o.Events(run)
	})
	return s
}

// TestFaultReportForAnotherWorkersLease: a second enrolled worker, speaking
// wire frames by hand on a real socket, reports on the lease a real worker
// holds for a running step, tries to start it, reports an unknown lease and
// a malformed report. Each is REJECTED (the start refused), its connection
// stays up, and nothing changes: not the step, not any lease or its recorded
// answers, not the run's events. The real worker then commits; the other
// worker's exact copy of that committed report is still REJECTED.
func TestFaultReportForAnotherWorkersLease(t *testing.T) {
	r := startFaultRig(t)
	w1 := r.worker(core.WorkerConfig{Name: "w1", Tags: []string{"real"}, BackoffBase: 20 * time.Millisecond, BackoffMax: time.Second})
	gate := filepath.Join(t.TempDir(), "gate")
	run, steps := r.submit(core.RunSpec{Name: "rogue", Steps: []core.StepSpec{{Name: "s", Tags: []string{"real"},
		Command: "echo started; while [ ! -e " + gate + " ]; do sleep 0.01; done; echo done"}}})
	step := steps[0]
	var lease core.LeaseID
	r.waitFor("the step to run on w1", func(o view) bool {
		s, _ := o.StepByID(step)
		lease = s.Lease
		return s.State == core.StateRunning
	})
	rogue, _ := r.enrollRaw("rogue", "rogue-instance")
	before := r.stateOf(run, step)
	if len(before.Leases) != 1 || before.Leases[0].Worker != w1.ID() {
		t.Fatalf("leases before: %+v, want one, held by w1", before.Leases)
	}

	ok := core.Outcome{Status: core.OutcomeSuccess}
	for _, c := range []struct {
		name   string
		report core.Report
		reason string
	}{
		{"another worker's lease", core.Report{Step: step, Lease: lease, Request: 1, Outcome: ok}, "belongs to another worker"},
		{"an unknown lease", core.Report{Step: step, Lease: lease + 1000, Request: 2, Outcome: ok}, "unknown lease"},
		{"request id 0", core.Report{Step: step, Lease: lease, Request: 0, Outcome: ok}, "malformed"},
	} {
		rogue.send(c.report)
		if a := rogue.answer(c.report.Lease, c.report.Request); a.Verdict != core.Rejected || !strings.Contains(a.Reason, c.reason) {
			t.Errorf("report on %s: answered %s %q, want REJECTED (%s)", c.name, a.Verdict, a.Reason, c.reason)
		}
	}
	rogue.send(core.Start{Lease: lease, Request: 3})
	if m, isAck := rogue.recv().(core.StartAck); !isAck || m.OK || !strings.Contains(m.Reason, "another worker") {
		t.Errorf("start of another worker's lease: got %s, want a refusing StartAck", core.DescribeMsg(m))
	}
	if after := r.stateOf(run, step); !reflect.DeepEqual(after, before) {
		t.Fatalf("the other worker's frames changed the orchestrator:\nbefore %+v\nafter  %+v", before, after)
	}

	touch(t, gate)
	r.waitFor("the run to finish", finished(run))
	got := r.query(step)[step]
	if got.State != core.StateSuccess || got.Outcome == nil || *got.Outcome != ok {
		t.Fatalf("step %s with outcome %v, want success", got.State, got.Outcome)
	}
	// The worker's own report, as the proxy saw it, replayed by the other.
	var real *core.Report
	w1Links := map[uint64]bool{}
	for _, f := range r.rec.Frames() {
		switch m := f.Msg.(type) {
		case core.Hello:
			w1Links[f.Link] = m.Worker == w1.ID()
		case core.Report:
			if w1Links[f.Link] && f.Dir == netfault.Up {
				real = &m
			}
		}
	}
	if real == nil {
		t.Fatal("the proxy saw no report from w1")
	}
	rogue.send(*real)
	if a := rogue.answer(real.Lease, real.Request); a.Verdict != core.Rejected {
		t.Errorf("another worker's copy of the committed report: answered %s, want REJECTED", a.Verdict)
	}
	var l core.LeaseRecord
	viewer{r.d}.Snapshot(r.ctx, func(o view) { l = o.Leases()[0] })
	if len(l.Answers) != 1 || l.Answers[0].Verdict != core.Committed || l.Worker != w1.ID() {
		t.Errorf("lease %d answers %+v: want only w1's COMMITTED", l.ID, l.Answers)
	}
	r.checkHistory()
}

// readClose reads until the connection ends and returns the close error.
func readClose(t *testing.T, ws *websocket.Conn) error {
	t.Helper()
	ws.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		if _, _, err := ws.ReadMessage(); err != nil {
			return err
		}
	}
}

// TestFaultMalformedFramesKeepServing sends bad frames on real sockets, from
// strangers and from an enrolled worker, while a real worker runs a step.
// Each bad frame closes only its own connection, with a reason; the
// enrolled worker reconnects with its credential; the running step is
// untouched and commits; and the orchestrator keeps taking calls.
func TestFaultMalformedFramesKeepServing(t *testing.T) {
	r := startFaultRig(t)
	r.worker(core.WorkerConfig{Name: "w1", Tags: []string{"real"}, BackoffBase: 20 * time.Millisecond, BackoffMax: time.Second})
	gate := filepath.Join(t.TempDir(), "gate")
	run, steps := r.submit(core.RunSpec{Name: "bad-frames", Steps: []core.StepSpec{{Name: "s", Tags: []string{"real"},
		Command: "while [ ! -e " + gate + " ]; do sleep 0.01; done; echo done"}}})
	step := steps[0]
	r.waitFor("the step to run", func(o view) bool {
		s, _ := o.StepByID(step)
		return s.State == core.StateRunning
	})
	before := r.stateOf(run, step)

	// Frames that do not decode: closed with 1002 (a binary frame: 1003) and
	// the decoder's reason (SPEC §9). A report with an unknown outcome
	// decodes (it is a malformed report, §3): before a Hello it is the
	// core's protocol error, also 1002.
	for name, c := range map[string]struct {
		typ    int
		frame  string
		code   int
		reason string
	}{
		"binary":          {websocket.BinaryMessage, `{"v":1,"type":"heartbeat","body":{}}`, websocket.CloseUnsupportedData, "binary frames"},
		"truncated":       {websocket.TextMessage, `{"v":1,"type":"report","body":{"lease":`, websocket.CloseProtocolError, "wire: malformed"},
		"wrong type":      {websocket.TextMessage, `{"v":1,"type":"report","body":{"lease":"seven"}}`, websocket.CloseProtocolError, "wire: malformed"},
		"unknown outcome": {websocket.TextMessage, `{"v":1,"type":"report","body":{"step":"run-1/s","lease":1,"request":1,"outcome":{"status":"exploded"}}}`, websocket.CloseProtocolError, "report before hello"},
		"no body":         {websocket.TextMessage, `{"v":1,"type":"start"}`, websocket.CloseProtocolError, "wire: malformed"},
		"nul bytes":       {websocket.TextMessage, "\x00\x00\x00", websocket.CloseProtocolError, "wire: malformed"},
	} {
		w := r.rawDial()
		if err := w.ws.WriteMessage(c.typ, []byte(c.frame)); err != nil {
			t.Fatal(err)
		}
		var ce *websocket.CloseError
		if err := readClose(t, w.ws); !errors.As(err, &ce) || ce.Code != c.code || !strings.Contains(ce.Text, c.reason) {
			t.Errorf("%s frame: connection ended with %v, want close %d with %q", name, err, c.code, c.reason)
		}
	}

	// An enrolled worker: a second Hello is a protocol error that closes its
	// connection; so is a frame that does not decode. Each time it comes
	// back with its credential.
	rogue, cred := r.enrollRaw("other", "other-instance")
	rogue.send(core.Hello{Version: core.ProtocolVersion, Credential: cred, Worker: "other-instance", Slots: 1, MaxDelay: time.Second})
	if m, isClose := rogue.recv().(core.Close); !isClose {
		t.Errorf("second Hello on one connection: got %s, want a Close", core.DescribeMsg(m))
	}
	readClose(t, rogue.ws)
	reconnect := func() rawWorker {
		w := r.rawDial()
		w.send(core.Hello{Version: core.ProtocolVersion, Credential: cred, Worker: "other-instance", Name: "other", Tags: []string{"other"}, Slots: 1, MaxDelay: time.Second})
		if m, isWelcome := w.recv().(core.Welcome); !isWelcome {
			t.Fatalf("reconnect with the credential: got %s, want a Welcome", core.DescribeMsg(m))
		}
		return w
	}
	rogue = reconnect()
	rogue.ws.WriteMessage(websocket.TextMessage, []byte(`{"v":1,"type":"report","body":[]}`))
	var ce *websocket.CloseError
	if err := readClose(t, rogue.ws); !errors.As(err, &ce) || ce.Code != websocket.CloseProtocolError {
		t.Errorf("enrolled worker's malformed frame: connection ended with %v, want close 1002", err)
	}
	rogue = reconnect()

	if after := r.stateOf(run, step); !reflect.DeepEqual(after.Step, before.Step) || !reflect.DeepEqual(after.Leases, before.Leases) || !reflect.DeepEqual(after.Events, before.Events) {
		t.Fatalf("bad frames changed the running step:\nbefore %+v\nafter  %+v", before, after)
	}
	if r.rec.Undecodable() < 5 {
		t.Errorf("the recorder saw %d undecodable frames, want at least 5", r.rec.Undecodable())
	}
	// Still serving: the step commits, and new calls are answered.
	touch(t, gate)
	r.waitFor("the run to finish", finished(run))
	if got := r.query(step)[step]; got.State != core.StateSuccess {
		t.Fatalf("step %s after the bad frames, want success", got.State)
	}
	if _, err := r.d.CreateToken(r.ctx, "after", time.Minute); err != nil {
		t.Fatalf("orchestrator unusable after malformed frames: %v", err)
	}
	rogue.send(core.Heartbeat{})
	r.waitFor("the reconnected worker to be connected", func(o view) bool {
		for _, w := range o.Workers() {
			if w.ID == "other-instance" {
				return w.Connected
			}
		}
		return false
	})
	r.checkHistory()
}

// TestFaultAnswerLostInCut cuts the link at the moment a write-bearing
// step's COMMITTED answer passes the proxy, so the answer never reaches the
// worker. The commit stands: the step succeeded once, on its one lease, with
// one recorded answer, and is never dispatched again. The reconnecting
// worker still lists the lease; it is not told to cancel it, so it re-sends
// its report — an exact repeat — and this time the COMMITTED answer reaches
// it. The worker keeps working: a second run succeeds on it.
func TestFaultAnswerLostInCut(t *testing.T) {
	r := startFaultRig(t)
	var cut atomic.Bool
	var lostLease atomic.Uint64
	var again atomic.Int64 // COMMITTED answers for the lost lease after the cut
	r.rec.Intercept(func(f netfault.Frame) {
		a, ok := f.Msg.(core.Answer)
		if !ok || f.Dir != netfault.Down || a.Verdict != core.Committed {
			return
		}
		if !cut.Swap(true) {
			lostLease.Store(uint64(a.Lease))
			r.p.Cut() // before the chunk holding the answer is forwarded
		} else if uint64(a.Lease) == lostLease.Load() {
			again.Add(1)
		}
	})
	r.worker(core.WorkerConfig{Name: "w1", BackoffBase: 20 * time.Millisecond, BackoffMax: 5 * time.Second})
	run1, steps1 := r.submit(core.RunSpec{Name: "lost-answer", Steps: []core.StepSpec{{Name: "s", Command: "echo once", Writes: true}}})
	r.waitFor("the run to finish", finished(run1))
	r.poll("the cut", cut.Load)
	r.poll("the worker to redial", func() bool { return r.p.Refused() > 0 })
	r.p.Restore()
	r.waitFor("the worker to reconnect", func(o view) bool {
		ws := o.Workers()
		return len(ws) == 1 && ws[0].Connected
	})

	r.poll("the re-sent report's COMMITTED answer", func() bool { return again.Load() > 0 })

	step := steps1[0]
	got := r.query(step)[step]
	var leases []core.LeaseRecord
	viewer{r.d}.Snapshot(r.ctx, func(o view) { leases = o.Leases() })
	if got.State != core.StateSuccess || got.Attempts != 1 || len(leases) != 1 || uint64(leases[0].ID) != lostLease.Load() ||
		!leases[0].Committed || len(leases[0].Answers) != 1 || leases[0].Answers[0].Verdict != core.Committed {
		t.Fatalf("after the lost answer: step %s (attempts %d), leases %+v; want one committed lease with one answer", got.State, got.Attempts, leases)
	}

	run2, _ := r.submit(core.RunSpec{Name: "after", Steps: []core.StepSpec{{Name: "t", Command: "echo again"}}})
	r.waitFor("the second run to finish", finished(run2))
	var status string
	viewer{r.d}.Snapshot(r.ctx, func(o view) { status = runStatus(o, run2) })
	if status != "success" {
		t.Fatalf("the second run finished %s", status)
	}
	// Wait for the second run's answer; the first report may stay open.
	r.poll("the second report's answer", func() bool {
		for _, op := range r.rec.Ops() {
			if in := op.Input.(spec.StepInput); in.Kind == spec.OpReport && in.Step != step && op.Output.(spec.StepOutput).Verdict == core.Committed {
				return true
			}
		}
		return false
	})
	checkHistory(t, r.rec)
}

// TestFaultFrozenOrchestratorLeft: the orchestrator's end of the link goes
// silent with its sockets open — its host died without a FIN, or its
// process is stopped — while the worker has nothing to send. The worker
// pings, hears no pong, and dials again within its ReadWait (SPEC §10),
// as it must to reach a standby that took over (SPEC §11), rather than
// waiting for a write to fail.
func TestFaultFrozenOrchestratorLeft(t *testing.T) {
	r := startFaultRig(t)
	const readWait = 2 * time.Second
	r.workerWith(worker.Options{ReadWait: readWait}, core.WorkerConfig{Name: "w1", Slots: 1})
	r.poll("the worker to connect", func() bool { return r.p.Links() == 1 && r.p.Accepted() == 1 })
	// Idle but answering, the link lives on past ReadWait: the worker's
	// pings get pongs (the orchestrator pings only after 30 s of silence).
	select {
	case <-time.After(5 * readWait / 2):
	case <-r.ctx.Done():
		t.Fatal(r.ctx.Err())
	}
	if n := r.p.Accepted(); n != 1 {
		t.Fatalf("an idle, answering link was dialed %d times in %v; want once (ReadWait %v)", n, 5*readWait/2, readWait)
	}
	if n := r.p.Freeze(); n != 1 {
		t.Fatalf("froze %d links; want the worker's one", n)
	}
	r.poll("the worker to leave the frozen link and dial again", func() bool { return r.p.Accepted() >= 2 })
}
