package core

import "time"

// The heartbeat grid (SPEC §10). A worker sends its heartbeats on instants
// of a grid the orchestrator's clock sets, rather than an interval after
// whatever moment it connected, so that the heartbeats of a fleet arrive
// together: a second's worth of heartbeats then costs the orchestrator one
// wakeup rather than one each (10,000 idle workers: 333 a second). The
// worker learns the grid's phase from the Welcome and measures from there
// with its own clock, so only durations cross between the two clocks (§11)
// and a worker whose clock is off by hours still lands on the grid.

// maxHeartbeatGrid bounds HeartbeatGrid: a heartbeat is at most this late.
const maxHeartbeatGrid = time.Second

// HeartbeatGrid is the spacing of the instants a worker heartbeats on, for
// a heartbeat interval: a twentieth of it, at most a second (30 s: 1 s). A
// heartbeat is so at most a twentieth of an interval later than the
// interval, well inside the silence window of MaxSilentHeartbeats
// intervals (§8).
func HeartbeatGrid(interval time.Duration) time.Duration {
	return min(maxHeartbeatGrid, max(interval/20, time.Millisecond))
}

// heartbeatPhase is how long from now the orchestrator's clock next
// reaches a multiple of the grid of interval (zero when now is on one): the
// Welcome's HeartbeatPhase.
func heartbeatPhase(now time.Time, interval time.Duration) time.Duration {
	grid := HeartbeatGrid(interval)
	off := time.Duration(now.UnixNano() % int64(grid))
	if off < 0 { // before 1970
		off += grid
	}
	if off == 0 {
		return 0
	}
	return grid - off
}

// GridAnchor is an instant of the orchestrator's heartbeat grid on the
// worker's clock: the Welcome's receipt plus its HeartbeatPhase, a phase
// beyond the grid of interval (or below zero) taken modulo it, as it says
// no more than that.
func GridAnchor(received time.Time, phase, interval time.Duration) time.Time {
	grid := HeartbeatGrid(interval)
	phase %= grid
	if phase < 0 {
		phase += grid
	}
	return received.Add(phase)
}

// NextHeartbeat is the last instant, at most interval after now, of the
// grid of interval that anchor lies on: when a worker that sends a
// heartbeat (or is welcomed) at now sends the next one. The next one is so
// never later than an interval, and never earlier than an interval less a
// grid; a tick that comes late does not delay the one after it. anchor is
// the Welcome's receipt on the worker's clock plus its HeartbeatPhase.
func NextHeartbeat(anchor, now time.Time, interval time.Duration) time.Time {
	return OnGrid(anchor, now.Add(interval), HeartbeatGrid(interval))
}

// OnGrid is the last instant at or before t of the grid of spacing grid
// that anchor lies on. The worker's driver times its pings with it too
// (SPEC §9).
func OnGrid(anchor, t time.Time, grid time.Duration) time.Time {
	d := t.Sub(anchor)
	n := d / grid
	if d%grid < 0 {
		n-- // t before anchor: the floor, below zero too
	}
	return anchor.Add(n * grid)
}

// HeartbeatAnchor returns the grid the worker heartbeats on: an instant of
// it on the worker's clock (the last Welcome's receipt plus its
// HeartbeatPhase) and its spacing; zero before the first Welcome.
func (w *Worker) HeartbeatAnchor() (anchor time.Time, grid time.Duration) {
	if w.beatAnchor.IsZero() {
		return time.Time{}, 0
	}
	return w.beatAnchor, HeartbeatGrid(w.heartbeat)
}
