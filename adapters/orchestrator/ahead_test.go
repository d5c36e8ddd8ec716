package orchestrator_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/adapters/worker"
	"github.com/tether-run/tether/client"
	"github.com/tether-run/tether/core"
)

// TestLeaseAheadEndToEnd runs lease-ahead (SPEC §3) through the real
// driver, the wire and the worker's driver: one worker with one slot and one
// lease ahead. While a runs, the next step is dispatched to it, held, and
// recorded held (the worker's Held crossed the wire); every step, the
// write-bearing one too, then runs once, on its first grant (a lost Held
// would let the dispatch-ack deadline requeue it). GET /api/workers and
// the server stream's worker event show the worker's ahead.
func TestLeaseAheadEndToEnd(t *testing.T) {
	r := startAPI(t)
	ctx, d := r.ctx, r.d
	stream := openStream(t, ctx, d, "/events", "")
	tok, err := d.CreateToken(ctx, "w1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(worker.Options{
		URL:    d.URL(),
		Logger: testLogger(t).With("side", "worker"),
		Config: core.WorkerConfig{Name: "w1", Token: tok, Slots: 1, Ahead: 1, BackoffBase: 50 * time.Millisecond, BackoffMax: 3 * time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		w.Run(wctx)
	}()
	defer func() { stop(); wg.Wait() }()

	// a holds the slot until its marker file exists: b is held meanwhile.
	gate := filepath.Join(t.TempDir(), "gate")
	run, err := d.Submit(ctx, core.RunSpec{Name: "ahead", Steps: []core.StepSpec{
		{Name: "a", Command: fmt.Sprintf("while [ ! -e %q ]; do sleep 0.02; done", gate)},
		{Name: "b", Command: "echo b", Writes: true},
		{Name: "c", Command: "echo c"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, d, "a lease held ahead", func(o view) bool {
		for _, l := range o.Leases() {
			if l.Current && l.Held {
				return true
			}
		}
		return false
	})
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, d, "run to finish", finished(run))
	c, err := client.New(d.DataURL(), adminToken)
	if err != nil {
		t.Fatal(err)
	}
	ws, err := c.Workers(ctx)
	if err != nil || len(ws.Workers) != 1 || ws.Workers[0].Ahead != 1 || ws.Workers[0].Slots != 1 {
		t.Errorf("GET /api/workers: %+v, %v; want one worker with 1 slot and 1 ahead", ws, err)
	}
	got := stream.until("the worker's event", func(e sseEvent) bool { return e.kind == "worker" })
	if v := decode[orchestrator.StreamWorker](t, got[len(got)-1]); v.Slots != 1 || v.Ahead != 1 {
		t.Errorf("the server stream's worker event %+v: want 1 slot and 1 ahead", v)
	}
	viewer{d}.Snapshot(ctx, func(o view) {
		if st := runStatus(o, run); st != "success" {
			t.Fatalf("run finished %s:\n%s", st, describeSteps(o, run))
		}
		for _, name := range []string{"a", "b", "c"} {
			if s, _ := o.StepByID(core.StepID(string(run) + "/" + name)); s.Attempts != 1 {
				t.Errorf("step %s took %d grants, want 1:\n%s", name, s.Attempts, describeSteps(o, run))
			}
		}
	})
}
