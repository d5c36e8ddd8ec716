package core

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// DescribeMsg renders one message as a single line: its kind, then its fields
// as key=value in a fixed order. Maps are printed sorted; times are not printed
// (they depend on clocks), durations are.
func DescribeMsg(m Msg) string {
	var b strings.Builder
	b.WriteString(m.Kind())
	kv := func(k string, v any) { fmt.Fprintf(&b, " %s=%v", k, v) }
	switch m := m.(type) {
	case Hello:
		if m.Token != "" {
			kv("token", tokenName(m.Token))
		}
		if m.Credential != "" {
			kv("credential", "yes")
		}
		kv("worker", m.Worker)
		if m.Name != "" && string(m.Worker) != m.Name {
			kv("name", m.Name)
		}
		if len(m.Tags) > 0 {
			kv("tags", strings.Join(sortedCopy(m.Tags), ","))
		}
		if len(m.Labels) > 0 {
			kv("labels", describeMap(m.Labels))
		}
		kv("slots", m.Slots)
		if m.Ahead > 0 {
			kv("ahead", m.Ahead)
		}
		if m.Scaler {
			kv("scaler", true)
		}
		if m.Version != ProtocolVersion {
			kv("version", m.Version)
		}
		b.WriteString(" in-flight=" + describeRefs(m.InFlight))
	case Heartbeat:
		b.WriteString(" in-flight=" + describeRefs(m.InFlight))
	case Start:
		kv("lease", m.Lease)
		kv("req", m.Request)
	case Held:
		kv("lease", m.Lease)
	case RejectDispatch:
		kv("lease", m.Lease)
		kv("reason", quote(m.Reason))
	case Report:
		kv("step", m.Step)
		kv("lease", m.Lease)
		kv("req", m.Request)
		b.WriteString(" " + describeOutcome(m.Outcome))
	case Logs:
		kv("lease", m.Lease)
		kv("lines", len(m.Lines))
	case Events:
		kv("lease", m.Lease)
		kv("events", len(m.Events))
	case Refresh:
		kv("req", m.Request)
	case LogAck:
		kv("lease", m.Lease)
		kv("lines", m.Lines)
		kv("events", m.Events)
	case Welcome:
		kv("worker", m.Worker)
		if m.Credential != "" {
			kv("credential", "issued")
		}
		kv("ttl", m.CredentialTTL)
		if m.HeartbeatPhase != 0 {
			kv("phase", m.HeartbeatPhase)
		}
		if len(m.Cancel) > 0 {
			kv("cancel", describeLeases(m.Cancel))
		}
	case Refused:
		kv("reason", quote(m.Reason))
		if m.Fatal {
			kv("fatal", true)
		}
		if m.Cause != "" {
			kv("cause", m.Cause)
		}
	case Dispatch:
		kv("lease", m.Lease)
		kv("step", m.Step)
		kv("attempt", m.Attempt)
		if m.Writes {
			kv("writes", true)
		}
		if m.Command != "" {
			kv("cmd", quote(m.Command))
		}
		if len(m.Env) > 0 {
			kv("env", describeMap(m.Env))
		}
		if m.Timeout > 0 {
			kv("timeout", m.Timeout)
		}
	case StartAck:
		kv("lease", m.Lease)
		kv("req", m.Request)
		kv("ok", m.OK)
		if m.Reason != "" {
			kv("reason", quote(m.Reason))
		}
	case Cancel:
		kv("lease", m.Lease)
		kv("reason", quote(m.Reason))
	case Answer:
		kv("lease", m.Lease)
		kv("req", m.Request)
		b.WriteString(" " + m.Verdict.String())
		if m.Reason != "" {
			kv("reason", quote(m.Reason))
		}
	case Refreshed:
		kv("req", m.Request)
		kv("ttl", m.TTL)
	case Close:
		kv("reason", quote(m.Reason))
		if m.Code != CloseEnded {
			kv("code", m.Code)
		}
		if m.Cause != "" {
			kv("cause", m.Cause)
		}
	}
	return b.String()
}

func describeOutcome(o Outcome) string {
	s := o.Status.String()
	if o.Status == OutcomeFailure || o.ExitCode != 0 {
		s += fmt.Sprintf(" exit=%d", o.ExitCode)
	}
	if o.Message != "" {
		s += " msg=" + quote(o.Message)
	}
	return s
}

func describeRefs(refs []LeaseRef) string {
	if len(refs) == 0 {
		return "[]"
	}
	rs := append([]LeaseRef(nil), refs...)
	sort.Slice(rs, func(i, j int) bool { return rs[i].Lease < rs[j].Lease })
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = fmt.Sprintf("%s@%d", r.Step, r.Lease)
		if r.Held {
			parts[i] += "(held)"
		}
	}
	return "[" + strings.Join(parts, " ") + "]"
}

func describeLeases(ls []LeaseID) string {
	parts := make([]string, len(ls))
	for i, l := range ls {
		parts[i] = fmt.Sprint(l)
	}
	return "[" + strings.Join(parts, ",") + "]"
}

func describeMap(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + ":" + m[k]
	}
	return strings.Join(parts, ",")
}

func sortedCopy(s []string) []string {
	c := append([]string(nil), s...)
	sort.Strings(c)
	return c
}

func quote(s string) string { return fmt.Sprintf("%q", s) }

// DescribeDuration renders d compactly and stably: "90s", "2m0s" style is
// avoided in favour of whole seconds when d is a whole number of seconds.
func DescribeDuration(d time.Duration) string {
	if d%time.Second == 0 {
		return fmt.Sprintf("%ds", d/time.Second)
	}
	return d.String()
}

func tokenName(tok string) string {
	if i := strings.IndexByte(tok, '.'); i >= 0 {
		return tok[:i]
	}
	return tok
}

// DescribeReady renders a batch one fact per line: messages (in send order,
// with the connection named by name), answers, server events, then the next
// deadline relative to t0. Records and log lines are left out: they are
// checked elsewhere and would drown the story.
func DescribeReady(rd Ready, t0 time.Time, name func(ConnID) string) []string {
	var out []string
	for _, e := range rd.Messages {
		out = append(out, fmt.Sprintf("→ %s: %s", name(e.Conn), DescribeMsg(e.Msg)))
	}
	for _, a := range rd.Answers {
		s := fmt.Sprintf("answer call=%d:", a.Call)
		if a.Err != "" {
			s += " error=" + quote(a.Err)
		} else {
			s += " ok"
		}
		if a.Run != "" {
			s += " run=" + string(a.Run)
		}
		if a.Token != "" {
			s += " token=" + tokenName(a.Token) + ".…"
		}
		out = append(out, s)
	}
	for _, ev := range rd.Events {
		out = append(out, DescribeEvent(ev, t0))
	}
	if !rd.Deadline.IsZero() {
		out = append(out, "next deadline: "+DescribeAt(rd.Deadline, t0))
	}
	return out
}

// DescribeEvent renders one server event.
func DescribeEvent(ev ServerEvent, t0 time.Time) string {
	s := fmt.Sprintf("event %s#%d %s", ev.Run, ev.Seq, ev.Kind)
	if ev.Step != "" {
		s += " step=" + string(ev.Step)
	}
	if ev.Cause != "" {
		s += " cause=" + string(ev.Cause)
	}
	if ev.Lease != 0 {
		s += fmt.Sprintf(" lease=%d worker=%s", ev.Lease, ev.Worker)
	}
	return s + " " + quote(ev.Message)
}

// DescribeAt renders t relative to t0 ("+1m30s", "+0s").
func DescribeAt(t, t0 time.Time) string {
	d := t.Sub(t0)
	if d < 0 {
		return "-" + DescribeDuration(-d)
	}
	return "+" + DescribeDuration(d)
}

// DescribeStep renders a step's state in one line.
func DescribeStep(s StepRecord) string {
	out := fmt.Sprintf("%s %s attempts=%d", s.ID, s.State, s.Attempts)
	if s.Tries != 0 {
		out += fmt.Sprintf(" tries=%d", s.Tries)
	}
	if s.Lease != 0 {
		out += fmt.Sprintf(" lease=%d", s.Lease)
	}
	if s.Class != "" {
		out += " class=" + string(s.Class)
	}
	if s.SkippedBy != "" {
		out += " skipped-by=" + string(s.SkippedBy)
	}
	if s.Child != "" {
		out += " child=" + string(s.Child)
	}
	for i, w := range s.MissedBy {
		if i == 0 {
			out += " missed-by="
		} else {
			out += ","
		}
		out += string(w)
	}
	if s.Message != "" {
		out += " msg=" + quote(s.Message)
	}
	return out
}

// DescribeLease renders a lease in one line.
func DescribeLease(l LeaseRecord) string {
	out := fmt.Sprintf("lease %d step=%s worker=%s", l.ID, l.Step, l.Worker)
	if l.Current {
		out += " current"
	} else {
		out += " ended=" + quote(l.EndReason)
	}
	if l.Started {
		out += " started"
	}
	if l.Held {
		out += " held"
	}
	if l.Committed {
		out += " committed"
	}
	return out
}

// DescribeClosed renders an entry of the closed-lease table in one line,
// its closing time relative to t0.
func DescribeClosed(c ClosedLease, t0 time.Time) string {
	out := fmt.Sprintf("closed lease %d worker=%s at=%s", c.Lease, c.Worker, DescribeAt(time.Unix(c.ClosedAt, 0), t0))
	if c.Held {
		out += " held"
	}
	if c.Committed {
		out += " committed"
	}
	if c.Answered {
		out += fmt.Sprintf(" answered=req%d", c.Request)
	}
	if c.Rejected {
		out += " rejected"
	}
	return out
}

// DescribeWorker renders a worker in one line.
func DescribeWorker(w WorkerView) string {
	out := fmt.Sprintf("worker %s name=%s slots=%d leases=%d", w.ID, w.Name, w.Slots, w.Leases)
	if w.Ahead > 0 {
		out += fmt.Sprintf(" ahead=%d", w.Ahead)
	}
	switch {
	case w.Revoked:
		out += " revoked"
	case !w.Active:
		out += " inactive"
	case w.Connected:
		out += " connected"
	default:
		out += " disconnected"
	}
	if w.Draining {
		out += " draining"
	}
	return out
}
