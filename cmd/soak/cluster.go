package main

// The processes: one orchestrator (`orchestrator serve`) and its workers
// (`worker connect --executor noop`), each with its own log file in the
// temp dir, and an HTTP client of the operator API.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/tether-run/tether/client"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Module paths of the two binaries (built with `go build` unless -bin).
const (
	orchestratorPkg = "github.com/tether-run/tether/cmd/orchestrator"
	workerPkg       = "github.com/tether-run/tether/cmd/worker"
	storeFile       = "tether.db"      // serve's store, in its --data-dir
	adminTokenFile  = "admin-token"    // serve's admin token, in its --data-dir
	startTimeout    = time.Minute      // a process must be serving within this
	restartTimeout  = 10 * time.Minute // a restart, restoring a long history, within this
	stopTimeout     = 30 * time.Second
)

// bins are the two binaries.
type bins struct{ orchestrator, worker string }

// buildBins builds both binaries into dir, or takes them from binDir.
func buildBins(ctx context.Context, binDir, dir string, race bool) (bins, error) {
	if binDir != "" {
		b := bins{filepath.Join(binDir, "orchestrator"), filepath.Join(binDir, "worker")}
		for _, p := range []string{b.orchestrator, b.worker} {
			if _, err := os.Stat(p); err != nil {
				return b, fmt.Errorf("-bin: %w", err)
			}
		}
		return b, nil
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out := filepath.Join(dir, "bin")
	args := []string{"build", "-o", out + string(filepath.Separator)}
	if race {
		args = append(args, "-race")
	}
	cmd := exec.CommandContext(ctx, goBin, append(args, orchestratorPkg, workerPkg)...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return bins{}, fmt.Errorf("go build (run soak inside the module, or give -bin): %v\n%s", err, b)
	}
	return bins{filepath.Join(out, "orchestrator"), filepath.Join(out, "worker")}, nil
}

// freeAddr is a loopback address with a port nothing listens on now; both
// starts of one orchestrator use it, so the restart can be probed from the
// moment its process starts.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// proc is a child process with its log file.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{} // closed when it exited; err is then set
	err  error
}

func startProc(name, dir, logPath string, argv ...string) (*proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir // no config file is found there: defaults and flags only
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop signals the process (only this child, by its pid) and waits for it;
// after stopTimeout it is killed and that is an error.
func (p *proc) stop(sig os.Signal) error {
	if !p.exited() {
		p.cmd.Process.Signal(sig)
	}
	select {
	case <-p.done:
		return p.err
	case <-time.After(stopTimeout):
		p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s did not exit within %s of %v; killed", p.name, stopTimeout, sig)
	}
}

// tail is the last n lines of the process's log.
func (p *proc) tail(n int) string {
	b, _ := os.ReadFile(p.log)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return p.name + " (" + p.log + "):\n  " + strings.Join(lines, "\n  ")
}

// races names the log files under dir in which a binary built with -race
// reported a race.
func races(dir string) ([]string, error) {
	logs, err := filepath.Glob(filepath.Join(dir, "*", "*.log"))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err != nil {
			return nil, err
		}
		if bytes.Contains(b, []byte("WARNING: DATA RACE")) {
			out = append(out, l)
		}
	}
	return out, nil
}

// memory is a process's resident set now and at its peak (VmRSS, VmHWM),
// and the two parts of the resident set now: anonymous memory (the Go heap
// and runtime, RssAnon) and pages of mapped files (the store's mmap,
// RssFile).
type memory struct{ rss, peak, anon, file int64 } // bytes

func readMemory(pid int) (memory, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return memory{}, err
	}
	defer f.Close()
	var m memory
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		var dst *int64
		switch k {
		case "VmRSS":
			dst = &m.rss
		case "VmHWM":
			dst = &m.peak
		case "RssAnon":
			dst = &m.anon
		case "RssFile":
			dst = &m.file
		default:
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			return m, fmt.Errorf("/proc/%d/status: %s: %q", pid, k, v)
		}
		*dst = kb << 10
	}
	return m, sc.Err()
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// cluster is one orchestrator and its workers on one data directory.
type cluster struct {
	bins    bins
	dir     string // the phase's directory: data/, logs, worker state
	dataDir string
	addr    string
	extra   []string // more serve flags
	orch    *proc
	workers []*proc
	api     *apiClient
	starts  int
}

func newCluster(b bins, dir string, extra ...string) (*cluster, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	return &cluster{bins: b, dir: dir, dataDir: filepath.Join(dir, "data"), addr: addr, extra: extra}, nil
}

// startOrchestrator starts `orchestrator serve` and returns when the
// process was started (not when it serves).
func (c *cluster) startOrchestrator() error {
	c.starts++
	argv := append([]string{c.bins.orchestrator, "serve", "--addr", c.addr, "--data-dir", c.dataDir, "--log-level", "warn"}, c.extra...)
	p, err := startProc(fmt.Sprintf("orchestrator (start %d)", c.starts), c.dir, filepath.Join(c.dir, "orchestrator.log"), argv...)
	if err != nil {
		return err
	}
	c.orch = p
	return nil
}

// waitAPI waits until the admin token exists and the API answers.
func (c *cluster) waitAPI(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	for {
		if c.orch.exited() {
			return fmt.Errorf("the orchestrator exited: %v\n%s", c.orch.err, c.orch.tail(20))
		}
		if c.api == nil {
			if b, err := os.ReadFile(filepath.Join(c.dataDir, adminTokenFile)); err == nil && len(bytes.TrimSpace(b)) > 0 {
				c.api = newAPIClient("http://"+c.addr, string(bytes.TrimSpace(b)))
			}
		}
		if c.api != nil {
			if _, err := c.api.workers(ctx); err == nil {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the orchestrator did not serve its API within %s\n%s", startTimeout, c.orch.tail(20))
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// startWorkers enrols n workers, each with its own token, and waits until
// all are connected.
func (c *cluster) startWorkers(ctx context.Context, n, slots int) error {
	for i := range n {
		name := fmt.Sprintf("soak-%d", i+1)
		tok, err := c.api.createToken(ctx, name)
		if err != nil {
			return err
		}
		wdir := filepath.Join(c.dir, name)
		if err := os.MkdirAll(wdir, 0o700); err != nil {
			return err
		}
		p, err := startProc(name, wdir, filepath.Join(c.dir, name+".log"), c.bins.worker, "connect",
			"--url", "ws://"+c.addr+"/control", "--token", tok, "--slots", strconv.Itoa(slots),
			"--executor", "noop", "--no-reconnect", "--state-dir", wdir, "--log-level", "warn")
		if err != nil {
			return err
		}
		c.workers = append(c.workers, p)
	}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	for {
		ws, err := c.api.workers(ctx)
		if err != nil {
			return err
		}
		connected := 0
		for _, w := range ws {
			if w.Connected {
				connected++
			}
		}
		if connected >= n {
			return nil
		}
		for _, p := range c.workers {
			if p.exited() {
				return fmt.Errorf("%s exited: %v\n%s", p.name, p.err, p.tail(20))
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d workers connected within %s", connected, n, startTimeout)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// stopOrchestrator shuts the orchestrator down with SIGTERM (serve's clean
// shutdown); it must exit 0. Workers started with --no-reconnect exit when
// their connection closes; they are waited for.
func (c *cluster) stopOrchestrator() error {
	if c.orch == nil {
		return nil
	}
	err := c.orch.stop(syscall.SIGTERM)
	if err != nil {
		err = fmt.Errorf("orchestrator shutdown: %v\n%s", err, c.orch.tail(20))
	}
	for _, w := range c.workers {
		w.stop(os.Interrupt) // they have lost their connection: any exit code
	}
	c.workers = nil
	return err
}

// close stops everything still running (after an error, too).
func (c *cluster) close() {
	if c.orch != nil && !c.orch.exited() {
		c.stopOrchestrator()
	}
	for _, w := range c.workers {
		w.stop(os.Interrupt)
	}
}

// storeSize is the bbolt file's size.
func (c *cluster) storeSize() int64 {
	fi, err := os.Stat(filepath.Join(c.dataDir, storeFile))
	if err != nil {
		return 0
	}
	return fi.Size()
}

func (c *cluster) memory() (memory, error) { return readMemory(c.orch.cmd.Process.Pid) }

// ---- the operator API, only what the harness needs ----

// apiClient is the harness's use of the operator API (package client).
type apiClient struct {
	base, token string
	c           *client.Client
}

func newAPIClient(base, token string) *apiClient {
	hc := &http.Client{
		Timeout:   2 * time.Minute,
		Transport: &http.Transport{MaxIdleConnsPerHost: 8, DisableCompression: true},
	}
	c, err := client.New(base, token, client.WithHTTPClient(hc))
	if err != nil {
		panic(err) // base is the harness's own http://host:port
	}
	return &apiClient{base: base, token: token, c: c}
}

func (a *apiClient) workers(ctx context.Context) ([]client.Worker, error) {
	l, err := a.c.Workers(ctx)
	if err != nil {
		return nil, err
	}
	return l.Workers, nil
}

func (a *apiClient) createToken(ctx context.Context, name string) (string, error) {
	tok, err := a.c.CreateToken(ctx, name, 24*time.Hour)
	if err != nil {
		return "", fmt.Errorf("create token %s: %w", name, err)
	}
	return tok.Token, nil
}

func (a *apiClient) submit(ctx context.Context, workflow []byte) (string, error) {
	run, err := a.c.Submit(ctx, "soak.yaml", workflow)
	if err != nil {
		return "", fmt.Errorf("submit: %w", err)
	}
	if run == "" {
		return "", errors.New("submit: the answer names no run")
	}
	return run, nil
}

// runDetail is GET /api/runs/{id}'s answer.
type runDetail = client.RunDetail

func (a *apiClient) run(ctx context.Context, id string) (runDetail, error) {
	d, err := a.c.Run(ctx, id)
	if err != nil {
		return runDetail{}, err
	}
	return *d, nil
}

// noopWorkflow is a run of n independent steps (the noop executor ignores
// the command).
func noopWorkflow(n int) []byte {
	var b bytes.Buffer
	b.WriteString("name: soak\nsteps:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - name: s%d\n    run: \"true\"\n", i)
	}
	return b.Bytes()
}
