package orchestrator_test

import (
	"context"

	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/adapters/orchestrator/orchtest"
)

// view is what the end-to-end tests read of an orchestrator (orchtest.View:
// live state and history, SPEC §7a).
type view = orchtest.View

// viewer takes snapshots as views.
type viewer struct{ d *orchestrator.Driver }

func (v viewer) Snapshot(ctx context.Context, f func(o view)) error {
	return orchtest.Snapshot(ctx, v.d, f)
}
