package spec

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/tether-run/tether/core"
)

// Three properties over the grants and the sessions a world sees leave the
// orchestrator, batch by batch. They are judged from what the batches say
// (Dispatch messages, Welcomes, Refresheds, refusals and closes with their
// typed causes) and from what the world knows (the tags a worker declared
// in its Hello), not from the orchestrator's own bookkeeping, which is what
// they check. The simulator and the explorer both run them with this code
// (Grants), after every orchestrator batch.
const (
	// PropGrantsWithinCap: a step is granted at most the attempt cap's
	// leases (Config.MaxAttempts, SPEC §3, §4: "a grant counts toward the
	// step's attempts"; "a requeue that would need a 6th grant fails the
	// step instead"), counting every Dispatch with a new lease the world
	// saw for it; and a step failed with class attempts-exhausted was
	// granted exactly the cap's leases (SPEC §1: queued/recovering --FAIL-->
	// failed when attempts are exhausted), no fewer.
	PropGrantsWithinCap = "GrantsWithinCap"
	// PropCredentialWindow: a session credential is valid until its TTL has
	// passed since it last slid (SPEC §7, §9): since the Welcome that issued
	// it, the last Refreshed answering a refresh, or the orchestrator
	// restart that extended it (a restart makes the credentials of workers
	// still in the pool valid for at least a TTL from then). Before that
	// instant a Hello presenting it is never refused, nor its session
	// closed, for expiry (cause credential-expired); from that instant on
	// (for every slide the world may not have seen: a restart extends
	// every worker's at most) it is always refused: a Welcome to a Hello
	// presenting it is a violation; and a session still open then is
	// closed (SPEC §9): a batch made after that instant that sends the
	// worker anything but closes no session of its for expiry is a
	// violation (the orchestrator served a session whose credential had
	// expired).
	PropCredentialWindow = "CredentialWindow"
	// PropGrantsHoldAllTags: every grant goes to a worker holding ALL of the
	// step's required tags (SPEC §8: required tags ⊆ worker tags; the
	// required tags derived by the spec's own table), judged by the tags
	// the worker declared in its Hello as the world saw it.
	PropGrantsHoldAllTags = "GrantsHoldAllTags"
	// PropRetriesWithinPolicy: a step with `retry: {attempts: N}` runs at
	// most 1+N tries (SPEC §1 RETRY): the distinct leases whose try ended
	// in RETRY — the step's latest grant when the transition is seen — are
	// at most N, and a step without a policy is never retried. The cap of
	// GrantsWithinCap then applies per try (SPEC §3: the budget is per
	// try), the try of a grant being the step's as its batch left it.
	PropRetriesWithinPolicy = "RetriesWithinPolicy"
)

// GrantView is what a world tells Grants.Check about one batch besides the
// batch itself.
type GrantView struct {
	O   View      // the orchestrator as the batch left it, with the archive (its spec, its config)
	Now time.Time // when the batch was made
	// Restored says the batch is a Restore's (SPEC §7): the credentials of
	// the workers still in the pool slide to now + TTL, and grants of
	// batches a crash took back (never persisted, so never sent) are
	// forgotten.
	Restored bool
	// LostBatches says a crash may take back batches that were stepped but
	// not yet synced (the simulator's world; the explorer's persistence is
	// atomic with the step): a refresh answered in such a batch was never
	// answered, so at a restart a worker not in the pool keeps only the
	// expiry the restored orchestrator knows.
	LostBatches bool
	// WorkerOf names the worker at the other end of a connection (empty if
	// the world does not know it).
	WorkerOf func(core.ConnID) core.WorkerID
	// TagsOf gives the tags worker w declared in its Hello, as the world
	// saw it; false if the world does not know them.
	TagsOf func(w core.WorkerID) ([]string, bool)
}

// credWindow is what the world knows of one worker's session credential:
// valid surely before lo; surely expired from hi on.
type credWindow struct{ lo, hi time.Time }

// Grants tracks the properties' state across batches: the leases granted
// per step and each worker's credential window and declared tags. A world
// that branches (the explorer) clones it before a batch that changes it
// (Touches).
type Grants struct {
	leases map[core.StepID][]core.LeaseID // by tryKey: the grants of one try
	creds  map[core.WorkerID]credWindow
	tags   map[core.WorkerID][]string
	// last is each step's latest grant; retried the leases whose try
	// ended in RETRY, per step (PropRetriesWithinPolicy).
	last    map[core.StepID]core.LeaseID
	retried map[core.StepID][]core.LeaseID
}

// NewGrants returns an empty tracker.
func NewGrants() *Grants {
	return &Grants{leases: map[core.StepID][]core.LeaseID{}, creds: map[core.WorkerID]credWindow{}, tags: map[core.WorkerID][]string{},
		last: map[core.StepID]core.LeaseID{}, retried: map[core.StepID][]core.LeaseID{}}
}

// Clone returns an independent copy.
func (g *Grants) Clone() *Grants {
	n := &Grants{leases: make(map[core.StepID][]core.LeaseID, len(g.leases)), creds: maps.Clone(g.creds), tags: maps.Clone(g.tags)}
	for k, v := range g.leases {
		n.leases[k] = slices.Clone(v)
	}
	n.last = maps.Clone(g.last)
	n.retried = make(map[core.StepID][]core.LeaseID, len(g.retried))
	for k, v := range g.retried {
		n.retried[k] = slices.Clone(v)
	}
	return n
}

// Touches says whether Check may change the tracker for batch rd (it
// checks every batch, and changes it only for these).
func (g *Grants) Touches(rd core.Ready, restored bool) bool {
	if restored {
		return true
	}
	for _, e := range rd.Messages {
		switch e.Msg.(type) {
		case core.Dispatch, core.Welcome, core.Refreshed:
			return true
		}
	}
	for _, t := range rd.Transitions {
		if t.Event == core.EvRetry {
			return true
		}
	}
	return false
}

// Check checks batch rd against the three properties and learns from it.
func (g *Grants) Check(rd core.Ready, v GrantView) *Violation {
	cfg := v.O.Config()
	if v.Restored {
		g.restored(v, cfg.CredentialTTL)
	}
	// Sessions: refusals and closes for expiry first (a batch that refuses
	// a Hello does not also slide its credential), then what slides.
	closedExpired := map[core.WorkerID]bool{}
	for _, e := range rd.Messages {
		var cause core.Cause
		what := ""
		switch m := e.Msg.(type) {
		case core.Refused:
			cause, what = m.Cause, "a hello presenting it was refused"
		case core.Close:
			cause, what = m.Cause, "its session was closed"
		}
		if cause != core.CauseCredentialExpired {
			continue
		}
		w := v.WorkerOf(e.Conn)
		closedExpired[w] = true
		if cw, ok := g.creds[w]; ok && v.Now.Before(cw.lo) {
			return &Violation{Invariant: PropCredentialWindow, Detail: fmt.Sprintf(
				"worker %s's credential was judged expired (%s) at %s, %s before its TTL passed since it last slid (valid until %s)",
				w, what, v.Now.Format(time.RFC3339Nano), cw.lo.Sub(v.Now), cw.lo.Format(time.RFC3339Nano))}
		}
	}
	for _, e := range rd.Messages {
		switch m := e.Msg.(type) {
		case core.Welcome:
			if m.Credential != "" { // enrollment: a new credential
				g.creds[m.Worker] = credWindow{lo: v.Now.Add(m.CredentialTTL), hi: v.Now.Add(m.CredentialTTL)}
				if v.TagsOf != nil {
					if t, ok := v.TagsOf(m.Worker); ok {
						g.tags[m.Worker] = slices.Clone(t)
					}
				}
				continue
			}
			// A reconnect Hello presented the credential and was welcomed.
			if cw, ok := g.creds[m.Worker]; ok && !v.Now.Before(cw.hi) {
				return &Violation{Invariant: PropCredentialWindow, Detail: fmt.Sprintf(
					"worker %s was welcomed back at %s presenting a credential that expired at %s (%s earlier): its TTL had passed since it last slid",
					m.Worker, v.Now.Format(time.RFC3339Nano), cw.hi.Format(time.RFC3339Nano), v.Now.Sub(cw.hi))}
			}
		case core.Refused, core.Close:
		default:
			// Anything else serves the session: its credential must not
			// have expired, unless this batch closes it for that.
			w := v.WorkerOf(e.Conn)
			if cw, ok := g.creds[w]; ok && w != "" && v.Now.After(cw.hi) && !closedExpired[w] {
				return &Violation{Invariant: PropCredentialWindow, Detail: fmt.Sprintf(
					"worker %s's session was sent a %s at %s, %s after its credential expired (%s) since it last slid, and not closed",
					w, e.Msg.Kind(), v.Now.Format(time.RFC3339Nano), v.Now.Sub(cw.hi), cw.hi.Format(time.RFC3339Nano))}
			}
			if m, ok := e.Msg.(core.Refreshed); ok && w != "" {
				at := v.Now.Add(m.TTL)
				g.creds[w] = credWindow{lo: at, hi: at}
			}
		}
	}
	// Retries: judged before this batch's grants, so that a step's latest
	// grant is the lease of the try that ended.
	for _, t := range rd.Transitions {
		if t.Event != core.EvRetry {
			continue
		}
		l := g.last[t.Step]
		if l != 0 && !slices.Contains(g.retried[t.Step], l) {
			g.retried[t.Step] = append(g.retried[t.Step], l)
		}
		sp, _ := v.O.StepSpecOf(t.Step)
		if sp.Retry == nil || len(g.retried[t.Step]) > sp.Retry.Attempts {
			n := 0
			if sp.Retry != nil {
				n = sp.Retry.Attempts
			}
			return &Violation{Invariant: PropRetriesWithinPolicy, Detail: fmt.Sprintf(
				"step %s was retried after the tries of leases %v; its policy allows %d retries", t.Step, g.retried[t.Step], n)}
		}
	}
	// Grants.
	for _, e := range rd.Messages {
		m, ok := e.Msg.(core.Dispatch)
		if !ok {
			continue
		}
		key := m.Step
		if st, ok := v.O.StepByID(m.Step); ok {
			key = tryKey(m.Step, st.Tries)
		}
		ls := g.leases[key]
		if slices.Contains(ls, m.Lease) {
			continue // the same grant sent again (a Welcome's re-send), not a new lease
		}
		ls = append(ls, m.Lease)
		g.leases[key] = ls
		g.last[m.Step] = m.Lease
		if len(ls) > cfg.MaxAttempts {
			return &Violation{Invariant: PropGrantsWithinCap, Detail: fmt.Sprintf(
				"step %s was granted %d leases %v; the attempt cap is %d", m.Step, len(ls), ls, cfg.MaxAttempts)}
		}
		w := v.WorkerOf(e.Conn)
		held, known := g.tags[w]
		if !known {
			continue
		}
		sp, ok := v.O.StepSpecOf(m.Step)
		if !ok {
			continue
		}
		req, ok := SpecRequiredTags(sp)
		if !ok {
			continue
		}
		for _, t := range req {
			if !slices.Contains(held, t) {
				return &Violation{Invariant: PropGrantsHoldAllTags, Detail: fmt.Sprintf(
					"step %s (lease %d) was granted to worker %s, which declared tags %v in its hello, without the required tag %s (requires %v)",
					m.Step, m.Lease, w, held, t, req)}
			}
		}
	}
	for _, t := range rd.Transitions {
		if t.To != core.StateFailed {
			continue
		}
		st, ok := v.O.StepByID(t.Step)
		if !ok || st.Class != core.ClassAttemptsExhausted {
			continue
		}
		key := tryKey(t.Step, st.Tries)
		if n := len(g.leases[key]); n != cfg.MaxAttempts {
			return &Violation{Invariant: PropGrantsWithinCap, Detail: fmt.Sprintf(
				"step %s failed %s after %d grants %v; the attempt cap is %d", t.Step, st.Class, n, g.leases[key], cfg.MaxAttempts)}
		}
	}
	return nil
}

// restored applies a Restore (SPEC §7) to the tracker.
func (g *Grants) restored(v GrantView, ttl time.Duration) {
	// A lease the orchestrator holds, live or archived (the set View.Leases
	// lists), looked up rather than copying every lease at each restore.
	known := func(l core.LeaseID) bool {
		if _, ok := v.O.Orchestrator.Lease(l); ok {
			return true
		}
		_, ok := v.O.A.Lease(l)
		return ok
	}
	for id, ls := range g.leases { // each step's list on its own: the order is immaterial
		g.leases[id] = slices.DeleteFunc(ls, func(l core.LeaseID) bool { return !known(l) })
	}
	for id, l := range g.last {
		if !known(l) {
			delete(g.last, id) // a grant the crash took back
		}
	}
	pool := map[core.WorkerID]core.WorkerRecord{}
	for _, w := range v.O.Workers() {
		pool[w.ID] = w.WorkerRecord
	}
	at := v.Now.Add(ttl)
	for id, cw := range g.creds {
		r, ok := pool[id]
		switch {
		case ok && r.Active && !r.Revoked:
			if cw.lo.Before(at) {
				cw.lo = at
			}
		case v.LostBatches && (!ok || r.CredExpiry.Before(cw.lo)):
			// A slide in a batch the crash took back was never answered.
			cw.lo = r.CredExpiry
		}
		if cw.hi.Before(at) {
			cw.hi = at // every slide the world may not have seen ends by now + TTL
		}
		g.creds[id] = cw
	}
}

// checkGrants runs Grants over an explorer batch. A state's tracker is
// shared with its parent and siblings, so a batch that changes it changes a
// copy. The tracker is not part of the state hash: for a correct core its
// leases and windows follow from the machines' hashed state (the step's
// attempts, the worker's credential expiry, its recorded tags), so merging
// states that differ only in it hides no path the core can tell apart.
func (b *builder) checkGrants(rd core.Ready) {
	s := b.s
	restored := b.hits&sometimesBit(SomeOrchestratorRestored) != 0
	switch {
	case s.grants == nil:
		s.grants = NewGrants()
	case s.grants.Touches(rd, restored):
		s.grants = s.grants.Clone()
	}
	v := s.grants.Check(rd, GrantView{O: s.chk.View(s.o), Now: s.now, Restored: restored, WorkerOf: b.workerOfConn, TagsOf: b.declaredTags})
	if v != nil {
		b.fail(v.Invariant, "%s", v.Detail)
	}
}

// workerOfConn names the worker instance that opened a connection.
func (b *builder) workerOfConn(id core.ConnID) core.WorkerID {
	if c := b.conn(id); c != nil {
		if c.owner != "" {
			return c.owner
		}
		return b.s.ws[c.w].id
	}
	return ""
}

// declaredTags gives the tags worker id declares in its Hellos: its
// configuration's, which the worker machine sends as they are.
func (b *builder) declaredTags(id core.WorkerID) ([]string, bool) {
	for _, w := range b.s.ws {
		if w.id == id && w.m != nil {
			return w.m.Config().Tags, true
		}
	}
	return nil, false
}
