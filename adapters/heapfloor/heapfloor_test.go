package heapfloor

import (
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
)

func TestPercent(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		live, roots, floor uint64
		base, want         int
	}{
		{live: 8 * mib, floor: 128 * mib, base: 100, want: 1500}, // 8 MiB × 16 = 128 MiB
		{live: 6 * mib, roots: 2 * mib, floor: 128 * mib, base: 100, want: 1525},
		{live: 10 * mib, floor: 128 * mib, base: 100, want: 1180},
		{live: 64 * mib, floor: 128 * mib, base: 100, want: 100}, // half the floor: GOGC's own goal reaches it
		{live: 100 * mib, floor: 128 * mib, base: 100, want: 100},
		{live: 100 * mib, floor: 128 * mib, base: 20, want: 28},
		{live: 512 * mib, floor: 128 * mib, base: 100, want: 100},
		{live: 512 * mib, floor: 128 * mib, base: 50, want: 50},
		{live: 0, floor: 128 * mib, base: 100, want: 3200},                       // the heap minimum, 4 MiB × 32, is the floor
		{live: mib / 8, roots: mib / 4, floor: 256 * mib, base: 100, want: 6400}, // likewise
		{live: 2 * mib, roots: 2 * mib, floor: 256 * mib, base: 100, want: 6350},
		{live: 3, floor: 10, base: 0, want: 1},                     // a floor under the heap minimum: the least percentage
		{live: 8 * mib, floor: 1 << 63, base: 100, want: 13107100}, // taken as FloorMax: no overflow, a percentage an int32 holds
	} {
		got := Percent(c.live, c.roots, c.floor, c.base)
		if got != c.want {
			t.Errorf("Percent(live %d, roots %d, floor %d, base %d) = %d, want %d", c.live, c.roots, c.floor, c.base, got, c.want)
		}
		if got < c.base {
			t.Errorf("Percent(live %d, roots %d, floor %d, base %d) = %d: under the base", c.live, c.roots, c.floor, c.base, got)
		}
		floor := min(c.floor, FloorMax)
		if got > math.MaxInt32 {
			t.Errorf("Percent(live %d, roots %d, floor %d, base %d) = %d: more than the runtime holds", c.live, c.roots, c.floor, c.base, got)
		}
		g := max(c.live+(c.live+c.roots)*uint64(got)/100, heapMinimum*uint64(got)/100)
		if g < floor {
			t.Errorf("Percent(live %d, roots %d, floor %d, base %d) = %d: the goal %d is under the floor", c.live, c.roots, c.floor, c.base, got, g)
		}
		if slack := (c.live+c.roots)/100 + heapMinimum/100; got > c.base && g > max(floor, heapMinimum/100)+slack {
			t.Errorf("Percent(live %d, roots %d, floor %d, base %d) = %d: the goal %d is past the floor by more than a percent's rounding", c.live, c.roots, c.floor, c.base, got, g)
		}
	}
}

// goal is the collector's current heap goal.
func goal() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/goal:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// gogc is the collector's current percentage.
func gogc() uint64 {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// collectUntil runs collections (the floor adjusts after each, on the
// finalizer goroutine) until ok holds of the goal, for at most 5 s.
func collectUntil(t *testing.T, what string, ok func(uint64) bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; {
		runtime.GC()
		if g := goal(); ok(g) {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("after 5 s of collections the heap goal is %d bytes: want it %s", g, what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestStartKeepsTheGoal: with a floor far above this test's small heap,
// the goal reaches the floor and stays there cycle after cycle; once the
// live heap grows, the next goal is set from it (a goal kept from the
// small heap would be many times the floor); stopped, the goal falls back
// to GOGC's.
func TestStartKeepsTheGoal(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64)) // none, whatever $GOMEMLIMIT says
	base := gogc()
	const floor = 256 << 20
	stop, err := Start(floor)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	near := func(g uint64) bool { return g >= floor && g <= floor+floor/4 }
	collectUntil(t, "at the floor", near)
	for range 3 {
		runtime.GC()
		runtime.GC()
		if g := goal(); !near(g) {
			t.Fatalf("the goal moved to %d bytes, off the floor %d, a few cycles later", g, floor)
		}
	}
	ballast := make([]byte, 96<<20) // live: the goal must follow
	collectUntil(t, "at the floor with 96 MiB more live", near)
	runtime.KeepAlive(ballast)
	if _, err := Start(floor); err != ErrStarted {
		t.Fatalf("a second Start: err %v, want ErrStarted", err)
	}
	stop()
	if p := gogc(); p != base {
		t.Fatalf("stopped, the collector's percentage is %d: want the one it had, %d", p, base)
	}
	collectUntil(t, "under the floor once stopped", func(g uint64) bool { return g < floor })
	stop() // twice: nothing
}

// TestMemoryLimitCapsTheFloor: under a memory limit the floor is at most
// half of it (without the cap the limit alone would hold the goal near
// itself, not near its half).
func TestMemoryLimitCapsTheFloor(t *testing.T) {
	const limit = 64 << 20
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(limit))
	stop, err := Start(1 << 30)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	collectUntil(t, "at half the limit", func(g uint64) bool { return g >= limit/2 && g <= limit/2+limit/8 })
}

// TestCollectorOff: with the collector off (GOGC=off, or as here
// debug.SetGCPercent(-1)), Start keeps nothing and leaves it off.
func TestCollectorOff(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	stop, err := Start(256 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if running != nil {
		t.Fatal("a floor is kept with the collector off")
	}
	if p := gogc(); p <= math.MaxInt32 {
		t.Fatalf("the collector's percentage is %d: Start turned it back on", p)
	}
}
