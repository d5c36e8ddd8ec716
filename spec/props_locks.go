package spec

import (
	"fmt"
	"sort"
	"time"

	"github.com/tether-run/tether/core"
)

// CheckGroupCaps is GroupCapHeld (SPEC §8a): no run group has more
// admitted members than its max, no step group more steps holding a
// lease. A member counts as admitted when one of its steps has left
// pending — the core's own GroupWait flag is not trusted: a waiting
// run's steps are all pending, an admitted run's roots never are. A
// rerun's reused steps (REUSE, SPEC §2) do not count: they are created
// succeeded in the submitting batch, whether the run waits or not, and
// run nothing.
func CheckGroupCaps(o *core.Orchestrator) *Violation {
	active, limit := map[string][]core.RunID{}, map[string]int{}
	for _, id := range o.GroupRunIDs() { // RunIDs less runs naming no group: skipped below
		r, _, _ := o.Run(id)
		g := r.Spec.Group
		if g.Name == "" || r.Finished {
			continue
		}
		limit[g.Name] = max(limit[g.Name], g.Max, 1)
		for _, sid := range r.Steps {
			if s, ok := o.StepByID(sid); ok && s.State != core.StatePending && s.ReusedFrom == "" {
				active[g.Name] = append(active[g.Name], id)
				break
			}
		}
	}
	for _, g := range sortedNames(active) {
		if n := len(active[g]); n > limit[g] {
			return &Violation{"GroupCapHeld", fmt.Sprintf("run group %s has %d admitted members %v, max %d", g, n, active[g], limit[g])}
		}
	}
	held, slimit := map[string][]core.StepID{}, map[string]int{}
	for _, id := range o.StepIDsLeased() {
		if sp, ok := o.StepSpecOf(id); ok && sp.Group.Name != "" {
			held[sp.Group.Name] = append(held[sp.Group.Name], id)
			slimit[sp.Group.Name] = max(slimit[sp.Group.Name], sp.Group.Max, 1)
		}
	}
	for _, g := range sortedNames(held) {
		if n := len(held[g]); n > slimit[g] {
			return &Violation{"GroupCapHeld", fmt.Sprintf("step group %s has %d steps holding a lease %v, max %d", g, n, held[g], slimit[g])}
		}
	}
	return nil
}

func sortedNames[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// ScheduleFires is ScheduleFiresOnce (SPEC §8a), over the durable
// records: each (schedule, fire time) is noted on one run at most, across
// restarts. Feed it every durable batch (Persisted).
type ScheduleFires struct {
	runs map[fireKey]core.RunID
}

type fireKey struct {
	schedule string
	at       int64
}

// NewScheduleFires starts with no fire seen.
func NewScheduleFires() *ScheduleFires { return &ScheduleFires{runs: map[fireKey]core.RunID{}} }

// Persisted checks the run records of one durable batch and returns the
// runs a schedule started in it (first seen), for the caller's history.
func (f *ScheduleFires) Persisted(rd core.Ready) ([]core.RunRecord, *Violation) {
	var started []core.RunRecord
	for _, rec := range rd.Records {
		if rec.Delete || len(rec.Key) < 4 || rec.Key[:4] != core.KindRun+"/" {
			continue
		}
		v, err := core.DecodeRecord(rec)
		if err != nil {
			continue
		}
		r := v.(*core.RunRecord)
		if r.Schedule == "" {
			continue
		}
		k := fireKey{r.Schedule, r.FireAt.UnixNano()}
		switch prev, ok := f.runs[k]; {
		case !ok:
			f.runs[k] = r.ID
			started = append(started, *r)
		case prev != r.ID:
			return started, &Violation{"ScheduleFiresOnce", fmt.Sprintf("schedule %s started %s and %s for one fire time %s",
				r.Schedule, prev, r.ID, r.FireAt.UTC().Format(time.RFC3339))}
		}
	}
	return started, nil
}

// scopeHasGroups says whether an explorer scope's run names a group, so
// that the other scopes pay nothing for GroupCapHeld.
func scopeHasGroups(sc Scope) bool {
	for _, s := range sc.Steps {
		if s.Group.Name != "" {
			return true
		}
	}
	return false
}

// stepGroupWaits says whether a queued step without a lease waits while
// another step of its step group holds one.
func stepGroupWaits(o *core.Orchestrator) bool {
	held, waiting := map[string]bool{}, map[string]bool{}
	for _, s := range o.Steps() {
		sp, ok := o.StepSpecOf(s.ID)
		if !ok || sp.Group.Name == "" {
			continue
		}
		if s.Lease != 0 {
			held[sp.Group.Name] = true
		} else if s.State == core.StateQueued {
			waiting[sp.Group.Name] = true
		}
	}
	for g := range waiting {
		if held[g] {
			return true
		}
	}
	return false
}
