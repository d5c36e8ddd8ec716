package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tether-run/tether/client"
)

// standby answers as a standby orchestrator does (SPEC §11): 307 to the same
// path with LeaderHeader naming leader, its Location pointing at location.
func standby(t *testing.T, leader, location string, hits *atomic.Int32) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if leader == "" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			json.NewEncoder(w).Encode(map[string]string{"error": "standby", "leader": "", "message": "this orchestrator is a standby and no orchestrator leads now"})
			return
		}
		w.Header().Set(client.LeaderHeader, leader)
		w.Header().Set("Location", location+r.URL.Path)
		w.WriteHeader(http.StatusTemporaryRedirect)
	}))
	t.Cleanup(s.Close)
	return s
}

// leaderServer accepts POST /api/runs with the token and the definition,
// counting what it got.
func leaderServer(t *testing.T, token, definition string, hits *atomic.Int32) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		b, _ := io.ReadAll(r.Body)
		if r.Header.Get("Authorization") != "Bearer "+token || r.URL.Path != "/api/runs" || string(b) != definition {
			t.Errorf("leader got %s %s auth %q body %q", r.Method, r.URL.Path, r.Header.Get("Authorization"), b)
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]string{"run": "run-1"})
	}))
	t.Cleanup(s.Close)
	return s
}

// TestClientFollowsLeader: a standby's 307 with LeaderHeader sends the
// request, its body and the token to the leader named there, never to the
// redirect's Location (a decoy here: the http.Client would follow it, and
// keep the token, as its host is the same), and the client then goes to the
// leader first.
func TestClientFollowsLeader(t *testing.T) {
	const tok, def = "operator-token-0123456789", "name: w\nsteps: []\n"
	var leaderHits, decoyHits, standbyHits atomic.Int32
	leader := leaderServer(t, tok, def, &leaderHits)
	decoy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		decoyHits.Add(1)
		t.Errorf("the decoy got %s %s with auth %q", r.Method, r.URL.Path, r.Header.Get("Authorization"))
	}))
	t.Cleanup(decoy.Close)
	sb := standby(t, leader.URL, decoy.URL, &standbyHits)
	c, err := client.New(sb.URL, tok)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		run, err := c.Submit(context.Background(), "w.yaml", []byte(def))
		if err != nil || run != "run-1" {
			t.Fatalf("submit %d: %q, %v", i, run, err)
		}
	}
	if leaderHits.Load() != 2 || standbyHits.Load() != 1 || decoyHits.Load() != 0 {
		t.Fatalf("leader %d, standby %d, decoy %d requests; want 2, 1, 0", leaderHits.Load(), standbyHits.Load(), decoyHits.Load())
	}
	if c.URL() != leader.URL {
		t.Fatalf("URL() = %s, want the leader %s", c.URL(), leader.URL)
	}
}

// TestClientTriesEveryURL: of the URLs given, one that refuses connections
// and a standby that knows no leader are passed over for the next.
func TestClientTriesEveryURL(t *testing.T) {
	const tok, def = "operator-token-0123456789", "name: w\nsteps: []\n"
	var leaderHits, standbyHits atomic.Int32
	leader := leaderServer(t, tok, def, &leaderHits)
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close() // its port refuses connections now
	sb := standby(t, "", "", &standbyHits)
	c, err := client.New(dead.URL, tok, client.WithURLs(sb.URL, leader.URL))
	if err != nil {
		t.Fatal(err)
	}
	run, err := c.Submit(context.Background(), "w.yaml", []byte(def))
	if err != nil || run != "run-1" {
		t.Fatalf("submit: %q, %v", run, err)
	}
	if leaderHits.Load() != 1 || standbyHits.Load() != 1 {
		t.Fatalf("leader %d, standby %d requests; want 1 each", leaderHits.Load(), standbyHits.Load())
	}
}

// TestClientLeaderHopsBounded: standbys that point at each other end in an
// error after a few hops, not a loop.
func TestClientLeaderHopsBounded(t *testing.T) {
	var hits atomic.Int32
	var bURL atomic.Value
	a := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set(client.LeaderHeader, bURL.Load().(string))
		w.WriteHeader(http.StatusTemporaryRedirect)
	}))
	t.Cleanup(a.Close)
	b := standby(t, a.URL, a.URL, &hits)
	bURL.Store(b.URL)
	c, err := client.New(a.URL, "tok")
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Runs(context.Background(), client.RunsOptions{})
	if err == nil || hits.Load() > 5 {
		t.Fatalf("err %v after %d requests; want an error within a few hops", err, hits.Load())
	}
}

// TestClientWriteNotRedirected: a plain redirect (no LeaderHeader, as a
// proxy's http → https 301) of a request that changes something is an
// error naming the Location; net/http would resend the POST there as a GET
// and the GET's 200 would pass for the submit's answer (SPEC §15: a write
// is never sent to another address). A GET still follows it.
func TestClientWriteNotRedirected(t *testing.T) {
	var mu sync.Mutex
	var got []string
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Method+" "+r.URL.Path)
		mu.Unlock()
		if r.URL.Path == "/old/api/runs" {
			http.Redirect(w, r, "/api/runs", http.StatusMovedPermanently)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"runs":[]}`)
	}))
	t.Cleanup(s.Close)
	c, err := client.New(s.URL+"/old", "tok")
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Submit(context.Background(), "", []byte("steps: []\n"))
	var e *client.Error
	if !errors.As(err, &e) || e.Status != http.StatusMovedPermanently || !strings.Contains(e.Message, `"/api/runs"`) {
		t.Fatalf("a submit redirected by a 301: %v, want an error naming the Location", err)
	}
	mu.Lock()
	if len(got) != 1 {
		t.Errorf("requests %q, want the POST alone", got)
	}
	mu.Unlock()
	if _, err := c.Runs(context.Background(), client.RunsOptions{}); err != nil {
		t.Fatalf("a GET redirected by a 301: %v, want it followed", err)
	}
}
