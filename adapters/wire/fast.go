package wire

import (
	"encoding/json"
	"sort"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/tether-run/tether/core"
)

// The messages of every step (dispatch, start, start-ack, report, answer),
// of its output (logs, events) and a worker's heartbeat (every connected
// worker's, idle or not) have hand-written codecs: the reflective path
// costs several microseconds a message on each side. They change
// nothing on the wire:
//
//   - fastEncode renders exactly the bytes of the reflective encoder
//     (TestFastEncodeMatches checks it over random messages), or declines.
//   - fastDecode accepts only frames in exactly that canonical form (keys in
//     order, no whitespace, no escapes, plain ASCII) and returns what the
//     reflective decoder returns for them (TestFastDecodeMatches, and
//     FuzzDecode on arbitrary input); anything else it declines, and the
//     reflective decoder decides, errors included.

// fastEncode renders m's frame, or returns false.
func fastEncode(m core.Msg) ([]byte, bool) {
	var e fastEnc
	switch m := m.(type) {
	case core.Heartbeat:
		e.open("heartbeat", `{`, 48+48*len(m.InFlight))
		if len(m.InFlight) > 0 {
			e.lit(`"in_flight":[`)
			for i, r := range m.InFlight {
				if i > 0 {
					e.lit(`,`)
				}
				e.lit(`{"step":`)
				e.str(string(r.Step))
				e.lit(`,"lease":`)
				e.uint(uint64(r.Lease))
				if r.Held {
					e.lit(`,"held":true`)
				}
				e.lit(`}`)
			}
			e.lit(`]`)
		}
	case core.Start:
		e.open("start", `{"lease":`, 64)
		e.uint(uint64(m.Lease))
		e.lit(`,"request":`)
		e.uint(m.Request)
	case core.Held:
		e.open("held", `{"lease":`, 48)
		e.uint(uint64(m.Lease))
	case core.Report:
		e.open("report", `{"step":`, 160)
		e.str(string(m.Step))
		e.lit(`,"lease":`)
		e.uint(uint64(m.Lease))
		e.lit(`,"request":`)
		e.uint(m.Request)
		e.lit(`,"outcome":{"status":`)
		e.str(m.Outcome.Status.String())
		e.lit(`,"exit_code":`)
		e.int(m.Outcome.ExitCode)
		if m.Outcome.Message != "" {
			e.lit(`,"message":`)
			e.str(m.Outcome.Message)
		}
		e.lit(`}`)
	case core.StartAck:
		e.open("start-ack", `{"lease":`, 96)
		e.uint(uint64(m.Lease))
		e.lit(`,"request":`)
		e.uint(m.Request)
		e.lit(`,"ok":`)
		e.b = strconv.AppendBool(e.b, m.OK)
		if m.Reason != "" {
			e.lit(`,"reason":`)
			e.str(m.Reason)
		}
	case core.Answer:
		e.open("answer", `{"lease":`, 96)
		e.uint(uint64(m.Lease))
		e.lit(`,"request":`)
		e.uint(m.Request)
		e.lit(`,"verdict":`)
		e.str(m.Verdict.String())
		if m.Reason != "" {
			e.lit(`,"reason":`)
			e.str(m.Reason)
		}
	case core.Dispatch:
		if len(m.Secrets) > 0 || m.SecretsAs != "" {
			return nil, false // the reflective encoder renders the secrets' fields (SPEC §14a)
		}
		e.open("dispatch", `{"lease":`, 256+len(m.Command))
		e.uint(uint64(m.Lease))
		e.lit(`,"step":`)
		e.str(string(m.Step))
		e.lit(`,"run":`)
		e.str(string(m.Run))
		e.lit(`,"command":`)
		e.str(m.Command)
		if len(m.Env) > 0 {
			keys := make([]string, 0, len(m.Env))
			for k := range m.Env {
				keys = append(keys, k)
			}
			sort.Strings(keys) // encoding/json's order for a map
			e.lit(`,"env":{`)
			for i, k := range keys {
				if i > 0 {
					e.lit(`,`)
				}
				e.str(k)
				e.lit(`:`)
				e.str(m.Env[k])
			}
			e.lit(`}`)
		}
		if m.Writes {
			e.lit(`,"writes":true`)
		}
		e.lit(`,"timeout":`)
		e.str(m.Timeout.String())
		e.lit(`,"attempt":`)
		e.int(m.Attempt)
	case core.Logs:
		e.open("logs", `{"lease":`, 64+64*len(m.Lines))
		e.uint(uint64(m.Lease))
		e.lit(`,"lines":`)
		e.lines(m.Lines)
	case core.Events:
		e.open("events", `{"lease":`, 64+64*len(m.Events))
		e.uint(uint64(m.Lease))
		e.lit(`,"events":`)
		e.lines(m.Events)
	default:
		return nil, false
	}
	e.lit(`}}`)
	return e.b, !e.bad
}

type fastEnc struct {
	b   []byte
	bad bool
}

func (e *fastEnc) open(kind, first string, size int) {
	e.b = make([]byte, 0, size)
	e.lit(`{"v":1,"type":"`)
	e.lit(kind)
	e.lit(`","body":`)
	e.lit(first)
}

func (e *fastEnc) lit(s string)  { e.b = append(e.b, s...) }
func (e *fastEnc) uint(n uint64) { e.b = strconv.AppendUint(e.b, n, 10) }
func (e *fastEnc) int(n int)     { e.b = strconv.AppendInt(e.b, int64(n), 10) }
func (e *fastEnc) str(s string)  { e.b = appendString(e.b, s) }
func (e *fastEnc) time(t time.Time) {
	n0 := len(e.b) + 1
	e.b = append(e.b, '"')
	e.b = t.AppendFormat(e.b, time.RFC3339Nano)
	// time.Time.MarshalJSON refuses what RFC 3339 cannot say; the
	// reflective encoder then fails, with its message.
	b := e.b
	switch {
	case len(b) < n0+5 || b[n0+4] != '-':
		e.bad = true
	case b[len(b)-1] != 'Z':
		c := b[len(b)-len("Z07:00")]
		if ('0' <= c && c <= '9') || 10*(b[len(b)-5]-'0')+(b[len(b)-4]-'0') >= 24 {
			e.bad = true
		}
	}
	e.b = append(e.b, '"')
}

func (e *fastEnc) lines(ls []core.LogLine) {
	if ls == nil {
		e.lit(`null`)
		return
	}
	e.lit(`[`)
	for i, l := range ls {
		if i > 0 {
			e.lit(`,`)
		}
		e.lit(`{"seq":`)
		e.uint(l.Seq)
		e.lit(`,"at":`)
		e.time(l.At)
		e.lit(`,"text":`)
		e.str(l.Text)
		e.lit(`}`)
	}
	e.lit(`]`)
}

// appendString quotes s as encoding/json does (HTML-safe). Printable ASCII
// is copied; anything else takes encoding/json's path.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if !plain(s[i]) {
			q, _ := json.Marshal(s) // a string always encodes
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// plain reports whether c stands for itself inside a JSON string, both ways:
// printable ASCII other than the quote, the backslash and the characters
// encoding/json escapes for HTML.
func plain(c byte) bool {
	return c >= 0x20 && c < utf8.RuneSelf && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
}

// fastDecode parses a canonical frame of a hot kind, or returns false.
func fastDecode(b []byte) (core.Msg, bool) {
	d := fastDec{b: b, ok: true}
	if !d.lit(`{"v":1,"type":"`) {
		return nil, false
	}
	var m core.Msg
	kind := d.word()
	switch string(kind) {
	case "heartbeat":
		if !d.lit(`","body":{`) {
			return nil, false
		}
		var h core.Heartbeat
		if d.opt(`"in_flight":[`) {
			// encoding/json leaves an empty list out: "[]" is not canonical.
			for d.ok {
				var r core.LeaseRef
				d.lit(`{"step":`)
				r.Step = core.StepID(d.str())
				d.lit(`,"lease":`)
				r.Lease = core.LeaseID(d.uint())
				r.Held = d.opt(`,"held":true`)
				d.lit(`}`)
				h.InFlight = append(h.InFlight, r)
				if d.opt(`]`) {
					break
				}
				d.lit(`,`)
			}
		}
		m = h
	case "start":
		if !d.lit(`","body":{"lease":`) {
			return nil, false
		}
		var s core.Start
		s.Lease = core.LeaseID(d.uint())
		d.lit(`,"request":`)
		s.Request = d.uint()
		m = s
	case "held":
		if !d.lit(`","body":{"lease":`) {
			return nil, false
		}
		m = core.Held{Lease: core.LeaseID(d.uint())}
	case "report":
		if !d.lit(`","body":{"step":`) {
			return nil, false
		}
		var r core.Report
		r.Step = core.StepID(d.str())
		d.lit(`,"lease":`)
		r.Lease = core.LeaseID(d.uint())
		d.lit(`,"request":`)
		r.Request = d.uint()
		d.lit(`,"outcome":{"status":`)
		st, err := parseStatus(d.str())
		if err != nil {
			return nil, false
		}
		r.Outcome.Status = st
		d.lit(`,"exit_code":`)
		r.Outcome.ExitCode = d.int()
		if d.opt(`,"message":`) {
			r.Outcome.Message = d.str()
		}
		d.lit(`}`)
		m = r
	case "start-ack":
		if !d.lit(`","body":{"lease":`) {
			return nil, false
		}
		var a core.StartAck
		a.Lease = core.LeaseID(d.uint())
		d.lit(`,"request":`)
		a.Request = d.uint()
		d.lit(`,"ok":`)
		a.OK = d.bool()
		if d.opt(`,"reason":`) {
			a.Reason = d.str()
		}
		m = a
	case "answer":
		if !d.lit(`","body":{"lease":`) {
			return nil, false
		}
		var a core.Answer
		a.Lease = core.LeaseID(d.uint())
		d.lit(`,"request":`)
		a.Request = d.uint()
		d.lit(`,"verdict":`)
		v, err := parseVerdict(d.str())
		if err != nil {
			return nil, false
		}
		a.Verdict = v
		if d.opt(`,"reason":`) {
			a.Reason = d.str()
		}
		m = a
	case "dispatch":
		if !d.lit(`","body":{"lease":`) {
			return nil, false
		}
		var x core.Dispatch
		x.Lease = core.LeaseID(d.uint())
		d.lit(`,"step":`)
		x.Step = core.StepID(d.str())
		d.lit(`,"run":`)
		x.Run = core.RunID(d.str())
		d.lit(`,"command":`)
		x.Command = d.str()
		if d.opt(`,"env":{`) {
			if !d.opt(`}`) {
				x.Env = map[string]string{}
				last := ""
				for d.ok {
					k := d.str()
					if len(x.Env) > 0 && k <= last {
						return nil, false // a repeated key: the reflective decoder decides
					}
					last = k
					d.lit(`:`)
					x.Env[k] = d.str()
					if d.opt(`}`) {
						break
					}
					d.lit(`,`)
				}
			}
		}
		x.Writes = d.opt(`,"writes":true`)
		d.lit(`,"timeout":`)
		if s := d.str(); d.ok {
			t, err := time.ParseDuration(s)
			if err != nil {
				return nil, false
			}
			x.Timeout = t
		}
		d.lit(`,"attempt":`)
		x.Attempt = d.int()
		m = x
	case "logs", "events":
		if !d.lit(`","body":{"lease":`) {
			return nil, false
		}
		lease := core.LeaseID(d.uint())
		if string(kind) == "logs" {
			d.lit(`,"lines":`)
		} else {
			d.lit(`,"events":`)
		}
		var lines []core.LogLine
		if !d.opt(`null`) && d.lit(`[`) && !d.opt(`]`) {
			for d.ok {
				var l core.LogLine
				d.lit(`{"seq":`)
				l.Seq = d.uint()
				d.lit(`,"at":`)
				if at := d.quoted(); d.ok && l.At.UnmarshalJSON(at) != nil {
					return nil, false
				}
				d.lit(`,"text":`)
				l.Text = d.str()
				d.lit(`}`)
				lines = append(lines, l)
				if d.opt(`]`) {
					break
				}
				d.lit(`,`)
			}
		}
		if string(kind) == "logs" {
			m = core.Logs{Lease: lease, Lines: lines}
		} else {
			m = core.Events{Lease: lease, Events: lines}
		}
	default:
		return nil, false
	}
	d.lit(`}}`)
	if !d.ok || d.i != len(d.b) {
		return nil, false
	}
	return m, true
}

// fastDec scans a canonical frame; ok turns false at the first surprise,
// after which every method returns zero values.
type fastDec struct {
	b  []byte
	i  int
	ok bool
}

func (d *fastDec) lit(s string) bool {
	if !d.ok || len(d.b)-d.i < len(s) || string(d.b[d.i:d.i+len(s)]) != s {
		d.ok = false
		return false
	}
	d.i += len(s)
	return true
}

// opt consumes s if it comes next.
func (d *fastDec) opt(s string) bool {
	if d.ok && len(d.b)-d.i >= len(s) && string(d.b[d.i:d.i+len(s)]) == s {
		d.i += len(s)
		return true
	}
	return false
}

// word reads up to the next quote (the frame's type).
func (d *fastDec) word() []byte {
	if !d.ok {
		return nil
	}
	j := d.i
	for j < len(d.b) && d.b[j] != '"' {
		if !plain(d.b[j]) {
			d.ok = false
			return nil
		}
		j++
	}
	w := d.b[d.i:j]
	d.i = j
	return w
}

// quoted returns a string literal with its quotes, all plain characters.
func (d *fastDec) quoted() []byte {
	if !d.ok || d.i >= len(d.b) || d.b[d.i] != '"' {
		d.ok = false
		return nil
	}
	j := d.i + 1
	for j < len(d.b) && d.b[j] != '"' {
		if !plain(d.b[j]) {
			d.ok = false
			return nil
		}
		j++
	}
	if j == len(d.b) {
		d.ok = false
		return nil
	}
	q := d.b[d.i : j+1]
	d.i = j + 1
	return q
}

func (d *fastDec) str() string {
	q := d.quoted()
	if len(q) < 2 {
		return ""
	}
	return string(q[1 : len(q)-1])
}

func (d *fastDec) bool() bool {
	if d.opt("true") {
		return true
	}
	if d.opt("false") {
		return false
	}
	d.ok = false
	return false
}

// uint reads a JSON integer that fits a uint64: no sign, no leading zero.
func (d *fastDec) uint() uint64 {
	if !d.ok {
		return 0
	}
	j := d.i
	for j < len(d.b) && d.b[j] >= '0' && d.b[j] <= '9' {
		j++
	}
	if j == d.i || (d.b[d.i] == '0' && j > d.i+1) || j-d.i > 20 {
		d.ok = false
		return 0
	}
	var n uint64
	for _, c := range d.b[d.i:j] {
		x := n*10 + uint64(c-'0')
		if n > (1<<64-1)/10 || x < n*10 {
			d.ok = false // overflows a uint64
			return 0
		}
		n = x
	}
	d.i = j
	return n
}

// int reads a JSON integer that fits an int ("-0" is left to encoding/json).
func (d *fastDec) int() int {
	neg := d.opt("-")
	n := d.uint()
	if !d.ok || (neg && n == 0) {
		d.ok = false
		return 0
	}
	if neg {
		if n > 1<<(strconv.IntSize-1) {
			d.ok = false
			return 0
		}
		return int(-n)
	}
	if n > 1<<(strconv.IntSize-1)-1 {
		d.ok = false
		return 0
	}
	return int(n)
}
