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

// An idle stream sends ": ping" comment lines, so proxies keep it open;
// the per-write deadline (here far shorter than the pause between pings)
// does not cut a stream that pauses, over HTTP/1.1 or HTTP/2.
func TestStreamHeartbeat(t *testing.T) {
	old := streamHeartbeat
	streamHeartbeat = 200 * time.Millisecond
	defer func() { streamHeartbeat = old }()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	d, err := Start(Options{Addr: "127.0.0.1:0", StorePath: filepath.Join(t.TempDir(), "tether.db"),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), AdminToken: "tok-0123456789", WriteTimeout: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	h2 := &http.Transport{Protocols: new(http.Protocols)}
	h2.Protocols.SetUnencryptedHTTP2(true)
	for name, hc := range map[string]*http.Client{"HTTP/1.1": http.DefaultClient, "h2c": {Transport: h2}} {
		req, _ := http.NewRequestWithContext(ctx, "GET", d.APIURL()+"/events", nil)
		req.Header.Set("Authorization", "Bearer tok-0123456789")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(resp.Body)
		pings := 0
		for pings < 3 {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("%s: after %d pings: %v", name, pings, err)
			}
			if line == ": ping\n" {
				pings++
			}
		}
		resp.Body.Close()
	}
}
