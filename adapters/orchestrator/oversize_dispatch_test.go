package orchestrator_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/adapters/wire"
	"github.com/tether-run/tether/core"
)

// TestUndeliverableDispatchClosesWithReason: submit refuses a step whose
// dispatch could not fit in a frame (SPEC §12), but the orchestrator's own
// environment may grow across a restart. A dispatch the driver then cannot
// encode closes the worker's connection with 1011 and the reason (its kind,
// size and the frame limit), never silently, and the core hears a
// disconnect.
func TestUndeliverableDispatchClosesWithReason(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	path := filepath.Join(t.TempDir(), "tether.db")
	d := startOrch(t, "127.0.0.1:0", path)
	if _, err := d.Submit(ctx, core.RunSpec{Steps: []core.StepSpec{{Name: "a", Command: "true"}}}); err != nil {
		t.Fatal(err)
	}
	d.Close()

	// Restarted with an environment larger than a frame.
	d, err := orchestrator.Start(orchestrator.Options{Addr: "127.0.0.1:0", StorePath: path, Logger: testLogger(t),
		Config: core.Config{Env: map[string]string{"HUGE": strings.Repeat("x", wire.MaxFrame)}}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	tok, err := d.CreateToken(ctx, "w", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	ws, _, err := websocket.DefaultDialer.DialContext(ctx, d.URL(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	w := rawWorker{t, ws}
	w.send(core.Hello{Version: core.ProtocolVersion, Token: tok, Worker: "w-1", Name: "w", Slots: 1, MaxDelay: time.Second})
	if m, ok := w.recv().(core.Welcome); !ok {
		t.Fatalf("want a Welcome, got %s", core.DescribeMsg(m))
	}
	err = readClose(t, ws)
	var ce *websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.CloseInternalServerErr || !strings.Contains(ce.Text, "dispatch") || !strings.Contains(ce.Text, "1048576") {
		t.Fatalf("the connection ended with %v; want a close frame 1011 naming the dispatch and the frame limit", err)
	}
	t.Logf("closed: %d %q", ce.Code, ce.Text)
	waitFor(t, ctx, d, "the worker to be disconnected", func(o view) bool {
		for _, wr := range o.Workers() {
			if wr.Name == "w" {
				return !wr.Connected
			}
		}
		return false
	})
}
