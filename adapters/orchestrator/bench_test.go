package orchestrator_test

// The end-to-end benchmark that `make bench` quotes: the real driver (in this
// process, so that a CPU profile sees it) with a real bbolt file, every
// commit fsync'd (or PostgreSQL: make bench's second pass, see
// bench_peers_test.go), and four real worker processes (cmd/worker) on
// loopback WebSockets. The workers run with --executor noop, a benchmarking aid that
// completes every step at once without starting a process, so the figures
// measure the orchestrator and the protocol, not fork and exec.
//
//	go test ./adapters/orchestrator -run '^$' -bench EndToEnd -benchtime 1x
//
// Throughput: 20,000 no-op steps, submitted as 100 runs of 200 independent
// steps, from the first Submit to the durable commit of the last run's
// finish, once with 16 slots per worker (64 concurrent steps), once
// with 1, and once with 1 and eight steps held ahead (SPEC §3 lease-ahead:
// `worker connect --ahead 8`; the best of 1, 2, 4 and 8 in PERFORMANCE.md).
//
// Latency: on an idle system, one single-step run at a time; "start" is the
// moment the orchestrator's START of the step (queued → running) is durable,
// i.e. the store's Apply of that batch returned, so the fact is on disk.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tether-run/tether/adapters/heapfloor"
	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/adapters/store"
	"github.com/tether-run/tether/core"
)

// benchShape is one throughput shape of BenchmarkEndToEnd: a fleet of
// workers with slots each. The peers (bench_peers_test.go) run at each
// shape's concurrency, workers × slots.
type benchShape struct{ workers, slots, ahead int }

// benchShapes are the throughput shapes, in the order they run.
var benchShapes = []benchShape{
	{workers: benchWorkers, slots: 16},          // 64 slots
	{workers: benchWorkers, slots: 1},           // 4 slots
	{workers: benchWorkers, slots: 1, ahead: 8}, // 4 slots, lease-ahead (SPEC §3)
}

// name is the shape's sub-benchmark name (bench/report reads it).
func (s benchShape) name() string {
	n := fmt.Sprintf("steps=%d/workers=%d/slots=%d", benchSteps, s.workers, s.slots)
	if s.ahead > 0 {
		n += fmt.Sprintf("/ahead=%d", s.ahead)
	}
	return n
}

// concurrency is how many steps the shape runs at once.
func (s benchShape) concurrency() int { return s.workers * s.slots }

const (
	benchSteps     = 20000
	benchRunSize   = 200 // independent steps per run
	benchWorkers   = 4
	latencySamples = 2000
	benchTimeout   = 5 * time.Minute
)

// watchStore is the benchmark's store with a hook that sees every batch once it is
// durable. The hook runs on the driver's loop goroutine, so it must be cheap:
// it only looks for byte patterns in the records' values.
type watchStore struct {
	store.Backend
	mu    sync.Mutex
	watch func(recs []core.Record, at time.Time)
	busy  time.Duration // time spent in Apply (writing and syncing)
	recs  int           // records applied
	// watchMu makes the watch see one batch at a time.
	watchMu sync.Mutex
}

func (s *watchStore) Apply(recs []core.Record) error {
	t0 := time.Now()
	if err := s.Backend.Apply(recs); err != nil {
		return err
	}
	s.applied(recs, t0)
	return nil
}

// applied counts a batch made durable since t0 and shows it to the watch,
// one batch at a time (the pipeline's places end concurrently).
func (s *watchStore) applied(recs []core.Record, t0 time.Time) {
	s.mu.Lock()
	w := s.watch
	s.busy += time.Since(t0)
	s.recs += len(recs)
	s.mu.Unlock()
	if w != nil {
		s.watchMu.Lock()
		w(recs, time.Now())
		s.watchMu.Unlock()
	}
}

// PipelineDepth and Reserve pass the backend's store.Pipeline through (a
// depth of 1 without one: the driver then commits one group at a time),
// each place watched as Apply is.
func (s *watchStore) PipelineDepth() int {
	if p, ok := s.Backend.(store.Pipeline); ok {
		return p.PipelineDepth()
	}
	return 1
}

func (s *watchStore) Reserve() func([]core.Record) error {
	apply := s.Backend.(store.Pipeline).Reserve()
	return func(recs []core.Record) error {
		t0 := time.Now()
		if err := apply(recs); err != nil {
			return err
		}
		s.applied(recs, t0)
		return nil
	}
}

func (s *watchStore) busyTime() (time.Duration, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.busy, s.recs
}

func (s *watchStore) setWatch(w func(recs []core.Record, at time.Time)) {
	s.mu.Lock()
	s.watch = w
	s.mu.Unlock()
}

// Byte patterns of the canonical record encoding the watchers look for.
var (
	runFinished  = []byte(`"Finished":true`)
	stepStarted  = []byte(`"StartedAt":`)
	leaseCurrent = []byte(`"Current":true`)
)

// finishedRun names the run whose finish record is rec: its history record
// (a run leaves the core in the batch that finishes it, SPEC §7a), or a run
// record marked finished.
func finishedRun(rec core.Record) (string, bool) {
	if core.IsHistoryKey(rec.Key) {
		return strings.TrimPrefix(rec.Key, core.KindHistory+"/"), true
	}
	if strings.HasPrefix(rec.Key, core.KindRun+"/") && bytes.Contains(rec.Value, runFinished) {
		return strings.TrimPrefix(rec.Key, core.KindRun+"/"), true
	}
	return "", false
}

// benchRig is an orchestrator with a fleet of worker processes.
type benchRig struct {
	d       *orchestrator.Driver
	st      *watchStore
	workers []int // worker process ids
}

// usage is what the orchestrator's process (with the benchmark's own small
// part) and the worker processes have used so far.
type usage struct {
	orchCPU, workerCPU time.Duration
	ctxsw              int64  // voluntary context switches, all processes
	gcCycles           uint64 // this process's completed GC cycles
	allocBytes         uint64 // this process's heap allocations, cumulative
}

// usage reads the CPU time (user and system) and the voluntary context
// switches of this process and the workers. The machine is shared, so
// wall-clock figures vary with the load; CPU time and wakeups per step say
// what the work itself costs.
func (r *benchRig) usage(tb testing.TB) usage {
	tb.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	u := usage{orchCPU: time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), ctxsw: ru.Nvcsw}
	// The collector's cycles and the bytes allocated, which set how often
	// it runs (a cycle lengthens the loop's batches it meets, SPEC §12).
	gc := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}, {Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(gc)
	u.gcCycles, u.allocBytes = gc[0].Value.Uint64(), gc[1].Value.Uint64()
	for _, pid := range r.workers {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			tb.Fatal(err)
		}
		// Fields after the command's closing parenthesis; utime and stime
		// are the 14th and 15th fields, in clock ticks (USER_HZ, 100/s).
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		for _, s := range f[11:13] {
			ticks, _ := strconv.ParseInt(s, 10, 64)
			u.workerCPU += time.Duration(ticks) * 10 * time.Millisecond
		}
		// A status counts one thread's switches: add up the threads.
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
		for _, task := range tasks {
			st, _ := os.ReadFile(task) // a thread may just have gone
			for _, line := range strings.Split(string(st), "\n") {
				if v, ok := strings.CutPrefix(line, "voluntary_ctxt_switches:"); ok {
					n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
					u.ctxsw += n
				}
			}
		}
	}
	return u
}

// $TETHER_BENCH_WORKER_CPUPROFILE=DIR writes each worker process's CPU
// profile into DIR (worker-PID-N.cpu; go tool pprof DIR/*.cpu adds them up);
// the orchestrator runs in this process, so -test.cpuprofile profiles it.
const benchWorkerProfileEnv = "TETHER_BENCH_WORKER_CPUPROFILE"

// workerSeq numbers the worker processes this process started.
var workerSeq atomic.Int64

// buildWorker builds cmd/worker into a temporary directory of tb's.
func buildWorker(tb testing.TB) string {
	tb.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(tb.TempDir(), "worker")
	cmd := exec.Command(goBin, "build", "-o", bin, "./cmd/worker")
	cmd.Dir = filepath.Join("..", "..") // the module root
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("go build ./cmd/worker: %v\n%s", err, out)
	}
	return bin
}

// $TETHER_BENCH_HEAP_FLOOR=BYTES makes a benchmark's rig keep a heap floor
// of BYTES, as serve --heap-floor BYTES does (SPEC §12); unset or 0, none,
// as serve by default.
const benchHeapFloorEnv = "TETHER_BENCH_HEAP_FLOOR"

// keepHeapFloor keeps, for a benchmark's rig, the heap floor
// $TETHER_BENCH_HEAP_FLOOR asks for. A test's rig keeps none.
func keepHeapFloor(tb testing.TB) {
	tb.Helper()
	v := os.Getenv(benchHeapFloorEnv)
	if _, ok := tb.(*testing.B); !ok || v == "" {
		return
	}
	floor, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		tb.Fatalf("$%s=%q: want a whole number of bytes (0: none)", benchHeapFloorEnv, v)
	}
	stop, err := heapfloor.Start(floor)
	if errors.Is(err, heapfloor.ErrStarted) { // a rig of this benchmark's keeps it
		return
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(stop)
}

// startRig starts the orchestrator on a fresh store of bs (nil: a bbolt
// file) and `workers` worker processes with `slots` slots each (and
// ahead[0] leases ahead, if given), and waits until all are connected.
func startRig(tb testing.TB, bs *benchStore, workers, slots int, ahead ...int) *benchRig {
	tb.Helper()
	keepHeapFloor(tb)
	bin := buildWorker(tb)
	st := &watchStore{Backend: bs.open(tb)}
	d, err := orchestrator.Start(orchestrator.Options{
		Addr: "127.0.0.1:0", Store: st,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var procs []*exec.Cmd
	var logs []*lockedBuffer
	for i := range workers {
		tok, err := d.CreateToken(ctx, fmt.Sprintf("bench-%d", i+1), time.Hour)
		if err != nil {
			tb.Fatal(err)
		}
		cmd := exec.Command(bin, "connect", "--url", d.URL(), "--token", tok, "--slots", strconv.Itoa(slots),
			"--executor", "noop", "--no-reconnect", "--state-dir", tb.TempDir())
		if len(ahead) > 0 {
			cmd.Args = append(cmd.Args, "--ahead", strconv.Itoa(ahead[0]))
		}
		if dir := os.Getenv(benchWorkerProfileEnv); dir != "" { // each worker's CPU profile, from its start to its exit
			cmd.Env = append(os.Environ(), fmt.Sprintf("TETHER_WORKER_CPUPROFILE=%s", filepath.Join(dir, fmt.Sprintf("worker-%d-%d.cpu", os.Getpid(), workerSeq.Add(1)))))
		}
		buf := &lockedBuffer{}
		cmd.Stdout, cmd.Stderr = buf, buf
		if err := cmd.Start(); err != nil {
			tb.Fatal(err)
		}
		procs = append(procs, cmd)
		logs = append(logs, buf)
	}
	tb.Cleanup(func() {
		for _, p := range procs {
			p.Process.Signal(os.Interrupt) // only our own children, by pid
		}
		for i, p := range procs {
			if err := p.Wait(); err != nil || tb.Failed() {
				tb.Logf("worker %d: %v\n%s", i+1, err, logs[i])
			}
		}
		if err := d.Close(); err != nil {
			tb.Errorf("orchestrator: %v", err)
		}
	})
	for {
		n := 0
		if err := d.Snapshot(ctx, func(o *core.Orchestrator) {
			for _, w := range o.Workers() {
				if w.Connected && w.Active {
					n++
				}
			}
		}); err != nil {
			tb.Fatal(err)
		}
		if n == workers {
			r := &benchRig{d: d, st: st}
			for _, p := range procs {
				r.workers = append(r.workers, p.Process.Pid)
			}
			return r
		}
		select {
		case <-ctx.Done():
			tb.Fatalf("%d of %d workers connected", n, workers)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// noopRun is a run of n independent steps.
func noopRun(n int) core.RunSpec {
	spec := core.RunSpec{Name: "bench"}
	for i := range n {
		spec.Steps = append(spec.Steps, core.StepSpec{Name: "s" + strconv.Itoa(i), Command: "true"})
	}
	return spec
}

// throughput submits steps no-op steps (runs of runSize) and returns the time
// from the first Submit to the durable commit of the last run's finish, the
// number of commits in between, and a check that every step succeeded, to
// call after the process's CPU time is read: it reads each run's history,
// work the orchestrator does not do for a run.
func (r *benchRig) throughput(tb testing.TB, steps, runSize int) (time.Duration, int, func()) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
	defer cancel()
	runs := steps / runSize
	spec := noopRun(runSize)
	var (
		finished = map[string]bool{}
		commits  int
		done     = make(chan time.Time, 1)
	)
	r.st.setWatch(func(recs []core.Record, at time.Time) { // one commit at a time
		commits++
		for _, rec := range recs {
			if id, ok := finishedRun(rec); ok && !finished[id] {
				finished[id] = true
				if len(finished) == runs {
					done <- at
				}
			}
		}
	})
	defer r.st.setWatch(nil)
	ids := make(chan core.RunID, runs)
	errs := make(chan error, 1)
	t0 := time.Now()
	go func() {
		for range runs {
			id, err := r.d.Submit(ctx, spec)
			if err != nil {
				errs <- err
				return
			}
			ids <- id
		}
	}()
	var t1 time.Time
	select {
	case t1 = <-done:
	case err := <-errs:
		tb.Fatal(err)
	case <-ctx.Done():
		tb.Fatalf("%d of %d runs finished within %s", len(ids), runs, benchTimeout)
	}
	close(ids)
	check := func() { // not timed: every step must have succeeded
		tb.Helper()
		var bad []string
		for id := range ids {
			h, err := r.st.History(id) // finished, so archived
			if err != nil {
				tb.Fatal(err)
			}
			if h.Status != "success" || len(h.Run.Steps) != runSize {
				bad = append(bad, fmt.Sprintf("%s %s (%d steps)", id, h.Status, len(h.Run.Steps)))
			}
		}
		if len(bad) > 0 {
			tb.Fatalf("runs did not succeed: %v", bad)
		}
	}
	return t1.Sub(t0), commits, check
}

// latency is one single-step run's times from calling Submit: to the grant
// of its lease being durable (the Dispatch leaves right after; submit and
// grant are one commit when a slot is free), to its START being durable,
// and to the run's finish being durable.
type latency struct{ dispatched, started, finished time.Duration }

// latencies runs n single-step runs one at a time.
func (r *benchRig) latencies(tb testing.TB, n int) []latency {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
	defer cancel()
	spec := noopRun(1)
	type sample struct{ dispatched, started, finished time.Time }
	var (
		mu      sync.Mutex
		armed   bool // a run was submitted and its finish not seen yet
		current sample
		done    = make(chan sample, 1)
	)
	r.st.setWatch(func(recs []core.Record, at time.Time) {
		mu.Lock()
		defer mu.Unlock()
		if !armed {
			return
		}
		// One batch may hold several of the three (records are in key
		// order, "lease/" < "run/" < "step/"): look for them in turn.
		for _, rec := range recs {
			if current.dispatched.IsZero() && strings.HasPrefix(rec.Key, core.KindLease+"/") && bytes.Contains(rec.Value, leaseCurrent) {
				current.dispatched = at
			}
		}
		for _, rec := range recs {
			if !current.dispatched.IsZero() && current.started.IsZero() && strings.HasPrefix(rec.Key, core.KindStep+"/") && bytes.Contains(rec.Value, stepStarted) {
				current.started = at
			}
		}
		for _, rec := range recs {
			if _, ok := finishedRun(rec); ok && !current.dispatched.IsZero() {
				if current.started.IsZero() {
					// START and report in one batch: the run left the
					// core in it, so its step record was deleted, not
					// written with its start.
					current.started = at
				}
				current.finished = at
				armed = false
				done <- current
				current = sample{}
			}
		}
	})
	defer r.st.setWatch(nil)
	var out []latency
	for range n {
		mu.Lock()
		armed = true
		mu.Unlock()
		t0 := time.Now()
		if _, err := r.d.Submit(ctx, spec); err != nil {
			tb.Fatal(err)
		}
		select {
		case s := <-done:
			out = append(out, latency{s.dispatched.Sub(t0), s.started.Sub(t0), s.finished.Sub(t0)})
		case <-ctx.Done():
			tb.Fatalf("a single-step run did not finish within %s", benchTimeout)
		}
	}
	return out
}

func percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(p/100*float64(len(s)) + 0.5)
	return s[min(max(i-1, 0), len(s)-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// BenchmarkEndToEnd is `make bench`'s end-to-end figure; see the top of
// this file. Each iteration does the whole workload (20,000 steps, or 2,000
// latency samples), so run it with -benchtime 1x (repeat with -count).
func BenchmarkEndToEnd(b *testing.B) {
	bs := benchStoreFromEnv(b)
	for _, sh := range benchShapes {
		b.Run(sh.name(), func(b *testing.B) {
			r := startRig(b, bs, sh.workers, sh.slots, sh.ahead)
			var total time.Duration
			commits := 0
			u0 := r.usage(b)
			busy0, recs0 := r.st.busyTime()
			r.d.ResetLoopStats() // the loop under this shape's load, not the rig's start
			b.ResetTimer()
			var checks []func()
			for range b.N {
				d, c, check := r.throughput(b, benchSteps, benchRunSize)
				total += d
				commits += c
				checks = append(checks, check)
			}
			b.StopTimer()
			u1 := r.usage(b)
			for _, check := range checks {
				check()
			}
			busy, recs := r.st.busyTime()
			busy, recs = busy-busy0, recs-recs0
			steps := float64(benchSteps * b.N)
			b.ReportMetric(steps/total.Seconds(), "steps/s")
			b.ReportMetric(steps/float64(commits), "steps/commit")
			b.ReportMetric(float64(busy.Microseconds())/1000/float64(commits), "ms/commit")
			b.ReportMetric(float64(recs)/steps, "records/step")
			b.ReportMetric(100*busy.Seconds()/total.Seconds(), "%store-busy")
			b.ReportMetric(float64((u1.orchCPU-u0.orchCPU).Microseconds())/steps, "orch-cpu-µs/step")
			b.ReportMetric(float64((u1.workerCPU-u0.workerCPU).Microseconds())/steps, "worker-cpu-µs/step")
			b.ReportMetric(float64(u1.ctxsw-u0.ctxsw)/steps, "ctxsw/step")
			b.ReportMetric(float64(u1.gcCycles-u0.gcCycles)/float64(b.N), "gc-cycles/op")
			b.ReportMetric(float64(u1.allocBytes-u0.allocBytes)/steps, "alloc-B/step")
			ls := r.d.LoopStats() // the loop's longest batch, and its quantiles (SPEC §12)
			b.ReportMetric(ms(ls.Max), "loop-max-ms")
			b.ReportMetric(ms(ls.P99), "loop-p99-ms")
			b.ReportMetric(0, "ns/op") // the run's wall time is in steps/s
		})
	}
	b.Run("submit=largest", func(b *testing.B) {
		// The largest valid submission (largestRun), on an idle
		// orchestrator with a real bbolt file, submitted b.N times;
		// loop-max-ms is the longest batch the loop ran.
		r := startRig(b, bs, 1, 1)
		spec := largestRun()
		if err := spec.Validate(); err != nil {
			b.Fatal(err)
		}
		var worst time.Duration
		b.ResetTimer()
		for range b.N {
			r.d.ResetLoopStats()
			if _, err := r.d.Submit(context.Background(), spec); err != nil {
				b.Fatal(err)
			}
			// The answer leaves before the batch's measurement is kept: a
			// read through the loop comes after it.
			if err := r.d.Snapshot(context.Background(), func(*core.Orchestrator) {}); err != nil {
				b.Fatal(err)
			}
			worst = max(worst, r.d.LoopStats().Max)
		}
		b.StopTimer()
		b.ReportMetric(ms(worst), "loop-max-ms")
		b.ReportMetric(0, "ns/op")
	})
	b.Run("latency/idle", func(b *testing.B) {
		r := startRig(b, bs, benchWorkers, 16)
		var lat []latency
		b.ResetTimer()
		for range b.N {
			lat = append(lat, r.latencies(b, latencySamples)...)
		}
		b.StopTimer()
		for _, m := range []struct {
			name string
			of   func(latency) time.Duration
		}{
			{"dispatch", func(l latency) time.Duration { return l.dispatched }},
			{"start", func(l latency) time.Duration { return l.started }},
			{"done", func(l latency) time.Duration { return l.finished }},
		} {
			ds := make([]time.Duration, len(lat))
			for i, l := range lat {
				ds[i] = m.of(l)
			}
			b.ReportMetric(ms(percentile(ds, 50)), m.name+"-p50-ms")
			b.ReportMetric(ms(percentile(ds, 99)), m.name+"-p99-ms")
		}
		b.ReportMetric(0, "ns/op")
	})
	benchPeers(b, bs)
}

// largestRun is a run at the submission limits (SPEC §12): 1,000 expanded
// steps, 5,000 edges (100 instances on 50 task instances, which succeed at
// submit, so their dependents are promoted in the same batch) and 64 KiB of
// expanded names (the 850 others named with 43 bytes); every step gated by
// hold, so each also writes an event.
func largestRun() core.RunSpec {
	items := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = strconv.Itoa(i)
		}
		return out
	}
	return core.RunSpec{Name: "largest", Steps: []core.StepSpec{
		{Name: "a", ForEach: items(50), Type: "task"},
		{Name: "b", Command: "true", ForEach: items(100), DependsOn: []string{"a"}, Hold: true},
		{Name: strings.Repeat("c", 43), Command: "true", ForEach: items(core.MaxStepsPerRun - 150), Hold: true},
	}}
}

// TestLargestSubmission: the largest valid run is accepted, and one step,
// one edge or one byte of names more is not (SPEC §12); the benchmark above
// measures it.
func TestLargestSubmission(t *testing.T) {
	if err := largestRun().Validate(); err != nil {
		t.Fatalf("the largest run is refused: %v", err)
	}
	for what, change := range map[string]func(r *core.RunSpec){
		"a step": func(r *core.RunSpec) { r.Steps[2].ForEach = append(r.Steps[2].ForEach, "x") },
		"an edge": func(r *core.RunSpec) {
			r.Steps[1].ForEach = append(r.Steps[1].ForEach, "x")
			r.Steps[2].ForEach = r.Steps[2].ForEach[1:]
		},
		"a byte (name)": func(r *core.RunSpec) { r.Steps[2].Name += "c" },
	} {
		r := largestRun()
		change(&r)
		if err := r.Validate(); err == nil {
			t.Errorf("%s more is accepted", what)
		}
	}
}

// TestEndToEndBenchRig keeps the benchmark's rig honest under `make test`
// (which runs no benchmarks): a small throughput run and a few latency
// samples through the same code.
func TestEndToEndBenchRig(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the worker binary")
	}
	r := startRig(t, nil, 2, 4)
	d, commits, check := r.throughput(t, 400, benchRunSize)
	if d <= 0 || commits == 0 {
		t.Errorf("throughput: %s, %d commits", d, commits)
	}
	check()
	for i, l := range r.latencies(t, 5) {
		if l.dispatched <= 0 || l.started < l.dispatched || l.finished < l.started {
			t.Errorf("sample %d: %+v", i, l)
		}
	}
}
