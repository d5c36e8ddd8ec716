package main

import (
	"context"

	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/adapters/orchestrator/orchtest"
)

// coreView is what the tests read of an in-process orchestrator
// (orchtest.View: live state and history, SPEC §7a).
type coreView = orchtest.View

// coreViewer takes snapshots as coreViews.
type coreViewer struct{ d *orchestrator.Driver }

func (v coreViewer) Snapshot(ctx context.Context, f func(o coreView)) error {
	return orchtest.Snapshot(ctx, v.d, f)
}
