package orchestrator

// The listener under the one HTTP server (SPEC §12, §14): a cap on
// concurrent TCP connections, in all and per source address, counting every
// accepted connection until it is closed (hijacked control WebSockets
// included); and a per-write progress deadline on every connection.

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// refusalLogInterval bounds how often refused connections are logged:
	// the first refusal at once, then one summary line per interval at most.
	refusalLogInterval = 10 * time.Second
	// refusalWriteTimeout bounds writing the refusal to a connection over
	// the cap (it fits in a fresh socket's send buffer).
	refusalWriteTimeout = 100 * time.Millisecond
)

// Kinds of refused connections.
const (
	refusedTotal   = "total"        // the listener's cap (Options.MaxTCPConns)
	refusedPerAddr = "per-address"  // one source address's share (Options.MaxConnsPerAddr)
	refusalStatus  = "HTTP/1.1 503" // how a refused connection's answer begins
)

// capListener accepts connections up to a total and a per-address cap. A
// connection over either cap is accepted, told why in a short HTTP/1.1 503
// answer, and closed at once, so it neither waits in the kernel's backlog
// nor holds a slot; refusals are counted and logged at a bounded rate.
type capListener struct {
	net.Listener
	max, perAddr  int           // caps; perAddr <= max
	writeProgress time.Duration // per-write deadline of accepted connections; 0: none
	log           *slog.Logger

	mu     sync.Mutex
	total  int
	byAddr map[netip.Addr]int

	refused  [2]atomic.Int64 // by kind: total, per-address
	logMu    sync.Mutex
	lastLog  time.Time
	unlogged [2]int64 // refusals since the last log line, by kind
}

func newCapListener(ln net.Listener, max, perAddr int, writeProgress time.Duration, log *slog.Logger) *capListener {
	return &capListener{Listener: ln, max: max, perAddr: min(perAddr, max), writeProgress: writeProgress, log: log, byAddr: map[netip.Addr]int{}}
}

// Accept returns the next connection within the caps; connections over a
// cap are refused here and never returned.
func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		addr := sourceAddr(c)
		l.mu.Lock()
		kind := ""
		switch {
		case l.total >= l.max:
			kind = refusedTotal
		case l.byAddr[addr] >= l.perAddr:
			kind = refusedPerAddr
		default:
			l.total++
			l.byAddr[addr]++
		}
		l.mu.Unlock()
		if kind == "" {
			return &capConn{Conn: c, l: l, addr: addr, writeProgress: l.writeProgress}, nil
		}
		l.refuse(c, kind)
	}
}

// refuse counts a connection over a cap, logs it at a bounded rate, and
// answers and closes it (counted first, so that whoever saw the answer
// sees the count).
func (l *capListener) refuse(c net.Conn, kind string) {
	limit, what, k := l.max, "the orchestrator's connection cap", 0
	if kind == refusedPerAddr {
		limit, what, k = l.perAddr, "the connection cap per source address", 1
	}
	l.refused[k].Add(1)
	l.logRefusal(c, kind, limit, k)
	reason := fmt.Sprintf("too many connections: %s of %d is reached; retry later\n", what, limit)
	c.SetWriteDeadline(time.Now().Add(refusalWriteTimeout))
	fmt.Fprintf(c, "%s Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nRetry-After: 1\r\nContent-Length: %d\r\n\r\n%s",
		refusalStatus, len(reason), reason)
	c.Close()
}

// logRefusal logs the first refusal, then at most one line per
// refusalLogInterval with the refusals since the last line.
func (l *capListener) logRefusal(c net.Conn, kind string, limit, k int) {
	l.logMu.Lock()
	l.unlogged[k]++
	now := time.Now()
	if now.Sub(l.lastLog) < refusalLogInterval {
		l.logMu.Unlock()
		return
	}
	counts := l.unlogged
	l.unlogged = [2]int64{}
	l.lastLog = now
	l.logMu.Unlock()
	total, perAddr := l.Refused()
	l.log.Warn("connection refused over the cap", "remote", c.RemoteAddr().String(), "cap", kind, "limit", limit,
		"refused_since_last_log", counts[0]+counts[1], "refused_over_total_cap", total, "refused_over_address_cap", perAddr)
}

// Refused returns how many connections were refused over the total cap and
// over the per-address cap since the listener started.
func (l *capListener) Refused() (total, perAddr int64) {
	return l.refused[0].Load(), l.refused[1].Load()
}

// open returns the number of connections held.
func (l *capListener) open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}

func (l *capListener) release(addr netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
	if l.byAddr[addr]--; l.byAddr[addr] <= 0 {
		delete(l.byAddr, addr)
	}
}

// sourceAddr is the connection's remote IP address (IPv4-mapped IPv6
// addresses as IPv4); the zero Addr if it has none.
func sourceAddr(c net.Conn) netip.Addr {
	if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		if a, ok := netip.AddrFromSlice(ta.IP); ok {
			return a.Unmap()
		}
	}
	if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}

// capConn is an accepted connection: it gives its slot back when closed
// (once), and bounds each write that runs under no deadline of its user.
type capConn struct {
	net.Conn
	l             *capListener
	addr          netip.Addr
	writeProgress time.Duration
	explicit      atomic.Bool // the user set a write deadline, which then rules
	closed        atomic.Bool
}

// Write, unless the user set a write deadline, allows writeProgress
// without progress: the deadline is renewed as long as some bytes went
// out, so a peer that stops reading is cut off after that long, while a
// long response to a slow reader that keeps reading is never cut (an
// absolute write timeout would). The HTTP/2 server sets its own per-write
// deadlines (WriteByteTimeout), and the control plane's WebSocket writer
// its own per frame.
func (c *capConn) Write(b []byte) (int, error) {
	if c.writeProgress <= 0 || c.explicit.Load() {
		return c.Conn.Write(b)
	}
	n := 0
	for {
		c.Conn.SetWriteDeadline(time.Now().Add(c.writeProgress))
		m, err := c.Conn.Write(b[n:])
		n += m
		if n == len(b) || m == 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
			return n, err
		}
	}
}

func (c *capConn) SetWriteDeadline(t time.Time) error {
	c.explicit.Store(!t.IsZero())
	return c.Conn.SetWriteDeadline(t)
}

func (c *capConn) SetDeadline(t time.Time) error {
	c.explicit.Store(!t.IsZero())
	return c.Conn.SetDeadline(t)
}

// CloseWrite half-closes a TCP connection, as net/http does before closing
// one whose request body it did not read.
func (c *capConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (c *capConn) Close() error {
	err := c.Conn.Close()
	if c.closed.CompareAndSwap(false, true) {
		c.l.release(c.addr)
	}
	return err
}

// h2WritePieceBytes is the most of a response written to an HTTP/2 stream
// under one write deadline (h2StreamWrites).
const h2WritePieceBytes = 64 << 10

// h2StreamWrites is an HTTP/2 response whose every write, in pieces of at
// most h2WritePieceBytes, and flush must complete within timeout, and its
// final flush within timeout of the handler's return; between writes no
// deadline runs (a stream may pause). A client that withholds its
// flow-control window (even an initial window of 0) so has its stream
// reset instead of holding the handler, its stream slot and its
// connection forever; the connection-level deadlines cannot see this, as
// the connection itself keeps moving.
type h2StreamWrites struct {
	http.ResponseWriter
	rc      *http.ResponseController // of the wrapped writer
	timeout time.Duration
}

func (w *h2StreamWrites) Write(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		k := min(len(p)-n, h2WritePieceBytes)
		_ = w.rc.SetWriteDeadline(time.Now().Add(w.timeout))
		m, err := w.ResponseWriter.Write(p[n : n+k])
		_ = w.rc.SetWriteDeadline(time.Time{})
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func (w *h2StreamWrites) Flush() {
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.timeout))
	_ = w.rc.Flush()
	_ = w.rc.SetWriteDeadline(time.Time{})
}

// Unwrap lets http.ResponseController reach the stream.
func (w *h2StreamWrites) Unwrap() http.ResponseWriter { return w.ResponseWriter }
