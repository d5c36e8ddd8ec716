package main

// Hostile input at the HTTP server (SPEC §12, §14): connections that open
// and then say nothing, stall in their headers or body, or sit idle after a
// request or an h2c preface, from one source address, while a genuine
// worker and an operator use the same `orchestrator serve`.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	flag "github.com/spf13/pflag"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/tether-run/tether/adapters/orchestrator"
)

// idleAttack configures attackIdleConns: where it dials from, how many
// connections of each kind it holds at once, and the server's deadlines it
// expects to be closed by (plus Slack).
type idleAttack struct {
	From                 string // source IP address, e.g. "127.0.0.2"
	Slots                int    // connections held at once, per kind
	Surplus              int    // extra connections of the last kind (silent), dialed last: the ones a per-address cap of 6 × Slots refuses
	Header, Body, Idle   time.Duration
	Write                time.Duration // the server's per-write deadline
	Slack                time.Duration
	RefusalRetryInterval time.Duration // a slot refused at the cap waits this long before dialing again
}

// The kinds of idle connection.
const (
	idleSilent      = "silent"       // connects and sends nothing: the header deadline
	idleHeaderStall = "header-stall" // a request line and a header, never the blank line: the header deadline
	idleBodyStall   = "body-stall"   // a POST whose body never arrives: the body deadline
	idleKeepAlive   = "keep-alive"   // one whole request, answered, then nothing: the idle deadline
	idleH2C         = "h2c-idle"     // the h2c preface and SETTINGS, then nothing: the idle deadline
	idleH2CNoWindow = "h2c-window-0" // h2c with an initial window of 0 and 4 requests whose answers can never be sent: write, then idle
)

// idleKinds are started in this order, the longest-lived first, 100 ms
// apart, so that under a per-address cap each kind holds its slots (a slot
// the server closed is dialed again at once, while a refused one waits)
// and the surplus is what is refused.
var idleKinds = []string{idleH2CNoWindow, idleH2C, idleKeepAlive, idleBodyStall, idleHeaderStall, idleSilent}

// deadline is the server deadline a connection of kind must be closed by,
// counted from its last byte sent.
func (a idleAttack) deadline(kind string) time.Duration {
	switch kind {
	case idleSilent, idleHeaderStall:
		return a.Header
	case idleBodyStall:
		return a.Body
	case idleH2CNoWindow:
		return a.Write + a.Idle // the streams are reset, then the connection is idle
	}
	return a.Idle
}

// attackIdleConnsResult is what attackIdleConns observed, by kind.
type attackIdleConnsResult struct {
	Closed   map[string]int           // closed by the server within its deadline plus slack
	Late     map[string]int           // closed later than that, or still open at the end although older
	Pending  map[string]int           // still open at the end, younger than deadline plus slack
	Refused  map[string]int           // refused at the listener's cap with its 503
	MinWait  map[string]time.Duration // shortest time from the last byte sent to the server's close
	MaxWait  map[string]time.Duration // longest
	Reasons  map[string]int           // the refusals' texts
	Problems []string                 // anything else (a dial failure, a 503 without the reason, ...)
}

func (r attackIdleConnsResult) String() string {
	var b strings.Builder
	for _, k := range idleKinds {
		fmt.Fprintf(&b, "%s: closed %d (%v..%v), late %d, pending %d, refused %d; ", k, r.Closed[k], r.MinWait[k].Round(time.Millisecond),
			r.MaxWait[k].Round(time.Millisecond), r.Late[k], r.Pending[k], r.Refused[k])
	}
	return b.String() + fmt.Sprintf("problems %d", len(r.Problems))
}

// attackIdleConns runs the attack against the orchestrator at addr
// (host:port) until ctx is done and returns what it observed. Each of
// a.Slots goroutines per kind opens a connection from a.From, sends its
// kind's bytes, waits for the server to close it and times that, and opens
// the next; a connection refused at the cap (HTTP/1.1 503 before anything
// is sent) is counted and retried after a pause.
func attackIdleConns(ctx context.Context, t *testing.T, addr string, a idleAttack) attackIdleConnsResult {
	t.Helper()
	res := attackIdleConnsResult{Closed: map[string]int{}, Late: map[string]int{}, Pending: map[string]int{}, Refused: map[string]int{},
		MinWait: map[string]time.Duration{}, MaxWait: map[string]time.Duration{}, Reasons: map[string]int{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i, kind := range idleKinds {
		n := a.Slots
		if i == len(idleKinds)-1 {
			n += a.Surplus
		}
		for range n {
			wg.Go(func() {
				select { // stagger the kinds' first connections by 100 ms
				case <-ctx.Done():
				case <-time.After(time.Duration(i) * 100 * time.Millisecond):
				}
				for ctx.Err() == nil {
					o := idleOnce(ctx, addr, a, kind)
					mu.Lock()
					res.add(a, kind, o)
					mu.Unlock()
					if o.refused != "" || o.problem != "" {
						select {
						case <-ctx.Done():
						case <-time.After(a.RefusalRetryInterval):
						}
					}
				}
			})
		}
	}
	wg.Wait()
	return res
}

// idleOutcome is one connection's fate.
type idleOutcome struct {
	refused string        // the 503's body
	problem string        // something unexpected
	wait    time.Duration // from the last byte sent to the close, or to the end if open
	open    bool          // still open when ctx ended
}

func (r *attackIdleConnsResult) add(a idleAttack, kind string, o idleOutcome) {
	switch {
	case o.problem != "":
		if len(r.Problems) < 20 {
			r.Problems = append(r.Problems, kind+": "+o.problem)
		}
	case o.refused != "":
		r.Refused[kind]++
		r.Reasons[o.refused]++
	case o.open && o.wait <= a.deadline(kind)+a.Slack:
		r.Pending[kind]++
	case o.open || o.wait > a.deadline(kind)+a.Slack:
		r.Late[kind]++
		r.MaxWait[kind] = max(r.MaxWait[kind], o.wait)
	default:
		r.Closed[kind]++
		r.MaxWait[kind] = max(r.MaxWait[kind], o.wait)
		if r.MinWait[kind] == 0 || o.wait < r.MinWait[kind] {
			r.MinWait[kind] = o.wait
		}
	}
}

// h2cPreface is what an h2c client with prior knowledge sends first: the
// connection preface, an empty SETTINGS frame, and the acknowledgement of
// the server's SETTINGS (which it sends at once).
var h2cPreface = []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" +
	"\x00\x00\x00\x04\x00\x00\x00\x00\x00" + // SETTINGS, empty
	"\x00\x00\x00\x04\x01\x00\x00\x00\x00") // SETTINGS ACK

// h2cNoWindow is an h2c client's preface declaring an initial stream
// window of 0, then 4 GET requests: the answers' bodies can never be sent.
func h2cNoWindow() []byte {
	var b, hb bytes.Buffer
	b.WriteString(http2.ClientPreface)
	fr := http2.NewFramer(&b, nil)
	fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	fr.WriteSettingsAck()
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "GET"}, {":scheme", "http"}, {":authority", "tether"}, {":path", "/api/runs"}} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	for id := uint32(1); id <= 7; id += 2 {
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndStream: true, EndHeaders: true})
	}
	return b.Bytes()
}

// idleOnce opens one connection of kind and follows it to its end.
func idleOnce(ctx context.Context, addr string, a idleAttack, kind string) idleOutcome {
	dialer := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(a.From)}, Timeout: 5 * time.Second}
	c, err := dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		if ctx.Err() != nil {
			return idleOutcome{open: true}
		}
		return idleOutcome{problem: "dial: " + err.Error()}
	}
	defer c.Close()
	start := time.Now()
	var ended bool // ctx ended, not the server: set before the read is woken
	var endMu sync.Mutex
	stop := context.AfterFunc(ctx, func() {
		endMu.Lock()
		ended = true
		endMu.Unlock()
		c.SetReadDeadline(time.Unix(1, 0))
	})
	defer stop()
	isEnded := func() bool { endMu.Lock(); defer endMu.Unlock(); return ended }

	// A connection over the cap is answered and closed at once, before it
	// sends anything.
	var first bytes.Buffer
	c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	n, err := io.Copy(&first, c)
	switch {
	case isEnded():
		return idleOutcome{open: true}
	case n > 0 || err == nil: // answered and closed
		return refusalOutcome(first.Bytes())
	case !errors.Is(err, os.ErrDeadlineExceeded):
		return idleOutcome{problem: "closed before sending anything: " + err.Error()}
	}
	c.SetReadDeadline(time.Time{})
	if isEnded() {
		return idleOutcome{open: true}
	}

	var send string
	switch kind {
	case idleHeaderStall:
		send = "GET /api/runs HTTP/1.1\r\nHost: tether\r\nX-Stall: "
	case idleBodyStall:
		send = "POST /api/runs HTTP/1.1\r\nHost: tether\r\nContent-Type: application/yaml\r\nContent-Length: 100000\r\n\r\nname: stall\n"
	case idleKeepAlive:
		send = "GET /api/runs HTTP/1.1\r\nHost: tether\r\n\r\n"
	case idleH2C:
		send = string(h2cPreface)
	case idleH2CNoWindow:
		send = string(h2cNoWindow())
	}
	last := start // the header deadline runs from the accept
	if send != "" {
		if _, err := io.WriteString(c, send); err != nil {
			return idleOutcome{problem: "write: " + err.Error()}
		}
		if kind != idleHeaderStall {
			last = time.Now()
		}
	}
	// Read whatever the server says (a 401, its SETTINGS, a GOAWAY) until
	// it closes the connection.
	var got bytes.Buffer
	_, err = io.Copy(&got, c)
	wait := time.Since(last)
	if isEnded() {
		return idleOutcome{open: true, wait: wait}
	}
	if err != nil && !errors.Is(err, net.ErrClosed) && !strings.Contains(err.Error(), "connection reset") {
		return idleOutcome{problem: "read: " + err.Error()}
	}
	if bytes.HasPrefix(got.Bytes(), []byte("HTTP/1.1 503")) {
		return refusalOutcome(got.Bytes())
	}
	return idleOutcome{wait: wait}
}

// refusalOutcome reads the listener's refusal.
func refusalOutcome(b []byte) idleOutcome {
	if !bytes.HasPrefix(b, []byte("HTTP/1.1 503")) {
		return idleOutcome{problem: fmt.Sprintf("closed at once with %q", b)}
	}
	_, body, _ := bytes.Cut(b, []byte("\r\n\r\n"))
	if !bytes.Contains(body, []byte("too many connections")) {
		return idleOutcome{problem: fmt.Sprintf("a 503 without the reason: %q", b)}
	}
	return idleOutcome{refused: strings.TrimSpace(string(body))}
}

// TestHostileIdleConns: a real `orchestrator serve` with short deadlines
// (header 2 s, body 2 s, idle 3 s, write 2 s) and a per-address cap of 120
// under a total of 400. From 127.0.0.2, 20 connections of each of six kinds
// are held at once, reopened as soon as the server closes them, and 30 more
// (150 > 120) are refused at the cap and retried every 250 ms. Every one the server closes is closed
// within its deadline plus 3 s (the h2c ones get a GOAWAY and 1 s to
// leave), none before its deadline, and none outlives it; the ones over the
// cap get the 503 naming the per-address cap, and the refusals are logged
// at a bounded rate. Meanwhile, from 127.0.0.1, an operator creates a
// token, a worker process enrolls and runs a six-step workflow to success,
// and the API answers. On the old server (no idle, body or stream write
// deadline) the body-stall, keep-alive and both h2c kinds stay open for
// good. The sizes: 150 connections are enough to exceed a cap of 120 and
// small enough for a race-built serve on two busy cores.
func TestHostileIdleConns(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binaries")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	orchBin, workerBin := buildBinaries(t, ctx)
	dataDir := filepath.Join(t.TempDir(), "data")
	const perAddr = 120
	r := serveRig(t, ctx, orchBin, workerBin, dataDir,
		"--header-timeout", "2s", "--body-timeout", "2s", "--idle-timeout", "3s", "--write-timeout", "2s",
		"--max-tcp-conns", "400", "--max-conns-per-addr", fmt.Sprint(perAddr))

	a := idleAttack{From: "127.0.0.2", Slots: 20, Surplus: 30, Header: 2 * time.Second, Body: 2 * time.Second, Idle: 3 * time.Second, Write: 2 * time.Second,
		Slack: 3 * time.Second, RefusalRetryInterval: 250 * time.Millisecond}
	actx, stopAttack := context.WithCancel(ctx)
	defer stopAttack()
	began := time.Now()
	resc := make(chan attackIdleConnsResult, 1)
	go func() { resc <- attackIdleConns(actx, t, r.addr, a) }()
	time.Sleep(time.Second) // the attack holds its connections

	r.worker("genuine")
	var src strings.Builder
	src.WriteString("name: genuine\nsteps:\n")
	for i := range 6 {
		fmt.Fprintf(&src, "  - name: s%d\n    run: echo s%d\n", i, i)
		if i > 0 {
			fmt.Fprintf(&src, "    depends_on: [s%d]\n", i-1)
		}
	}
	run := r.submit(src.String())
	det := r.waitFinished(run)
	if det.Status != "success" {
		t.Fatalf("the genuine run ended %s: %+v", det.Status, det.Steps)
	}
	// Hold the attack long enough for every kind to be closed by its
	// deadline at least once, then ask the API once more while it runs.
	if d := a.deadline(idleH2CNoWindow) + a.Slack + time.Second - time.Since(began); d > 0 {
		time.Sleep(d)
	}
	r.api.workers()
	elapsed := time.Since(began)
	stopAttack()
	res := <-resc
	t.Logf("attack for %v: %s; refusals %v", elapsed.Round(time.Millisecond), res, res.Reasons)

	for _, p := range res.Problems {
		t.Errorf("attack: %s", p)
	}
	refused := 0
	for _, k := range idleKinds {
		refused += res.Refused[k]
		if res.Closed[k] == 0 {
			t.Errorf("%s: no connection was closed by the server", k)
		}
		if res.Late[k] > 0 {
			t.Errorf("%s: %d connections outlived the deadline of %v plus %v (longest %v)", k, res.Late[k], a.deadline(k), a.Slack, res.MaxWait[k])
		}
		if min := res.MinWait[k]; res.Closed[k] > 0 && min < a.deadline(k)-500*time.Millisecond {
			t.Errorf("%s: a connection was closed after %v, before its deadline of %v", k, min, a.deadline(k))
		}
	}
	if refused == 0 {
		t.Errorf("no connection was refused at the per-address cap of %d (%d dialed at once)", perAddr, a.Slots*len(idleKinds)+a.Surplus)
	}
	want := fmt.Sprintf("too many connections: the connection cap per source address of %d is reached; retry later", perAddr)
	var reasons []string
	for reason := range res.Reasons {
		reasons = append(reasons, reason)
	}
	sort.Strings(reasons)
	if len(reasons) > 0 && (len(reasons) != 1 || reasons[0] != want) {
		t.Errorf("refusals said %q, want only %q", reasons, want)
	}
	logged := strings.Count(r.serve.stderr.String(), "connection refused over the cap")
	if limit := 2 + int(elapsed/(10*time.Second)); refused > 0 && (logged == 0 || logged > limit) {
		t.Errorf("%d refusals logged in %d lines, want 1..%d (one per 10 s at most)", refused, logged, limit)
	}
}

// TestServeHTTPLimitsConfig: the HTTP server's limits come from the config
// file's http: section and from serve's flags (which win), bad values are
// refused naming the key or flag, and the example in serve's help parses to
// the defaults it documents.
func TestServeHTTPLimitsConfig(t *testing.T) {
	src := "http:\n  idle_timeout_secs: 60\n  header_timeout_secs: 5\n  body_timeout_secs: 20\n  write_timeout_secs: 15\n" +
		"  max_tcp_conns: 20000\n  max_conns_per_addr: 20000\n  refusals_per_sec: 500\n  work_per_sec: 200000\n"
	cfg, err := loadServerConfig("c.yaml", []byte(src))
	want := httpLimits{IdleTimeout: time.Minute, HeaderTimeout: 5 * time.Second, BodyTimeout: 20 * time.Second, WriteTimeout: 15 * time.Second,
		MaxTCPConns: 20000, MaxConnsPerAddr: 20000, RefusalsPerSec: 500, WorkPerSec: 200000}
	if err != nil || cfg.HTTP != want {
		t.Errorf("http section: %+v, %v; want %+v", cfg.HTTP, err, want)
	}
	for name, c := range map[string]struct{ src, want string }{
		"unknown key":  {"http:\n  read_timeout_secs: 5\n", `c.yaml:2: http: unknown key "read_timeout_secs"`},
		"zero":         {"http:\n  idle_timeout_secs: 0\n", "c.yaml:2: idle_timeout_secs must be a positive whole number of seconds"},
		"not a count":  {"http:\n  max_tcp_conns: many\n", `c.yaml:2: max_tcp_conns must be a positive whole number, not "many"`},
		"negative cap": {"http:\n  max_conns_per_addr: -1\n", "c.yaml:2: max_conns_per_addr must be a positive whole number"},
	} {
		if _, err := loadServerConfig("c.yaml", []byte(c.src)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want it to contain %q", name, err, c.want)
		}
	}

	// The help's example: the http: section documents the defaults.
	help := serveCmd.long
	i, j := strings.Index(help, "  addr: 127.0.0.1:7420"), strings.Index(help, "\n\nFlags given")
	if i < 0 || j < i {
		t.Fatal("no config example in serve's help")
	}
	cfg, err = loadServerConfig("example.yaml", []byte(help[i:j]))
	if err != nil {
		t.Fatalf("the help's example: %v", err)
	}
	want = httpLimits{IdleTimeout: orchestrator.DefaultIdleTimeout, HeaderTimeout: orchestrator.DefaultHeaderTimeout, BodyTimeout: orchestrator.DefaultBodyTimeout,
		WriteTimeout: orchestrator.DefaultWriteTimeout, MaxTCPConns: 1024 + orchestrator.DefaultExtraTCPConns, MaxConnsPerAddr: (1024 + orchestrator.DefaultExtraTCPConns) * 3 / 4,
		RefusalsPerSec: orchestrator.DefaultRefusalsPerSec, WorkPerSec: orchestrator.DefaultWorkPerSec}
	if cfg.HTTP != want {
		t.Errorf("the help's example says %+v; the defaults are %+v", cfg.HTTP, want)
	}

	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "server-config.yaml")
	os.WriteFile(cfgPath, []byte(src), 0o600)
	resolve := func(args ...string) (serverConfig, error) {
		o := &options{}
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		serveCmd.flags(fs, o)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return resolveServeConfig(&env{opts: o, flags: fs})
	}
	cfg, err = resolve("--config", cfgPath, "--idle-timeout", "3s", "--max-conns-per-addr", "7", "--refusals-per-sec", "9", "--work-per-sec", "80000")
	want = httpLimits{IdleTimeout: 3 * time.Second, HeaderTimeout: 5 * time.Second, BodyTimeout: 20 * time.Second, WriteTimeout: 15 * time.Second,
		MaxTCPConns: 20000, MaxConnsPerAddr: 7, RefusalsPerSec: 9, WorkPerSec: 80000}
	if err != nil || cfg.HTTP != want {
		t.Errorf("flags over the file: %+v, %v; want %+v", cfg.HTTP, err, want)
	}
	for _, args := range [][]string{{"--write-timeout", "0s"}, {"--body-timeout", "-1s"}, {"--max-tcp-conns", "-5"}, {"--work-per-sec", "-1"}} {
		if _, err := resolve(args...); exitCode(err) != exitUsage || !strings.Contains(err.Error(), args[0]) {
			t.Errorf("serve %s: %v, want a usage error naming the flag", args, err)
		}
	}
	if cfg, err := resolve(); err != nil || cfg.HTTP != (httpLimits{}) {
		t.Errorf("no flags, no file: %+v, %v; want zeros (the orchestrator's defaults)", cfg.HTTP, err)
	}
}
