package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/gorilla/websocket"

	"github.com/tether-run/tether/adapters/wire"
	"github.com/tether-run/tether/core"
)

// Thresholds of the verdict (MB is 10^6 bytes).
const (
	maxRSS        = 100_000_000
	flatWithin    = 0.20 // from a quarter of the steps on, each line within this of the first
	maxRestart    = time.Second
	maxRestartRSS = 60_000_000
)

// sample is one printed line of the load.
type sample struct {
	steps int
	mem   memory
	store int64
}

// result is what the verdict judges.
type result struct {
	runs         int // runs that finished, every one a success
	samples      []sample
	restarted    bool
	restartReady time.Duration
	restartMem   memory
	retainSkip   string // why the retention phase did not run ("" if it did)
	retainMid    int64  // store size at the middle of the retention phase
	retainEnd    int64  // and at its end
	failed       bool   // a threshold failed
}

// soak runs the phases and prints the lines and the verdict. An error is a
// failed run or a harness failure; res.failed a threshold that failed.
func soak(ctx context.Context, cfg config, out io.Writer) (res result, err error) {
	dir, err := os.MkdirTemp("", "tether-soak-")
	if err != nil {
		return res, err
	}
	if cfg.keep {
		defer fmt.Fprintf(out, "soak: kept %s (stores, logs, binaries)\n", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	b, err := buildBins(ctx, cfg.binDir, dir, cfg.race)
	if err != nil {
		return res, err
	}
	if cfg.race {
		defer func() {
			bad, rerr := races(dir)
			err = errors.Join(err, rerr)
			if len(bad) > 0 {
				err = errors.Join(err, fmt.Errorf("a binary reported a data race: see %s", strings.Join(bad, ", ")))
				for _, l := range bad {
					b, _ := os.ReadFile(l)
					fmt.Fprintf(out, "%s:\n%s\n", l, b)
				}
			}
		}()
	}
	race := ""
	if cfg.race {
		race = " race=true (binaries built with -race: the figures mean little)"
	}
	fmt.Fprintf(out, "soak: steps=%d runsize=%d workers=%d slots=%d inflight=%d cpus=%d orchestrator=%s%s\n",
		cfg.steps, cfg.runSize, cfg.workers, cfg.slots, cfg.inFlight, runtime.NumCPU(), b.orchestrator, race)

	var extra []string
	if cfg.pprof != "" {
		extra = []string{"--pprof", cfg.pprof}
	}
	c, err := newCluster(b, filepath.Join(dir, "load"), extra...)
	if err != nil {
		return res, err
	}
	defer c.close()
	if err := c.startOrchestrator(); err != nil {
		return res, err
	}
	if err := c.waitAPI(ctx); err != nil {
		return res, err
	}
	if err := c.startWorkers(ctx, cfg.workers, cfg.slots); err != nil {
		return res, err
	}

	// Load.
	l := &loader{c: c, cfg: cfg, workflow: noopWorkflow(cfg.runSize)}
	total, submitted := cfg.steps/cfg.runSize, 0
	next, t0 := cfg.every, time.Now()
	last := struct {
		steps int
		at    time.Time
	}{0, t0}
	// Every line is taken in the same state: a run just finished and the
	// others of the in-flight window still running. So submitting goes on
	// past total, by the window less one, and those runs finish after the
	// last line (they must succeed too); the memory once nothing is in
	// flight is printed apart (drained).
	err = l.load(ctx, func() bool {
		if submitted < total+cfg.inFlight-1 {
			submitted++
			return true
		}
		return false
	}, func() error {
		if l.steps < next || l.steps > cfg.steps {
			return nil // the runs beyond the load keep the window full; no line
		}
		for next <= l.steps {
			next += cfg.every
		}
		m, err := c.memory()
		if err != nil {
			return err
		}
		now := time.Now()
		s := sample{steps: l.steps, mem: m, store: c.storeSize()}
		res.samples = append(res.samples, s)
		fmt.Fprintf(out, "steps=%d rss_mib=%.1f peak_rss_mib=%.1f anon_mib=%.1f file_mib=%.1f store_mib=%.1f steps_per_s=%.0f runs=%d elapsed_s=%.1f\n",
			s.steps, mib(m.rss), mib(m.peak), mib(m.anon), mib(m.file), mib(s.store), float64(l.steps-last.steps)/now.Sub(last.at).Seconds(), l.runs, now.Sub(t0).Seconds())
		last.steps, last.at = l.steps, now
		return nil
	})
	if err != nil {
		return res, err
	}
	took := time.Since(t0)
	res.runs = l.runs
	fmt.Fprintf(out, "load: %d steps in %d runs (the last %d after the last line), every run succeeded, %.1fs, steps_per_s=%.0f, reads of a run %.1f (GET /api/runs/{id} until it finished)\n",
		l.steps, l.runs, l.runs-total, took.Seconds(), float64(l.steps)/took.Seconds(), float64(l.polls)/float64(l.runs))
	if m, err := c.memory(); err == nil {
		fmt.Fprintf(out, "drained: rss_mib=%.1f anon_mib=%.1f file_mib=%.1f (no run in flight)\n", mib(m.rss), mib(m.anon), mib(m.file))
	}

	// Restart.
	if cfg.restart {
		if err := restart(ctx, c, l.lastRun, l.steps, cfg, out, &res); err != nil {
			return res, err
		}
	}
	if err := c.stopOrchestrator(); err != nil {
		return res, err
	}

	// Retention.
	if cfg.retain != "" {
		if err := retention(ctx, b, filepath.Join(dir, "retain"), cfg, out, &res); err != nil {
			return res, err
		}
	}
	res.failed = printVerdict(out, cfg, &res)
	return res, nil
}

// loader submits runs and reads them back until they finished.
type loader struct {
	c        *cluster
	cfg      config
	workflow []byte
	runs     int // finished (all succeeded: a failed one ends the load)
	steps    int
	polls    int    // reads of a run
	lastRun  string // the last run that finished
	finishes []time.Time
}

// load keeps at most cfg.inFlight runs submitted and unfinished while more()
// says to submit another, and calls finished after each run that finished.
// It reads the oldest run in flight (runs of equal size finish in about the
// order they were submitted): when it has not finished, it waits until the
// next finish is due at the recent spacing of finishes, so a run is read
// about twice however fast they go — every read copies the run's steps on
// the orchestrator's loop, and the figures should measure the load, not
// the harness.
func (l *loader) load(ctx context.Context, more func() bool, finished func() error) error {
	var queue []string
	for {
		for len(queue) < l.cfg.inFlight && more() {
			id, err := l.c.api.submit(ctx, l.workflow)
			if err != nil {
				return l.c.failure(err)
			}
			queue = append(queue, id)
		}
		if len(queue) == 0 {
			return nil
		}
		d, err := l.c.api.run(ctx, queue[0])
		l.polls++
		if err != nil {
			return l.c.failure(fmt.Errorf("read %s: %w", queue[0], err))
		}
		done, err := checkRun(d, l.cfg.runSize)
		if err != nil {
			return err
		}
		if !done {
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s did not finish: %w", queue[0], ctx.Err())
			case <-time.After(l.wait()):
			}
			continue
		}
		queue = queue[1:]
		l.runs++
		l.steps += l.cfg.runSize
		l.lastRun = d.Run.ID
		l.finishes = append(l.finishes, time.Now())
		if len(l.finishes) > 16 {
			l.finishes = l.finishes[1:]
		}
		if err := finished(); err != nil {
			return err
		}
	}
}

// wait is how long to wait before reading an unfinished run again: until
// the next finish is due at the spacing of the recent ones, or a quarter
// of that spacing if it is overdue; at least cfg.poll.
func (l *loader) wait() time.Duration {
	n := len(l.finishes)
	if n < 2 {
		return 4 * l.cfg.poll
	}
	spacing := l.finishes[n-1].Sub(l.finishes[0]) / time.Duration(n-1)
	due := time.Until(l.finishes[n-1].Add(spacing))
	if due < spacing/4 {
		due = spacing / 4
	}
	return min(max(due, l.cfg.poll), time.Second)
}

// checkRun says whether a run finished; a run that did not (or will not)
// succeed with every step is an error naming its steps that did not.
func checkRun(d runDetail, size int) (bool, error) {
	succeeded := d.Run.States["success"]
	if n := countState(d, "success"); n > succeeded {
		succeeded = n // the steps listed, should a summary leave its counts out
	}
	switch d.Run.Status {
	case "success":
		if succeeded == size && max(d.Run.Steps, len(d.Steps)) == size {
			return true, nil
		}
	case "failed", "cancelled", "failing", "cancelling":
	default: // running, or a status of a later tree that is not final
		if d.Run.FinishedAt.IsZero() {
			return false, nil
		}
	}
	var bad []string
	for _, s := range d.Steps {
		if s.State != "success" && len(bad) < 5 {
			bad = append(bad, fmt.Sprintf("%s %s %s %s", s.ID, s.State, s.Class, s.Message))
		}
	}
	return false, fmt.Errorf("run %s did not succeed: status %s, %d steps (want %d), states %v; e.g. %s",
		d.Run.ID, d.Run.Status, d.Run.Steps, size, d.Run.States, strings.Join(bad, "; "))
}

func countState(d runDetail, state string) int {
	n := 0
	for _, s := range d.Steps {
		if s.State == state {
			n++
		}
	}
	return n
}

// failure adds the orchestrator's log tail to an error of a request.
func (c *cluster) failure(err error) error {
	if c.orch.exited() {
		return fmt.Errorf("%w; the orchestrator exited: %v\n%s", err, c.orch.err, c.orch.tail(20))
	}
	return err
}

// restart stops the orchestrator (SIGTERM) and starts it again on the same
// data directory, timing from the process's start until a worker's Hello
// is answered with a Welcome and the API answers; then the last run must
// read back as it finished.
func restart(ctx context.Context, c *cluster, lastRun string, storedSteps int, cfg config, out io.Writer, res *result) error {
	probeToken, err := c.api.createToken(ctx, "soak-probe")
	if err != nil {
		return err
	}
	t := time.Now()
	if err := c.stopOrchestrator(); err != nil {
		return err
	}
	shutdown := time.Since(t)
	store := c.storeSize()

	pctx, cancel := context.WithTimeout(ctx, restartTimeout)
	defer cancel()
	type probe struct {
		at  time.Time
		err error
	}
	hello, apiUp := make(chan probe, 1), make(chan probe, 1)
	probeAPI := newAPIClient(c.api.base, c.api.token) // no connection of the old process
	t0 := time.Now()
	if err := c.startOrchestrator(); err != nil {
		return err
	}
	go func() {
		err := helloProbe(pctx, c.addr, probeToken)
		hello <- probe{time.Now(), err}
	}()
	go func() {
		for {
			_, err := probeAPI.workers(pctx)
			if err == nil || pctx.Err() != nil {
				apiUp <- probe{time.Now(), err}
				return
			}
			time.Sleep(time.Millisecond) // not serving yet: connection refused
		}
	}()
	h, a := <-hello, <-apiUp
	if err := errors.Join(h.err, a.err); err != nil {
		return c.failure(fmt.Errorf("restart: %w", err))
	}
	ready := max(h.at.Sub(t0), a.at.Sub(t0))
	m, err := c.memory()
	if err != nil {
		return err
	}
	res.restarted, res.restartReady, res.restartMem = true, ready, m
	fmt.Fprintf(out, "restart: ready_ms=%.0f hello_ms=%.0f api_ms=%.0f rss_mib=%.1f peak_rss_mib=%.1f anon_mib=%.1f file_mib=%.1f store_mib=%.1f shutdown_ms=%.0f (steps in the store: %d)\n",
		ms(ready), ms(h.at.Sub(t0)), ms(a.at.Sub(t0)), mib(m.rss), mib(m.peak), mib(m.anon), mib(m.file), mib(store), ms(shutdown), storedSteps)

	c.api = probeAPI
	d, err := c.api.run(ctx, lastRun)
	if err != nil {
		return c.failure(fmt.Errorf("after the restart, read %s: %w", lastRun, err))
	}
	if done, err := checkRun(d, cfg.runSize); err != nil || !done {
		return fmt.Errorf("after the restart, the last run %s reads back %s: %v", lastRun, d.Run.Status, err)
	}
	fmt.Fprintf(out, "restart: the last run, %s, reads back %s with %d steps\n", lastRun, d.Run.Status, d.Run.Steps)
	return nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// helloProbe connects to the control plane as a new worker (the token
// enrols it) until its Hello is answered with a Welcome. Until the process
// listens a dial is refused; while it restores, the dial waits.
func helloProbe(ctx context.Context, addr, token string) error {
	dialer := websocket.Dialer{HandshakeTimeout: restartTimeout}
	hello, err := wire.Encode(core.Hello{Version: core.ProtocolVersion, Token: token, Worker: "soak-probe-1", Name: "soak-probe",
		Slots: 1, MaxDelay: time.Second})
	if err != nil {
		return err
	}
	for {
		ws, _, err := dialer.DialContext(ctx, "ws://"+addr+"/control", nil)
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("control plane: %v", err)
			}
			time.Sleep(time.Millisecond)
			continue
		}
		defer ws.Close()
		if dl, ok := ctx.Deadline(); ok {
			ws.SetReadDeadline(dl)
		}
		if err := ws.WriteMessage(websocket.TextMessage, hello); err != nil {
			return fmt.Errorf("send Hello: %w", err)
		}
		_, b, err := ws.ReadMessage()
		if err != nil {
			return fmt.Errorf("no answer to Hello: %w", err)
		}
		m, err := wire.Decode(b)
		if err != nil {
			return fmt.Errorf("answer to Hello: %w", err)
		}
		if _, ok := m.(core.Welcome); !ok {
			return fmt.Errorf("Hello answered with %s, not a Welcome", core.DescribeMsg(m))
		}
		return nil
	}
}

// acceptsRetain says whether the orchestrator's serve has --retain (its
// help lists it).
func acceptsRetain(ctx context.Context, bin string) (bool, error) {
	outb, err := exec.CommandContext(ctx, bin, "serve", "--help").CombinedOutput()
	if err != nil {
		return false, fmt.Errorf("orchestrator serve --help: %v\n%s", err, outb)
	}
	for _, line := range strings.Split(string(outb), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && (f[0] == "-retain" || f[0] == "--retain") {
			return true, nil
		}
	}
	return false, nil
}

// retention runs a fresh orchestrator with serve --retain under the load
// for cfg.retainFor and prints the store's size every cfg.retainEvery.
func retention(ctx context.Context, b bins, dir string, cfg config, out io.Writer, res *result) error {
	ok, err := acceptsRetain(ctx, b.orchestrator)
	if err != nil {
		return err
	}
	if !ok {
		res.retainSkip = "this orchestrator's serve has no --retain flag (serve --help lists none)"
		fmt.Fprintf(out, "retain: skipped: %s\n", res.retainSkip)
		return nil
	}
	c, err := newCluster(b, dir, "--retain", cfg.retain)
	if err != nil {
		return err
	}
	defer c.close()
	if err := c.startOrchestrator(); err != nil {
		return err
	}
	if err := c.waitAPI(ctx); err != nil {
		return err
	}
	if err := c.startWorkers(ctx, cfg.workers, cfg.slots); err != nil {
		return err
	}
	l := &loader{c: c, cfg: cfg, workflow: noopWorkflow(cfg.runSize)}
	t0 := time.Now()
	end, nextAt, mid := t0.Add(cfg.retainFor), t0.Add(cfg.retainEvery), t0.Add(cfg.retainFor/2)
	res.retainMid = -1
	line := func(now time.Time) error {
		m, err := c.memory()
		if err != nil {
			return err
		}
		size := c.storeSize()
		if res.retainMid < 0 && !now.Before(mid) {
			res.retainMid = size
		}
		res.retainEnd = size
		fmt.Fprintf(out, "retain: t=%.0fs steps=%d store_mib=%.1f rss_mib=%.1f peak_rss_mib=%.1f anon_mib=%.1f file_mib=%.1f\n",
			now.Sub(t0).Seconds(), l.steps, mib(size), mib(m.rss), mib(m.peak), mib(m.anon), mib(m.file))
		return nil
	}
	fmt.Fprintf(out, "retain: serve --retain %s, the load for %s, the store's size every %s\n", cfg.retain, cfg.retainFor, cfg.retainEvery)
	err = l.load(ctx, func() bool { return time.Now().Before(end) }, func() error {
		if now := time.Now(); !now.Before(nextAt) {
			for !nextAt.After(now) {
				nextAt = nextAt.Add(cfg.retainEvery)
			}
			return line(now)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := line(time.Now()); err != nil {
		return err
	}
	return c.stopOrchestrator()
}

// printVerdict prints a line per threshold and says whether one failed.
func printVerdict(out io.Writer, cfg config, res *result) (failed bool) {
	verdict := func(name string, ok bool, format string, args ...any) {
		word := "PASS"
		if !ok {
			word, failed = "FAIL", true
		}
		fmt.Fprintf(out, "verdict: %-12s %s  %s\n", name, word, fmt.Sprintf(format, args...))
	}
	skip := func(name, why string) { fmt.Fprintf(out, "verdict: %-12s SKIP  %s\n", name, why) }

	fmt.Fprintf(out, "verdict: %-12s PASS  %d runs of %d steps, every one succeeded\n", "runs", res.runs, cfg.runSize)
	if len(res.samples) == 0 {
		skip("rss", "no line printed (-every > -steps)")
	} else {
		worst := res.samples[0]
		for _, s := range res.samples {
			if s.mem.rss > worst.mem.rss {
				worst = s
			}
		}
		verdict("rss", worst.mem.rss <= maxRSS, "largest %.1f MiB at steps=%d (at most 100 MB = %.1f MiB)",
			mib(worst.mem.rss), worst.steps, mib(maxRSS))
		var ref *sample
		lo, hi := int64(-1), int64(0)
		for i, s := range res.samples {
			if s.steps*4 < cfg.steps {
				continue
			}
			if ref == nil {
				ref = &res.samples[i]
			}
			if lo < 0 || s.mem.rss < lo {
				lo = s.mem.rss
			}
			hi = max(hi, s.mem.rss)
		}
		if ref == nil {
			skip("rss_flat", "no line from a quarter of the steps on")
		} else {
			r := float64(ref.mem.rss)
			verdict("rss_flat", float64(hi) <= r*(1+flatWithin) && float64(lo) >= r*(1-flatWithin),
				"from steps=%d (%.1f MiB): %.1f..%.1f MiB, %+.0f%%..%+.0f%% (within ±%.0f%%)",
				ref.steps, mib(ref.mem.rss), mib(lo), mib(hi), 100*(float64(lo)/r-1), 100*(float64(hi)/r-1), 100*flatWithin)
		}
	}
	if res.restarted {
		verdict("restart", res.restartReady <= maxRestart, "ready in %.0f ms (at most %.0f ms)", ms(res.restartReady), ms(maxRestart))
		verdict("restart_rss", res.restartMem.rss <= maxRestartRSS, "%.1f MiB after the restart (at most 60 MB = %.1f MiB)",
			mib(res.restartMem.rss), mib(maxRestartRSS))
	} else {
		skip("restart", "-restart=false")
	}
	retain, _ := time.ParseDuration(cfg.retain)
	switch {
	case cfg.retain == "":
		skip("retain", "-retain ''")
	case res.retainSkip != "":
		skip("retain", res.retainSkip)
	case cfg.retainFor < 4*retain:
		skip("retain", fmt.Sprintf("-retainfor %s is under 4 × --retain %s: its second half is no steady state; store %.1f MiB at the end",
			cfg.retainFor, cfg.retain, mib(res.retainEnd)))
	case res.retainMid < 0:
		skip("retain", "no size measured at the middle")
	default:
		verdict("retain", res.retainEnd <= res.retainMid, "store %.1f MiB at the middle, %.1f MiB at the end (must not grow)",
			mib(res.retainMid), mib(res.retainEnd))
	}
	if failed {
		fmt.Fprintln(out, "soak: FAIL")
	} else {
		fmt.Fprintln(out, "soak: PASS")
	}
	return failed
}
