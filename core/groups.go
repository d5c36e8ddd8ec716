package core

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// ConcurrencyGroup names a concurrency group (SPEC §8a). On a run, at most
// Max runs of the group are admitted at once (the rest wait, in submit
// order); with CancelInProgress a new run cancels every older member. On a
// step, at most Max steps of the group hold a lease at once, across runs.
type ConcurrencyGroup struct {
	Name             string
	Max              int  `json:",omitzero"` // 0 means 1
	CancelInProgress bool `json:",omitzero"`
}

// MaxGroupSize bounds a group's Max (SPEC §12).
const MaxGroupSize = 10000

// limit is the group's effective Max.
func (g ConcurrencyGroup) limit() int { return max(g.Max, 1) }

// check validates a group declaration; run says it is a run's.
func (g ConcurrencyGroup) check(run bool) error {
	if g.Name == "" {
		if g != (ConcurrencyGroup{}) {
			return fmt.Errorf("concurrency group has max or cancel_in_progress but no group name")
		}
		return nil
	}
	if err := CheckName("concurrency group", g.Name); err != nil {
		return err
	}
	if g.Max < 0 || g.Max > MaxGroupSize {
		return fmt.Errorf("concurrency group %s: max %d is not in 0..%d (0 means 1)", Quote(g.Name), g.Max, MaxGroupSize)
	}
	if g.CancelInProgress && !run {
		return fmt.Errorf("concurrency group %s: cancel_in_progress applies only to a run's group (a step group queues)", Quote(g.Name))
	}
	return nil
}

// runSeq is the submit order of a run id ("run-<n>").
func runSeq(id RunID) uint64 {
	n, _ := strconv.ParseUint(strings.TrimPrefix(string(id), "run-"), 10, 64)
	return n
}

// indexHeld keeps a step group's set of steps holding a lease in step
// with s.
func (o *Orchestrator) indexHeld(s *StepRecord) {
	if s.Lease == 0 && len(o.groupHeld) == 0 {
		return // nothing to remove: no spec lookup on the hot path
	}
	sp := o.specOf[s.ID]
	if sp == nil || sp.Group.Name == "" {
		return
	}
	held := o.groupHeld[sp.Group.Name]
	if s.Lease != 0 {
		if held == nil {
			held = map[StepID]bool{}
			o.groupHeld[sp.Group.Name] = held
		}
		held[s.ID] = true
	} else if held != nil {
		delete(held, s.ID)
		if len(held) == 0 {
			delete(o.groupHeld, sp.Group.Name)
		}
	}
}

// indexGroups rebuilds the run groups' member lists after a load: the
// unfinished runs of each group in submit order, so that a restart keeps
// the waiting order.
func (o *Orchestrator) indexGroups() {
	var ids []RunID
	for id, r := range o.runs {
		if !r.Finished && r.Spec.Group.Name != "" {
			ids = append(ids, id)
		}
	}
	sort.Slice(ids, func(i, j int) bool { return runSeq(ids[i]) < runSeq(ids[j]) })
	for _, id := range ids {
		g := o.runs[id].Spec.Group.Name
		o.groupRuns[g] = append(o.groupRuns[g], id)
	}
}

// joinGroup adds a new run to its group (SPEC §8a), before its steps are
// first promoted: if it is not admitted now, it waits (GroupWait) and
// promote leaves its steps pending. With cancel_in_progress every older
// member is cancelled first (class concurrency); a member counts until it
// has finished, so a superseded run still cancelling keeps its place
// until its steps end.
func (o *Orchestrator) joinGroup(r *RunRecord) {
	g := r.Spec.Group
	if g.Name == "" {
		return
	}
	if g.CancelInProgress {
		o.noAdmit = g.Name // admit nobody while the older members go
		for _, id := range append([]RunID(nil), o.groupRuns[g.Name]...) {
			if m := o.runs[id]; m != nil && !m.Finished {
				o.cancelRun(m, ClassConcurrency, fmt.Sprintf("superseded by %s in concurrency group %s", r.ID, g.Name))
			}
		}
		o.noAdmit = ""
	}
	members := o.groupRuns[g.Name]
	active, waiting := 0, false
	for _, id := range members {
		if o.runs[id].GroupWait {
			waiting = true
		} else {
			active++
		}
	}
	o.groupRuns[g.Name] = append(members, r.ID)
	if waiting || active >= g.limit() {
		r.GroupWait = true
		o.markRun(r)
		// Recorded when the batch ends (flushGroupWaits), after the
		// run's run-submitted event.
		o.groupWaits = append(o.groupWaits, groupWait{r.ID, fmt.Sprintf("waiting for concurrency group %s: %d of %d running, %d waiting before it", g.Name, active, g.limit(), len(members)-active)})
	}
}

// groupWait is a run-group-wait event to record when the batch ends.
type groupWait struct {
	run RunID
	msg string
}

// flushGroupWaits records the batch's run-group-wait events, for the runs
// still waiting.
func (o *Orchestrator) flushGroupWaits() {
	for _, w := range o.groupWaits {
		if r := o.runs[w.run]; r != nil && r.GroupWait && !r.Finished {
			o.event(r.ID, "", "run-group-wait", w.msg)
		}
	}
	o.groupWaits = o.groupWaits[:0]
}

// leaveGroup takes a finished run out of its group and admits the waiting
// members that now fit, oldest first (a waiting member blocks those after
// it: submit order is kept).
func (o *Orchestrator) leaveGroup(r *RunRecord) {
	g := r.Spec.Group.Name
	if g == "" {
		return
	}
	members := o.groupRuns[g]
	for i, id := range members {
		if id == r.ID {
			members = append(members[:i:i], members[i+1:]...)
			break
		}
	}
	if len(members) == 0 {
		delete(o.groupRuns, g)
		return
	}
	o.groupRuns[g] = members
	if o.noAdmit == g {
		return
	}
	active := 0
	for _, id := range members {
		if !o.runs[id].GroupWait {
			active++
		}
	}
	for _, id := range members {
		m := o.runs[id]
		if !m.GroupWait {
			continue
		}
		if active >= m.Spec.Group.limit() {
			return
		}
		active++
		m.GroupWait = false
		o.markRun(m)
		o.event(m.ID, "", "run-group-admitted", fmt.Sprintf("admitted to concurrency group %s after %s finished", g, r.ID))
		for _, sid := range m.Steps {
			o.promote(o.steps[sid])
		}
	}
}

// GroupMembers lists a run group's unfinished members in submit order
// (for checkers and views).
func (o *Orchestrator) GroupMembers(group string) []RunID {
	return append([]RunID(nil), o.groupRuns[group]...)
}

// GroupHeld counts a step group's steps holding a lease.
func (o *Orchestrator) GroupHeld(group string) int { return len(o.groupHeld[group]) }

// groupBytes is the bytes of a run's group names, counted in the
// declaration's size (SPEC §12).
func groupBytes(r RunSpec) int {
	n := len(r.Group.Name)
	for _, s := range r.Steps {
		n += len(s.Group.Name)
	}
	return n
}

// group renders a concurrency group for the hand encoder (omitzero).
func (e *recEncoder) group(g *ConcurrencyGroup) {
	if *g == (ConcurrencyGroup{}) {
		return
	}
	e.key(false, "Group")
	e.key(true, "Name")
	e.str(g.Name)
	e.optInt("Max", int64(g.Max))
	e.optBool("CancelInProgress", g.CancelInProgress)
	e.end()
}
