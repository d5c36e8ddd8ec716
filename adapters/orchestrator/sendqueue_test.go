package orchestrator_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/adapters/wire"
	"github.com/tether-run/tether/core"
)

// One release may queue, to one connection, a Welcome and a Dispatch for
// every lease the largest Hello allows (slots + ahead, SPEC §12): a worker
// that reads as fast as it can is not "reading too slowly" (1013, §9),
// however few cores the orchestrator has. At one P the loop queues the
// whole release before the connection's writer runs.
func TestLargestWorkerGetsItsWholeRelease(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	r := startData(t, orchestrator.Options{})
	want := core.MaxWorkerSlots + core.MaxWorkerAhead
	for left := want + 12; left > 0; left -= 1000 {
		spec := core.RunSpec{Name: "many"}
		for i := range min(left, 1000) {
			spec.Steps = append(spec.Steps, core.StepSpec{Name: fmt.Sprintf("s%d", i), Command: "true"})
		}
		if _, err := r.d.Submit(r.ctx, spec); err != nil {
			t.Fatal(err)
		}
	}
	tok, err := r.d.CreateToken(r.ctx, "big", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(r.ctx, 30*time.Second)
	defer cancel()
	ws, _, err := websocket.DefaultDialer.DialContext(ctx, r.d.URL(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	w := rawWorker{t, ws}
	w.send(core.Hello{Version: core.ProtocolVersion, Token: tok, Worker: "big-id", Name: "big", Slots: core.MaxWorkerSlots, Ahead: core.MaxWorkerAhead, MaxDelay: time.Minute})
	welcomes, dispatches := 0, 0
	for welcomes+dispatches < 1+want {
		ws.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, b, err := ws.ReadMessage()
		if err != nil {
			t.Fatalf("after %d welcome and %d dispatches (want 1 and %d): %v", welcomes, dispatches, want, err)
		}
		m, err := wire.Decode(b)
		if err != nil {
			t.Fatal(err)
		}
		switch m.(type) {
		case core.Welcome:
			welcomes++
		case core.Dispatch:
			dispatches++
		}
	}
	if welcomes != 1 {
		t.Fatalf("%d welcomes, want 1", welcomes)
	}
}
