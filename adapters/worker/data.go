package worker

// The worker's side of the data plane (SPEC §14): DataClient
// speaks HTTP/2 to the orchestrator (h2c for an http:// base, TLS with ALPN
// h2 for https://) with the worker's session credential, and attaches a
// lease to every write. The step endpoint is a loopback HTTP server the
// worker runs for its step processes: each process gets
//
//	TETHER_DATA_URL    http://127.0.0.1:PORT (the data plane's paths: /data/…, /bundle/…)
//	TETHER_DATA_TOKEN  a random per-dispatch bearer token for that URL
//	TETHER_LEASE       its lease id
//
// and the endpoint forwards its requests to the orchestrator with the
// session credential and that lease attached, so a process never holds the
// credential and cannot write under another lease. A token stops working
// when its process has exited.

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tether-run/tether/adapters/dataplane"
	"github.com/tether-run/tether/client"
	"github.com/tether-run/tether/core"
)

// Environment variables a step process gets for the step endpoint.
const (
	EnvDataURL   = "TETHER_DATA_URL"
	EnvDataToken = "TETHER_DATA_TOKEN"
	EnvLease     = "TETHER_LEASE"
)

const (
	maxErrorBody  = 64 << 10 // of an error answer, read for its message
	maxAnswerBody = 1 << 20  // of a JSON answer
)

var (
	// ErrDataUnauthorized is returned when the orchestrator refuses the
	// session credential (401): expired, revoked, or not yet enrolled.
	ErrDataUnauthorized = errors.New("data plane: session credential refused")
	// ErrDataFenced is returned when a write's lease is not current (409):
	// the step lost its lease, and nothing was written.
	ErrDataFenced = errors.New("data plane: write fenced")
	// ErrDataNotFound is returned when a data version, stream, bundle or
	// file does not exist (404).
	ErrDataNotFound = errors.New("data plane: not found")
	// ErrDataTooLarge is returned when a body is over the orchestrator's
	// limit (413); nothing was written.
	ErrDataTooLarge = errors.New("data plane: body too large")
	// ErrDataRefused is returned for any other 4xx answer.
	ErrDataRefused = errors.New("data plane: request refused")
	// ErrDataCorrupt is returned at the end of a read whose bytes do not
	// match the SHA-256 the orchestrator announced.
	ErrDataCorrupt = errors.New("data plane: content does not match its sha256")
	// ErrNoCredential is returned when a request is made before the worker
	// was enrolled (it has no session credential yet).
	ErrNoCredential = errors.New("data plane: no session credential yet")
	// ErrBadDataURL is returned by NewDataClient for a base URL that is not
	// http:// or https://.
	ErrBadDataURL = errors.New("data plane: bad base URL")
)

// DataError is a non-2xx answer of the data plane. It matches (errors.Is)
// the Err* sentinel of its status.
type DataError struct {
	Status int
	Msg    string

	// The answer as the orchestrator wrote it, which the step endpoint
	// passes on unchanged (SPEC §14): its body when it is a whole §15
	// error answer (JSON with a code, at most maxErrorBody bytes; nil
	// otherwise), and its headers.
	body   []byte
	header http.Header
}

func (e *DataError) Error() string { return fmt.Sprintf("%s (HTTP %d)", e.Msg, e.Status) }

// Is maps the status to a sentinel.
func (e *DataError) Is(target error) bool {
	switch e.Status {
	case http.StatusUnauthorized:
		return target == ErrDataUnauthorized
	case http.StatusConflict:
		return target == ErrDataFenced
	case http.StatusNotFound:
		return target == ErrDataNotFound
	case http.StatusRequestEntityTooLarge:
		return target == ErrDataTooLarge
	}
	return target == ErrDataRefused && e.Status/100 == 4
}

// DataClient is the worker's client of the data plane. It is safe for
// concurrent use. Every write carries a request id and is sent again, with
// the same id, after a failure that may have lost its answer (DefaultRetry;
// see write.go): the orchestrator answers a repeat with its first answer.
type DataClient struct {
	cur  atomic.Pointer[dataTarget] // where requests go now
	tls  *tls.Config
	cred func() string

	// follow: the client goes where the control plane connected, and to
	// the leader a standby names (SPEC §11; leader.go).
	follow   bool
	onLeader func(leader string) // logs a switch to a named leader; nil: silent

	retry   Retry
	onRetry func(method, path, requestID string, attempt int, err error) // logs a retry; nil: silent
}

// SetRetry sets how writes are retried (Attempts 1: never); for tests.
func (c *DataClient) SetRetry(r Retry) { c.retry = r }

// NewDataClient returns a client of the data plane at base (http://HOST:PORT
// for h2c, https://HOST:PORT for TLS, verified with tlsConf's roots when
// given). cred returns the current session credential ("" before
// enrollment). Only HTTP/2 is spoken.
func NewDataClient(base string, tlsConf *tls.Config, cred func() string) (*DataClient, error) {
	u, err := url.Parse(strings.TrimRight(base, "/"))
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("%w %q: want http://HOST:PORT or https://HOST:PORT", ErrBadDataURL, base)
	}
	c := &DataClient{tls: tlsConf, cred: cred, retry: DefaultRetry}
	c.cur.Store(c.newTarget(u, ""))
	return c, nil
}

// dataTarget is one orchestrator the data client talks to: its base URL,
// the address dialed for it ("" to resolve the URL's host) and a client of
// its own, so that no connection to another orchestrator is reused.
type dataTarget struct {
	base *url.URL
	addr string
	hc   *http.Client
}

func (c *DataClient) newTarget(u *url.URL, addr string) *dataTarget {
	nd := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		Proxy: nil, // a worker talks to its orchestrator directly
		DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
			if addr != "" {
				a = addr
			}
			return nd.DialContext(ctx, network, a)
		},
		TLSHandshakeTimeout: 10 * time.Second,
		IdleConnTimeout:     90 * time.Second,
		Protocols:           new(http.Protocols),
	}
	if u.Scheme == "https" {
		tr.Protocols.SetHTTP2(true)
		if c.tls != nil {
			tr.TLSClientConfig = c.tls.Clone()
			tr.TLSClientConfig.NextProtos = nil // the transport offers h2
		}
	} else {
		tr.Protocols.SetUnencryptedHTTP2(true) // h2c with prior knowledge
	}
	return &dataTarget{base: u, addr: addr, hc: &http.Client{Transport: tr}}
}

// switchTo makes base (dialed at addr, "" to resolve it) where requests go,
// unless it is so already; it says whether it changed.
func (c *DataClient) switchTo(base, addr string) bool {
	u, err := url.Parse(strings.TrimRight(base, "/"))
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return false
	}
	old := c.cur.Load()
	if old.base.String() == u.String() && old.addr == addr {
		return false
	}
	if !c.cur.CompareAndSwap(old, c.newTarget(u, addr)) {
		return false // another switch came first
	}
	old.hc.CloseIdleConnections() // requests in flight there finish or fail
	return true
}

// Close closes idle connections.
func (c *DataClient) Close() { c.cur.Load().hc.CloseIdleConnections() }

// URL returns the data plane's base URL.
func (c *DataClient) URL() string { return c.cur.Load().base.String() }

// do sends one request with the credential (and the lease, if not zero);
// path is unescaped.
func (c *DataClient) do(ctx context.Context, method, path, rawQuery string, lease core.LeaseID, body io.Reader, size int64) (*http.Response, error) {
	return c.doHeader(ctx, method, path, rawQuery, lease, nil, body, size)
}

// doHeader is do with extra request headers (a write's request id, its
// attributes).
func (c *DataClient) doHeader(ctx context.Context, method, path, rawQuery string, lease core.LeaseID, hdr http.Header, body io.Reader, size int64) (*http.Response, error) {
	cred := c.cred()
	if cred == "" {
		return nil, ErrNoCredential
	}
	for try := 0; ; try++ {
		t := c.cur.Load()
		u := *t.base
		u.Path, u.RawQuery = path, rawQuery
		req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
		if err != nil {
			return nil, err
		}
		if body != nil {
			req.ContentLength = size
		}
		for k, vs := range hdr {
			for _, v := range vs {
				req.Header.Add(k, v)
			}
		}
		req.Header.Set("Authorization", "Bearer "+cred)
		if lease != 0 {
			req.Header.Set(dataplane.LeaseHeader, strconv.FormatUint(uint64(lease), 10))
		}
		resp, err := t.hc.Do(req)
		if err != nil {
			return nil, fmt.Errorf("data plane: %s %s: %w", method, core.Quote(path), err)
		}
		if resp.StatusCode/100 == 2 {
			return resp, nil
		}
		if c.followLeader(resp) && body == nil && try == 0 {
			// A request without a body (a read; a delete, whose request
			// id makes it safe) goes to the leader at once; one with a
			// body is sent again by write, after its backoff.
			resp.Body.Close()
			continue
		}
		defer resp.Body.Close()
		return nil, answerError(resp)
	}
}

func answerError(resp *http.Response) error {
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody+1))
	whole := err == nil && len(b) <= maxErrorBody
	b = b[:min(len(b), maxErrorBody)]
	var e struct {
		Code  string `json:"code"`
		Error string `json:"error"`
	}
	msg := strings.TrimSpace(string(b))
	decoded := json.Unmarshal(b, &e) == nil
	if decoded && e.Error != "" {
		msg = e.Error
	}
	if msg == "" {
		msg = resp.Status
	}
	de := &DataError{Status: resp.StatusCode, Msg: msg, header: resp.Header}
	if whole && decoded && e.Code != "" {
		de.body = b
	}
	return de
}

func decodeAnswer(resp *http.Response, v any) error {
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBody))
	if err != nil {
		return fmt.Errorf("data plane: reading the answer: %w", err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("data plane: undecodable answer: %w", err)
	}
	return nil
}

// dataPath builds an unescaped path; the URL escapes it once.
func dataPath(id string, rest ...string) string {
	return "/data/" + strings.Join(append([]string{id}, rest...), "/")
}

// Put stores body (size bytes, or -1 if unknown) as the next version of id
// under lease, and returns the version once the orchestrator made it
// durable. A fenced lease gets ErrDataFenced and nothing is written.
func (c *DataClient) Put(ctx context.Context, lease core.LeaseID, id string, body io.Reader, size int64) (dataplane.Version, error) {
	return c.PutWith(ctx, lease, id, body, size, WriteOpts{})
}

// Append appends b to id's stream under lease; it returns once durable.
func (c *DataClient) Append(ctx context.Context, lease core.LeaseID, id string, b []byte) (dataplane.Appended, error) {
	hdr, _ := WriteOpts{}.header()
	resp, err := c.write(ctx, http.MethodPost, dataPath(id, "append"), "", lease, hdr, bytes.NewReader(b), int64(len(b)))
	if err != nil {
		return dataplane.Appended{}, err
	}
	var a dataplane.Appended
	return a, decodeAnswer(resp, &a)
}

// Get opens a version of id (0: the latest). The reader checks the bytes
// against the version's SHA-256 and fails with ErrDataCorrupt at the end if
// they differ. The caller closes it.
func (c *DataClient) Get(ctx context.Context, id string, version uint64) (io.ReadCloser, dataplane.Version, error) {
	v := "latest"
	if version != 0 {
		v = strconv.FormatUint(version, 10)
	}
	resp, err := c.do(ctx, http.MethodGet, dataPath(id, v), "", 0, nil, 0)
	if err != nil {
		return nil, dataplane.Version{}, err
	}
	n, _ := strconv.ParseUint(resp.Header.Get(dataplane.VersionHeader), 10, 64)
	meta := dataplane.Version{ID: id, Version: n, Size: resp.ContentLength, SHA256: resp.Header.Get(dataplane.SHA256Header)}
	return &verifyingReader{rc: resp.Body, h: sha256.New(), want: meta.SHA256}, meta, nil
}

// ReadStream opens id's stream from offset; length is the stream's length
// when the request was answered (the reader ends there).
func (c *DataClient) ReadStream(ctx context.Context, id string, offset int64) (rc io.ReadCloser, length int64, err error) {
	resp, err := c.do(ctx, http.MethodGet, dataPath(id, "append"), "offset="+strconv.FormatInt(offset, 10), 0, nil, 0)
	if err != nil {
		return nil, 0, err
	}
	length, _ = strconv.ParseInt(resp.Header.Get(dataplane.StreamLengthHeader), 10, 64)
	return resp.Body, length, nil
}

// Bundle opens a bundle by fingerprint; the reader checks its SHA-256.
func (c *DataClient) Bundle(ctx context.Context, fingerprint string) (io.ReadCloser, error) {
	resp, err := c.do(ctx, http.MethodGet, "/bundle/"+fingerprint, "", 0, nil, 0)
	if err != nil {
		return nil, err
	}
	return &verifyingReader{rc: resp.Body, h: sha256.New(), want: fingerprint}, nil
}

// BundleFile opens one file of a tar bundle.
func (c *DataClient) BundleFile(ctx context.Context, fingerprint, relPath string) (io.ReadCloser, error) {
	resp, err := c.do(ctx, http.MethodGet, "/bundle/"+fingerprint+"/file/"+relPath, "", 0, nil, 0)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// verifyingReader hashes what it reads and checks the sum at EOF.
type verifyingReader struct {
	rc   io.ReadCloser
	h    hash.Hash
	want string
}

func (v *verifyingReader) Read(p []byte) (int, error) {
	n, err := v.rc.Read(p)
	v.h.Write(p[:n])
	if errors.Is(err, io.EOF) && v.want != "" && hex.EncodeToString(v.h.Sum(nil)) != v.want {
		return n, fmt.Errorf("%w (want %s)", ErrDataCorrupt, v.want)
	}
	return n, err
}

func (v *verifyingReader) Close() error { return v.rc.Close() }

// ---- the step endpoint ----

// stepEndpoint is the loopback server that gives step processes the data
// plane with their lease attached.
type stepEndpoint struct {
	log      *slog.Logger
	client   *DataClient
	ln       net.Listener
	srv      *http.Server
	cache    *readCache // nil: no cache
	spoolDir string     // where a large write body is held for retries ("": the system's temp dir)

	mu     sync.Mutex
	leases map[string]core.LeaseID // per-dispatch token → lease
}

// startStepEndpoint listens on 127.0.0.1:0 and serves until close.
func startStepEndpoint(log *slog.Logger, client *DataClient, cache *readCache, spoolDir string) (*stepEndpoint, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("step endpoint: %w", err)
	}
	e := &stepEndpoint{log: log, client: client, ln: ln, cache: cache, spoolDir: spoolDir, leases: map[string]core.LeaseID{}}
	e.srv = &http.Server{Handler: e, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	go e.srv.Serve(ln)
	return e, nil
}

// URL is the endpoint's base URL.
func (e *stepEndpoint) URL() string { return "http://" + e.ln.Addr().String() }

// grant returns the environment of a new step process of lease.
func (e *stepEndpoint) grant(lease core.LeaseID) map[string]string {
	var b [16]byte
	rand.Read(b[:])
	tok := hex.EncodeToString(b[:])
	e.mu.Lock()
	e.leases[tok] = lease
	e.mu.Unlock()
	return map[string]string{EnvDataURL: e.URL(), EnvDataToken: tok, EnvLease: strconv.FormatUint(uint64(lease), 10)}
}

// revoke ends the tokens of lease (its process has exited).
func (e *stepEndpoint) revoke(lease core.LeaseID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for tok, l := range e.leases {
		if l == lease {
			delete(e.leases, tok)
		}
	}
}

func (e *stepEndpoint) lookup(tok string) (core.LeaseID, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for t, l := range e.leases {
		if subtle.ConstantTimeCompare([]byte(t), []byte(tok)) == 1 {
			return l, true
		}
	}
	return 0, false
}

func (e *stepEndpoint) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if e.srv.Shutdown(ctx) != nil {
		e.srv.Close()
	}
	e.client.Close()
}

// forwarded are the answer headers passed back to the step.
var forwarded = []string{"Content-Type", "Content-Length", "ETag", "Location", "Content-Location", "Cache-Control", "Allow",
	dataplane.VersionHeader, dataplane.SHA256Header, dataplane.StreamLengthHeader, "Tether-Repeated"}

// CacheHeader tells a step whether the worker's read cache answered a read
// of a numbered version: "hit" or "miss".
const CacheHeader = "Tether-Worker-Cache"

// stepPath says whether the step endpoint forwards path: the data plane's
// paths a step may use (SPEC §14).
func stepPath(path string) bool {
	if path == "/data" || path == "/pool" || path == "/token" {
		return true
	}
	for _, p := range []string{"/data/", "/bundle/", "/step/", "/secret/"} {
		if strings.HasPrefix(path, p) {
			return true
		}
	}
	return false
}

// cacheableRead returns the (id, version) of a GET of a numbered version
// (not latest, not a stream, not a version list).
func cacheableRead(r *http.Request) (cacheKey, bool) {
	if r.Method != http.MethodGet || r.URL.RawQuery != "" {
		return cacheKey{}, false
	}
	id, v, ok := strings.Cut(strings.TrimPrefix(r.URL.Path, "/data/"), "/")
	if !ok || !strings.HasPrefix(r.URL.Path, "/data/") || id == "" || strings.Contains(v, "/") {
		return cacheKey{}, false
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil || n == 0 {
		return cacheKey{}, false
	}
	return cacheKey{id: id, version: n}, true
}

// stepRealm is the realm of the step endpoint's 401 (its tokens are not
// the data plane's session credentials).
const stepRealm = "tether-step"

// errorHeaders are the headers of an orchestrator's error answer passed
// back to the step with it (SPEC §14: a 405 has Allow, a 401
// WWW-Authenticate).
var errorHeaders = []string{"Content-Type", "Allow", "WWW-Authenticate"}

func (e *stepEndpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// fail answers a refusal as the data plane does (SPEC §14, §15):
	// {"code", "message", "error"}, the error repeating the message.
	fail := func(status int, msg string) {
		if status == http.StatusUnauthorized && w.Header().Get("WWW-Authenticate") == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="`+stepRealm+`"`)
		}
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.WriteHeader(status)
		json.NewEncoder(w).Encode(client.ErrorBody{Code: client.CodeFor(status), Message: msg, Error: msg})
	}
	scheme, tok, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	lease, ok := e.lookup(strings.TrimSpace(tok))
	if !strings.EqualFold(scheme, "Bearer") || !ok {
		fail(http.StatusUnauthorized, "missing or unknown step token (send Authorization: Bearer $"+EnvDataToken+")")
		return
	}
	if !stepPath(r.URL.Path) {
		fail(http.StatusNotFound, "no such path: "+core.Quote(r.URL.Path)+" (the step endpoint serves /data, /data/…, /bundle/…, /step/…, /secret/…, /pool and /token)")
		return
	}
	q := r.URL.Query()
	q.Del("lease") // the endpoint attaches the step's own lease
	key, cacheable := cacheableRead(r)
	if cacheable {
		if ent, hit := e.cache.get(key); hit {
			for k, vs := range ent.header {
				w.Header()[k] = vs
			}
			w.Header().Set(CacheHeader, "hit")
			w.Header().Set("Content-Length", strconv.Itoa(len(ent.b)))
			w.WriteHeader(http.StatusOK)
			w.Write(ent.b)
			return
		}
	}
	var (
		resp *http.Response
		err  error
	)
	switch r.Method {
	case http.MethodPut, http.MethodPost, http.MethodDelete:
		resp, err = e.forwardWrite(r, q, lease)
		if errors.Is(err, errBadRequestID) {
			fail(http.StatusBadRequest, err.Error())
			return
		}
		if errors.Is(err, errSpoolTooLarge) {
			fail(http.StatusRequestEntityTooLarge, err.Error())
			return
		}
	default:
		var body io.Reader
		if r.ContentLength != 0 {
			body = r.Body
		}
		resp, err = e.client.do(r.Context(), r.Method, r.URL.Path, q.Encode(), lease, body, r.ContentLength)
	}
	var de *DataError
	switch {
	case errors.As(err, &de):
		// The orchestrator's refusal reaches the step as it was written
		// (SPEC §14: the step endpoint serves the data plane's paths);
		// a body that is not a §15 error answer is answered in that shape.
		for _, h := range errorHeaders {
			for _, v := range de.header.Values(h) {
				w.Header().Add(h, v)
			}
		}
		if de.body == nil {
			fail(de.Status, de.Msg)
			return
		}
		if w.Header().Get("Content-Type") == "" {
			w.Header().Set("Content-Type", "application/json; charset=utf-8")
		}
		w.WriteHeader(de.Status)
		w.Write(de.body)
		return
	case errors.Is(err, ErrNoCredential):
		fail(http.StatusServiceUnavailable, "the worker is not enrolled yet")
		return
	case err != nil:
		e.log.Warn("step endpoint: forwarding failed", "lease", uint64(lease), "method", r.Method, "path", r.URL.Path, "err", err)
		fail(http.StatusBadGateway, err.Error())
		return
	}
	defer resp.Body.Close()
	hdr := http.Header{}
	for _, h := range forwarded {
		if v := resp.Header.Get(h); v != "" {
			hdr.Set(h, v)
			w.Header().Set(h, v)
		}
	}
	sha := resp.Header.Get(dataplane.SHA256Header)
	if cacheable && e.cache.fits(resp.ContentLength) && resp.StatusCode == http.StatusOK && sha != "" {
		// Read it whole (it fits the cache's bound), check it, keep it, then
		// answer: a version that fails its check is never served.
		w.Header().Set(CacheHeader, "miss")
		b, err := io.ReadAll(io.LimitReader(resp.Body, resp.ContentLength+1))
		if err != nil || int64(len(b)) != resp.ContentLength {
			e.log.Warn("step endpoint: reading a version failed", "lease", uint64(lease), "path", r.URL.Path, "err", err)
			fail(http.StatusBadGateway, fmt.Sprintf("reading %s from the orchestrator: %v", r.URL.Path, err))
			return
		}
		if !e.cache.put(key, b, sha, hdr) {
			fail(http.StatusBadGateway, fmt.Sprintf("%s: %v", r.URL.Path, ErrDataCorrupt))
			return
		}
		w.WriteHeader(resp.StatusCode)
		w.Write(b)
		return
	}
	w.WriteHeader(resp.StatusCode)
	if _, err := io.Copy(w, resp.Body); err != nil {
		panic(http.ErrAbortHandler) // cut short: the step must not take it for whole
	}
}

// errBadRequestID: a step sent a malformed Tether-Request-Id.
var errBadRequestID = errors.New("bad " + RequestIDHeader + ": want 1–64 of [A-Za-z0-9._-]")

// forwardWrite forwards a step's write with a request id (the step's own,
// else a fresh one) and its attributes, its body held (spool) so that the
// write can be sent again after a lost answer (DataClient.write).
func (e *stepEndpoint) forwardWrite(r *http.Request, q url.Values, lease core.LeaseID) (*http.Response, error) {
	id := r.Header.Get(RequestIDHeader)
	if id != "" && !ValidRequestID(id) {
		return nil, errBadRequestID
	}
	if r.ContentLength > maxSpoolBytes {
		return nil, errSpoolTooLarge
	}
	hdr, _ := WriteOpts{RequestID: id, Attrs: r.Header.Values(AttributeHeader)}.header()
	if ct := r.Header.Get("Content-Type"); ct != "" {
		hdr.Set("Content-Type", ct)
	}
	var body io.Reader
	size := int64(0)
	if r.ContentLength != 0 && r.Body != nil {
		sp, err := spool(r.Body, e.spoolDir)
		if err != nil {
			return nil, err
		}
		defer sp.close() // the answer's body does not need it
		body, size = sp.r, sp.size
	}
	return e.client.write(r.Context(), r.Method, r.URL.Path, q.Encode(), lease, hdr, body, size)
}
