package orchestrator

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"testing"
	"time"
)

// An idle stream sends ": ping" comment lines, so proxies keep it open.
func TestStreamHeartbeat(t *testing.T) {
	old := streamHeartbeat
	streamHeartbeat = 10 * time.Millisecond
	defer func() { streamHeartbeat = old }()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	d, err := Start(Options{Addr: "127.0.0.1:0", StorePath: filepath.Join(t.TempDir(), "tether.db"),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), AdminToken: "tok-0123456789"})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	req, _ := http.NewRequestWithContext(ctx, "GET", d.APIURL()+"/events", nil)
	req.Header.Set("Authorization", "Bearer tok-0123456789")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	pings := 0
	for pings < 2 {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("after %d pings: %v", pings, err)
		}
		if line == ": ping\n" {
			pings++
		}
	}
}
