package orchestrator

import (
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
// heartbeat every interval.
const (
	connWorkRate  = 50_000 // units per second
	connWorkBurst = 50_000 // units that may be spent at once
	refreshCost   = 100
	linesPerUnit  = 100
	// maxBudgetAddrs is how many addresses' budgets are kept before the
	// ones with no debt left are dropped.
	maxBudgetAddrs = 4096
)

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

// addrBudgets are the work budgets by source address.
type addrBudgets struct {
	mu sync.Mutex
	m  map[string]*workBudget
}

// spend takes cost units from host's budget at now and returns how long the
// frame must wait.
func (a *addrBudgets) spend(host string, now time.Time, cost float64) time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.m == nil {
		a.m = map[string]*workBudget{}
	}
	b := a.m[host]
	if b == nil {
		if len(a.m) >= maxBudgetAddrs {
			for h, old := range a.m { // order does not matter: each is judged alone
				if old.refill(now) >= connWorkBurst {
					delete(a.m, h)
				}
			}
		}
		b = &workBudget{}
		a.m[host] = b
	}
	return b.spend(now, cost)
}

// workBudget is a token bucket.
type workBudget struct {
	units float64
	at    time.Time
}

// spend takes cost units at now and returns how long the caller must wait
// before the frame may go on (zero when the budget had them).
func (b *workBudget) spend(now time.Time, cost float64) time.Duration {
	b.units = b.refill(now)
	b.at = now
	b.units -= cost
	if b.units >= 0 {
		return 0
	}
	return time.Duration(-b.units / connWorkRate * float64(time.Second))
}

// refill is the units the budget holds at now.
func (b *workBudget) refill(now time.Time) float64 {
	if b.at.IsZero() {
		return connWorkBurst
	}
	return min(connWorkBurst, b.units+now.Sub(b.at).Seconds()*connWorkRate)
}
