package worker

import (
	"cmp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/tether-run/tether/adapters/wire"
	"github.com/tether-run/tether/core"
)

// Control-plane timing and limits (SPEC §9: the orchestrator pings a
// connection it read nothing from for 20 s, the worker one it read nothing
// from for ReadWait/2).
const (
	// DefaultReadWait is Options.ReadWait's default: no frame, ping or
	// pong this long and the connection is dead.
	DefaultReadWait = 20 * time.Second
	writeWait       = 10 * time.Second // one frame must be written within this
)

// The send queue has no overflow rule (SPEC §10): what the core sends is
// bounded by design — per lease at most its window of unacknowledged lines
// (LogWindowLines, LogWindowBytes) is in flight, plus a few requests and
// heartbeats — so a step printing as fast as it can never costs the worker
// its connection. A peer that stops reading fails the write deadline.

// conn is the worker's side of one control connection.
type conn struct {
	gen      uint64
	ws       *websocket.Conn
	cc       *wire.CorkConn // under ws: the writer gathers queued frames into one write
	readWait time.Duration  // silent this long: dead (Options.ReadWait)
	heard    atomic.Int64   // when a frame, ping or pong was last read (unix ns)
	// The orchestrator's heartbeat grid (SPEC §10), set once the core has
	// its Welcome: an instant of it (unix ns) and its spacing (zero: none
	// yet). The writer times its ping checks on it.
	gridAnchor, grid atomic.Int64

	mu       sync.Mutex
	queue    [][]byte      // frames waiting for the writer, oldest first
	closed   bool          // no more frames: the writer hangs up after the queue
	wake     chan struct{} // capacity 1: the queue changed
	closing  bool          // loop goroutine only: closeAfterQueued was called
	stop     chan struct{} // closed by abort
	stopOnce sync.Once
}

// startConn runs the read loop and the writer of a new connection.
func (d *Driver) startConn(gen uint64, ws *websocket.Conn, cc *wire.CorkConn) *conn {
	c := &conn{gen: gen, ws: ws, cc: cc, readWait: cmp.Or(d.opts.ReadWait, DefaultReadWait), wake: make(chan struct{}, 1), stop: make(chan struct{})}
	c.heard.Store(time.Now().UnixNano())
	d.wg.Add(2)
	go func() {
		defer d.wg.Done()
		c.writeLoop()
	}()
	go func() {
		defer d.wg.Done()
		reason := d.readLoop(c)
		c.abort()
		d.push(lost{gen: gen, reason: reason})
	}()
	return c
}

// readLoop feeds decoded frames to the loop until the connection fails, and
// returns why. A frame that does not decode ends the connection.
func (d *Driver) readLoop(c *conn) string {
	c.ws.SetReadLimit(wire.MaxFrame)
	c.ws.SetReadDeadline(time.Now().Add(c.readWait))
	c.ws.SetPingHandler(func(data string) error {
		c.alive()
		c.ws.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(writeWait)) // best effort
		return nil
	})
	c.ws.SetPongHandler(func(string) error { // the answer to writeLoop's pings
		c.alive()
		return nil
	})
	var frames wire.FrameBuffer
	for {
		typ, r, err := c.ws.NextReader()
		if err != nil {
			return err.Error()
		}
		b, err := frames.Read(r) // the read limit has refused a longer frame
		if err != nil {
			return err.Error()
		}
		c.alive()
		if typ != websocket.TextMessage {
			c.hangUp(websocket.CloseUnsupportedData, "binary frame")
			return "orchestrator sent a binary frame"
		}
		m, err := wire.Decode(b)
		if err != nil {
			d.log.Warn("undecodable frame from orchestrator; closing the connection", "err", err)
			c.hangUp(websocket.CloseUnsupportedData, "undecodable frame")
			return "undecodable frame: " + err.Error()
		}
		if !d.push(received{gen: c.gen, msg: m}) {
			return "worker stopping"
		}
	}
}

// alive notes that something was read: the connection lives readWait more
// (read loop only).
func (c *conn) alive() {
	now := time.Now()
	c.heard.Store(now.UnixNano())
	c.ws.SetReadDeadline(now.Add(c.readWait))
}

// writeText writes one text frame within the write deadline.
func (c *conn) writeText(b []byte) error { return wire.WriteText(c.ws, b, writeWait) }

// setGrid hands the writer the heartbeat grid of the Welcome the core
// took (loop goroutine only).
func (c *conn) setGrid(anchor time.Time, grid time.Duration) {
	c.gridAnchor.Store(anchor.UnixNano())
	c.grid.Store(int64(grid))
}

// nextPingCheck is when the writer next checks whether a ping is due:
// readWait/4 after now, or, once the grid is known and finer than that, the
// last instant of the grid at or before it, so that the pings of a fleet of
// idle workers reach the orchestrator together, as their heartbeats do
// (SPEC §9, §10).
func (c *conn) nextPingCheck(now time.Time) time.Duration {
	every := c.readWait / 4
	grid := time.Duration(c.grid.Load())
	if grid <= 0 || grid >= every {
		return every
	}
	at := core.OnGrid(time.Unix(0, c.gridAnchor.Load()), now.Add(every), grid)
	return at.Sub(now) // in (every-grid, every]
}

// writeLoop writes queued frames until the queue is closed (then it sends a
// close frame) or the connection is aborted or fails. The frames queued at
// one moment go out in one write. Every readWait/4 (on the heartbeat grid
// once known, at most a grid sooner) it pings if it has read nothing for
// readWait/2 (SPEC §9): an orchestrator that answers nothing, not even a
// pong, is pinged twice and left within readWait (readLoop's deadline),
// and one that sends anything is not pinged at all.
func (c *conn) writeLoop() {
	defer c.ws.Close()
	ping := time.NewTimer(c.readWait / 4)
	defer ping.Stop()
	for {
		c.mu.Lock()
		frames, closed := c.queue, c.closed
		c.queue = nil
		c.mu.Unlock()
		if len(frames) > 0 {
			if err := c.cc.WriteAll(frames, c.writeText); err != nil {
				c.abort()
				return
			}
			continue
		}
		if closed {
			c.hangUp(websocket.CloseNormalClosure, "")
			return
		}
		select {
		case <-c.wake:
		case now := <-ping.C:
			ping.Reset(c.nextPingCheck(now))
			if now.Sub(time.Unix(0, c.heard.Load())) < c.readWait/2 {
				continue // heard from lately
			}
			if err := c.ws.WriteControl(websocket.PingMessage, nil, now.Add(writeWait)); err != nil {
				c.abort()
				return
			}
		case <-c.stop:
			return
		}
	}
}

func (c *conn) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// send queues a frame (loop goroutine only).
func (c *conn) send(b []byte) {
	if c.closing {
		return
	}
	c.mu.Lock()
	c.queue = append(c.queue, b)
	c.mu.Unlock()
	c.signal()
}

// closeAfterQueued closes the connection once queued frames are written
// (loop goroutine only).
func (c *conn) closeAfterQueued() {
	if !c.closing {
		c.closing = true
		c.mu.Lock()
		c.closed = true
		c.mu.Unlock()
		c.signal()
	}
}

// abort hangs up at once.
func (c *conn) abort() {
	c.stopOnce.Do(func() {
		close(c.stop)
		c.ws.Close()
	})
}

func (c *conn) hangUp(code int, reason string) {
	c.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, reason), time.Now().Add(time.Second))
	c.abort()
}
