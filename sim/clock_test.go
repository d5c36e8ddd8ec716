package sim

import (
	"testing"
	"time"

	"pgregory.net/rapid"
)

// TestSimTimeForMatchesBisection: simTimeFor, which decides most of its
// bisection's comparisons without reading the clock, gives the time the
// bisection reading the clock at every midpoint gives, to the nanosecond,
// for clocks as wild as the workload draws and wilder (a 10 % drift, a
// wobble of 5 s), deadlines near and far, and days into a run.
func TestSimTimeForMatchesBisection(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		wn := &workerNode{
			offset: time.Duration(rapid.Int64Range(-int64(3*time.Hour), int64(3*time.Hour)).Draw(t, "offset")),
			drift:  rapid.Float64Range(-0.1, 0.1).Draw(t, "drift"),
			jumps:  time.Duration(rapid.Int64Range(-int64(time.Hour), int64(time.Hour)).Draw(t, "jumps")),
			wobble: time.Duration(rapid.Int64Range(0, int64(5*time.Second)).Draw(t, "wobble")),
			period: 5*time.Minute + time.Duration(rapid.Int64Range(0, int64(15*time.Minute)).Draw(t, "period")),
		}
		if rapid.Bool().Draw(t, "no-drift") {
			wn.drift = 0
		}
		now := t0.Add(time.Duration(rapid.Int64Range(0, int64(72*time.Hour)).Draw(t, "now")))
		ahead := time.Duration(rapid.OneOf(rapid.Int64Range(-int64(time.Second), int64(time.Second)),
			rapid.Int64Range(0, int64(time.Hour))).Draw(t, "ahead"))
		deadline := wn.local(now).Add(ahead)
		if wn.slopeMin() <= 0.5 {
			t.Skip("a clock the bound does not serve")
		}
		want := wn.simTimeForReadingAll(now, deadline)
		if got := wn.simTimeFor(now, deadline); !got.Equal(want) {
			t.Fatalf("simTimeFor %v, reading every midpoint %v (off by %v)", got, want, got.Sub(want))
		}
	})
}

// simTimeForReadingAll is simTimeFor as it was: the clock read at every
// midpoint.
func (wn *workerNode) simTimeForReadingAll(now, local time.Time) time.Time {
	if !wn.local(now).Before(local) {
		return now
	}
	if wn.drift == 0 && wn.wobble == 0 {
		return local.Add(-wn.offset - wn.jumps)
	}
	lo, hi := now, now.Add(2*local.Sub(wn.local(now))+time.Hour)
	for hi.Sub(lo) > time.Microsecond {
		mid := lo.Add(hi.Sub(lo) / 2)
		if wn.local(mid).Before(local) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return hi
}
