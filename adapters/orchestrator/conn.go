package orchestrator

import (
	"bufio"
	"bytes"
	"context"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"github.com/tether-run/tether/adapters/wire"
	"github.com/tether-run/tether/core"
)

// Control-plane timing and limits.
const (
	pingPeriod   = 20 * time.Second // the orchestrator pings every connection this often
	readWait     = 60 * time.Second // a connection silent this long (no frame, no pong) is dead
	writeWait    = 10 * time.Second // one frame must be written within this
	sendQueue    = 1024             // frames queued per connection; a slower reader is dropped
	maxReasonLen = 120              // a close frame's reason (control frames carry 125 bytes)
)

// WebSocket close codes the driver uses.
const (
	closeNormal    = websocket.CloseNormalClosure
	closePolicy    = websocket.ClosePolicyViolation
	closeData      = websocket.CloseUnsupportedData
	closeGoingAway = websocket.CloseGoingAway // the orchestrator is stopping
	closeInternal  = websocket.CloseInternalServerErr
)

// goingAwayWait bounds how long a stopping orchestrator waits for its
// connections to flush their queued frames and say going-away.
const goingAwayWait = 2 * time.Second

var upgrader = websocket.Upgrader{
	ReadBufferSize:   4096,
	WriteBufferSize:  4096,
	HandshakeTimeout: 10 * time.Second,
}

// conn is one control connection: a read loop turning frames into inputs and
// a writer goroutine draining out.
type conn struct {
	id core.ConnID
	ws *websocket.Conn
	cc *wire.CorkConn // under ws: the writer gathers queued frames into one write

	// out is written and closed only by the loop goroutine; a close means
	// "write a close frame with code and reason, then hang up".
	out    chan []byte
	code   int
	reason string

	stop     chan struct{} // closed by abort: hang up now, unflushed
	stopOnce sync.Once
	loopSide struct{ closing bool } // loop goroutine only: out is closed
}

// serveControl upgrades one connection and runs it until it ends.
func (d *Driver) serveControl(w http.ResponseWriter, r *http.Request) {
	if d.nconns.Add(1) > int64(d.opts.MaxConns) {
		d.nconns.Add(-1)
		http.Error(w, "too many control connections", http.StatusServiceUnavailable)
		return
	}
	defer d.nconns.Add(-1)
	hj := &corkingHijacker{ResponseWriter: w}
	ws, err := upgrader.Upgrade(hj, r, nil)
	if err != nil {
		d.log.Warn("control upgrade failed", "remote", r.RemoteAddr, "err", err)
		return // the upgrader has answered
	}
	c := &conn{id: core.ConnID(d.nextConn.Add(1)), ws: ws, cc: hj.cc, out: make(chan []byte, sendQueue), stop: make(chan struct{})}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		ws.Close()
		return
	}
	d.live[c] = true
	d.wg.Add(1)
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		delete(d.live, c)
		d.mu.Unlock()
		d.wg.Done()
	}()
	if err := d.push(context.Background(), opened{c}); err != nil {
		ws.Close()
		return
	}
	d.log.Debug("control connection opened", "conn", uint64(c.id), "remote", r.RemoteAddr)
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		c.writeLoop()
	}()
	reason := d.readLoop(c)
	c.abort()
	<-writerDone
	d.push(context.Background(), dropped{conn: c.id, reason: reason})
}

// readLoop turns frames into inputs until the connection fails; it returns
// why. A frame that does not decode closes the connection with the reason.
func (d *Driver) readLoop(c *conn) string {
	c.ws.SetReadLimit(wire.MaxFrame)
	c.ws.SetReadDeadline(time.Now().Add(readWait))
	c.ws.SetPongHandler(func(string) error { return c.ws.SetReadDeadline(time.Now().Add(readWait)) })
	var buf bytes.Buffer // reused: decoding copies what it keeps
	for {
		typ, r, err := c.ws.NextReader()
		if err != nil {
			return err.Error()
		}
		if buf.Cap() > 64<<10 {
			buf = bytes.Buffer{} // do not keep a rare large frame's buffer
		}
		buf.Reset()
		if _, err := buf.ReadFrom(r); err != nil {
			return err.Error()
		}
		b := buf.Bytes()
		c.ws.SetReadDeadline(time.Now().Add(readWait))
		if typ != websocket.TextMessage {
			c.hangUp(closeData, "binary frames are not part of the protocol")
			return "binary frame"
		}
		m, err := wire.Decode(b)
		if err != nil {
			d.log.Warn("undecodable frame; closing the connection", "conn", uint64(c.id), "err", err)
			c.hangUp(closeData, err.Error())
			return "undecodable frame: " + err.Error()
		}
		if d.push(context.Background(), frame{conn: c.id, msg: m}) != nil {
			return "orchestrator stopping"
		}
	}
}

// corkingHijacker hands the upgrader the hijacked connection wrapped in a
// CorkConn.
type corkingHijacker struct {
	http.ResponseWriter
	cc *wire.CorkConn
}

func (h *corkingHijacker) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	nc, brw, err := http.NewResponseController(h.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	h.cc = wire.NewCorkConn(nc)
	return h.cc, brw, nil
}

// writeText writes one text frame within the write deadline.
func (c *conn) writeText(b []byte) error {
	c.ws.SetWriteDeadline(time.Now().Add(writeWait))
	return c.ws.WriteMessage(websocket.TextMessage, b)
}

// writeLoop writes queued frames and pings until out is closed (then it
// says goodbye with a close frame) or the connection is aborted or fails.
// The frames queued at one moment (a batch's messages for this worker) go
// out in one write.
func (c *conn) writeLoop() {
	defer c.ws.Close()
	ping := time.NewTicker(pingPeriod)
	defer ping.Stop()
	for {
		select {
		case b, ok := <-c.out:
			if ok {
				var err error
				if ok, err = c.cc.WriteQueued(b, c.out, c.writeText); err != nil {
					return
				}
			}
			if !ok {
				c.hangUp(c.code, c.reason)
				return
			}
		case <-ping.C:
			if err := c.ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(writeWait)); err != nil {
				return
			}
		case <-c.stop:
			return
		}
	}
}

// send queues a frame (loop goroutine only). A connection whose queue is full
// is not keeping up: it is dropped, which the core hears as a Disconnected.
func (c *conn) send(b []byte) {
	if c.loopSide.closing {
		return
	}
	select {
	case c.out <- b:
	default:
		c.abort()
	}
}

// closeAfterQueued closes the connection once the queued frames are written
// (loop goroutine only).
func (c *conn) closeAfterQueued(code int, reason string) {
	if c.loopSide.closing {
		return
	}
	c.loopSide.closing = true
	c.code, c.reason = code, reason
	close(c.out)
}

// abort hangs up at once; the read loop then ends.
func (c *conn) abort() {
	c.stopOnce.Do(func() {
		close(c.stop)
		c.ws.Close()
	})
}

// hangUp sends a close frame with a reason, then closes the socket. Safe
// from any goroutine (gorilla allows WriteControl alongside other writers).
func (c *conn) hangUp(code int, reason string) {
	msg := websocket.FormatCloseMessage(code, closeReason(reason))
	c.ws.WriteControl(websocket.CloseMessage, msg, time.Now().Add(time.Second)) // best effort
	c.abort()
}

// closeReason fits a reason into a close frame, on a rune boundary.
func closeReason(s string) string {
	if len(s) <= maxReasonLen {
		return s
	}
	return strings.ToValidUTF8(s[:maxReasonLen], "")
}
