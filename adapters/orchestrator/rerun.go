package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/tether-run/tether/core"
)

// Rerun submits run old's definition again as a new run recording RerunOf
// (SPEC §2), the steps in reuse created already succeeded (REUSE, §1). It
// is validated off the loop like Submit.
func (d *Driver) Rerun(ctx context.Context, old core.RunID, spec core.RunSpec, reuse []core.ReusedStep) (core.RunID, error) {
	if err := spec.Validate(); err != nil {
		return "", fmt.Errorf("rerun %s: %w: %w", old, ErrRefused, err)
	}
	if err := spec.CheckDispatchSizes(d.opts.Config.Env); err != nil {
		return "", fmt.Errorf("rerun %s: %w: %w", old, ErrRefused, err)
	}
	a, err := d.do(ctx, func(id core.CallID) core.Input {
		return core.Submit{Call: id, Actor: actorOf(ctx), Spec: spec, RerunOf: old, Reuse: reuse}
	})
	if err != nil {
		return "", fmt.Errorf("rerun %s: %w", old, err)
	}
	return a.Run, nil
}

// rerun is POST /api/runs/{id}/rerun: the run's definition and, with
// failed_only, its successes, read live from a snapshot or from its
// history record once archived (SPEC §2, §7a).
func (a *api) rerun(r *http.Request) (int, any, error) {
	id := core.RunID(r.PathValue("id"))
	var body APIRerunRequest
	if err := decodeJSON(r, &body); err != nil {
		return 0, nil, err
	}
	src, err := a.runSource(r.Context(), id, liveRun, nil)
	if err != nil {
		return 0, nil, err
	}
	var reuse []core.ReusedStep
	if body.FailedOnly {
		reuse = core.ReusePlan(src.run, src.steps)
	}
	run, err := a.d.Rerun(r.Context(), id, src.run.Spec, reuse)
	if errors.Is(err, ErrRefused) {
		return 0, nil, errorf(http.StatusBadRequest, "%v", err)
	}
	if err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, APISubmitted{Run: string(run)}, nil
}
