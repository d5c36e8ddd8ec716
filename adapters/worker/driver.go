// Package worker drives one core.Worker in the real world: it dials the
// orchestrator's WebSocket control plane, runs step processes with `sh -c`,
// and keeps the core's timers with the worker's own clock.
//
// One goroutine owns the Worker and applies each WorkerReady in the order
// core.WorkerReady documents: Send (on the current connection), Close, Dial,
// Exec, then Logs, and Exit last. Connections carry a generation number so
// that nothing from a connection the core gave up (Close) or a dial it
// abandoned is ever fed back.
package worker

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/tether-run/tether/adapters/logging"
	"github.com/tether-run/tether/adapters/wire"
	"github.com/tether-run/tether/core"
)

// inputQueue bounds the inputs waiting for the loop; producers (read loop,
// process output) block beyond it, which backpressures the step's pipe.
const inputQueue = 1024

// maxRefusalBytes bounds the reason read from a refused upgrade's body.
const maxRefusalBytes = 256

// ErrNoURL is returned by New when Options.URL is empty.
var ErrNoURL = errors.New("worker: no orchestrator URL")

// Options configures a Driver.
type Options struct {
	// URL is the orchestrator's control plane, e.g. ws://127.0.0.1:7070/control.
	URL string
	// URLs are more orchestrators of one highly available group (SPEC §11),
	// each dialed after URL in turn (see leader.go): a dial that fails, or
	// a standby's refusal, moves on to the leader it names, else to the
	// next URL; a host name that resolves to several addresses is each of
	// them.
	URLs []string
	// ReadWait is how long the control connection may be silent — no
	// frame, ping or pong from the orchestrator — before the worker takes
	// it for dead and dials again (zero: DefaultReadWait). The worker
	// pings once it has read nothing for ReadWait/2 (checked every
	// ReadWait/4), so an orchestrator whose host died without closing its
	// sockets, or whose process is stopped, is left within ReadWait
	// (SPEC §9, §10), not at the next write.
	ReadWait time.Duration
	// Config configures the core worker; an empty ID gets a random UUID and
	// a zero Seed a random one.
	Config core.WorkerConfig
	// Logger receives structured logs; nil means slog.Default().
	Logger *slog.Logger
	// Env is the base environment of step processes (the shipped env is
	// overlaid on it); nil means StepBaseEnv(os.Environ(), PassEnv): the
	// few variables a shell needs, not the worker's own (SPEC §10).
	Env []string
	// PassEnv are glob patterns (path.Match) of more variables of this
	// process's environment that step processes inherit when Env is nil
	// (worker connect --pass-env); TETHER_* never.
	PassEnv []string
	// WorkDir holds each dispatch's scratch and output directories (SPEC
	// §10); empty: a fresh directory under the system's temp dir, removed
	// when Run returns.
	WorkDir string
	// KeepScratch keeps each step's directory after it ends (a debugging
	// aid; the operator removes them).
	KeepScratch bool
	// CacheBytes bounds the read cache of data versions (SPEC §10); zero:
	// DefaultCacheBytes; negative: no cache.
	CacheBytes int64
	// OutputFiles and OutputBytes bound what a step may leave in
	// $TETHER_OUTPUT_DIR (zero: DefaultMaxOutputFiles, DefaultMaxOutputBytes).
	OutputFiles int
	OutputBytes int64
	// TLS configures wss:// and https:// connections (e.g. RootCAs for a
	// private CA); nil means the system's roots.
	TLS *tls.Config
	// DataURL is the data plane's base URL; empty derives it from URL
	// (ws → http, wss → https, same host).
	DataURL string
	// NoStepEndpoint turns off the loopback endpoint that gives step
	// processes the data plane (TETHER_DATA_URL and friends).
	NoStepEndpoint bool
	// Noop, a benchmarking aid, runs no process at all: every step
	// completes at once with exit code 0 and no output, so a benchmark
	// measures the orchestrator and the protocol rather than fork and exec.
	Noop bool
	// Shim, if set, is an executable that runs ShimMain when its first
	// argument is ShimArg (the worker binary itself): each step's shell runs
	// under it, so the step's process tree dies with the worker and a
	// finished step leaves no background process behind (§10). Ignored
	// unless ShimSupported; empty: each step's shell leads its own group.
	Shim string
	// SaveCredential, if set, is called with the session credential when
	// the core learns one it did not boot with (the enrollment Welcome),
	// before anything else of that step is acted on (SPEC §9): a worker
	// that keeps its identity across restarts saves it durably here. An
	// error stops the worker: Run returns it (wrapping ErrSaveCredential).
	SaveCredential func(credential string) error
}

// ErrSaveCredential wraps a failure of Options.SaveCredential.
var ErrSaveCredential = errors.New("worker: cannot save the session credential")

// Driver runs one worker. Run may be called once.
type Driver struct {
	opts Options
	log  *slog.Logger
	w    *core.Worker

	inputs chan input
	done   chan struct{} // closed when Run is returning: producers stop
	wg     sync.WaitGroup

	data     *DataClient
	cred     atomic.Pointer[string] // the session credential, for the data plane
	saved    string                 // the credential last saved (or booted with)
	exit     *core.WorkerExit       // the core's exit, once Run returned it
	endpoint *stepEndpoint          // nil when off
	workDir  string                 // each dispatch's directories (SPEC §10)
	tempWork bool                   // workDir was made by Run: removed when it returns
	urls     []string               // the control URLs given, in order (Options.URL, then URLs)

	// Owned by the loop goroutine: the URL to dial first (the one that
	// connected last, or the leader a standby named).
	pref string

	// Owned by the loop goroutine.
	ctx        context.Context
	gen        uint64 // generation of the current connection or dial
	cur        *conn  // current connection, nil when none
	dialCancel func() // cancels the pending dial, nil when none
	procs      map[core.LeaseID]*proc
	secrets    map[core.LeaseID]*stepSecrets // what a step is given (secrets.go)
	timer      *time.Timer
	local      []input        // inputs the loop made itself (no-op exits), taken before the queue
	stepped    []core.LeaseID // leases whose output batch the current Step took
}

// Inputs of the loop.
type (
	input  interface{}
	dialed struct {
		gen  uint64
		ws   *websocket.Conn
		cc   *wire.CorkConn // the TCP connection under ws (and under TLS, for wss)
		at   target         // where ws is connected
		next string         // after a failure: the URL to dial first next time ("": as before)
		err  error
	}
	received struct {
		gen uint64
		msg core.Msg
	}
	lost struct {
		gen    uint64
		reason string
	}
	output struct {
		lease core.LeaseID
		lines []string
	}
	exited   core.WExecExited
	drainReq struct{}
)

// New returns a worker driver.
func New(opts Options) (*Driver, error) {
	if opts.URL == "" {
		return nil, ErrNoURL
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Env == nil {
		opts.Env = StepBaseEnv(os.Environ(), opts.PassEnv)
	}
	if opts.CacheBytes == 0 {
		opts.CacheBytes = DefaultCacheBytes
	}
	if opts.OutputFiles <= 0 {
		opts.OutputFiles = DefaultMaxOutputFiles
	}
	if opts.OutputBytes <= 0 {
		opts.OutputBytes = DefaultMaxOutputBytes
	}
	if opts.Config.ID == "" {
		opts.Config.ID = core.WorkerID(newUUID())
	}
	if !ShimSupported || opts.Noop {
		opts.Shim = ""
	}
	if opts.Config.Seed == 0 {
		var b [8]byte
		rand.Read(b[:])
		for _, x := range b {
			opts.Config.Seed = opts.Config.Seed<<8 | uint64(x)
		}
	}
	followData := opts.DataURL == "" // the data plane is the connected orchestrator's
	if followData {
		u, err := DataURLFor(opts.URL)
		if err != nil {
			return nil, err
		}
		opts.DataURL = u
	}
	urls := []string{opts.URL}
	for _, u := range opts.URLs {
		if _, err := DataURLFor(u); err != nil {
			return nil, err
		}
		if !slices.Contains(urls, u) {
			urls = append(urls, u)
		}
	}
	d := &Driver{
		opts:   opts,
		w:      core.NewWorker(opts.Config),
		inputs: make(chan input, inputQueue),
		done:   make(chan struct{}),
		procs:  map[core.LeaseID]*proc{},
		saved:  opts.Config.Credential,
		urls:   urls,
		pref:   urls[0],
	}
	d.log = opts.Logger.With("worker", opts.Config.Name, "worker_id", string(opts.Config.ID))
	data, err := NewDataClient(opts.DataURL, opts.TLS, func() string {
		if c := d.cred.Load(); c != nil {
			return *c
		}
		return ""
	})
	if err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	d.data = data
	data.follow = followData
	data.onLeader = func(leader string) {
		d.log.Warn("data plane: a standby answered; following the leader it names", "leader", leader)
	}
	data.onRetry = func(method, path, requestID string, attempt int, err error) {
		d.log.Warn("data plane: sending a write again with the same request id", "method", method, "path", path,
			"request_id", requestID, "attempt", attempt, "err", err)
	}
	return d, nil
}

// DataURLFor derives the data plane's base URL from the control plane's:
// ws://HOST/control → http://HOST, wss:// → https://.
func DataURLFor(control string) (string, error) {
	u, err := url.Parse(control)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("worker: control URL %q: want ws://HOST:PORT/control", control)
	}
	switch strings.ToLower(u.Scheme) {
	case "ws", "http":
		u.Scheme = "http"
	case "wss", "https":
		u.Scheme = "https"
	default:
		return "", fmt.Errorf("worker: control URL %q: scheme must be ws or wss", control)
	}
	u.Path, u.RawPath, u.RawQuery, u.Fragment = "", "", "", ""
	return u.String(), nil
}

// Data returns the worker's data-plane client, which uses the worker's
// session credential once it is enrolled.
func (d *Driver) Data() *DataClient { return d.data }

// ID returns the worker instance's id.
func (d *Driver) ID() core.WorkerID { return d.opts.Config.ID }

// Exit returns the core's exit once Run returned its code, else nil.
func (d *Driver) Exit() *core.WorkerExit { return d.exit }

// Run runs the worker until the core asks it to exit, and returns that exit
// code; or until ctx ends, and returns ctx's error. Either way every step
// process is killed (step processes die with the worker) and every goroutine
// has stopped when it returns.
func (d *Driver) Run(ctx context.Context) (int, error) {
	d.ctx = ctx
	d.timer = time.NewTimer(time.Hour)
	d.timer.Stop()
	if err := d.openWorkDir(); err != nil {
		return 0, fmt.Errorf("worker: %w", err)
	}
	if !d.opts.NoStepEndpoint {
		e, err := startStepEndpoint(d.log, d.data, newReadCache(d.opts.CacheBytes), d.workDir)
		if err != nil {
			if d.tempWork {
				os.RemoveAll(d.workDir)
			}
			return 0, fmt.Errorf("worker: %w", err)
		}
		d.endpoint = e
		d.log.Info("step endpoint listening", "url", e.URL(), "data_plane", d.data.URL())
	}
	defer d.shutdown()
	if x, err := d.apply(d.w.Step(time.Now(), core.WBoot{})); err != nil || x != nil {
		return d.exited(x, err)
	}
	for {
		var in core.WorkerInput
		if len(d.local) > 0 && ctx.Err() == nil {
			raw := d.local[0]
			d.local = d.local[1:]
			in = d.translate(raw)
		} else {
			select {
			case <-ctx.Done():
				d.log.Info("worker stopping", "reason", context.Cause(ctx))
				return 0, ctx.Err()
			case <-d.timer.C:
				in = core.WTick{}
			case raw := <-d.inputs:
				in = d.translate(raw)
			}
		}
		if in == nil {
			continue
		}
		if x, err := d.apply(d.w.Step(time.Now(), in)); err != nil || x != nil {
			return d.exited(x, err)
		}
		if r, ok := in.(core.WReceived); ok && d.cur != nil {
			if _, ok := r.Msg.(core.Welcome); ok {
				d.cur.setGrid(d.w.HeartbeatAnchor()) // the pings' timing (SPEC §9)
			}
		}
	}
}

// Drain asks the worker to drain (§10): the first call stops it taking work
// and makes Run return 0 once its steps are finished and reported; a second
// call (or the drain timeout) stops the steps still running. Safe from any
// goroutine; false once Run is returning.
func (d *Driver) Drain() bool { return d.push(drainReq{}) }

// exited ends Run with the core's exit, or with a failure to save the
// credential (then nothing of the Ready that brought it was acted on).
func (d *Driver) exited(x *core.WorkerExit, err error) (int, error) {
	if err != nil {
		d.log.Error("worker stopping", "err", err)
		return 0, err
	}
	d.exit = x
	d.log.Info("worker exiting", "code", x.Code, "reason", x.Reason)
	return x.Code, nil
}

// translate turns a driver event into a core input, or nil when it belongs
// to a connection or dial the core no longer has.
func (d *Driver) translate(raw input) core.WorkerInput {
	switch in := raw.(type) {
	case dialed:
		if in.gen != d.gen || d.dialCancel == nil {
			if in.ws != nil {
				in.ws.Close() // an abandoned dial
			}
			return nil
		}
		d.dialCancel()
		d.dialCancel = nil
		if in.next != "" {
			d.pref = in.next
		}
		if in.err != nil {
			return core.WDialFailed{Reason: in.err.Error()}
		}
		if in.at.url != d.pref || len(d.urls) > 1 {
			d.log.Info("connected", "url", in.at.url, "addr", in.at.addr)
		}
		d.pref = in.at.url
		d.data.setTarget(in.at)
		d.cur = d.startConn(in.gen, in.ws, in.cc)
		return core.WConnected{Conn: core.ConnID(in.gen)}
	case received:
		if d.cur == nil || in.gen != d.cur.gen {
			return nil
		}
		return core.WReceived{Msg: in.msg}
	case lost:
		if d.cur == nil || in.gen != d.cur.gen {
			return nil
		}
		d.cur.abort()
		d.cur = nil
		return core.WDisconnected{Reason: in.reason}
	case output:
		d.stepped = append(d.stepped, in.lease) // apply lets its reader read on
		return core.WExecOutput{Lease: in.lease, Lines: in.lines}
	case drainReq:
		return core.WDrain{}
	case secretsFetched:
		d.fetched(in)
		return nil
	case exited:
		delete(d.procs, in.Lease)
		d.dropSecrets(in.Lease)
		if d.endpoint != nil {
			d.endpoint.revoke(in.Lease)
		}
		return core.WExecExited(in)
	}
	panic(fmt.Sprintf("worker: unknown input %T", raw))
}

// apply carries out one WorkerReady; it returns the Exit, if any. A new
// session credential is saved first (Options.SaveCredential): if that fails,
// nothing of rd is acted on.
func (d *Driver) apply(rd core.WorkerReady) (*core.WorkerExit, error) {
	if c := d.w.Credential(); c != "" {
		if c != d.saved && d.opts.SaveCredential != nil {
			if err := d.opts.SaveCredential(c); err != nil {
				return nil, fmt.Errorf("%w: %v", ErrSaveCredential, err)
			}
		}
		d.saved = c
		if old := d.cred.Load(); old == nil || *old != c {
			d.cred.Store(&c)
		}
	}
	for _, m := range rd.Send {
		d.send(m)
	}
	if rd.Close {
		d.gen++ // whatever the old connection or dial still says is ignored
		if d.cur != nil {
			d.cur.closeAfterQueued()
			d.cur = nil
		}
		if d.dialCancel != nil {
			d.dialCancel()
			d.dialCancel = nil
		}
	}
	if rd.Dial {
		d.dial()
	}
	for _, c := range rd.Exec {
		d.exec(c)
	}
	for _, l := range rd.Logs {
		lv := slog.LevelInfo // the core's level (SPEC §10: REJECTED is an error)
		switch l.Level {
		case core.LevelWarn:
			lv = slog.LevelWarn
		case core.LevelError:
			lv = slog.LevelError
		}
		attrs := make([]any, 0, len(l.Fields))
		for _, f := range l.Fields { // the core's fields (SPEC §16: lease, step, run)
			attrs = append(attrs, logging.CoreAttr(f))
		}
		d.log.Log(d.ctx, lv, l.Msg, attrs...)
	}
	// Backpressure (SPEC §10): a lease whose unacknowledged lines fill its
	// window is not read until acks free it.
	for lease, p := range d.procs {
		if p.gate != nil {
			p.gate.setPaused(d.w.OutputPaused(lease))
		}
	}
	for _, lease := range d.stepped {
		if p := d.procs[lease]; p != nil && p.gate != nil {
			p.gate.taken()
		}
	}
	d.stepped = d.stepped[:0]
	if rd.Exit != nil {
		return rd.Exit, nil
	}
	d.timer.Stop()
	if !rd.Deadline.IsZero() {
		d.timer.Reset(max(time.Until(rd.Deadline), 0))
	}
	return nil, nil
}

// send encodes one message for the current connection. Logs and Events too
// large for one frame are split (the core batches by count, not bytes).
func (d *Driver) send(m core.Msg) {
	if d.cur == nil {
		d.log.Warn("message without a connection dropped", "msg", core.DescribeMsg(m))
		return
	}
	b, err := wire.Encode(m)
	if errors.Is(err, wire.ErrFrameTooLarge) {
		if parts := split(m); parts != nil {
			for _, p := range parts {
				d.send(p)
			}
			return
		}
	}
	if err != nil {
		d.log.Error("cannot encode message; dropping the connection", "kind", m.Kind(), "err", err)
		d.cur.abort() // the read loop reports the loss
		return
	}
	d.cur.send(b)
}

// split halves a Logs or Events message; nil if it cannot be split.
func split(m core.Msg) []core.Msg {
	switch m := m.(type) {
	case core.Logs:
		if n := len(m.Lines); n > 1 {
			return []core.Msg{core.Logs{Lease: m.Lease, Lines: m.Lines[:n/2]}, core.Logs{Lease: m.Lease, Lines: m.Lines[n/2:]}}
		}
	case core.Events:
		if n := len(m.Events); n > 1 {
			return []core.Msg{core.Events{Lease: m.Lease, Events: m.Events[:n/2]}, core.Events{Lease: m.Lease, Events: m.Events[n/2:]}}
		}
	}
	return nil
}

// dial opens a new connection in the background, trying the URLs in the
// order of dialOrder (leader.go); the result comes back as a dialed input
// of the new generation.
func (d *Driver) dial() {
	d.gen++
	gen := d.gen
	if d.dialCancel != nil {
		d.dialCancel()
	}
	timeout := d.w.Config().DialTimeout
	ctx, cancel := context.WithTimeout(d.ctx, timeout)
	d.dialCancel = cancel
	order := dialOrder(d.pref, d.urls)
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		in := d.dialAny(ctx, order, timeout)
		in.gen = gen
		if !d.push(in) && in.ws != nil {
			in.ws.Close()
		}
	}()
}

// dialOne dials one target; leader is the LeaderHeader of a refusal.
func (d *Driver) dialOne(ctx context.Context, at target, timeout time.Duration) (ws *websocket.Conn, cc *wire.CorkConn, leader string, err error) {
	dialer := websocket.Dialer{HandshakeTimeout: timeout, ReadBufferSize: 4096, WriteBufferSize: 4096,
		NetDialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var nd net.Dialer
			nc, err := nd.DialContext(ctx, network, at.dialAddr(addr))
			if err != nil {
				return nil, err
			}
			cc = wire.NewCorkConn(nc)
			return cc, nil
		}}
	if d.opts.TLS != nil {
		dialer.TLSClientConfig = d.opts.TLS.Clone()
		dialer.TLSClientConfig.NextProtos = nil // the upgrade is HTTP/1.1
	}
	ws, resp, err := dialer.DialContext(ctx, at.url, nil)
	var why []byte // a refused upgrade's reason (SPEC §12: 503 over a cap)
	if resp != nil && resp.Body != nil {
		if err != nil {
			why, _ = io.ReadAll(io.LimitReader(resp.Body, maxRefusalBytes))
		}
		resp.Body.Close()
	}
	if err != nil {
		where := at.url
		if at.addr != "" {
			where += " (" + at.addr + ")"
		}
		err = fmt.Errorf("dial %s: %w", where, err)
		if resp != nil {
			err = fmt.Errorf("%w (HTTP %s)", err, resp.Status)
			if resp.StatusCode == http.StatusServiceUnavailable {
				leader = resp.Header.Get(LeaderHeader)
			}
		}
		if s := strings.TrimSpace(strings.ToValidUTF8(string(why), "")); s != "" {
			err = fmt.Errorf("%w: %s", err, strconv.Quote(s))
		}
	}
	return ws, cc, leader, err
}

// push hands an input to the loop; false once Run is returning.
func (d *Driver) push(in input) bool {
	select {
	case d.inputs <- in:
		return true
	case <-d.done:
		return false
	}
}

// shutdown kills every step process group, closes the connection and waits
// for every goroutine.
func (d *Driver) shutdown() {
	for _, p := range d.procs {
		p.signalled.Store(true) // stopped by the worker: not uploaded (SPEC §10 persistFile)
		p.signal(killSignal)
	}
	if d.cur != nil {
		d.cur.closeAfterQueued()
		d.cur = nil
	}
	if d.dialCancel != nil {
		d.dialCancel()
	}
	d.timer.Stop()
	if d.endpoint != nil {
		d.endpoint.close()
	}
	close(d.done)
	d.wg.Wait()
	if d.tempWork && !d.opts.KeepScratch {
		removeTree(d.workDir)
	}
	for l := range d.secrets {
		d.dropSecrets(l)
	}
}

// newUUID returns a random (version 4) UUID.
func newUUID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}
