package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tether-run/tether/adapters/orchestrator"
)

const e2eTimeout = 50 * time.Second

// syncBuffer is an output sink safe to read while the process writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// proc is a started binary.
type proc struct {
	name           string
	cmd            *exec.Cmd
	stdout, stderr *syncBuffer
	done           chan struct{} // closed when it exited
	code           int
}

func start(t *testing.T, ctx context.Context, name, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.CommandContext(ctx, bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	p.cmd.Env = append(os.Environ(), "TETHER_ADMIN_TOKEN=", // clients must find the token in the data dir
		"STATE_DIRECTORY="+t.TempDir()) // each worker process its own identity, unless --state-dir says otherwise
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.cmd.Wait()
		p.code = p.cmd.ProcessState.ExitCode()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			p.cmd.Process.Kill() // only our own child, by its pid
			<-p.done
		}
		if strings.Contains(p.stderr.String(), "WARNING: DATA RACE") {
			t.Errorf("%s: the race detector found a data race", name)
		}
		if t.Failed() {
			t.Logf("--- %s stdout:\n%s\n--- %s stderr:\n%s", name, p.stdout, name, p.stderr)
		}
	})
	return p
}

// wait waits for the process to exit and returns its exit code.
func (p *proc) wait(t *testing.T, ctx context.Context) int {
	t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-ctx.Done():
		t.Fatalf("%s did not exit: %v\nstderr:\n%s", p.name, ctx.Err(), p.stderr)
		return -1
	}
}

func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %s: %v", p.name, err)
	}
}

// poll calls f every 25 ms until it returns true or ctx ends.
func poll(t *testing.T, ctx context.Context, what string, f func() bool) {
	t.Helper()
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for !f() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-tick.C:
		}
	}
}

// The binaries are built once per test run of this package, into binDir
// (removed by TestMain).
var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// buildBinaries builds both commands (once) and returns their paths.
func buildBinaries(t *testing.T, ctx context.Context) (orch, work string) {
	t.Helper()
	buildOnce.Do(func() {
		goBin, err := exec.LookPath("go")
		if err != nil {
			goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		if binDir, buildErr = os.MkdirTemp("", "tether-bin-"); buildErr != nil {
			return
		}
		args := []string{"build", "-o", binDir + string(filepath.Separator), "./cmd/orchestrator", "./cmd/worker"}
		if raceBuild {
			args = append(args[:1], append([]string{"-race"}, args[1:]...)...)
		}
		cmd := exec.CommandContext(ctx, goBin, args...)
		cmd.Dir = filepath.Join("..", "..") // the module root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(binDir, "orchestrator"), filepath.Join(binDir, "worker")
}

// TestEndToEndBinaries runs the real binaries: serve, a token from the CLI,
// a worker process, examples/dag.yaml submitted with the CLI to success,
// its logs, a replayed token refused (exit 3), and clean exits on SIGTERM
// (a --no-reconnect worker exits 2 when the orchestrator goes).
func TestEndToEndBinaries(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binaries")
	}
	ctx, cancel := context.WithTimeout(t.Context(), e2eTimeout)
	defer cancel()
	orchBin, workerBin := buildBinaries(t, ctx)
	dataDir := filepath.Join(t.TempDir(), "data")

	cfg := filepath.Join(t.TempDir(), "server-config.yaml")
	os.WriteFile(cfg, []byte("addr: 127.0.0.1:0\ndata_dir: ignored-the-flag-wins\nrecovery:\n  sweep_interval_secs: 5\n"), 0o600)
	serve := start(t, ctx, "orchestrator serve", orchBin, "serve", "--config", cfg, "--data-dir", dataDir, "--log-level", "debug")
	urlRE := regexp.MustCompile(`workers connect to: (ws://127\.0\.0\.1:\d+/control)`)
	var wsURL string
	poll(t, ctx, "serve to print its address", func() bool {
		select {
		case <-serve.done:
			t.Fatalf("serve exited %d:\n%s", serve.code, serve.stderr)
		default:
		}
		if m := urlRE.FindStringSubmatch(serve.stdout.String()); m != nil {
			wsURL = m[1]
			return true
		}
		return false
	})
	httpURL := "http://" + strings.TrimSuffix(strings.TrimPrefix(wsURL, "ws://"), "/control")
	// stderr is copied apart from stdout, so its line may arrive a little later.
	poll(t, ctx, "the config file's recovery section to be applied (sweep_interval=5s logged)", func() bool {
		return strings.Contains(serve.stderr.String(), "sweep_interval=5s")
	})

	// The admin token: printed once, stored with mode 0600.
	tokPath := filepath.Join(dataDir, "admin-token")
	fi, err := os.Stat(tokPath)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("admin-token: %v, mode %v; want mode 0600", err, fi.Mode().Perm())
	}
	admin, _ := os.ReadFile(tokPath)
	if !strings.Contains(serve.stdout.String(), strings.TrimSpace(string(admin))) {
		t.Errorf("serve did not print the admin token on first start:\n%s", serve.stdout)
	}

	// cli runs a client command against this orchestrator.
	cli := func(args ...string) (stdout, stderr string, code int) {
		t.Helper()
		return orchCLI(t, ctx, orchBin, append(args, "--url", httpURL, "--data-dir", dataDir)...)
	}
	mustCLI := func(args ...string) string {
		t.Helper()
		out, errOut, code := cli(args...)
		if code != 0 {
			t.Fatalf("orchestrator %q: exit %d\n%s", args, code, errOut)
		}
		return out
	}
	jsonCLI := func(v any, args ...string) {
		t.Helper()
		if err := json.Unmarshal([]byte(mustCLI(append(args, "--json")...)), v); err != nil {
			t.Fatalf("orchestrator %q --json: %v", args, err)
		}
	}

	token := strings.TrimSpace(mustCLI("token", "create", "w1", "--ttl", "10m"))
	if name, secret, ok := strings.Cut(token, "."); !ok || name != "w1" || len(secret) != 32 {
		t.Fatalf("token create printed %q, want w1.<secret>", token)
	}
	if out := mustCLI("token", "list", "--json"); strings.Contains(out, token[3:]) {
		t.Fatalf("token list shows the secret:\n%s", out)
	}

	w1 := start(t, ctx, "worker w1", workerBin, "connect", "--url", wsURL, "--token", token, "--tags", "script", "--log-format", "json")
	connected := func(n int) func() bool {
		return func() bool {
			var ws orchestrator.APIWorkerList
			jsonCLI(&ws, "worker", "list")
			c := 0
			for _, w := range ws.Workers {
				if w.State == "connected" {
					c++
				}
			}
			return c == n
		}
	}
	poll(t, ctx, "worker w1 to connect", connected(1))

	run := strings.TrimSpace(mustCLI("run", "submit", "examples/dag.yaml"))
	if run != "run-1" {
		t.Fatalf("run submit printed %q, want run-1", run)
	}
	var det orchestrator.APIRunDetail
	poll(t, ctx, "run-1 to finish", func() bool {
		jsonCLI(&det, "run", "show", run)
		return !det.Run.FinishedAt.IsZero()
	})
	if det.Status != "success" {
		t.Fatalf("run-1 finished %s:\n%s", det.Status, mustCLI("run", "show", run))
	}
	for _, s := range det.Steps {
		if s.State != "success" || s.Worker != "w1" {
			t.Errorf("step %s: %s on %q, want success on w1", s.ID, s.State, s.Worker)
		}
	}
	show := mustCLI("run", "show", run)
	for _, want := range []string{"run-1/fetch", "run-1/package", "success", "run-submitted", "run-finished"} {
		if !strings.Contains(show, want) {
			t.Errorf("run show lacks %q:\n%s", want, show)
		}
	}
	logs := mustCLI("run", "logs", run)
	for _, want := range []string{"run-1/fetch | fetched sources for 1.4.2", "run-1/test | tests passed: 42", "run-1/package | packaged tether-1.4.2.tar.gz"} {
		if !strings.Contains(logs, want) {
			t.Errorf("run logs lacks %q:\n%s", want, logs)
		}
	}
	if only := mustCLI("run", "logs", run, "--step", "lint"); !strings.Contains(only, "lint passed") || strings.Contains(only, "fetch") {
		t.Errorf("run logs --step lint:\n%s", only)
	}

	// Refusals exit 3: a bad definition (with its line), an unknown run.
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("name: bad\nsteps:\n  - name: a\n    run: echo\n    depends_on: [ghost]\n"), 0o600)
	if _, errOut, code := cli("run", "submit", bad); code != exitRefused || !strings.Contains(errOut, "bad.yaml:3") {
		t.Errorf("bad definition: exit %d, stderr %q; want 3 naming bad.yaml:3", code, errOut)
	}
	if _, _, code := cli("run", "show", "run-42"); code != exitRefused {
		t.Errorf("unknown run: exit %d, want 3", code)
	}
	if _, _, code := cli("run", "list", "--admin-token", "wrong"); code != exitRefused {
		t.Errorf("wrong admin token: exit %d, want 3", code)
	}

	// A replayed enrollment token is refused for good: exit 3.
	replay := start(t, ctx, "worker replay", workerBin, "connect", "--url", wsURL, "--token", token)
	if code := replay.wait(t, ctx); code != 3 {
		t.Errorf("a worker with a replayed token exited %d, want 3:\n%s", code, replay.stderr)
	}
	if !strings.Contains(replay.stderr.String(), "already used") {
		t.Errorf("the replayed worker does not say why:\n%s", replay.stderr)
	}

	// A --no-reconnect worker, to see it exit 2 when the orchestrator goes.
	tok2 := strings.TrimSpace(mustCLI("token", "create", "w2"))
	w2 := start(t, ctx, "worker w2", workerBin, "connect", "--url", wsURL, "--token", tok2, "--no-reconnect")
	poll(t, ctx, "worker w2 to connect", connected(2))

	w1.signal(t, syscall.SIGTERM)
	if code := w1.wait(t, ctx); code != 0 {
		t.Errorf("worker w1 exited %d on SIGTERM, want 0:\n%s", code, w1.stderr)
	}
	serve.signal(t, syscall.SIGTERM)
	if code := serve.wait(t, ctx); code != 0 {
		t.Errorf("orchestrator exited %d on SIGTERM, want 0:\n%s", code, serve.stderr)
	}
	if !strings.Contains(serve.stderr.String(), "orchestrator stopped") {
		t.Errorf("serve did not log a clean stop:\n%s", serve.stderr)
	}
	if code := w2.wait(t, ctx); code != 2 {
		t.Errorf("the --no-reconnect worker exited %d when the orchestrator stopped, want 2:\n%s", code, w2.stderr)
	}
	if !strings.Contains(w2.stderr.String(), "close 1001 (going away)") {
		t.Errorf("the worker did not see a going-away close (1001) when the orchestrator stopped:\n%s", w2.stderr)
	}

	// A restart restores the store and does not print the admin token again.
	serve2 := start(t, ctx, "orchestrator serve (restart)", orchBin, "serve", "--addr", "127.0.0.1:0", "--data-dir", dataDir)
	poll(t, ctx, "the restarted serve to print its address", func() bool {
		select {
		case <-serve2.done:
			t.Fatalf("restarted serve exited %d:\n%s", serve2.code, serve2.stderr)
		default:
		}
		m := urlRE.FindStringSubmatch(serve2.stdout.String())
		if m != nil {
			httpURL = "http://" + strings.TrimSuffix(strings.TrimPrefix(m[1], "ws://"), "/control")
		}
		return m != nil
	})
	if strings.Contains(serve2.stdout.String(), strings.TrimSpace(string(admin))) {
		t.Errorf("the admin token was printed again on restart")
	}
	var again orchestrator.APIRunDetail
	jsonCLI(&again, "run", "show", run)
	if again.Status != "success" || len(again.Steps) != len(det.Steps) {
		t.Errorf("after a restart run-1 is %s with %d steps, want success with %d", again.Status, len(again.Steps), len(det.Steps))
	}
	serve2.signal(t, syscall.SIGINT)
	if code := serve2.wait(t, ctx); code != 0 {
		t.Errorf("restarted orchestrator exited %d on SIGINT, want 0:\n%s", code, serve2.stderr)
	}

	tlsPhase(t, ctx, orchBin, workerBin, dataDir)
}

// tlsPhase serves the same data dir over TLS: a worker with --ca dials
// wss://, the CLI with --ca talks https://, a step uses the data plane
// through its worker (when curl is installed), and bundles go up and data
// comes down with the CLI.
func tlsPhase(t *testing.T, ctx context.Context, orchBin, workerBin, dataDir string) {
	certPath, keyPath := writeTestCert(t, t.TempDir())
	serve := start(t, ctx, "orchestrator serve (TLS)", orchBin, "serve", "--addr", "127.0.0.1:0", "--data-dir", dataDir,
		"--tls-cert", certPath, "--tls-key", keyPath)
	re := regexp.MustCompile(`workers connect to: (wss://127\.0\.0\.1:\d+/control)`)
	var wssURL string
	poll(t, ctx, "the TLS serve to print its address", func() bool {
		select {
		case <-serve.done:
			t.Fatalf("TLS serve exited %d:\n%s", serve.code, serve.stderr)
		default:
		}
		if m := re.FindStringSubmatch(serve.stdout.String()); m != nil {
			wssURL = m[1]
			return true
		}
		return false
	})
	httpsURL := "https://" + strings.TrimSuffix(strings.TrimPrefix(wssURL, "wss://"), "/control")
	if !strings.Contains(serve.stdout.String(), "data plane:         "+httpsURL) {
		t.Errorf("serve does not name its data plane:\n%s", serve.stdout)
	}
	if !strings.Contains(serve.stdout.String(), "status page:        "+httpsURL+"/ ") {
		t.Errorf("serve does not name its status page:\n%s", serve.stdout)
	}
	cli := func(args ...string) (string, string, int) {
		t.Helper()
		return orchCLI(t, ctx, orchBin, append(args, "--url", httpsURL, "--data-dir", dataDir, "--ca", certPath)...)
	}
	mustCLI := func(args ...string) string {
		t.Helper()
		out, errOut, code := cli(args...)
		if code != 0 {
			t.Fatalf("orchestrator %q: exit %d\n%s", args, code, errOut)
		}
		return out
	}
	// Without the CA the CLI cannot talk to it.
	cmd := exec.CommandContext(ctx, orchBin, "run", "list", "--url", httpsURL, "--data-dir", dataDir)
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "certificate") {
		t.Errorf("a client without --ca: %v\n%s", err, out)
	}

	token := strings.TrimSpace(mustCLI("token", "create", "w3"))
	w3 := start(t, ctx, "worker w3 (TLS)", workerBin, "connect", "--url", wssURL, "--token", token, "--ca", certPath)
	poll(t, ctx, "worker w3 to connect over wss", func() bool {
		var ws orchestrator.APIWorkerList
		json.Unmarshal([]byte(mustCLI("worker", "list", "--json")), &ws)
		for _, w := range ws.Workers {
			if w.Name == "w3" && w.State == "connected" {
				return true
			}
		}
		return false
	})
	_, curlErr := exec.LookPath("curl")
	if curlErr == nil {
		run := strings.TrimSpace(mustCLI("run", "submit", "examples/data.yaml"))
		var det orchestrator.APIRunDetail
		poll(t, ctx, run+" to finish", func() bool {
			json.Unmarshal([]byte(mustCLI("run", "show", run, "--json")), &det)
			return !det.Run.FinishedAt.IsZero()
		})
		if det.Status != "success" {
			t.Fatalf("%s finished %s:\n%s\n%s", run, det.Status, mustCLI("run", "show", run), mustCLI("run", "logs", run))
		}
		report := mustCLI("data", "get", "report.txt")
		if !strings.HasPrefix(report, "built at ") {
			t.Errorf("data get report.txt: %q", report)
		}
		if logs := mustCLI("run", "logs", run, "--step", "consume"); !strings.Contains(logs, strings.TrimSpace(report)) {
			t.Errorf("the consuming step did not read the report:\n%s", logs)
		}
		if got := mustCLI("data", "get", "pipeline.log", "append"); got != "produce: done\n" {
			t.Errorf("data get pipeline.log append: %q", got)
		}
		if sum := sha256.Sum256([]byte(report)); !strings.Contains(mustCLI("data", "versions", "report.txt"), hex.EncodeToString(sum[:])) {
			t.Errorf("data versions report.txt does not list the version's sha256:\n%s", mustCLI("data", "versions", "report.txt"))
		}
	} else {
		t.Log("curl not found: the step-side data plane is covered by adapters/orchestrator's TestStepEndpoint only")
	}

	bundle := filepath.Join(t.TempDir(), "b.bin")
	os.WriteFile(bundle, []byte("bundle bytes"), 0o600)
	fp := strings.TrimSpace(mustCLI("bundle", "put", bundle))
	if sum := sha256.Sum256([]byte("bundle bytes")); fp != hex.EncodeToString(sum[:]) {
		t.Errorf("bundle put printed %q, want the sha256", fp)
	}
	if _, errOut, code := cli("data", "get", "no-such-item"); code != exitRefused || !strings.Contains(errOut, "not found") {
		t.Errorf("data get of an unknown item: exit %d %q, want 3", code, errOut)
	}

	w3.signal(t, syscall.SIGTERM)
	if code := w3.wait(t, ctx); code != 0 {
		t.Errorf("worker w3 exited %d on SIGTERM, want 0:\n%s", code, w3.stderr)
	}
	serve.signal(t, syscall.SIGTERM)
	if code := serve.wait(t, ctx); code != 0 {
		t.Errorf("TLS orchestrator exited %d on SIGTERM, want 0:\n%s", code, serve.stderr)
	}
}

// writeTestCert writes a self-signed certificate for 127.0.0.1 (it is its
// own CA) and its key as PEM files.
func writeTestCert(t *testing.T, dir string) (certPath, keyPath string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "tether test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPath, keyPath = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certPath, keyPath
}
