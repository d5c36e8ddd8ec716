package orchestrator

import "net/http"

// Routes returns the patterns registered on d's server mux, in order, and
// the mux (for openapi_test.go).
func Routes(d *Driver) ([]string, *http.ServeMux) { return d.mux.patterns, d.mux.ServeMux }
