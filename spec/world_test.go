package spec

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/tether-run/tether/core"
)

// world is a small random world around a real orchestrator: workers that
// enroll, take leases, run the start handshake, write, report (sometimes
// twice), get cancelled, drop and reconnect; operators that submit, cancel,
// approve and revoke; an orchestrator that crashes, sometimes losing a batch
// it never persisted. It exists to show that the Checker raises no false
// alarm on the real core, with every invariant evaluated many times.
type world struct {
	*rig
	rnd       *rand.Rand
	workers   []core.WorkerID
	scaler    map[core.WorkerID]bool
	gone      map[core.WorkerID]bool // revoked, refused or scaler-disconnected: never dials again
	held      map[core.WorkerID]map[core.LeaseID]bool
	started   map[core.LeaseID]bool // the step's process started
	startReq  map[core.LeaseID]bool // a Start was sent
	cancel    map[core.LeaseID]bool // a Cancel reached the worker
	lastRep   map[core.LeaseID]core.Report
	runs      []core.RunID
	stats     map[string]int
	answered  map[core.WorkerID][]core.Report // reports answered, for duplicate deliveries
	sendEarly bool                            // a faulty driver (mutant)
}

func newWorld(t testing.TB, seed uint64) *world {
	w := &world{rig: newRig(t), rnd: rand.New(rand.NewPCG(seed, seed*7919)),
		scaler: map[core.WorkerID]bool{}, gone: map[core.WorkerID]bool{},
		held: map[core.WorkerID]map[core.LeaseID]bool{}, started: map[core.LeaseID]bool{},
		startReq: map[core.LeaseID]bool{}, cancel: map[core.LeaseID]bool{}, lastRep: map[core.LeaseID]core.Report{},
		stats: map[string]int{}, answered: map[core.WorkerID][]core.Report{}}
	w.onDeliver = w.workerSees
	return w
}

func (w *world) pick(n int) int { return w.rnd.IntN(n) }

// workerSees is the worker side of a delivered message.
func (w *world) workerSees(id core.WorkerID, m core.Msg) {
	switch m := m.(type) {
	case core.Welcome:
		for _, l := range m.Cancel {
			w.drop(id, l)
		}
	case core.Dispatch:
		if w.held[id] == nil {
			w.held[id] = map[core.LeaseID]bool{}
		}
		w.held[id][m.Lease] = true
		if !m.Writes {
			w.started[m.Lease] = true
			w.c.ProcessStarted(w.now, id, m.Lease, m.Step, false)
		}
	case core.StartAck:
		d := w.leases[m.Lease]
		if !w.held[id][m.Lease] {
			return
		}
		if !m.OK {
			w.drop(id, m.Lease)
			return
		}
		if d.Writes && !w.started[m.Lease] {
			w.started[m.Lease] = true
			w.c.ProcessStarted(w.now, id, m.Lease, d.Step, true)
			w.stats["write-bearing process"]++
			if w.pick(2) == 0 {
				w.c.ExternalWrite(w.now, id, m.Lease, d.Step)
			}
		}
	case core.Answer:
		w.stats["answer "+m.Verdict.String()]++
		if rep, ok := w.lastRep[m.Lease]; ok && rep.Request == m.Request {
			w.answered[id] = append(w.answered[id], rep)
		}
		w.drop(id, m.Lease)
	case core.Cancel:
		if w.held[id][m.Lease] {
			w.cancel[m.Lease] = true
		}
	}
}

func (w *world) drop(id core.WorkerID, l core.LeaseID) {
	if w.held[id][l] {
		delete(w.held[id], l)
		if w.started[l] {
			w.c.ProcessStopped(w.now, id, l)
		}
	}
}

func (w *world) heldLeases(id core.WorkerID) []core.LeaseID {
	var ls []core.LeaseID
	for l := range w.held[id] {
		ls = append(ls, l)
	}
	sort.Slice(ls, func(i, j int) bool { return ls[i] < ls[j] })
	return ls
}

func (w *world) connected() []core.WorkerID {
	var ws []core.WorkerID
	for _, id := range w.workers {
		if _, ok := w.conn[id]; ok {
			ws = append(ws, id)
		}
	}
	return ws
}

func (w *world) enrollRandom() {
	id := core.WorkerID(fmt.Sprintf("w%d", len(w.workers)+1))
	tok := w.createToken("tok-"+string(id), time.Hour)
	in := w.hello(id, 1+w.pick(3))
	h := in.Msg.(core.Hello)
	h.Token = tok
	if w.pick(2) == 0 {
		h.Tags = []string{"docker"}
	}
	if w.pick(6) == 0 {
		h.Scaler = true
		w.scaler[id] = true
	}
	if w.pick(6) == 0 {
		h.MaxDelay = 0
	}
	in.Msg = h
	w.workers = append(w.workers, id)
	w.step(in)
}

func (w *world) reconnectRandom() {
	var cands []core.WorkerID
	for _, id := range w.workers {
		if _, on := w.conn[id]; !on && !w.gone[id] && w.creds[id] != "" {
			cands = append(cands, id)
		}
	}
	if len(cands) == 0 {
		return
	}
	id := cands[w.pick(len(cands))]
	in := w.hello(id, 1)
	h := in.Msg.(core.Hello)
	h.Credential = w.creds[id]
	for _, l := range w.heldLeases(id) {
		h.InFlight = append(h.InFlight, core.LeaseRef{Step: w.leases[l].Step, Lease: l})
	}
	in.Msg = h
	rd := w.step(in)
	for _, e := range rd.Messages {
		if ref, ok := e.Msg.(core.Refused); ok && ref.Fatal {
			w.gone[id] = true
			for _, l := range w.heldLeases(id) {
				w.drop(id, l)
			}
		}
	}
}

func (w *world) disconnectRandom() {
	ws := w.connected()
	if len(ws) == 0 {
		return
	}
	id := ws[w.pick(len(ws))]
	w.disconnect(id)
	if w.scaler[id] {
		w.gone[id] = true
		for _, l := range w.heldLeases(id) {
			w.drop(id, l)
		}
	}
}

func (w *world) submitRandom() {
	n := 1 + w.pick(4)
	var steps []core.StepSpec
	for i := 0; i < n; i++ {
		s := core.StepSpec{Name: fmt.Sprintf("s%d", i), Command: "x", Writes: w.pick(2) == 0}
		for j := 0; j < i; j++ {
			if w.pick(3) == 0 {
				s.DependsOn = append(s.DependsOn, fmt.Sprintf("s%d", j))
			}
		}
		switch w.pick(10) {
		case 0:
			s.Type = "docker"
		case 1:
			s.ForEach, s.Concurrency = []string{"a", "b", "c"}, 1+w.pick(2)
		case 2:
			s.Hold = true
		case 3:
			s.Wait = 20 * time.Second
		case 4:
			s.Timeout = 90 * time.Second
		case 5:
			s.Type = "task"
		}
		steps = append(steps, s)
	}
	w.runs = append(w.runs, w.submit(steps...))
}

// workerActs has a connected worker do something with one of its leases.
func (w *world) workerActs() {
	ws := w.connected()
	if len(ws) == 0 {
		return
	}
	id := ws[w.pick(len(ws))]
	if old := w.answered[id]; len(old) > 0 && w.pick(8) == 0 {
		w.step(w.msg(id, old[w.pick(len(old))])) // the network delivers a report twice
		return
	}
	ls := w.heldLeases(id)
	if len(ls) == 0 {
		w.step(w.msg(id, core.Heartbeat{}))
		return
	}
	l := ls[w.pick(len(ls))]
	d := w.leases[l]
	switch k := w.pick(10); {
	case k < 1:
		w.step(w.msg(id, core.Refresh{Request: w.nextReq()}))
	case k < 2 && !w.started[l] && !w.startReq[l]:
		w.step(w.msg(id, core.RejectDispatch{Lease: l, Reason: "busy"}))
		w.drop(id, l)
	case k < 3 && w.pick(3) == 0 && d.Writes && !w.started[l]:
		// A buggy worker reports a write-bearing step it never started.
		rep := core.Report{Step: d.Step, Lease: l, Request: w.nextReq(), Outcome: core.Outcome{Status: core.OutcomeFailure, ExitCode: 1}}
		w.lastRep[l] = rep
		w.step(w.msg(id, rep))
	case !w.startReq[l] || (k < 4 && d.Writes && !w.started[l]):
		w.startReq[l] = true
		w.step(w.msg(id, core.Start{Lease: l, Request: w.nextReq()}))
	case k < 5 && w.lastRep[l].Request != 0:
		w.step(w.msg(id, w.lastRep[l])) // a retry of the same request
	case w.started[l]:
		st := []core.OutcomeStatus{core.OutcomeSuccess, core.OutcomeSuccess, core.OutcomeFailure}[w.pick(3)]
		if w.cancel[l] {
			st = []core.OutcomeStatus{core.OutcomeCancelled, core.OutcomeCleanupFailed}[w.pick(2)]
		}
		rep := core.Report{Step: d.Step, Lease: l, Request: w.nextReq(), Outcome: core.Outcome{Status: st, ExitCode: map[bool]int{true: 0, false: 2}[st == core.OutcomeSuccess]}}
		w.lastRep[l] = rep
		w.step(w.msg(id, rep))
	}
}

func (w *world) nextReq() uint64 { w.req++; return w.req }

// lossyCrash steps one input, shows the batch to the checker, and crashes
// before it is persisted: nothing of it left the process.
func (w *world) lossyCrash() {
	ws := w.connected()
	var in core.Input = core.Tick{}
	if len(ws) > 0 {
		id := ws[w.pick(len(ws))]
		if ls := w.heldLeases(id); len(ls) > 0 {
			l := ls[0]
			in = w.msg(id, core.Report{Step: w.leases[l].Step, Lease: l, Request: w.nextReq(), Outcome: core.Outcome{Status: core.OutcomeSuccess}})
		}
	}
	rd := w.produce(in)
	w.c.Batch(w.now, w.o, rd)
	if w.sendEarly {
		w.deliver(rd) // a faulty driver: messages leave before the records are durable
	}
	w.stats["lost batch"]++
	w.quiet()
	w.crash()
	w.quiet()
}

func (w *world) randomEvent() {
	switch k := w.pick(100); {
	case k < 14:
		w.advance(time.Duration(w.pick(40_000)) * time.Millisecond)
	case k < 18 && len(w.workers) < 5:
		w.enrollRandom()
	case k < 24:
		w.reconnectRandom()
	case k < 28:
		w.disconnectRandom()
	case k < 34 && len(w.runs) < 10:
		w.submitRandom()
	case k < 36 && len(w.runs) > 0:
		w.step(core.CancelRun{Call: w.nextCall(), Run: w.runs[w.pick(len(w.runs))]})
	case k < 38 && len(w.runs) > 0:
		r, _, _ := w.c.View(w.o).Run(w.runs[w.pick(len(w.runs))]) // an archived run too (SPEC §7a)
		w.step(core.Approve{Call: w.nextCall(), Step: r.Steps[w.pick(len(r.Steps))]})
	case k < 39 && w.pick(4) == 0 && len(w.workers) > 0:
		id := w.workers[w.pick(len(w.workers))]
		w.step(core.RevokeToken{Call: w.nextCall(), Name: "tok-" + string(id)})
		w.gone[id] = true
		w.stats["revoke"]++
	case k < 40 && w.pick(2) == 0:
		w.stats["crash"]++
		w.crash()
		w.quiet()
	case k < 41 && w.pick(2) == 0:
		w.lossyCrash()
	default:
		w.workerActs()
	}
}

// heal lets faults stop: workers come back, finish what they hold, gates
// open, time passes.
func (w *world) heal() {
	for round := 0; round < 60; round++ {
		for i := 0; i < 3; i++ {
			w.reconnectRandom()
		}
		for _, id := range w.connected() {
			for _, l := range w.heldLeases(id) {
				d := w.leases[l]
				if !w.startReq[l] || (d.Writes && !w.started[l]) {
					w.startReq[l] = true
					w.step(w.msg(id, core.Start{Lease: l, Request: w.nextReq()}))
				}
				if w.started[l] && w.held[id][l] {
					w.step(w.msg(id, core.Report{Step: d.Step, Lease: l, Request: w.nextReq(), Outcome: core.Outcome{Status: core.OutcomeSuccess}}))
				}
			}
			w.step(w.msg(id, core.Heartbeat{}))
			w.step(w.msg(id, core.Refresh{Request: w.nextReq()}))
		}
		for _, s := range w.o.Steps() {
			if s.State == core.StateHeld {
				w.step(core.Approve{Call: w.nextCall(), Step: s.ID})
			}
		}
		w.advance(20 * time.Second)
	}
}

func TestCheckerQuietOnRandomWorlds(t *testing.T) {
	seeds, events := 24, 1500
	if testing.Short() {
		seeds, events = 6, 800
	}
	var counts [numInv]uint64
	stats := map[string]int{}
	for seed := uint64(1); seed <= uint64(seeds); seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			w := newWorld(t, seed)
			w.c.Verify = seed%2 == 0
			for i := 0; i < events; i++ {
				w.randomEvent()
			}
			w.heal()
			if v := w.c.CheckLiveness(w.c.View(w.o)); v != nil {
				t.Fatalf("liveness after healing: %v", v)
			}
			for i := range counts {
				counts[i] += w.c.counts[i]
			}
			for k, v := range w.stats {
				stats[k] += v
			}
			finished := 0
			v := w.c.View(w.o)
			for _, id := range v.RunIDs() {
				r, st, _ := v.Run(id)
				if r.Finished {
					finished++
					stats["run "+st]++
				}
			}
		})
	}
	t.Logf("worlds: %v", stats)
	for _, k := range []string{"answer COMMITTED", "answer CANCELLED", "answer REJECTED", "write-bearing process", "lost batch", "crash", "revoke", "run success", "run failed", "run cancelled"} {
		if stats[k] == 0 {
			t.Errorf("the worlds never saw a %s", k)
		}
	}
	for i, n := range counts {
		t.Logf("%s: %d evaluations", invNames[i], n)
		if n < 100 {
			t.Errorf("%s was evaluated only %d times: the worlds are too tame", invNames[i], n)
		}
	}
}

// caught carries a violation out of a mutant world's event loop.
type caught struct{ v *Violation }

// runMutant runs random worlds with a planted fault until the checker
// catches it, and returns the first violation.
func runMutant(t *testing.T, plant func(*world)) *Violation {
	t.Helper()
	for seed := uint64(1); seed <= 20; seed++ {
		w := newWorld(t, seed)
		w.stop = func(v *Violation) { panic(caught{v}) }
		plant(w)
		v := func() (v *Violation) {
			defer func() {
				if r := recover(); r != nil {
					c, ok := r.(caught)
					if !ok {
						panic(r)
					}
					v = c.v
				}
			}()
			for i := 0; i < 2000; i++ {
				w.randomEvent()
			}
			return nil
		}()
		if v != nil {
			t.Logf("seed %d: %v", seed, v)
			return v
		}
	}
	t.Fatal("the planted fault was never caught")
	return nil
}

func TestMutantWorldsAreCaught(t *testing.T) {
	cases := []struct {
		name  string
		want  string
		plant func(*world)
	}{
		{"store forgets that leases ended", "NoStaleCommit", func(w *world) {
			w.keep = func(r core.Record) bool {
				_, isLease := leaseKeyID(r.Key)
				return !isLease || r.Delete || strings.Contains(string(r.Value), `"Current":true`)
			}
		}},
		{"store forgets committed outcomes", "AtMostOneCommit", func(w *world) {
			w.keep = func(r core.Record) bool {
				_, stored := w.disk[r.Key]
				return !stored || !strings.HasPrefix(r.Key, "step/") || !strings.Contains(string(r.Value), `"Outcome"`)
			}
		}},
		{"worker skips the start handshake", "WriteStepRunsOnce", func(w *world) {
			inner := w.onDeliver
			w.onDeliver = func(id core.WorkerID, m core.Msg) {
				if d, ok := m.(core.Dispatch); ok && d.Writes {
					w.started[d.Lease] = true
					w.c.ProcessStarted(w.now, id, d.Lease, d.Step, true)
				}
				inner(id, m)
			}
		}},
		{"driver sends before persisting", "AtMostOneCommit", func(w *world) {
			w.sendEarly = true
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if v := runMutant(t, tc.plant); v.Invariant != tc.want {
				t.Fatalf("caught by %s, want %s: %v", v.Invariant, tc.want, v)
			}
		})
	}
}
