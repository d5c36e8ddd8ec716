package core

import (
	"testing"
	"time"
)

func TestHeartbeatGrid(t *testing.T) {
	for _, c := range []struct{ interval, grid time.Duration }{
		{30 * time.Second, time.Second}, {time.Hour, time.Second}, {4 * time.Second, 200 * time.Millisecond},
		{time.Second, 50 * time.Millisecond}, {0, time.Millisecond},
	} {
		if got := HeartbeatGrid(c.interval); got != c.grid {
			t.Errorf("HeartbeatGrid(%v) = %v, want %v", c.interval, got, c.grid)
		}
	}
	at := func(ms int64) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	for _, c := range []struct {
		now   time.Time
		phase time.Duration
	}{{at(0), 0}, {at(1), 999 * time.Millisecond}, {at(300), 700 * time.Millisecond}, {at(999), time.Millisecond}, {at(-300), 300 * time.Millisecond}} {
		if got := heartbeatPhase(c.now, 30*time.Second); got != c.phase {
			t.Errorf("heartbeatPhase(t0%+v) = %v, want %v", c.now.Sub(t0), got, c.phase)
		}
	}
	for _, c := range []struct {
		phase time.Duration
		at    time.Time
	}{{0, at(0)}, {700 * time.Millisecond, at(700)}, {2300 * time.Millisecond, at(300)}, {-300 * time.Millisecond, at(700)}} {
		if got := GridAnchor(t0, c.phase, 30*time.Second); !got.Equal(c.at) {
			t.Errorf("GridAnchor(t0, %v, 30s) = t0%+v, want t0%+v", c.phase, got.Sub(t0), c.at.Sub(t0))
		}
	}
	anchor := at(700)
	for _, c := range []struct {
		now  time.Time
		next time.Time
	}{{at(0), at(29700)}, {at(700), at(30700)}, {at(701), at(30700)}, {at(1699), at(30700)}, {at(30703), at(60700)}, {at(45100), at(74700)}} {
		if got := NextHeartbeat(anchor, c.now, 30*time.Second); !got.Equal(c.next) {
			t.Errorf("NextHeartbeat(t0+700ms, t0%+v) = t0%+v, want t0%+v", c.now.Sub(t0), got.Sub(t0), c.next.Sub(t0))
		}
	}
	if got := OnGrid(anchor, at(-100), time.Second); !got.Equal(at(-300)) {
		t.Errorf("OnGrid(t0+700ms, t0-100ms, 1s) = t0%+v, want t0-300ms", got.Sub(t0))
	}
	if got := OnGrid(anchor, at(-300), time.Second); !got.Equal(at(-300)) {
		t.Errorf("OnGrid(t0+700ms, t0-300ms, 1s) = t0%+v, want t0-300ms", got.Sub(t0))
	}
}

// TestHeartbeatsOnTheOrchestratorsGrid: a worker whose clock is hours and
// a fraction of a second off the orchestrator's, welcomed at an instant off
// the grid, sends every heartbeat at an instant that is, on the
// orchestrator's clock, a whole second plus the Welcome's trip (SPEC §10),
// at most an interval and more than an interval less a grid after the one
// before, though each tick comes a little late.
func TestHeartbeatsOnTheOrchestratorsGrid(t *testing.T) {
	const (
		offset = 3*time.Hour + 123456789*time.Nanosecond // the worker's clock ahead of the orchestrator's
		trip   = 5 * time.Millisecond                    // each message's time on the wire
		late   = 3 * time.Millisecond                    // each timer fires this late
	)
	cfg := DefaultConfig()
	o := NewOrchestrator(cfg)
	now := t0.Add(300 * time.Millisecond) // the orchestrator's clock, off its grid
	rd := o.Step(now, CreateToken{Call: 1, Name: "t", TTL: time.Hour})
	w := NewWorker(WorkerConfig{ID: "w", Name: "w", Token: rd.Answers[0].Token})
	w.Step(now.Add(offset), WBoot{})
	hello := w.Step(now.Add(offset), WConnected{Conn: 1}).Send
	if len(hello) != 1 {
		t.Fatalf("the worker sent %d messages on connecting, want its Hello", len(hello))
	}
	now = now.Add(trip + 100*time.Millisecond)
	welcome := o.Step(now, Received{Conn: 1, Msg: hello[0]}).Messages
	if len(welcome) != 1 {
		t.Fatalf("the orchestrator sent %d messages, want a Welcome", len(welcome))
	}
	if m := welcome[0].Msg.(Welcome); m.HeartbeatPhase != 595*time.Millisecond {
		t.Fatalf("a Welcome sent at t0+%v has phase %v, want 595ms", now.Sub(t0), m.HeartbeatPhase)
	}
	wnow := now.Add(offset + trip)
	out := w.Step(wnow, WReceived{Msg: welcome[0].Msg})
	grid := HeartbeatGrid(cfg.HeartbeatInterval)
	var prev time.Time // on the worker's clock
	for beat := 0; beat < 5; beat++ {
		if out.Deadline.IsZero() {
			t.Fatalf("heartbeat %d: the worker wants no tick", beat)
		}
		due := out.Deadline
		wnow = due.Add(late)
		out = w.Step(wnow, WTick{})
		n := 0
		for _, m := range out.Send {
			if _, ok := m.(Heartbeat); ok {
				n++
			}
		}
		if n == 0 {
			continue // another timer (a credential refresh) came first
		}
		onOrch := due.Add(-offset - trip)
		if off := onOrch.Sub(t0) % grid; off != 0 {
			t.Fatalf("heartbeat %d at t0+%v on the orchestrator's clock (less the Welcome's trip): %v off its grid of %v", beat, onOrch.Sub(t0), off, grid)
		}
		if !prev.IsZero() {
			if gap := due.Sub(prev); gap <= cfg.HeartbeatInterval-grid || gap > cfg.HeartbeatInterval {
				t.Fatalf("heartbeat %d was due %v after the one before, want (%v, %v]", beat, gap, cfg.HeartbeatInterval-grid, cfg.HeartbeatInterval)
			}
		}
		prev = due
	}
	if prev.IsZero() {
		t.Fatal("no heartbeat")
	}
}
