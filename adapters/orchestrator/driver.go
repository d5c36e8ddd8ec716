// Package orchestrator drives one core.Orchestrator in the real world: a bbolt
// store, the WebSocket control plane at /control, the HTTP/2 data plane at
// /data/ and /bundle/ (data.go), the real clock, a Go API for operators, and
// the probes and Prometheus metrics (health.go, metrics.go; SPEC §16).
// One listener serves them all: HTTP/1.1 (the WebSocket upgrade) and
// cleartext HTTP/2 (h2c, prior knowledge) by default, or TLS with ALPN
// choosing h2 or http/1.1 when Options.TLS is set.
//
// The Driver follows core/doc.go's duties to the letter. One goroutine owns
// the Orchestrator. It blocks for one input, drains whatever else is queued
// (at most maxBatch inputs), steps each with a fresh time.Now into a group,
// and arms a timer for the Deadline. The group is saved in ONE store
// transaction (with the data-plane writes fenced among its inputs) on a
// goroutine of its own while the loop steps what comes next into the next
// group (a pipeline, SPEC §11; more than one group in flight when the store
// is a store.Pipeline); once it and every group before it are durable, the
// loop sends its
// messages (each connection has its own buffered writer), closes the
// connections the core closed, answers the API calls and the data writes,
// runs the queued read-only queries, and hands the next group to the store.
package orchestrator

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime/pprof"
	"runtime/trace"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tether-run/tether/adapters/commit"
	"github.com/tether-run/tether/adapters/logging"
	"github.com/tether-run/tether/adapters/store"
	"github.com/tether-run/tether/adapters/wire"
	"github.com/tether-run/tether/core"
)

// Limits.
const (
	inputQueue      = 4096 // inputs waiting for the loop; senders block beyond it
	maxBatch        = 512  // inputs stepped into one group commit
	defaultMaxConns = 1024 // concurrent control connections that sent a Hello
)

// Defaults of the control plane's admission limits (Options, SPEC §12).
const (
	DefaultMaxUnauthConns        = 256
	DefaultMaxUnauthConnsPerAddr = 32
	DefaultHelloTimeout          = 5 * time.Second
)

// HTTP server limits (SPEC §12, §14). The Default* ones are Options' zero
// values; the others are fixed.
const (
	// DefaultIdleTimeout closes a keep-alive HTTP/1.1 connection between
	// requests, and an HTTP/2 connection with no open stream, idle this long.
	DefaultIdleTimeout = 2 * time.Minute
	// DefaultHeaderTimeout bounds a TLS handshake, reading a request's
	// headers, and an h2c client's preface; a connection that sends nothing
	// is closed after it.
	DefaultHeaderTimeout = 10 * time.Second
	// DefaultBodyTimeout bounds reading a request body from its headers on,
	// for the operator API and for any request whose handler sets no
	// deadline of its own (the data plane sets its own, SPEC §14).
	DefaultBodyTimeout = 30 * time.Second
	// DefaultWriteTimeout is the per-write progress deadline: a connection
	// whose peer accepts no byte of a pending write for this long is
	// closed. A long response to a slow reader that keeps reading is never
	// cut.
	DefaultWriteTimeout = 30 * time.Second
	// DefaultExtraTCPConns is how many TCP connections the listener admits
	// beyond MaxConns when Options.MaxTCPConns is zero: workers' data-plane
	// connections, operators, and connections not yet upgraded.
	DefaultExtraTCPConns = 2048
	// bundleBodyTimeout bounds reading a bundle upload (PUT /api/bundles,
	// up to Options.MaxBundleBody, a full operator token's request) from
	// its headers; its answer then gets apiTimeout (SPEC §12).
	bundleBodyTimeout = 10 * time.Minute
	// maxHeaderBytes bounds a request's header (HTTP/1.1), and so its
	// header list (HTTP/2 SETTINGS_MAX_HEADER_LIST_SIZE: this plus 320).
	maxHeaderBytes = 64 << 10
	// HTTP/2: concurrent streams per connection; the largest frame read;
	// the flow-control windows (request bytes received and not yet read by
	// a handler) per connection and per stream; a connection silent this
	// long is pinged, and closed if the ping is not answered in time.
	h2MaxStreams              = 256
	h2MaxFrameBytes           = 1 << 20
	h2UploadBufferConnBytes   = 1 << 20
	h2UploadBufferStreamBytes = 1 << 20
	h2PingAfter               = 30 * time.Second
	h2PingTimeout             = 15 * time.Second
)

var (
	// ErrClosed is returned when the driver was closed, or stopped on a
	// store failure, before a call could be answered.
	ErrClosed = errors.New("orchestrator: driver closed")
	// ErrRefused is returned, wrapped with the orchestrator's reason, when
	// the orchestrator refuses an operator call (an invalid run, an unknown
	// token, ...).
	ErrRefused = errors.New("orchestrator: refused")
	// ErrAdminMismatch is returned by Start when Options.AdminShared is set
	// and the admin token differs from the one the store holds: on a store
	// that several orchestrators share, one with another copy of the file
	// must not reset the token of the others (SPEC §11, §15a).
	ErrAdminMismatch = errors.New("orchestrator: the admin token differs from the one the store holds")
)

// Options configures a Driver.
type Options struct {
	// Addr is the control plane's listen address; "127.0.0.1:0" picks a port.
	Addr string
	// Listener, if set, is used instead of listening on Addr: serve binds
	// before it creates anything (SPEC §12). Start owns it from then on and
	// closes it if it fails.
	Listener net.Listener
	// StorePath is the bbolt file. An existing file is restored (SPEC §7).
	StorePath string
	// Store, if set, is the backend used instead of opening StorePath with
	// bbolt (tests wrap the bbolt store with it). The driver closes it.
	Store store.Backend
	// SecretsKeyFile holds the key that seals secrets at rest (SPEC §14a):
	// 64 hex digits, created (mode 0600) when missing. Empty: StorePath +
	// ".secrets-key", or SecretsKey, or no secrets when neither is set.
	SecretsKeyFile string
	SecretsKey     []byte
	// Config is the core's configuration. Config.Env is the environment
	// snapshot shipped with every dispatch (see EnvSnapshot); the core
	// removes the denylist.
	Config core.Config
	// Logger receives structured logs; nil means slog.Default().
	Logger *slog.Logger
	// MaxConns bounds the control connections that sent a Hello (the
	// authenticated cap, not per address: SPEC §12); zero means 1024. A
	// Hello beyond it is closed with 1013 (try again later).
	MaxConns int
	// MaxUnauthConns bounds the control connections without an accepted
	// Hello yet (upgraded, not welcomed), in all; zero means 256. They
	// never hold one of the MaxConns places. Beyond it an upgrade is
	// answered 503 with the reason.
	MaxUnauthConns int
	// MaxUnauthConnsPerAddr bounds those from one source address; zero
	// means 32.
	MaxUnauthConnsPerAddr int
	// HelloTimeout is how long a new control connection has to send its
	// Hello before it is closed (1008); zero means 5 s.
	HelloTimeout time.Duration
	// ReadWait is how long a control connection may be silent (no frame,
	// no pong) before it is closed as dead; zero means 60 s. One heard
	// nothing from for half of it is pinged (SPEC §9).
	ReadWait time.Duration
	// MetricsToken, if set, is the bearer token /metrics asks for; empty
	// serves /metrics to anyone who can reach the listener (SPEC §16).
	MetricsToken string
	// Epoch is the leadership epoch this driver leads in on a shared store
	// (SPEC §11); 0 on a store of one orchestrator. It decides nothing
	// here (the store fences with it); /metrics shows it.
	Epoch uint64
	// AdminToken, if set, mounts the operator HTTP API (APIHandler) under
	// /api/ on the control plane's server; the token is the operator token
	// "admin" (SPEC §15a: created at the first start, given this hash when
	// it changed), and the API takes every live operator token.
	AdminToken string
	// AdminShared says the store is shared by several orchestrators (SPEC
	// §11): an AdminToken other than the one the store holds is refused
	// (ErrAdminMismatch) rather than taken as a reset of the token.
	AdminShared bool
	// TLS, if set, serves everything over TLS (it needs a certificate);
	// HTTP/2 is negotiated by ALPN and workers dial wss://. Nil serves
	// cleartext: HTTP/1.1 and h2c.
	TLS *tls.Config
	// Data-plane limits in bytes; zero means the Default* constant: one PUT
	// body, one append body, a stream's total length, one bundle upload, and
	// the append bodies held in memory at once (at least MaxAppendBody; PUT
	// and bundle bodies are streamed to blobs, not held, SPEC §14).
	MaxPutBody, MaxAppendBody, MaxStream, MaxBundleBody, MaxDataInFlight int64
	// MaxSubmitBody bounds a workflow definition posted to POST /api/runs,
	// in bytes; zero means DefaultMaxSubmitBody (SPEC §12).
	MaxSubmitBody int64
	// BodyIdleTimeout cuts a data-plane write's body (and a bundle upload's)
	// that sends no byte for this long (408); zero means
	// DefaultBodyIdleTimeout.
	BodyIdleTimeout time.Duration
	// HTTP server deadlines (SPEC §12); zero means the Default* constant.
	// IdleTimeout: an idle keep-alive or HTTP/2 connection is closed.
	// HeaderTimeout: a TLS handshake, request headers, an h2c preface.
	// BodyTimeout: an operator API request body, and any body no handler
	// sets a deadline for. WriteTimeout: per write, without progress.
	IdleTimeout, HeaderTimeout, BodyTimeout, WriteTimeout time.Duration
	// bundleBody bounds a bundle upload's body from its headers; zero
	// means bundleBodyTimeout (tests shorten it: export_test.go).
	bundleBody time.Duration
	// MaxTCPConns caps concurrent TCP connections at the listener (control
	// WebSockets included); over it a new connection is refused at once.
	// Zero means MaxConns + DefaultExtraTCPConns.
	MaxTCPConns int
	// MaxConnsPerAddr caps the connections of one source IP address; zero
	// means 3/4 of MaxTCPConns, so one address never holds the last quarter.
	// Set it to MaxTCPConns to have no per-address share.
	MaxConnsPerAddr int
	// RefusalsPerSec is the refusal budget of one source address (SPEC
	// §12): refused faster than this (beyond a burst of twice it), its next
	// requests wait. Zero means DefaultRefusalsPerSec; negative turns the
	// budget off (tests that refuse on purpose as fast as they can).
	RefusalsPerSec int
	// WorkPerSec is the work budget of one source address's control
	// frames, in units a second, the burst equal to it (SPEC §12). Zero
	// means DefaultWorkPerSec; negative turns the budget off.
	WorkPerSec int
	// MaxEventStreams caps the live event streams open at once (GET
	// /api/events and /api/runs/{id}/events, SPEC §17); zero means
	// DefaultMaxEventStreams.
	MaxEventStreams int
}

// EnvSnapshot returns this process's environment as a map, for Config.Env.
func EnvSnapshot() map[string]string {
	env := map[string]string{}
	for _, kv := range os.Environ() {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			env[k] = v
		}
	}
	return env
}

// Driver runs one orchestrator. Its methods are safe for concurrent use.
type Driver struct {
	opts    Options
	log     *slog.Logger
	st      store.Backend  // durable storage (store.Backend states its promises)
	pipe    store.Pipeline // st, when it takes more than one group in flight; else nil
	depth   int            // groups in flight at most: pipe's depth, else 1
	secrets bool           // the store was given its secrets key (secrets.go)
	mux     *routeMux      // the server's routes
	dp      *dataPlane     // its HTTP side
	streams *broker        // the live event streams (events.go)
	ln      *capListener
	srv     *http.Server

	inputs chan input
	beats  *beats        // heartbeats on their way to inputs, many as one
	quit   chan struct{} // closed by Close
	ended  chan struct{} // closed when the loop has stopped (Close, or a store failure)
	done   chan struct{} // closed when everything has stopped
	err    error         // why the loop stopped; read after done
	once   sync.Once

	nextConn atomic.Uint64
	nextCall atomic.Uint64
	nauth    atomic.Int64 // control connections holding a MaxConns place (they sent a Hello)

	mu         sync.Mutex
	nunauth    int            // control connections not welcomed yet
	unauthFrom map[string]int // of them, per source address
	work       addrBudgets    // what each source address's frames may cost the loop
	refusals   addrBudgets    // how fast each source address is refused
	closed     bool           // no new connections once set
	live       map[*conn]bool // every connection with running goroutines
	wg         sync.WaitGroup // connection goroutines

	web *web // the status page (web.go); nil without an admin token

	// Owned by the loop goroutine.
	o          *core.Orchestrator
	conns      map[core.ConnID]*conn
	coreClosed map[core.ConnID]bool // the core closed these; their reads end silently
	calls      map[core.CallID]chan core.APIAnswer
	// pendingReq: request ids of data writes admitted into groups not yet
	// durable (stepdata.go); a repeat of one is not fenced again.
	pendingReq map[requestKey]pendingRequest
	timer      *time.Timer
	deadline   time.Time // the core's next deadline, as armed
	inFlight   []*flight // the groups being made durable, oldest first (at most depth)
	next       *flight   // the group stepped since, waiting for the store
	spare      []*flight // landed groups, emptied, whose arrays the next groups reuse

	stats loopStats // how long each batch held the loop (SPEC §12)

	m     *metrics    // Prometheus metrics (SPEC §16)
	ready atomic.Bool // restored and serving (/readyz)

	operators atomic.Pointer[operatorView] // the operator tokens, for the HTTP side (operators.go)
	stopping  atomic.Bool                  // Shutdown or Close began (/readyz)
}

// A query's claim (query.claim).
const (
	queryPending int32 = iota
	queryRun
	queryAbandoned
)

// Inputs of the loop.
type (
	input  interface{}
	opened struct{ c *conn }
	frame  struct {
		conn core.ConnID
		msg  core.Msg
		from *conn // holds one of its input tokens until the loop takes it
	}
	dropped struct {
		conn   core.ConnID
		reason string
	}
	call struct {
		in    core.Input
		reply chan core.APIAnswer
	}
	query struct {
		f    func(*core.Orchestrator)
		done chan struct{}
		// claim decides, once, who has the query: the loop (queryRun),
		// which then runs f, or its caller giving up (queryAbandoned),
		// after which f never runs and the caller may read what f writes.
		claim *atomic.Int32
	}
	tick struct{}
	// heartbeats (beats.go): the heartbeat frames of many connections
)

// Start opens the store, restores the orchestrator from it (an empty store
// gives an empty orchestrator), persists the restore batch, and starts the
// loop and the control plane.
func Start(opts Options) (*Driver, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.MaxConns <= 0 {
		opts.MaxConns = defaultMaxConns
	}
	if opts.MaxUnauthConns <= 0 {
		opts.MaxUnauthConns = DefaultMaxUnauthConns
	}
	if opts.MaxUnauthConnsPerAddr <= 0 {
		opts.MaxUnauthConnsPerAddr = DefaultMaxUnauthConnsPerAddr
	}
	if opts.HelloTimeout <= 0 {
		opts.HelloTimeout = DefaultHelloTimeout
	}
	if opts.ReadWait <= 0 {
		opts.ReadWait = readWait
	}
	for _, l := range []struct {
		v   *int64
		def int64
	}{{&opts.MaxPutBody, DefaultMaxPutBody}, {&opts.MaxAppendBody, DefaultMaxAppendBody}, {&opts.MaxStream, DefaultMaxStream},
		{&opts.MaxBundleBody, DefaultMaxBundleBody}, {&opts.MaxDataInFlight, DefaultMaxDataInFlight}} {
		if *l.v <= 0 {
			*l.v = l.def
		}
	}
	if opts.MaxSubmitBody <= 0 {
		opts.MaxSubmitBody = DefaultMaxSubmitBody
	}
	opts.MaxDataInFlight = max(opts.MaxDataInFlight, opts.MaxAppendBody)
	if opts.BodyIdleTimeout <= 0 {
		opts.BodyIdleTimeout = DefaultBodyIdleTimeout
	}
	for _, l := range []struct {
		v   *time.Duration
		def time.Duration
	}{{&opts.IdleTimeout, DefaultIdleTimeout}, {&opts.HeaderTimeout, DefaultHeaderTimeout}, {&opts.BodyTimeout, DefaultBodyTimeout},
		{&opts.WriteTimeout, DefaultWriteTimeout}, {&opts.bundleBody, bundleBodyTimeout}} {
		if *l.v <= 0 {
			*l.v = l.def
		}
	}
	if opts.MaxEventStreams <= 0 {
		opts.MaxEventStreams = DefaultMaxEventStreams
	}
	if opts.WorkPerSec == 0 {
		opts.WorkPerSec = DefaultWorkPerSec
	}
	if opts.RefusalsPerSec == 0 {
		opts.RefusalsPerSec = DefaultRefusalsPerSec
	}
	if opts.MaxTCPConns <= 0 {
		opts.MaxTCPConns = opts.MaxConns + DefaultExtraTCPConns
	}
	if opts.MaxConnsPerAddr <= 0 {
		opts.MaxConnsPerAddr = max(1, opts.MaxTCPConns*3/4)
	}
	opts.MaxConnsPerAddr = min(opts.MaxConnsPerAddr, opts.MaxTCPConns)
	d := &Driver{
		opts:       opts,
		log:        opts.Logger,
		inputs:     make(chan input, inputQueue),
		quit:       make(chan struct{}),
		ended:      make(chan struct{}),
		done:       make(chan struct{}),
		live:       map[*conn]bool{},
		unauthFrom: map[string]int{},
		work:       workBudgets(opts.WorkPerSec),
		refusals:   addrBudgets{rate: float64(opts.RefusalsPerSec), burst: 2 * float64(opts.RefusalsPerSec), off: opts.RefusalsPerSec < 0},
		conns:      map[core.ConnID]*conn{},
		coreClosed: map[core.ConnID]bool{},
		calls:      map[core.CallID]chan core.APIAnswer{},
		pendingReq: map[requestKey]pendingRequest{},
		streams:    newBroker(opts.MaxEventStreams),
	}
	started := false
	defer func() {
		if !started && opts.Listener != nil {
			opts.Listener.Close()
		}
	}()
	st := opts.Store
	if st == nil {
		bst, err := store.Open(opts.StorePath)
		if err != nil {
			return nil, fmt.Errorf("orchestrator: %w", err)
		}
		st = bst
	}
	d.st, d.depth = st, 1
	if p, ok := st.(store.Pipeline); ok && p.PipelineDepth() > 1 {
		d.pipe, d.depth = p, p.PipelineDepth()
	}
	if err := d.openSecrets(opts); err != nil {
		st.Close()
		return nil, fmt.Errorf("orchestrator: %w", err)
	}
	recs, err := st.Load()
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("orchestrator: %w", err)
	}
	cfg := opts.Config
	cfg.NoStateCache = true // this driver never fingerprints nor clones the core
	o, rd, err := core.Restore(cfg, time.Now(), recs)
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("orchestrator: restore from %s: %w", opts.StorePath, err)
	}
	d.o = o
	// The restore batch is a batch like any other; no connection exists yet,
	// so it has nothing to send.
	if err := st.Apply(rd.Records); err != nil {
		st.Close()
		return nil, fmt.Errorf("orchestrator: persist restore batch: %w", err)
	}
	d.emitLogs(rd)
	if opts.AdminToken != "" {
		// The admin-token file is the operator token "admin" (SPEC §15a).
		hash := sha256.Sum256([]byte(opts.AdminToken))
		if opts.AdminShared {
			for _, t := range o.Operators() {
				if t.Name == core.AdminOperator && t.Hash != hash {
					st.Close()
					return nil, fmt.Errorf("%w: every orchestrator of a shared store needs the same admin-token file; copy the one the others use", ErrAdminMismatch)
				}
			}
		}
		rd := o.Step(time.Now(), core.SetAdmin{Hash: hash})
		if err := st.Apply(rd.Records); err != nil {
			st.Close()
			return nil, fmt.Errorf("orchestrator: persist the admin token: %w", err)
		}
		d.emitLogs(rd)
	}
	d.refreshOperators()
	archived, err := st.ArchivedRuns()
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("orchestrator: %w", err)
	}
	d.log.Info("orchestrator restored", "store", opts.StorePath, "records", len(recs), "live_runs", len(o.RunIDs()), "archived_runs", archived)

	ln := opts.Listener
	if ln == nil {
		ln, err = net.Listen("tcp", opts.Addr)
	}
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("orchestrator: listen on %s: %w", opts.Addr, err)
	}
	d.ln = newCapListener(ln, opts.MaxTCPConns, opts.MaxConnsPerAddr, opts.WriteTimeout, d.log)
	mux := newRouteMux()
	d.mux = mux
	mux.HandleFunc("/control", d.serveControl)
	d.dp = &dataPlane{d: d, mem: newBudget(opts.MaxDataInFlight)}
	d.m = newMetrics(d)
	mux.HandleFunc("/livez", d.livez)
	mux.HandleFunc("/readyz", d.readyz)
	mux.Handle("/metrics", d.m.handler(d, opts.MetricsToken))
	d.routes(mux) // the operator API (api.go)
	if opts.AdminToken != "" {
		d.web = newWeb(d, opts.AdminToken, mux) // the status page calls the API in-process
		mux.Handle("/", d.web)
	}
	mux.Handle("/data/", d.dp)
	mux.Handle("/bundle/", d.dp)
	mux.Handle("/data", d.dp) // a query (SPEC §14)
	mux.Handle("/step/", d.dp)
	mux.Handle("/pool", d.dp)
	mux.Handle("/secret/", d.dp)
	mux.Handle("/token", d.dp) // a step mints a token into a secret (SPEC §14a)
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true) // the WebSocket upgrade of /control
	if opts.TLS != nil {
		protocols.SetHTTP2(true)
	} else {
		protocols.SetUnencryptedHTTP2(true) // h2c with prior knowledge
	}
	// SPEC §12: no ReadTimeout or WriteTimeout, which are absolute per
	// request (the h2 server's per stream) and would cut a long upload or a
	// long response to a slow reader that keeps reading; instead the
	// headers, the bodies and every write have their own deadlines. The
	// control WebSocket, hijacked, keeps its own rules (conn.go).
	d.srv = &http.Server{
		Handler: d.throttleRefused(d.bodyDeadline(mux)), ErrorLog: slog.NewLogLogger(d.log.Handler(), slog.LevelWarn), Protocols: protocols,
		ReadHeaderTimeout: opts.HeaderTimeout,
		IdleTimeout:       opts.IdleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams:          h2MaxStreams,
			MaxReadFrameSize:              h2MaxFrameBytes,
			MaxReceiveBufferPerConnection: h2UploadBufferConnBytes,
			MaxReceiveBufferPerStream:     h2UploadBufferStreamBytes,
			SendPingTimeout:               h2PingAfter,
			PingTimeout:                   h2PingTimeout,
			WriteByteTimeout:              opts.WriteTimeout,
		},
	}
	if opts.TLS != nil {
		d.srv.TLSConfig = opts.TLS.Clone()
	}
	d.srv.RegisterOnShutdown(d.streams.shutdown) // live streams end, so Shutdown need not wait for them
	d.timer = time.NewTimer(time.Hour)
	d.arm(rd.Deadline)

	d.beats = newBeats(min(maxBeatWait, o.Config().HeartbeatInterval/100), func(in input) error { return d.push(context.Background(), in) })
	// The loop's goroutine carries the profile label goroutine=loop (a
	// commit's, goroutine=commit; the few others the loop starts, such as
	// a hang-up, inherit loop), so a CPU profile (--pprof) shows its share:
	// go tool pprof -tagfocus goroutine=loop. In an execution
	// trace each batch the loop measures (LoopStats) is a region, "batch",
	// or "land" for a group released while idle (SPEC §12, the loop's
	// longest step).
	d.wg.Add(3) // before the loop starts: a loop that fails at once waits for these in run
	go pprof.Do(context.Background(), pprof.Labels("goroutine", "loop"), func(context.Context) { d.run() })
	go d.pruner(st, o.Config().Retention)
	go d.releaser(st)
	go d.pingSweep()
	go func() {
		var err error
		if opts.TLS != nil {
			err = d.srv.ServeTLS(d.ln, "", "")
		} else {
			err = d.srv.Serve(d.ln)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.Error("control plane stopped", "err", err)
		}
	}()
	d.ready.Store(true)
	d.log.Info("control plane listening", "url", d.URL(), "data_plane", d.DataURL(), "tls", opts.TLS != nil)
	started = true
	return d, nil
}

// RefusedConns returns how many connections the listener refused over its
// total cap and over the per-address cap (Options.MaxTCPConns,
// MaxConnsPerAddr) since Start.
func (d *Driver) RefusedConns() (total, perAddr int64) { return d.ln.Refused() }

// bodyDeadline gives every request with a body a read deadline of
// BodyTimeout from its headers (SPEC §12): the operator API's, and those of
// routes that read no body (net/http then discards up to 256 KiB of it
// before reusing the connection). A handler may set its own with
// http.ResponseController (the data plane does; a bundle upload gets
// longer). Once the body is read to its end the deadline is lifted, so it
// does not cut the response that follows. An HTTP/2 response's writes get
// a per-write deadline of WriteTimeout (h2StreamWrites).
func (d *Driver) bodyDeadline(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		if r.Body != nil && r.Body != http.NoBody {
			_ = rc.SetReadDeadline(time.Now().Add(d.opts.BodyTimeout))
			r.Body = &liftAtEOF{ReadCloser: r.Body, rc: rc}
		}
		if r.ProtoMajor != 2 {
			h.ServeHTTP(w, r) // HTTP/1.1: the connection's own write deadline (capConn)
			return
		}
		h.ServeHTTP(&h2StreamWrites{ResponseWriter: w, rc: rc, timeout: d.opts.WriteTimeout}, r)
		// The response's last bytes are flushed after the handler returns.
		_ = rc.SetWriteDeadline(time.Now().Add(d.opts.WriteTimeout))
	})
}

// liftAtEOF is a request body that clears the read deadline once read to
// its end.
type liftAtEOF struct {
	io.ReadCloser
	rc     *http.ResponseController
	lifted bool
}

func (b *liftAtEOF) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.lifted {
		b.lifted = true
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// Addr returns the address the control plane listens on.
func (d *Driver) Addr() string { return d.ln.Addr().String() }

// URL returns the control plane's WebSocket URL, for workers: wss:// when
// serving TLS.
func (d *Driver) URL() string {
	if d.opts.TLS != nil {
		return "wss://" + d.Addr() + "/control"
	}
	return "ws://" + d.Addr() + "/control"
}

// APIURL returns the base URL of the operator API (see Options.AdminToken).
func (d *Driver) APIURL() string { return d.DataURL() + "/api" }

// DataURL returns the base URL of the data plane (http:// for h2c, or
// https://), without a trailing slash.
func (d *Driver) DataURL() string { return dataURL(d.opts.TLS != nil, d.Addr()) }

// Done is closed once the driver has stopped (Close, or a store failure).
func (d *Driver) Done() <-chan struct{} { return d.done }

// Close stops the driver without stepping anything more: it stops listening,
// drops every connection, waits for its goroutines and closes the store.
// Inputs not yet persisted are lost, exactly as in a crash, and nothing of
// theirs has left the process. It returns the error that stopped the loop,
// if one did.
func (d *Driver) Close() error {
	d.stopping.Store(true)
	d.once.Do(func() { close(d.quit) })
	<-d.done
	return d.err
}

// Shutdown stops gracefully: it stops accepting HTTP requests, lets the
// operator API requests in progress finish (until ctx ends), then Closes.
// Control connections are hijacked, so Shutdown does not wait for them; they
// are dropped by Close and their workers reconnect to the next start.
func (d *Driver) Shutdown(ctx context.Context) error {
	d.stopping.Store(true)
	serr := d.srv.Shutdown(ctx)
	if err := d.Close(); err != nil {
		return err
	}
	if serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		return fmt.Errorf("orchestrator: shutdown: %w", serr)
	}
	return nil
}

// run is the loop goroutine; when the loop ends it tears everything down.
func (d *Driver) run() {
	err := d.loop()
	if lerr := d.landAll(); err == nil { // groups still in flight after an error end as any other
		err = lerr
	}
	if d.next != nil { // stepped after an error: never durable, so nobody may hear "written"
		for _, pw := range d.next.writes {
			close(pw.reply)
		}
		d.next = nil
	}
	close(d.ended)
	if err != nil {
		d.log.Error("orchestrator loop stopped", "err", err)
	}
	d.timer.Stop()
	for _, reply := range d.calls {
		close(reply)
	}
	d.srv.Close()
	d.sayGoingAway()
	d.mu.Lock()
	d.closed = true
	for c := range d.live {
		c.abort()
	}
	d.mu.Unlock()
	d.wg.Wait()
	if cerr := d.st.Close(); cerr != nil && err == nil {
		err = cerr
	}
	d.err = err
	close(d.done)
}

// sayGoingAway closes every control connection the loop holds once its
// queued frames are written, with a going-away close frame (1001), and waits
// for that a bounded time (loop goroutine, after the loop ended).
func (d *Driver) sayGoingAway() {
	ids := make([]core.ConnID, 0, len(d.conns))
	for id, c := range d.conns {
		c.closeAfterQueued(closeGoingAway, "orchestrator shutting down")
		ids = append(ids, id)
	}
	deadline := time.NewTimer(goingAwayWait)
	defer deadline.Stop()
	for _, id := range ids {
		select {
		case <-d.conns[id].stop:
		case <-deadline.C:
			return
		}
	}
}

// flushQueued processes the inputs already queued when the driver was told
// to stop, so what a worker or an operator sent before is committed (and
// answered) rather than dropped.
func (d *Driver) flushQueued() error {
	for n := len(d.inputs); n > 0; {
		batch := make([]input, 0, min(n, maxBatch))
		for len(batch) < cap(batch) {
			batch = append(batch, <-d.inputs)
		}
		n -= len(batch)
		if err := d.process(batch); err != nil {
			return err
		}
	}
	return d.settle()
}

func (d *Driver) loop() error {
	batch := make([]input, 0, maxBatch)
	for {
		batch = batch[:0]
		var landed <-chan struct{} // nil (never ready) when nothing is in flight
		if len(d.inFlight) > 0 {
			landed = d.inFlight[0].done
		}
		select {
		case <-d.quit:
			if err := d.settle(); err != nil {
				return err
			}
			return d.flushQueued()
		case <-landed:
			// The oldest group is durable: release it, and hand the store
			// what was stepped meanwhile.
			rg := trace.StartRegion(context.Background(), "land")
			t0 := time.Now()
			err := d.land()
			if err == nil {
				d.launchNext()
			}
			d.stats.add(time.Since(t0), 0)
			rg.End()
			if err != nil {
				return err
			}
			continue
		case <-d.timer.C:
			batch = append(batch, tick{})
		case in := <-d.inputs:
			batch = append(batch, in)
		}
	drain:
		for len(batch) < maxBatch {
			select {
			case in := <-d.inputs:
				batch = append(batch, in)
			default:
				break drain
			}
		}
		rg := trace.StartRegion(context.Background(), "batch")
		t0 := time.Now()
		err := d.process(batch)
		d.stats.add(time.Since(t0), len(batch))
		rg.End()
		if err != nil {
			return err
		}
	}
}

// commitLabels label a commit's goroutine in CPU profiles (the loop's are
// goroutine=loop, Start).
var commitLabels = pprof.Labels("goroutine", "commit")

// flight is a group of stepped batches on its way to the store. Its commit
// runs on its own goroutine while the loop steps the next batches into the
// next group (SPEC §12). At most depth are in flight: one, or, on a
// store.Pipeline, its depth, each in the place the loop reserved for it
// when it put the group in flight, so the store makes them durable in the
// order they were stepped and never a later one without every earlier one.
// The loop releases them (land) oldest first, each only once durable: a
// group's messages leave only after every group before it left (SPEC §11).
// A group with data writes goes alone (ApplyWithData is no place of the
// pipeline): it is put in flight only when nothing is, and nothing follows
// it into flight before it landed.
type flight struct {
	group   commit.Group   // the same write-ahead code the simulator runs
	ops     []store.DataOp // fenced data writes, persisted with the group
	writes  []pendingWrite // their answers, and the refused ones', in order
	queries []query        // run once the group is durable
	inputs  int            // inputs stepped into the group

	// For the metrics (metrics.go), taken at each Step, observed at land.
	grants                         int
	dispatchLatency, submitToStart []float64
	results                        []store.DataResult // written by the commit goroutine: ops' outcomes
	err                            error              // written by the commit goroutine
	records                        int                // written by the commit goroutine: records persisted
	took                           time.Duration      // written by the commit goroutine: the store's time
	done                           chan struct{}      // closed when results and err are set
}

// launch starts f's commit on its own goroutine, in the next place of the
// pipeline when the store has one.
func (d *Driver) launch(f *flight) {
	f.done = make(chan struct{})
	d.inFlight = append(d.inFlight, f)
	apply := d.st.Apply
	if d.pipe != nil && len(f.ops) == 0 {
		apply = d.pipe.Reserve() // on the loop: places in the order groups were stepped
	}
	go pprof.Do(context.Background(), commitLabels, func(context.Context) {
		defer close(f.done)
		f.err = f.group.Persist(func(recs []core.Record) error {
			t0 := time.Now()
			defer func() { f.records, f.took = len(recs), time.Since(t0) }()
			if len(f.ops) > 0 {
				var err error
				if f.results, err = d.st.ApplyWithData(recs, f.ops); err != nil {
					return fmt.Errorf("persist batch of %d records and %d data writes: %w", len(recs), len(f.ops), err)
				}
				return nil
			}
			if err := apply(recs); err != nil {
				return fmt.Errorf("persist batch of %d records: %w", len(recs), err)
			}
			return nil
		})
	})
}

// land waits for the oldest group in flight, if any, to be durable, then
// releases it (core/doc.go, duty 4): its messages in order (closing what the
// core closed), its API answers, its data writes' answers, its queries. If
// its commit failed nothing of it leaves, nor of any group in flight after
// it, and the error is returned.
func (d *Driver) land() error {
	if len(d.inFlight) == 0 {
		return nil
	}
	f := d.inFlight[0]
	<-f.done
	d.inFlight[0] = nil
	d.inFlight = d.inFlight[1:]
	d.released(f.ops)
	if f.err != nil {
		d.abandon(f)
		for _, g := range d.inFlight { // whatever the store said of them, later groups stay unsaid
			<-g.done
			d.released(g.ops)
			d.abandon(g)
		}
		d.inFlight = nil
		return f.err
	}
	for _, rd := range f.group.Readys() {
		if changesOperators(rd) { // before any answer: a token is usable, or refused, once its creator or revoker hears so
			d.refreshOperators()
			break
		}
	}
	f.group.Release(d.deliver, func(a core.APIAnswer) {
		if reply, ok := d.calls[a.Call]; ok {
			reply <- a // buffered: never blocks
			delete(d.calls, a.Call)
		}
	})
	for _, pw := range f.writes {
		if pw.err != nil {
			pw.reply <- dataAnswer{err: pw.err} // buffered: never blocks
		} else {
			pw.reply <- dataAnswer{res: f.results[pw.op]}
		}
	}
	// The live streams get the group now that it is durable (SPEC §11),
	// before the queries: a stream that subscribes in one of them starts
	// from the state after this group, and hears the groups after it.
	for _, rd := range f.group.Readys() {
		d.streams.publish(rd)
	}
	for _, q := range f.queries {
		if q.claim.CompareAndSwap(queryPending, queryRun) {
			q.f(d.o)
		}
		close(q.done)
	}
	for _, rd := range f.group.Readys() {
		d.emitLogs(rd)
	}
	d.m.landed(d, f)
	d.recycle(f)
	return nil
}

// recycle empties a landed group for a next one, keeping its arrays: a
// group per commit would otherwise grow them afresh each time (fewer bytes
// allocated, fewer collections to lengthen the loop's batches: SPEC §12,
// the loop's longest step). What they held is cleared, so nothing of it
// stays reachable. There are at most depth+1 groups (in flight, and the
// next), so at most that many spares.
func (d *Driver) recycle(f *flight) {
	f.group.Reset()
	clear(f.ops)
	clear(f.writes)
	clear(f.queries)
	*f = flight{group: f.group, ops: f.ops[:0], writes: f.writes[:0], queries: f.queries[:0],
		dispatchLatency: f.dispatchLatency[:0], submitToStart: f.submitToStart[:0]}
	d.spare = append(d.spare, f)
}

// abandon ends a group that will never be released: nobody may hear
// "written".
func (d *Driver) abandon(f *flight) {
	for _, pw := range f.writes {
		close(pw.reply)
	}
}

// landAll lands every group in flight, oldest first.
func (d *Driver) landAll() error {
	for len(d.inFlight) > 0 {
		if err := d.land(); err != nil {
			return err
		}
	}
	return nil
}

// canLaunch says whether f may go in flight now: the pipeline has room,
// neither f nor a group in flight has data writes (those go alone), and f
// already holds as many inputs as the newest group in flight. That last
// rule keeps groups as large as one at a time makes them: f goes early
// only about when the group before it would have landed, which hides the
// time between two commits without splitting what one would carry (a
// step's slot spans its grant's group and its report's; a group put in
// flight early would make it span three).
func (d *Driver) canLaunch(f *flight) bool {
	if len(d.inFlight) == 0 {
		return true
	}
	if len(d.inFlight) >= d.depth || len(f.ops) > 0 {
		return false
	}
	for _, g := range d.inFlight {
		if len(g.ops) > 0 {
			return false
		}
	}
	return f.inputs >= d.inFlight[len(d.inFlight)-1].inputs
}

// launchNext puts the next group in flight, if it holds anything and may
// go now (canLaunch).
func (d *Driver) launchNext() {
	f := d.next
	if f == nil {
		return
	}
	if f.group.Len() == 0 && len(f.writes) == 0 && len(f.queries) == 0 {
		d.next = nil
		d.recycle(f)
		return
	}
	if !d.canLaunch(f) {
		return
	}
	d.next = nil
	d.launch(f)
}

// settle makes everything stepped durable and released: the groups in
// flight, then the next one. Afterwards the core's state is durable.
func (d *Driver) settle() error {
	if err := d.landAll(); err != nil {
		return err
	}
	d.launchNext()
	return d.landAll()
}

// received steps a frame a connection read, unless the core already
// treats the connection as gone.
func (d *Driver) received(in frame, step func(core.Input) core.Ready) error {
	if in.from != nil {
		in.from.taken()
	}
	if d.coreClosed[in.conn] || d.conns[in.conn] == nil {
		return nil
	}
	rcv := core.Received{Conn: in.conn, Msg: in.msg}
	if _, err := rand.Read(rcv.Entropy[:]); err != nil {
		return fmt.Errorf("read entropy: %w", err)
	}
	step(rcv)
	return nil
}

// process steps a batch of inputs into the next group (core/doc.go, duties
// 2 and 5), and puts that group in flight at once if it may (canLaunch), or
// once the oldest groups landed if it is full; otherwise it waits for the
// oldest group in flight to land
// (the loop's select), gathering more batches meanwhile (group commit). What
// reads the state for an answer needs it durable: the data plane's early
// checks are answered, and a batch's queries run, only after settle.
func (d *Driver) process(batch []input) error {
	reads := false // a precheck or a query
	for _, in := range batch {
		switch in.(type) {
		case precheck, query:
			reads = true
		}
	}
	if reads {
		if err := d.settle(); err != nil {
			return err
		}
	}
	// The data plane's early checks see the state as the last batch left
	// it, which is durable (settled): they are answered at once, before
	// this batch is stepped, so they never wait for its commit (SPEC §14).
	for _, in := range batch {
		if pc, ok := in.(precheck); ok {
			pc.reply <- d.precheck(pc) // buffered: never blocks
		}
	}
	if d.next == nil {
		if n := len(d.spare); n > 0 {
			d.next, d.spare[n-1], d.spare = d.spare[n-1], nil, d.spare[:n-1]
		} else {
			d.next = &flight{}
		}
	}
	f := d.next
	f.inputs += len(batch)
	stepped, dl := false, d.deadline
	step := func(in core.Input) core.Ready {
		rd := d.o.Step(time.Now(), in)
		if !emptyReady(rd) { // an idle heartbeat's: nothing to persist or release
			f.group.Add(rd)
		}
		d.m.stepped(d.o, rd, f)
		stepped, dl = true, rd.Deadline // the last Ready's Deadline is the core's earliest timer now
		return rd
	}
	for _, in := range batch {
		switch in := in.(type) {
		case tick:
			step(core.Tick{})
		case opened:
			d.conns[in.c.id] = in.c
		case frame:
			if err := d.received(in, step); err != nil {
				return err
			}
		case heartbeats:
			for _, fr := range in.frames {
				if err := d.received(fr, step); err != nil {
					return err
				}
			}
		case dropped:
			delete(d.conns, in.conn)
			if d.coreClosed[in.conn] {
				delete(d.coreClosed, in.conn) // closed by the core: not a Disconnected
				continue
			}
			d.log.Info("control connection dropped", d.connAttrs(in.conn, "reason", in.reason)...)
			step(core.Disconnected{Conn: in.conn})
		case call:
			if ct, ok := in.in.(core.CreateToken); ok {
				if _, err := rand.Read(ct.Secret[:]); err != nil {
					return fmt.Errorf("read entropy: %w", err)
				}
				in.in = ct
			}
			if co, ok := in.in.(core.CreateOperator); ok {
				if _, err := rand.Read(co.Secret[:]); err != nil {
					return fmt.Errorf("read entropy: %w", err)
				}
				in.in = co
			}
			d.calls[callID(in.in)] = in.reply
			step(in.in)
		case query:
			f.queries = append(f.queries, in)
		case dataWrite:
			// The core decides the write here, between the group's inputs
			// (after every timer due by now), and the write is made durable
			// with the group: no lease change can come between.
			if err := d.admitWrite(&in, step); err != nil {
				f.writes = append(f.writes, pendingWrite{reply: in.reply, err: err})
				continue
			}
			f.writes = append(f.writes, pendingWrite{reply: in.reply, op: len(f.ops)})
			f.ops = append(f.ops, in.op)
		}
	}
	// Duty 5.
	if stepped {
		d.arm(dl)
	}
	// Duties 3 and 4, in land and launch: a group is released only once
	// durable, and only after the groups before it.
	if reads {
		return d.settle()
	}
	for f.inputs >= maxBatch && !d.canLaunch(f) {
		if err := d.land(); err != nil {
			return err
		}
	}
	d.launchNext()
	return nil
}

// emptyReady says whether a batch holds nothing to persist or release (a
// heartbeat that changed nothing, SPEC §8): it joins no group, so a group of
// such batches costs no commit (on PostgreSQL, no proof of leadership,
// which only what leaves needs) and no goroutine.
func emptyReady(rd core.Ready) bool {
	return len(rd.Records) == 0 && len(rd.Messages) == 0 && len(rd.Answers) == 0 && len(rd.Events) == 0 &&
		len(rd.Logs) == 0 && len(rd.Transitions) == 0 && len(rd.Writes) == 0 && len(rd.Audit) == 0
}

// pendingWrite is a data write's answer, sent once its group is durable:
// its refusal, or the result of ops[op].
type pendingWrite struct {
	reply chan dataAnswer
	err   error
	op    int
}

func callID(in core.Input) core.CallID {
	switch in := in.(type) {
	case core.Submit:
		return in.Call
	case core.CancelRun:
		return in.Call
	case core.Approve:
		return in.Call
	case core.RejectGate:
		return in.Call
	case core.CreateToken:
		return in.Call
	case core.RevokeToken:
		return in.Call
	case core.CreateOperator:
		return in.Call
	case core.RevokeOperator:
		return in.Call
	case core.Audit:
		return in.Call
	case core.CreateSchedule:
		return in.Call
	case core.ChangeSchedule:
		return in.Call
	}
	panic(fmt.Sprintf("orchestrator: %T is not an API call", in))
}

// arm sets the timer for the core's next deadline (zero: none).
func (d *Driver) arm(at time.Time) {
	d.deadline = at
	d.timer.Stop()
	if !at.IsZero() {
		d.timer.Reset(max(time.Until(at), 0))
	}
}

// deliver encodes one message for its connection. After a Close or Refused
// the connection is closed once the frame is written, and its end is not
// reported to the core.
func (d *Driver) deliver(e core.Envelope) {
	c := d.conns[e.Conn]
	if c == nil {
		d.log.Debug("message for a gone connection dropped", "conn", uint64(e.Conn), "msg", core.DescribeMsg(e.Msg))
		return
	}
	b, err := wire.Encode(e.Msg)
	if err != nil {
		// The worker cannot receive it: to the protocol that is a broken
		// connection, which the core will hear about as a Disconnected. The
		// worker is told why in the close frame (1011), so its log says it
		// too. Submit refuses a step whose dispatch could not fit (SPEC
		// §12), so this is a bug or an environment grown since the submit.
		attrs := d.connAttrs(c.id, "kind", e.Msg.Kind(), "err", err)
		if m, ok := e.Msg.(core.Dispatch); ok {
			attrs = append(attrs, logging.LeaseAttrs(m.Lease, m.Step)...)
		}
		d.log.Error("cannot encode message; closing the connection", attrs...)
		reason := strings.TrimPrefix(err.Error(), wire.ErrFrameTooLarge.Error()+": ") // fits a close frame's 120 bytes
		c.loopSide.closing = true
		go c.hangUp(closeInternal, fmt.Sprintf("orchestrator cannot send a %s: %s", e.Msg.Kind(), reason)) // off the loop: the close frame may wait for the writer
		return
	}
	c.send(b)
	switch m := e.Msg.(type) {
	case core.Welcome:
		c.leaveUnauth(d) // authenticated: the core accepted its Hello
	case core.Close:
		d.closeByCore(c, closeCode(m), m.Reason)
	case core.Refused:
		code := closeTryAgain // the worker may retry
		if m.Fatal {
			code = closePolicy
		}
		d.closeByCore(c, code, m.Reason)
	}
}

func (d *Driver) closeByCore(c *conn, code int, reason string) {
	delete(d.conns, c.id)
	d.coreClosed[c.id] = true
	c.closeAfterQueued(code, reason)
}

func (d *Driver) emitLogs(rd core.Ready) {
	for _, e := range rd.Logs {
		attrs := make([]any, 0, 2*len(e.Fields))
		for _, f := range e.Fields {
			attrs = append(attrs, logging.CoreAttr(f))
		}
		d.log.Log(context.Background(), level(e.Level), e.Msg, attrs...)
	}
	for _, ev := range rd.Events {
		d.log.Info("server event", logging.Run, string(ev.Run), "seq", ev.Seq, logging.Step, string(ev.Step), "kind", ev.Kind, "message", ev.Message)
	}
}

// connAttrs are a log line's fields about a control connection: its id
// and, once its Hello was accepted, its worker's (SPEC §16); then more
// (loop goroutine).
func (d *Driver) connAttrs(c core.ConnID, more ...any) []any {
	attrs := []any{"conn", uint64(c)}
	if w, ok := d.o.ConnWorker(c); ok {
		attrs = append(attrs, logging.Worker, string(w))
	}
	return append(attrs, more...)
}

func level(s string) slog.Level {
	switch s {
	case "debug":
		return slog.LevelDebug
	case "warn", "warning":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	}
	return slog.LevelInfo
}

// push hands an input to the loop, blocking while the queue is full.
func (d *Driver) push(ctx context.Context, in input) error {
	select {
	case d.inputs <- in:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-d.quit:
		return ErrClosed
	case <-d.ended:
		return ErrClosed
	}
}

// ---- operator API ----

// do runs one API call and waits for its answer, which comes only after the
// call's batch is durable. If ctx ends first the call may still take effect.
func (d *Driver) do(ctx context.Context, mk func(core.CallID) core.Input) (core.APIAnswer, error) {
	id := core.CallID(d.nextCall.Add(1))
	reply := make(chan core.APIAnswer, 1)
	if err := d.push(ctx, call{in: mk(id), reply: reply}); err != nil {
		return core.APIAnswer{}, err
	}
	var a core.APIAnswer
	ok := false
	select {
	case a, ok = <-reply:
	case <-d.ended:
		// The loop stopped: a call it took was answered or never will be
		// (one pushed after it stopped stays in the queue).
		select {
		case a, ok = <-reply:
		default:
		}
	case <-ctx.Done():
		return core.APIAnswer{}, ctx.Err()
	}
	if !ok {
		return core.APIAnswer{}, ErrClosed
	}
	noted(ctx)
	if a.Err != "" {
		return a, &Refusal{Code: a.Code, Reason: a.Err}
	}
	return a, nil
}

// Refusal is the error of a call the core refused; it wraps ErrRefused.
// Code is the core's (core.CodeInvalid, CodeNotFound, CodeConflict,
// CodeForbidden), which the operator API answers as its status (SPEC §15:
// 400, 404, 409, 403).
type Refusal struct {
	Code   string
	Reason string
}

func (r *Refusal) Error() string { return ErrRefused.Error() + ": " + r.Reason }
func (r *Refusal) Unwrap() error { return ErrRefused }

// Submit submits a run and returns its id. The run is validated here first,
// off the loop (the core validates it again): an invalid run, however large,
// never reaches the loop (SPEC §12).
func (d *Driver) Submit(ctx context.Context, spec core.RunSpec) (core.RunID, error) {
	return d.SubmitChild(ctx, spec, "")
}

// parentError marks a submission refused for its parent run (unknown,
// finished, cancelling, full): the API answers 409, not 400.
type parentError struct{ error }

func (e parentError) Unwrap() error { return e.error }

// SubmitChild is Submit of a child run of parent (SPEC §2; "" for none):
// cancelling the parent cancels it.
func (d *Driver) SubmitChild(ctx context.Context, spec core.RunSpec, parent core.RunID) (core.RunID, error) {
	if err := spec.Validate(); err != nil {
		return "", fmt.Errorf("submit %s: %w: %w", core.Quote(spec.Name), ErrRefused, err)
	}
	if err := spec.CheckDispatchSizes(d.opts.Config.Env); err != nil {
		return "", fmt.Errorf("submit %s: %w: %w", core.Quote(spec.Name), ErrRefused, err)
	}
	a, err := d.do(ctx, func(id core.CallID) core.Input {
		return core.Submit{Call: id, Actor: actorOf(ctx), Spec: spec, Parent: parent}
	})
	if err != nil && (a.Code == core.CodeConflict || a.Code == core.CodeNotFound) {
		return "", parentError{fmt.Errorf("submit %q: %w", spec.Name, err)}
	}
	if err != nil {
		return "", fmt.Errorf("submit %q: %w", spec.Name, err)
	}
	return a.Run, nil
}

// CancelRun cancels every non-terminal step of a run.
func (d *Driver) CancelRun(ctx context.Context, run core.RunID, reason string) error {
	_, err := d.do(ctx, func(id core.CallID) core.Input {
		return core.CancelRun{Call: id, Actor: actorOf(ctx), Run: run, Reason: reason}
	})
	if err != nil {
		return fmt.Errorf("cancel %s: %w", run, err)
	}
	return nil
}

// CreateToken creates a named enrollment token valid for ttl and returns it
// ("<name>.<secret>"); it is shown only once.
func (d *Driver) CreateToken(ctx context.Context, name string, ttl time.Duration) (string, error) {
	a, err := d.do(ctx, func(id core.CallID) core.Input {
		return core.CreateToken{Call: id, Actor: actorOf(ctx), Name: name, TTL: ttl}
	})
	if err != nil {
		return "", fmt.Errorf("create token %q: %w", name, err)
	}
	return a.Token, nil
}

// CreateTokenIntoSecret creates an enrollment token and stores it, sealed,
// as secret (SPEC §9, §14a) in the same group as the token's record: it is
// never answered. With a credential and a lease, a step mints it, admitted
// only as a write of secret under that lease.
func (d *Driver) CreateTokenIntoSecret(ctx context.Context, name string, ttl time.Duration, secret, credential string, lease core.LeaseID) error {
	in := core.CreateToken{Call: core.CallID(d.nextCall.Add(1)), Actor: actorOf(ctx), Name: name, TTL: ttl, IntoSecret: secret,
		Credential: credential, Lease: lease}
	if _, err := rand.Read(in.Secret[:]); err != nil {
		return fmt.Errorf("read entropy: %w", err)
	}
	value := []byte(name + "." + hex.EncodeToString(in.Secret[:]))
	if err := d.changeSecret(ctx, in, store.DataOp{Kind: store.OpSecretPut, ID: secret, Body: value, Lease: uint64(lease)}); err != nil {
		return fmt.Errorf("create token %q into secret %q: %w", name, secret, err)
	}
	return nil
}

// Approve opens a held step's gate: the step is queued.
func (d *Driver) Approve(ctx context.Context, step core.StepID) error {
	_, err := d.do(ctx, func(id core.CallID) core.Input { return core.Approve{Call: id, Actor: actorOf(ctx), Step: step} })
	if err != nil {
		return fmt.Errorf("approve %s: %w", step, err)
	}
	return nil
}

// RejectGate closes a held step's gate: the step is cancelled.
func (d *Driver) RejectGate(ctx context.Context, step core.StepID) error {
	_, err := d.do(ctx, func(id core.CallID) core.Input { return core.RejectGate{Call: id, Actor: actorOf(ctx), Step: step} })
	if err != nil {
		return fmt.Errorf("reject %s: %w", step, err)
	}
	return nil
}

// RevokeToken revokes a token; its worker is disconnected and loses its leases.
func (d *Driver) RevokeToken(ctx context.Context, name string) error {
	_, err := d.do(ctx, func(id core.CallID) core.Input { return core.RevokeToken{Call: id, Actor: actorOf(ctx), Name: name} })
	if err != nil {
		return fmt.Errorf("revoke token %q: %w", name, err)
	}
	return nil
}

// Snapshot runs f on the loop goroutine, between batches, after every
// earlier batch is durable and sent. f must only read o (the query methods
// of core.Orchestrator return copies) and must not keep it.
func (d *Driver) Snapshot(ctx context.Context, f func(o *core.Orchestrator)) error {
	q := query{f: f, done: make(chan struct{}), claim: new(atomic.Int32)}
	if err := d.push(ctx, q); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	// giveUp returns err unless the loop already took the query, in which
	// case f is running or ran: wait for it (it is short) and succeed, so
	// the caller never reads what f writes while f writes it.
	giveUp := func(err error) error {
		if q.claim.CompareAndSwap(queryPending, queryAbandoned) {
			return err
		}
		<-q.done
		return nil
	}
	select {
	case <-q.done:
		return nil
	case <-d.ended:
		select {
		case <-q.done: // ran just before the loop stopped
			return nil
		default:
		}
		return giveUp(fmt.Errorf("snapshot: %w", ErrClosed))
	case <-ctx.Done():
		return giveUp(fmt.Errorf("snapshot: %w", ctx.Err()))
	}
}
