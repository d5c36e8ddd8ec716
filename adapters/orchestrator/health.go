package orchestrator

import (
	"net/http"
)

// livez answers the liveness probe (SPEC §16): 200 while the process
// serves HTTP at all.
func (d *Driver) livez(w http.ResponseWriter, r *http.Request) {
	Probe(w, r, http.StatusOK, "ok")
}

// readyz answers the readiness probe (SPEC §16): 200 once the store is open
// and the state restored from it, while the loop runs and takes inputs;
// 503 with the reason otherwise (shutting down, stopped, the loop's input
// queue full).
func (d *Driver) readyz(w http.ResponseWriter, r *http.Request) {
	code, why := http.StatusServiceUnavailable, d.notReady()
	if why == "" {
		code, why = http.StatusOK, "ok"
	}
	Probe(w, r, code, why)
}

// notReady says why the driver is not ready, or "" if it is.
func (d *Driver) notReady() string {
	select {
	case <-d.ended:
		return "not ready: the orchestrator loop has stopped"
	default:
	}
	switch {
	case d.stopping.Load():
		return "not ready: shutting down"
	case !d.ready.Load():
		return "not ready: starting (the state is not restored yet)"
	case len(d.inputs) == cap(d.inputs):
		return "not ready: the orchestrator loop's input queue is full"
	}
	return ""
}

// Probe writes a probe's plain-text answer (/livez, /readyz, SPEC §16);
// only GET and HEAD are probes. A standby answers its probes with it too.
func Probe(w http.ResponseWriter, r *http.Request, code int, body string) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	if r.Method == http.MethodGet {
		_, _ = w.Write([]byte(body + "\n"))
	}
}
