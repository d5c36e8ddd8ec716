package orchestrator_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/adapters/store"
	"github.com/tether-run/tether/adapters/worker"
	"github.com/tether-run/tether/core"
)

const testTimeout = 20 * time.Second

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
}

func startOrch(t *testing.T, addr, path string) *orchestrator.Driver {
	t.Helper()
	d, err := orchestrator.Start(orchestrator.Options{Addr: addr, StorePath: path, Logger: testLogger(t).With("side", "orchestrator")})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// fleet runs worker drivers until stopped.
type fleet struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	exits  []string
}

func startWorkers(t *testing.T, ctx context.Context, d *orchestrator.Driver, names ...string) *fleet {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	f := &fleet{cancel: cancel}
	for _, name := range names {
		tok, err := d.CreateToken(ctx, name, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		w, err := worker.New(worker.Options{
			URL:    d.URL(),
			Logger: testLogger(t).With("side", "worker"),
			Config: core.WorkerConfig{
				Name: name, Token: tok,
				// Fast reconnects: a restarted orchestrator is found within
				// ~100 ms; grace is 2 × BackoffMax = 6 s.
				BackoffBase: 50 * time.Millisecond, BackoffMax: 3 * time.Second,
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			code, err := w.Run(ctx)
			if err == nil {
				f.mu.Lock()
				f.exits = append(f.exits, fmt.Sprintf("%s exited with code %d", name, code))
				f.mu.Unlock()
			}
		}()
	}
	return f
}

func (f *fleet) stop(t *testing.T) {
	f.cancel()
	f.wg.Wait()
	if len(f.exits) > 0 {
		t.Errorf("workers exited on their own: %v", f.exits)
	}
}

// waitFor polls the orchestrator until cond holds or ctx ends.
func waitFor(t *testing.T, ctx context.Context, d *orchestrator.Driver, what string, cond func(o view) bool) {
	t.Helper()
	for {
		ok := false
		if err := (viewer{d}).Snapshot(ctx, func(o view) { ok = cond(o) }); err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func runStatus(o view, id core.RunID) string {
	_, st, _ := o.Run(id)
	return st
}

func finished(id core.RunID) func(o view) bool {
	return func(o view) bool {
		r, _, ok := o.Run(id)
		return ok && r.Finished
	}
}

// describeSteps renders every step of a run for failure messages.
func describeSteps(o view, id core.RunID) string {
	var b strings.Builder
	r, st, _ := o.Run(id)
	fmt.Fprintf(&b, "run %s %s", id, st)
	for _, sid := range r.Steps {
		s, _ := o.StepByID(sid)
		fmt.Fprintf(&b, "\n  %s %s attempts=%d %s %s", s.ID, s.State, s.Attempts, s.Class, s.Message)
	}
	for _, ev := range o.Events(id) {
		fmt.Fprintf(&b, "\n  event %d %s %s %s", ev.Seq, ev.Step, ev.Kind, ev.Message)
	}
	return b.String()
}

// storedSteps loads the store file and decodes its step records, live and
// archived (SPEC §7a).
func storedSteps(t *testing.T, path string) map[core.StepID]core.StepRecord {
	t.Helper()
	st, err := store.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	recs, err := st.Load()
	if err != nil {
		t.Fatal(err)
	}
	out := map[core.StepID]core.StepRecord{}
	for _, h := range (view{H: st}).Archived() {
		for _, s := range h.Steps {
			out[s.ID] = s
		}
	}
	for _, r := range recs {
		if !strings.HasPrefix(r.Key, core.KindStep+"/") {
			continue
		}
		v, err := core.DecodeRecord(r)
		if err != nil {
			t.Fatal(err)
		}
		s := v.(*core.StepRecord)
		out[s.ID] = *s
	}
	return out
}

// TestEndToEnd: an orchestrator driver and two worker drivers on real
// loopback sockets run a three-step DAG (one step write-bearing) to success
// with real `sh -c` processes; output and the shipped env arrive; the store
// holds every committed step.
func TestEndToEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	path := filepath.Join(t.TempDir(), "tether.db")
	d := startOrch(t, "127.0.0.1:0", path)
	defer d.Close()
	f := startWorkers(t, ctx, d, "w1", "w2")
	defer f.stop(t)

	spec := core.RunSpec{Name: "e2e", Env: map[string]string{"GREETING": "hello"}, Steps: []core.StepSpec{
		{Name: "fetch", Command: `echo "$GREETING from fetch"; echo oops >&2`},
		{Name: "build", Command: "sleep 0.1; echo built", DependsOn: []string{"fetch"}},
		{Name: "publish", Command: "echo published", DependsOn: []string{"fetch", "build"}, Writes: true},
	}}
	run, err := d.Submit(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Submit(ctx, core.RunSpec{Name: "bad"}); !errors.Is(err, orchestrator.ErrRefused) {
		t.Fatalf("Submit of an invalid run: err = %v, want ErrRefused", err)
	}
	waitFor(t, ctx, d, "run to finish", finished(run))

	var status, detail string
	var logs []string
	viewer{d}.Snapshot(ctx, func(o view) {
		status, detail = runStatus(o, run), describeSteps(o, run)
		for _, l := range o.StepLogs(core.StepID(run + "/fetch")) {
			logs = append(logs, l.Line.Text)
		}
	})
	if status != "success" {
		t.Fatalf("run finished %s:\n%s", status, detail)
	}
	if !slices.Contains(logs, "hello from fetch") || !slices.Contains(logs, "oops") {
		t.Errorf("fetch's stored log %q lacks its stdout and stderr lines", logs)
	}

	f.stop(t)
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	steps := storedSteps(t, path)
	for _, name := range []string{"fetch", "build", "publish"} {
		s, ok := steps[core.StepID(string(run)+"/"+name)]
		if !ok || s.State != core.StateSuccess || s.Outcome == nil || s.Outcome.Status != core.OutcomeSuccess {
			t.Errorf("store: step %s = %v (present %v), want success with a committed outcome", name, s.State, ok)
		}
	}
}

// TestRestart stops the orchestrator driver mid-run, with one committed
// step and two steps (one write-bearing) executing on workers, and starts a
// new driver on the same store file and address. The workers reconnect, the
// executing steps are reclaimed (the write-bearing one is not re-dispatched)
// and the run succeeds; nothing committed before the stop is lost.
func TestRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	path := filepath.Join(t.TempDir(), "tether.db")
	d1 := startOrch(t, "127.0.0.1:0", path)
	addr := d1.Addr()
	defer d1.Close()
	f := startWorkers(t, ctx, d1, "w1", "w2")
	defer f.stop(t)

	spec := core.RunSpec{Name: "restart", Steps: []core.StepSpec{
		{Name: "first", Command: "echo first"},
		{Name: "slow", Command: "sleep 1.5; echo slow", DependsOn: []string{"first"}},
		{Name: "write", Command: "sleep 1.5; echo wrote", DependsOn: []string{"first"}, Writes: true},
		{Name: "last", Command: "echo last", DependsOn: []string{"slow", "write"}},
	}}
	run, err := d1.Submit(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	id := func(name string) core.StepID { return core.StepID(string(run) + "/" + name) }
	var before core.StepRecord
	waitFor(t, ctx, d1, "first committed, slow and write running", func(o view) bool {
		first, _ := o.StepByID(id("first"))
		slow, _ := o.StepByID(id("slow"))
		write, _ := o.StepByID(id("write"))
		before = first
		return first.State == core.StateSuccess && slow.State == core.StateRunning && write.State == core.StateRunning
	})
	// Stop without finishing anything: the equivalent of a crash, since
	// everything this driver said was durable first.
	if err := d1.Close(); err != nil {
		t.Fatal(err)
	}
	if s := storedSteps(t, path)[id("first")]; s.State != core.StateSuccess {
		t.Fatalf("store after stop: first is %s, want success", s.State)
	}

	d2 := startOrch(t, addr, path)
	defer d2.Close()
	waitFor(t, ctx, d2, "run to finish after restart", finished(run))

	var status, detail string
	var after core.StepRecord
	var writeLeases int
	viewer{d2}.Snapshot(ctx, func(o view) {
		status, detail = runStatus(o, run), describeSteps(o, run)
		after, _ = o.StepByID(id("first"))
		for _, l := range o.Leases() {
			if l.Step == id("write") {
				writeLeases++
			}
		}
	})
	if status != "success" {
		t.Fatalf("run finished %s after restart:\n%s", status, detail)
	}
	if after.State != core.StateSuccess || *after.Outcome != *before.Outcome || !after.FinishedAt.Equal(before.FinishedAt) {
		t.Errorf("committed step changed across the restart: before %v %v, after %v %v", before.State, before.Outcome, after.State, after.Outcome)
	}
	if writeLeases != 1 {
		t.Errorf("write-bearing step got %d leases, want exactly 1 (never re-dispatched)", writeLeases)
	}
	var reclaimed bool
	viewer{d2}.Snapshot(ctx, func(o view) {
		for _, ev := range o.Events(run) {
			reclaimed = reclaimed || ev.Kind == "step-reclaimed"
		}
	})
	if !reclaimed {
		t.Errorf("no step-reclaimed event: the executing steps were not reclaimed after the restart:\n%s", detail)
	}

	f.stop(t)
	if err := d2.Close(); err != nil {
		t.Fatal(err)
	}
	for name, s := range storedSteps(t, path) {
		if s.State != core.StateSuccess {
			t.Errorf("store after restart: %s is %s, want success", name, s.State)
		}
	}
}

// TestMalformedFrames: a frame that does not decode closes that connection
// with a reason; the orchestrator carries on.
func TestMalformedFrames(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	d := startOrch(t, "127.0.0.1:0", filepath.Join(t.TempDir(), "tether.db"))
	defer d.Close()
	for _, bad := range []string{"not json", `{"v":9,"type":"hello","body":{}}`, `{"v":1,"type":"nope","body":{}}`} {
		ws, _, err := websocket.DefaultDialer.DialContext(ctx, d.URL(), nil)
		if err != nil {
			t.Fatal(err)
		}
		ws.SetReadDeadline(time.Now().Add(5 * time.Second))
		if err := ws.WriteMessage(websocket.TextMessage, []byte(bad)); err != nil {
			t.Fatal(err)
		}
		_, _, err = ws.ReadMessage()
		var ce *websocket.CloseError
		if !errors.As(err, &ce) || ce.Code != websocket.CloseProtocolError || !strings.Contains(ce.Text, "wire:") {
			t.Errorf("after %q: read err = %v, want a close frame 1002 with the decoding error", bad, err)
		}
		ws.Close()
	}
	// A message before hello is the core's business: it answers with a Close.
	ws, _, err := websocket.DefaultDialer.DialContext(ctx, d.URL(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	ws.SetReadDeadline(time.Now().Add(5 * time.Second))
	ws.WriteMessage(websocket.TextMessage, []byte(`{"v":1,"type":"heartbeat","body":{}}`))
	_, b, err := ws.ReadMessage()
	if err != nil || !strings.Contains(string(b), `"type":"close"`) {
		t.Errorf("heartbeat before hello: got %q, %v; want a close message", b, err)
	}
	if _, err := d.CreateToken(ctx, "still-alive", time.Minute); err != nil {
		t.Fatalf("orchestrator unusable after malformed frames: %v", err)
	}
}

// TestCancelAndRevoke: cancelling a run stops its running step's process
// (SIGTERM to the group) and the step ends cancelled; revoking the worker's
// token closes its connection, and its reconnect is refused for good, so the
// worker driver exits with core.WorkerExitRefused.
func TestCancelAndRevoke(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	d := startOrch(t, "127.0.0.1:0", filepath.Join(t.TempDir(), "tether.db"))
	defer d.Close()
	tok, err := d.CreateToken(ctx, "w1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(worker.Options{URL: d.URL(), Logger: testLogger(t).With("side", "worker"),
		Config: core.WorkerConfig{Name: "w1", Token: tok, BackoffBase: 50 * time.Millisecond, BackoffMax: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		code int
		err  error
	}
	res := make(chan result, 1)
	go func() {
		code, err := w.Run(ctx)
		res <- result{code, err}
	}()

	run, err := d.Submit(ctx, core.RunSpec{Name: "cancel", Steps: []core.StepSpec{{Name: "forever", Command: "echo started; sleep 30"}}})
	if err != nil {
		t.Fatal(err)
	}
	step := core.StepID(string(run) + "/forever")
	waitFor(t, ctx, d, "the step to run and log", func(o view) bool {
		s, _ := o.StepByID(step)
		return s.State == core.StateRunning && len(o.StepLogs(step)) > 0
	})
	if err := d.CancelRun(ctx, run, "test cancels"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, d, "the run to finish cancelled", finished(run))
	var s core.StepRecord
	viewer{d}.Snapshot(ctx, func(o view) { s, _ = o.StepByID(step) })
	if s.State != core.StateCancelled || s.Outcome != nil {
		t.Fatalf("step is %s (outcome %v), want cancelled by the worker's ack", s.State, s.Outcome)
	}

	if err := d.RevokeToken(ctx, "w1"); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-res:
		if r.err != nil || r.code != core.WorkerExitRefused {
			t.Fatalf("worker Run = (%d, %v), want exit code %d", r.code, r.err, core.WorkerExitRefused)
		}
	case <-ctx.Done():
		t.Fatal("worker did not exit after its token was revoked")
	}
}
