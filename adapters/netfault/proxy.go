// Package netfault puts faults and an observer between real sockets, for
// end-to-end fault tests on loopback: Proxy is a TCP proxy whose links can
// be cut and restored, MessageTap splits the WebSocket traffic it forwards
// into messages, and Recorder turns the control-plane messages among them
// into a history of step operations for spec.CheckSteps.
//
// Nothing here is used by the orchestrator or the worker themselves.
package netfault

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Dir is the direction of traffic through a Proxy.
type Dir uint8

// Directions.
const (
	Up   Dir = iota + 1 // from the dialing client to the target
	Down                // from the target back to the client
)

func (d Dir) String() string {
	switch d {
	case Up:
		return "up"
	case Down:
		return "down"
	}
	return fmt.Sprintf("dir(%d)", uint8(d))
}

// A Tap observes what a Proxy forwards. Read is called with each chunk read
// from one side of a link, before the chunk is written to the other side, so
// a tap's clock reading for a chunk is never later than the chunk's arrival
// at its destination. Read and Closed for one link and direction come from
// one goroutine; different links and directions call concurrently. p is
// valid only during the call.
type Tap interface {
	Read(link uint64, dir Dir, p []byte, at time.Time)
	// Closed is called once per link, after its last Read.
	Closed(link uint64)
}

// Proxy forwards TCP connections from its own loopback address to a target
// address. Each accepted connection and its upstream connection form a link.
// Cut severs every link at once, as a network failure would (both sides see
// a reset), and refuses new connections (accepted, then reset at once, so a
// dialer fails fast rather than hanging) until Restore. Its methods are safe
// for concurrent use.
type Proxy struct {
	target string
	tap    Tap
	ln     net.Listener

	mu       sync.Mutex
	cut      bool
	closed   bool
	links    map[uint64]*link
	nextLink uint64
	accepted int // connections accepted and linked
	refused  int // connections reset because the proxy was cut
	wg       sync.WaitGroup
}

type link struct {
	id           uint64
	client, peer net.Conn
	once         sync.Once
	frozen       atomic.Bool // Freeze: what is read is dropped, nothing is forwarded
}

// sever closes both connections; with reset, as an abortive close (RST).
func (l *link) sever(reset bool) {
	l.once.Do(func() {
		for _, c := range []net.Conn{l.client, l.peer} {
			if tc, ok := c.(*net.TCPConn); ok && reset {
				tc.SetLinger(0)
			}
			c.Close()
		}
	})
}

// Listen starts a proxy on 127.0.0.1 (a free port) to target. tap may be nil.
func Listen(target string, tap Tap) (*Proxy, error) {
	if target == "" {
		return nil, errors.New("netfault: no target address")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("netfault: listen: %w", err)
	}
	p := &Proxy{target: target, tap: tap, ln: ln, links: map[uint64]*link{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's listen address (host:port).
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Target is the address the proxy forwards to.
func (p *Proxy) Target() string { return p.target }

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // Close
		}
		p.mu.Lock()
		if p.closed || p.cut {
			if p.cut {
				p.refused++
			}
			p.mu.Unlock()
			reset(c)
			continue
		}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.serve(c)
	}
}

func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

// serve dials the target for one accepted connection and forwards both ways
// until either side fails, the link is cut or the proxy closes.
func (p *Proxy) serve(c net.Conn) {
	defer p.wg.Done()
	peer, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		reset(c) // the target is down: the client sees its dial fail
		return
	}
	p.mu.Lock()
	if p.closed || p.cut {
		if p.cut {
			p.refused++
		}
		p.mu.Unlock()
		reset(c)
		reset(peer)
		return
	}
	p.nextLink++
	l := &link{id: p.nextLink, client: c, peer: peer}
	p.links[l.id] = l
	p.accepted++
	p.mu.Unlock()

	var both sync.WaitGroup
	both.Add(2)
	go func() { defer both.Done(); p.pipe(l, Up, c, peer) }()
	go func() { defer both.Done(); p.pipe(l, Down, peer, c) }()
	both.Wait()
	p.mu.Lock()
	delete(p.links, l.id)
	p.mu.Unlock()
	if p.tap != nil {
		p.tap.Closed(l.id)
	}
}

// pipe copies src to dst through the tap; when either fails the link ends
// (a half-closed link is of no use to the protocols tested here).
func (p *Proxy) pipe(l *link, dir Dir, src, dst net.Conn) {
	defer l.sever(false)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !l.frozen.Load() {
			if p.tap != nil {
				p.tap.Read(l.id, dir, buf[:n], time.Now())
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				l.sever(true)
			}
			return
		}
	}
}

// Cut severs every link now (both sides get a reset) and refuses new
// connections until Restore. It returns how many links it severed.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	p.cut = true
	links := make([]*link, 0, len(p.links))
	for _, l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	for _, l := range links {
		l.sever(true)
	}
	return len(links)
}

// Freeze stops every live link forwarding, in both directions, while its
// sockets stay open: what either side sends is read and dropped, as when
// the peer's host died without a FIN or its process was stopped. Links
// made later forward as usual. It returns how many links it froze.
func (p *Proxy) Freeze() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.links {
		l.frozen.Store(true)
	}
	return len(p.links)
}

// Restore lets new connections through again after Cut.
func (p *Proxy) Restore() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

// Links is the number of live links.
func (p *Proxy) Links() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// Accepted is how many connections have been linked to the target so far.
func (p *Proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// Refused is how many connections were reset because the proxy was cut: a
// client that dials again after a Cut shows here, so a test can tell that
// the client noticed the cut.
func (p *Proxy) Refused() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refused
}

// Close stops listening, severs every link and waits for the proxy's
// goroutines. It is safe to call more than once.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	links := make([]*link, 0, len(p.links))
	for _, l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	err := p.ln.Close()
	for _, l := range links {
		l.sever(true)
	}
	p.wg.Wait()
	return err
}
