package spec

import (
	"slices"
	"sort"

	"github.com/tether-run/tether/core"
)

// Row is one row of the step transition table of SPEC §1.
type Row struct {
	From  core.State
	Event core.Event
	To    core.State
}

// Table is SPEC §1's transition table, written out again here so that the
// checkers hold the core to the specification rather than to its own
// core.Transitions (a test keeps this copy, SPEC.md's table and the core's
// in agreement).
var Table = []Row{
	{core.StatePending, core.EvEnqueue, core.StateQueued},
	{core.StatePending, core.EvCancel, core.StateCancelled},
	{core.StatePending, core.EvSkip, core.StateSkipped},
	{core.StatePending, core.EvHold, core.StateHeld},
	{core.StatePending, core.EvWait, core.StateWaiting},
	{core.StateQueued, core.EvStart, core.StateRunning},
	{core.StateQueued, core.EvFail, core.StateFailed},
	{core.StateQueued, core.EvCancel, core.StateCancelled},
	{core.StateRunning, core.EvSucceed, core.StateSuccess},
	{core.StateRunning, core.EvFail, core.StateFailed},
	{core.StateRunning, core.EvCancel, core.StateCancelled},
	{core.StateRunning, core.EvCancelGraceful, core.StateCancelling},
	{core.StateRunning, core.EvRecover, core.StateRecovering},
	{core.StateRecovering, core.EvStart, core.StateRunning},
	{core.StateRecovering, core.EvFail, core.StateFailed},
	{core.StateRecovering, core.EvCancel, core.StateCancelled},
	{core.StateRecovering, core.EvRequeue, core.StateQueued},
	{core.StateCancelling, core.EvCancelForce, core.StateCancelled},
	{core.StateCancelling, core.EvComplete, core.StateCancelled},
	{core.StateCancelling, core.EvFail, core.StateFailed},
	{core.StateHeld, core.EvApprove, core.StateQueued},
	{core.StateHeld, core.EvReject, core.StateCancelled},
	{core.StateHeld, core.EvExpire, core.StateCancelled},
	{core.StateHeld, core.EvCancel, core.StateCancelled},
	{core.StateWaiting, core.EvTimerDone, core.StateQueued},
	{core.StateWaiting, core.EvCancel, core.StateCancelled},
	{core.StateRunning, core.EvRetry, core.StateWaiting},
	{core.StatePending, core.EvReuse, core.StateSuccess},
}

type rowKey struct {
	from  core.State
	event core.Event
}

var tableIndex = func() map[rowKey]core.State {
	m := make(map[rowKey]core.State, len(Table))
	for _, r := range Table {
		m[rowKey{r.From, r.Event}] = r.To
	}
	return m
}()

// InTable reports whether from --event--> to is a row of Table.
func InTable(from core.State, event core.Event, to core.State) bool {
	t, ok := tableIndex[rowKey{from, event}]
	return ok && t == to
}

// Terminal reports whether a step state is terminal (SPEC §1: success,
// failed, cancelled, skipped), by the specification's list.
func Terminal(s core.State) bool {
	switch s {
	case core.StateSuccess, core.StateFailed, core.StateCancelled, core.StateSkipped:
		return true
	}
	return false
}

// SpecRequiredTags derives the worker tags a step needs from its type and
// runner plus its explicit tags (SPEC §8), sorted and
// deduplicated; ok is false for a type or runner the table does not know.
// Task steps need none: they never leave the orchestrator.
func SpecRequiredTags(sp core.StepSpec) (tags []string, ok bool) {
	switch sp.Type {
	case "":
		if sp.Runner != "" {
			return nil, false
		}
	case "task":
		return nil, true
	case "script":
		switch sp.Runner {
		case "", "local":
			tags = []string{"script"}
		case "docker":
			tags = []string{"script", "docker"}
		case "pod":
			tags = []string{"script", "kubernetes"}
		default:
			return nil, false
		}
	case "docker", "pod":
		if sp.Runner != "" {
			return nil, false
		}
		tags = []string{map[string]string{"docker": "docker", "pod": "kubernetes"}[sp.Type]}
	default:
		return nil, false
	}
	tags = append(tags, sp.Tags...)
	sort.Strings(tags)
	return slices.Compact(tags), true
}

// WorkerTraits are the parts of a worker that matching looks at.
type WorkerTraits struct {
	Name     string
	Tags     []string
	Labels   map[string]string
	Platform string
}

// Matches is SPEC §8's matching predicate: target (the worker's name), then
// labels (the worker carries every pair), then platform, then required tags
// ⊆ worker tags. It says why not when it does not match.
func Matches(sp core.StepSpec, required []string, w WorkerTraits) (bool, string) {
	if sp.Target != "" && sp.Target != w.Name {
		return false, "target " + sp.Target + " is not the worker's name " + w.Name
	}
	for k, v := range sp.Labels {
		if got, ok := w.Labels[k]; !ok || got != v {
			return false, "the worker does not carry label " + k + "=" + v
		}
	}
	if sp.Platform != "" && sp.Platform != w.Platform {
		return false, "platform " + sp.Platform + " is not the worker's " + w.Platform
	}
	for _, t := range required {
		if !slices.Contains(w.Tags, t) {
			return false, "the worker lacks required tag " + t
		}
	}
	return true, ""
}
