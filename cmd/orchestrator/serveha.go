package main

// serve on PostgreSQL (SPEC §11): any number of serve processes point at
// one database and one of them leads. Each starts as a standby on its
// already-bound listener, campaigns for the lead (adapters/pglead), and
// when it wins restores from the database exactly as a restart does
// (SPEC §7) and serves on the same listener. Deposed, it stops at once and
// exits with status 75; its supervisor restarts it as a standby.

import (
	"cmp"
	"context"
	"crypto/subtle"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/net/netutil"

	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/adapters/pglead"
	"github.com/tether-run/tether/adapters/pgstore"
	"github.com/tether-run/tether/adapters/store"
)

// Leadership (SPEC §11).
const (
	// exitDeposed is serve's exit status when it stopped leading: another
	// orchestrator took the lead, or a commit's outcome is unknown. Its
	// supervisor restarts it; it comes back as a standby.
	exitDeposed        = 75
	defaultLeaderLease = pglead.DefaultLease
	minLeaderLease     = time.Second
	maxLeaderLease     = 10 * time.Minute
	// leaderHeader names the leader's advertised base URL in a standby's
	// answers.
	leaderHeader = "Tether-Leader"
	// standbyStopWait bounds how long a standby's requests in progress may
	// finish once it leads.
	standbyStopWait = 2 * time.Second
)

// deposedErrorf is serve's error when it stops leading: exit 75.
func deposedErrorf(format string, args ...any) error {
	return &exitErr{code: exitDeposed, err: fmt.Errorf(format, args...)}
}

// advertiseURL checks --advertise: an http or https base URL with a host
// and no path, query or fragment.
func advertiseURL(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
		strings.TrimSuffix(u.Path, "/") != "" || u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("%q: want the base URL other orchestrators, workers and clients reach this one at, like http://10.0.0.5:7420", s)
	}
	return u.Scheme + "://" + u.Host, nil
}

// defaultAdvertise is the advertised URL when --advertise is not given:
// the bound address, when it names a host others can reach.
func defaultAdvertise(addr net.Addr, tlsOn bool) (string, error) {
	ta, ok := addr.(*net.TCPAddr)
	if !ok || ta.IP.IsUnspecified() {
		return "", usageErrorf("--advertise: the listen address %s names no host other processes can reach; say where they reach this orchestrator, like --advertise http://10.0.0.5:7420", addr)
	}
	scheme := "http"
	if tlsOn {
		scheme = "https"
	}
	return scheme + "://" + ta.String(), nil
}

// leaderDSN is the store's URL for the leader's sessions: unless the URL
// says otherwise, the server ends a session idle in a transaction for a
// lease. A leader paused inside a write transaction holds the leader row
// FOR KEY SHARE (the fence), which a take-over's UPDATE waits for: without the
// timeout no standby could take over until the paused one resumed.
func leaderDSN(dsn string, lease time.Duration) string {
	const param = "idle_in_transaction_session_timeout"
	u, err := url.Parse(dsn)
	if err != nil {
		return dsn // pgstore.Open names the problem
	}
	q := u.Query()
	if q.Has(param) {
		return dsn
	}
	q.Set(param, strconv.FormatInt(lease.Milliseconds(), 10))
	u.RawQuery = q.Encode()
	return u.String()
}

// redactDSN names a PostgreSQL store without its password.
func redactDSN(dsn string) string {
	c, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return "postgres"
	}
	return fmt.Sprintf("postgres://%s@%s:%d/%s", c.ConnConfig.User, c.ConnConfig.Host, c.ConnConfig.Port, c.ConnConfig.Database)
}

// serveLeading runs serve on a PostgreSQL store: a standby until it wins
// the lead, then the orchestrator. ln is bound; serveLeading owns it.
func serveLeading(ctx context.Context, e *env, log *slog.Logger, cfg serverConfig, ln net.Listener, opts orchestrator.Options) error {
	feed := newConnFeed(ln)
	defer feed.close()
	where := redactDSN(cfg.StoreDSN)
	advertise := cfg.Advertise
	if advertise == "" {
		var err error
		if advertise, err = defaultAdvertise(ln.Addr(), opts.TLS != nil); err != nil {
			return err
		}
	}
	// The schema first, so the leader row exists; nothing else of the
	// store is a standby's (Open collects blobs, which are the leader's).
	if err := pgstore.Migrate(ctx, cfg.StoreDSN); err != nil {
		return fmt.Errorf("store %s: %w", where, err)
	}
	pcfg, err := pgxpool.ParseConfig(cfg.StoreDSN)
	if err != nil {
		return usageErrorf("--store: the URL does not parse as a PostgreSQL connection string")
	}
	pcfg.MaxConns = 2 // the election's own: a renewal never waits for a commit's connection (nor its fence: SPEC §11)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("store %s: %w", where, err)
	}
	defer pool.Close()
	host, _ := os.Hostname()
	el := pglead.New(pool, pglead.Config{Holder: fmt.Sprintf("%s pid %d", host, os.Getpid()), URL: advertise, Lease: cfg.LeaderLease, Logger: log})

	sb := newStandby(advertise, opts.MetricsToken)
	sctx, stopStandby := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() { defer close(watched); sb.watch(sctx, el) }()
	srv := standbyServer(sb, opts.TLS, cmp.Or(opts.HeaderTimeout, orchestrator.DefaultHeaderTimeout), log)
	// Bounded as the orchestrator's own listener is (SPEC §12): beyond the
	// cap a connection waits in the backlog.
	sbln := netutil.LimitListener(feed.listener(), cmp.Or(opts.MaxTCPConns, opts.MaxConns+orchestrator.DefaultExtraTCPConns))
	served := serveStandby(srv, sbln, opts.TLS != nil, log)
	endStandby := func() {
		stopStandby()
		<-watched
		served.stop(standbyStopWait)
	}
	c := el.Config()
	log.Info("standing by: campaigning for the lead", "store", where, "advertise", advertise,
		"lease", c.Lease.String(), "renew", c.Renew.String(), "poll", c.Poll.String())
	fmt.Fprintf(e.stdout, "Tether orchestrator standing by on %s (store %s, advertised as %s): it leads once the leader's lease (%s) lapses\n",
		ln.Addr(), where, advertise, c.Lease)
	epoch, err := el.Campaign(ctx)
	endStandby()
	if err != nil {
		log.Info("standby stopped", "reason", "signal")
		return nil
	}
	log.Info("took the lead: restoring from the store", "epoch", epoch)
	hctx, stopHolding := context.WithCancel(context.Background())
	defer stopHolding()
	held := make(chan error, 1)
	go func() { held <- el.Hold(hctx, epoch) }() // from now: restoring may take longer than a lease
	resign := func() {
		rctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		stopHolding()
		if err := el.Resign(rctx, epoch); err != nil {
			log.Warn("could not resign the lead; a standby takes over once the lease lapses", "err", err)
		}
	}
	st, err := pgstore.Open(ctx, leaderDSN(cfg.StoreDSN, c.Lease), pgstore.Options{Epoch: epoch})
	switch {
	case errors.Is(err, store.ErrDeposed):
		return stepDown(log, epoch, unknownOutcome, err)
	case err != nil && ctx.Err() != nil:
		resign()
		log.Info("stopped before serving; the lead resigned", "reason", "signal", "epoch", epoch)
		return nil
	case err != nil:
		resign()
		return fmt.Errorf("store %s: %w", where, err)
	}
	opts.Store = st
	opts.StorePath = where // for its logs: the secrets key is --secrets-key-file
	opts.Listener = feed.listener()
	opts.Epoch = epoch
	opts.AdminShared = true // another copy of the admin-token file is refused, not a reset (SPEC §15a)
	d, err := orchestrator.Start(opts)
	if err != nil { // Start closed the store
		if errors.Is(err, store.ErrDeposed) {
			return stepDown(log, epoch, unknownOutcome, err)
		}
		resign()
		switch { // a setting to fix: exit 2
		case errors.Is(err, orchestrator.ErrAdminMismatch):
			return usageErrorf("--admin-token-file %s: %v", cfg.AdminTokenFile, err)
		case errors.Is(err, store.ErrSecretsKey), errors.Is(err, store.ErrNoSecretsKey):
			return usageErrorf("--secrets-key-file: %v", err)
		}
		return err
	}
	fmt.Fprintf(e.stdout, "Tether orchestrator listening on %s (store %s, leading: epoch %d, advertised as %s)\n  workers connect to: %s\n  operator API:       %s\n  data plane:         %s\n",
		d.Addr(), where, epoch, advertise, d.URL(), d.APIURL(), d.DataURL())
	select {
	case <-ctx.Done():
		log.Info("shutting down", "reason", "signal")
		sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		serr := d.Shutdown(sctx)
		if errors.Is(serr, store.ErrDeposed) {
			return stepDown(log, epoch, unknownOutcome, serr)
		}
		resign()
		if serr != nil {
			return fmt.Errorf("shutdown: %w", serr)
		}
		log.Info("orchestrator stopped; the lead resigned", "epoch", epoch)
		return nil
	case err := <-held:
		st.Close() // at once: a commit waiting on an unreachable database ends now
		d.Close()  // its commits fail (the fence, or the closed store): nothing more leaves
		return stepDown(log, epoch, "the lease went a whole lease without a renewal (the store unreachable): a standby may lead by now", err)
	case <-d.Done():
		err := d.Close()
		if err == nil {
			err = errors.New("the orchestrator loop stopped")
		}
		return stepDown(log, epoch, unknownOutcome, err)
	}
}

// unknownOutcome is why a leader stops on a store error.
const unknownOutcome = "a commit's outcome is unknown (a store error): only a restore from the store settles it"

// stepDown logs why this orchestrator stopped leading and returns the
// error that exits 75: deposed (another epoch leads, whatever why says),
// or why.
func stepDown(log *slog.Logger, epoch uint64, why string, err error) error {
	if errors.Is(err, store.ErrDeposed) {
		why = "deposed: another orchestrator leads (a newer epoch)"
	}
	log.Error("stopped leading; exiting for the supervisor to restart this orchestrator as a standby", "epoch", epoch, "why", why, "err", err)
	return deposedErrorf("stopped leading (epoch %d): %s: %v; exit %d: restart it (it comes back as a standby)", epoch, why, err, exitDeposed)
}

// standby answers while this orchestrator does not lead (SPEC §7): the
// probes, a redirect of the operator API to the leader, and a refusal
// naming the leader to everything else (the workers' endpoints).
type standby struct {
	self    string                 // this orchestrator's advertised URL
	leader  atomic.Pointer[string] // the leader's advertised URL; "" when none leads
	epoch   atomic.Uint64          // the leader's epoch, as last read
	metrics http.Handler           // /metrics: tether_leader 0 and the leader's epoch
}

// newStandby makes the standby's answers; its /metrics asks for the
// metrics token when one is set (operator tokens live in the store, which
// a standby does not read).
func newStandby(self, metricsToken string) *standby {
	s := &standby{self: self}
	reg := prometheus.NewRegistry()
	reg.MustRegister(orchestrator.LeaderGauges(false, s.epoch.Load)...)
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	h := promhttp.HandlerFor(reg, orchestrator.MetricsHandlerOpts()) // SPEC §16's bounds, as the leader's
	s.metrics = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if metricsToken != "" && subtle.ConstantTimeCompare([]byte(got), []byte(metricsToken)) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="tether-metrics"`)
			http.Error(w, "metrics: missing or wrong bearer token (a standby takes only the metrics token)", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
	return s
}

// watch keeps the leader's URL current, reading it every poll, until ctx
// ends.
func (s *standby) watch(ctx context.Context, el *pglead.Elector) {
	t := time.NewTicker(el.Config().Poll)
	defer t.Stop()
	for {
		url, epoch, live, err := el.Leader(ctx)
		if err == nil {
			s.epoch.Store(epoch)
			if !live || url == s.self { // a lapsed lease, or this address's own before a restart
				url = ""
			}
			s.leader.Store(&url)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *standby) leaderURL() string {
	if p := s.leader.Load(); p != nil {
		return *p
	}
	return ""
}

func (s *standby) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	leader := s.leaderURL()
	switch {
	case r.URL.Path == "/livez":
		orchestrator.Probe(w, r, http.StatusOK, "ok")
		return
	case r.URL.Path == "/readyz":
		why := "standby; no orchestrator leads now"
		if leader != "" {
			why = "standby; leader at " + leader
		}
		orchestrator.Probe(w, r, http.StatusServiceUnavailable, why)
		return
	case r.URL.Path == "/metrics":
		s.metrics.ServeHTTP(w, r)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	if leader != "" {
		w.Header().Set(leaderHeader, leader)
	}
	if leader != "" && (r.URL.Path == "/api" || strings.HasPrefix(r.URL.Path, "/api/") || statusPage(r)) {
		http.Redirect(w, r, leader+r.URL.RequestURI(), http.StatusTemporaryRedirect)
		return
	}
	msg := "this orchestrator is a standby and no orchestrator leads now; try again shortly"
	if leader != "" {
		msg = "this orchestrator is a standby; the leader is at " + leader
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Retry-After", "1")
	w.WriteHeader(http.StatusServiceUnavailable)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": "standby", "leader": leader, "message": msg})
}

// statusPage says whether r reads a page of the status page (SPEC §18),
// which a standby sends to the leader's as it does the operator API.
func statusPage(r *http.Request) bool {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return false
	}
	switch p := r.URL.Path; p {
	case "/", "/login", "/events", "/workers", "/tokens":
		return true
	default:
		return strings.HasPrefix(p, "/runs/")
	}
}

// standbyServer serves the standby's answers in the protocols the
// orchestrator speaks (a worker's HTTP/2 data-plane client with prior
// knowledge must read the refusal too).
func standbyServer(h http.Handler, tlsConf *tls.Config, headerTimeout time.Duration, log *slog.Logger) *http.Server {
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	if tlsConf != nil {
		protocols.SetHTTP2(true)
	} else {
		protocols.SetUnencryptedHTTP2(true)
	}
	srv := &http.Server{
		Handler: h, Protocols: protocols,
		ReadHeaderTimeout: headerTimeout,
		IdleTimeout:       10 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	if tlsConf != nil {
		srv.TLSConfig = tlsConf.Clone()
	}
	// Every answer closes its connection: when this standby leads, the
	// listener passes to the orchestrator's server, and a client must not
	// be left holding an idle connection the standby's server is closing
	// (its next request would meet EOF, not the new leader).
	srv.SetKeepAlivesEnabled(false)
	return srv
}

// standbyServing is a standby's server at work on its view of the feed.
type standbyServing struct {
	srv    *http.Server
	ln     net.Listener
	served chan struct{}
	mu     sync.Mutex
	busy   map[net.Conn]bool // accepted and not yet answered: new or active
}

// serveStandby serves srv on ln until stop.
func serveStandby(srv *http.Server, ln net.Listener, tls bool, log *slog.Logger) *standbyServing {
	s := &standbyServing{srv: srv, ln: ln, served: make(chan struct{}), busy: map[net.Conn]bool{}}
	srv.ConnState = func(c net.Conn, st http.ConnState) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if st == http.StateNew || st == http.StateActive {
			s.busy[c] = true
		} else {
			delete(s.busy, c)
		}
	}
	go func() {
		defer close(s.served)
		var err error
		if tls {
			err = srv.ServeTLS(ln, "", "")
		} else {
			err = srv.Serve(ln)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
			log.Error("standby listener stopped", "err", err)
		}
	}()
	return s
}

// stop ends the standby's serving once it leads, answering every request
// already accepted: it stops accepting (later connections wait in the
// feed for the orchestrator's server), waits up to wait for each accepted
// connection to be answered, then shuts the server down. Shutting down
// first would drop a connection whose request the server had not yet read
// (net/http returns without answering a request read after Shutdown
// began): its client would meet EOF at the moment of a take-over instead
// of a standby's 503 naming the leader.
func (s *standbyServing) stop(wait time.Duration) {
	s.ln.Close()
	<-s.served // every accepted connection is now counted
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		n := len(s.busy)
		s.mu.Unlock()
		if n == 0 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if s.srv.Shutdown(ctx) != nil {
		s.srv.Close()
	}
}

// connFeed accepts on one listener and hands each connection to whichever
// of its views asks: the standby's server, then the orchestrator's. A view
// closed takes no more connections, and closing it leaves the listener
// bound, so the orchestrator serves on the address the standby held.
type connFeed struct {
	ln    net.Listener
	conns chan net.Conn
	stop  chan struct{}
	ended chan struct{} // closed when the accept loop ended; err says why
	err   error
	once  sync.Once
}

func newConnFeed(ln net.Listener) *connFeed {
	f := &connFeed{ln: ln, conns: make(chan net.Conn), stop: make(chan struct{}), ended: make(chan struct{})}
	go f.accept()
	return f
}

func (f *connFeed) accept() {
	defer close(f.ended)
	for {
		c, err := f.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			f.err = err
			return
		}
		select {
		case f.conns <- c:
		case <-f.stop:
			c.Close()
			return
		}
	}
}

// close closes the listener and ends the accept loop.
func (f *connFeed) close() {
	f.once.Do(func() {
		close(f.stop)
		f.ln.Close()
		<-f.ended
	})
}

// listener is a new view of the feed.
func (f *connFeed) listener() net.Listener {
	return &feedView{f: f, closed: make(chan struct{})}
}

type feedView struct {
	f      *connFeed
	closed chan struct{}
	once   sync.Once
}

func (v *feedView) Accept() (net.Conn, error) {
	select {
	case <-v.closed:
		return nil, net.ErrClosed
	default:
	}
	select {
	case c := <-v.f.conns:
		return c, nil
	case <-v.closed:
		return nil, net.ErrClosed
	case <-v.f.ended:
		if v.f.err != nil {
			return nil, v.f.err
		}
		return nil, net.ErrClosed
	}
}

func (v *feedView) Close() error {
	v.once.Do(func() { close(v.closed) })
	return nil
}

func (v *feedView) Addr() net.Addr { return v.f.ln.Addr() }
