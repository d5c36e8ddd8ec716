package orchestrator_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/adapters/wire"
	"github.com/tether-run/tether/core"
)

// TestControlPings: the orchestrator pings a control connection only once
// it has read nothing from it (no frame, ping or pong) for half its
// ReadWait, and closes one silent for ReadWait (SPEC §9). Three enrolled
// clients, ReadWait 1.5 s:
//   - chatty sends a Heartbeat every ReadWait/6 and reads: it is never
//     pinged, and stays;
//   - quiet sends nothing after its Hello but reads (so answers pings):
//     it is pinged, and stays;
//   - dead sends nothing and reads nothing (a half-open peer: no pong
//     ever comes back): the orchestrator closes it, and the core hears
//     the worker disconnect.
func TestControlPings(t *testing.T) {
	const wait = 1500 * time.Millisecond
	d, err := orchestrator.Start(orchestrator.Options{
		Addr: "127.0.0.1:0", StorePath: filepath.Join(t.TempDir(), "tether.db"), ReadWait: wait,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dial := func(name string) *websocket.Conn { return rawFleetWorker(t, ctx, d, name).ws }
	// reads counts the pings a client gets while it reads (gorilla answers
	// each with a pong) until its connection ends.
	reads := func(ws *websocket.Conn) *atomic.Int64 {
		var pings atomic.Int64
		ws.SetPingHandler(func(data string) error {
			pings.Add(1)
			return ws.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(time.Second))
		})
		go func() {
			for {
				if _, _, err := ws.NextReader(); err != nil {
					return
				}
			}
		}()
		return &pings
	}
	chatty, quiet := dial("chatty"), dial("quiet")
	dial("dead")
	chattyPings, quietPings := reads(chatty), reads(quiet)
	hb, err := wire.Encode(core.Heartbeat{})
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	beats := make(chan error, 1)
	go func() {
		tk := time.NewTicker(wait / 6)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				beats <- nil
				return
			case <-tk.C:
				if err := chatty.WriteMessage(websocket.TextMessage, hb); err != nil {
					beats <- err
					return
				}
			}
		}
	}()
	// The dead one is closed: its worker disconnects in the core.
	for connected(t, d)["dead"] {
		select {
		case <-ctx.Done():
			t.Fatalf("a connection silent for ReadWait (%v), its pings unanswered, was not closed within a minute", wait)
		case <-time.After(50 * time.Millisecond):
		}
	}
	// Three ReadWaits on, the other two are still there.
	time.Sleep(3 * wait)
	close(stop)
	if err := <-beats; err != nil {
		t.Fatalf("chatty's heartbeat: %v", err)
	}
	c := connected(t, d)
	if !c["chatty"] || !c["quiet"] {
		t.Fatalf("connected workers %v: chatty and quiet must stay (each heard from, or answering pings)", c)
	}
	if n := chattyPings.Load(); n != 0 {
		t.Errorf("chatty, heard from every %v, was pinged %d times; want none", wait/6, n)
	}
	if n := quietPings.Load(); n == 0 {
		t.Errorf("quiet, silent for %v, was never pinged", 3*wait)
	}
}

// connected is the set of workers the core holds connected.
func connected(t *testing.T, d *orchestrator.Driver) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	if err := d.Snapshot(context.Background(), func(o *core.Orchestrator) {
		for _, w := range o.Workers() {
			if w.Connected {
				out[string(w.ID)] = true
			}
		}
	}); err != nil {
		t.Fatal(fmt.Errorf("snapshot: %w", err))
	}
	return out
}
