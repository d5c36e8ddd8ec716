package orchestrator

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/tether-run/tether/adapters/wire"
	"github.com/tether-run/tether/core"
)

// Control-plane timing and limits (SPEC §12).
const (
	readWait  = 60 * time.Second // a connection silent this long (no frame, no pong) is dead (Options.ReadWait)
	writeWait = 10 * time.Second // one frame must be written within this
	// sendQueue: a connection whose queue would hold more frames than
	// this, plus two for each lease its Hello may hold (slots + ahead), is
	// reading too slowly, and is closed (1013): a Welcome and a Dispatch
	// (or a Cancel) for every one of them may come in one release, before
	// the writer runs.
	sendQueue      = 1024
	connInputQueue = 64              // inputs of one connection waiting for the loop; its reads wait beyond it
	maxReasonLen   = 120             // a close frame's reason (control frames carry 125 bytes)
	lingerWait     = 5 * time.Second // after a close frame, how long the peer has to read it and answer
)

// WebSocket close codes the driver uses (SPEC §9), each sent with a reason.
const (
	closeNormal    = websocket.CloseNormalClosure     // the session ended (superseded)
	closeGoingAway = websocket.CloseGoingAway         // the orchestrator is stopping
	closeProtocol  = websocket.CloseProtocolError     // a frame that is not the protocol
	closeData      = websocket.CloseUnsupportedData   // a binary frame
	closePolicy    = websocket.ClosePolicyViolation   // refused: credential, token, a limit of the Hello, no Hello in time
	closeTooBig    = websocket.CloseMessageTooBig     // a frame over wire.MaxFrame
	closeTryAgain  = websocket.CloseTryAgainLater     // overload: a cap, a reader too slow for its send queue
	closeInternal  = websocket.CloseInternalServerErr // a message the driver cannot encode
)

// closeCode is the close code for a core Close.
func closeCode(m core.Close) int {
	switch m.Code {
	case core.CloseProtocolError:
		return closeProtocol
	case core.ClosePolicy:
		return closePolicy
	}
	return closeNormal
}

// goingAwayWait bounds how long a stopping orchestrator waits for its
// connections to flush their queued frames and say going-away.
const goingAwayWait = 2 * time.Second

// upgrader makes the control connections. An idle connection holds no
// buffer of its own but the HTTP server's reader it came in on (read
// buffer size 0: gorilla reads through that one); a write takes a buffer
// from writeBuffers and gives it back when the frame is out.
var upgrader = websocket.Upgrader{
	ReadBufferSize:   0,
	WriteBufferSize:  4096,
	WriteBufferPool:  &writeBuffers,
	HandshakeTimeout: 10 * time.Second,
}

var writeBuffers sync.Pool

// conn is one control connection: a read loop turning frames into inputs and
// a writer goroutine draining out.
type conn struct {
	id core.ConnID
	ws *websocket.Conn
	cc *wire.CorkConn // under ws: the writer gathers queued frames into one write

	// out is pushed to and closed only by the loop goroutine; a close
	// means "write a close frame with code and reason, then hang up".
	out    frameQueue
	code   int
	reason string

	stop     chan struct{} // closed by abort: hang up now, unflushed
	stopOnce sync.Once
	loopSide struct{ closing bool } // loop goroutine only: out is closed
	// leases is how many leases its Hello may hold (slots + ahead, at most
	// core.MaxInFlightLeases): its send queue's room beyond sendQueue.
	leases atomic.Int32

	// Admission (SPEC §12): host is the source address; the connection
	// counts as unauthenticated until the core welcomes it (leaveUnauth),
	// and holds one of the MaxConns places from its Hello on (hello).
	host     string
	unauth   sync.Once
	hello    atomic.Bool
	inputs   chan struct{} // one token per input of this connection waiting for the loop
	overOnce sync.Once
	// lingerUntil is when a hung-up connection is closed (unix ns; 0: not
	// hung up).
	lingerUntil atomic.Int64
	closedWith  atomic.Int32 // the close code it was hung up with
	bytesIn     int64        // frame bytes read (the read loop's; read after it ends)
	// heard is when its last frame, ping or pong was read (unix ns); a
	// ping is due half Options.ReadWait after it, which the driver's one
	// liveness sweep checks for every connection every third of it
	// (pingSweep): a ping leaves at least a sixth for the pong.
	heard atomic.Int64
}

// serveControl upgrades one connection and runs it until it ends. A
// connection is unauthenticated from its upgrade until the core welcomes its
// Hello; those have their own cap, in all and per source address, and must
// send their Hello within HelloTimeout (SPEC §12). A Hello takes one of the
// MaxConns places, which unauthenticated connections never hold.
func (d *Driver) serveControl(w http.ResponseWriter, r *http.Request) {
	host := sourceHost(r.RemoteAddr)
	if why := d.admitUnauth(host); why != "" {
		// Before the upgrade, so a refusal costs nothing: the client reads
		// the reason in the body and tries again later.
		w.Header().Set("Retry-After", "1")
		http.Error(w, why, http.StatusServiceUnavailable)
		return
	}
	hj := &corkingHijacker{ResponseWriter: w}
	ws, err := upgrader.Upgrade(hj, r, nil)
	if err != nil {
		d.releaseUnauth(host)
		d.log.Warn("control upgrade failed", "remote", r.RemoteAddr, "err", err)
		return // the upgrader has answered
	}
	c := &conn{id: core.ConnID(d.nextConn.Add(1)), ws: ws, cc: hj.cc, out: newFrameQueue(), stop: make(chan struct{}),
		host: host, inputs: make(chan struct{}, connInputQueue)}
	c.heard.Store(time.Now().UnixNano())
	// The connection runs on a goroutine of its own, and the handler
	// returns: what the HTTP server held for the request (its writer, the
	// request, a deep stack) is then free, where a handler running for the
	// connection's life would hold it.
	go d.runControl(c, r.RemoteAddr)
}

// runControl runs an upgraded control connection until it ends.
func (d *Driver) runControl(c *conn, remote string) {
	ws := c.ws
	defer func() {
		c.leaveUnauth(d)
		if c.hello.Load() {
			d.nauth.Add(-1)
		}
	}()
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
	d.log.Debug("control connection opened", "conn", uint64(c.id), "remote", remote)
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		c.writeLoop()
	}()
	reason := d.readLoop(c)
	c.drain()
	c.abort()
	<-writerDone
	if refusalClose(int(c.closedWith.Load())) {
		d.refusals.spend(c.host, time.Now(), refusalCost(c.bytesIn)) // SPEC §12: the refusal budget
	}
	d.beats.pass(c, dropped{conn: c.id, reason: reason}) // after its heartbeats
}

// sourceHost is the host part of a remote address: connections are counted
// per source address, whatever their port.
func sourceHost(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

// admitUnauth counts a new unauthenticated connection from host, or says
// which cap refuses it.
func (d *Driver) admitUnauth(host string) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case d.nunauth >= d.opts.MaxUnauthConns:
		return fmt.Sprintf("too many connections without an accepted hello (%d); try again later", d.opts.MaxUnauthConns)
	case d.unauthFrom[host] >= d.opts.MaxUnauthConnsPerAddr:
		return fmt.Sprintf("too many connections without an accepted hello from %s (%d); try again later", host, d.opts.MaxUnauthConnsPerAddr)
	}
	d.nunauth++
	d.unauthFrom[host]++
	return ""
}

func (d *Driver) releaseUnauth(host string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.nunauth--
	if d.unauthFrom[host]--; d.unauthFrom[host] <= 0 {
		delete(d.unauthFrom, host)
	}
}

// leaveUnauth ends the connection's unauthenticated time: at its Welcome, or
// at its end.
func (c *conn) leaveUnauth(d *Driver) {
	c.unauth.Do(func() { d.releaseUnauth(c.host) })
}

// takeHelloPlace gives the connection one of the MaxConns places when its
// Hello arrives, or says why not.
func (d *Driver) takeHelloPlace(c *conn) string {
	if d.nauth.Add(1) > int64(d.opts.MaxConns) {
		d.nauth.Add(-1)
		return fmt.Sprintf("too many worker connections (%d); try again later", d.opts.MaxConns)
	}
	c.hello.Store(true)
	return ""
}

// readLoop turns frames into inputs until the connection fails; it returns
// why. Every refusal hangs up with a close code and a reason (SPEC §9): no
// Hello within HelloTimeout (1008), a frame over wire.MaxFrame (1009), a
// binary frame (1003), a frame that does not decode (1002), a Hello beyond
// the MaxConns places (1013). One connection has at most connInputQueue
// inputs waiting for the loop: beyond that its reads wait, so a flood from
// one connection is throttled and never fills the loop's queue for the
// others.
func (d *Driver) readLoop(c *conn) string {
	helloBy := time.Now().Add(d.opts.HelloTimeout)
	c.ws.SetReadDeadline(helloBy)
	first := true
	// A pong, or a worker's own ping, is heard from the peer as a frame is
	// (SPEC §9): it extends the read deadline and spares the next ping.
	heard := func() error {
		if first || c.lingering() {
			return nil // they do not extend the Hello deadline, nor a linger
		}
		now := time.Now()
		c.heard.Store(now.UnixNano())
		return c.ws.SetReadDeadline(now.Add(d.opts.ReadWait))
	}
	c.ws.SetPongHandler(func(string) error { return heard() })
	c.ws.SetPingHandler(func(data string) error {
		if err := heard(); err != nil {
			return err
		}
		c.ws.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(writeWait)) // best effort, as gorilla's own
		return nil
	})
	var frames wire.FrameBuffer
	for {
		typ, r, err := c.ws.NextReader()
		if err != nil {
			var ne net.Error
			if first && c.lingerUntil.Load() == 0 && errors.As(err, &ne) && ne.Timeout() {
				why := fmt.Sprintf("no hello within %s", d.opts.HelloTimeout)
				c.hangUp(closePolicy, why)
				return why
			}
			return err.Error()
		}
		b, err := frames.Read(r)
		if errors.Is(err, wire.ErrFrameTooLarge) {
			c.bytesIn += wire.MaxFrame + 1 // read before it was refused: its cost (SPEC §12)
			why := fmt.Sprintf("frame larger than %d bytes", wire.MaxFrame)
			c.hangUp(closeTooBig, why)
			return why
		}
		if err != nil {
			return err.Error()
		}
		c.bytesIn += int64(len(b))
		if c.lingering() {
			continue // hung up (its send queue overflowed): discard
		}
		c.heard.Store(time.Now().UnixNano()) // the read deadline moves once the frame is passed on, below
		if typ != websocket.TextMessage {
			c.hangUp(closeData, "binary frames are not part of the protocol")
			return "binary frame"
		}
		m, err := wire.Decode(b)
		if err != nil {
			d.log.Warn("undecodable frame; closing the connection", "conn", uint64(c.id), "err", err)
			c.hangUp(closeProtocol, err.Error())
			return "undecodable frame: " + err.Error()
		}
		if first {
			first = false
			if h, ok := m.(core.Hello); ok {
				c.leases.Store(int32(min(max(h.Slots, 0)+max(h.Ahead, 0), core.MaxInFlightLeases)))
				if why := d.takeHelloPlace(c); why != "" {
					d.log.Warn("hello refused: too many worker connections", "conn", uint64(c.id), "max_conns", d.opts.MaxConns)
					c.hangUp(closeTryAgain, why)
					return why
				}
			}
		}
		if wait := d.work.spend(c.host, time.Now(), frameCost(m)); wait > 0 {
			t := time.NewTimer(wait) // over its work budget: throttled (SPEC §12)
			select {
			case <-t.C:
			case <-c.stop:
				t.Stop()
				return "connection closed"
			case <-d.quit:
				t.Stop()
				return "orchestrator stopping"
			}
		}
		select {
		case c.inputs <- struct{}{}: // released by the loop when it takes the frame
		case <-c.stop:
			return "connection closed"
		case <-d.quit:
			return "orchestrator stopping"
		}
		// A heartbeat goes with others, within maxBeatWait (beats).
		if d.beats.pass(c, frame{conn: c.id, msg: m, from: c}) != nil {
			return "orchestrator stopping"
		}
		// The waits above (the work budget, the input tokens) are not the
		// peer's silence: ReadWait runs again from when it is read again
		// (a deadline past by now would drop a connection whose frames
		// wait in its socket).
		c.ws.SetReadDeadline(time.Now().Add(d.opts.ReadWait))
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
func (c *conn) writeText(b []byte) error { return wire.WriteText(c.ws, b, writeWait) }

// writeLoop writes queued frames and the pings the liveness sweep asks
// for until out is closed (then it says goodbye with a close frame) or the
// connection is aborted or fails. The frames queued at one moment (a
// batch's messages for this worker) go out in one write.
func (c *conn) writeLoop() {
	var frames [][]byte
	for {
		select {
		case <-c.out.ready:
			var closed, ping bool
			frames, closed, ping = c.out.take(frames)
			if len(frames) > 0 {
				if err := c.cc.WriteAll(frames, c.writeText); err != nil {
					c.writeFailed()
					return
				}
			}
			if closed {
				c.hangUp(c.code, c.reason) // the read loop ends within lingerWait
				return
			}
			if ping {
				if err := c.ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(writeWait)); err != nil {
					c.writeFailed()
					return
				}
			}
		case <-c.stop:
			return
		}
	}
}

// pingSweep is the driver's one liveness timer (SPEC §9): every third of
// ReadWait it asks every connection it read nothing from for half ReadWait
// for a ping, which the connection's writer sends. One timer for all
// keeps an idle connection's writer asleep, where a ticker each woke
// every one of them every period to find, mostly, nothing to do.
func (d *Driver) pingSweep() {
	pingAfter := d.opts.ReadWait / 2
	var due []*conn
	d.every(d.opts.ReadWait/3, func() {
		now := time.Now().UnixNano()
		d.mu.Lock()
		for c := range d.live {
			if now-c.heard.Load() >= int64(pingAfter) {
				due = append(due, c)
			}
		}
		d.mu.Unlock()
		for i, c := range due {
			c.out.ping()
			due[i] = nil
		}
		due = due[:0]
	})
}

// send queues a frame (loop goroutine only). A connection whose queue is
// full (sendQueue, and two frames for each lease its Hello may hold) is not
// keeping up: it is closed with 1013 (try again later), which the core
// hears as a Disconnected.
func (c *conn) send(b []byte) {
	if c.loopSide.closing {
		return
	}
	if limit := sendQueue + 2*int(c.leases.Load()); !c.out.push(b, limit) {
		c.loopSide.closing = true
		c.overOnce.Do(func() {
			// Off the loop: the close frame may wait for the slow reader.
			go c.hangUp(closeTryAgain, fmt.Sprintf("send queue full (%d frames): reading too slowly; reconnect later", limit))
		})
	}
}

// taken releases one of the connection's input tokens (loop goroutine).
func (c *conn) taken() {
	select {
	case <-c.inputs:
	default:
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
	c.out.close()
}

// frameQueue is a connection's queue of frames to write, at most the limit
// send gives: pushed and closed by the loop goroutine, taken by the writer.
// It holds no more than what waits in it (an idle connection's queue is
// empty), where a channel of sendQueue frames would hold 24 KiB from the
// start whatever waits in it.
type frameQueue struct {
	mu     sync.Mutex
	frames [][]byte
	closed bool
	pingIt bool          // the liveness sweep asks for a ping
	ready  chan struct{} // one token: there are frames, a ping is asked for, or the queue closed
}

func newFrameQueue() frameQueue { return frameQueue{ready: make(chan struct{}, 1)} }

// push queues b, or says the queue holds limit frames already.
func (q *frameQueue) push(b []byte, limit int) bool {
	q.mu.Lock()
	if len(q.frames) >= limit {
		q.mu.Unlock()
		return false
	}
	q.frames = append(q.frames, b)
	q.mu.Unlock()
	q.signal()
	return true
}

// close marks the queue closed: the writer takes what is queued, then
// hangs up.
func (q *frameQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.signal()
}

// ping asks the writer for a ping (any goroutine).
func (q *frameQueue) ping() {
	q.mu.Lock()
	q.pingIt = true
	q.mu.Unlock()
	q.signal()
}

func (q *frameQueue) signal() {
	select {
	case q.ready <- struct{}{}:
	default: // signalled already
	}
}

// take returns the frames queued, in order, whether the queue is closed
// and whether a ping was asked for (asked for once: the ask is taken);
// spare (the slice the last take returned, its frames written) is reused
// for the frames pushed next, unless it grew large.
func (q *frameQueue) take(spare [][]byte) (frames [][]byte, closed, ping bool) {
	clear(spare)
	if cap(spare) > 64 {
		spare = nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	frames = q.frames
	q.frames = spare[:0]
	ping, q.pingIt = q.pingIt, false
	return frames, q.closed, ping
}

// abort hangs up at once; the read loop then ends.
func (c *conn) abort() {
	c.stopOnce.Do(func() {
		close(c.stop)
		c.ws.Close()
	})
}

// hangUp sends a close frame with a reason and half-closes the socket; the
// read loop then discards what still arrives until the peer answers the
// close or lingerWait passes, and the socket is closed when it ends. Closing
// at once would reset a connection whose peer is still sending (a flood),
// and a reset may discard the close frame before the peer reads it. Safe
// from any goroutine (gorilla allows WriteControl alongside other writers).
func (c *conn) hangUp(code int, reason string) {
	// Marked first: a write that fails once the close frame is out must
	// not reset the connection (writeFailed).
	until := time.Now().Add(lingerWait)
	if !c.lingerUntil.CompareAndSwap(0, until.UnixNano()) {
		return // hung up already: one close frame
	}
	c.closedWith.Store(int32(code))
	msg := websocket.FormatCloseMessage(code, closeReason(reason))
	c.ws.WriteControl(websocket.CloseMessage, msg, time.Now().Add(time.Second)) // best effort
	// The writer may be corked: the close frame then joined its batch.
	c.cc.Uncork()
	if hc, ok := c.cc.Conn.(interface{ CloseWrite() error }); ok {
		hc.CloseWrite()
	}
	c.ws.SetReadDeadline(until)
}

// writeFailed ends a connection whose write failed, unless it was hung up:
// writes after the close frame fail, and the read loop ends it after the
// linger.
func (c *conn) writeFailed() {
	if c.lingerUntil.Load() == 0 {
		c.abort()
	}
}

// lingering says whether the connection was hung up; it then (re)sets the
// read deadline to the end of its linger.
func (c *conn) lingering() bool {
	until := c.lingerUntil.Load()
	if until != 0 {
		c.ws.SetReadDeadline(time.Unix(0, until))
	}
	return until != 0
}

// drain discards what the peer still sends after a hang-up, until it
// answers the close or the linger ends (read loop only).
func (c *conn) drain() {
	for c.lingering() {
		if _, _, err := c.ws.NextReader(); err != nil {
			return
		}
	}
}

// closeReason fits a reason into a close frame, on a rune boundary.
func closeReason(s string) string {
	if len(s) <= maxReasonLen {
		return s
	}
	return strings.ToValidUTF8(s[:maxReasonLen], "")
}
