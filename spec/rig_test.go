package spec

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tether-run/tether/core"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// rig drives a real orchestrator through a scripted story and feeds a
// Checker the way a driver would: Input, Step, Batch, Persisted (the records
// go to an in-memory disk), then every message Delivered to its worker.
// produce and land are split so that a test can doctor a batch in between.
type rig struct {
	t        testing.TB
	o        *core.Orchestrator
	c        *Checker
	now      time.Time
	call     core.CallID
	nextConn core.ConnID
	req      uint64
	secret   byte
	conn     map[core.WorkerID]core.ConnID
	connW    map[core.ConnID]core.WorkerID
	tokens   map[string]string
	creds    map[core.WorkerID]string
	leases   map[core.LeaseID]core.Dispatch
	holder   map[core.LeaseID]core.WorkerID
	answers  map[core.LeaseID]core.Answer
	disk     core.Disk
	lastRun  core.RunID
	// onDeliver, if set, sees every delivered message after the rig did.
	onDeliver func(w core.WorkerID, m core.Msg)
	// keep, if set, filters the records the disk stores (a faulty store).
	keep func(core.Record) bool
	// stop, if set, is told of a violation instead of failing the test.
	stop func(*Violation)
}

func newRig(t testing.TB) *rig {
	r := &rig{t: t, o: core.NewOrchestrator(core.Config{}), c: NewChecker(), now: t0,
		conn: map[core.WorkerID]core.ConnID{}, connW: map[core.ConnID]core.WorkerID{},
		tokens: map[string]string{}, creds: map[core.WorkerID]string{},
		leases: map[core.LeaseID]core.Dispatch{}, holder: map[core.LeaseID]core.WorkerID{},
		answers: map[core.LeaseID]core.Answer{}, disk: core.Disk{}}
	r.c.Verify = true
	return r
}

// produce feeds the input and steps the orchestrator; the batch is not yet
// shown to the checker.
func (r *rig) produce(in core.Input) core.Ready {
	r.c.Input(r.now, in)
	return r.o.Step(r.now, in)
}

// land shows a batch to the checker, persists it and delivers its messages.
func (r *rig) land(rd core.Ready) core.Ready {
	r.c.Batch(r.now, r.o, rd)
	r.persist(rd)
	r.deliver(rd)
	return rd
}

func (r *rig) persist(rd core.Ready) {
	for _, rec := range rd.Records {
		if r.keep == nil || r.keep(rec) {
			r.disk.Apply([]core.Record{rec})
		}
	}
	r.c.Persisted(r.now, rd)
}

func (r *rig) deliver(rd core.Ready) {
	for _, a := range rd.Answers {
		if a.Token != "" {
			name, _, _ := strings.Cut(a.Token, ".")
			r.tokens[name] = a.Token
		}
		if a.Run != "" {
			r.lastRun = a.Run
		}
	}
	for _, e := range rd.Messages {
		w, ok := r.connW[e.Conn]
		if !ok {
			continue
		}
		r.c.Delivered(r.now, w, e.Msg)
		switch m := e.Msg.(type) {
		case core.Welcome:
			if m.Credential != "" {
				r.creds[w] = m.Credential
			}
		case core.Dispatch:
			r.leases[m.Lease] = m
			r.holder[m.Lease] = w
		case core.Answer:
			r.answers[m.Lease] = m
		case core.Close, core.Refused:
			delete(r.connW, e.Conn)
			if r.conn[w] == e.Conn {
				delete(r.conn, w)
			}
		}
		if r.onDeliver != nil {
			r.onDeliver(w, e.Msg)
		}
	}
}

// step lands one input and requires the checker to stay quiet.
func (r *rig) step(in core.Input) core.Ready {
	r.t.Helper()
	rd := r.land(r.produce(in))
	r.quiet()
	return rd
}

func (r *rig) quiet() {
	r.t.Helper()
	if v := r.c.Check(); v != nil {
		if r.stop != nil {
			r.stop(v)
		}
		r.t.Fatalf("correct behaviour flagged: %v", v)
	}
}

func (r *rig) advance(d time.Duration) core.Ready {
	r.t.Helper()
	r.now = r.now.Add(d)
	return r.step(core.Tick{})
}

func (r *rig) nextCall() core.CallID { r.call++; return r.call }

func (r *rig) createToken(name string, ttl time.Duration) string {
	r.t.Helper()
	r.secret++
	r.step(core.CreateToken{Call: r.nextCall(), Name: name, TTL: ttl, Secret: [16]byte{r.secret}})
	return r.tokens[name]
}

// hello is a Hello of worker w on a new connection.
func (r *rig) hello(w core.WorkerID, slots int, tags ...string) core.Received {
	r.nextConn++
	c := r.nextConn
	r.conn[w] = c
	r.connW[c] = w
	h := core.Hello{Version: core.ProtocolVersion, Worker: w, Name: string(w), Slots: slots, Tags: tags,
		MaxDelay: 60 * time.Second}
	return core.Received{Conn: c, Msg: h, Entropy: [16]byte{byte(c)}}
}

// enroll creates a token for w and enrolls it.
func (r *rig) enroll(w core.WorkerID, slots int, tags ...string) {
	r.t.Helper()
	tok := r.createToken("tok-"+string(w), time.Hour)
	in := r.hello(w, slots, tags...)
	h := in.Msg.(core.Hello)
	h.Token = tok
	in.Msg = h
	r.step(in)
	if r.creds[w] == "" {
		r.t.Fatalf("worker %s was not enrolled", w)
	}
}

// reconnect dials w again with its credential, reporting the leases it
// holds.
func (r *rig) reconnect(w core.WorkerID, inflight ...core.LeaseID) core.Ready {
	r.t.Helper()
	in := r.hello(w, 1)
	h := in.Msg.(core.Hello)
	h.Credential = r.creds[w]
	for _, l := range inflight {
		h.InFlight = append(h.InFlight, core.LeaseRef{Step: r.leases[l].Step, Lease: l})
	}
	in.Msg = h
	return r.step(in)
}

func (r *rig) disconnect(w core.WorkerID) core.Ready {
	r.t.Helper()
	c := r.conn[w]
	delete(r.conn, w)
	delete(r.connW, c)
	return r.step(core.Disconnected{Conn: c})
}

func (r *rig) submit(steps ...core.StepSpec) core.RunID {
	r.t.Helper()
	r.step(core.Submit{Call: r.nextCall(), Spec: core.RunSpec{Name: "r", Steps: steps}})
	return r.lastRun
}

func (r *rig) msg(w core.WorkerID, m core.Msg) core.Received {
	return core.Received{Conn: r.conn[w], Msg: m}
}

func (r *rig) reportIn(w core.WorkerID, l core.LeaseID, st core.OutcomeStatus) core.Received {
	r.req++
	return r.msg(w, core.Report{Step: r.leases[l].Step, Lease: l, Request: r.req, Outcome: core.Outcome{Status: st, ExitCode: map[bool]int{true: 0, false: 1}[st == core.OutcomeSuccess]}})
}

// report lands a report and returns its answer.
func (r *rig) report(w core.WorkerID, l core.LeaseID, st core.OutcomeStatus) core.Answer {
	r.t.Helper()
	r.step(r.reportIn(w, l, st))
	return r.answers[l]
}

// leaseOf returns the lease the rig saw dispatched for a step (the latest).
func (r *rig) leaseOf(s core.StepID) core.LeaseID {
	var best core.LeaseID
	for l, d := range r.leases {
		if d.Step == s && l > best {
			best = l
		}
	}
	if best == 0 {
		r.t.Fatalf("step %s was never dispatched", s)
	}
	return best
}

func (r *rig) state(s core.StepID) core.State {
	st, ok := r.c.View(r.o).StepByID(s)
	if !ok {
		r.t.Fatalf("no step %s", s)
	}
	return st.State
}

// crash kills the orchestrator and restores it from the rig's disk.
func (r *rig) crash() {
	r.t.Helper()
	r.c.Crash(r.now)
	r.restore()
}

func (r *rig) restore() {
	r.t.Helper()
	o, rd, err := core.Restore(r.o.Config(), r.now, r.disk.Records())
	if err != nil {
		r.t.Fatal(err)
	}
	r.o = o
	clear(r.conn)
	clear(r.connW)
	r.c.Restored(r.now, o, rd)
	r.persist(rd)
	r.deliver(rd)
}

// expect requires the named invariant to fire, and says which others did.
func expect(t testing.TB, c *Checker, name string) {
	t.Helper()
	var fired []string
	var mine *Violation
	for _, inv := range Invariants {
		if v := inv.Check(c); v != nil {
			fired = append(fired, v.Error())
			if inv.Name == name {
				mine = v
			}
		}
	}
	if mine == nil {
		t.Fatalf("planted bug not caught by %s; fired: %v", name, fired)
	}
	if len(fired) > 1 {
		t.Logf("also fired: %s", strings.Join(fired, "; "))
	}
	t.Logf("caught: %v", mine)
}

// expectFirst requires Check to report exactly the named invariant first.
func expectFirst(t testing.TB, c *Checker, name string) {
	t.Helper()
	v := c.Check()
	if v == nil || v.Invariant != name {
		t.Fatalf("want %s to fire first, got %v", name, v)
	}
	t.Logf("caught: %v", v)
}

func noWrite(name string, deps ...string) core.StepSpec {
	return core.StepSpec{Name: name, Command: "true", DependsOn: deps}
}

func writeStep(name string, deps ...string) core.StepSpec {
	return core.StepSpec{Name: name, Command: "deploy", Writes: true, DependsOn: deps}
}

func sid(run core.RunID, name string) core.StepID {
	return core.StepID(fmt.Sprintf("%s/%s", run, name))
}
