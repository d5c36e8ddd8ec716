package spec

import "github.com/tether-run/tether/core"

// PlantedBug is a bug planted in the orchestrator's driver: Mutate doctors
// every batch the orchestrator produces, and the explorer (Scope.Mutate) and
// the simulator (sim.RunScript) must each catch it as a violation of one of
// Invariants. Tests only: a planted bug proves the checks can fail.
type PlantedBug struct {
	Name       string
	Invariants []string // the invariants that may report it
	Mutate     func(rd *core.Ready)
}

// Plant returns sc with the bug planted (Mutate and Planted set, the name
// suffixed with the bug's).
func (p PlantedBug) Plant(sc Scope) Scope {
	sc.Name += "+" + p.Name
	sc.Mutate, sc.Planted = p.Mutate, p.Name
	return sc
}

// PlantedBugs are the bugs the explorer's tests plant; the default scope
// catches each within 8 actions.
var PlantedBugs = []PlantedBug{
	{
		// A report on a lease that lost its authority is answered COMMITTED
		// (SPEC §3 says CANCELLED).
		Name:       "stale-report-committed",
		Invariants: []string{"AtMostOneCommit", "NoStaleCommit", "CancelledNeverCommitted"},
		Mutate: func(rd *core.Ready) {
			for i, e := range rd.Messages {
				if a, ok := e.Msg.(core.Answer); ok && a.Verdict == core.Cancelled {
					a.Verdict = core.Committed
					rd.Messages[i].Msg = a
				}
			}
		},
	},
	{
		// The dispatch of a write-bearing step says it writes nothing: the
		// worker starts it without the start handshake (sim/mutants/13).
		Name:       "no-start-handshake",
		Invariants: []string{"WriteStepRunsOnce"},
		Mutate: func(rd *core.Ready) {
			for i, e := range rd.Messages {
				if d, ok := e.Msg.(core.Dispatch); ok && d.Writes {
					d.Writes = false
					rd.Messages[i].Msg = d
				}
			}
		},
	},
}

// PlantedBugByName finds a PlantedBugs entry.
func PlantedBugByName(name string) (PlantedBug, bool) {
	for _, p := range PlantedBugs {
		if p.Name == name {
			return p, true
		}
	}
	return PlantedBug{}, false
}
