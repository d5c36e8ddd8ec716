package orchestrator_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
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

// A control connection closed 1009 for a frame over wire.MaxFrame costs
// its address one refusal per 64 KiB it sent (SPEC §12: a refused 1 MiB
// frame costs 17), not one.
func TestOversizeFrameCostsItsBytes(t *testing.T) {
	t.Parallel()
	r := startData(t, orchestrator.Options{RefusalsPerSec: 1})
	ws, _, err := websocket.DefaultDialer.DialContext(r.ctx, r.d.URL(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	if err := ws.WriteMessage(websocket.TextMessage, make([]byte, wire.MaxFrame+1)); err != nil {
		t.Fatal(err)
	}
	ws.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, _, err = ws.ReadMessage()
	if ce, ok := err.(*websocket.CloseError); !ok || ce.Code != websocket.CloseMessageTooBig {
		t.Fatalf("a frame of %d bytes: %v, want close 1009", wire.MaxFrame+1, err)
	}
	ws.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		left := orchestrator.RefusalUnits(r.d, "127.0.0.1")
		if left <= 2-17+1 { // burst 2, rate 1/s: a second's refill at most
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a refused frame of 1 MiB the address's refusal budget holds %.1f units of its burst of 2, want at most %d (17 spent)", left, 2-17+1)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The probes answer at once from an address in debt with its refusal
// budget (SPEC §16; a prober may share an address, through a translator,
// with a client that keeps being refused), where any other request waits.
func TestProbesNeverWaitForRefusals(t *testing.T) {
	t.Parallel()
	r := startData(t, orchestrator.Options{RefusalsPerSec: 1})
	orchestrator.SpendRefusals(r.d, "127.0.0.1", 10) // 8 units in debt: 8 s at 1/s, waits of 5 s
	hc := &http.Client{Timeout: 30 * time.Second}
	for _, p := range []string{"/livez", "/readyz"} {
		start := time.Now()
		resp, err := hc.Get(r.d.DataURL() + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if took := time.Since(start); resp.StatusCode != http.StatusOK || took > 2500*time.Millisecond {
			t.Fatalf("GET %s from an address in refusal debt: HTTP %d after %v, want 200 at once (the wait is 5 s)", p, resp.StatusCode, took.Round(time.Millisecond))
		}
	}
}

// A connection's frames that wait for its work budget (SPEC §12) are not
// silence: the read deadline (ReadWait, SPEC §9) runs from when its reader
// reads again, not from the frame before the wait.
func TestBudgetWaitIsNotSilence(t *testing.T) {
	t.Parallel()
	r := startData(t, orchestrator.Options{ReadWait: time.Second, WorkPerSec: 1})
	tok, err := r.d.CreateToken(r.ctx, "w", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	ws, _, err := websocket.DefaultDialer.DialContext(r.ctx, r.d.URL(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	w := rawWorker{t, ws}
	w.send(core.Hello{Version: core.ProtocolVersion, Token: tok, Worker: "w-id", Name: "w", Slots: 1, MaxDelay: time.Minute})
	if m, ok := w.recv().(core.Welcome); !ok {
		t.Fatalf("want a Welcome, got %s", core.DescribeMsg(m))
	}
	// One heartbeat listing three leases costs 4: it waits 4 s for the
	// budget (the Hello took the burst), four times ReadWait, while the
	// pings sent meanwhile wait in the socket for the reader.
	w.send(core.Heartbeat{InFlight: []core.LeaseRef{{Step: "run-9/a", Lease: 91}, {Step: "run-9/b", Lease: 92}, {Step: "run-9/c", Lease: 93}}})
	// Keep sending, so the connection is never silent for a second.
	for range 12 {
		time.Sleep(500 * time.Millisecond)
		if err := ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(time.Second)); err != nil {
			t.Fatalf("the connection was closed while its frames waited for the work budget: %v", err)
		}
	}
	ws.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, _, err := ws.ReadMessage(); err != nil {
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("the connection was closed while its frames waited for the work budget: %v", err)
		}
	}
}
