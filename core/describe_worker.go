package core

import (
	"fmt"
	"strings"
	"time"
)

// DescribeWorkerReady renders rd one fact per line, in the order the driver
// applies it: send, close, dial, exec, log, exit, deadline. Times are printed
// relative to now ("+1.5s", "-45s"), never absolutely. A log line shows its
// level only when it is not info ("log warn: …"). An empty Ready renders as "".
func DescribeWorkerReady(now time.Time, rd WorkerReady) string {
	var lines []string
	add := func(format string, args ...any) { lines = append(lines, fmt.Sprintf(format, args...)) }
	for _, m := range rd.Send {
		add("send: %s", describeWorkerMsg(now, m))
	}
	if rd.Close {
		add("close")
	}
	if rd.Dial {
		add("dial")
	}
	for _, c := range rd.Exec {
		s := fmt.Sprintf("exec: %s lease=%d", c.Op, c.Lease)
		if c.Op == ExecStart {
			s += fmt.Sprintf(" step=%s", c.Step)
			if c.Command != "" {
				s += " cmd=" + quote(c.Command)
			}
			if len(c.Env) > 0 {
				s += " env=" + describeMap(c.Env)
			}
		}
		lines = append(lines, s)
	}
	for _, l := range rd.Logs {
		if l.Level == LevelInfo {
			add("log: %s", l.Msg) // most lines: the level only when it is not info
		} else {
			add("log %s: %s", l.Level, l.Msg)
		}
	}
	if rd.Exit != nil {
		add("exit: code=%d reason=%q", rd.Exit.Code, rd.Exit.Reason)
		if rd.Exit.CredentialRefused {
			add("exit: credential refused")
		}
	}
	if !rd.Deadline.IsZero() {
		add("deadline: %s", describeRelTime(now, rd.Deadline))
	}
	return strings.Join(lines, "\n")
}

// describeWorkerMsg is DescribeMsg plus, for Logs and Events, the sequence
// numbers and stamps (relative to now) of the lines, and the text of a single
// line.
func describeWorkerMsg(now time.Time, m Msg) string {
	var ls []LogLine
	switch m := m.(type) {
	case Logs:
		ls = m.Lines
	case Events:
		ls = m.Events
	default:
		return DescribeMsg(m)
	}
	s := DescribeMsg(m)
	if len(ls) == 0 {
		return s
	}
	first, last := ls[0], ls[len(ls)-1]
	if len(ls) == 1 {
		return fmt.Sprintf("%s seq=%d at=%s text=%q", s, first.Seq, describeRelTime(now, first.At), first.Text)
	}
	return fmt.Sprintf("%s seq=%d..%d at=%s..%s", s, first.Seq, last.Seq,
		describeRelTime(now, first.At), describeRelTime(now, last.At))
}

// describeRelTime renders t as a signed offset from now.
func describeRelTime(now, t time.Time) string {
	d := t.Sub(now)
	if d >= 0 {
		return "+" + DescribeDuration(d)
	}
	return DescribeDuration(d)
}
