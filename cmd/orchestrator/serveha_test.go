package main

// The standby's answers with and without a leader (SPEC §7), and the
// listener handed from the standby's server to the orchestrator's.

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestStandbyAnswers(t *testing.T) {
	sb := newStandby("http://10.0.0.9:7420", "mtok")
	sb.epoch.Store(7)
	ask := func(method, path string, header ...string) *http.Response {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(method, path, nil)
		for i := 0; i+1 < len(header); i += 2 {
			r.Header.Set(header[i], header[i+1])
		}
		sb.ServeHTTP(w, r)
		return w.Result()
	}
	body := func(r *http.Response) string { b, _ := io.ReadAll(r.Body); return strings.TrimSpace(string(b)) }
	for _, leader := range []string{"", "http://10.0.0.5:7420"} {
		sb.leader.Store(&leader)
		if r := ask("GET", "/livez"); r.StatusCode != 200 {
			t.Errorf("leader %q: /livez %d", leader, r.StatusCode)
		}
		wantReady := "standby; no orchestrator leads now"
		if leader != "" {
			wantReady = "standby; leader at " + leader
		}
		if r := ask("GET", "/readyz"); r.StatusCode != 503 || body(r) != wantReady {
			t.Errorf("leader %q: /readyz %d %q; want 503 %q", leader, r.StatusCode, body(r), wantReady)
		}
		// /metrics: tether_leader 0 and the leader's epoch, behind the
		// metrics token (SPEC §16).
		if r := ask("GET", "/metrics"); r.StatusCode != 401 {
			t.Errorf("leader %q: /metrics without the token %d; want 401", leader, r.StatusCode)
		}
		if r := ask("GET", "/metrics", "Authorization", "Bearer mtok"); r.StatusCode != 200 {
			t.Errorf("leader %q: /metrics %d; want 200", leader, r.StatusCode)
		} else if m := body(r); !regexp.MustCompile(`(?m)^tether_leader 0$`).MatchString(m) || !regexp.MustCompile(`(?m)^tether_leader_epoch 7$`).MatchString(m) {
			t.Errorf("leader %q: /metrics lacks tether_leader 0 and tether_leader_epoch 7:\n%s", leader, m)
		}
		for _, path := range []string{"/control", "/data/x", "/bundle/f", "/step/definition"} {
			r := ask("GET", path)
			if r.StatusCode != 503 || r.Header.Get(leaderHeader) != leader || !strings.Contains(body(r), `"leader":"`+leader+`"`) {
				t.Errorf("leader %q: %s %d, %s %q; want 503 naming the leader", leader, path, r.StatusCode, leaderHeader, r.Header.Get(leaderHeader))
			}
		}
		// The status page's pages go to the leader's (SPEC §18); its
		// actions (POST) are refused as any other write.
		for _, path := range []string{"/", "/runs/run-1", "/workers"} {
			r := ask("GET", path)
			switch {
			case leader == "" && r.StatusCode != 503:
				t.Errorf("no leader: GET %s %d; want 503", path, r.StatusCode)
			case leader != "" && (r.StatusCode != 307 || r.Header.Get("Location") != leader+path):
				t.Errorf("leader %q: GET %s %d to %q; want 307 to the same page there", leader, path, r.StatusCode, r.Header.Get("Location"))
			}
		}
		if r := ask("POST", "/runs/run-1/cancel"); r.StatusCode != 503 {
			t.Errorf("leader %q: POST /runs/run-1/cancel %d; want 503", leader, r.StatusCode)
		}
		r := ask("POST", "/api/runs?file=a.yaml")
		switch {
		case leader == "" && r.StatusCode != 503:
			t.Errorf("no leader: /api/runs %d; want 503", r.StatusCode)
		case leader != "" && (r.StatusCode != 307 || r.Header.Get("Location") != leader+"/api/runs?file=a.yaml"):
			t.Errorf("leader %q: /api/runs %d to %q; want 307 to the same path there", leader, r.StatusCode, r.Header.Get("Location"))
		}
	}
}

func TestConnFeedHandsOver(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := newConnFeed(ln)
	defer f.close()
	dial := func() {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	first, second := f.listener(), f.listener()
	dial()
	c, err := first.Accept()
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	first.Close()
	if _, err := first.Accept(); err != net.ErrClosed {
		t.Fatalf("a closed view accepts: %v", err)
	}
	dial() // the address is still bound: the next view takes it
	if c, err = second.Accept(); err != nil {
		t.Fatalf("the next view: %v", err)
	}
	c.Close()
	f.close()
	if _, err := second.Accept(); err == nil {
		t.Fatal("a view of a closed feed accepts")
	}
}

// TestStandbyClosesEachConnection: a standby's server answers with
// Connection: close, so no client holds an idle connection to it when it
// leads and hands the listener to the orchestrator's server (a request
// sent on such a connection as it closes meets EOF, not the leader).
func TestStandbyClosesEachConnection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := standbyServer(newStandby("http://127.0.0.1:1", ""), nil, time.Second, slog.New(slog.DiscardHandler))
	go srv.Serve(ln)
	defer srv.Close()
	resp, err := http.Get("http://" + ln.Addr().String() + "/livez")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !resp.Close {
		t.Fatalf("standby /livez: %d, Connection: close %v; want 200 and the connection closed", resp.StatusCode, resp.Close)
	}
}

// TestStandbyStopAnswersAccepted: when a standby leads, a connection its
// server accepted but whose request it had not yet read is still answered
// (a 503 naming the leader-to-be), not closed: the client of a take-over's
// moment gets an answer, not EOF. A connection made after the stop began
// waits in the feed for the next view (the orchestrator's server).
func TestStandbyStopAnswersAccepted(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := newConnFeed(ln)
	defer f.close()
	srv := standbyServer(newStandby("http://127.0.0.1:1", ""), nil, 5*time.Second, slog.New(slog.DiscardHandler))
	s := serveStandby(srv, f.listener(), false, slog.New(slog.DiscardHandler))
	early, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer early.Close()
	busy := func() int { s.mu.Lock(); defer s.mu.Unlock(); return len(s.busy) }
	for deadline := time.Now().Add(10 * time.Second); busy() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the standby's server never accepted the connection")
		}
	}
	stopped := make(chan time.Duration, 1)
	go func() { t0 := time.Now(); s.stop(3 * time.Second); stopped <- time.Since(t0) }()
	<-s.served // the stop has begun: the server accepts no more
	late, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	if _, err := io.WriteString(early, "GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	early.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(early)
	if !strings.HasPrefix(string(b), "HTTP/1.1 503") {
		t.Fatalf("a request accepted before the stop: %q, %v; want a 503 answer", b, err)
	}
	select {
	case d := <-stopped:
		if d >= 3*time.Second {
			t.Errorf("the stop waited its whole bound (%s) with every connection answered", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stop did not end")
	}
	next := f.listener() // the orchestrator's view takes the later connection
	c, err := next.Accept()
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}
