package sim

import (
	"github.com/tether-run/tether/core"
	"github.com/tether-run/tether/spec"
)

// grantProps is the simulator's side of spec.Grants (spec.PropGrantsWithinCap,
// spec.PropCredentialWindow, spec.PropGrantsHoldAllTags): the tracker, and
// whether the next batch is a Restore's (restartOrch sets it).
type grantProps struct {
	g        *spec.Grants
	restored bool
	// The world's lookups GrantView names, made once: a method value
	// taken at every batch was two allocations a batch.
	workerOf func(core.ConnID) core.WorkerID
	tagsOf   func(core.WorkerID) ([]string, bool)
}

// checkGrants runs the grant, credential and tag properties over one
// orchestrator batch.
func (w *world) checkGrants(rd core.Ready) {
	p := &w.grants
	if p.g == nil {
		p.g = spec.NewGrants()
		p.workerOf, p.tagsOf = w.workerOfConn, w.declaredTags
	}
	restored := p.restored
	p.restored = false
	v := p.g.Check(rd, spec.GrantView{O: w.view(), Now: w.onow(), Restored: restored, LostBatches: true,
		WorkerOf: p.workerOf, TagsOf: p.tagsOf})
	if v != nil {
		w.fail(v.Invariant, v.Detail)
	}
}

// declaredTags gives the tags worker id declares in its Hellos: its
// configuration's, which the worker machine sends as they are.
func (w *world) declaredTags(id core.WorkerID) ([]string, bool) {
	for _, wn := range w.workers {
		if wn.id == id && wn.m != nil {
			return wn.m.Config().Tags, true
		}
	}
	return nil, false
}
