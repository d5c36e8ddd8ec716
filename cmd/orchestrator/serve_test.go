package main

// serve refuses configurations that make no sense, binds before it creates
// anything, and names the file and the other process when the store is
// locked (SPEC §12).

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strings"
	"testing"
	"time"
)

// runServeInProcess runs `orchestrator serve` in this process with args and returns
// its exit code, stdout and stderr. It is for invocations that must fail
// before serving: a test that expects it to serve would hang until ctx ends.
func runServeInProcess(t *testing.T, ctx context.Context, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(ctx, append([]string{"serve"}, args...), &stdout, &stderr, func(string) string { return "" })
	return code, stdout.String(), stderr.String()
}

// Each recovery setting that makes no sense alone or with the others is
// refused, naming the key and what to change, before anything is created.
func TestServeRefusesSenselessConfig(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	for name, c := range map[string]struct{ recovery, want string }{
		// 60 s < 2 × 40 s: a worker that is one heartbeat late is stale.
		"timeout under two intervals": {"  heartbeat_interval_secs: 40\n  heartbeat_timeout_secs: 60\n  sweep_interval_secs: 30\n",
			"heartbeat_timeout_secs (60) is shorter than 2 heartbeat intervals (heartbeat_interval_secs 40 × 2 = 80): every worker would go stale between two heartbeats; raise heartbeat_timeout_secs to at least 80 or lower heartbeat_interval_secs to at most 30"},
		"interval at the timeout": {"  heartbeat_interval_secs: 120\n",
			"heartbeat_interval_secs (2m0s) must be shorter than heartbeat_timeout_secs (2m0s)"},
		"sweep slower than the timeout": {"  heartbeat_timeout_secs: 90\n  sweep_interval_secs: 300\n",
			"sweep_interval_secs (300) is longer than heartbeat_timeout_secs (90): a stale worker would be found only at the next sweep, up to 300 s late; lower sweep_interval_secs to at most 90"},
		"default sweep, short timeout": {"  heartbeat_timeout_secs: 50\n  heartbeat_interval_secs: 20\n",
			"sweep_interval_secs (60) is longer than heartbeat_timeout_secs (50)"},
		"overflowing number": {"  unmatched_step_timeout_secs: 99999999999\n",
			"unmatched_step_timeout_secs is 99999999999 seconds, at most 604800 (7 days); lower it"},
		"a year":   {"  dispatch_ack_secs: 31536000\n", "dispatch_ack_secs is 31536000 seconds, at most 604800"},
		"negative": {"  sweep_interval_secs: -5\n", `sweep_interval_secs must be a positive whole number of seconds, not "-5"`},
	} {
		dir := t.TempDir()
		cfg := filepath.Join(dir, "server-config.yaml")
		if err := os.WriteFile(cfg, []byte("recovery:\n"+c.recovery), 0o600); err != nil {
			t.Fatal(err)
		}
		dataDir := filepath.Join(dir, "data")
		code, stdout, stderr := runServeInProcess(t, ctx, "--config", cfg, "--data-dir", dataDir, "--addr", "127.0.0.1:0")
		if code != exitUsage || !strings.Contains(stderr, c.want) || !strings.Contains(stderr, "server-config.yaml") {
			t.Errorf("%s: exit %d, stderr:\n%s\nwant exit %d and %q", name, code, stderr, exitUsage, c.want)
		}
		if stdout != "" || exists(dataDir) {
			t.Errorf("%s: refused config, yet stdout %q and data dir created: %v", name, stdout, exists(dataDir))
		}
	}
	// The defaults and sensible combinations pass.
	for _, ok := range []string{"", "  heartbeat_interval_secs: 3\n  dispatch_ack_secs: 1\n", "  heartbeat_timeout_secs: 60\n  sweep_interval_secs: 60\n  heartbeat_interval_secs: 30\n"} {
		if _, err := loadServerConfig("c.yaml", []byte("recovery:\n"+ok+"  unmatched_step_timeout_secs: 30\n")); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	// Flags: a listen address without a port, an empty data directory.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--addr", "localhost", "--data-dir", filepath.Join(t.TempDir(), "d")}, `listen address "localhost" (--addr or addr:): want HOST:PORT`},
		{[]string{"--addr", "127.0.0.1:0", "--data-dir", ""}, "the data directory (--data-dir or data_dir:) is empty"},
	} {
		code, stdout, stderr := runServeInProcess(t, ctx, c.args...)
		if code != exitUsage || !strings.Contains(stderr, c.want) || stdout != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit %d and %q", c.args, code, stdout, stderr, exitUsage, c.want)
		}
	}
}

// serve on a port already in use fails before it creates the data
// directory, the store or an admin token, and says why.
func TestServeBindsFirst(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dataDir := filepath.Join(t.TempDir(), "data")
	code, stdout, stderr := runServeInProcess(t, ctx, "--addr", ln.Addr().String(), "--data-dir", dataDir)
	want := "cannot listen on " + ln.Addr().String() + ": the address is already in use"
	if code != exitError || !strings.Contains(stderr, want) || !strings.Contains(stderr, "nothing was created") {
		t.Errorf("exit %d, stderr %q; want exit %d and %q", code, stderr, exitError, want)
	}
	if stdout != "" {
		t.Errorf("stdout %q: nothing may be printed (no admin token) when the port is in use", stdout)
	}
	if exists(dataDir) {
		entries, _ := os.ReadDir(dataDir)
		t.Errorf("the data directory was created (%d entries): the store and the admin token must not exist before the listener", len(entries))
	}
}

// Two serves on one data directory: the second names the store file and
// says another process holds it (not bbolt's bare "timeout"), creates and
// prints nothing, and the first keeps serving.
func TestServeStoreLocked(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binaries")
	}
	ctx, cancel := context.WithTimeout(t.Context(), faultTimeout)
	defer cancel()
	orchBin, _ := buildBinaries(t, ctx)
	dataDir := filepath.Join(t.TempDir(), "data")
	first := startServe(t, ctx, orchBin, "orchestrator serve (first)", "127.0.0.1:0", dataDir)
	admin, err := os.ReadFile(filepath.Join(dataDir, adminTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	second := start(t, ctx, "orchestrator serve (second)", orchBin, "serve", "--addr", "127.0.0.1:0", "--data-dir", dataDir)
	code := second.wait(t, ctx)
	storePath := filepath.Join(dataDir, storeFile)
	stderr := second.stderr.String()
	for _, want := range []string{"locked by another process", storePath, "another orchestrator serving this data directory", "stop that process or use another data directory"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("second serve's error lacks %q:\n%s", want, stderr)
		}
	}
	if code != exitError || strings.Contains(second.stdout.String(), "Admin token") {
		t.Errorf("second serve: exit %d, stdout %q; want exit %d, no admin token", code, second.stdout, exitError)
	}
	apiClient{t: t, ctx: ctx, base: "http://" + first.addr + "/api", token: strings.TrimSpace(string(admin))}.workers()
}

// TestRetentionSetting: --retain and the config file's retention: take a Go
// duration or whole days, at least a minute; anything else is refused with
// the value named.
func TestRetentionSetting(t *testing.T) {
	for in, want := range map[string]time.Duration{"720h": 720 * time.Hour, "30d": 30 * 24 * time.Hour, "1m": time.Minute, "90m": 90 * time.Minute} {
		if got, err := parseRetention(in); err != nil || got != want {
			t.Errorf("parseRetention(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "59s", "0d", "-1h", "30 days", "d", "1.5d"} {
		if _, err := parseRetention(bad); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", bad)) {
			t.Errorf("parseRetention(%q): err %v, want a refusal naming it", bad, err)
		}
	}
	cfg, err := loadServerConfig("c.yaml", []byte("retention: 14d\n"))
	if err != nil || cfg.Retention != 14*24*time.Hour {
		t.Fatalf("retention: 14d → %v, %v", cfg.Retention, err)
	}
	if _, err := loadServerConfig("c.yaml", []byte("retention: 10s\n")); err == nil || !strings.Contains(err.Error(), "c.yaml:1: retention:") {
		t.Fatalf("retention: 10s accepted or badly refused: %v", err)
	}
	if cfg := defaultServerConfig(); cfg.Retention != 720*time.Hour {
		t.Fatalf("default retention %v, want 720h", cfg.Retention)
	}
}

// serve --heap-floor keeps the floor while it serves (the collector's
// percentage raised over this test process's small heap) and gives GOGC's
// back when it stops (SPEC §12).
func TestServeKeepsHeapFloor(t *testing.T) {
	gogc := func() uint64 {
		s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
		metrics.Read(s)
		return s[0].Value.Uint64()
	}
	p0 := gogc()
	if p0 > 1000 { // GOGC=off, or so high that a 256 MiB floor over this test's heap need not raise it
		t.Fatalf("the collector's percentage is %d before serve: run this test with GOGC unset or at most 1000", p0)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	serving, stop := context.WithCancel(ctx)
	done := make(chan int, 1)
	go func() {
		var out, errs bytes.Buffer
		done <- run(serving, []string{"serve", "--addr", "127.0.0.1:0", "--data-dir", t.TempDir(), "--heap-floor", "268435456"}, &out, &errs, func(string) string { return "" })
	}()
	for p := gogc(); p <= p0; p = gogc() {
		select {
		case code := <-done:
			t.Fatalf("serve exited %d before keeping a floor", code)
		case <-ctx.Done():
			t.Fatalf("the collector's percentage is still %d: serve keeps no floor", p)
		case <-time.After(10 * time.Millisecond):
			runtime.GC()
		}
	}
	stop()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("serve exited %d when stopped", code)
		}
	case <-ctx.Done():
		t.Fatal("serve did not stop")
	}
	if p := gogc(); p != p0 {
		t.Errorf("after serve stopped the collector's percentage is %d: want the one it had, %d, back", p, p0)
	}
}
