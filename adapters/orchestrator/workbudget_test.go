package orchestrator

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/tether-run/tether/core"
)

// A source address's budget: the burst is free, then each unit costs
// 1/rate of waiting; another address is not charged; off never waits.
func TestAddrBudgets(t *testing.T) {
	at := time.Unix(1000, 0)
	a := addrBudgets{rate: 10, burst: 20}
	for i := range 20 {
		if w := a.spend("a", at, 1); w != 0 {
			t.Fatalf("refusal %d within the burst waits %s", i+1, w)
		}
	}
	if w := a.spend("a", at, 1); w != 100*time.Millisecond {
		t.Fatalf("the first refusal past the burst: wait %s, want 100ms", w)
	}
	if w := a.wait("a", at); w != 100*time.Millisecond {
		t.Fatalf("a request after it waits %s, want 100ms", w)
	}
	if w := a.wait("a", at.Add(100*time.Millisecond)); w != 0 {
		t.Fatalf("100ms later a request waits %s, want 0", w)
	}
	if w := a.wait("b", at); w != 0 {
		t.Fatalf("another address waits %s", w)
	}
	off := addrBudgets{rate: 10, burst: 20, off: true}
	for range 100 {
		off.spend("a", at, 1)
	}
	if w := off.wait("a", at); w != 0 {
		t.Fatalf("a budget that is off makes a request wait %s", w)
	}
}

// Options.WorkPerSec sets the rate and the burst of the work budgets, and a
// negative one turns them off: a fleet behind one address translator can
// be given more than the default (SPEC §12).
func TestWorkBudgetsFromOptions(t *testing.T) {
	at := time.Unix(1000, 0)
	a := workBudgets(200_000)
	if w := a.spend("nat", at, 150_000); w != 0 {
		t.Fatalf("150,000 units within a burst of 200,000 wait %s", w)
	}
	if w := a.spend("nat", at, 100_000); w != 250*time.Millisecond {
		t.Fatalf("50,000 units past the burst at 200,000/s: wait %s, want 250ms", w)
	}
	def := workBudgets(DefaultWorkPerSec)
	if w := def.spend("nat", at, 150_000); w != 2*time.Second {
		t.Fatalf("100,000 units past the default burst: wait %s, want 2s", w)
	}
	off := workBudgets(-1)
	if w := off.spend("nat", at, 1e9); w != 0 || off.wait("nat", at) != 0 {
		t.Fatalf("an off budget makes a frame wait %s", w)
	}
}

// A heartbeat costs a unit per lease it names; a refresh is a durable
// record; a refused control connection costs more the more it sent.
func TestFrameAndRefusalCosts(t *testing.T) {
	refs := make([]core.LeaseRef, 1024)
	if c := frameCost(core.Heartbeat{InFlight: refs}); c != 1025 {
		t.Errorf("a heartbeat naming 1,024 leases costs %v, want 1025", c)
	}
	if c := frameCost(core.Refresh{}); c != refreshCost {
		t.Errorf("a refresh costs %v, want %v", c, refreshCost)
	}
	if c := refusalCost(1 << 20); c != 17 {
		t.Errorf("a refused connection that sent 1 MiB costs %v, want 17", c)
	}
	if c := refusalCost(1 << 40); c != refusalCostMax {
		t.Errorf("a refused connection that sent 1 TiB costs %v, want the cap %v", c, refusalCostMax)
	}
	for code, want := range map[int]bool{400: true, 401: true, 413: true, 503: true, 404: false, 409: false, 416: false, 200: false, 500: false} {
		if chargedStatus(code) != want {
			t.Errorf("HTTP %d charged: %v, want %v", code, !want, want)
		}
	}
}

// throttleRefused: an address past its burst of refusals waits before its
// next request is served; an address that was only answered 200 never does.
func TestThrottleRefused(t *testing.T) {
	d := &Driver{refusals: addrBudgets{rate: 10, burst: 2}}
	h := d.throttleRefused(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/bad" {
			http.Error(w, "refused", http.StatusBadRequest)
		}
	}))
	serve := func(from, path string) time.Duration {
		req := httptest.NewRequest("GET", path, nil)
		req.RemoteAddr = from + ":1234"
		t0 := time.Now()
		h.ServeHTTP(httptest.NewRecorder(), req)
		return time.Since(t0)
	}
	var refused time.Duration
	for range 5 {
		refused += serve("192.0.2.1", "/bad") // the 3rd puts it in debt; the 4th and 5th each wait 100 ms
		serve("192.0.2.2", "/good")
	}
	if refused < 150*time.Millisecond {
		t.Errorf("5 refused requests, 3 past the burst, were served in %s, want about 200ms", refused)
	}
	if took := serve("192.0.2.1", "/good"); took < 50*time.Millisecond {
		t.Errorf("a request from an address a refusal past its burst was served after %s, want it to wait about 100ms", took)
	}
	if took := serve("192.0.2.2", "/good"); took > 100*time.Millisecond {
		t.Errorf("a request from an address never refused waited %s", took)
	}
}
