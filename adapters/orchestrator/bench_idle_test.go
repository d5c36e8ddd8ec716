package orchestrator_test

// BenchmarkIdleWorkers: what connected, idle workers cost the orchestrator.
// The real driver runs in this process (as in BenchmarkEndToEnd) on a bbolt
// file, its connection caps raised by its options as `serve --max-conns`
// and `--max-tcp-conns` raise them; a swarm of light WebSocket clients runs
// in a second process (this test binary again, swarmMain), each enrolling
// with a token of its own as a worker does (a Hello with the token, then
// the Welcome), then sending a Heartbeat at the interval the Welcome gives
// (SPEC §9) on the heartbeat grid the Welcome sets (SPEC §10), and
// answering the orchestrator's pings; in the second sub-benchmark
// (pings=idle10s) each also pings as cmd/worker does (SPEC §9): every 5 s,
// on that grid, it pings if it has read nothing for 10 s. Once all are
// connected it measures, over idleWindow with nothing to run:
//
//   - rss-KiB/worker: this process's resident set (VmRSS) at the end of the
//     window, less what it was before the first token was made, per
//     worker;
//   - %cpu-of-one-core: this process's CPU time (user and system) over the
//     window, as a share of one core;
//   - heap-KiB/worker, stack-KiB/worker, goroutines/worker: the live heap
//     after a collection at the end of the window, the goroutines' stacks,
//     and the goroutines, less those before.
//
//	go test ./adapters/orchestrator -run '^$' -bench IdleWorkers -benchtime 1x
//
// $TETHER_BENCH_HEAPPROFILE=FILE writes the heap profile at the end of the
// window (go tool pprof -sample_index inuse_space FILE), when the swarm is
// still connected; $TETHER_BENCH_CPUPROFILE=FILE the CPU profile of the
// window alone.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/adapters/wire"
	"github.com/tether-run/tether/core"
)

const (
	idleWorkers = 10000            // the swarm's size
	idleWindow  = 60 * time.Second // the idle time measured: two heartbeat intervals, three ping periods
	idleSettle  = 5 * time.Second  // after the last Welcome, before the window
	// swarmEnv makes the test binary play the swarm (swarmMain): it names
	// the file with the control URL on its first line and a token a line.
	swarmEnv = "TETHER_BENCH_SWARM"
	// swarmDialers is how many of the swarm's clients enroll at once (the
	// driver's cap on connections without an accepted Hello from one
	// address is raised to twice it).
	swarmDialers = 32
	heapProfEnv  = "TETHER_BENCH_HEAPPROFILE"
	cpuProfEnv   = "TETHER_BENCH_CPUPROFILE"
	swarmPingEnv = "TETHER_BENCH_SWARM_PING" // how often each client checks for a ping due (a duration; 0s: never)
	// workerPing is how often cmd/worker checks whether a ping is due, and
	// half how long it reads nothing before one is (SPEC §9: ReadWait/4,
	// ReadWait/2).
	workerPing = 5 * time.Second
)

// idleRig is an orchestrator with a swarm of n idle workers connected.
type idleRig struct {
	d          *orchestrator.Driver
	swarm      *exec.Cmd
	stdin      io.WriteCloser
	lines      chan string // the swarm's stdout
	rss0       int64       // KiB, before the swarm
	heap0      uint64      // live heap, before the swarm
	stack0     uint64
	goroutines int
	enroll     time.Duration // from the swarm's start to the last Welcome
}

// startIdleRig starts the driver with caps for n workers, makes n tokens
// and starts the swarm (each client pinging every ping; 0: never), and
// returns once all n are connected.
func startIdleRig(tb testing.TB, n int, ping time.Duration) *idleRig {
	tb.Helper()
	keepHeapFloor(tb)
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		tb.Fatal(err)
	}
	if need := uint64(n + 1024); lim.Cur < need {
		lim.Cur = min(need, lim.Max) // Go raises it to the hard limit at start; be sure
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
		if lim.Cur < need {
			tb.Fatalf("RLIMIT_NOFILE is %d, %d needed for %d connections (ulimit -Hn)", lim.Cur, need, n)
		}
	}
	d, err := orchestrator.Start(orchestrator.Options{
		Addr: "127.0.0.1:0", StorePath: filepath.Join(tb.TempDir(), "tether.db"),
		// The caps raised for the swarm, all from one address.
		MaxConns: n + 64, MaxTCPConns: n + 1024, MaxConnsPerAddr: n + 1024, MaxUnauthConnsPerAddr: 2 * swarmDialers,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := d.Close(); err != nil {
			tb.Errorf("orchestrator: %v", err)
		}
	})
	r := &idleRig{d: d}
	// What a rig before this one freed goes back to the system first, so
	// that the resident set grows with this swarm, not into pages an
	// earlier one left.
	debug.FreeOSMemory()
	r.rss0 = vmRSS(tb, os.Getpid())
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	r.heap0, r.stack0, r.goroutines = ms.HeapAlloc, ms.StackInuse, runtime.NumGoroutine()

	// One token a worker, made concurrently (the commits group).
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	toks := make([]string, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				t, err := d.CreateToken(ctx, fmt.Sprintf("idle-%05d", i), time.Hour)
				if err != nil {
					errs <- err
					return
				}
				toks[i] = t
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errs:
		tb.Fatal(err)
	default:
	}
	cfg := filepath.Join(tb.TempDir(), "swarm")
	if err := os.WriteFile(cfg, []byte(d.URL()+"\n"+strings.Join(toks, "\n")+"\n"), 0o600); err != nil {
		tb.Fatal(err)
	}

	t0 := time.Now()
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), swarmEnv+"="+cfg, swarmPingEnv+"="+ping.String())
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	r.swarm, r.stdin = cmd, stdin
	r.lines = make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			r.lines <- sc.Text()
		}
		close(r.lines)
	}()
	tb.Cleanup(func() {
		stdin.Close() // the swarm's signal to end
		for range r.lines {
		}
		if err := cmd.Wait(); err != nil || tb.Failed() {
			tb.Logf("swarm: %v\n%s", err, stderr)
		}
	})
	select {
	case line, ok := <-r.lines:
		if !ok || line != fmt.Sprintf("connected %d", n) {
			tb.Fatalf("swarm: %q, want \"connected %d\"\n%s", line, n, stderr)
		}
	case <-ctx.Done():
		tb.Fatalf("the swarm did not connect within 5 minutes\n%s", stderr)
	}
	r.enroll = time.Since(t0)
	if c := connectedWorkers(tb, d); c != n {
		tb.Fatalf("%d of %d workers connected", c, n)
	}
	return r
}

// connectedWorkers counts the workers the core holds connected and active.
func connectedWorkers(tb testing.TB, d *orchestrator.Driver) int {
	tb.Helper()
	n := 0
	if err := d.Snapshot(context.Background(), func(o *core.Orchestrator) {
		for _, w := range o.Workers() {
			if w.Connected && w.Active {
				n++
			}
		}
	}); err != nil {
		tb.Fatal(err)
	}
	return n
}

// end stops the swarm and returns its last line.
func (r *idleRig) end(tb testing.TB) string {
	tb.Helper()
	r.stdin.Close()
	last := ""
	for l := range r.lines {
		last = l
	}
	return last
}

// vmRSS is a process's resident set in KiB (/proc/PID/status).
func vmRSS(tb testing.TB, pid int) int64 {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				tb.Fatal(err)
			}
			return n
		}
	}
	tb.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}

// cpuSelf is this process's CPU time so far, user and system.
func cpuSelf(tb testing.TB) time.Duration {
	tb.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// idleFigures is what one window measured.
type idleFigures struct {
	rssPerWorker, heapPerWorker, stackPerWorker, goroutinesPerWorker, cpuShare float64
}

// measure waits settle, then measures over window.
func (r *idleRig) measure(tb testing.TB, n int, settle, window time.Duration) idleFigures {
	tb.Helper()
	time.Sleep(settle)
	if p := os.Getenv(cpuProfEnv); p != "" {
		f, err := os.Create(p)
		if err != nil {
			tb.Fatal(err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			tb.Fatal(err)
		}
	}
	cpu0, t0 := cpuSelf(tb), time.Now()
	time.Sleep(window)
	cpu1, t1 := cpuSelf(tb), time.Now()
	pprof.StopCPUProfile()
	rss1 := vmRSS(tb, os.Getpid())
	runtime.GC() // after the resident set is read: the live heap
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	g := runtime.NumGoroutine()
	if p := os.Getenv(heapProfEnv); p != "" {
		f, err := os.Create(p)
		if err != nil {
			tb.Fatal(err)
		}
		runtime.GC()
		if err := pprof.WriteHeapProfile(f); err != nil {
			tb.Fatal(err)
		}
		f.Close()
	}
	if c := connectedWorkers(tb, r.d); c != n {
		tb.Fatalf("after the window %d of %d workers are connected", c, n)
	}
	return idleFigures{
		rssPerWorker:        float64(rss1-r.rss0) / float64(n),
		heapPerWorker:       float64(int64(ms.HeapAlloc)-int64(r.heap0)) / 1024 / float64(n),
		stackPerWorker:      float64(int64(ms.StackInuse)-int64(r.stack0)) / 1024 / float64(n),
		goroutinesPerWorker: float64(g-r.goroutines) / float64(n),
		cpuShare:            100 * (cpu1 - cpu0).Seconds() / t1.Sub(t0).Seconds(),
	}
}

// BenchmarkIdleWorkers is `make bench`'s figure for idle workers; see the
// top of this file. Run it with -benchtime 1x.
func BenchmarkIdleWorkers(b *testing.B) {
	for _, ping := range []time.Duration{0, workerPing} {
		name := fmt.Sprintf("workers=%d", idleWorkers)
		if ping > 0 {
			name += "/pings=idle" + (2 * ping).String()
		}
		b.Run(name, func(b *testing.B) { benchIdle(b, ping) })
	}
}

func benchIdle(b *testing.B, ping time.Duration) {
	r := startIdleRig(b, idleWorkers, ping)
	var f idleFigures
	for range b.N {
		f = r.measure(b, idleWorkers, idleSettle, idleWindow)
	}
	b.StopTimer()
	b.Log(r.end(b))
	b.ReportMetric(f.rssPerWorker, "rss-KiB/worker")
	b.ReportMetric(f.heapPerWorker, "heap-KiB/worker")
	b.ReportMetric(f.stackPerWorker, "stack-KiB/worker")
	b.ReportMetric(f.goroutinesPerWorker, "goroutines/worker")
	b.ReportMetric(f.cpuShare, "%cpu-of-one-core")
	b.ReportMetric(r.enroll.Seconds(), "enroll-s")
	b.ReportMetric(0, "ns/op")
}

// TestIdleWorkersRig keeps the idle workers' rig honest under `make test`
// (which runs no benchmarks): a small swarm enrolls, heartbeats, stays
// connected through a short window, and ends having been dropped by
// nobody.
func TestIdleWorkersRig(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a second process")
	}
	const n = 20
	r := startIdleRig(t, n, 10*time.Millisecond)
	f := r.measure(t, n, 0, 0)
	if f.goroutinesPerWorker < 1 || math.IsNaN(f.cpuShare) {
		t.Errorf("figures: %+v", f)
	}
	last := r.end(t)
	if want := fmt.Sprintf("swarm: %d connected, 0 dropped", n); !strings.HasPrefix(last, want) {
		t.Errorf("swarm's last line %q, want %q…", last, want)
	}
}

// swarmMain is the swarm: it enrolls a client per token, swarmDialers at
// a time, prints "connected N" once all are welcomed, heartbeats each at
// the Welcome's interval on its heartbeat grid and, every
// $TETHER_BENCH_SWARM_PING (on that grid too, when it is finer), pings each
// that has read nothing for twice that, as cmd/worker does, until its
// stdin closes,
// then prints "swarm: N connected, D dropped, H heartbeats, P pings" and
// exits. A client is light: small buffers, one goroutine reading (which
// answers the orchestrator's pings), the heartbeats and pings from one
// goroutine for all.
func swarmMain() int {
	b, err := os.ReadFile(os.Getenv(swarmEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	lines := strings.Fields(string(b))
	url, toks := lines[0], lines[1:]
	dialer := websocket.Dialer{ReadBufferSize: 512, WriteBufferSize: 512, HandshakeTimeout: 30 * time.Second}
	var (
		mu       sync.Mutex
		conns    = make([]*websocket.Conn, 0, len(toks))
		heard    = make([]*atomic.Int64, 0, len(toks)) // when each last read a frame, ping or pong (unix ns)
		anchors  = make([]time.Time, 0, len(toks))     // an instant of each one's heartbeat grid: its Welcome's receipt plus the phase
		welcomed = make([]time.Time, 0, len(toks))
		interval time.Duration
		dropped  atomic.Int64
		failed   = make(chan error, 1)
		next     atomic.Int64
		wg       sync.WaitGroup
	)
	enroll := func(tok string) error {
		name, _, _ := strings.Cut(tok, ".")
		for attempt := 0; ; attempt++ {
			ws, resp, err := dialer.Dial(url, nil)
			if err != nil {
				if resp != nil && resp.StatusCode == 503 && attempt < 100 { // a cap: try again
					time.Sleep(100 * time.Millisecond)
					continue
				}
				return fmt.Errorf("%s: dial: %v", name, err)
			}
			hello, err := wire.Encode(core.Hello{Version: core.ProtocolVersion, Token: tok, Worker: core.WorkerID(name + "-1"),
				Name: name, Slots: 1, MaxDelay: time.Minute})
			if err != nil {
				return err
			}
			if err := ws.WriteMessage(websocket.TextMessage, hello); err != nil {
				return fmt.Errorf("%s: hello: %v", name, err)
			}
			_, p, err := ws.ReadMessage()
			if err != nil {
				return fmt.Errorf("%s: welcome: %v", name, err)
			}
			m, err := wire.Decode(p)
			if err != nil {
				return fmt.Errorf("%s: %v", name, err)
			}
			w, ok := m.(core.Welcome)
			if !ok {
				return fmt.Errorf("%s: %#v, not a Welcome", name, m)
			}
			at := time.Now()
			h := &atomic.Int64{}
			h.Store(at.UnixNano())
			ws.SetPingHandler(func(data string) error {
				h.Store(time.Now().UnixNano())
				ws.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(10*time.Second))
				return nil
			})
			ws.SetPongHandler(func(string) error { h.Store(time.Now().UnixNano()); return nil })
			mu.Lock()
			conns = append(conns, ws)
			heard = append(heard, h)
			interval = w.Heartbeat
			anchors = append(anchors, core.GridAnchor(at, w.HeartbeatPhase, w.Heartbeat)) // as the worker core takes the Welcome
			welcomed = append(welcomed, at)
			mu.Unlock()
			go func() { // reads (and so answers pings) until the connection ends
				for {
					if _, _, err := ws.NextReader(); err != nil {
						if !closing.Load() {
							dropped.Add(1)
							fmt.Fprintf(os.Stderr, "%s: dropped: %v\n", name, err)
						}
						return
					}
					h.Store(time.Now().UnixNano())
				}
			}()
			return nil
		}
	}
	for range swarmDialers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1)) - 1; i < len(toks); i = int(next.Add(1)) - 1 {
				if err := enroll(toks[i]); err != nil {
					select {
					case failed <- err:
					default:
					}
					return
				}
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-failed:
		fmt.Fprintln(os.Stderr, err)
		return 1
	default:
	}
	fmt.Printf("connected %d\n", len(conns))
	hb, err := wire.Encode(core.Heartbeat{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	stop := make(chan struct{})
	go func() { io.Copy(io.Discard, os.Stdin); close(stop) }()
	ping, err := time.ParseDuration(os.Getenv(swarmPingEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// The heartbeats and the pings, each when cmd/worker would send it: a
	// heartbeat on the grid its Welcome set, at most an interval after the
	// last (core.NextHeartbeat); a ping check every ping on that grid
	// (core.OnGrid, as adapters/worker times them), a ping if nothing was
	// read for 2 × ping. Every client keeps its period, so each queue
	// stays in the order of its first instants: a tick sends what is due
	// from its front.
	type due struct {
		c  int
		at time.Time
	}
	queue := func(first func(c int) time.Time) []due {
		q := make([]due, len(conns))
		for c := range conns {
			q[c] = due{c, first(c)}
		}
		slices.SortFunc(q, func(a, b due) int { return a.at.Compare(b.at) })
		return q
	}
	beatQ := queue(func(c int) time.Time { return core.NextHeartbeat(anchors[c], welcomed[c], interval) })
	var pingQ []due
	grid := core.HeartbeatGrid(interval)
	nextCheck := func(c int, from time.Time) time.Time {
		if grid >= ping { // as adapters/worker: a grid no finer than the checks is not followed
			return from.Add(ping)
		}
		return core.OnGrid(anchors[c], from.Add(ping), grid)
	}
	if ping > 0 {
		pingQ = queue(func(c int) time.Time { return nextCheck(c, welcomed[c]) })
	}
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	beats, pings := 0, 0
	for i, j := 0, 0; ; {
		var now time.Time
		select {
		case <-stop:
			closing.Store(true)
			for _, ws := range conns {
				ws.Close()
			}
			fmt.Printf("swarm: %d connected, %d dropped, %d heartbeats, %d pings\n", len(conns), dropped.Load(), beats, pings)
			return 0
		case now = <-t.C:
		}
		for ; !beatQ[i].at.After(now); i = (i + 1) % len(beatQ) {
			ws := conns[beatQ[i].c]
			beatQ[i].at = core.NextHeartbeat(anchors[beatQ[i].c], beatQ[i].at, interval)
			ws.SetWriteDeadline(now.Add(10 * time.Second))
			if err := ws.WriteMessage(websocket.TextMessage, hb); err == nil {
				beats++
			}
		}
		for ; len(pingQ) > 0 && !pingQ[j].at.After(now); j = (j + 1) % len(pingQ) {
			c := pingQ[j].c
			pingQ[j].at = nextCheck(c, pingQ[j].at)
			if now.Sub(time.Unix(0, heard[c].Load())) < 2*ping {
				continue // heard from lately: no ping (SPEC §9)
			}
			if err := conns[c].WriteControl(websocket.PingMessage, nil, now.Add(10*time.Second)); err == nil {
				pings++
			}
		}
	}
}

// closing is set when the swarm closes its own connections: their reads
// then end without counting as drops.
var closing atomic.Bool
