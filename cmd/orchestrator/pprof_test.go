package main

import (
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
)

// serve --pprof serves the runtime profiles on loopback only; any other
// address is a usage error naming why, and nothing listens.
func TestPprofLoopbackOnly(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, addr := range []string{"0.0.0.0:0", ":0", "192.0.2.1:0", "example.com:0", "no-port"} {
		_, stop, err := servePprof(addr, log)
		if err == nil {
			stop()
			t.Errorf("--pprof %s: served, want a usage error", addr)
		} else if exitCode(err) != exitUsage {
			t.Errorf("--pprof %s: %v (exit %d), want a usage error (exit %d)", addr, err, exitCode(err), exitUsage)
		}
	}
	at, stop, err := servePprof("127.0.0.1:0", log)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	resp, err := http.Get("http://" + at + "/debug/pprof/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "heap") {
		t.Fatalf("GET /debug/pprof/: %s\n%s", resp.Status, body)
	}
}
