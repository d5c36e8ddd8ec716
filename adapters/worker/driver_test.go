package worker

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/tether-run/tether/adapters/wire"
	"github.com/tether-run/tether/core"
)

// levelRecorder is a slog.Handler that keeps each record's level and message.
type levelRecorder struct {
	mu      sync.Mutex
	records []slog.Record
	added   chan struct{} // signalled (without blocking) on every record
}

func (h *levelRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (h *levelRecorder) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *levelRecorder) WithGroup(string) slog.Handler            { return h }
func (h *levelRecorder) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.records = append(h.records, r.Clone())
	h.mu.Unlock()
	select {
	case h.added <- struct{}{}:
	default:
	}
	return nil
}

// find returns the first record whose message contains text.
func (h *levelRecorder) find(text string) (slog.Record, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.records {
		if strings.Contains(r.Message, text) {
			return r, true
		}
	}
	return slog.Record{}, false
}

// TestDriverLogsCoreLevels: the driver logs the core's lines at the core's
// level. A fake orchestrator welcomes the worker, dispatches a lease and
// answers its Start with REJECTED, which SPEC §10 says is logged as an error.
func TestDriverLogsCoreLevels(t *testing.T) {
	const lease = core.LeaseID(7)
	up := websocket.Upgrader{}
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		ws, err := up.Upgrade(rw, r, nil)
		if err != nil {
			return
		}
		defer ws.Close()
		send := func(m core.Msg) bool {
			b, err := wire.Encode(m)
			return err == nil && ws.WriteMessage(websocket.TextMessage, b) == nil
		}
		for {
			_, b, err := ws.ReadMessage()
			if err != nil {
				return
			}
			m, err := wire.Decode(b)
			if err != nil {
				t.Errorf("undecodable frame from the worker: %v", err)
				return
			}
			switch m := m.(type) {
			case core.Hello:
				send(core.Welcome{Worker: m.Worker, Credential: "cred", CredentialTTL: time.Hour, Heartbeat: time.Minute})
				send(core.Dispatch{Lease: lease, Step: "run-1/a", Run: "run-1", Command: "true", Writes: true, Attempt: 1})
			case core.Start:
				send(core.Answer{Lease: m.Lease, Request: m.Request, Verdict: core.Rejected, Reason: "lease belongs to another worker"})
			}
		}
	}))
	defer srv.Close()

	rec := &levelRecorder{added: make(chan struct{}, 1)}
	d, err := New(Options{
		URL:            "ws" + strings.TrimPrefix(srv.URL, "http") + "/control",
		Config:         core.WorkerConfig{Name: "w1", Token: "t1.00", Slots: 1},
		Logger:         slog.New(rec),
		NoStepEndpoint: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.Run(ctx)
	}()
	defer func() {
		cancel()
		<-done
	}()

	const want = "report for lease 7 rejected: lease belongs to another worker"
	deadline := time.After(30 * time.Second)
	for {
		if r, ok := rec.find(want); ok {
			if r.Level != slog.LevelError {
				t.Errorf("%q logged at %v, want %v (SPEC §10)", want, r.Level, slog.LevelError)
			}
			break
		}
		select {
		case <-rec.added:
		case <-deadline:
			t.Fatalf("the worker never logged %q", want)
		}
	}
	if r, ok := rec.find("connected to orchestrator"); !ok || r.Level != slog.LevelInfo {
		t.Errorf("the routine connect line: found %v at %v, want it at %v", ok, r.Level, slog.LevelInfo)
	}
}

// TestDriverLogsRefusals: the worker logs why the orchestrator refused it at
// the socket (SPEC §9, §10): a refused upgrade's reason from the 503's body,
// and a close frame's code and reason; both as warnings, and it keeps
// retrying (neither is fatal).
func TestDriverLogsRefusals(t *testing.T) {
	var mu sync.Mutex
	dials := 0
	up := websocket.Upgrader{}
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		mu.Lock()
		dials++
		n := dials
		mu.Unlock()
		if n == 1 {
			http.Error(rw, "too many connections without an accepted hello from 127.0.0.1 (32); try again later", http.StatusServiceUnavailable)
			return
		}
		ws, err := up.Upgrade(rw, r, nil)
		if err != nil {
			return
		}
		defer ws.Close()
		ws.ReadMessage() // the Hello
		ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseTryAgainLater, "too many worker connections (1024); try again later"), time.Now().Add(time.Second))
		ws.ReadMessage()
	}))
	defer srv.Close()
	rec := &levelRecorder{added: make(chan struct{}, 1)}
	d, err := New(Options{
		URL:            "ws" + strings.TrimPrefix(srv.URL, "http") + "/control",
		Config:         core.WorkerConfig{Name: "w1", Token: "t1.00", Slots: 1},
		Logger:         slog.New(rec),
		NoStepEndpoint: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.Run(ctx)
	}()
	defer func() {
		cancel()
		<-done
	}()
	deadline := time.After(30 * time.Second)
	for _, want := range []struct {
		text  string
		level slog.Level
	}{
		{`503 Service Unavailable): "too many connections without an accepted hello from 127.0.0.1 (32); try again later"`, slog.LevelWarn},
		{"connection lost: websocket: close 1013: too many worker connections (1024); try again later", slog.LevelWarn},
		{"next dial in", slog.LevelInfo}, // it backs off: a 1013 is retried, never at once
	} {
		for {
			if r, ok := rec.find(want.text); ok {
				if r.Level != want.level {
					t.Errorf("%q logged at %v, want %v (SPEC §10)", want.text, r.Level, want.level)
				}
				break
			}
			select {
			case <-rec.added:
			case <-deadline:
				rec.mu.Lock()
				for _, r := range rec.records {
					t.Logf("%v %s", r.Level, r.Message)
				}
				rec.mu.Unlock()
				t.Fatalf("the worker never logged %q", want.text)
			}
		}
	}
}
