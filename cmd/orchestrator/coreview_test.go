package main

import (
	"context"
	"sort"
	"strings"

	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/adapters/store"
	"github.com/tether-run/tether/core"
)

// coreView is what the tests read of an in-process orchestrator: the
// core's live state, and the store's history for the runs that left the
// core when they finished (SPEC §7a). Its run, step, event, lease and log
// queries answer as the core's did before archival; the rest are the
// core's.
type coreView struct {
	*core.Orchestrator
	h orchestrator.HistoryStore
}

// coreViewer takes snapshots as coreViews.
type coreViewer struct{ d *orchestrator.Driver }

func (v coreViewer) Snapshot(ctx context.Context, f func(o coreView)) error {
	return v.d.Snapshot(ctx, func(o *core.Orchestrator) { f(coreView{o, v.d.History()}) })
}

func (v coreView) history(id core.RunID) (core.RunHistory, bool) {
	if v.h == nil {
		return core.RunHistory{}, false
	}
	h, err := v.h.History(id)
	return h, err == nil
}

func (v coreView) Run(id core.RunID) (core.RunRecord, string, bool) {
	if r, st, ok := v.Orchestrator.Run(id); ok {
		return r, st, ok
	}
	h, ok := v.history(id)
	return h.Run, h.Status, ok
}

func (v coreView) StepByID(id core.StepID) (core.StepRecord, bool) {
	if s, ok := v.Orchestrator.StepByID(id); ok {
		return s, ok
	}
	run, _, _ := strings.Cut(string(id), "/")
	h, _ := v.history(core.RunID(run))
	return h.Step(id)
}

func (v coreView) Events(run core.RunID) []core.ServerEvent {
	if _, _, ok := v.Orchestrator.Run(run); ok {
		return v.Orchestrator.Events(run)
	}
	h, _ := v.history(run)
	return h.Events
}

// archived is every archived run's history.
func (v coreView) archived() []core.RunHistory {
	var out []core.RunHistory
	if v.h == nil {
		return nil
	}
	for cursor := uint64(0); ; {
		runs, next, err := v.h.ListRuns(store.RunFilter{}, cursor, 1000)
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

func (v coreView) Steps() []core.StepRecord {
	out := v.Orchestrator.Steps()
	for _, h := range v.archived() {
		out = append(out, h.Steps...)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func (v coreView) Leases() []core.LeaseRecord {
	out := v.Orchestrator.Leases()
	for _, h := range v.archived() {
		out = append(out, h.Leases...)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func (v coreView) StepLogs(step core.StepID) []core.StepLogLine {
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
		page, next, err := v.h.HistoryLogs(leases, after, 0)
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
