package core

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
)

// t0 is the scenario clock's origin; every time is printed relative to it.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// harness drives one Orchestrator through a scenario file. It keeps the
// "disk" (every batch's records applied in order) and after every command
// checks that the disk equals the machine's own Records(): a state change
// that was not emitted as a record would be lost by a restart.
type harness struct {
	t        *testing.T
	cfg      Config
	o        *Orchestrator
	now      time.Time
	disk     Disk
	conns    map[string]ConnID // worker → current connection
	connName map[ConnID]string
	nextConn ConnID
	nextCall CallID
	secrets  int
	prev     map[StepID]State
	tokens   map[string]string     // token name → full token, as the API answered
	creds    map[string]string     // worker → session credential from its Welcome
	aheads   map[string]int        // worker → the ahead it enrolled with, its reconnects' default
	slots    map[string]int        // worker → the slots it enrolled with, its reconnects' default
	archive  map[RunID]*RunHistory // runs archived so far, from their history records
	defs     map[string]RunSpec    // child workflows by name (define), for workflow=NAME
}

func newHarness(t *testing.T) *harness {
	h := &harness{t: t, cfg: DefaultConfig(), now: t0, disk: Disk{},
		conns: map[string]ConnID{}, connName: map[ConnID]string{}}
	h.o = NewOrchestrator(h.cfg)
	h.prev = map[StepID]State{}
	h.tokens = map[string]string{}
	h.creds = map[string]string{}
	h.aheads = map[string]int{}
	h.slots = map[string]int{}
	h.archive = map[RunID]*RunHistory{}
	return h
}

// steps returns every step, live or archived, sorted by id.
func (h *harness) steps() []StepRecord {
	out := h.o.Steps()
	for _, id := range sortedKeys(h.archive) {
		out = append(out, h.archive[id].Steps...)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// leases returns every lease, live or archived, sorted by id.
func (h *harness) leases() []LeaseRecord {
	out := h.o.Leases()
	for _, id := range sortedKeys(h.archive) {
		out = append(out, h.archive[id].Leases...)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func TestScenarios(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		if strings.HasPrefix(filepathBase(path), "worker_") {
			return
		}
		h := newHarness(t)
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			return h.run(d)
		})
	})
}

func filepathBase(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[i+1:]
	}
	return p
}

func (h *harness) name(c ConnID) string {
	if n, ok := h.connName[c]; ok {
		return n
	}
	return fmt.Sprintf("conn%d", c)
}

// step feeds one input and renders the batch plus the step transitions it
// caused.
func (h *harness) step(in Input) []string {
	rd := h.o.Step(h.now, in)
	return h.absorb(rd)
}

func (h *harness) absorb(rd Ready) []string {
	h.disk.Apply(rd.Records)
	for _, r := range rd.Records {
		if IsHistoryKey(r.Key) {
			v, err := DecodeRecord(r)
			if err != nil {
				h.t.Fatalf("history record %s: %v", r.Key, err)
			}
			hist := v.(*RunHistory)
			// archive encodes from the live records (encodeHistory): the
			// bytes must be encoding/json's of the RunHistory they decode to.
			if want, err := json.Marshal(hist); err != nil || !bytes.Equal(r.Value, want) {
				h.t.Fatalf("history record %s: written\n%s\nencoding/json renders it\n%s (%v)", r.Key, r.Value, want, err)
			}
			if want := hist.DeriveHead(); !reflect.DeepEqual(hist.Head, want) {
				h.t.Fatalf("history record %s: head %+v, the rest of the record says %+v", r.Key, hist.Head, want)
			}
			if _, _, ok := h.o.Run(hist.Run.ID); ok {
				h.t.Fatalf("run %s archived but still in the core", hist.Run.ID)
			}
			h.archive[hist.Run.ID] = hist
		}
	}
	h.checkDisk()
	for _, a := range rd.Answers {
		if a.Token != "" {
			h.tokens[tokenName(a.Token)] = a.Token
		}
	}
	out := h.transitions()
	out = append(out, DescribeReady(rd, t0, h.name)...)
	for _, e := range rd.Messages {
		switch e.Msg.(type) {
		case Close, Refused:
			if n, ok := h.connName[e.Conn]; ok && h.conns[n] == e.Conn {
				delete(h.conns, n)
			}
		}
	}
	return out
}

func (h *harness) checkDisk() {
	recs := h.o.Records()
	live := map[LeaseID]bool{}
	for _, l := range h.o.Leases() {
		live[l.ID] = true
	}
	state := 0 // the disk's records that are state: not history, not an archived lease's log, not the closed-lease log
	var closedKeys []string
	for k, v := range h.disk {
		if IsHistoryKey(k) || IsAuditKey(k) {
			continue
		}
		if isClosedKey(k) {
			closedKeys = append(closedKeys, k)
			continue
		}
		if strings.HasPrefix(k, KindLog+"/") {
			ln, err := DecodeRecord(Record{Key: k, Value: v})
			if err != nil {
				h.t.Fatalf("log record %s: %v", k, err)
			}
			if !live[ln.(*StepLogLine).Lease] {
				continue
			}
		}
		state++
	}
	// The closed-lease log on disk, replayed, is the machine's table (the
	// machine does not keep the log as written, only the table).
	sort.Strings(closedKeys)
	table := map[LeaseID]ClosedLease{}
	for _, k := range closedKeys {
		ch, err := decodeClosed(h.disk[k])
		if err != nil {
			h.t.Fatalf("closed-lease record %s: %v", k, err)
		}
		for _, c := range ch.Adds {
			table[c.Lease] = c
		}
		for _, id := range ch.Drops {
			delete(table, id)
		}
	}
	mem := h.o.ClosedLeases()
	if len(mem) != len(table) {
		h.t.Fatalf("closed-lease log on disk holds %d entries, the machine's table %d", len(table), len(mem))
	}
	for _, c := range mem {
		if table[c.Lease] != c {
			h.t.Fatalf("closed lease %d: disk %+v, machine %+v", c.Lease, table[c.Lease], c)
		}
	}
	var kept []Record
	for _, r := range recs {
		if !isClosedKey(r.Key) {
			kept = append(kept, r)
		}
	}
	recs = kept
	if len(recs) != state {
		keys := make([]string, 0, len(h.disk))
		for k := range h.disk {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		h.t.Fatalf("disk holds %d records, machine has %d: a change was not emitted as a record\ndisk: %v", len(h.disk), len(recs), keys)
	}
	for _, r := range recs {
		if !bytes.Equal(h.disk[r.Key], r.Value) {
			h.t.Fatalf("record %s on disk differs from the machine:\ndisk:    %s\nmachine: %s", r.Key, h.disk[r.Key], r.Value)
		}
	}
}

// transitions lists the steps whose state changed since the last command.
func (h *harness) transitions() []string {
	var out []string
	for _, s := range h.steps() {
		before, ok := h.prev[s.ID]
		if !ok {
			before = StatePending
		}
		if !ok && s.State == StatePending {
			h.prev[s.ID] = s.State
			continue
		}
		if before != s.State {
			line := fmt.Sprintf("step %s: %s -> %s", s.ID, before, s.State)
			if s.State == StateFailed || s.State == StateCancelled || s.State == StateSkipped {
				if s.Class != "" {
					line += " class=" + string(s.Class)
				}
				if s.Message != "" {
					line += " msg=" + quote(s.Message)
				}
			}
			out = append(out, line)
		}
		h.prev[s.ID] = s.State
	}
	return out
}

func (h *harness) call() CallID { h.nextCall++; return h.nextCall }

func (h *harness) run(d *datadriven.TestData) (out string) {
	defer func() {
		if r := recover(); r != nil {
			out = fmt.Sprintf("panic: %v\n", r)
		}
	}()
	d.CmdArgs = joinQuoted(d.CmdArgs)
	lines := h.command(d)
	if len(lines) == 0 {
		return "ok\n"
	}
	return strings.Join(lines, "\n") + "\n"
}

// joinQuoted lets a value hold spaces: datadriven splits key="a b c" into
// key=`"a` and bare words `b`, `c"`; this joins them back into key=`a b c`.
func joinQuoted(args []datadriven.CmdArg) []datadriven.CmdArg {
	var out []datadriven.CmdArg
	for i := 0; i < len(args); i++ {
		a := args[i]
		if len(a.Vals) != 1 || !strings.HasPrefix(a.Vals[0], `"`) {
			out = append(out, a)
			continue
		}
		v := a.Vals[0]
		for !(len(v) >= 2 && strings.HasSuffix(v, `"`)) && i+1 < len(args) && len(args[i+1].Vals) == 0 {
			i++
			v += " " + args[i].Key
		}
		a.Vals = []string{strings.TrimSuffix(strings.TrimPrefix(v, `"`), `"`)}
		out = append(out, a)
	}
	return out
}

func (h *harness) arg(d *datadriven.TestData, key string) (string, bool) {
	for _, a := range d.CmdArgs {
		if a.Key == key {
			if len(a.Vals) == 0 {
				return "", true
			}
			return strings.Join(a.Vals, ","), true
		}
	}
	return "", false
}

func (h *harness) argOr(d *datadriven.TestData, key, def string) string {
	if v, ok := h.arg(d, key); ok {
		return v
	}
	return def
}

func (h *harness) pos(d *datadriven.TestData, i int) string {
	n := 0
	for _, a := range d.CmdArgs {
		if len(a.Vals) == 0 {
			if n == i {
				return a.Key
			}
			n++
		}
	}
	h.t.Fatalf("%s: %s needs positional argument %d", d.Pos, d.Cmd, i+1)
	return ""
}

func (h *harness) dur(d *datadriven.TestData, key string, def time.Duration) time.Duration {
	v, ok := h.arg(d, key)
	if !ok {
		return def
	}
	x, err := time.ParseDuration(v)
	if err != nil {
		h.t.Fatalf("%s: %s=%q: %v", d.Pos, key, v, err)
	}
	return x
}

func (h *harness) num(d *datadriven.TestData, key string, def uint64) uint64 {
	v, ok := h.arg(d, key)
	if !ok {
		return def
	}
	x, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		h.t.Fatalf("%s: %s=%q: %v", d.Pos, key, v, err)
	}
	return x
}

func (h *harness) conn(d *datadriven.TestData, w string) ConnID {
	c, ok := h.conns[w]
	if !ok {
		h.t.Fatalf("%s: worker %s has no open connection", d.Pos, w)
	}
	return c
}

func (h *harness) newConn(w string) ConnID {
	h.nextConn++
	h.conns[w] = h.nextConn
	h.connName[h.nextConn] = w
	return h.nextConn
}

func (h *harness) secret() (s [16]byte) {
	h.secrets++
	copy(s[:], fmt.Sprintf("secret-%09d", h.secrets))
	return s
}

// oversize applies a Hello's oversized fields (SPEC §12's limits):
// namebytes=N, name-esc, ntags=N, tag-nl, nlabels=N, labelbytes=N,
// ninflight=N, credbytes=N.
func (h *harness) oversize(d *datadriven.TestData, m *Hello) {
	if _, ok := h.arg(d, "namebytes"); ok {
		m.Name = strings.Repeat("n", int(h.num(d, "namebytes", 0)))
	}
	if h.has(d, "name-esc") {
		m.Name = "evil\x1b[2Jname"
	}
	for i := 0; i < int(h.num(d, "ntags", 0)); i++ {
		m.Tags = append(m.Tags, fmt.Sprintf("t%d", i))
	}
	if h.has(d, "tag-nl") {
		m.Tags = append(m.Tags, "forged\nline")
	}
	if n := int(h.num(d, "nlabels", 0)); n > 0 {
		m.Labels = map[string]string{}
		for i := 0; i < n; i++ {
			m.Labels[fmt.Sprintf("k%d", i)] = "v"
		}
	}
	if _, ok := h.arg(d, "labelbytes"); ok {
		m.Labels = map[string]string{"zone": strings.Repeat("v", int(h.num(d, "labelbytes", 0)))}
	}
	m.InFlight = append(m.InFlight, manyRefs(int(h.num(d, "ninflight", 0)))...)
	if _, ok := h.arg(d, "credbytes"); ok {
		if m.Token != "" {
			m.Token = strings.Repeat("t", int(h.num(d, "credbytes", 0)))
		} else {
			m.Credential = strings.Repeat("c", int(h.num(d, "credbytes", 0)))
		}
	}
}

// manyRefs makes n lease references nobody holds.
func manyRefs(n int) []LeaseRef {
	var refs []LeaseRef
	for i := 0; i < n; i++ {
		refs = append(refs, LeaseRef{Step: "run-9/x", Lease: LeaseID(1000 + i)})
	}
	return refs
}

// parseRefs reads "run-1/a@3,run-1/b@4(held)".
func (h *harness) parseRefs(d *datadriven.TestData, v string) []LeaseRef {
	var refs []LeaseRef
	for _, p := range strings.Split(v, ",") {
		if p == "" {
			continue
		}
		step, lease, ok := strings.Cut(p, "@")
		lease, held := strings.CutSuffix(lease, "(held)")
		n, err := strconv.ParseUint(lease, 10, 64)
		if !ok || err != nil {
			h.t.Fatalf("%s: bad in-flight entry %q (want step@lease)", d.Pos, p)
		}
		refs = append(refs, LeaseRef{Step: StepID(step), Lease: LeaseID(n), Held: held})
	}
	return refs
}

func (h *harness) leaseStep(id LeaseID) StepID {
	for _, l := range h.leases() {
		if l.ID == id {
			return l.Step
		}
	}
	return ""
}

func (h *harness) command(d *datadriven.TestData) []string {
	switch d.Cmd {
	case "config":
		// Must come first: rebuilds the machine with the given knobs.
		h.cfg.MaxAttempts = int(h.num(d, "max-attempts", uint64(h.cfg.MaxAttempts)))
		h.cfg.UnmatchedTimeout = h.dur(d, "unmatched", h.cfg.UnmatchedTimeout)
		h.cfg.SweepInterval = h.dur(d, "sweep", h.cfg.SweepInterval)
		h.cfg.CredentialTTL = h.dur(d, "credential-ttl", h.cfg.CredentialTTL)
		h.cfg.Retention = h.dur(d, "retention", h.cfg.Retention)
		if n := h.num(d, "env-bytes", 0); n > 0 { // the orchestrator's own environment snapshot
			h.cfg.Env = map[string]string{"SNAPSHOT": strings.Repeat("s", int(n))}
		}
		h.o = NewOrchestrator(h.cfg)
		return nil

	case "advance":
		// advance 10s [no-tick]: with no-tick only the clock moves; the next
		// input is the first the machine sees at the new time.
		h.now = h.now.Add(h.dur(d, "by", mustDur(h.t, h.pos(d, 0))))
		if h.has(d, "no-tick") {
			return []string{"now: " + DescribeAt(h.now, t0) + " (no tick)"}
		}
		return append([]string{"now: " + DescribeAt(h.now, t0)}, h.step(Tick{})...)

	case "tick":
		return h.step(Tick{})

	case "token":
		switch h.pos(d, 0) {
		case "create":
			// token create name=N [into=SECRET [worker=W lease=L]]: minted
			// into a secret, by an operator or by a step (SPEC §14a).
			ct := CreateToken{Call: h.call(), Actor: h.argOr(d, "actor", ""), Name: unescape(h.t, h.argOr(d, "name", "")), TTL: h.dur(d, "ttl", time.Hour), Secret: h.secret(),
				IntoSecret: h.argOr(d, "into", "")}
			if w, ok := h.arg(d, "worker"); ok {
				ct.Credential, ct.Lease = h.creds[w], LeaseID(h.num(d, "lease", 0))
			}
			return h.step(ct)
		case "revoke":
			return h.step(RevokeToken{Call: h.call(), Actor: h.argOr(d, "actor", ""), Name: h.argOr(d, "name", "")})
		}

	case "enroll":
		// enroll w1 [token=T | no token → one is created] [tags=..] [slots=N] ...
		w := h.pos(d, 0)
		var pre []string
		tok, ok := h.arg(d, "token")
		if !ok {
			name := "tok-" + w
			rd := h.o.Step(h.now, CreateToken{Call: h.call(), Name: name, TTL: time.Hour, Secret: h.secret()})
			h.absorb(rd)
			tok = rd.Answers[0].Token
		} else if !strings.Contains(tok, ".") {
			tok = h.tokens[tok]
		}
		hello := Hello{Version: int(h.num(d, "version", ProtocolVersion)), Token: tok, Worker: WorkerID(w),
			Name: h.argOr(d, "name", w), Platform: h.argOr(d, "platform", ""), Slots: int(h.num(d, "slots", 1)),
			Ahead: int(h.num(d, "ahead", 0)), MaxDelay: h.dur(d, "maxdelay", 60*time.Second)}
		h.aheads[w] = hello.Ahead
		h.slots[w] = hello.Slots
		if v, ok := h.arg(d, "tags"); ok {
			hello.Tags = strings.Split(v, ",")
		}
		if v, ok := h.arg(d, "labels"); ok {
			hello.Labels = map[string]string{}
			for _, kv := range strings.Split(v, ",") {
				k, val, _ := strings.Cut(kv, ":")
				hello.Labels[k] = val
			}
		}
		if _, ok := h.arg(d, "scaler"); ok {
			hello.Scaler = true
		}
		if _, ok := h.arg(d, "no-reconnect"); ok {
			hello.MaxDelay = 0
		}
		h.oversize(d, &hello)
		c := h.newConn(w)
		rd := h.o.Step(h.now, Received{Conn: c, Msg: hello, Entropy: h.secret()})
		for _, e := range rd.Messages {
			if wel, ok := e.Msg.(Welcome); ok && wel.Credential != "" {
				h.creds[w] = wel.Credential
			}
		}
		return append(pre, h.absorb(rd)...)

	case "connect":
		// connect w1 [inflight=step@lease,...] [credential=bad] [version=N] [draining] [ahead=N] [slots=N]
		// (ahead and slots: the ones it enrolled with unless given)
		w := h.pos(d, 0)
		cred := h.creds[w]
		if v, ok := h.arg(d, "credential"); ok {
			cred = v
		}
		hello := Hello{Version: int(h.num(d, "version", ProtocolVersion)), Credential: cred, Worker: WorkerID(w), Name: w,
			Slots: int(h.num(d, "slots", uint64(max(h.slots[w], 1)))), Ahead: int(h.num(d, "ahead", uint64(h.aheads[w])))}
		hello.InFlight = h.parseRefs(d, h.argOr(d, "inflight", ""))
		hello.Draining = d.HasArg("draining")
		h.oversize(d, &hello)
		c := h.newConn(w)
		return h.step(Received{Conn: c, Msg: hello})

	case "disconnect":
		w := h.pos(d, 0)
		c := h.conn(d, w)
		delete(h.conns, w)
		return h.step(Disconnected{Conn: c})

	case "heartbeat":
		// heartbeat w1 [inflight=…] [ninflight=N] [records]: with records,
		// the keys of the records its batch wrote come first.
		w := h.pos(d, 0)
		refs := h.parseRefs(d, h.argOr(d, "inflight", ""))
		refs = append(refs, manyRefs(int(h.num(d, "ninflight", 0)))...)
		rd := h.o.Step(h.now, Received{Conn: h.conn(d, w), Msg: Heartbeat{InFlight: refs}})
		var out []string
		if d.HasArg("records") {
			out = append(out, describeRecordKeys(rd.Records))
		}
		return append(out, h.absorb(rd)...)

	case "clocks":
		// Each worker's heartbeat clock (SPEC §8), in memory, and the one
		// its record on the disk holds.
		var out []string
		for _, w := range h.o.Workers() {
			v, err := DecodeRecord(Record{Key: workerKey(w.ID), Value: h.disk[workerKey(w.ID)]})
			if err != nil {
				h.t.Fatalf("%s: worker record %s: %v", d.Pos, w.ID, err)
			}
			out = append(out, fmt.Sprintf("worker %s clock=%s recorded=%s", w.ID,
				DescribeAt(w.LastHeartbeat, t0), DescribeAt(v.(*WorkerRecord).LastHeartbeat, t0)))
		}
		return out

	case "start":
		w := h.pos(d, 0)
		return h.step(Received{Conn: h.conn(d, w), Msg: Start{Lease: LeaseID(h.num(d, "lease", 0)), Request: h.num(d, "req", 1)}})

	case "held":
		w := h.pos(d, 0)
		return h.step(Received{Conn: h.conn(d, w), Msg: Held{Lease: LeaseID(h.num(d, "lease", 0))}})

	case "reject":
		w := h.pos(d, 0)
		reason := h.argOr(d, "reason", "busy")
		if _, ok := h.arg(d, "reasonbytes"); ok {
			reason = strings.Repeat("r", int(h.num(d, "reasonbytes", 0)))
		}
		return h.step(Received{Conn: h.conn(d, w), Msg: RejectDispatch{Lease: LeaseID(h.num(d, "lease", 0)), Reason: reason}})

	case "report":
		// report w1 lease=3 ok|fail|cancelled|cleanup-failed|timed-out [exit=N] [msg=..] [req=N] [step=..]
		w := h.pos(d, 0)
		lease := LeaseID(h.num(d, "lease", 0))
		m := Report{Lease: lease, Request: h.num(d, "req", 1), Step: StepID(h.argOr(d, "step", string(h.leaseStep(lease))))}
		switch {
		case h.has(d, "ok"):
			m.Outcome = Outcome{Status: OutcomeSuccess}
		case h.has(d, "fail"):
			m.Outcome = Outcome{Status: OutcomeFailure, ExitCode: int(h.num(d, "exit", 1)), Message: h.argOr(d, "msg", "")}
		case h.has(d, "cancelled"):
			m.Outcome = Outcome{Status: OutcomeCancelled}
		case h.has(d, "cleanup-failed"):
			m.Outcome = Outcome{Status: OutcomeCleanupFailed, Message: h.argOr(d, "msg", "")}
		case h.has(d, "worker-stopped"):
			m.Outcome = Outcome{Status: OutcomeWorkerStopped, ExitCode: int(h.num(d, "exit", 0)), Message: h.argOr(d, "msg", "")}
		case h.has(d, "timed-out"):
			m.Outcome = Outcome{Status: OutcomeTimedOut, ExitCode: int(h.num(d, "exit", 143)), Message: h.argOr(d, "msg", "")}
		}
		if _, ok := h.arg(d, "msgbytes"); ok {
			m.Outcome.Message = strings.Repeat("m", int(h.num(d, "msgbytes", 0)))
		}
		return h.step(Received{Conn: h.conn(d, w), Msg: m})

	case "logs":
		// logs w1 lease=3 seq=1,2,3 [marker="text"] [events]
		w := h.pos(d, 0)
		var lines []LogLine
		if v, ok := h.arg(d, "marker"); ok {
			lines = append(lines, LogLine{Seq: 0, At: h.now, Text: v})
		}
		for _, s := range strings.Split(h.argOr(d, "seq", ""), ",") {
			if s == "" {
				continue
			}
			n, _ := strconv.ParseUint(s, 10, 64)
			lines = append(lines, LogLine{Seq: n, At: h.now, Text: "line " + s})
		}
		if h.has(d, "events") {
			return h.step(Received{Conn: h.conn(d, w), Msg: Events{Lease: LeaseID(h.num(d, "lease", 0)), Events: lines}})
		}
		return h.step(Received{Conn: h.conn(d, w), Msg: Logs{Lease: LeaseID(h.num(d, "lease", 0)), Lines: lines}})

	case "drain":
		w := h.pos(d, 0)
		return h.step(Received{Conn: h.conn(d, w), Msg: Drain{}})

	case "refresh":
		w := h.pos(d, 0)
		return h.step(Received{Conn: h.conn(d, w), Msg: Refresh{Request: h.num(d, "req", 1)}})

	case "raw":
		// raw conn=N kind  — a message on an unidentified connection.
		h.nextConn++
		c := h.nextConn
		return h.step(Received{Conn: c, Msg: Heartbeat{}})

	case "define":
		// define name=N — a workflow that a step's workflow=N starts as
		// a child run (SPEC §2); the input is submit's.
		if h.defs == nil {
			h.defs = map[string]RunSpec{}
		}
		h.defs[h.argOr(d, "name", "")] = h.parseRun(d)
		return nil

	case "submit":
		spec := h.parseRun(d)
		return h.step(Submit{Call: h.call(), Actor: h.argOr(d, "actor", ""), Spec: spec, Parent: RunID(h.argOr(d, "parent", ""))})

	case "rerun":
		// rerun run-1 [failed-only]: the old run's definition and, with
		// failed-only, its successes, live or from its history record, as
		// the API reads them (SPEC §2).
		old := RunID(h.pos(d, 0))
		r, _, ok := h.o.Run(old)
		var steps []StepRecord
		if ok {
			for _, id := range r.Steps {
				st, _ := h.o.StepByID(id)
				steps = append(steps, st)
			}
		} else if v, found := h.disk[HistoryKey(old)]; found {
			hv, err := DecodeRecord(Record{Key: HistoryKey(old), Value: v})
			if err != nil {
				h.t.Fatalf("history of %s: %v", old, err)
			}
			r, steps = hv.(*RunHistory).Run, hv.(*RunHistory).Steps
		} else {
			return []string{"unknown run " + string(old)}
		}
		in := Submit{Call: h.call(), Actor: h.argOr(d, "actor", ""), Spec: r.Spec, RerunOf: old}
		if d.HasArg("failed-only") {
			in.Reuse = ReusePlan(r, steps)
		}
		// reuse=a,b:fail: a hand-made list (b with a failure), as a
		// client other than the API might send.
		if v, ok := h.arg(d, "reuse"); ok {
			in.Reuse = nil
			for _, x := range strings.Split(v, ",") {
				name, how, _ := strings.Cut(x, ":")
				u := ReusedStep{Step: name, Outcome: Outcome{Status: OutcomeSuccess}}
				if how == "fail" {
					u.Outcome = Outcome{Status: OutcomeFailure, ExitCode: 1}
				}
				in.Reuse = append(in.Reuse, u)
			}
		}
		return h.step(in)
	case "schedule":
		// schedule create NAME cron="…" [catch-up=…] [spans=T0:off,T1:off] + a run
		// block; schedule pause|resume|delete NAME; schedule list.
		switch op := h.pos(d, 0); op {
		case "create":
			var spans []ZoneSpan
			if v, ok := h.arg(d, "spans"); ok { // +offset-from-t0:seconds,…
				for _, p := range strings.Split(v, ",") {
					at, off, _ := strings.Cut(p, ":")
					n, _ := strconv.Atoi(off)
					spans = append(spans, ZoneSpan{From: t0.Add(mustDur(h.t, at)), Offset: n})
				}
			}
			return h.step(CreateSchedule{Call: h.call(), Actor: h.argOr(d, "actor", ""), Name: h.pos(d, 1),
				Cron: strings.ReplaceAll(h.argOr(d, "cron", ""), "_", " "), Zone: h.argOr(d, "zone", ""), Spans: spans,
				CatchUp: h.argOr(d, "catch-up", ""), Spec: h.parseRun(d)})
		case "list":
			at := func(t time.Time) string {
				if t.IsZero() {
					return "none"
				}
				return DescribeAt(t, t0)
			}
			var out []string
			for _, sc := range h.o.Schedules() {
				out = append(out, fmt.Sprintf("schedule %s cron=%q catch-up=%s paused=%v last=%s next=%s runs=%d skipped=%d last-run=%s",
					sc.Name, sc.Cron, sc.CatchUp, sc.Paused, at(sc.LastFire), at(sc.NextFire), sc.Runs, sc.Skipped, sc.LastRun))
			}
			return out
		default:
			return h.step(ChangeSchedule{Call: h.call(), Actor: h.argOr(d, "actor", ""), Name: h.pos(d, 1), Op: op})
		}

	case "group":
		// group NAME: a run group's members in order, and a step group's held count.
		g := h.pos(d, 0)
		var out []string
		for _, id := range h.o.GroupMembers(g) {
			_, st, _ := h.o.Run(id)
			out = append(out, fmt.Sprintf("member %s %s", id, st))
		}
		return append(out, fmt.Sprintf("step leases held: %d", h.o.GroupHeld(g)))

	case "cancel":
		return h.step(CancelRun{Call: h.call(), Actor: h.argOr(d, "actor", ""), Run: RunID(h.pos(d, 0)), Reason: h.argOr(d, "reason", "")})

	case "approve":
		return h.step(Approve{Call: h.call(), Actor: h.argOr(d, "actor", ""), Step: StepID(h.pos(d, 0))})

	case "reject-gate":
		return h.step(RejectGate{Call: h.call(), Actor: h.argOr(d, "actor", ""), Step: StepID(h.pos(d, 0))})

	case "operator":
		// operator create NAME [read-only] [actor=A] | operator revoke NAME
		// [actor=A] | operator admin secret=S (the admin-token file)
		switch h.pos(d, 0) {
		case "create":
			var sec [32]byte
			copy(sec[:], fmt.Sprintf("op-secret-%s", h.pos(d, 1)))
			return h.step(CreateOperator{Call: h.call(), Actor: h.argOr(d, "actor", ""), Name: h.pos(d, 1), ReadOnly: h.has(d, "read-only"), Secret: sec})
		case "revoke":
			return h.step(RevokeOperator{Call: h.call(), Actor: h.argOr(d, "actor", ""), Name: h.pos(d, 1)})
		case "admin":
			return h.step(SetAdmin{Call: h.call(), Hash: hashSecret([]byte(h.argOr(d, "secret", "")))})
		}

	case "refused":
		// refused actor=A action=X target=T code=C msg=M: a refusal the
		// driver met before the core (Audit input).
		return h.step(Audit{Call: h.call(), Entry: AuditEntry{Actor: h.argOr(d, "actor", ""), Action: h.argOr(d, "action", ""),
			Target: h.argOr(d, "target", ""), Outcome: OutcomeRefused, Code: h.argOr(d, "code", ""), Message: h.argOr(d, "msg", "")}})

	case "operators":
		var out []string
		for _, t := range h.o.Operators() {
			line := fmt.Sprintf("operator %s hash=%x by=%s", t.Name, t.Hash[:4], t.CreatedBy)
			if t.ReadOnly {
				line += " read-only"
			}
			if t.Revoked {
				line += " revoked at " + DescribeAt(t.RevokedAt, t0)
			}
			out = append(out, line)
		}
		return out

	case "audit":
		// The audit log as the disk holds it, oldest first.
		var out []string
		for _, k := range sortedKeys(h.disk) {
			if !IsAuditKey(k) {
				continue
			}
			v, err := DecodeRecord(Record{Key: k, Value: h.disk[k]})
			if err != nil {
				h.t.Fatalf("audit record %s: %v", k, err)
			}
			e := v.(*AuditEntry)
			line := fmt.Sprintf("#%d %s %s %s %s %s", e.Seq, DescribeAt(e.At, t0), e.Actor, e.Action, e.Target, e.Outcome)
			if e.Code != "" {
				line += fmt.Sprintf(" %s: %s", e.Code, e.Message)
			}
			out = append(out, line)
		}
		return out

	case "restart":
		// The process dies: connections and memory are gone; the disk stays.
		h.conns = map[string]ConnID{}
		o, rd, err := Restore(h.cfg, h.now, h.disk.Records())
		if err != nil {
			return []string{"restore error: " + err.Error()}
		}
		h.o = o
		return h.absorb(rd)

	case "state":
		var out []string
		for _, s := range h.steps() {
			out = append(out, DescribeStep(s))
		}
		for _, l := range h.leases() {
			out = append(out, DescribeLease(l))
		}
		for _, w := range h.o.Workers() {
			out = append(out, DescribeWorker(w))
		}
		var runs []string
		for _, id := range h.o.RunIDs() {
			_, st, _ := h.o.Run(id)
			runs = append(runs, fmt.Sprintf("run %s %s", id, st))
		}
		for _, id := range sortedKeys(h.archive) {
			runs = append(runs, fmt.Sprintf("run %s %s archived", id, h.archive[id].Status))
		}
		sort.Strings(runs)
		return append(out, runs...)

	case "tokens":
		var out []string
		for _, t := range h.o.Tokens() {
			line := fmt.Sprintf("token %s expires=%s", t.Name, DescribeAt(t.ExpiresAt, t0))
			if t.Consumed {
				line += " used-by=" + string(t.Worker)
			}
			if t.Revoked {
				line += " revoked"
			}
			out = append(out, line)
		}
		return out

	case "closed":
		// The closed-lease table (SPEC §7a), one entry per line, then the
		// span of its log's records.
		var out []string
		for _, c := range h.o.ClosedLeases() {
			out = append(out, DescribeClosed(c, t0))
		}
		return append(out, fmt.Sprintf("log records %d..%d", h.o.closedLo, h.o.closedHi))

	case "events":
		var out []string
		evs := h.o.Events(RunID(h.pos(d, 0)))
		if a := h.archive[RunID(h.pos(d, 0))]; a != nil {
			evs = a.Events
		}
		for _, ev := range evs {
			out = append(out, DescribeAt(ev.At, t0)+" "+DescribeEvent(ev, t0))
		}
		return out

	case "stored-logs":
		var out []string
		// From the disk: an archived lease's lines stay there.
		step := StepID(h.pos(d, 0))
		var keys []string
		for k, v := range h.disk {
			if strings.HasPrefix(k, KindLog+"/") {
				ln, _ := DecodeRecord(Record{Key: k, Value: v})
				if ln.(*StepLogLine).Step == step {
					keys = append(keys, k)
				}
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			v, _ := DecodeRecord(Record{Key: k, Value: h.disk[k]})
			ln := v.(*StepLogLine)
			out = append(out, fmt.Sprintf("lease=%d seq=%d %q", ln.Lease, ln.Line.Seq, ln.Line.Text))
		}
		return out

	case "fence":
		w := h.pos(d, 0)
		if err := h.o.Fence(WorkerID(w), LeaseID(h.num(d, "lease", 0))); err != nil {
			return []string{"refused: " + err.Error()}
		}
		return []string{"may write"}

	case "authenticate":
		// authenticate w1 [credential=C]: may this session credential use the
		// data plane now? The default is w1's credential from its Welcome.
		cred := h.creds[h.pos(d, 0)]
		if v, ok := h.arg(d, "credential"); ok {
			cred = v
		}
		w, err := h.o.Authenticate(h.now, cred)
		if err != nil {
			return []string{"refused: " + err.Error()}
		}
		return []string{"worker " + string(w)}

	case "write":
		// write w1 lease=N [credential=C] [id=X]: a data-plane write (to data id X) stepped as a
		// DataWrite (SPEC §14): its typed answer, then how many records the
		// batch made (deciding changes nothing), then the batch.
		cred := h.creds[h.pos(d, 0)]
		if v, ok := h.arg(d, "credential"); ok {
			cred = v
		}
		rd := h.o.Step(h.now, DataWrite{Req: 7, Credential: cred, Lease: LeaseID(h.num(d, "lease", 0)), ID: h.argOr(d, "id", "")})
		var out []string
		for _, a := range rd.Writes {
			line := fmt.Sprintf("write req=%d %s", a.Req, a.Refusal)
			if a.Worker != "" {
				line += " worker=" + string(a.Worker)
			}
			if err := a.Err(); err != nil {
				line += ": " + err.Error()
			}
			out = append(out, line)
		}
		out = append(out, fmt.Sprintf("records: %d", len(rd.Records)))
		return append(out, h.absorb(rd)...)

	case "secret":
		// SPEC §14a. secret put NAME size=N [actor=A] | secret rm NAME |
		// secret read W lease=L NAME | secret write W lease=L NAME size=N
		// | secret list. A read is the CheckSecret query; a write a
		// SecretWrite input, answered like a DataWrite.
		switch h.pos(d, 0) {
		case "put":
			return h.step(PutSecret{Call: h.call(), Actor: h.argOr(d, "actor", ""), Name: h.pos(d, 1), Size: int(h.num(d, "size", 1))})
		case "rm":
			return h.step(RemoveSecret{Call: h.call(), Actor: h.argOr(d, "actor", ""), Name: h.pos(d, 1)})
		case "list":
			var out []string
			for _, s := range h.o.Secrets() {
				out = append(out, fmt.Sprintf("secret %s size=%d at=%s by=%s", s.Name, s.Size, DescribeAt(s.UpdatedAt, t0), s.UpdatedBy))
			}
			return out
		case "read", "write":
			w := h.pos(d, 1)
			lease, name := LeaseID(h.num(d, "lease", 0)), h.pos(d, 2)
			describe := func(a DataAnswer) string {
				line := fmt.Sprintf("%s %s %s", h.pos(d, 0), name, a.Refusal)
				if err := a.Err(); err != nil {
					line += ": " + err.Error()
				}
				return line
			}
			if h.pos(d, 0) == "read" {
				return []string{describe(h.o.CheckSecret(h.now, h.creds[w], lease, name, false))}
			}
			rd := h.o.Step(h.now, SecretWrite{Req: 9, Credential: h.creds[w], Lease: lease, Name: name, Size: int(h.num(d, "size", 1))})
			var out []string
			for _, a := range rd.Writes {
				out = append(out, describe(a))
			}
			return append(out, h.absorb(rd)...)
		}

	case "transition":
		s, ok1 := ParseState(h.pos(d, 0))
		e, ok2 := ParseEvent(h.pos(d, 1))
		if !ok1 || !ok2 {
			h.t.Fatalf("%s: unknown state or event", d.Pos)
		}
		if to, ok := Next(s, e); ok {
			return []string{fmt.Sprintf("%s --%s--> %s", s, e, to)}
		}
		return []string{fmt.Sprintf("%s --%s--> refused", s, e)}
	}
	h.t.Fatalf("%s: unknown command %q", d.Pos, d.Cmd)
	return nil
}

func (h *harness) has(d *datadriven.TestData, key string) bool {
	_, ok := h.arg(d, key)
	return ok
}

func mustDur(t *testing.T, s string) time.Duration {
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("bad duration %q: %v", s, err)
	}
	return d
}

// parseRun reads a run from the command's input block, one step a line:
//
//	run timeout=1h            (optional first line)
//	build: cmd="make" writes after=a,b tags=docker timeout=5m
func (h *harness) parseRun(d *datadriven.TestData) RunSpec {
	var spec RunSpec
	for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		fields := splitFields(line)
		if fields[0] == "run" {
			for _, f := range fields[1:] {
				k, v, _ := strings.Cut(f, "=")
				if k == "timeout" {
					spec.Timeout = mustDur(h.t, v)
				}
				if k == "name" {
					spec.Name = unescape(h.t, v)
				}
				switch k { // a run's concurrency group (SPEC §8a)
				case "group":
					spec.Group.Name = v
				case "max":
					spec.Group.Max, _ = strconv.Atoi(v)
				case "cancel-in-progress":
					spec.Group.CancelInProgress = true
				}
			}
			continue
		}
		s := StepSpec{Name: unescape(h.t, strings.TrimSuffix(fields[0], ":"))}
		s.Command = "run " + s.Name
		for _, f := range fields[1:] {
			k, v, _ := strings.Cut(f, "=")
			v = unescape(h.t, strings.Trim(v, `"`))
			list := func() []string {
				if v == "" {
					return nil
				}
				return strings.Split(v, ",")
			}
			switch k {
			case "cmd":
				s.Command = v
			case "after":
				s.DependsOn = list()
			case "writes":
				s.Writes = true
			case "outputs":
				s.Outputs, s.Writes = list(), true
			case "type":
				s.Type = v
			case "runner":
				s.Runner = v
			case "tags":
				s.Tags = list()
			case "target":
				s.Target = v
			case "platform":
				s.Platform = v
			case "labels":
				s.Labels = map[string]string{}
				for _, kv := range list() {
					a, b, _ := strings.Cut(kv, ":")
					s.Labels[a] = b
				}
			case "timeout":
				s.Timeout = mustDur(h.t, v)
			case "foreach":
				s.ForEach = list()
			case "concurrency":
				n, _ := strconv.Atoi(v)
				s.Concurrency = n
			case "hold":
				s.Hold = true
			case "hold-expiry":
				s.HoldExpiry = mustDur(h.t, v)
			case "wait":
				s.Wait = mustDur(h.t, v)
			// retry=N backoff=D on=3,7,timeout idempotent (SPEC §1 RETRY).
			case "retry", "backoff", "on":
				if s.Retry == nil {
					s.Retry = &RetryPolicy{}
				}
				switch k {
				case "retry":
					s.Retry.Attempts, _ = strconv.Atoi(v)
				case "backoff":
					s.Retry.Backoff = mustDur(h.t, v)
				case "on":
					for _, c := range list() {
						if c == "timeout" {
							s.Retry.OnTimeout = true
							continue
						}
						n, _ := strconv.Atoi(c)
						s.Retry.Codes = append(s.Retry.Codes, n)
					}
				}
			case "idempotent":
				s.Idempotent = true
			case "secrets": // SPEC §14a
				s.Secrets = list()
			case "put-secrets":
				s.PutSecrets = list()
			case "secrets-as":
				s.SecretsAs = v
			case "workflow":
				w, ok := h.defs[v]
				if !ok {
					h.t.Fatalf("%s: workflow %q is not defined", d.Pos, v)
				}
				s.Workflow, s.Command = &w, ""
			case "with":
				s.With = map[string]string{}
				for _, kv := range list() {
					a, b, _ := strings.Cut(kv, ":")
					s.With[a] = b
				}
			case "group":
				s.Group.Name = v
			case "group-max":
				s.Group.Max, _ = strconv.Atoi(v)
			case "env":
				s.Env = map[string]string{}
				for _, kv := range list() {
					a, b, _ := strings.Cut(kv, ":")
					s.Env[a] = b
				}
			// Sizes for the limits (SPEC §12): items=N generates N forEach
			// items; cmd-bytes=N a command of N bytes; env-vars=N N
			// variables; env-value=N one variable of N bytes.
			case "items":
				n, _ := strconv.Atoi(v)
				s.ForEach = make([]string, n)
				for i := range s.ForEach {
					s.ForEach[i] = strconv.Itoa(i)
				}
			case "cmd-bytes":
				n, _ := strconv.Atoi(v)
				s.Command = strings.Repeat("c", n)
			case "env-vars":
				n, _ := strconv.Atoi(v)
				s.Env = map[string]string{}
				for i := range n {
					s.Env[fmt.Sprintf("V%04d", i)] = "v"
				}
			case "env-value":
				n, _ := strconv.Atoi(v)
				s.Env = map[string]string{"BIG": strings.Repeat("v", n)}
			default:
				h.t.Fatalf("%s: unknown step field %q", d.Pos, k)
			}
		}
		spec.Steps = append(spec.Steps, s)
	}
	return spec
}

// unescape reads the Go escapes (\x1b, \n, \x00, …) in a story's value, so
// that a story can hold a name with control characters (SPEC §12).
func unescape(t *testing.T, s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	u, err := strconv.Unquote(`"` + s + `"`)
	if err != nil {
		t.Fatalf("bad escape in %q: %v", s, err)
	}
	return u
}

// splitFields splits on spaces outside double quotes.
func splitFields(s string) []string {
	var out []string
	var cur strings.Builder
	inq := false
	for _, r := range s {
		switch {
		case r == '"':
			inq = !inq
			cur.WriteRune(r)
		case r == ' ' && !inq:
			if cur.Len() > 0 {
				out = append(out, cur.String())
				cur.Reset()
			}
		default:
			cur.WriteRune(r)
		}
	}
	if cur.Len() > 0 {
		out = append(out, cur.String())
	}
	return out
}

// describeRecordKeys renders the keys of a batch's records in one line.
func describeRecordKeys(recs []Record) string {
	if len(recs) == 0 {
		return "records: none"
	}
	keys := make([]string, len(recs))
	for i, r := range recs {
		keys[i] = r.Key
	}
	return "records: " + strings.Join(keys, " ")
}
