package wire

import (
	"net"
	"sync"
)

// corkLimit is the most a corked connection holds before it writes anyway.
const corkLimit = 64 << 10

// CorkConn is a net.Conn under a WebSocket connection that can gather the
// frames of several messages into one write: between Cork and Uncork,
// writes are buffered (up to 64 KiB, then written), and Uncork writes what
// was gathered. A writer goroutine corks, writes every message queued for
// its connection, and uncorks, so a burst of messages costs the peer one
// wakeup and both ends one system call instead of one per message. Outside
// a cork, writes go straight through. It is safe for concurrent use (a
// control frame may be written by another goroutine; it joins the batch).
type CorkConn struct {
	net.Conn
	mu     sync.Mutex
	corked bool
	buf    []byte
	err    error // a buffered write's failure, returned by Uncork
}

// NewCorkConn wraps c.
func NewCorkConn(c net.Conn) *CorkConn { return &CorkConn{Conn: c} }

// Write writes p, or buffers it while corked.
func (c *CorkConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.corked {
		return c.Conn.Write(p)
	}
	if c.err != nil {
		return 0, c.err
	}
	c.buf = append(c.buf, p...)
	if len(c.buf) >= corkLimit {
		c.err = c.flush()
	}
	return len(p), nil
}

// Cork starts gathering writes. Cork and Uncork of a nil *CorkConn do
// nothing.
func (c *CorkConn) Cork() {
	if c == nil {
		return
	}
	c.mu.Lock()
	c.corked = true
	c.mu.Unlock()
}

// Uncork writes what was gathered and lets writes through again. It
// returns the error of any write since Cork; the connection is then broken.
func (c *CorkConn) Uncork() error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.corked = false
	err := c.err
	c.err = nil
	if err == nil {
		err = c.flush()
	}
	return err
}

func (c *CorkConn) flush() error {
	if len(c.buf) == 0 {
		return nil
	}
	_, err := c.Conn.Write(c.buf)
	if cap(c.buf) > corkLimit {
		c.buf = nil // a one-off large batch need not stay allocated
	} else {
		c.buf = c.buf[:0]
	}
	return err
}

// WriteQueued writes first and then every frame already waiting on out, with
// write, as one corked write: the frames queued at one moment (a batch's
// messages for one peer) leave together. It does not wait for more frames.
// open is false when it found out closed; the frames before that were
// written.
func (c *CorkConn) WriteQueued(first []byte, out <-chan []byte, write func([]byte) error) (open bool, err error) {
	c.Cork()
	b, ok := first, true
	for {
		if err := write(b); err != nil {
			c.Uncork()
			return true, err
		}
		select {
		case b, ok = <-out:
			if ok {
				continue
			}
		default:
		}
		break
	}
	return ok, c.Uncork()
}

// WriteAll writes frames, with write, as one corked write; it stops at the
// first error. A nil CorkConn does not gather: write writes each frame.
func (c *CorkConn) WriteAll(frames [][]byte, write func([]byte) error) error {
	c.Cork()
	for _, b := range frames {
		if err := write(b); err != nil {
			c.Uncork()
			return err
		}
	}
	return c.Uncork()
}
