package orchestrator

import (
	"net/http"
	"time"

	"github.com/tether-run/tether/adapters/store"
)

// Routes returns the patterns registered on d's server mux, in order, and
// the mux (for openapi_test.go).
func Routes(d *Driver) ([]string, *http.ServeMux) { return d.mux.patterns, d.mux.ServeMux }

// APIRoute is one route of the operator API, for tests.
type APIRoute struct {
	Method, Path string
	Public, Full bool
}

// APIRouteList returns the operator API's routes.
func APIRouteList() (out []APIRoute) {
	for _, rt := range apiRoutes {
		out = append(out, APIRoute{rt.method, rt.path, rt.public, rt.full})
	}
	return out
}

// PruneOnce runs one pass of the retention's pruner at cutoff.
func PruneOnce(d *Driver, cutoff time.Time) (store.PruneStats, error) {
	return d.pruneOnce(d.st, cutoff)
}

// WithBundleBodyTimeout returns opts with a bundle upload's body bounded
// by d instead of bundleBodyTimeout.
func WithBundleBodyTimeout(opts Options, d time.Duration) Options {
	opts.bundleBody = d
	return opts
}

// AuditAction is the audited action of a route (operators.go).
func AuditAction(method, path string) string { return auditAction(method, path) }

// RefusalUnits returns what is left of host's refusal budget (negative: in
// debt), as of now.
func RefusalUnits(d *Driver, host string) float64 {
	d.refusals.mu.Lock()
	defer d.refusals.mu.Unlock()
	b := d.refusals.m[host]
	if b == nil {
		return d.refusals.burst
	}
	return b.refill(time.Now(), d.refusals.rate, d.refusals.burst)
}

// SpendRefusals charges host's refusal budget n refusals now.
func SpendRefusals(d *Driver, host string, n float64) { d.refusals.spend(host, time.Now(), n) }
