package netfault

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

const testTimeout = 10 * time.Second

// echoServer echoes every line back until the connection ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

// roundTrip writes a line and reads it back.
func roundTrip(c net.Conn, line string) (string, error) {
	c.SetDeadline(time.Now().Add(testTimeout))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return "", err
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	return string(bytes.TrimSuffix([]byte(got), []byte("\n"))), err
}

// recordingTap keeps what it saw, per direction.
type recordingTap struct {
	mu     sync.Mutex
	seen   map[Dir]*bytes.Buffer
	closed []uint64
}

func (r *recordingTap) Read(link uint64, dir Dir, p []byte, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.seen == nil {
		r.seen = map[Dir]*bytes.Buffer{Up: {}, Down: {}}
	}
	r.seen[dir].Write(p)
}

func (r *recordingTap) Closed(link uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = append(r.closed, link)
}

func (r *recordingTap) snapshot() (up, down string, closed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.seen == nil {
		return "", "", len(r.closed)
	}
	return r.seen[Up].String(), r.seen[Down].String(), len(r.closed)
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// TestProxyCutRestore: bytes pass both ways and the tap sees them; Cut
// severs the live link (the client's next read fails) and refuses new
// connections (counted); Restore lets a new connection through; Close ends
// everything.
func TestProxyCutRestore(t *testing.T) {
	tap := &recordingTap{}
	p, err := Listen(echoServer(t), tap)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	c1, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	if got, err := roundTrip(c1, "hello"); err != nil || got != "hello" {
		t.Fatalf("through the proxy: %q, %v", got, err)
	}
	if up, down, _ := tap.snapshot(); up != "hello\n" || down != "hello\n" {
		t.Errorf("tap saw up %q, down %q; want the line each way", up, down)
	}
	if p.Links() != 1 || p.Accepted() != 1 {
		t.Errorf("links %d, accepted %d; want 1 and 1", p.Links(), p.Accepted())
	}

	if n := p.Cut(); n != 1 {
		t.Errorf("Cut severed %d links, want 1", n)
	}
	if _, err := roundTrip(c1, "after the cut"); err == nil {
		t.Fatal("a severed link still carried a line")
	}
	waitUntil(t, "the tap to hear the link close", func() bool { _, _, closed := tap.snapshot(); return closed == 1 })
	if p.Links() != 0 {
		t.Errorf("links after Cut: %d", p.Links())
	}
	// A dial while cut connects (the listener accepts) and is reset at once.
	c2, err := net.Dial("tcp", p.Addr())
	if err == nil {
		_, err = roundTrip(c2, "while cut")
		c2.Close()
	}
	if err == nil {
		t.Fatal("a connection made while cut carried a line")
	}
	waitUntil(t, "the refused connection to be counted", func() bool { return p.Refused() == 1 })

	p.Restore()
	c3, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if got, err := roundTrip(c3, "restored"); err != nil || got != "restored" {
		t.Fatalf("after Restore: %q, %v", got, err)
	}
	if p.Accepted() != 2 {
		t.Errorf("accepted %d, want 2", p.Accepted())
	}

	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := roundTrip(c3, "after close"); err == nil {
		t.Error("a link outlived Close")
	}
	if c, err := net.Dial("tcp", p.Addr()); err == nil {
		_, err = roundTrip(c, "x")
		c.Close()
		if err == nil {
			t.Error("the proxy still forwards after Close")
		}
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestProxyTargetDown: with nothing at the target, a client's connection
// is reset rather than left hanging, and nothing is counted as linked.
func TestProxyTargetDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	p, err := Listen(dead, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err == nil { // or the reset came before the dial returned
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(testTimeout))
		_, err = c.Read(make([]byte, 1))
	}
	var ne net.Error
	if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("read through a proxy to a dead target: %v, want a reset or EOF", err)
	}
	if p.Accepted() != 0 {
		t.Errorf("accepted %d, want 0", p.Accepted())
	}
	if _, err := Listen("", nil); err == nil {
		t.Error("Listen without a target: no error")
	}
}
