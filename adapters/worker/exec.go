package worker

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tether-run/tether/adapters/logging"
	"github.com/tether-run/tether/core"
)

// Executor limits.
const (
	maxLine = 16 << 10 // longer output lines are truncated
	// One output input carries at most this many lines (one Logs message)
	// or about this many bytes: the lines already in the pipe when read.
	maxBatchLines = 1000
	maxBatchBytes = 256 << 10
	drainPoll     = 100 * time.Millisecond // how often a waiting exit looks at the reader
	drainWait     = time.Second            // after the step's process exits, wait this long for its pipe to close
	exitCodeErr   = 127                    // exit code reported when the process could not start
	killSignal    = syscall.SIGKILL        // ExecKill, and leftovers of an exited step
	termSignal    = syscall.SIGTERM        // ExecTerm
)

// proc is a running step process: the leader of its own process group (the
// shim, when there is one, or the shell).
type proc struct {
	log  *slog.Logger // with the lease's fields (SPEC §16)
	pgid int
	gate *outGate // its pipe reader's gate (SPEC §10 backpressure)
	shim bool
	// signalled: the worker stopped it (cancel, timeout, drain, its own
	// shutdown): its output directory is not uploaded (SPEC §10
	// persistFile).
	signalled atomic.Bool
	// gone: the leader is reaped, so pgid may name another process's group
	// by now: no signal is sent any more. mu makes a signal and the reaping
	// exclude each other.
	mu   sync.Mutex
	gone bool
}

// outGate lets a step's pipe reader take one batch of output at a time, and
// only while the core does not report the lease's output paused (its window
// of unacknowledged lines is full): the step then blocks on write, as under
// a slow terminal. The reader sets pending when it hands a batch to the
// loop; the loop goroutine sets paused after every Step and clears pending
// when it has stepped the batch; it never blocks.
type outGate struct {
	mu      sync.Mutex
	paused  bool          // the core's OutputPaused for the lease
	pending bool          // a batch is on its way to the loop
	wake    chan struct{} // capacity 1: the state changed
}

func newOutGate() *outGate { return &outGate{wake: make(chan struct{}, 1)} }

func (g *outGate) update(f func()) {
	g.mu.Lock()
	f()
	g.mu.Unlock()
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// setPaused and taken are for the loop goroutine.
func (g *outGate) setPaused(p bool) {
	g.mu.Lock()
	same := g.paused == p
	g.mu.Unlock()
	if !same {
		g.update(func() { g.paused = p })
	}
}

func (g *outGate) taken() { g.update(func() { g.pending = false }) }

// isPaused says whether the reader is held (for acks, or for the loop to
// take its batch), not reading the pipe.
func (g *outGate) isPaused() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.paused || g.pending
}

// hold marks a batch on its way to the loop: the reader reads no more
// until the loop took it.
func (g *outGate) hold() {
	g.mu.Lock()
	g.pending = true
	g.mu.Unlock()
}

// acquire waits until the reader may read a batch (nothing paused or
// pending); false once done is closed (the worker is stopping).
func (g *outGate) acquire(done <-chan struct{}) bool {
	for {
		g.mu.Lock()
		ok := !g.paused && !g.pending
		g.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-g.wake:
		case <-done:
			return false
		}
	}
}

// signal sends sig to the step's process group. Under a shim, SIGTERM goes
// to the shim alone, which passes it on to the whole group once and waits
// for the shell (so every process gets exactly one, as without a shim).
// Once the leader is reaped it sends nothing: its pid, the group's id, may
// have been reused.
func (p *proc) signal(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gone {
		return
	}
	target := -p.pgid
	if p.shim && sig == termSignal {
		target = p.pgid
	}
	if err := syscall.Kill(target, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		p.log.Warn("signal step process group", "pgid", p.pgid, "signal", sig.String(), "err", err)
	}
}

// exec carries out one executor command (loop goroutine only).
func (d *Driver) exec(c core.ExecCommand) {
	switch c.Op {
	case core.ExecStart:
		d.start(c)
	case core.ExecTerm, core.ExecKill:
		p := d.procs[c.Lease]
		if p == nil {
			d.cancelFetch(c.Lease) // not started yet: it will not be
			return                 // or already reaped
		}
		sig := termSignal
		if c.Op == core.ExecKill {
			sig = killSignal
		}
		p.log.Info("signalling step", "signal", sig.String())
		p.signalled.Store(true)
		p.signal(sig)
	default:
		d.log.Error("unknown executor command", append(logging.LeaseAttrs(c.Lease, c.Step), "op", c.Op.String())...)
	}
}

// start runs `sh -c <command>` in its own process group (or, with
// Options.Noop, nothing: the step exits 0 at once), with the shipped
// env overlaid on the base environment and stdout and stderr on one pipe,
// read line by line. With Options.Shim the shell runs under the shim, which
// leads the group and takes it down with the worker (§10). Its exit, or its
// failure to start, comes back as an exited input after all of its output.
func (d *Driver) start(c core.ExecCommand) {
	lease := c.Lease
	if d.opts.Noop { // nothing runs, so nothing logs: no logger is made
		d.local = append(d.local, exited{Lease: lease}) // the loop takes it next
		return
	}
	log := d.log.With(logging.LeaseAttrs(lease, c.Step)...)
	if !d.secretsReady(c) {
		return // the loop starts it once its secrets are fetched (SPEC §14a)
	}
	sec := d.secrets[lease]
	cmd := exec.Command("sh", "-c", c.Command)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if d.opts.Shim != "" {
		cmd = exec.Command(d.opts.Shim, ShimArg, strconv.Itoa(os.Getpid()), c.Command)
		cmd.SysProcAttr = shimAttr()
	}
	var exitWait func() (zombie bool, err error)
	var endpoint map[string]string
	if d.endpoint != nil {
		// The step endpoint's variables, set here and not shipped: the
		// orchestrator drops TETHER_* from what it ships.
		endpoint = d.endpoint.grant(lease)
	}
	// A fresh scratch directory (the cwd) and an empty output directory.
	var err error
	if d.workDir == "" { // a driver whose loop a test plays, without Run
		err = d.openWorkDir()
	}
	var dirs stepDirs
	if err == nil {
		dirs, err = d.makeStepDirs(lease)
	}
	var pr, pw *os.File
	if err == nil {
		cmd.Dir = dirs.scratch
		cmd.Env = overlay(d.opts.Env, c.Env, endpoint, map[string]string{EnvScratch: dirs.scratch, EnvOutputDir: dirs.output}, sec.environ())
		pr, pw, err = os.Pipe()
	}
	if err == nil {
		cmd.Stdout, cmd.Stderr = pw, pw
		if d.opts.Shim != "" {
			exitWait, err = startPinned(cmd)
		} else if err = cmd.Start(); err == nil {
			exitWait = func() (bool, error) { return awaitLeader(cmd) }
		}
		pw.Close() // the child holds its own copy
		if err != nil {
			pr.Close()
		}
	}
	if err != nil {
		log.Warn("step process failed to start", "err", err)
		d.removeStepDirs(dirs, log)
		d.wg.Add(1)
		go func() { // never push from the loop goroutine: it is the only consumer
			defer d.wg.Done()
			d.push(exited{Lease: lease, ExitCode: exitCodeErr, Err: "start: " + err.Error()})
		}()
		return
	}
	p := &proc{log: log, pgid: cmd.Process.Pid, gate: newOutGate(), shim: d.opts.Shim != ""}
	d.procs[lease] = p
	log.Info("step process started", "pid", p.pgid)
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		drained := make(chan struct{})
		go func() {
			defer close(drained)
			readOutput(pr, p.gate, d.done, func(lines []string) bool { return d.push(output{lease: lease, lines: sec.redactLines(lines)}) })
		}()
		// The leader has exited; where the system allows (Linux) it is
		// not reaped yet, so its pid, the group's id, is not reused while
		// the kill below or a cancel may still name the group.
		zombie, werr := exitWait()
		// Background processes may still hold the pipe: give them a
		// moment, then kill what is left of the group, and after another
		// stop reading (one outside the group, e.g. under setsid, is not
		// waited for: SPEC §10). The moment is counted only while the
		// reader reads: a reader held for acks still has the step's last
		// output to deliver. A stopping worker reads no more at once.
		waitDrained(drained, p.gate, d.done, func() { p.signal(killSignal) })
		pr.Close()
		<-drained
		p.mu.Lock()
		if zombie {
			werr = cmd.Wait()
		}
		p.gone = true
		p.mu.Unlock()
		x := exited{Lease: lease}
		switch st, ok := waitStatus(cmd); {
		case ok && st.Signaled():
			x.Signaled, x.ExitCode = true, 128+int(st.Signal()) // the shell's convention
		case ok:
			x.ExitCode = st.ExitStatus()
		default:
			x.ExitCode, x.Err = exitCodeErr, fmt.Sprintf("wait: %v", werr)
		}
		log.Info("step process exited", "exit_code", x.ExitCode, "signaled", x.Signaled)
		// persistFile: the output directory's files, uploaded before the
		// report (which waits for them); a failed upload fails the step.
		ctx := d.ctx
		if ctx == nil {
			ctx = context.Background() // a driver whose loop a test plays
		}
		var lines []string
		var perr error
		if p.signalled.Load() {
			log.Info("the step was stopped: its output directory is not uploaded")
		} else {
			lines, perr = d.persistOutputs(ctx, lease, dirs.output)
		}
		if perr != nil {
			log.Warn("step output files not stored; the step fails", "err", perr)
			if x.Err == "" {
				x.Err = perr.Error()
			}
		}
		if len(lines) > 0 && p.gate.acquire(d.done) {
			p.gate.hold()
			d.push(output{lease: lease, lines: lines}) // false only once the worker stops: then so is the exit's
		}
		d.removeStepDirs(dirs, log)
		d.push(x)
	}()
}

func waitStatus(cmd *exec.Cmd) (syscall.WaitStatus, bool) {
	if cmd.ProcessState == nil {
		return 0, false
	}
	st, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	return st, ok
}

// waitDrained waits for the reader to finish: after drainWait of reading
// without an end it calls kill, after another it gives up; at once when
// done is closed (the worker is stopping: nothing more is pushed).
func waitDrained(drained <-chan struct{}, g *outGate, done <-chan struct{}, kill func()) {
	tick := time.NewTicker(drainPoll)
	defer tick.Stop()
	reading, killed := time.Duration(0), false
	for {
		select {
		case <-drained:
			return
		case <-done:
			return
		case <-tick.C:
		}
		if g.isPaused() {
			continue
		}
		if reading += drainPoll; reading < drainWait {
			continue
		}
		if killed {
			return
		}
		kill()
		reading, killed = 0, true
	}
}

// readOutput reads r in batches, each acquired from the gate: the complete
// lines already buffered when the first arrives (at most maxBatchLines,
// about maxBatchBytes), passed to emit without their line endings, lines
// longer than maxLine cut. It returns when r ends, done is closed or emit
// returns false.
func readOutput(r io.Reader, g *outGate, done <-chan struct{}, emit func([]string) bool) {
	br := bufio.NewReaderSize(r, maxLine+len("\r\n")) // a line of maxLine and its ending fits
	for {
		if !g.acquire(done) {
			return
		}
		var lines []string
		size := 0
		var err error
		for {
			var text string
			var ok bool
			text, ok, err = readLine(br)
			if ok {
				lines = append(lines, text)
				size += len(text) + 1
			}
			if err != nil || len(lines) >= maxBatchLines || size >= maxBatchBytes || !lineBuffered(br) {
				break
			}
		}
		if len(lines) > 0 {
			g.hold()
			if !emit(lines) {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// lineBuffered says whether a complete line waits in br (so reading it does
// not block).
func lineBuffered(br *bufio.Reader) bool {
	b, _ := br.Peek(br.Buffered())
	return bytes.IndexByte(b, '\n') >= 0
}

// readLine reads one line without its ending, cutting one longer than
// maxLine (SPEC §10: a line of exactly maxLine is whole); ok is false when
// there was nothing to read.
func readLine(br *bufio.Reader) (text string, ok bool, err error) {
	line, err := br.ReadSlice('\n')
	b := bytes.TrimRight(line, "\r\n")
	truncated := len(b) > maxLine
	text = string(b[:min(len(b), maxLine)]) // before the buffer is read again
	ok = len(line) > 0
	for errors.Is(err, bufio.ErrBufferFull) {
		truncated = true
		_, err = br.ReadSlice('\n')
	}
	if truncated {
		text = strings.ToValidUTF8(text, "") + " [line truncated]"
	}
	return text, ok, err
}

// overlay returns base with each env's variables set in turn (a later one
// replacing any of the same name), sorted by name.
func overlay(base []string, envs ...map[string]string) []string {
	m := make(map[string]string, len(base))
	for _, kv := range base {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	for _, env := range envs {
		for k, v := range env {
			m[k] = v
		}
	}
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}
