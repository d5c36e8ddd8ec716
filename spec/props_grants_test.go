package spec

import (
	"testing"
	"time"

	"github.com/tether-run/tether/core"
)

// Small scopes that reach the rules of props_grants.go, for the tests below
// (the named explorer scopes with short timers and tags reach them too).

// grantsTagsScope: every worker declares only "docker"; step a requires
// docker, step b docker and gpu, so b may never be granted (SPEC §8) and
// fails unmatched at the first sweep after the unmatched timeout (§5).
func grantsTagsScope() Scope {
	sc := DefaultScope()
	sc.Name = "grants-tags"
	sc.Steps = []core.StepSpec{
		{Name: "a", Command: "read a", Tags: []string{"docker"}},
		{Name: "b", Command: "read b", Tags: []string{"docker", "gpu"}},
	}
	sc.Worker.Tags = []string{"docker"}
	sc.MaxDepth = 8
	sc.Horizon = 70 * time.Second
	sc.MaxOrchCrashes = 0
	sc.MaxCancels = 0
	return sc
}

// grantsCapScope: an attempt cap of 2, so that two lost grants exhaust a
// step (SPEC §4: a requeue that would need a grant beyond the cap fails it).
func grantsCapScope() Scope {
	sc := DefaultScope()
	sc.Name = "grants-cap"
	sc.Steps = []core.StepSpec{{Name: "a", Command: "read a"}}
	sc.Config.MaxAttempts = 2
	sc.MaxDepth = 10
	sc.MaxDisconnects = 2
	sc.MaxCancels = 0
	return sc
}

// grantsCredScope: a credential TTL of 10 s within a 30 s horizon, so that
// credentials slide, lapse while a worker is away or the orchestrator is
// down, and close sessions (SPEC §7, §9).
func grantsCredScope() Scope {
	sc := DefaultScope()
	sc.Name = "grants-credential"
	sc.Workers = 1
	sc.Steps = []core.StepSpec{{Name: "a", Command: "read a"}}
	sc.Config.CredentialTTL = 10 * time.Second
	sc.MaxDepth = 14
	sc.Horizon = 30 * time.Second
	sc.MaxDisconnects = 1
	sc.MaxCancels = 0
	return sc
}

// TestGrantsExplore explores the three scopes on the real core: no grant
// beyond the cap, no grant to a worker without a required tag, no
// credential judged expired early or welcomed late.
func TestGrantsExplore(t *testing.T) {
	for _, sc := range []Scope{grantsTagsScope(), grantsCapScope(), grantsCredScope()} {
		t.Run(sc.Name, func(t *testing.T) {
			res := Explore(sc)
			report(t, sc, res)
		})
	}
}

// grantsRig is a Grants tracker fed hand-made batches: one worker w1 on
// connection 1, an orchestrator (no workers, no leases) holding a run with a
// step needing docker and gpu, a credential TTL of 10 minutes and a cap of 3.
type grantsRig struct {
	t   *testing.T
	g   *Grants
	o   *core.Orchestrator
	now time.Time
}

func newGrantsRig(t *testing.T) *grantsRig {
	o := core.NewOrchestrator(core.Config{CredentialTTL: 10 * time.Minute, MaxAttempts: 3})
	rd := o.Step(exploreT0, core.Submit{Call: 1, Spec: core.RunSpec{Name: "r", Steps: []core.StepSpec{{Name: "b", Command: "x", Tags: []string{"docker", "gpu"}}}}})
	if len(rd.Answers) != 1 || rd.Answers[0].Err != "" {
		t.Fatalf("submit: %+v", rd.Answers)
	}
	return &grantsRig{t: t, g: NewGrants(), o: o, now: exploreT0}
}

// batch checks a batch of msgs (all on connection 1) made at offset at.
func (r *grantsRig) batch(at time.Duration, restored bool, msgs ...core.Msg) *Violation {
	var rd core.Ready
	for _, m := range msgs {
		rd.Messages = append(rd.Messages, core.Envelope{Conn: 1, Msg: m})
	}
	return r.g.Check(rd, GrantView{O: View{Orchestrator: r.o}, Now: r.now.Add(at), Restored: restored, LostBatches: true,
		WorkerOf: func(core.ConnID) core.WorkerID { return "w1" },
		TagsOf:   func(core.WorkerID) ([]string, bool) { return []string{"docker"}, true }})
}

func (r *grantsRig) want(inv string, v *Violation) {
	r.t.Helper()
	switch {
	case inv == "" && v != nil:
		r.t.Fatalf("unexpected violation: %v", v)
	case inv != "" && (v == nil || v.Invariant != inv):
		r.t.Fatalf("want a %s violation, got %v", inv, v)
	}
}

func TestGrantsCredentialWindow(t *testing.T) {
	expired := core.Refused{Fatal: true, Cause: core.CauseCredentialExpired}
	closed := core.Close{Code: core.ClosePolicy, Cause: core.CauseCredentialExpired}
	enroll := core.Welcome{Worker: "w1", Credential: "w1.s", CredentialTTL: 10 * time.Minute}
	back := core.Welcome{Worker: "w1"}
	slid := core.Refreshed{Request: 1, TTL: 10 * time.Minute}

	r := newGrantsRig(t)
	r.want("", r.batch(0, false, enroll))
	r.want(PropCredentialWindow, r.batch(9*time.Minute, false, expired)) // before enrollment + TTL

	r = newGrantsRig(t)
	r.want("", r.batch(0, false, enroll))
	r.want("", r.batch(5*time.Minute, false, slid))
	r.want("", r.batch(14*time.Minute, false, back))                     // within refresh + TTL
	r.want(PropCredentialWindow, r.batch(12*time.Minute, false, closed)) // the refresh slid it to 15 min
	r.want(PropCredentialWindow, r.batch(15*time.Minute, false, back))   // TTL passed since the refresh

	// A restart extends a credential by a TTL from then at most: welcomed
	// back within it is fine, after it is not. The worker is not in the
	// restored pool and the crash may have taken its refresh back, so a
	// refusal after the durable expiry is not judged early.
	r = newGrantsRig(t)
	r.want("", r.batch(0, false, enroll))
	r.want("", r.batch(5*time.Minute, false, slid))
	r.want("", r.batch(8*time.Minute, true))
	r.want("", r.batch(11*time.Minute, false, expired))
	r.want("", r.batch(17*time.Minute, false, back))
	r.want(PropCredentialWindow, r.batch(18*time.Minute, false, back))

	// A refusal for another cause is none of the property's business.
	r = newGrantsRig(t)
	r.want("", r.batch(0, false, enroll))
	r.want("", r.batch(time.Minute, false, core.Refused{Fatal: true, Cause: core.CauseTokenRevoked}))
}

func TestGrantsWithinCapAndTags(t *testing.T) {
	r := newGrantsRig(t)
	d := func(l core.LeaseID) core.Dispatch { return core.Dispatch{Lease: l, Step: "run-1/nope"} }
	r.want("", r.batch(0, false, d(1), d(2)))
	r.want("", r.batch(time.Second, false, d(2), d(3))) // lease 2 sent again is not a new grant
	r.want(PropGrantsWithinCap, r.batch(2*time.Second, false, d(4)))

	// Grants of batches a crash took back are forgotten at the restart:
	// the restored orchestrator knows none of these leases.
	r = newGrantsRig(t)
	r.want("", r.batch(0, false, d(1), d(2), d(3)))
	r.want("", r.batch(time.Second, true))
	r.want("", r.batch(2*time.Second, false, d(1), d(2), d(3)))

	// w1 declared docker only; step b needs docker and gpu.
	r = newGrantsRig(t)
	r.want("", r.batch(0, false, core.Welcome{Worker: "w1", Credential: "w1.s", CredentialTTL: time.Minute}))
	r.want(PropGrantsHoldAllTags, r.batch(time.Second, false, core.Dispatch{Lease: 1, Step: "run-1/b"}))
}
