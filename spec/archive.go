package spec

// Archival (SPEC §7a): a finished run leaves the core in the batch that made
// it archivable, as one history record. The core's queries then answer for
// live work only; what the checks read of finished runs comes from an
// Archive of the history records a driver saw in durable batches, merged
// with the live state by a View.

import (
	"hash/fnv"
	"maps"
	"slices"
	"sort"

	"github.com/tether-run/tether/core"
)

// Archive is the history records seen so far, by run. It is immutable: add
// returns a new Archive sharing nothing mutable with the old one, so that a
// checker's journal can take it back at a crash by keeping the old pointer,
// and an explorer state can share it with its copies. The nil Archive is
// empty.
type Archive struct {
	runs   map[core.RunID]*core.RunHistory
	steps  map[core.StepID]core.RunID
	leases map[core.LeaseID]core.RunID
	sum    uint64 // order-independent hash of the history records' bytes
}

// add returns the archive with one more history record.
func (a *Archive) add(h *core.RunHistory, value []byte) *Archive {
	n := &Archive{runs: map[core.RunID]*core.RunHistory{}, steps: map[core.StepID]core.RunID{},
		leases: map[core.LeaseID]core.RunID{}}
	if a != nil {
		n.runs, n.steps, n.leases, n.sum = maps.Clone(a.runs), maps.Clone(a.steps), maps.Clone(a.leases), a.sum
	}
	n.runs[h.Run.ID] = h
	for _, s := range h.Steps {
		n.steps[s.ID] = h.Run.ID
	}
	for _, l := range h.Leases {
		n.leases[l.ID] = h.Run.ID
	}
	f := fnv.New64a()
	f.Write(value)
	n.sum += f.Sum64()
	return n
}

// Len is the number of archived runs.
func (a *Archive) Len() int {
	if a == nil {
		return 0
	}
	return len(a.runs)
}

// Run returns run id's history record.
func (a *Archive) Run(id core.RunID) (*core.RunHistory, bool) {
	if a == nil {
		return nil, false
	}
	h, ok := a.runs[id]
	return h, ok
}

// RunIDs lists the archived runs, sorted.
func (a *Archive) RunIDs() []core.RunID {
	if a == nil {
		return nil
	}
	return slices.Sorted(maps.Keys(a.runs))
}

// Step returns an archived step.
func (a *Archive) Step(id core.StepID) (core.StepRecord, bool) {
	if a == nil {
		return core.StepRecord{}, false
	}
	run, ok := a.steps[id]
	if !ok {
		return core.StepRecord{}, false
	}
	return a.runs[run].Step(id)
}

// Lease returns an archived lease.
func (a *Archive) Lease(id core.LeaseID) (core.LeaseRecord, bool) {
	if a == nil {
		return core.LeaseRecord{}, false
	}
	run, ok := a.leases[id]
	if !ok {
		return core.LeaseRecord{}, false
	}
	for _, l := range a.runs[run].Leases {
		if l.ID == id {
			return l, true
		}
	}
	return core.LeaseRecord{}, false
}

// StepSpec returns the declaration an archived step was expanded from (its
// run's spec, by the step's name).
func (a *Archive) StepSpec(id core.StepID) (core.StepSpec, bool) {
	st, ok := a.Step(id)
	if !ok {
		return core.StepSpec{}, false
	}
	for _, sp := range a.runs[st.Run].Run.Spec.Steps {
		if sp.Name == st.Name {
			return sp, true
		}
	}
	return core.StepSpec{}, false
}

// View is the orchestrator's live state merged with an archive: its queries
// of runs, steps, leases and events answer as the core answered them before
// archival, finished runs included. Every other method is the core's.
type View struct {
	*core.Orchestrator
	A *Archive
}

// StepByID returns a live or archived step.
func (v View) StepByID(id core.StepID) (core.StepRecord, bool) {
	if s, ok := v.Orchestrator.StepByID(id); ok {
		return s, true
	}
	return v.A.Step(id)
}

// StepSpecOf returns a live or archived step's declaration.
func (v View) StepSpecOf(id core.StepID) (core.StepSpec, bool) {
	if sp, ok := v.Orchestrator.StepSpecOf(id); ok {
		return sp, true
	}
	return v.A.StepSpec(id)
}

// Steps returns every live and archived step, sorted by id.
func (v View) Steps() []core.StepRecord {
	out := v.Orchestrator.Steps()
	if v.A.Len() == 0 {
		return out
	}
	for _, id := range v.A.RunIDs() {
		out = append(out, v.A.runs[id].Steps...)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// StepsIn returns the live and archived steps in one of states, sorted by
// id: Steps filtered, without copying every step.
func (v View) StepsIn(states ...core.State) []core.StepRecord {
	var out []core.StepRecord
	for _, st := range states {
		for _, id := range v.Orchestrator.StepIDsIn(st) {
			s, _ := v.Orchestrator.StepByID(id)
			out = append(out, s)
		}
	}
	if v.A != nil {
		for _, h := range v.A.runs { // any order: sorted below
			for _, s := range h.Steps {
				if slices.Contains(states, s.State) {
					out = append(out, s)
				}
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// StepIDs returns the ids of Steps, in its order.
func (v View) StepIDs() []core.StepID {
	out := v.Orchestrator.StepIDs()
	if v.A.Len() == 0 {
		return out
	}
	for id := range v.A.steps {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// Leases returns every live and archived lease, sorted by id.
func (v View) Leases() []core.LeaseRecord {
	out := v.Orchestrator.Leases()
	if v.A.Len() == 0 {
		return out
	}
	for _, id := range v.A.RunIDs() {
		out = append(out, v.A.runs[id].Leases...)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Run returns a live or archived run and its derived status.
func (v View) Run(id core.RunID) (core.RunRecord, string, bool) {
	if r, st, ok := v.Orchestrator.Run(id); ok {
		return r, st, true
	}
	if h, ok := v.A.Run(id); ok {
		return h.Run, h.Status, true
	}
	return core.RunRecord{}, "", false
}

// RunIDs lists every live and archived run, in submission order (the
// core's order: submission time, then the shorter id).
func (v View) RunIDs() []core.RunID {
	ids := v.Orchestrator.RunIDs()
	if v.A.Len() == 0 {
		return ids
	}
	at := map[core.RunID]core.RunRecord{}
	for _, id := range ids {
		r, _, _ := v.Orchestrator.Run(id)
		at[id] = r
	}
	for _, id := range v.A.RunIDs() {
		if _, live := at[id]; !live {
			at[id] = v.A.runs[id].Run
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	sort.SliceStable(ids, func(i, j int) bool {
		a, b := at[ids[i]].SubmittedAt, at[ids[j]].SubmittedAt
		return a.Before(b) || (a.Equal(b) && len(ids[i]) < len(ids[j]))
	})
	return ids
}

// Events returns a live or archived run's server events in order.
func (v View) Events(run core.RunID) []core.ServerEvent {
	if h, ok := v.A.Run(run); ok {
		if _, _, live := v.Orchestrator.Run(run); !live {
			return slices.Clone(h.Events)
		}
	}
	return v.Orchestrator.Events(run)
}
