// Package orchtest is what tests read of an in-process orchestrator: the
// core's live state merged with the store's history of the runs that left
// the core when they finished (SPEC §7a), so that a test's queries answer
// as the core's did before archival. Shared by the tests of
// adapters/orchestrator and cmd/orchestrator.
package orchtest

import (
	"context"
	"sort"
	"strings"

	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/adapters/store"
	"github.com/tether-run/tether/core"
)

// View is the core's live state and the store's history. Its
// run, step, event, lease and log queries answer as the core's did before
// archival; the rest are the core's.
type View struct {
	*core.Orchestrator
	H store.Histories
}

// Snapshot calls f with a View of d, on d's loop (Driver.Snapshot).
func Snapshot(ctx context.Context, d *orchestrator.Driver, f func(o View)) error {
	return d.Snapshot(ctx, func(o *core.Orchestrator) { f(View{o, d.History()}) })
}

func (v View) history(id core.RunID) (core.RunHistory, bool) {
	if v.H == nil {
		return core.RunHistory{}, false
	}
	h, err := v.H.History(id)
	return h, err == nil
}

func (v View) Run(id core.RunID) (core.RunRecord, string, bool) {
	if r, st, ok := v.Orchestrator.Run(id); ok {
		return r, st, ok
	}
	h, ok := v.history(id)
	return h.Run, h.Status, ok
}

func (v View) StepByID(id core.StepID) (core.StepRecord, bool) {
	if s, ok := v.Orchestrator.StepByID(id); ok {
		return s, ok
	}
	run, _, _ := strings.Cut(string(id), "/")
	h, _ := v.history(core.RunID(run))
	return h.Step(id)
}

func (v View) Events(run core.RunID) []core.ServerEvent {
	if _, _, ok := v.Orchestrator.Run(run); ok {
		return v.Orchestrator.Events(run)
	}
	h, _ := v.history(run)
	return h.Events
}

// Archived is every archived run's history.
func (v View) Archived() []core.RunHistory {
	var out []core.RunHistory
	if v.H == nil {
		return nil
	}
	for cursor := uint64(0); ; {
		runs, next, err := v.H.ListRuns(store.RunFilter{}, cursor, 1000)
		if err != nil {
			return out
		}
		for _, r := range runs {
			if h, ok := v.history(r.ID); ok {
				out = append(out, h)
			}
		}
		if next == 0 {
			return out
		}
		cursor = next
	}
}

func (v View) Steps() []core.StepRecord {
	out := v.Orchestrator.Steps()
	for _, h := range v.Archived() {
		out = append(out, h.Steps...)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func (v View) Leases() []core.LeaseRecord {
	out := v.Orchestrator.Leases()
	for _, h := range v.Archived() {
		out = append(out, h.Leases...)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func (v View) StepLogs(step core.StepID) []core.StepLogLine {
	if _, ok := v.Orchestrator.StepByID(step); ok {
		return v.Orchestrator.StepLogs(step)
	}
	run, _, _ := strings.Cut(string(step), "/")
	h, ok := v.history(core.RunID(run))
	if !ok {
		return nil
	}
	var leases []core.LeaseID
	for _, l := range h.Leases {
		if l.Step == step {
			leases = append(leases, l.ID)
		}
	}
	var out []core.StepLogLine
	for after := ""; len(leases) > 0; {
		page, next, err := v.H.HistoryLogs(leases, after, 0)
		if err != nil {
			return out
		}
		out = append(out, page...)
		if next == "" {
			break
		}
		after = next
	}
	return out
}
