package orchestrator

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/tether-run/tether/adapters/store"
	"github.com/tether-run/tether/core"
)

// pruneEvery is how often the pruner looks for what the retention lets go:
// a tenth of the retention, between a second and ten minutes.
func pruneEvery(retention time.Duration) time.Duration {
	return min(max(retention/10, time.Second), 10*time.Minute)
}

// pruner deletes history, log lines and data older than the retention
// (SPEC §7a, §12) until the driver stops. It runs beside the loop: each of
// its transactions makes at most store.PruneBudget deletions, so a commit of
// the loop never waits for it long. The core prunes workers and tokens
// itself, at its sweeps.
func (d *Driver) pruner(p store.Retention, retention time.Duration) {
	d.every(pruneEvery(retention), func() { d.pruneOnce(p, time.Now().Add(-retention)) })
}

// pruneOnce is one pass at cutoff.
func (d *Driver) pruneOnce(p store.Retention, cutoff time.Time) (store.PruneStats, error) {
	var st store.PruneStats
	h, err := p.PruneHistory(cutoff, store.PruneBudget)
	st.Add(h)
	if err != nil {
		d.log.Error("pruning history", "err", err)
		return st, err
	}
	a, err := p.PruneAudit(cutoff, store.PruneBudget)
	st.Add(a)
	if err != nil {
		d.log.Error("pruning the audit log", "err", err)
		return st, err
	}
	// A bundle a live run names is kept: its spec (command, environment)
	// mentions the fingerprint.
	var specs []string
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err = d.Snapshot(ctx, func(o *core.Orchestrator) {
		for _, id := range o.RunIDs() {
			if r, _, ok := o.Run(id); ok {
				if b, err := json.Marshal(r.Spec); err == nil {
					specs = append(specs, string(b))
				}
			}
		}
	})
	cancel()
	if err != nil {
		return st, err // stopping
	}
	named := func(fp string) bool {
		for _, s := range specs {
			if strings.Contains(s, fp) {
				return true
			}
		}
		return false
	}
	dt, err := p.PruneData(cutoff, named, store.PruneBudget)
	st.Add(dt)
	if err != nil {
		d.log.Error("pruning data", "err", err)
		return st, err
	}
	if st.Runs+st.LogLines+st.Versions+st.Streams+st.Bundles+st.Audit > 0 {
		d.log.Info("pruned", "older_than", cutoff.UTC().Format(time.RFC3339), "runs", st.Runs, "log_lines", st.LogLines, "audit_entries", st.Audit,
			"versions", st.Versions, "streams", st.Streams, "bundles", st.Bundles, "blobs", st.Blobs, "transactions", st.Transactions)
	}
	return st, nil
}
