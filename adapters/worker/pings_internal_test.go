package worker

import (
	"testing"
	"time"
)

// TestPingChecksOnTheGrid: before a Welcome the writer checks for a ping
// every readWait/4; after it, at the last instant of the heartbeat grid at
// or before that (SPEC §9, §10), never later and less than a grid sooner;
// a grid no finer than readWait/4 is not followed.
func TestPingChecksOnTheGrid(t *testing.T) {
	c := &conn{readWait: 20 * time.Second}
	now := time.Date(2026, 1, 1, 0, 0, 7, 250_000_000, time.UTC)
	if got := c.nextPingCheck(now); got != 5*time.Second {
		t.Fatalf("before a Welcome: next check in %v, want 5s", got)
	}
	anchor := time.Date(2026, 1, 1, 0, 0, 0, 600_000_000, time.UTC) // the grid: every whole second + 600 ms
	c.setGrid(anchor, time.Second)
	for _, off := range []time.Duration{0, 350 * time.Millisecond, 351 * time.Millisecond, 999 * time.Millisecond} {
		at := now.Add(off)
		d := c.nextPingCheck(at)
		if d > 5*time.Second || d <= 4*time.Second {
			t.Errorf("at +%v: next check in %v, want (4s, 5s]", off, d)
		}
		if r := at.Add(d).Sub(anchor) % time.Second; r != 0 {
			t.Errorf("at +%v: next check %v off the grid", off, r)
		}
	}
	c.setGrid(anchor, 5*time.Second)
	if got := c.nextPingCheck(now); got != 5*time.Second {
		t.Fatalf("a grid as coarse as the checks: next check in %v, want 5s", got)
	}
}
