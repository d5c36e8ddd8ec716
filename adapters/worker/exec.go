package worker

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tether-run/tether/core"
)

// Executor limits.
const (
	maxLine     = 16 << 10        // longer output lines are truncated
	drainWait   = time.Second     // after the shell exits, wait this long for its pipe to close
	exitCodeErr = 127             // exit code reported when the process could not start
	killSignal  = syscall.SIGKILL // ExecKill, and leftovers of an exited step
	termSignal  = syscall.SIGTERM // ExecTerm
)

// proc is a running step process: the leader of its own process group (the
// shim, when there is one, or the shell).
type proc struct {
	pgid int
	shim bool
}

// signal sends sig to the step's process group. Under a shim, SIGTERM goes
// to the shim alone, which passes it on to the whole group once and waits
// for the shell (so every process gets exactly one, as without a shim).
func (p *proc) signal(log *slog.Logger, lease core.LeaseID, sig syscall.Signal) {
	target := -p.pgid
	if p.shim && sig == termSignal {
		target = p.pgid
	}
	if err := syscall.Kill(target, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		log.Warn("signal step process group", "lease", uint64(lease), "pgid", p.pgid, "signal", sig.String(), "err", err)
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
			return // already reaped
		}
		sig := termSignal
		if c.Op == core.ExecKill {
			sig = killSignal
		}
		d.log.Info("signalling step", "lease", uint64(c.Lease), "signal", sig.String())
		p.signal(d.log, c.Lease, sig)
	default:
		d.log.Error("unknown executor command", "op", c.Op.String(), "lease", uint64(c.Lease))
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
	if d.opts.Noop {
		d.local = append(d.local, exited{Lease: lease}) // the loop takes it next
		return
	}
	cmd := exec.Command("sh", "-c", c.Command)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if d.opts.Shim != "" {
		cmd = exec.Command(d.opts.Shim, ShimArg, strconv.Itoa(os.Getpid()), c.Command)
		cmd.SysProcAttr = shimAttr()
	}
	var wait func() error
	var endpoint map[string]string
	if d.endpoint != nil {
		// The step endpoint's variables, set here and not shipped: the
		// orchestrator drops TETHER_* from what it ships.
		endpoint = d.endpoint.grant(lease)
	}
	cmd.Env = overlay(d.opts.Env, c.Env, endpoint)
	pr, pw, err := os.Pipe()
	if err == nil {
		cmd.Stdout, cmd.Stderr = pw, pw
		if d.opts.Shim != "" {
			wait, err = startPinned(cmd)
		} else {
			wait, err = cmd.Wait, cmd.Start()
		}
		pw.Close() // the child holds its own copy
		if err != nil {
			pr.Close()
		}
	}
	if err != nil {
		d.log.Warn("step process failed to start", "lease", uint64(lease), "step", string(c.Step), "err", err)
		d.wg.Add(1)
		go func() { // never push from the loop goroutine: it is the only consumer
			defer d.wg.Done()
			d.push(exited{Lease: lease, ExitCode: exitCodeErr, Err: "start: " + err.Error()})
		}()
		return
	}
	p := &proc{pgid: cmd.Process.Pid, shim: d.opts.Shim != ""}
	d.procs[lease] = p
	d.log.Info("step process started", "lease", uint64(lease), "step", string(c.Step), "pid", p.pgid)
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		drained := make(chan struct{})
		go func() {
			defer close(drained)
			scanLines(pr, func(text string) bool { return d.push(output{lease: lease, text: text}) })
		}()
		werr := wait()
		// Background children may still hold the pipe: give them a moment,
		// then kill what is left of the group (the group still exists while
		// they do, so its id cannot have been reused) and stop reading.
		select {
		case <-drained:
		case <-time.After(drainWait):
			p.signal(d.log, lease, killSignal)
			select {
			case <-drained:
			case <-time.After(drainWait):
			}
		}
		pr.Close()
		<-drained
		x := exited{Lease: lease}
		switch st, ok := waitStatus(cmd); {
		case ok && st.Signaled():
			x.Signaled, x.ExitCode = true, 128+int(st.Signal()) // the shell's convention
		case ok:
			x.ExitCode = st.ExitStatus()
		default:
			x.ExitCode, x.Err = exitCodeErr, fmt.Sprintf("wait: %v", werr)
		}
		d.log.Info("step process exited", "lease", uint64(lease), "exit_code", x.ExitCode, "signaled", x.Signaled)
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

// scanLines calls emit for each line of r (without its line ending), cutting
// lines longer than maxLine, until r ends or emit returns false.
func scanLines(r io.Reader, emit func(string) bool) {
	br := bufio.NewReaderSize(r, maxLine)
	for {
		line, err := br.ReadSlice('\n')
		text := string(bytes.TrimRight(line, "\r\n"))
		truncated := false
		for errors.Is(err, bufio.ErrBufferFull) {
			truncated = true
			_, err = br.ReadSlice('\n')
		}
		if truncated {
			text = strings.ToValidUTF8(text, "") + " [line truncated]"
		}
		if len(line) > 0 && !emit(text) {
			return
		}
		if err != nil {
			return
		}
	}
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
