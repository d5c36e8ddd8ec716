package worker

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/tether-run/tether/adapters/wire"
	"github.com/tether-run/tether/core"
)

// fakeOrch is an orchestrator of a highly available group, for the worker's
// side of SPEC §11: as the leader it welcomes a worker on /control and
// answers data-plane writes; as a standby it refuses both with 503 and
// LeaderHeader (when it knows a leader).
type fakeOrch struct {
	t   *testing.T
	srv *httptest.Server

	mu      sync.Mutex
	standby bool
	leader  string   // a standby's LeaderHeader ("" for none)
	hellos  int      // Hellos welcomed
	writes  []string // "METHOD PATH request-id credential" of each write seen
	welcome chan struct{}
}

func newFakeOrch(t *testing.T, ln net.Listener) *fakeOrch {
	f := &fakeOrch{t: t, welcome: make(chan struct{}, 8)}
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(f.serve))
	if ln != nil {
		f.srv.Listener.Close()
		f.srv.Listener = ln
	}
	f.srv.Config.Protocols = new(http.Protocols)
	f.srv.Config.Protocols.SetHTTP1(true)
	f.srv.Config.Protocols.SetUnencryptedHTTP2(true) // the data plane is h2c
	f.srv.Start()
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeOrch) setStandby(leader string) {
	f.mu.Lock()
	f.standby, f.leader = true, leader
	f.mu.Unlock()
}

func (f *fakeOrch) control() string { return "ws" + strings.TrimPrefix(f.srv.URL, "http") + "/control" }

func (f *fakeOrch) seen() (hellos int, writes []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hellos, append([]string(nil), f.writes...)
}

func (f *fakeOrch) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	standby, leader := f.standby, f.leader
	if r.URL.Path != "/control" {
		f.writes = append(f.writes, r.Method+" "+r.URL.Path+" "+r.Header.Get(RequestIDHeader)+" "+r.Header.Get("Authorization"))
	}
	f.mu.Unlock()
	if standby {
		if leader != "" {
			w.Header().Set(LeaderHeader, leader)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		json.NewEncoder(w).Encode(map[string]string{"error": "standby", "leader": leader})
		return
	}
	if r.URL.Path != "/control" {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"id": "x", "version": 1})
		return
	}
	ws, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
	if err != nil {
		return
	}
	defer ws.Close()
	for {
		_, b, err := ws.ReadMessage()
		if err != nil {
			return
		}
		m, err := wire.Decode(b)
		if err != nil {
			f.t.Errorf("undecodable frame from the worker: %v", err)
			return
		}
		if h, ok := m.(core.Hello); ok {
			b, _ := wire.Encode(core.Welcome{Worker: h.Worker, Credential: "cred", CredentialTTL: time.Hour, Heartbeat: time.Minute})
			ws.WriteMessage(websocket.TextMessage, b)
			f.mu.Lock()
			f.hellos++
			f.mu.Unlock()
			f.welcome <- struct{}{}
		}
	}
}

// runWorker runs a worker dialing urls until the test ends.
func runWorker(t *testing.T, urls ...string) *Driver {
	return runWorkerWith(t, core.WorkerConfig{}, urls...)
}

// runWorkerWith is runWorker with the core's dial timeout of cfg.
func runWorkerWith(t *testing.T, cfg core.WorkerConfig, urls ...string) *Driver {
	d, err := New(Options{
		URL: urls[0], URLs: urls[1:],
		Config: core.WorkerConfig{Name: "w1", Token: "w1.00", Slots: 1, BackoffBase: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
			DialTimeout: cfg.DialTimeout},
		Logger:         slog.New(slog.NewTextHandler(io.Discard, nil)),
		NoStepEndpoint: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	d.Data().SetRetry(Retry{Attempts: 6, First: 10 * time.Millisecond, Max: 50 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return d
}

func waitWelcome(t *testing.T, f *fakeOrch) {
	select {
	case <-f.welcome:
	case <-time.After(30 * time.Second):
		t.Fatal("the worker never reached the leader")
	}
}

// TestWorkerFollowsLeader: a standby's 503 with LeaderHeader sends the
// worker to the leader named there, though that URL is not among its own
// (the other one refuses connections); its data plane goes there too. When
// that leader is in turn deposed, a write it refuses with LeaderHeader is
// sent again, with the same request id, to the new leader.
func TestWorkerFollowsLeader(t *testing.T) {
	leader, next := newFakeOrch(t, nil), newFakeOrch(t, nil)
	standby := newFakeOrch(t, nil)
	standby.setStandby(leader.srv.URL)
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	d := runWorker(t, standby.control(), "ws"+strings.TrimPrefix(dead.URL, "http")+"/control")
	waitWelcome(t, leader)
	if got := d.Data().URL(); got != leader.srv.URL {
		t.Fatalf("the data plane is at %s, want the leader %s", got, leader.srv.URL)
	}

	leader.setStandby(next.srv.URL) // deposed: a newer leader took over
	if _, err := d.Data().PutWith(context.Background(), 7, "out", strings.NewReader("bytes"), 5, WriteOpts{RequestID: "req-1"}); err != nil {
		t.Fatalf("a write during the failover: %v", err)
	}
	_, lw := leader.seen()
	_, nw := next.seen()
	if len(lw) != 1 || len(nw) != 1 || lw[0] != "PUT /data/out req-1 Bearer cred" || nw[0] != lw[0] {
		t.Fatalf("writes: old leader %q, new leader %q; want the one write at both, the same request id", lw, nw)
	}
	if got := d.Data().URL(); got != next.srv.URL {
		t.Fatalf("the data plane is at %s, want the new leader %s", got, next.srv.URL)
	}
}

// TestWorkerTriesEveryURL: a URL that refuses connections and a standby that
// knows no leader are passed over for the next URL given.
func TestWorkerTriesEveryURL(t *testing.T) {
	leader, standby := newFakeOrch(t, nil), newFakeOrch(t, nil)
	standby.setStandby("")
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	d := runWorker(t, "ws"+strings.TrimPrefix(dead.URL, "http")+"/control", standby.control(), leader.control())
	waitWelcome(t, leader)
	if got := d.Data().URL(); got != leader.srv.URL {
		t.Fatalf("the data plane is at %s, want the leader %s", got, leader.srv.URL)
	}
}

// TestWorkerPassesSilentURL: a URL whose server accepts the connection and
// never answers (a host gone dark) has only its share of the dial timeout;
// it was the one connected last, yet the worker reaches the next URL.
func TestWorkerPassesSilentURL(t *testing.T) {
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { silent.Close() })
	go func() {
		var held []net.Conn // accepted and never answered
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	leader := newFakeOrch(t, nil)
	runWorkerWith(t, core.WorkerConfig{DialTimeout: 2 * time.Second}, "ws://"+silent.Addr().String()+"/control", leader.control())
	waitWelcome(t, leader)
}

// TestWorkerNameOfSeveralAddresses: one host name that resolves to several
// addresses is dialed at each; the data plane then talks to the address
// that connected, not to whatever the name resolves to first.
func TestWorkerNameOfSeveralAddresses(t *testing.T) {
	ln1, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln1.Addr().(*net.TCPAddr).Port
	ln2, err := net.Listen("tcp", net.JoinHostPort("127.0.0.2", strconv.Itoa(port)))
	if err != nil {
		t.Fatalf("a second loopback address (127.0.0.2) on the same port: %v", err)
	}
	standby, leader := newFakeOrch(t, ln1), newFakeOrch(t, ln2)
	standby.setStandby("")
	old := lookupHost
	lookupHost = func(ctx context.Context, host string) ([]string, error) {
		if host == "orch.test" {
			return []string{"127.0.0.1", "127.0.0.2"}, nil
		}
		return old(ctx, host)
	}
	t.Cleanup(func() { lookupHost = old })
	d := runWorker(t, "ws://orch.test:"+strconv.Itoa(port)+"/control")
	waitWelcome(t, leader)
	if _, err := d.Data().PutWith(context.Background(), 7, "out", strings.NewReader("bytes"), 5, WriteOpts{RequestID: "req-2"}); err != nil {
		t.Fatalf("a write: %v", err)
	}
	_, lw := leader.seen()
	_, sw := standby.seen()
	if len(lw) != 1 || len(sw) != 0 {
		t.Fatalf("writes: leader %q, standby %q; want the one write at the leader", lw, sw)
	}
}
