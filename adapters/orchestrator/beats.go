package orchestrator

import (
	"sync"
	"time"

	"github.com/tether-run/tether/core"
)

// maxBeatWait bounds how long a heartbeat waits for the loop (beats).
const maxBeatWait = 50 * time.Millisecond

// beats gathers the connections' heartbeats and hands them to the loop as
// one input, wait (maxBeatWait at most, a hundredth of the heartbeat
// interval) after the first of them arrived (SPEC §12): 10,000 idle
// workers send 333 a second, and each pushed alone woke the loop
// goroutine, usually on an idle thread, to step one heartbeat. A
// heartbeat's effect so comes at most wait later; a worker is silent only
// after two heartbeat intervals.
//
// A connection's inputs still reach the loop in the order it read them:
// its read loop passes each (pass), and anything but a heartbeat goes
// only after what waits here, if one of the connection's heartbeats is
// among it; a hand-over pushes while it holds mu, so nothing of the
// connection's can pass a heartbeat taken but not yet pushed.
type beats struct {
	wait time.Duration
	push func(input) error // the driver's push

	mu      sync.Mutex
	frames  []frame
	waiting map[*conn]bool // the connections with a heartbeat in frames
	armed   bool           // a hand-over is due (timer set)
}

// heartbeats is the input of a hand-over: frames in the order they came.
type heartbeats struct{ frames []frame }

func newBeats(wait time.Duration, push func(input) error) *beats {
	return &beats{wait: wait, push: push, waiting: map[*conn]bool{}}
}

// add queues a heartbeat frame of f.from (its read loop).
func (b *beats) add(f frame) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.frames = append(b.frames, f)
	b.waiting[f.from] = true
	if !b.armed {
		b.armed = true
		time.AfterFunc(b.wait, b.handOver)
	}
}

// pass hands the loop in, an input of c's read loop (a frame, its drop),
// after c's heartbeats before it: a heartbeat frame waits here, anything
// else is pushed once what waits of c's is.
func (b *beats) pass(c *conn, in input) error {
	if f, ok := in.(frame); ok {
		if _, ok := f.msg.(core.Heartbeat); ok {
			b.add(f)
			return nil
		}
	}
	if err := b.before(c); err != nil {
		return err
	}
	return b.push(in)
}

// before hands over what waits if c has a heartbeat in it.
func (b *beats) before(c *conn) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.waiting[c] {
		return nil
	}
	return b.handOverLocked()
}

// handOver pushes what waits (the timer's).
func (b *beats) handOver() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.armed = false
	b.handOverLocked()
}

// handOverLocked pushes what waits as one input, holding mu until it is in
// the loop's queue.
func (b *beats) handOverLocked() error {
	if len(b.frames) == 0 {
		return nil
	}
	in := heartbeats{frames: b.frames}
	b.frames = nil
	clear(b.waiting)
	return b.push(in)
}
