package workflow

import (
	"go.yaml.in/yaml/v3"

	"github.com/tether-run/tether/core"
)

// concurrency: as a mapping (SPEC §8a), on the workflow or on a step.

var groupFields = []string{"group", "max", "cancel_in_progress"}

// group reads a concurrency mapping; the core checks its values again.
func (p *parser) group(n *yaml.Node, what string, run bool) core.ConcurrencyGroup {
	var g core.ConcurrencyGroup
	p.fields(n, what, groupFields, func(key string, k, v *yaml.Node) {
		switch key {
		case "group":
			g.Name = p.str(v, what+": group")
			p.checkNames(v, "concurrency group")
		case "max":
			g.Max = p.integer(v, what+": max")
			if g.Max < 0 || g.Max > core.MaxGroupSize {
				p.errf(v, "%s: max %d is not in 0..%d (0 means 1)", what, g.Max, core.MaxGroupSize)
			}
		case "cancel_in_progress":
			g.CancelInProgress = p.boolean(v, what+": cancel_in_progress")
			if g.CancelInProgress && !run {
				p.errf(k, "%s: cancel_in_progress applies only to the workflow's concurrency (a step group queues)", what)
			}
		}
	})
	if g.Name == "" {
		p.errf(n, "%s: a concurrency mapping needs group: NAME", what)
	}
	return g
}
