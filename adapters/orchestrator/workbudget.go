package orchestrator

import (
	"net/http"
	"sync"
	"time"

	"github.com/tether-run/tether/core"
)

// The work budget of one source address (SPEC §12): what the frames of its
// control connections may cost the loop per second, shared by all of them
// (so a client that floods, is closed and reconnects keeps its debt). A frame costs one unit, plus one per lease its
// in-flight list names (each is looked up and an unknown one answered with a
// Cancel), plus one per 100 log lines or events, plus 100 for a refresh (a
// durable record). A connection that spends faster than the rate has its
// next frame wait — its reads stop, TCP pushes back — so a flood from one
// client is throttled while the loop keeps serving the others. Workers
// behind one address translator share one budget. A genuine
// worker spends far less: one unit per report, start or log batch, a
// heartbeat every interval; a busy one three or four a step (Held, Start,
// Report, output), so the default lets one address run 12,000–17,000
// steps/s: a larger fleet behind one address needs Options.WorkPerSec
// (`serve --work-per-sec`) raised.
const (
	DefaultWorkPerSec = 50_000 // Options.WorkPerSec: units per second; the burst equals it
	refreshCost       = 100
	linesPerUnit      = 100
	// maxBudgetAddrs is how many addresses' budgets are kept before the
	// ones with no debt left are dropped.
	maxBudgetAddrs = 4096
)

// workBudgets are the work budgets of Options.WorkPerSec (defaults applied):
// the burst equals the rate; negative is off.
func workBudgets(perSec int) addrBudgets {
	return addrBudgets{rate: float64(perSec), burst: float64(perSec), off: perSec < 0}
}

// frameCost is what a frame costs a connection's work budget.
func frameCost(m core.Msg) float64 {
	switch m := m.(type) {
	case core.Heartbeat:
		return 1 + float64(len(m.InFlight))
	case core.Hello:
		return 1 + float64(len(m.InFlight))
	case core.Logs:
		return 1 + float64(len(m.Lines)/linesPerUnit)
	case core.Events:
		return 1 + float64(len(m.Events)/linesPerUnit)
	case core.Refresh:
		return refreshCost
	}
	return 1
}

// The refusal budget of one source address (SPEC §12): an address whose
// requests are refused — an HTTP answer of 4xx (but 404, 409, 416) or 503, or a control
// connection closed for a protocol error, a policy, a frame too big or
// overload — faster than Options.RefusalsPerSec (default 50) beyond a burst of
// twice that has its next requests wait before they are served, each at
// most refusalWaitMax. A client that keeps sending what is refused (a
// scanner, a stolen or expired token, a broken script) is slowed to the
// rate, which costs the server little; clients at other addresses never
// wait for it. Clients behind one address translator share one budget.
const (
	DefaultRefusalsPerSec = 50 // Options.RefusalsPerSec; the burst is twice the rate
	refusalWaitMax        = 5 * time.Second
	// refusalBytesUnit: a refused control connection costs one refusal
	// more per this many bytes it sent (a refused 1 MiB Hello costs 17),
	// at most refusalCostMax.
	refusalBytesUnit = 64 << 10
	refusalCostMax   = 100
)

// refusalCost is what a control connection refused after reading bytesIn
// bytes of frames costs its address's refusal budget.
func refusalCost(bytesIn int64) float64 {
	return min(refusalCostMax, 1+float64(bytesIn/refusalBytesUnit))
}

// addrBudgets are token buckets by source address, all of one rate and
// burst.
type addrBudgets struct {
	rate, burst float64
	off         bool // spend and wait never hold anyone
	mu          sync.Mutex
	m           map[string]*workBudget
}

// spend takes cost units from host's budget at now and returns how long the
// frame must wait.
func (a *addrBudgets) spend(host string, now time.Time, cost float64) time.Duration {
	if a.off {
		return 0
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.m == nil {
		a.m = map[string]*workBudget{}
	}
	b := a.m[host]
	if b == nil {
		if len(a.m) >= maxBudgetAddrs {
			for h, old := range a.m { // order does not matter: each is judged alone
				if old.refill(now, a.rate, a.burst) >= a.burst {
					delete(a.m, h)
				}
			}
		}
		b = &workBudget{}
		a.m[host] = b
	}
	return b.spend(now, cost, a.rate, a.burst)
}

// wait is how long a request from host must wait at now before it is
// served: until the address's budget is out of debt.
func (a *addrBudgets) wait(host string, now time.Time) time.Duration {
	if a.off {
		return 0
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	b := a.m[host]
	if b == nil {
		return 0
	}
	if u := b.refill(now, a.rate, a.burst); u < 0 {
		return time.Duration(-u / a.rate * float64(time.Second))
	}
	return 0
}

// workBudget is a token bucket.
type workBudget struct {
	units float64
	at    time.Time
}

// spend takes cost units at now and returns how long the caller must wait
// before the frame may go on (zero when the budget had them).
func (b *workBudget) spend(now time.Time, cost, rate, burst float64) time.Duration {
	b.units = b.refill(now, rate, burst)
	b.at = now
	b.units -= cost
	if b.units >= 0 {
		return 0
	}
	return time.Duration(-b.units / rate * float64(time.Second))
}

// refill is the units the budget holds at now.
func (b *workBudget) refill(now time.Time, rate, burst float64) float64 {
	if b.at.IsZero() {
		return burst
	}
	return min(burst, b.units+now.Sub(b.at).Seconds()*rate)
}

// throttleRefused makes a request from an address in debt with its
// refusal budget wait (at most refusalWaitMax, or until the client goes
// away), then serves it and charges the address for a refusal. The probes
// neither wait nor are charged (SPEC §16: they answer at once, a not-ready
// orchestrator's 503 included; a prober may share an address with a
// client in debt).
func (d *Driver) throttleRefused(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/livez" || r.URL.Path == "/readyz" {
			h.ServeHTTP(w, r)
			return
		}
		host := sourceHost(r.RemoteAddr)
		if wait := min(d.refusals.wait(host, time.Now()), refusalWaitMax); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-r.Context().Done():
				t.Stop()
				return
			}
		}
		sw := &statusWriter{ResponseWriter: w}
		h.ServeHTTP(sw, r)
		if chargedStatus(sw.status) {
			d.refusals.spend(host, time.Now(), 1)
		}
	})
}

// chargedStatus says whether an HTTP answer is a refusal the address is
// charged for: a 4xx but 404 (a missing run, id or version is a normal
// answer to poll for), 409 (a fenced write: a lease that just ended) and
// 416 (an offset past a stream's end: a reader that caught up); and 503
// (a cap of connections without a Hello).
func chargedStatus(code int) bool {
	switch {
	case code == http.StatusNotFound, code == http.StatusConflict, code == http.StatusRequestedRangeNotSatisfiable:
		return false
	case code >= 400 && code < 500, code == http.StatusServiceUnavailable:
		return true
	}
	return false
}

// statusWriter notes the status a handler answers with; Unwrap lets
// http.ResponseController reach the connection (deadlines, hijacking).
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// refusalClose says whether a close code ends a control connection for a
// refusal the address is charged for (SPEC §9).
func refusalClose(code int) bool {
	switch code {
	case closeProtocol, closeData, closePolicy, closeTooBig, closeTryAgain:
		return true
	}
	return false
}
