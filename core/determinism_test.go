package core

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"
)

// inputGen draws a random but meaningful input stream for an Orchestrator:
// it reads the machine's outputs to learn lease ids and credentials, so its
// reports, starts and reconnects name real leases most of the time.
type inputGen struct {
	r        *rand.Rand
	now      time.Time
	call     CallID
	nextConn ConnID
	workers  []string
	conn     map[string]ConnID
	cred     map[string]string
	token    map[string]string
	held     map[string]map[LeaseID]StepID // worker → leases dispatched to it
	runs     []RunID
	steps    []StepID
}

func newInputGen(seed uint64) *inputGen {
	return &inputGen{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), now: t0,
		conn: map[string]ConnID{}, cred: map[string]string{}, token: map[string]string{},
		held: map[string]map[LeaseID]StepID{}}
}

func (g *inputGen) pick(n int) int { return g.r.IntN(n) }

func (g *inputGen) worker() string {
	if len(g.workers) == 0 {
		return ""
	}
	return g.workers[g.pick(len(g.workers))]
}

func (g *inputGen) lease(w string) (LeaseID, StepID, bool) {
	ls := g.held[w]
	if len(ls) == 0 {
		return 0, "", false
	}
	ids := make([]LeaseID, 0, len(ls))
	for id := range ls {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	id := ids[g.pick(len(ids))]
	return id, ls[id], true
}

func (g *inputGen) refs(w string) []LeaseRef {
	var refs []LeaseRef
	for id, s := range g.held[w] {
		if g.pick(4) > 0 {
			refs = append(refs, LeaseRef{Step: s, Lease: id})
		}
	}
	sort.Slice(refs, func(i, j int) bool { return refs[i].Lease < refs[j].Lease })
	return refs
}

func (g *inputGen) entropy() (e [16]byte) {
	for i := range e {
		e[i] = byte(g.r.Uint32())
	}
	return e
}

// next returns the next input and the time to apply it at; restart says the
// machine should be rebuilt from its records first.
func (g *inputGen) next() (in Input, restart bool) {
	g.call++
	switch k := g.pick(100); {
	case k < 15:
		g.now = g.now.Add(time.Duration(g.pick(90_000)) * time.Millisecond)
		return Tick{}, false
	case k < 20 && len(g.workers) < 6:
		w := fmt.Sprintf("w%d", len(g.workers)+1)
		g.workers = append(g.workers, w)
		g.token[w] = "pending"
		return CreateToken{Call: g.call, Name: "tok-" + w, TTL: time.Duration(1+g.pick(3)) * time.Hour, Secret: g.entropy()}, false
	case k < 25:
		w := g.worker()
		if w == "" || g.conn[w] != 0 {
			return Tick{}, false
		}
		g.nextConn++
		g.conn[w] = g.nextConn
		h := Hello{Version: ProtocolVersion, Worker: WorkerID(w), Name: w, Slots: 1 + g.pick(3),
			MaxDelay: time.Duration(g.pick(3)) * 30 * time.Second, Scaler: g.pick(8) == 0}
		if g.pick(2) == 0 {
			h.Tags = []string{"docker"}
		}
		if c, ok := g.cred[w]; ok {
			h.Credential, h.InFlight = c, g.refs(w)
		} else {
			h.Token = g.token[w]
		}
		return Received{Conn: g.nextConn, Msg: h, Entropy: g.entropy()}, false
	case k < 30:
		w := g.worker()
		if w == "" || g.conn[w] == 0 {
			return Tick{}, false
		}
		c := g.conn[w]
		g.conn[w] = 0
		return Disconnected{Conn: c}, false
	case k < 38:
		if len(g.runs) > 12 {
			return Tick{}, false
		}
		return Submit{Call: g.call, Spec: g.run()}, false
	case k < 40 && len(g.runs) > 0:
		return CancelRun{Call: g.call, Run: g.runs[g.pick(len(g.runs))]}, false
	case k < 42 && len(g.steps) > 0:
		s := g.steps[g.pick(len(g.steps))]
		if g.pick(2) == 0 {
			return Approve{Call: g.call, Step: s}, false
		}
		return RejectGate{Call: g.call, Step: s}, false
	case k < 43 && g.pick(8) == 0: // rare: a revoked worker never comes back
		if w := g.worker(); w != "" {
			return RevokeToken{Call: g.call, Name: "tok-" + w}, false
		}
	case k < 45 && g.pick(4) == 0:
		return Tick{}, true
	case k < 46: // a schedule (SPEC §8a): created, or paused, resumed, deleted
		name := []string{"sa", "sb"}[g.pick(2)]
		if g.pick(2) == 0 {
			return CreateSchedule{Call: g.call, Name: name, Cron: []string{"*/10 * * * *", "@hourly", "5,35 * * * *"}[g.pick(3)],
				CatchUp: []string{"", CatchUpNone, CatchUpAll}[g.pick(3)], Spec: RunSpec{Name: "sched", Steps: []StepSpec{{Name: "a", Command: "true"}}}}, false
		}
		return ChangeSchedule{Call: g.call, Name: name, Op: []string{SchedulePause, ScheduleResume, ScheduleDelete}[g.pick(3)]}, false
	}
	// A message from a connected worker.
	w := g.worker()
	if w == "" || g.conn[w] == 0 {
		return Tick{}, false
	}
	c := g.conn[w]
	lease, step, ok := g.lease(w)
	switch k := g.pick(10); {
	case k < 2:
		return Received{Conn: c, Msg: Heartbeat{InFlight: g.refs(w)}}, false
	case k < 3:
		if g.pick(8) == 0 {
			return Received{Conn: c, Msg: Drain{}}, false
		}
		return Received{Conn: c, Msg: Refresh{Request: uint64(g.call)}}, false
	case !ok:
		return Tick{}, false
	case k < 5:
		return Received{Conn: c, Msg: Start{Lease: lease, Request: uint64(g.pick(3))}}, false
	case k < 6:
		return Received{Conn: c, Msg: RejectDispatch{Lease: lease, Reason: "busy"}}, false
	case k < 7:
		return Received{Conn: c, Msg: Logs{Lease: lease, Lines: []LogLine{{Seq: uint64(g.pick(5)), At: g.now, Text: "x"}}}}, false
	default:
		st := []OutcomeStatus{OutcomeSuccess, OutcomeSuccess, OutcomeFailure, OutcomeCancelled, OutcomeCleanupFailed, OutcomeWorkerStopped}[g.pick(6)]
		if g.pick(10) == 0 {
			step = "run-1/nope"
		}
		return Received{Conn: c, Msg: Report{Step: step, Lease: lease, Request: 1 + uint64(g.pick(2)),
			Outcome: Outcome{Status: st, ExitCode: int(st) - 1}}}, false
	}
}

func (g *inputGen) run() RunSpec {
	n := 1 + g.pick(4)
	spec := RunSpec{Name: "r"}
	if g.pick(4) == 0 {
		spec.Timeout = time.Duration(1+g.pick(10)) * time.Minute
	}
	for i := 0; i < n; i++ {
		s := StepSpec{Name: fmt.Sprintf("s%d", i), Command: "true", Writes: g.pick(2) == 0}
		for j := 0; j < i; j++ {
			if g.pick(3) == 0 {
				s.DependsOn = append(s.DependsOn, fmt.Sprintf("s%d", j))
			}
		}
		switch g.pick(12) {
		case 0:
			s.Tags = []string{"docker"}
		case 1:
			s.ForEach, s.Concurrency = []string{"a", "b", "c"}, 1+g.pick(2)
		case 2:
			s.Hold = true
		case 3:
			s.Wait = 20 * time.Second
		case 4:
			s.Timeout = 45 * time.Second
		case 5:
			s.Type = "task"
		}
		spec.Steps = append(spec.Steps, s)
	}
	switch g.pick(6) { // concurrency groups (SPEC §8a)
	case 0:
		spec.Group = ConcurrencyGroup{Name: "g", Max: 1 + g.pick(2)}
	case 1:
		spec.Group = ConcurrencyGroup{Name: "g", CancelInProgress: true}
	case 2:
		spec.Steps[0].Group = ConcurrencyGroup{Name: "sg", Max: 1}
	}
	return spec
}

// learn reads a batch's outputs into the generator's view of the world.
func (g *inputGen) learn(o *Orchestrator, rd Ready) {
	for _, a := range rd.Answers {
		if a.Token != "" {
			g.token[strings.TrimPrefix(tokenName(a.Token), "tok-")] = a.Token
		}
		if a.Run != "" && a.Err == "" && (len(g.runs) == 0 || g.runs[len(g.runs)-1] != a.Run) {
			if r, _, ok := o.Run(a.Run); ok && r.SubmittedAt.Equal(o.Now()) {
				g.runs = append(g.runs, a.Run)
				g.steps = append(g.steps, r.Steps...)
			}
		}
	}
	for _, e := range rd.Messages {
		w := ""
		for name, c := range g.conn {
			if c == e.Conn && c != 0 {
				w = name
			}
		}
		if w == "" {
			continue
		}
		switch m := e.Msg.(type) {
		case Welcome:
			if m.Credential != "" {
				g.cred[w] = m.Credential
			}
		case Dispatch:
			if g.held[w] == nil {
				g.held[w] = map[LeaseID]StepID{}
			}
			g.held[w][m.Lease] = m.Step
		case Answer:
			if g.pick(3) > 0 {
				delete(g.held[w], m.Lease)
			}
		case Close, Refused:
			g.conn[w] = 0
		}
	}
}

func describeAll(rd Ready) string {
	var b strings.Builder
	for _, l := range DescribeReady(rd, t0, func(c ConnID) string { return fmt.Sprint(c) }) {
		b.WriteString(l + "\n")
	}
	for _, r := range rd.Records {
		fmt.Fprintf(&b, "%s %v %s\n", r.Key, r.Delete, r.Value)
	}
	for _, l := range rd.Logs {
		fmt.Fprintf(&b, "log %s %s %v\n", l.Level, l.Msg, l.Fields)
	}
	return b.String()
}

func restoreFrom(t *testing.T, o *Orchestrator, now time.Time) (*Orchestrator, Ready) {
	n, rd, err := Restore(o.Config(), now, o.Records())
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	return n, rd
}

// TestDeterminism feeds one long seeded input stream to two fresh machines:
// every batch and every fingerprint must be identical.
func TestDeterminism(t *testing.T) {
	seeds := 20
	steps := 3000
	if testing.Short() {
		seeds, steps = 4, 1000
	}
	for seed := uint64(1); seed <= uint64(seeds); seed++ {
		g := newInputGen(seed)
		a, b := NewOrchestrator(Config{}), NewOrchestrator(Config{})
		grants, archived := 0, 0
		for i := 0; i < steps; i++ {
			in, restart := g.next()
			var ra, rb Ready
			if restart {
				a, ra = restoreFrom(t, a, g.now)
				b, rb = restoreFrom(t, b, g.now)
			} else {
				ra, rb = a.Step(g.now, in), b.Step(g.now, in)
			}
			da, db := describeAll(ra), describeAll(rb)
			if da != db {
				t.Fatalf("seed %d step %d (%T): batches differ\n--- a\n%s--- b\n%s\nreplay: go test ./core -run TestDeterminism", seed, i, in, da, db)
			}
			if fa, fb := a.Fingerprint(), b.Fingerprint(); fa != fb {
				t.Fatalf("seed %d step %d: fingerprints differ: %x vs %x", seed, i, fa, fb)
			}
			g.learn(a, ra)
			for _, e := range ra.Messages {
				if _, ok := e.Msg.(Dispatch); ok {
					grants++
				}
			}
			for _, r := range ra.Records {
				if IsHistoryKey(r.Key) {
					archived++
				}
			}
		}
		if grants == 0 || len(g.runs) == 0 {
			t.Fatalf("seed %d: the stream granted no lease or submitted no run: the generator is vacuous", seed)
		}
		if seed == 1 && archived == 0 {
			t.Fatalf("seed %d: no run was archived: the generator never finishes a run", seed)
		}
	}
}

// TestCloneIndependent checks Clone: a clone has the same fingerprint, then
// evolves independently, and fed the same inputs produces the same batches.
func TestCloneIndependent(t *testing.T) {
	g := newInputGen(7)
	o := NewOrchestrator(Config{})
	for i := 0; i < 1500; i++ {
		in, restart := g.next()
		if restart {
			continue
		}
		g.learn(o, o.Step(g.now, in))
	}
	c := o.Clone()
	if o.Fingerprint() != c.Fingerprint() {
		t.Fatal("clone has a different fingerprint")
	}
	if !bytes.Equal(recordsBytes(o.Records()), recordsBytes(c.Records())) {
		t.Fatal("clone has different records")
	}
	before := o.Fingerprint()
	for i := 0; i < 300; i++ {
		in, restart := g.next()
		if restart {
			continue
		}
		ra := c.Step(g.now, in)
		g.learn(c, ra)
	}
	if o.Fingerprint() != before {
		t.Fatal("stepping the clone changed the original")
	}
	if c.Fingerprint() == before {
		t.Fatal("300 inputs did not change the clone: the check is vacuous")
	}
	// Same inputs to original and a fresh clone give the same batches.
	c2 := o.Clone()
	g2 := newInputGen(99)
	g2.now = g.now
	for i := 0; i < 300; i++ {
		in, restart := g2.next()
		if restart {
			continue
		}
		ra, rb := o.Step(g2.now, in), c2.Step(g2.now, in)
		if describeAll(ra) != describeAll(rb) {
			t.Fatalf("step %d: original and clone diverged", i)
		}
		g2.learn(o, ra)
	}
}

func recordsBytes(recs []Record) []byte {
	var b bytes.Buffer
	for _, r := range recs {
		b.WriteString(r.Key)
		b.Write(r.Value)
	}
	return b.Bytes()
}

// TestRestoreKeepsDurableState checks that loading the records a machine
// wrote gives back exactly its durable state (before SPEC §7's re-arming).
func TestRestoreKeepsDurableState(t *testing.T) {
	g := newInputGen(3)
	o := NewOrchestrator(Config{})
	for i := 0; i < 2000; i++ {
		in, restart := g.next()
		if restart {
			continue
		}
		g.learn(o, o.Step(g.now, in))
	}
	n := &Orchestrator{cfg: o.cfg}
	n.init()
	if err := n.load(o.Records()); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(recordsBytes(o.Records()), recordsBytes(n.Records())) {
		t.Fatal("records → load → records is not the identity")
	}
}

// safety tracks what a machine showed so far and checks, after every batch,
// the cheap safety facts of SPEC §13 that the core alone can see.
type safety struct {
	terminal  map[StepID]State
	outcome   map[StepID]Outcome
	writeLock map[StepID]LeaseID // write-bearing step → the lease it started under
	maxLease  LeaseID
}

func newSafety() *safety {
	return &safety{terminal: map[StepID]State{}, outcome: map[StepID]Outcome{}, writeLock: map[StepID]LeaseID{}}
}

func (sf *safety) check(t *testing.T, o *Orchestrator, where string) {
	t.Helper()
	current := map[StepID]LeaseID{}
	perWorker := map[WorkerID]int{}
	for _, l := range o.Leases() {
		if l.ID > sf.maxLease {
			sf.maxLease = l.ID
		}
		if !l.Current {
			continue
		}
		if prev, ok := current[l.Step]; ok {
			t.Fatalf("%s: step %s has two current leases %d and %d", where, l.Step, prev, l.ID)
		}
		current[l.Step] = l.ID
		perWorker[l.Worker]++
		if lock, ok := sf.writeLock[l.Step]; ok && lock != l.ID {
			t.Fatalf("%s: write-bearing step %s started under lease %d was leased again (%d)", where, l.Step, lock, l.ID)
		}
	}
	for _, w := range o.Workers() {
		if perWorker[w.ID] > w.Slots {
			t.Fatalf("%s: worker %s holds %d leases with %d slots", where, w.ID, perWorker[w.ID], w.Slots)
		}
		if w.Revoked && perWorker[w.ID] > 0 {
			t.Fatalf("%s: revoked worker %s holds %d leases", where, w.ID, perWorker[w.ID])
		}
	}
	for _, s := range o.Steps() {
		if s.Lease != current[s.ID] {
			t.Fatalf("%s: step %s names lease %d, current is %d", where, s.ID, s.Lease, current[s.ID])
		}
		if prev, ok := sf.terminal[s.ID]; ok && prev != s.State {
			t.Fatalf("%s: terminal step %s changed %s -> %s", where, s.ID, prev, s.State)
		}
		if s.State.Terminal() {
			sf.terminal[s.ID] = s.State
		}
		if s.Outcome != nil {
			if prev, ok := sf.outcome[s.ID]; ok && prev != *s.Outcome {
				t.Fatalf("%s: committed outcome of %s changed", where, s.ID)
			}
			sf.outcome[s.ID] = *s.Outcome
		}
		if sp, _ := o.StepSpecOf(s.ID); sp.Writes && s.EverStarted {
			if _, ok := sf.writeLock[s.ID]; !ok && s.Lease != 0 {
				sf.writeLock[s.ID] = s.Lease
			} else if !ok {
				sf.writeLock[s.ID] = 0 // started, lease already gone: never again
			}
		}
	}
}

// TestSafetyUnderRandomInputs runs long random streams (restarts included)
// and checks the core-visible safety facts after every batch.
func TestSafetyUnderRandomInputs(t *testing.T) {
	seeds := 30
	if testing.Short() {
		seeds = 5
	}
	for seed := uint64(100); seed < uint64(100+seeds); seed++ {
		g := newInputGen(seed)
		o := NewOrchestrator(Config{})
		sf := newSafety()
		for i := 0; i < 2000; i++ {
			in, restart := g.next()
			var rd Ready
			if restart {
				o, rd = restoreFrom(t, o, g.now)
			} else {
				rd = o.Step(g.now, in)
			}
			sf.check(t, o, fmt.Sprintf("seed %d step %d (%T)", seed, i, in))
			g.learn(o, rd)
		}
	}
}

// TestLogDedup: a duplicated message stores nothing twice — log lines by
// sequence, events by their own sequence, gap markers by time and text.
func TestLogDedup(t *testing.T) {
	o := NewOrchestrator(Config{})
	var sec [16]byte
	rd := o.Step(t0, CreateToken{Call: 1, Name: "t", TTL: time.Hour, Secret: sec})
	o.Step(t0, Received{Conn: 1, Msg: Hello{Version: ProtocolVersion, Token: rd.Answers[0].Token, Worker: "w1", Slots: 1, MaxDelay: time.Minute}})
	o.Step(t0, Submit{Call: 2, Spec: RunSpec{Steps: []StepSpec{{Name: "a", Command: "x"}}}})
	marker := LogLine{Seq: 0, At: t0, Text: "--- Orchestrator offline for 5s. Replaying 0 buffered events and 1 buffered log lines. 2 log lines dropped due to buffer overflow. ---"}
	logs := Logs{Lease: 1, Lines: []LogLine{marker, {Seq: 1, At: t0, Text: "one"}}}
	events := Events{Lease: 1, Events: []LogLine{{Seq: 1, At: t0, Text: "event one"}}}
	for i := 0; i < 2; i++ {
		o.Step(t0, Received{Conn: 1, Msg: logs})
		o.Step(t0, Received{Conn: 1, Msg: events})
	}
	var markers, lines, evs int
	for _, ln := range o.StepLogs("run-1/a") {
		switch {
		case ln.Event:
			evs++
		case ln.Line.Seq == 0:
			markers++
		default:
			lines++
		}
	}
	if markers != 1 || lines != 1 || evs != 1 {
		t.Fatalf("stored %d markers, %d lines, %d events; want one of each", markers, lines, evs)
	}
}

// TestNoStateCacheSameBatches: a machine without the state cache (as the
// real driver runs it) decides exactly as one with it. The stream of
// TestDeterminism goes to both; a restart restores each from the records
// the cached one's state holds.
func TestNoStateCacheSameBatches(t *testing.T) {
	seeds, steps := 10, 3000
	if testing.Short() {
		seeds, steps = 3, 1000
	}
	for seed := uint64(1); seed <= uint64(seeds); seed++ {
		g := newInputGen(seed)
		a, b := NewOrchestrator(Config{}), NewOrchestrator(Config{NoStateCache: true})
		for i := 0; i < steps; i++ {
			in, restart := g.next()
			var ra, rb Ready
			if restart {
				recs := a.Records()
				var err error
				if a, ra, err = Restore(a.Config(), g.now, recs); err != nil {
					t.Fatal(err)
				}
				if b, rb, err = Restore(b.Config(), g.now, recs); err != nil {
					t.Fatal(err)
				}
			} else {
				ra, rb = a.Step(g.now, in), b.Step(g.now, in)
			}
			if da, db := describeAll(ra), describeAll(rb); da != db {
				t.Fatalf("seed %d step %d (%T): batches differ\n--- cached\n%s--- uncached\n%s\nreplay: go test ./core -run TestNoStateCacheSameBatches", seed, i, in, da, db)
			}
			if !b.Config().NoStateCache || len(b.enc) != 0 {
				t.Fatalf("seed %d step %d: the uncached machine holds %d cached records", seed, i, len(b.enc))
			}
			g.learn(a, ra)
		}
	}
}

// TestHeartbeatClockInCloneAndFingerprint: the heartbeat clock is state in
// no record (SPEC §8), so Clone must carry it and Fingerprint must cover
// it: two machines that differ only in a heartbeat decide differently (a
// silent worker gets no work), and the explorer must never take one for the
// other.
func TestHeartbeatClockInCloneAndFingerprint(t *testing.T) {
	o := NewOrchestrator(Config{})
	var sec [16]byte
	rd := o.Step(t0, CreateToken{Call: 1, Name: "t", TTL: time.Hour, Secret: sec})
	o.Step(t0, Received{Conn: 1, Msg: Hello{Version: ProtocolVersion, Token: rd.Answers[0].Token, Worker: "w1", Slots: 1, MaxDelay: time.Minute}})
	quiet := o.Clone()
	at := t0.Add(50 * time.Second)
	if rd := o.Step(at, Received{Conn: 1, Msg: Heartbeat{}}); len(rd.Records) != 0 || len(rd.Messages) != 0 {
		t.Fatalf("a heartbeat that changes nothing else made a batch of %d records, %d messages", len(rd.Records), len(rd.Messages))
	}
	if rd := quiet.Step(at, Tick{}); len(rd.Records) != 0 {
		t.Fatalf("a tick made %d records", len(rd.Records))
	}
	if o.Fingerprint() == quiet.Fingerprint() {
		t.Fatal("a machine that heard a heartbeat has the fingerprint of one that did not")
	}
	// At +70s w1 is silent (60s) on the quiet machine only: a submit is
	// dispatched by o and by its clone, not by quiet.
	c := o.Clone()
	if o.Fingerprint() != c.Fingerprint() {
		t.Fatal("clone has a different fingerprint")
	}
	sub := Submit{Call: 2, Spec: RunSpec{Steps: []StepSpec{{Name: "a", Command: "x"}}}}
	at = t0.Add(70 * time.Second)
	ro, rc, rq := o.Step(at, sub), c.Step(at, sub), quiet.Step(at, sub)
	if describeAll(ro) != describeAll(rc) {
		t.Fatalf("original and clone diverged:\n--- original\n%s--- clone\n%s", describeAll(ro), describeAll(rc))
	}
	if describeAll(ro) == describeAll(rq) {
		t.Fatalf("the heartbeat made no difference: the check is vacuous\n%s", describeAll(ro))
	}
}

// TestArchiveEncodesAsEncodingJSON checks archive's history records, which
// it encodes from the live records without copying them (encodeHistory):
// each must be exactly encoding/json's rendering of the RunHistory it
// decodes to, runs without steps or leases included (null lists).
func TestArchiveEncodesAsEncodingJSON(t *testing.T) {
	seeds, steps := 10, 3000
	if testing.Short() {
		seeds, steps = 3, 1000
	}
	archived, noLeases := 0, 0
	for seed := uint64(1); seed <= uint64(seeds); seed++ {
		g := newInputGen(seed)
		o := NewOrchestrator(Config{NoStateCache: true})
		for i := 0; i < steps; i++ {
			in, restart := g.next()
			if restart {
				continue
			}
			rd := o.Step(g.now, in)
			g.learn(o, rd)
			for _, r := range rd.Records {
				if !IsHistoryKey(r.Key) {
					continue
				}
				v, err := DecodeRecord(r)
				if err != nil {
					t.Fatalf("seed %d step %d: history record %s: %v", seed, i, r.Key, err)
				}
				h := v.(*RunHistory)
				want, err := json.Marshal(h)
				if err != nil || !bytes.Equal(r.Value, want) {
					t.Fatalf("seed %d step %d: history record %s written\n%s\nencoding/json renders it\n%s (%v)\nreplay: go test ./core -run TestArchiveEncodesAsEncodingJSON", seed, i, r.Key, r.Value, want, err)
				}
				if !reflect.DeepEqual(h.Head, h.DeriveHead()) {
					t.Fatalf("seed %d step %d: history record %s: head %+v, the rest says %+v", seed, i, r.Key, h.Head, h.DeriveHead())
				}
				archived++
				if len(h.Leases) == 0 {
					noLeases++
					if h.Leases != nil { // a RunHistory of copies held nil, so null
						t.Fatalf("seed %d step %d: history record %s: no lease, written [] not null\nreplay: go test ./core -run TestArchiveEncodesAsEncodingJSON", seed, i, r.Key)
					}
				}
				if len(h.Steps) == 0 && h.Steps != nil {
					t.Fatalf("seed %d step %d: history record %s: no step, written [] not null", seed, i, r.Key)
				}
			}
		}
	}
	if archived == 0 || noLeases == 0 {
		t.Fatalf("%d runs archived, %d of them without a lease: the stream does not exercise archive", archived, noLeases)
	}
}
