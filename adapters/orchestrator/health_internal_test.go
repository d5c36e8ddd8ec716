package orchestrator

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
)

func readyzOf(d *Driver) (int, string) {
	rec := httptest.NewRecorder()
	d.readyz(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	return rec.Code, rec.Body.String()
}

// TestReadyzStates: /readyz is 503 with its reason before the state is
// restored, while the loop's input queue is full, once shutting down and
// once the loop stopped; 200 only while serving.
func TestReadyzStates(t *testing.T) {
	d := &Driver{quit: make(chan struct{}), ended: make(chan struct{}), inputs: make(chan input, 1)}
	check := func(when string, code int, reason string) {
		t.Helper()
		got, body := readyzOf(d)
		if got != code || !strings.Contains(body, reason) {
			t.Errorf("%s: /readyz = %d %q, want %d with %q", when, got, body, code, reason)
		}
	}
	check("before restore", http.StatusServiceUnavailable, "not restored")
	d.ready.Store(true)
	check("serving", http.StatusOK, "ok")
	d.inputs <- tick{}
	check("queue full", http.StatusServiceUnavailable, "queue is full")
	<-d.inputs
	d.stopping.Store(true)
	check("shutting down", http.StatusServiceUnavailable, "shutting down")

	// A real driver: ready once Start returns, not ready once closed.
	d, err := Start(Options{Addr: "127.0.0.1:0", StorePath: filepath.Join(t.TempDir(), "tether.db"), Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	check("started", http.StatusOK, "ok")
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	check("closed", http.StatusServiceUnavailable, "stopped")
}
