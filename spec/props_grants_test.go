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
// credentials slide, lapse while a worker is away, and close sessions (SPEC
// §7, §9).
func grantsCredScope() Scope {
	sc := DefaultScope()
	sc.Name = "grants-credential"
	sc.Workers = 1
	sc.Steps = []core.StepSpec{{Name: "a", Command: "read a"}}
	sc.Config.CredentialTTL = 10 * time.Second
	sc.MaxDepth = 14
	sc.Horizon = 30 * time.Second
	sc.MaxOrchCrashes = 0
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
