package main

// The standby's answers with and without a leader (SPEC §7), and the
// listener handed from the standby's server to the orchestrator's.

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestStandbyAnswers(t *testing.T) {
	sb := &standby{}
	ask := func(method, path string) *http.Response {
		w := httptest.NewRecorder()
		sb.ServeHTTP(w, httptest.NewRequest(method, path, nil))
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
		for _, path := range []string{"/control", "/data/x", "/bundle/f", "/metrics", "/"} {
			r := ask("GET", path)
			if r.StatusCode != 503 || r.Header.Get(leaderHeader) != leader || !strings.Contains(body(r), `"leader":"`+leader+`"`) {
				t.Errorf("leader %q: %s %d, %s %q; want 503 naming the leader", leader, path, r.StatusCode, leaderHeader, r.Header.Get(leaderHeader))
			}
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
