package orchestrator_test

import (
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/client"
)

// TestTLSConnDeadlines: over TLS (SPEC §12, §14), a connection that never
// starts its handshake is closed by the header deadline, and an h2
// connection that completes its handshake and preface and then sends
// nothing is closed by the idle deadline (a GOAWAY, then 1 s), while the
// operator API answers over TLS.
func TestTLSConnDeadlines(t *testing.T) {
	const header, idle, slack = time.Second, 2 * time.Second, 3 * time.Second
	cert, roots := testCert(t)
	d, err := orchestrator.Start(orchestrator.Options{Addr: "127.0.0.1:0", StorePath: filepath.Join(t.TempDir(), "t.db"),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), AdminToken: adminToken,
		TLS: &tls.Config{Certificates: []tls.Certificate{cert}}, HeaderTimeout: header, IdleTimeout: idle})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()

	// closedWithin reads c until the server closes it and checks when.
	closedWithin := func(what string, c net.Conn, from time.Time, min, max time.Duration) {
		t.Helper()
		c.SetReadDeadline(time.Now().Add(max + 5*time.Second))
		_, err := io.Copy(io.Discard, c)
		took := time.Since(from)
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatalf("%s: still open after %v", what, took)
			}
		}
		if took < min || took > max {
			t.Fatalf("%s: closed after %v, want %v..%v", what, took, min, max)
		}
	}

	silent, err := net.Dial("tcp", d.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	idleConn, err := tls.Dial("tcp", d.Addr(), &tls.Config{RootCAs: roots, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	defer idleConn.Close()
	if _, err := io.WriteString(idleConn, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00\x00\x00\x00\x04\x01\x00\x00\x00\x00"); err != nil {
		t.Fatal(err)
	}
	idleFrom, silentFrom := time.Now(), time.Now()

	// Meanwhile an operator is served.
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true}}
	op, err := client.New(d.DataURL(), adminToken, client.WithHTTPClient(hc))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := op.Workers(t.Context()); err != nil {
		t.Fatalf("API over TLS: %v", err)
	}

	closedWithin("a connection that never starts its TLS handshake", silent, silentFrom, header-500*time.Millisecond, header+slack)
	closedWithin("an idle h2 connection over TLS", idleConn, idleFrom, idle, idle+time.Second+slack)
}
