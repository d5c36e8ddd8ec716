package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"
)

// serve with --log-format json and $TETHER_METRICS_TOKEN: every stderr line
// is JSON, the probes answer without a token, and /metrics wants the token
// (SPEC §16).
func TestServeProbesMetricsTokenAndJSONLogs(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), e2eTimeout)
	defer cancel()
	sctx, stop := context.WithCancel(ctx)
	var stdout, stderr syncBuffer
	getenv := func(k string) string {
		if k == metricsTokenEnv {
			return "scrape-me"
		}
		return ""
	}
	code := make(chan int, 1)
	go func() {
		code <- run(sctx, []string{"serve", "--addr", "127.0.0.1:0", "--data-dir", t.TempDir(), "--log-format", "json"}, &stdout, &stderr, getenv)
	}()
	listening := regexp.MustCompile(`listening on (127\.0\.0\.1:\d+)`)
	var addr string
	for addr == "" {
		if m := listening.FindStringSubmatch(stdout.String()); m != nil {
			addr = m[1]
			break
		}
		select {
		case c := <-code:
			t.Fatalf("serve exited %d:\n%s", c, stderr.String())
		case <-ctx.Done():
			t.Fatalf("serve did not start:\n%s", stderr.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	get := func(path, token string) int {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, c := range []struct {
		path, token string
		want        int
	}{{"/livez", "", 200}, {"/readyz", "", 200}, {"/metrics", "", 401}, {"/metrics", "wrong", 401}, {"/metrics", "scrape-me", 200}} {
		if got := get(c.path, c.token); got != c.want {
			t.Errorf("GET %s with token %q = %d, want %d", c.path, c.token, got, c.want)
		}
	}
	stop()
	if c := <-code; c != exitOK {
		t.Errorf("serve exited %d on shutdown, want 0", c)
	}
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	for _, line := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil || m["msg"] == nil {
			t.Errorf("--log-format json wrote a line that is not a JSON record: %q", line)
		}
	}
	if !strings.Contains(stderr.String(), `"msg":"control plane listening"`) {
		t.Errorf("no JSON line for the listening control plane:\n%s", stderr.String())
	}
}
