package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tether-run/tether/core"
)

func TestNewUUID(t *testing.T) {
	v4 := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	seen := map[string]bool{}
	for range 1000 {
		id, err := newUUID()
		if err != nil {
			t.Fatal(err)
		}
		if !v4.MatchString(id) {
			t.Fatalf("%q is not a version-4 UUID", id)
		}
		if seen[id] {
			t.Fatalf("%q drawn twice", id)
		}
		seen[id] = true
	}
}

func TestControlURL(t *testing.T) {
	for in, want := range map[string]string{
		"ws://h:1/control":  "ws://h:1/control",
		"wss://h/x":         "wss://h/x",
		"http://h:7420":     "ws://h:7420/control",
		"https://h:7420/":   "wss://h:7420/control",
		"127.0.0.1:7420":    "ws://127.0.0.1:7420/control",
		"ftp://h/control":   "",
		"ws:///nohost":      "",
		"http://[::1]:7420": "ws://[::1]:7420/control",
	} {
		got, err := controlURL(in)
		if (err != nil) != (want == "") || got != want {
			t.Errorf("controlURL(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

func writeFile(t *testing.T, name, src string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestConfigFileAndFlags(t *testing.T) {
	cfg := writeFile(t, "worker-config.yaml", `
url: ws://orch:7420/control
ca: tls/ca.pem
token: b1.abc
tags: [script, docker]
labels: {zone: eu}
platform: linux/amd64
slots: 3
ahead: 2
no_reconnect: true
max_reconnect_delay: 2s
output_cap: 2MiB
drain_timeout: 90s
`)
	s, _, _, err := parseConnect([]string{"--config", cfg}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := settings{URLs: []string{"ws://orch:7420/control"}, Token: "b1.abc", Name: "b1", Tags: []string{"script", "docker"},
		Labels: map[string]string{"zone": "eu"}, Platform: "linux/amd64", Slots: 3, Ahead: 2, NoReconnect: true, MaxReconnectDelay: 2 * time.Second, OutputCapBytes: 2 << 20,
		DrainTimeout: 90 * time.Second, CA: filepath.Join(filepath.Dir(cfg), "tls", "ca.pem")} // relative to the file
	if !reflect.DeepEqual(s, want) {
		t.Errorf("from the file:\n got %+v\nwant %+v", s, want)
	}
	// Flags given override the file; flags not given do not.
	s, format, _, err := parseConnect([]string{"--config", cfg, "--tags", "gpu", "--slots", "8", "--ahead", "5", "--name", "n",
		"--labels", "a=1, b = 2", "--no-reconnect=false", "--max-reconnect-delay", "750ms", "--log-format", "json", "--ca", "/etc/ca.pem", "--output-cap", "1048576",
		"--drain-timeout", "3m"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want.Ahead = 5
	want.Tags, want.Slots, want.Name, want.Labels, want.NoReconnect, want.CA = []string{"gpu"}, 8, "n", map[string]string{"a": "1", "b": "2"}, false, "/etc/ca.pem"
	want.MaxReconnectDelay, want.DrainTimeout = 750*time.Millisecond, 3*time.Minute
	want.OutputCapBytes = 1 << 20
	if !reflect.DeepEqual(s, want) || format != "json" {
		t.Errorf("flags over the file:\n got %+v %s\nwant %+v json", s, format, want)
	}
	// state_dir in the file is relative to it; --state-dir wins.
	sd := writeFile(t, "worker-config.yaml", "token: b1.abc\nstate_dir: state\n")
	if s, _, _, err := parseConnect([]string{"--config", sd}, io.Discard); err != nil || s.StateDir != filepath.Join(filepath.Dir(sd), "state") {
		t.Errorf("state_dir from the file: %q, %v", s.StateDir, err)
	}
	if s, _, _, err := parseConnect([]string{"--config", sd, "--state-dir", "/var/lib/w"}, io.Discard); err != nil || s.StateDir != "/var/lib/w" {
		t.Errorf("--state-dir over the file: %q, %v", s.StateDir, err)
	}
	// Ahead is bounded by 64 alone, not by the slots (SPEC §3): one slot may
	// hold 64 steps ahead.
	if s, _, _, err := parseConnect([]string{"--config", cfg, "--slots", "1", "--ahead", "64"}, io.Discard); err != nil || s.Slots != 1 || s.Ahead != 64 {
		t.Errorf("--slots 1 --ahead 64: slots %d ahead %d, err %v; want 1, 64, nil", s.Slots, s.Ahead, err)
	}
	// The benchmarking aid: --executor noop runs no process.
	s, _, _, err = parseConnect([]string{"--config", cfg, "--executor", "noop"}, io.Discard)
	if err != nil || !s.Noop {
		t.Errorf("--executor noop: Noop = %v, err %v; want true", s.Noop, err)
	}
}

// TestURLList: the orchestrators of a highly available group (SPEC §11) as
// a list in the config file, or --url repeated (which replaces the file's),
// each normalized, in the order given.
func TestURLList(t *testing.T) {
	cfg := writeFile(t, "worker-config.yaml", "token: b1.abc\nurl: [orch-a:7420, \"http://orch-b:7420\"]\n")
	s, _, _, err := parseConnect([]string{"--config", cfg}, io.Discard)
	if want := []string{"ws://orch-a:7420/control", "ws://orch-b:7420/control"}; err != nil || !reflect.DeepEqual(s.URLs, want) {
		t.Errorf("url list in the file: %q, %v; want %q", s.URLs, err, want)
	}
	s, _, _, err = parseConnect([]string{"--config", cfg, "--url", "ws://c:1/control", "--url", "d:2"}, io.Discard)
	if want := []string{"ws://c:1/control", "ws://d:2/control"}; err != nil || !reflect.DeepEqual(s.URLs, want) {
		t.Errorf("--url twice over the file: %q, %v; want %q", s.URLs, err, want)
	}
	if _, _, _, err := parseConnect([]string{"--config", cfg, "--url", "ws://c:1/control", "--url", "ftp://x"}, io.Discard); err == nil {
		t.Error("a bad second --url: no error")
	}
}

func TestConfigFileErrors(t *testing.T) {
	for name, c := range map[string]struct{ src, want string }{
		"unknown key": {"token: a.b\nslot: 2\n", "worker-config.yaml:2: unknown key \"slot\""},
		"bad slots":   {"token: a.b\nslots: many\n", "worker-config.yaml:2: slots must be"},
		"bad ahead":   {"token: a.b\nahead: 65\n", "worker-config.yaml:2: ahead must be"},
		"bad bool":    {"no_reconnect: maybe\n", "worker-config.yaml:1: no_reconnect"},
		"bad delay":   {"max_reconnect_delay: soon\n", "worker-config.yaml:1: max_reconnect_delay must be a duration"},
		"tiny delay":  {"max_reconnect_delay: 1ms\n", "worker-config.yaml:1: max_reconnect_delay must be a duration"},
		"bad drain":   {"drain_timeout: 0s\n", "worker-config.yaml:1: drain_timeout must be a duration"},
		"bad tags":    {"tags: {a: b}\n", "worker-config.yaml:1: tags must be a list"},
		"bad cap":     {"output_cap: lots\n", "worker-config.yaml:1: output_cap must be a size"},
		"tiny cap":    {"output_cap: 100\n", "worker-config.yaml:1: output_cap must be a size"},
		"not a map":   {"- a\n", "worker-config.yaml:1: worker config must be a mapping"},
		"twice":       {"name: a\nname: b\n", "worker-config.yaml:2: key \"name\" appears twice"},
		"no urls":     {"url: []\n", "worker-config.yaml:1: url must be"},
	} {
		p := writeFile(t, "worker-config.yaml", c.src)
		_, _, _, err := parseConnect([]string{"--config", p}, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want it to contain %q", name, err, c.want)
		}
	}
}

func TestUsageExitCodes(t *testing.T) {
	t.Setenv("STATE_DIRECTORY", t.TempDir()) // never the user's own
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	missing := filepath.Join(t.TempDir(), "nope.yaml")
	for _, args := range [][]string{
		{},
		{"bogus"},
		{"connect"}, // no token, and no saved identity
		{"connect", "--token", "a.b", "--state-dir="},
		{"connect", "--token", "no-dot"},
		{"connect", "--token", "a.b", "--slots", "0"},
		{"connect", "--token", "a.b", "--slots", "100", "--ahead", "65"}, // beyond 64
		{"connect", "--token", "a.b", "--ahead", "65"},
		{"connect", "--token", "a.b", "--ahead", "-1"},
		{"connect", "--token", "a.b", "--single-use", "--ahead", "1"},
		{"connect", "--token", "a.b", "--max-reconnect-delay", "0s"},
		{"connect", "--token", "a.b", "--max-reconnect-delay", "2h"},
		{"connect", "--token", "a.b", "--max-reconnect-delay", "soon"},
		{"connect", "--token", "a.b", "--drain-timeout", "0s"},
		{"connect", "--token", "a.b", "--drain-timeout", "48h"},
		{"connect", "--token", "a.b", "--labels", "novalue"},
		{"connect", "--token", "a.b", "--log-format", "xml"},
		{"connect", "--token", "a.b", "--url", "ftp://x"},
		{"connect", "--token", "a.b", "--executor", "bash"},
		{"connect", "--token", "a.b", "--output-cap", "0"},
		{"connect", "--token", "a.b", "--output-cap", "2TiB"},
		{"connect", "--token", "a.b", "--output-cap", "64MB"},
		{"connect", "--token", "a.b", "extra-arg"},
		{"connect", "--nope"},
		{"connect", "--token", "a.b", "--config", missing},
	} {
		var stderr bytes.Buffer
		if code := run(ctx, args, io.Discard, &stderr); code != exitUsage {
			t.Errorf("worker %q: exit %d, want %d (usage); stderr: %s", args, code, exitUsage, stderr.String())
		}
	}
	for _, args := range [][]string{{"--help"}, {"help"}, {"connect", "--help"}, {"help", "connect"}} {
		var stdout bytes.Buffer
		if code := run(ctx, args, &stdout, io.Discard); code != exitOK {
			t.Errorf("worker %q: exit %d, want 0", args, code)
		}
		if !strings.Contains(stdout.String(), "Example:") || !strings.Contains(stdout.String(), "Exit codes:") {
			t.Errorf("worker %q: help lacks an example or the exit codes:\n%s", args, stdout.String())
		}
	}
	if exitDisconnected != 2 || exitRefused != 3 || exitUsage == exitDisconnected {
		t.Errorf("exit codes drifted from core: disconnected %d refused %d usage %d", exitDisconnected, exitRefused, exitUsage)
	}
}

// Under --no-reconnect a worker that cannot reach the orchestrator exits 2
// (core.WorkerExitDisconnected) instead of retrying.
func TestNoReconnectExitsDisconnected(t *testing.T) {
	t.Setenv("STATE_DIRECTORY", t.TempDir()) // never the user's own
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	// A listener that hangs up on every connection: the WebSocket handshake
	// fails, deterministically (a closed port could be taken by another test).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	addr := ln.Addr().String()
	var stderr bytes.Buffer
	code := run(ctx, []string{"connect", "--url", "ws://" + addr + "/control", "--token", "a.b", "--no-reconnect"}, io.Discard, &stderr)
	if code != core.WorkerExitDisconnected {
		t.Fatalf("exit %d, want %d; stderr:\n%s", code, core.WorkerExitDisconnected, stderr.String())
	}
	if ctx.Err() != nil {
		t.Fatalf("the worker only stopped at the test's deadline")
	}
}

// The enrollment token comes from $TETHER_WORKER_TOKEN, --token-file or
// --token (which only warns: ps shows it); the flags override the variable
// and the variable the config file; a bad or empty file is refused.
func TestTokenSources(t *testing.T) {
	defer func(f func(string) string) { getenv = f }(getenv)
	env := ""
	getenv = func(k string) string {
		if k == workerTokenEnv {
			return env
		}
		return ""
	}
	cfg := writeFile(t, "worker-config.yaml", "token: conf.secret\n")
	file := writeFile(t, "token", "file.secret\n")
	empty := writeFile(t, "empty", " \n")
	for _, c := range []struct {
		env   string
		args  []string
		want  string
		argv  bool
		isErr bool
	}{
		{"", nil, "conf.secret", false, false},
		{" env.secret\n", nil, "env.secret", false, false},
		{"env.secret", []string{"--token-file", file}, "file.secret", false, false},
		{"env.secret", []string{"--token", "argv.secret"}, "argv.secret", true, false},
		{"", []string{"--token", "a.b", "--token-file", file}, "", false, true},
		{"", []string{"--token-file", empty}, "", false, true},
		{"", []string{"--token-file", file + ".missing"}, "", false, true},
		{"no-dot", nil, "", false, true},
	} {
		env = c.env
		s, _, _, err := parseConnect(append([]string{"--config", cfg}, c.args...), io.Discard)
		if (err != nil) != c.isErr || err == nil && (s.Token != c.want || s.TokenOnArgv != c.argv) {
			t.Errorf("env %q, %q: token %q (on argv %v), %v; want %q (on argv %v), error %v", c.env, c.args, s.Token, s.TokenOnArgv, err, c.want, c.argv, c.isErr)
		}
	}
	// --token is warned about, in the log.
	var stderr bytes.Buffer
	env = ""
	ctx, cancel := context.WithCancel(t.Context())
	cancel() // the worker stops at once: only the warning matters
	runWith(ctx, nil, []string{"connect", "--config", cfg, "--token", "a.b", "--url", "ws://127.0.0.1:1/control", "--state-dir", t.TempDir(), "--no-reconnect"}, io.Discard, &stderr)
	if !strings.Contains(stderr.String(), "process list (ps)") {
		t.Errorf("--token is not warned about:\n%s", stderr.String())
	}
}

// TestCPUProfile: $TETHER_WORKER_CPUPROFILE's file holds a profile once
// stopped (gzip'd, as runtime/pprof writes it), and an empty name starts
// none.
func TestCPUProfile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "w.cpu")
	stop, err := cpuProfile(path)
	if err != nil {
		t.Fatal(err)
	}
	stop()
	b, err := os.ReadFile(path)
	if err != nil || len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
		t.Fatalf("the profile file holds %d bytes (%v), not a gzip'd profile", len(b), err)
	}
	stop, err = cpuProfile("")
	if err != nil {
		t.Fatal(err)
	}
	stop()
}
