package main

import (
	"bytes"
	"context"
	flag "github.com/spf13/pflag"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tether-run/tether/adapters/workflow"
)

// Every example parses with adapters/workflow, and each shows what it is for.
func TestExamplesParse(t *testing.T) {
	files, err := filepath.Glob("examples/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		spec, err := workflow.Parse(f, src)
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		found[filepath.Base(f)] = true
		switch filepath.Base(f) {
		case "dag.yaml":
			deps := 0
			for _, s := range spec.Steps {
				deps += len(s.DependsOn)
			}
			if len(spec.Steps) < 3 || deps < 2 {
				t.Errorf("dag.yaml: %d steps, %d dependencies: not much of a DAG", len(spec.Steps), deps)
			}
		case "foreach.yaml":
			ok := false
			for _, s := range spec.Steps {
				ok = ok || (len(s.ForEach) > 1 && s.Concurrency > 0 && s.Concurrency < len(s.ForEach))
			}
			if !ok {
				t.Errorf("foreach.yaml has no forEach step with a concurrency cap")
			}
		case "deploy.yaml":
			if g := spec.Group; g.Name == "" || !g.CancelInProgress || spec.Steps[1].Group.Name == "" {
				t.Errorf("deploy.yaml: run group %+v, step group %+v: want both", g, spec.Steps[1].Group)
			}
		case "writes.yaml":
			writes, noWrites := 0, 0
			for _, s := range spec.Steps {
				if s.Writes {
					writes++
				} else {
					noWrites++
				}
			}
			if writes == 0 || noWrites == 0 || !strings.Contains(string(src), "writes: true") {
				t.Errorf("writes.yaml: %d write-bearing, %d no-write steps; want both", writes, noWrites)
			}
		case "retries.yaml":
			ok := false
			for _, s := range spec.Steps {
				ok = ok || (s.Retry != nil && s.Writes && s.Idempotent)
			}
			if !ok {
				t.Errorf("retries.yaml has no idempotent write-bearing step with a retry policy")
			}
		}
	}
	for _, want := range []string{"dag.yaml", "foreach.yaml", "writes.yaml", "retries.yaml", "deploy.yaml"} {
		if !found[want] {
			t.Errorf("examples/%s is missing or does not parse", want)
		}
	}
}

func TestServerConfigFile(t *testing.T) {
	cfg, err := loadServerConfig("/etc/tether/server-config.yaml", nil)
	if err != nil || !reflect.DeepEqual(cfg, defaultServerConfig()) {
		t.Errorf("an empty file: %+v, %v; want the defaults", cfg, err)
	}
	def := defaultServerConfig()
	if def.HeartbeatTimeout != 120*time.Second || def.SweepInterval != 60*time.Second || def.UnmatchedTimeout != 30*time.Second ||
		def.Addr != "127.0.0.1:7420" || def.DataDir != "./tether-data" {
		t.Errorf("defaults %+v are not SPEC §12's (120/60/30) and the documented addr/data dir", def)
	}
	if def.HeapFloor != 0 {
		t.Errorf("default heap floor %d bytes: want none (SPEC §12)", def.HeapFloor)
	}
	if def.HeartbeatInterval != 30*time.Second || def.DispatchAck != 10*time.Second {
		t.Errorf("defaults %+v: want heartbeat interval 30s and dispatch ack 10s (SPEC §12)", def)
	}
	src := "addr: 0.0.0.0:9000\ndata_dir: state\nrecovery:\n  heartbeat_timeout_secs: 90\n  sweep_interval_secs: 15\n  unmatched_step_timeout_secs: 5\n" +
		"  heartbeat_interval_secs: 2\n  dispatch_ack_secs: 3\n" +
		"limits:\n  max_submit_body_bytes: 65536\nmemory:\n  heap_floor_bytes: 134217728\n"
	cfg, err = loadServerConfig("/etc/tether/server-config.yaml", []byte(src))
	want := serverConfig{Addr: "0.0.0.0:9000", DataDir: "/etc/tether/state",
		HeartbeatTimeout: 90 * time.Second, SweepInterval: 15 * time.Second, UnmatchedTimeout: 5 * time.Second,
		HeartbeatInterval: 2 * time.Second, DispatchAck: 3 * time.Second,
		MaxSubmitBody: 65536, HeapFloor: 128 << 20}
	want.MaxConns, want.MaxUnauthConns, want.MaxUnauthConnsPerAddr, want.HelloTimeout = def.MaxConns, def.MaxUnauthConns, def.MaxUnauthConnsPerAddr, def.HelloTimeout
	want.Retention = def.Retention // the file says none: the default (SPEC §7a)
	if err != nil || !reflect.DeepEqual(cfg, want) {
		t.Errorf("full file: %+v, %v; want %+v", cfg, err, want)
	}
	cfg, _ = loadServerConfig("c.yaml", []byte("recovery:\n  sweep_interval_secs: 10\n"))
	if cfg.SweepInterval != 10*time.Second || cfg.HeartbeatTimeout != 120*time.Second || cfg.UnmatchedTimeout != 30*time.Second {
		t.Errorf("a partial recovery section must keep the other defaults: %+v", cfg)
	}
	cfg, err = loadServerConfig("/etc/tether/c.yaml", []byte("tls:\n  cert_file: tls/s.crt\n  key_file: /keys/s.key\n"))
	if err != nil || cfg.TLSCert != "/etc/tether/tls/s.crt" || cfg.TLSKey != "/keys/s.key" {
		t.Errorf("tls section: %+v, %v; want paths relative to the file's directory", cfg, err)
	}
	for name, c := range map[string]struct{ src, want string }{
		"tls without a key":    {"tls:\n  cert_file: a.crt\n", "c.yaml:2: tls needs both cert_file and key_file"},
		"unknown tls key":      {"tls:\n  cert: a.crt\n", `c.yaml:2: tls: unknown key "cert"`},
		"unknown top key":      {"addr: x:1\nlisten: y\n", `c.yaml:2: server config: unknown key "listen"`},
		"unknown recovery key": {"recovery:\n  heartbeat_timeout_secs: 1\n  grace_secs: 5\n", `c.yaml:3: recovery: unknown key "grace_secs"`},
		"not a number":         {"recovery:\n  sweep_interval_secs: often\n", "c.yaml:2: sweep_interval_secs must be a positive whole number"},
		"zero":                 {"recovery:\n  unmatched_step_timeout_secs: 0\n", "c.yaml:2: unmatched_step_timeout_secs must be"},
		"zero dispatch ack":    {"recovery:\n  dispatch_ack_secs: 0\n", "c.yaml:2: dispatch_ack_secs must be"},
		"heartbeat too slow":   {"recovery:\n  heartbeat_interval_secs: 120\n", "heartbeat_interval_secs (2m0s) must be shorter than heartbeat_timeout_secs (2m0s)"},
		"not a mapping":        {"recovery: 5\n", "c.yaml:1: recovery must be a mapping"},
		"repeated key":         {"addr: a:1\naddr: b:2\n", `c.yaml:2: server config: key "addr" appears twice`},
		"empty addr":           {"addr:\n", "c.yaml:1: addr must be a non-empty string"},
		"syntax":               {"addr: [\n", "c.yaml"},
		"negative heap floor":  {"memory:\n  heap_floor_bytes: -1\n", "c.yaml:2: heap_floor_bytes must be a whole number of bytes from 0 (off) to 1099511627776"},
		"unknown memory key":   {"memory:\n  gogc: 400\n", `c.yaml:2: memory: unknown key "gogc"`},
		"empty heap floor":     {"memory:\n  heap_floor_bytes:\n", "c.yaml:2: heap_floor_bytes must be a whole number of bytes"},
	} {
		_, err := loadServerConfig("c.yaml", []byte(c.src))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want it to contain %q", name, err, c.want)
		}
	}
}

// Flags given on the command line override the config file.
func TestServeFlagsOverrideConfig(t *testing.T) {
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "server-config.yaml")
	os.WriteFile(cfgPath, []byte("addr: 10.0.0.1:1\ndata_dir: d\nrecovery:\n  sweep_interval_secs: 7\n"), 0o600)
	resolve := func(args ...string) (serverConfig, error) {
		o := &options{}
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		serveCmd.flags(fs, o)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return resolveServeConfig(&env{opts: o, flags: fs})
	}
	cfg, err := resolve("--config", cfgPath, "--addr", "127.0.0.1:0")
	if err != nil || cfg.Addr != "127.0.0.1:0" || cfg.DataDir != filepath.Join(dir, "d") || cfg.SweepInterval != 7*time.Second {
		t.Errorf("got %+v, %v", cfg, err)
	}
	cfg, err = resolve("--config", cfgPath, "--data-dir", "/x")
	if err != nil || cfg.Addr != "10.0.0.1:1" || cfg.DataDir != "/x" {
		t.Errorf("got %+v, %v", cfg, err)
	}
	if _, err := resolve("--config", cfgPath, "--tls-cert", "/c.pem"); exitCode(err) != exitUsage || !strings.Contains(err.Error(), "--tls-key") {
		t.Errorf("--tls-cert without --tls-key: %v, want a usage error", err)
	}
	if cfg, err := resolve("--config", cfgPath, "--tls-cert", "/c.pem", "--tls-key", "/k.pem"); err != nil || cfg.TLSCert != "/c.pem" || cfg.TLSKey != "/k.pem" {
		t.Errorf("TLS flags: %+v, %v", cfg, err)
	}
	if cfg, err := resolve("--config", cfgPath, "--heap-floor", "134217728"); err != nil || cfg.HeapFloor != 128<<20 {
		t.Errorf("--heap-floor 134217728: %+v, %v", cfg, err)
	}
	if _, err := resolve("--config", cfgPath, "--heap-floor", "-5"); exitCode(err) != exitUsage || !strings.Contains(err.Error(), "--heap-floor -5: want 0 (off)") {
		t.Errorf("--heap-floor -5: %v, want a usage error", err)
	}
	if _, err := resolve("--config", filepath.Join(dir, "missing.yaml")); exitCode(err) != exitUsage {
		t.Errorf("an explicit missing config file: %v (exit %d), want a usage error", err, exitCode(err))
	}
	os.WriteFile(cfgPath, []byte("bogus: 1\n"), 0o600)
	if _, err := resolve("--config", cfgPath); exitCode(err) != exitUsage || !strings.Contains(err.Error(), "server-config.yaml:1") {
		t.Errorf("a bad config file: %v (exit %d), want a usage error with its line", err, exitCode(err))
	}
}

func TestAdminTokenFile(t *testing.T) {
	dir := t.TempDir()
	tok, created, err := ensureAdminToken(dir)
	if err != nil || !created || len(tok) != 64 {
		t.Fatalf("first: %q created=%v err=%v; want 64 hex characters, created", tok, created, err)
	}
	fi, err := os.Stat(filepath.Join(dir, adminTokenFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("admin-token mode %v (%v), want 0600", fi.Mode().Perm(), err)
	}
	tok2, created, err := ensureAdminToken(dir)
	if err != nil || created || tok2 != tok {
		t.Errorf("second: %q created=%v err=%v; want the same token, not created", tok2, created, err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("data dir holds %d entries, want only admin-token (no temp files left)", len(entries))
	}
	os.WriteFile(filepath.Join(dir, adminTokenFile), []byte("\n"), 0o600)
	if _, _, err := ensureAdminToken(dir); err == nil {
		t.Errorf("an empty admin-token file must be an error, not silently replaced")
	}
}

// Flags may come before the command, between its arguments or after them;
// everything after "--" is an argument. Each placement reaches the command
// with the same flags and arguments.
func TestFlagPlacement(t *testing.T) {
	ctx := t.Context()
	for _, args := range [][]string{
		{"--url", "http://127.0.0.1:1", "data", "get", "d", "--timeout", "1s", "--admin-token", "t", "--", "-1"},
		{"data", "--url=http://127.0.0.1:1", "get", "--admin-token", "t", "d", "--timeout", "1s", "--", "-1"},
		{"data", "get", "d", "--", "-1", "--url", "http://127.0.0.1:1", "--admin-token", "t"},
	} {
		var stderr bytes.Buffer
		code := run(ctx, args, io.Discard, &stderr, func(string) string { return "" })
		want := exitError // the flags were taken: the orchestrator at port 1 is unreachable
		if slices.Contains(args[len(args)-4:], "--url") {
			// after "--" they are arguments: one too many
			want = exitUsage
		}
		if code != want {
			t.Errorf("%q: exit %d, want %d; stderr: %s", args, code, want, stderr.String())
		}
	}
}

// Every command explains itself with an example and the exit codes; usage
// mistakes exit 2.
func TestHelpAndUsage(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	noenv := func(string) string { return "" }
	for _, c := range commands {
		var out bytes.Buffer
		args := append(strings.Fields(c.path), "--help")
		if code := run(ctx, args, &out, io.Discard, noenv); code != exitOK {
			t.Errorf("%q: exit %d", args, code)
		}
		for _, want := range []string{"Usage: orchestrator " + c.path, "Example:", "Exit codes:", "--log-format"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("%q: help lacks %q:\n%s", args, want, out.String())
			}
		}
	}
	for _, args := range [][]string{{"--help"}, {"help"}, {"token", "--help"}, {"help", "run", "show"}} {
		var out bytes.Buffer
		if code := run(ctx, args, &out, io.Discard, noenv); code != exitOK || out.Len() == 0 {
			t.Errorf("%q: exit %d, output %d bytes", args, code, out.Len())
		}
	}
	empty := t.TempDir()
	for _, args := range [][]string{
		{},
		{"bogus"},
		{"token"},
		{"token", "bogus"},
		{"run", "show"},           // missing RUN
		{"run", "show", "a", "b"}, // too many
		{"run", "list", "--nope"}, // unknown flag
		{"token", "create", "x", "--ttl", "soon"},
		{"run", "list", "--data-dir", empty}, // no admin token anywhere
		{"run", "list", "--admin-token", "t", "--url", "ftp://x"},
		{"serve", "--log-format", "xml", "--data-dir", empty},
		{"serve", "--config", filepath.Join(empty, "missing.yaml"), "--data-dir", empty},
	} {
		var stderr bytes.Buffer
		if code := run(ctx, args, io.Discard, &stderr, noenv); code != exitUsage {
			t.Errorf("%q: exit %d, want %d; stderr: %s", args, code, exitUsage, stderr.String())
		}
	}
	// An unreachable orchestrator is an error (1), not a refusal (3).
	var stderr bytes.Buffer
	if code := run(ctx, []string{"run", "list", "--admin-token", "t", "--url", "http://127.0.0.1:1", "--timeout", "2s"}, io.Discard, &stderr, noenv); code != exitError {
		t.Errorf("unreachable orchestrator: exit %d, want 1; stderr: %s", code, stderr.String())
	}
}
