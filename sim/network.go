package sim

import (
	"time"

	"github.com/tether-run/tether/core"
)

// conn is one control connection between a worker and one orchestrator
// incarnation. Each direction is FIFO (a message never overtakes an earlier
// one on the same connection); different connections race freely.
type conn struct {
	id       core.ConnID
	worker   int
	epoch    int
	orchOpen bool // the orchestrator still treats it as open
	broken   bool // reset: nothing more gets through either way
	brokenAt time.Time
	flushed  time.Time // a dead process's sent bytes still arrive until then
	lastToO  time.Time
	lastToW  time.Time
}

// link is the network path of one worker, with its faults.
type link struct {
	scale     float64   // this link's delays relative to the seed's range
	cutUp     bool      // worker → orchestrator blocked
	cutDown   bool      // orchestrator → worker blocked
	clogUntil time.Time // messages wait until then
}

// delay draws one message's network delay on a worker's link: each link has
// its own distribution (the seed's range scaled by the link's factor), with
// a heavy tail.
func (w *world) delay(lk *link) time.Duration {
	if w.script != nil {
		return scriptHold // a scripted network holds each message until the script delivers it
	}
	d := w.uniform(w.opt.DelayMin, w.opt.DelayMax)
	d = time.Duration(float64(d) * lk.scale)
	if !w.healed && w.chance(w.opt.TailProb) {
		d *= 20
	}
	return d
}

// dial opens a connection for a worker, or fails.
func (w *world) dial(wn *workerNode) {
	gen := wn.gen
	lk := &wn.link
	live := func() bool { return wn.gen == gen }
	if w.script != nil {
		// A scripted network holds a dial, like a message, until the script
		// completes it: it connects if an orchestrator is up by then.
		w.after(scriptHold, evDial, wn.idx, nil, "dial", func() {
			if !live() {
				return
			}
			if !w.orch.up {
				w.stepWorker(wn, core.WDialFailed{Reason: "connection refused"})
				return
			}
			w.connSeq++
			c := &conn{id: w.connSeq, worker: wn.idx, epoch: w.orch.epoch, orchOpen: true}
			w.conns[c.id] = c
			wn.conn = c.id
			w.stepWorker(wn, core.WConnected{Conn: c.id})
		}).on(0, live)
		return
	}
	if !w.orch.up || lk.cutUp || lk.cutDown {
		w.after(w.uniform(time.Second, 10*time.Second), evDial, wn.idx, nil, "dial failed", func() {
			if live() {
				w.stepWorker(wn, core.WDialFailed{Reason: "connection refused"})
			}
		}).on(0, live)
		return
	}
	w.connSeq++
	c := &conn{id: w.connSeq, worker: wn.idx, epoch: w.orch.epoch, orchOpen: true}
	w.conns[c.id] = c
	w.after(w.delay(lk), evDial, wn.idx, nil, "connected", func() {
		if !live() {
			return
		}
		if c.broken {
			w.stepWorker(wn, core.WDialFailed{Reason: "connection reset"})
			return
		}
		wn.conn = c.id
		w.stepWorker(wn, core.WConnected{Conn: c.id})
	}).on(c.id, live)
}

// sendToOrch carries one message from a worker over its current connection.
func (w *world) sendToOrch(wn *workerNode, m core.Msg) {
	c := w.conns[wn.conn]
	if c == nil || c.broken {
		return
	}
	if wn.link.cutUp {
		if w.cfg.StreamLinks {
			w.breakConn(c, true) // as TCP would: the frame goes with its connection
			return
		}
		return // one-way partition: silently gone
	}
	if !w.healed && w.chance(w.opt.LossProb) {
		w.fault("message-loss")
		w.breakConn(c, true)
		return
	}
	at := w.now.Add(w.delay(&wn.link))
	if wn.link.clogUntil.After(at) {
		at = wn.link.clogUntil.Add(w.delay(&wn.link))
	}
	if at.Before(c.lastToO) {
		at = c.lastToO
	}
	c.lastToO = at
	live := func() bool {
		return !(c.broken && !c.brokenAt.After(at)) && c.epoch == w.orch.epoch && c.orchOpen && w.orch.up
	}
	deliver := func() {
		if !live() {
			return
		}
		var ent [16]byte
		for i := range ent {
			ent[i] = byte(w.r.Uint32())
		}
		w.orchInput(core.Received{Conn: c.id, Msg: m, Entropy: ent})
	}
	w.at(at, evToOrch, wn.idx, m, "", deliver).on(c.id, live)
	if _, hello := m.(core.Hello); !hello && !w.healed && w.chance(w.opt.DupProb) {
		w.fault("duplicate")
		// A retransmitting proxy's copy trails the original, possibly behind
		// later messages of the same connection: a reordered stale copy.
		dupLive := func() bool { return !c.broken && c.epoch == w.orch.epoch && c.orchOpen && w.orch.up }
		w.at(at.Add(w.uniform(0, time.Second)), evToOrch, wn.idx, m, "duplicate", func() {
			if !dupLive() {
				return
			}
			w.orchInput(core.Received{Conn: c.id, Msg: m})
		}).on(c.id, dupLive)
	}
}

// sendToWorker carries one message from the orchestrator.
func (w *world) sendToWorker(id core.ConnID, m core.Msg) {
	if _, ok := m.(core.LogAck); ok {
		w.out.AcksLost++ // until delivered
	}
	c := w.conns[id]
	if c == nil || c.broken || !c.orchOpen || c.epoch != w.orch.epoch {
		return
	}
	closing := false
	switch m.(type) {
	case core.Close, core.Refused:
		closing = true
		c.orchOpen = false
	}
	wn := w.workers[c.worker]
	if wn.link.cutDown {
		if closing {
			w.breakConn(c, false)
		}
		return
	}
	at := w.now.Add(w.delay(&wn.link))
	if wn.link.clogUntil.After(at) {
		at = wn.link.clogUntil.Add(w.delay(&wn.link))
	}
	if at.Before(c.lastToW) {
		at = c.lastToW
	}
	c.lastToW = at
	gen := wn.gen
	live := func() bool {
		return wn.gen == gen && wn.conn == c.id && !(c.broken && !c.brokenAt.After(at) && at.After(c.flushed))
	}
	w.at(at, evToWorker, wn.idx, m, "", func() {
		if !live() {
			return
		}
		if _, ok := m.(core.LogAck); ok {
			w.out.AcksLost-- // delivered after all
		}
		w.chk.Delivered(w.now, wn.id, m)
		w.hist.delivered(w.now, m)
		w.stepWorker(wn, core.WReceived{Msg: m})
	}).on(c.id, live)
	if closing {
		// The orchestrator closes the socket after the message; the worker
		// reads the message, then sees the close.
		noticeLive := func() bool { return wn.gen == gen && wn.conn == c.id }
		w.at(at.Add(time.Millisecond), evWorkerNotice, wn.idx, nil, "closed by orchestrator", func() {
			c.broken, c.brokenAt = true, w.now
			if noticeLive() {
				wn.conn = 0
				w.stepWorker(wn, core.WDisconnected{Reason: "closed by orchestrator"})
			}
		}).on(c.id, noticeLive)
	}
}

// breakConn resets a connection. Each end notices on its own schedule (a
// socket drop is not seen by both ends at once); messages still in flight are
// lost.
func (w *world) breakConn(c *conn, fault bool) {
	if c.broken {
		return
	}
	c.broken, c.brokenAt = true, w.now
	if fault {
		w.fault("socket-drop")
	}
	notice := func() time.Duration { return w.uniform(0, max(w.opt.NoticeMax, time.Millisecond)) }
	if c.orchOpen {
		epoch := w.orch.epoch
		live := func() bool { return w.orch.epoch == epoch && c.orchOpen && w.orch.up }
		w.after(notice(), evOrchNotice, c.worker, nil, "", func() {
			if live() {
				c.orchOpen = false
				w.orchInput(core.Disconnected{Conn: c.id})
			}
		}).on(c.id, live)
	}
	wn := w.workers[c.worker]
	gen := wn.gen
	live := func() bool { return wn.gen == gen && wn.conn == c.id }
	w.at(maxTime(w.now, c.flushed).Add(notice()), evWorkerNotice, c.worker, nil, "", func() {
		if live() {
			wn.conn = 0
			w.stepWorker(wn, core.WDisconnected{Reason: "connection reset"})
		}
	}).on(c.id, live)
}

// ---- network faults ----

// partition cuts a set of workers off, in one or both directions, for at
// least PartitionMin.
func (w *world) partition() {
	if w.healed || len(w.workers) == 0 {
		return
	}
	var set []*workerNode
	kind := []string{"isolate-one", "split", "symmetric", "one-way"}[w.r.IntN(4)]
	switch kind {
	case "isolate-one", "one-way":
		set = []*workerNode{w.workers[w.r.IntN(len(w.workers))]}
	case "split":
		for _, wn := range w.workers {
			if w.chance(0.5) {
				set = append(set, wn)
			}
		}
	case "symmetric":
		set = w.workers
	}
	w.fault("partition-" + kind)
	for _, wn := range set {
		wn.link.cutUp = true
		if kind != "one-way" {
			wn.link.cutDown = true
			if c := w.conns[wn.conn]; c != nil {
				w.breakConn(c, false)
			}
			for _, c := range w.sortedConns() {
				if c.worker == wn.idx && c.orchOpen {
					w.breakConn(c, false)
				}
			}
		}
	}
	d := w.uniform(w.opt.PartitionMin, w.opt.PartitionMax)
	w.after(d, evFault, -1, nil, "partition heals", func() {
		for _, wn := range set {
			wn.link.cutUp, wn.link.cutDown = false, false
		}
	})
}

// swizzleClog stops links one by one and brings them back in another order.
func (w *world) swizzleClog() {
	if w.healed || len(w.workers) == 0 {
		return
	}
	w.fault("swizzle-clog")
	order := w.r.Perm(len(w.workers))
	back := w.r.Perm(len(w.workers))
	step := w.uniform(time.Second, 10*time.Second)
	end := w.now.Add(step * time.Duration(len(order)+1))
	for i, idx := range order {
		wn := w.workers[idx]
		w.after(step*time.Duration(i), evFault, idx, nil, "clog", func() {
			wn.link.clogUntil = end.Add(step * time.Duration(back[idx]))
		})
	}
}

// flushAndBreak is a process crash on the orchestrator's side: what it had
// already written to the socket still reaches the worker (the kernel sends
// it), then the connection is gone.
func (w *world) flushAndBreak(c *conn) {
	if c.broken {
		return
	}
	c.flushed = c.lastToW
	w.breakConn(c, false)
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
