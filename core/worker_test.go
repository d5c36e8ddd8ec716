package core

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
)

// workerEpoch is where every scenario's worker clock starts; outputs only
// ever show times relative to it or to the current step.
var workerEpoch = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// TestWorkerScenarios runs the stories in testdata/worker_*.txt.
//
// Commands (arguments in brackets are optional):
//
//	worker [slots=N] [no-reconnect] [scaler] [single-use] [jitter=F] [seed=N] [log-buffer=N]
//	       [event-buffer=N] [retries=N] [request-timeout=D] [kill-grace=D] [dial-timeout=D]
//	       [credential=C] [no-token]
//	                             new worker; jitter is off unless given; credential
//	                             boots it with a saved session credential
//	boot | connected | tick      WBoot, WConnected (fresh conn id), WTick
//	dial-failed [reason=R] | disconnect [reason=R]
//	welcome [ttl=D] [hb=D] [cancel=(L, L)]  (issues a credential if the Hello carried a token)
//	refused [fatal] [reason=R] | close [reason=R]
//	dispatch lease=L step=S [writes] [cmd=C]
//	start-ack lease=L [fail] [reason=R] [req=N]
//	output lease=L [n=N] [text=T] | event lease=L [n=N] [text=T]
//	exit lease=L [code=N] [signaled] [err=E]
//	answer lease=L COMMITTED|CANCELLED|REJECTED [reason=R] [req=N]
//	cancel lease=L [reason=R]
//	refreshed [ttl=D] [req=N]
//	drain                        WDrain: the process got SIGTERM or SIGINT
//	advance D                    move the clock by D, sending WTick at every deadline on the way
//	next-deadline                move the clock to the last deadline and send WTick
//	state                        the worker's accessors
//
// Every step prints DescribeWorkerReady. Commands that take several steps
// print the deadline of the last one only.
func TestWorkerScenarios(t *testing.T) {
	files, err := filepath.Glob("testdata/worker_*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenario files: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			var h *workerHarness
			datadriven.RunTest(t, f, func(t *testing.T, td *datadriven.TestData) string {
				if td.Cmd == "worker" {
					h = newWorkerHarness(t, td)
					return fmt.Sprintf("worker %s slots=%d", h.w.cfg.Name, h.w.cfg.Slots)
				}
				if h == nil {
					t.Fatalf("%s: no worker yet", td.Pos)
				}
				return h.run(t, td)
			})
		})
	}
}

type workerHarness struct {
	w          *Worker
	now        time.Time
	deadline   time.Time // of the last Ready
	conn       ConnID
	lastHello  Hello
	startReq   map[LeaseID]uint64
	reportReq  map[LeaseID]uint64
	refreshReq uint64
}

func newWorkerHarness(t *testing.T, td *datadriven.TestData) *workerHarness {
	cfg := WorkerConfig{
		ID: "w-7f3a", Name: "builder", Token: "builder.s3cr3t", Tags: []string{"linux"},
		Platform: "linux/amd64", BackoffJitter: -1,
	}
	for _, a := range td.CmdArgs {
		switch a.Key {
		case "slots":
			cfg.Slots = argInt(t, a)
		case "ahead":
			cfg.Ahead = argInt(t, a)
		case "lossy":
			cfg.LinkLosesFrames = true
		case "no-reconnect":
			cfg.NoReconnect = true
		case "scaler":
			cfg.Scaler = true
		case "single-use":
			cfg.SingleUse = true
		case "jitter":
			f, err := strconv.ParseFloat(a.Vals[0], 64)
			if err != nil {
				t.Fatal(err)
			}
			cfg.BackoffJitter = f
		case "seed":
			cfg.Seed = uint64(argInt(t, a))
		case "window":
			cfg.LogWindowLines = argInt(t, a)
		case "window-bytes":
			cfg.LogWindowBytes = argInt(t, a)
		case "cap":
			cfg.OutputCapBytes = int64(argInt(t, a))
		case "retries":
			cfg.RequestRetries = argInt(t, a)
		case "request-timeout":
			cfg.RequestTimeout = argDur(t, a)
		case "kill-grace":
			cfg.KillGrace = argDur(t, a)
		case "dial-timeout":
			cfg.DialTimeout = argDur(t, a)
		case "drain-timeout":
			cfg.DrainTimeout = argDur(t, a)
		case "credential":
			cfg.Credential = a.Vals[0]
		case "no-token":
			cfg.Token = ""
		default:
			t.Fatalf("worker: unknown argument %s", a.Key)
		}
	}
	return &workerHarness{
		w: NewWorker(cfg), now: workerEpoch,
		startReq: map[LeaseID]uint64{}, reportReq: map[LeaseID]uint64{},
	}
}

// step feeds one input and returns its description; withDeadline false
// leaves out the deadline line.
func (h *workerHarness) step(in WorkerInput, withDeadline bool) string {
	rd := h.w.Step(h.now, in)
	h.deadline = rd.Deadline
	for _, m := range rd.Send {
		switch m := m.(type) {
		case Hello:
			h.lastHello = m
		case Start:
			h.startReq[m.Lease] = m.Request
		case Report:
			h.reportReq[m.Lease] = m.Request
		case Refresh:
			h.refreshReq = m.Request
		}
	}
	if !withDeadline {
		rd.Deadline = time.Time{}
	}
	return DescribeWorkerReady(h.now, rd)
}

func (h *workerHarness) run(t *testing.T, td *datadriven.TestData) string {
	var out []string
	emit := func(s string) {
		if s != "" {
			out = append(out, s)
		}
	}
	one := func(in WorkerInput) { emit(h.step(in, true)) }
	// many feeds n inputs, showing the deadline after the last only.
	many := func(n int, in func(i int) WorkerInput) {
		for i := 1; i <= n; i++ {
			emit(h.step(in(i), i == n))
		}
	}
	lease := func() LeaseID { return LeaseID(argUint(t, td, "lease", 0)) }
	reason := func(def string) string { return argStr(td, "reason", def) }
	switch td.Cmd {
	case "boot":
		one(WBoot{})
	case "connected":
		h.conn++
		one(WConnected{Conn: h.conn})
	case "dial-failed":
		one(WDialFailed{Reason: reason("connection refused")})
	case "disconnect":
		one(WDisconnected{Reason: reason("connection reset")})
	case "tick":
		one(WTick{})
	case "drain":
		one(WDrain{})
	case "welcome":
		m := Welcome{Worker: h.w.cfg.ID, CredentialTTL: argDurOpt(t, td, "ttl", 0), Heartbeat: argDurOpt(t, td, "hb", 0)}
		if h.lastHello.Token != "" {
			m.Credential = "cred-" + string(h.w.cfg.ID)
		}
		if a, ok := td.Arg("cancel"); ok {
			for _, v := range a.Vals {
				l, err := strconv.ParseUint(v, 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				m.Cancel = append(m.Cancel, LeaseID(l))
			}
		}
		one(WReceived{Msg: m})
	case "refused":
		one(WReceived{Msg: Refused{Reason: reason("refused"), Fatal: td.HasArg("fatal")}})
	case "close":
		one(WReceived{Msg: Close{Reason: reason("closed")}})
	case "dispatch":
		one(WReceived{Msg: Dispatch{
			Lease: lease(), Step: StepID(argStr(td, "step", "run-1/a")), Run: "run-1",
			Command: argStr(td, "cmd", ""), Writes: td.HasArg("writes"), Attempt: 1,
			Timeout: argDurOpt(t, td, "timeout", 0),
		}})
	case "start-ack":
		l := lease()
		one(WReceived{Msg: StartAck{Lease: l, Request: argUint(t, td, "req", h.startReq[l]),
			OK: !td.HasArg("fail"), Reason: argStr(td, "reason", "")}})
	case "output", "event":
		l, text := lease(), argStr(td, "text", "")
		if td.Cmd == "output" && td.HasArg("batch") {
			// n lines read at once: one input.
			var lines []string
			for i := 1; i <= int(argUint(t, td, "n", 1)); i++ {
				s := text
				if s == "" {
					s = fmt.Sprintf("output %d", i)
				}
				lines = append(lines, s)
			}
			one(WExecOutput{Lease: l, Lines: lines})
			break
		}
		many(int(argUint(t, td, "n", 1)), func(i int) WorkerInput {
			s := text
			if s == "" {
				s = fmt.Sprintf("%s %d", td.Cmd, i)
			}
			if td.Cmd == "event" {
				return WExecEvent{Lease: l, Text: s}
			}
			return WExecOutput{Lease: l, Lines: []string{s}}
		})
	case "log-ack":
		one(WReceived{Msg: LogAck{Lease: lease(), Lines: argUint(t, td, "lines", 0), Events: argUint(t, td, "events", 0)}})
	case "exit":
		one(WExecExited{Lease: lease(), ExitCode: int(argUint(t, td, "code", 0)),
			Signaled: td.HasArg("signaled"), Err: argStr(td, "err", "")})
	case "answer":
		l := lease()
		v := VerdictNone
		for _, c := range []Verdict{Committed, Cancelled, Rejected} {
			if td.HasArg(c.String()) {
				v = c
			}
		}
		one(WReceived{Msg: Answer{Lease: l, Request: argUint(t, td, "req", h.reportReq[l]), Verdict: v, Reason: reason("")}})
	case "cancel":
		one(WReceived{Msg: Cancel{Lease: lease(), Reason: reason("run cancelled")}})
	case "refreshed":
		one(WReceived{Msg: Refreshed{Request: argUint(t, td, "req", h.refreshReq), TTL: argDurOpt(t, td, "ttl", 0)}})
	case "advance":
		if len(td.CmdArgs) != 1 {
			t.Fatalf("advance wants one duration")
		}
		d, err := time.ParseDuration(td.CmdArgs[0].Key)
		if err != nil {
			t.Fatal(err)
		}
		end := h.now.Add(d)
		for range 10000 {
			dl := h.deadline
			if h.w.Exited() || dl.IsZero() || dl.After(end) {
				break
			}
			h.now = dl
			emit("at t=" + DescribeDuration(h.now.Sub(workerEpoch)) + ":")
			emit(h.step(WTick{}, true))
		}
		h.now = end
	case "next-deadline":
		if h.deadline.IsZero() {
			t.Fatalf("%s: no deadline", td.Pos)
		}
		h.now = h.deadline
		emit("at t=" + DescribeDuration(h.now.Sub(workerEpoch)) + ":")
		emit(h.step(WTick{}, true))
	case "state":
		ev, ln := h.w.Buffered()
		emit(fmt.Sprintf("connected=%v exited=%v", h.w.Connected(), h.w.Exited()))
		emit("in-flight=" + describeRefs(h.w.InFlight()))
		emit(fmt.Sprintf("pending=%v", h.w.Pending()))
		emit(fmt.Sprintf("unacked events=%d lines=%d", ev, ln))
		var paused []LeaseID
		for _, r := range h.w.InFlight() {
			if h.w.OutputPaused(r.Lease) {
				paused = append(paused, r.Lease)
			}
		}
		emit(fmt.Sprintf("paused=%v", paused))
	default:
		t.Fatalf("%s: unknown command %q", td.Pos, td.Cmd)
	}
	if len(out) == 0 {
		return "(nothing)"
	}
	return strings.Join(out, "\n")
}

func argStr(td *datadriven.TestData, key, def string) string {
	if a, ok := td.Arg(key); ok && len(a.Vals) > 0 {
		return a.Vals[0]
	}
	return def
}

func argUint(t *testing.T, td *datadriven.TestData, key string, def uint64) uint64 {
	s := argStr(td, key, "")
	if s == "" {
		return def
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatalf("%s=%s: %v", key, s, err)
	}
	return v
}

func argInt(t *testing.T, a datadriven.CmdArg) int {
	v, err := strconv.Atoi(a.Vals[0])
	if err != nil {
		t.Fatalf("%s: %v", a.Key, err)
	}
	return v
}

func argDur(t *testing.T, a datadriven.CmdArg) time.Duration {
	d, err := time.ParseDuration(a.Vals[0])
	if err != nil {
		t.Fatalf("%s: %v", a.Key, err)
	}
	return d
}

func argDurOpt(t *testing.T, td *datadriven.TestData, key string, def time.Duration) time.Duration {
	if a, ok := td.Arg(key); ok {
		return argDur(t, a)
	}
	return def
}

// workerGen produces a long, seeded, mostly protocol-shaped input stream,
// steering by what the worker last asked for.
type workerGen struct {
	r        *rand.Rand
	now      time.Time
	deadline time.Time
	conn     ConnID
	lease    LeaseID
	dialing  bool
	hello    bool
	ready    bool
	leases   []LeaseID // every lease dispatched so far
	inFlight []LeaseRef
	starts   map[LeaseID]uint64
	reports  map[LeaseID]uint64
	refresh  uint64
}

func newWorkerGen(seed uint64) *workerGen {
	return &workerGen{r: rand.New(rand.NewPCG(seed, 7)), now: workerEpoch,
		starts: map[LeaseID]uint64{}, reports: map[LeaseID]uint64{}}
}

// observe learns from a Ready what the worker expects next.
func (g *workerGen) observe(rd WorkerReady, inFlight []LeaseRef) {
	g.deadline = rd.Deadline
	g.inFlight = inFlight
	if rd.Close {
		g.dialing, g.hello, g.ready = false, false, false
	}
	if rd.Dial {
		g.dialing = true
	}
	for _, m := range rd.Send {
		switch m := m.(type) {
		case Hello:
			g.hello = true
		case Start:
			g.starts[m.Lease] = m.Request
		case Report:
			g.reports[m.Lease] = m.Request
		case Refresh:
			g.refresh = m.Request
		}
	}
}

func (g *workerGen) anyLease() LeaseID {
	if len(g.inFlight) > 0 && g.r.IntN(4) > 0 {
		return g.inFlight[g.r.IntN(len(g.inFlight))].Lease
	}
	if len(g.leases) == 0 || g.r.IntN(20) == 0 {
		return LeaseID(g.r.IntN(5)) // unknown
	}
	return g.leases[len(g.leases)-1-g.r.IntN(min(len(g.leases), 4))]
}

func (g *workerGen) next() (time.Time, WorkerInput) {
	g.now = g.now.Add(time.Duration(g.r.IntN(3000)) * time.Millisecond)
	if !g.deadline.IsZero() && g.r.IntN(3) == 0 {
		if g.deadline.After(g.now) {
			g.now = g.deadline
		}
		return g.now, WTick{}
	}
	switch {
	case g.dialing && g.r.IntN(4) > 0:
		g.dialing = false
		if g.r.IntN(3) == 0 {
			return g.now, WDialFailed{Reason: "refused"}
		}
		g.conn++
		return g.now, WConnected{Conn: g.conn}
	case g.hello && g.r.IntN(4) > 0:
		g.hello = false
		switch g.r.IntN(20) {
		case 0:
			return g.now, WReceived{Msg: Refused{Reason: "busy"}}
		case 1:
			return g.now, WReceived{Msg: Close{Reason: "superseded"}}
		}
		g.ready = true
		var cancel []LeaseID
		if g.r.IntN(4) == 0 {
			cancel = []LeaseID{g.anyLease()}
		}
		return g.now, WReceived{Msg: Welcome{CredentialTTL: time.Duration(g.r.IntN(3)) * time.Minute,
			Heartbeat: 30 * time.Second, Credential: "c", Cancel: cancel}}
	}
	l := g.anyLease()
	switch g.r.IntN(20) {
	case 0:
		if g.r.IntN(8) == 0 {
			g.dialing, g.hello, g.ready = false, false, false
			return g.now, WDisconnected{Reason: "reset"}
		}
		return g.now, WBoot{}
	case 1, 2:
		g.lease++
		g.leases = append(g.leases, g.lease)
		return g.now, WReceived{Msg: Dispatch{Lease: g.lease, Step: StepID(fmt.Sprintf("run-1/s%d", g.lease)),
			Writes: g.r.IntN(2) == 0, Command: "true", Env: map[string]string{"A": "1", "B": "2"}}}
	case 3:
		return g.now, WReceived{Msg: StartAck{Lease: l, Request: g.starts[l], OK: g.r.IntN(8) > 0}}
	case 4, 5, 12, 13, 14:
		return g.now, WExecOutput{Lease: l, Lines: []string{"line", "more"}[:1+g.r.IntN(2)]}
	case 6, 15:
		return g.now, WExecEvent{Lease: l, Text: "event"}
	case 7:
		return g.now, WExecExited{Lease: l, ExitCode: g.r.IntN(3), Signaled: g.r.IntN(6) == 0}
	case 8:
		return g.now, WReceived{Msg: Answer{Lease: l, Request: g.reports[l], Verdict: Verdict(1 + g.r.IntN(3))}}
	case 9:
		return g.now, WReceived{Msg: Cancel{Lease: l, Reason: "cancelled"}}
	case 10:
		if g.r.IntN(2) == 0 {
			return g.now, WReceived{Msg: LogAck{Lease: l, Lines: g.r.Uint64N(8), Events: g.r.Uint64N(4)}}
		}
		return g.now, WReceived{Msg: Refreshed{Request: g.refresh, TTL: time.Minute}}
	case 11:
		// Out-of-protocol input the worker must shrug off.
		return g.now, []WorkerInput{WConnected{Conn: 99}, WDialFailed{}, WReceived{Msg: Welcome{}}, WReceived{Msg: Heartbeat{}}}[g.r.IntN(4)]
	case 16:
		if g.r.IntN(10) == 0 {
			return g.now, WDrain{} // the first drains, the second stops the steps
		}
	}
	return g.now, WTick{}
}

// TestWorkerDeterministicAndCloneable feeds two workers, and from some point
// a clone of the first, the same long seeded stream: their Readies and
// fingerprints must agree at every step, and stepping a clone must never
// change the original.
func TestWorkerDeterministicAndCloneable(t *testing.T) {
	for seed := uint64(1); seed <= 30; seed++ {
		cfg := WorkerConfig{ID: "w-1", Name: "w", Token: "w.s", Slots: 2, Seed: seed,
			LogWindowLines: 3, LogWindowBytes: 20, OutputCapBytes: 60, RequestRetries: 2, Labels: map[string]string{"zone": "a", "arch": "x"}}
		if seed%5 == 0 {
			cfg.NoReconnect = true
		}
		a, b := NewWorker(cfg), NewWorker(cfg)
		var shadow *Worker
		g := newWorkerGen(seed)
		for i := 0; i < 4000 && !a.Exited(); i++ {
			if i == 300 {
				shadow = a.Clone()
			}
			if i%97 == 0 {
				// Step a throwaway clone with its own inputs; a must not notice.
				before, c := a.Fingerprint(), a.Clone()
				if c.Fingerprint() != before {
					t.Fatalf("seed %d step %d: clone fingerprint differs", seed, i)
				}
				cg := newWorkerGen(seed + 1000)
				cg.now = g.now
				for range 50 {
					now, in := cg.next()
					cg.observe(c.Step(now, in), c.InFlight())
				}
				if a.Fingerprint() != before {
					t.Fatalf("seed %d step %d: stepping a clone changed the original", seed, i)
				}
			}
			now, in := g.next()
			ra, rb := a.Step(now, in), b.Step(now, in)
			da, db := DescribeWorkerReady(now, ra), DescribeWorkerReady(now, rb)
			if da != db || !reflect.DeepEqual(ra, rb) {
				t.Fatalf("seed %d step %d (%T): readies differ:\n%s\n---\n%s", seed, i, in, da, db)
			}
			if a.Fingerprint() != b.Fingerprint() {
				t.Fatalf("seed %d step %d: fingerprints differ", seed, i)
			}
			if shadow != nil {
				rs := shadow.Step(now, in)
				if ds := DescribeWorkerReady(now, rs); ds != da || shadow.Fingerprint() != a.Fingerprint() {
					t.Fatalf("seed %d step %d: clone diverged:\n%s\n---\n%s", seed, i, da, ds)
				}
			}
			g.observe(ra, a.InFlight())
		}
	}
}

// TestWorkerFingerprint checks that the fingerprint is stable and sees every
// change of state.
func TestWorkerFingerprint(t *testing.T) {
	w := NewWorker(WorkerConfig{ID: "w", Slots: 8, LogWindowLines: 3, Labels: map[string]string{"a": "1", "b": "2", "c": "3"}})
	now := workerEpoch
	seen := map[uint64]int{}
	step := func(in WorkerInput) {
		now = now.Add(time.Second)
		w.Step(now, in)
		fp := w.Fingerprint()
		for range 20 {
			if w.Fingerprint() != fp {
				t.Fatalf("fingerprint is not stable")
			}
		}
		if j, ok := seen[fp]; ok {
			t.Fatalf("state after input %d has the fingerprint of state %d", len(seen), j)
		}
		seen[fp] = len(seen)
	}
	step(WBoot{})
	step(WConnected{Conn: 1})
	step(WReceived{Msg: Welcome{Heartbeat: time.Hour}})
	for l := LeaseID(1); l <= 6; l++ {
		step(WReceived{Msg: Dispatch{Lease: l, Step: "r/s", Env: map[string]string{"x": "1", "y": "2"}}})
	}
	step(WDisconnected{})
	for range 5 {
		step(WExecOutput{Lease: 2, Lines: []string{"x"}})
	}
}

// TestWorkerBackoffJitterBounds checks many seeded delays against ±20%.
func TestWorkerBackoffJitterBounds(t *testing.T) {
	for seed := uint64(0); seed < 50; seed++ {
		w := NewWorker(WorkerConfig{Seed: seed})
		for n := 1; n <= 15; n++ {
			raw, got := w.rawBackoff(n), w.backoff(n)
			lo := time.Duration(float64(raw) * 0.8)
			hi := min(time.Duration(float64(raw)*1.2), w.cfg.BackoffMax)
			if got < lo || got > hi {
				t.Fatalf("seed %d attempt %d: %v outside [%v, %v]", seed, n, got, lo, hi)
			}
		}
	}
}

func TestWorkerExitIsFinal(t *testing.T) {
	w := NewWorker(WorkerConfig{NoReconnect: true})
	now := workerEpoch
	w.Step(now, WBoot{})
	rd := w.Step(now, WDialFailed{Reason: "no route"})
	if rd.Exit == nil || rd.Exit.Code != WorkerExitDisconnected {
		t.Fatalf("want exit 2, got %+v", rd.Exit)
	}
	for _, in := range []WorkerInput{WBoot{}, WTick{}, WConnected{Conn: 1}, WExecOutput{Lease: 1, Lines: []string{"x"}}} {
		if rd := w.Step(now.Add(time.Hour), in); !reflect.DeepEqual(rd, WorkerReady{}) {
			t.Fatalf("after exit %T produced %+v", in, rd)
		}
	}
}

// TestWorkerFingerprintCoversState perturbs every field of the worker's state
// in turn: each must change the fingerprint. The field counts make a new
// field fail this test until it is covered here (and in Fingerprint).
func TestWorkerFingerprintCoversState(t *testing.T) {
	for typ, want := range map[reflect.Type]int{
		reflect.TypeFor[Worker](): 28, reflect.TypeFor[execution](): 28,
		reflect.TypeFor[request](): 6, reflect.TypeFor[WorkerConfig](): 26,
	} {
		if typ.NumField() != want {
			t.Errorf("%v has %d fields, this test knows %d: cover the new ones", typ, typ.NumField(), want)
		}
	}
	w := NewWorker(WorkerConfig{ID: "w", Slots: 2, LogWindowLines: 5, OutputCapBytes: 4})
	now := workerEpoch
	for _, in := range []WorkerInput{WBoot{}, WConnected{Conn: 1}, WReceived{Msg: Welcome{CredentialTTL: time.Minute, Credential: "c"}},
		WReceived{Msg: Dispatch{Lease: 1, Step: "r/a", Env: map[string]string{"k": "v"}}}, WExecExited{Lease: 1},
		WReceived{Msg: Dispatch{Lease: 2, Step: "r/b"}}, WDisconnected{}, WExecOutput{Lease: 2, Lines: []string{"x", "dropped over the cap"}}, WExecEvent{Lease: 2, Text: "e"}} {
		now = now.Add(time.Second)
		w.Step(now, in)
	}
	base := w.Fingerprint()
	d := time.Nanosecond
	mut := map[string]func(c *Worker){
		"cfg.ID": func(c *Worker) { c.cfg.ID = "x" }, "cfg.Name": func(c *Worker) { c.cfg.Name = "x" },
		"cfg.Token": func(c *Worker) { c.cfg.Token = "x" }, "cfg.Credential": func(c *Worker) { c.cfg.Credential = "x" }, "cfg.Tags": func(c *Worker) { c.cfg.Tags = []string{"x"} },
		"cfg.Labels": func(c *Worker) { c.cfg.Labels = map[string]string{"x": ""} }, "cfg.Platform": func(c *Worker) { c.cfg.Platform = "x" },
		"cfg.Slots": func(c *Worker) { c.cfg.Slots++ }, "cfg.Ahead": func(c *Worker) { c.cfg.Ahead++ }, "cfg.LinkLosesFrames": func(c *Worker) { c.cfg.LinkLosesFrames = true }, "cfg.Scaler": func(c *Worker) { c.cfg.Scaler = true },
		"cfg.NoReconnect": func(c *Worker) { c.cfg.NoReconnect = true }, "cfg.SingleUse": func(c *Worker) { c.cfg.SingleUse = true }, "cfg.Seed": func(c *Worker) { c.cfg.Seed++ },
		"cfg.BackoffBase": func(c *Worker) { c.cfg.BackoffBase += d }, "cfg.BackoffFactor": func(c *Worker) { c.cfg.BackoffFactor++ },
		"cfg.BackoffMax": func(c *Worker) { c.cfg.BackoffMax += d }, "cfg.BackoffJitter": func(c *Worker) { c.cfg.BackoffJitter = 0.5 },
		"cfg.LogWindowLines": func(c *Worker) { c.cfg.LogWindowLines++ }, "cfg.LogWindowBytes": func(c *Worker) { c.cfg.LogWindowBytes++ },
		"cfg.OutputCapBytes": func(c *Worker) { c.cfg.OutputCapBytes++ },
		"cfg.RequestTimeout": func(c *Worker) { c.cfg.RequestTimeout += d }, "cfg.RequestRetries": func(c *Worker) { c.cfg.RequestRetries++ },
		"cfg.KillGrace": func(c *Worker) { c.cfg.KillGrace += d }, "cfg.DialTimeout": func(c *Worker) { c.cfg.DialTimeout += d },
		"cfg.DrainTimeout": func(c *Worker) { c.cfg.DrainTimeout += d },
		"draining":         func(c *Worker) { c.draining = true }, "stopping": func(c *Worker) { c.stopping = true },
		"drainStopAt": func(c *Worker) { c.drainStopAt = now },
		"pcg":         func(c *Worker) { c.pcg.Uint64() }, "exited": func(c *Worker) { c.exited = true },
		"phase": func(c *Worker) { c.phase = phaseHello }, "conn": func(c *Worker) { c.conn = 9 },
		"connDeadline": func(c *Worker) { c.connDeadline = now }, "dialAt": func(c *Worker) { c.dialAt = c.dialAt.Add(d) },
		"attempt": func(c *Worker) { c.attempt++ }, "welcomed": func(c *Worker) { c.welcomed = false },
		"offlineSince": func(c *Worker) { c.offlineSince = c.offlineSince.Add(d) }, "credential": func(c *Worker) { c.credential = "x" },
		"credTTL": func(c *Worker) { c.credTTL += d }, "credExpiry": func(c *Worker) { c.credExpiry = now },
		"refreshAt": func(c *Worker) { c.refreshAt = now }, "heartbeat": func(c *Worker) { c.heartbeat += d },
		"heartbeatAt": func(c *Worker) { c.heartbeatAt = now }, "beatAnchor": func(c *Worker) { c.beatAnchor = c.beatAnchor.Add(d) }, "nextRequest": func(c *Worker) { c.nextRequest++ },
		"maxLease":        func(c *Worker) { c.maxLease++ },
		"letGo":           func(c *Worker) { c.letGo++ },
		"requests":        func(c *Worker) { c.requests = c.requests[1:] },
		"request.id":      func(c *Worker) { c.requests[0].id-- },
		"request.kind":    func(c *Worker) { c.requests[0].kind = reqRefresh },
		"request.ref":     func(c *Worker) { c.requests[0].ref.Step = "x" },
		"request.outcome": func(c *Worker) { c.requests[len(c.requests)-1].outcome.Message = "x" },
		"request.due":     func(c *Worker) { c.requests[0].due = now },
		"request.retries": func(c *Worker) { c.requests[0].retries++ },
		"leases":          func(c *Worker) { c.dropLease(1) },
		"order":           func(c *Worker) { c.order = c.order[1:] }, // the same executions, walked
		"exec.ref":        func(c *Worker) { c.leases[1].ref.Step = "x" },
		"exec.command":    func(c *Worker) { c.leases[1].command = "x" },
		"exec.env":        func(c *Worker) { c.leases[1].env["k"] = "w" },
		"exec.writes":     func(c *Worker) { c.leases[1].writes = true },
		"exec.secrets":    func(c *Worker) { c.leases[1].secrets = []string{"S"} },
		"exec.secretsAs":  func(c *Worker) { c.leases[1].secretsAs = "env" },
		"exec.released":   func(c *Worker) { c.leases[1].released = true },
		"exec.proc":       func(c *Worker) { c.leases[1].proc = procRunning },
		"exec.cancelled":  func(c *Worker) { c.leases[1].cancelled = true },
		"exec.termed":     func(c *Worker) { c.leases[1].termed = true },
		"exec.stopped":    func(c *Worker) { c.leases[1].stopped = true },
		"exec.ahead":      func(c *Worker) { c.leases[1].ahead = true },
		"exec.reportSent": func(c *Worker) { c.leases[1].reportSent = !c.leases[1].reportSent },
		"exec.killAt":     func(c *Worker) { c.leases[1].killAt = now },
		"exec.timeout":    func(c *Worker) { c.leases[1].timeout += d },
		"exec.timeoutAt":  func(c *Worker) { c.leases[1].timeoutAt = now },
		"exec.timedOut":   func(c *Worker) { c.leases[1].timedOut = true },
		"exec.logSeq":     func(c *Worker) { c.leases[1].logSeq++ },
		"exec.eventSeq":   func(c *Worker) { c.leases[1].eventSeq++ },
		"exec.lines":      func(c *Worker) { c.leases[2].lines[0].Text = "y" },
		"exec.lines.seq":  func(c *Worker) { c.leases[2].lines[0].Seq = 7 },
		"exec.events":     func(c *Worker) { c.leases[2].events[0].At = now.Add(d) },
		"exec.eventsLen":  func(c *Worker) { c.leases[2].events = nil },
		"exec.lineBytes":  func(c *Worker) { c.leases[2].lineBytes++ },
		"exec.outBytes":   func(c *Worker) { c.leases[2].outBytes++ },
		"exec.capped":     func(c *Worker) { c.leases[2].capped = false },
		"exec.dropLines":  func(c *Worker) { c.leases[2].dropLines++ },
		"exec.dropBytes":  func(c *Worker) { c.leases[2].dropBytes++ },
		"exec.dropEvents": func(c *Worker) { c.leases[2].dropEvents++ },
	}
	for name, f := range mut {
		c := w.Clone()
		f(c)
		if c.Fingerprint() == base {
			t.Errorf("perturbing %s does not change the fingerprint", name)
		}
		if w.Fingerprint() != base {
			t.Fatalf("perturbing %s on a clone changed the original", name)
		}
	}
}

// TestWorkerEarlyHeartbeat checks the early Heartbeat (SPEC §7a, rule 2):
// a worker that lets go of heartbeatAfterReleases leases sends one at once,
// listing what it still holds, long before its interval is up; and not
// before.
func TestWorkerEarlyHeartbeat(t *testing.T) {
	w := NewWorker(WorkerConfig{ID: "w", Slots: 2})
	now := workerEpoch
	step := func(in WorkerInput) WorkerReady {
		now = now.Add(time.Millisecond)
		return w.Step(now, in)
	}
	heartbeats := func(rd WorkerReady) (n int, listed int) {
		for _, m := range rd.Send {
			if h, ok := m.(Heartbeat); ok {
				n, listed = n+1, len(h.InFlight)
			}
		}
		return n, listed
	}
	step(WBoot{})
	step(WConnected{Conn: 1})
	step(WReceived{Msg: Welcome{Worker: "w", Heartbeat: time.Hour}})
	step(WReceived{Msg: Dispatch{Lease: 1, Step: "r/held"}}) // held throughout (lease ids only grow)
	for l := LeaseID(2); l <= heartbeatAfterReleases+1; l++ {
		step(WReceived{Msg: Dispatch{Lease: l, Step: "r/s"}})
		var req uint64
		reported := false
		for _, m := range step(WExecExited{Lease: l}).Send {
			if r, ok := m.(Report); ok {
				req, reported = r.Request, true
			}
		}
		if !reported {
			t.Fatalf("lease %d: no Report after its process exited", l)
		}
		n, listed := heartbeats(step(WReceived{Msg: Answer{Lease: l, Request: req, Verdict: Committed}}))
		switch released := int(l - 1); {
		case released < heartbeatAfterReleases && n != 0:
			t.Fatalf("a Heartbeat after %d released leases, before %d", released, heartbeatAfterReleases)
		case released == heartbeatAfterReleases && n != 1:
			t.Fatalf("%d leases released within %v of an hour's interval: %d Heartbeats, want 1 at once", released, now.Sub(workerEpoch), n)
		case released == heartbeatAfterReleases && listed != 1:
			t.Fatalf("the early Heartbeat lists %d leases, want the 1 still held", listed)
		}
	}
}
