package orchestrator

import (
	"bufio"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// dialFrom dials addr from a local loopback address (all of 127.0.0.0/8
// is routed to lo on Linux).
func dialFrom(t *testing.T, from, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial from %s: %v", from, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// refusal reads what the listener said to a connection over a cap: its
// 503 answer's body, or "" if the connection was not closed by a refusal
// within a second.
func refusal(t *testing.T, c net.Conn) string {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("refusal status %d, want 503", resp.StatusCode)
	}
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("after the refusal: %v, want EOF (the connection closed)", err)
	}
	return string(b)
}

// TestCapListener: the total cap and the per-address share hold, a
// connection over either is answered 503 naming the cap and closed at once,
// refusals are counted, and a closed connection (closed twice) gives its
// slot back once.
func TestCapListener(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var logged syncBuf
	ln := newCapListener(raw, 4, 3, 0, slog.New(slog.NewTextHandler(&logged, nil)))
	defer ln.Close()
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	addr := raw.Addr().String()
	accept := func(from string) net.Conn {
		t.Helper()
		dialFrom(t, from, addr)
		select {
		case c := <-accepted:
			return c
		case <-time.After(5 * time.Second):
			t.Fatalf("a connection from %s was not accepted", from)
			return nil
		}
	}
	var held []net.Conn
	for range 3 {
		held = append(held, accept("127.0.0.2"))
	}
	if got := refusal(t, dialFrom(t, "127.0.0.2", addr)); !strings.Contains(got, "per source address of 3") {
		t.Fatalf("4th connection from 127.0.0.2: refusal %q, want the per-address cap of 3", got)
	}
	accept("127.0.0.1") // another address still gets the last slot
	if got := refusal(t, dialFrom(t, "127.0.0.3", addr)); !strings.Contains(got, "connection cap of 4") {
		t.Fatalf("5th connection: refusal %q, want the total cap of 4", got)
	}
	if total, perAddr := ln.Refused(); total != 1 || perAddr != 1 {
		t.Fatalf("Refused() = %d, %d; want 1, 1", total, perAddr)
	}
	held[0].Close()
	held[0].Close() // a second Close gives back nothing more
	if n := ln.open(); n != 3 {
		t.Fatalf("%d connections held after one closed, want 3", n)
	}
	accept("127.0.0.3")
	if n := ln.open(); n != 4 {
		t.Fatalf("%d connections held, want 4", n)
	}
	if got := refusal(t, dialFrom(t, "127.0.0.2", addr)); got == "" {
		t.Fatal("a connection over the total cap was not refused")
	}
	select {
	case c := <-accepted:
		t.Fatalf("a connection over the cap was accepted: %v", c.RemoteAddr())
	default:
	}
	// Three refusals within refusalLogInterval: one log line, the first.
	if n := strings.Count(logged.String(), "connection refused over the cap"); n != 1 {
		t.Fatalf("3 refusals logged in %d lines, want 1:\n%s", n, logged.String())
	}
}

// syncBuf is a log sink safe for concurrent use.
type syncBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestCapConnWriteProgress: the per-write deadline cuts a peer that reads
// nothing within about the deadline, but not a slow reader that keeps
// reading, even when one write of 2 MiB takes many times the deadline (an
// absolute write timeout, or one per write call, would cut it).
func TestCapConnWriteProgress(t *testing.T) {
	const progress = 300 * time.Millisecond
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := newCapListener(raw, 10, 10, progress, slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer ln.Close()
	serve := func() (net.Conn, net.Conn) {
		client := dialFrom(t, "127.0.0.1", raw.Addr().String())
		server, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { server.Close() })
		// Small socket buffers, so that the writer waits for the reader.
		client.(*net.TCPConn).SetReadBuffer(16 << 10)
		server.(*capConn).Conn.(*net.TCPConn).SetWriteBuffer(16 << 10)
		return client, server
	}

	// A peer that reads nothing: the writes stop within the deadline once
	// the socket buffers are full.
	_, server := serve()
	chunk := make([]byte, 64<<10)
	start := time.Now()
	var werr error
	for time.Since(start) < 20*time.Second {
		last := time.Now()
		if _, werr = server.Write(chunk); werr != nil {
			if blocked := time.Since(last); blocked > progress+2*time.Second {
				t.Fatalf("the stalled write failed after %v, want about %v", blocked, progress)
			}
			break
		}
	}
	if !errors.Is(werr, os.ErrDeadlineExceeded) {
		t.Fatalf("writing to a peer that reads nothing: %v, want a deadline error", werr)
	}

	// A slow reader that keeps reading gets everything.
	client, server := serve()
	const total = 2 << 20
	done := make(chan error, 1)
	go func() { // one write of it all: the deadline is renewed while bytes go out
		_, err := server.Write(make([]byte, total))
		server.Close()
		done <- err
	}()
	start = time.Now()
	got, buf := 0, make([]byte, 16<<10)
	for {
		n, err := client.Read(buf)
		got += n
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("slow reader: %v after %d bytes", err, got)
		}
		time.Sleep(5 * time.Millisecond) // about 3 MiB/s at most
	}
	if err := <-done; err != nil {
		t.Fatalf("writing to a slow reader: %v", err)
	}
	if got != total {
		t.Fatalf("slow reader got %d bytes, want %d", got, total)
	}
	if took := time.Since(start); took < 2*progress {
		t.Fatalf("the slow read took only %v, not the more than %v the test needs", took, 2*progress)
	}
}

// TestStartHTTPDefaults: zero Options give the documented limits (SPEC §12).
func TestStartHTTPDefaults(t *testing.T) {
	d, err := Start(Options{Addr: "127.0.0.1:0", StorePath: filepath.Join(t.TempDir(), "t.db"), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	s := d.srv
	if s.IdleTimeout != DefaultIdleTimeout || s.ReadHeaderTimeout != DefaultHeaderTimeout || s.MaxHeaderBytes != maxHeaderBytes ||
		s.ReadTimeout != 0 || s.WriteTimeout != 0 {
		t.Errorf("server timeouts: idle %v, header %v, read %v, write %v, header bytes %d", s.IdleTimeout, s.ReadHeaderTimeout, s.ReadTimeout, s.WriteTimeout, s.MaxHeaderBytes)
	}
	if h := s.HTTP2; h.MaxConcurrentStreams != h2MaxStreams || h.SendPingTimeout != h2PingAfter || h.PingTimeout != h2PingTimeout ||
		h.WriteByteTimeout != DefaultWriteTimeout || h.MaxReceiveBufferPerConnection != h2UploadBufferConnBytes ||
		h.MaxReceiveBufferPerStream != h2UploadBufferStreamBytes || h.MaxReadFrameSize != h2MaxFrameBytes {
		t.Errorf("HTTP/2 config %+v", *h)
	}
	if d.ln.max != defaultMaxConns+DefaultExtraTCPConns || d.ln.perAddr != (defaultMaxConns+DefaultExtraTCPConns)*3/4 ||
		d.ln.writeProgress != DefaultWriteTimeout || d.opts.BodyTimeout != DefaultBodyTimeout {
		t.Errorf("listener caps %d total, %d per address, write progress %v; body timeout %v", d.ln.max, d.ln.perAddr, d.ln.writeProgress, d.opts.BodyTimeout)
	}
}
