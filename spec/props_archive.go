package spec

import (
	"fmt"
	"slices"

	"github.com/tether-run/tether/core"
)

// PropArchivedWhenDone names the archival property (SPEC §7a), which the
// Checker judges after every batch beside the seven invariants: no run
// whose steps are all terminal and none of whose leases is current is still
// in the core after a batch; a run leaves the core only as one history
// record, written in the batch that deleted its live records, whose steps
// are terminal in the states their transitions led to and none of whose
// leases is current; and a run is archived at most once and never live
// again, a restore included.
const PropArchivedWhenDone = "ArchivedWhenDone"

// ArchivedWhenDone returns the Checker's first violation of
// PropArchivedWhenDone.
func ArchivedWhenDone(c *Checker) *Violation {
	c.checks++
	return c.archFound
}

func (c *Checker) failArch(format string, args ...any) {
	if c.archFound == nil {
		c.archFound = &Violation{Invariant: PropArchivedWhenDone, Detail: fmt.Sprintf(format, args...)}
	}
}

func (c *Checker) evalArch() {
	c.archEvals++
	c.checks++
}

// observeHistory judges one history record of a batch (after the batch's
// lease records and transitions are applied) and archives it.
func (c *Checker) observeHistory(r core.Record) {
	c.evalArch()
	v, err := core.DecodeRecord(r)
	h, ok := v.(*core.RunHistory)
	if err != nil || !ok || core.HistoryKey(h.Run.ID) != r.Key {
		c.failArch("history record %s does not decode as its run's history (%v)", r.Key, err)
		return
	}
	if prev, ok := c.arch.Run(h.Run.ID); ok {
		c.failArch("run %s was archived twice (first as %s, again as %s)", h.Run.ID, prev.Status, h.Status)
	}
	if len(h.Steps) != len(h.Run.Steps) {
		c.failArch("history record of run %s holds %d steps, the run has %d", h.Run.ID, len(h.Steps), len(h.Run.Steps))
	}
	for _, s := range h.Steps {
		cur, known := c.steps[s.ID]
		switch {
		case !Terminal(s.State):
			c.failArch("run %s was archived with step %s %s, not terminal", h.Run.ID, s.ID, s.State)
		case !known || cur != s.State:
			c.failArch("run %s was archived with step %s %s, but its transitions lead to %s", h.Run.ID, s.ID, s.State, cur)
		}
	}
	for _, l := range h.Leases {
		if _, cur := c.current[l.ID]; cur || l.Current {
			c.failArch("run %s was archived while its lease %d (step %s, worker %s) is current", h.Run.ID, l.ID, l.Step, l.Worker)
		}
	}
	c.setArch(c.arch.add(h, r.Value))
}

// checkArchived judges the runs a batch touched (by a step record, a
// transition, or a lease that stopped being current): one that is
// archivable by the checker's own view — every step terminal by its
// transitions, no lease current by the lease records — must have left the
// core, and a run in history must not be live.
func (c *Checker) checkArchived(o *core.Orchestrator) {
	b := &c.b
	if len(b.steps) == 0 && len(b.ended) == 0 && len(b.history) == 0 {
		return
	}
	var runs []core.RunID
	add := func(s core.StepID) {
		if st, ok := o.StepByID(s); ok && !slices.Contains(runs, st.Run) {
			runs = append(runs, st.Run)
		}
	}
	for _, s := range b.steps {
		add(s)
	}
	for _, s := range b.ended {
		add(s)
	}
	for _, r := range b.history {
		_, id, _ := cutKey(r.Key)
		if !slices.Contains(runs, core.RunID(id)) {
			runs = append(runs, core.RunID(id))
		}
	}
	c.judgeRuns(o, runs)
}

// judgeRuns applies checkArchived's rule to the given runs.
func (c *Checker) judgeRuns(o *core.Orchestrator, runs []core.RunID) {
	var current map[core.StepID]core.LeaseID
	for _, id := range runs {
		c.evalArch()
		r, _, live := o.Run(id)
		if h, archived := c.arch.Run(id); archived {
			if live {
				c.failArch("run %s is live, but it was archived (%s)", id, h.Status)
			}
			for _, s := range h.Steps {
				if _, ok := o.StepByID(s.ID); ok {
					c.failArch("step %s of archived run %s is live", s.ID, id)
				}
			}
			continue
		}
		if !live {
			continue
		}
		done := len(r.Steps) > 0
		for _, s := range r.Steps {
			if !Terminal(c.steps[s]) {
				done = false
				break
			}
		}
		if !done {
			continue
		}
		if current == nil {
			current = make(map[core.StepID]core.LeaseID, len(c.current))
			for l, ow := range c.current {
				if prev, ok := current[ow.step]; !ok || l < prev {
					current[ow.step] = l
				}
			}
		}
		holds := false
		for _, s := range r.Steps {
			if _, ok := current[s]; ok {
				holds = true
				break
			}
		}
		if !holds {
			c.failArch("run %s has every step terminal and no lease current, but it is still in the core after the batch", id)
		}
	}
}

func cutKey(key string) (kind, id string, ok bool) {
	for i := 0; i < len(key); i++ {
		if key[i] == '/' {
			return key[:i], key[i+1:], true
		}
	}
	return key, "", false
}
