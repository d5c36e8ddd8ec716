package orchestrator

// The data plane (SPEC §14), served on the control plane's
// listener over HTTP/2 (h2c, or TLS with ALPN h2) next to /control and /api/:
//
//	GET  /data/{id}                      → {"id", "versions": [...], "stream": {...}}
//	PUT  /data/{id}                      body: bytes → 201 {"id", "version", "size", "sha256", ...}
//	GET  /data/{id}/{version}            → the bytes of that version; "latest" is the newest
//	POST /data/{id}/append               body: bytes → {"id", "offset", "size", "length"}
//	GET  /data/{id}/append[?offset=N]    → the stream's bytes from N (default 0)
//	GET  /bundle/{fingerprint}           → the bundle's bytes
//	GET  /bundle/{fingerprint}/file/{p}  → one file of a tar bundle
//	DELETE /data/{id}                    → 201 a tombstone version {"id", "version", "deleted": true, ...}
//	GET  /data?prefix=&run=&step=&since=&until=&attr.K=V&limit=&after= → {"items": [...], "next"}
//	GET  /step/definition                → the lease's run, workflow and step declaration
//	GET  /step/output/{step}             → a step of the lease's run: state, exit, writes, outputs
//	GET  /pool                           → {"workers": [...]}
//
// A write may name itself with Tether-Request-Id: its first answer is kept
// under (lease, request id), durable with the write, and a repeat gets it
// again — also once the lease ended — and writes nothing (stepdata.go).
//
// Every request carries "Authorization: Bearer <session credential>"; only a
// valid, unexpired credential of a worker in the pool is accepted (401).
// Every write (PUT, append, DELETE, and a step's secret put and token
// mint, secrets.go) carries its lease ("Tether-Lease: N", or
// ?lease=N) and is fenced: the core decides it (a core.DataWrite stepped on
// the driver's loop, between the core's inputs, answered with a typed
// refusal or admitted), and an admitted write is made durable in the same
// transaction as that group's records, so no lease change can come between
// the decision and the write. This file only translates. A
// write under a lease that is not current is refused (409) and writes
// nothing; an accepted one is answered only once it is on stable storage.
// Before a byte of a write's body is read, its credential and lease are
// checked on its headers (an early check that only refuses): a request
// that is refused holds nothing. A PUT's body is streamed into a blob off
// the loop (store/blob.go) and the loop commits the record naming it; an
// append's body (at most 1 MiB) is held in memory, within a budget, and
// written with its record. A body that stops arriving is cut (408).
//
// Errors are {"code", "message", "error"} (SPEC §15) with 400 (malformed id, version, offset or
// lease), 401, 404 (unknown path, id, version, bundle or file), 405, 408
// (the body stalled), 409 (fenced), 413 (body over the limit), 416 (offset
// past the stream's end), 503 (the orchestrator is stopping).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tether-run/tether/adapters/dataplane"
	"github.com/tether-run/tether/adapters/store"
	"github.com/tether-run/tether/core"
)

// Data-plane defaults (Options overrides them).
const (
	DefaultMaxPutBody      = 64 << 20  // one PUT
	DefaultMaxAppendBody   = 1 << 20   // one append
	DefaultMaxStream       = 1 << 30   // a stream's total length
	DefaultMaxBundleBody   = 256 << 20 // one bundle upload (operator API)
	DefaultMaxDataInFlight = 256 << 20 // append bodies held in memory at once
	// DefaultBodyIdleTimeout cuts a write's body that stops arriving: no
	// byte for this long and the request is answered 408 (SPEC §14).
	DefaultBodyIdleTimeout = 30 * time.Second
	// LeaseHeader names the lease a write is made under.
	LeaseHeader = dataplane.LeaseHeader
	// dataTimeout bounds one data-plane request (reading its body, waiting
	// for the loop and the disk).
	dataTimeout = 5 * time.Minute
)

var (
	// ErrFenced is returned, wrapping the core's reason, when a write's
	// lease is not current for its worker.
	ErrFenced = errors.New("write refused")
	// ErrUnauthenticated is returned, wrapping the core's reason, when a
	// data-plane request's session credential is not accepted.
	ErrUnauthenticated = errors.New("session credential refused")
	// ErrBodyStalled is returned when a write's body stops arriving for
	// the body idle timeout (or outlives the request's own deadline).
	ErrBodyStalled = errors.New("request body stalled")
)

// Inputs of the loop for the data plane.
type (
	// dataWrite is a write to fence and persist with the next group.
	// cred is empty for an operator's bundle upload (not fenced).
	dataWrite struct {
		cred  string
		lease core.LeaseID
		op    store.DataOp
		reply chan dataAnswer
		call  core.Input // a secret's change: the core input deciding it (secrets.go)
	}
	dataAnswer struct {
		res store.DataResult
		err error
	}
)

// ---- routing ----

// dataRouteKind is what a data-plane path names.
type dataRouteKind uint8

const (
	routeVersions   dataRouteKind = iota + 1 // /data/{id}: GET lists, PUT writes
	routeVersion                             // /data/{id}/{version}
	routeStream                              // /data/{id}/append: GET reads, POST appends
	routeBundle                              // /bundle/{fp}
	routeBundleFile                          // /bundle/{fp}/file/{relPath}
	routeQuery                               // /data: GET queries
	routeDefinition                          // /step/definition
	routeOutput                              // /step/output/{name}
	routePool                                // /pool
)

// dataRoute is a parsed data-plane request.
type dataRoute struct {
	kind    dataRouteKind
	id      string
	version uint64 // routeVersion: 0 means latest
	fp      string
	rel     string
	write   bool   // PUT, POST or DELETE: fenced
	step    string // routeOutput: the step's name
}

// parseDataPath parses a data-plane path and checks the method. It never
// touches storage: a malformed path is 400, an unknown shape 404, a wrong
// method 405 (with Allow).
func parseDataPath(method, p string) (dataRoute, *httpError) {
	get := method == http.MethodGet || method == http.MethodHead
	allow := func(r dataRoute, ok bool, allowed string) (dataRoute, *httpError) {
		if !ok {
			return dataRoute{}, &httpError{code: http.StatusMethodNotAllowed, msg: fmt.Sprintf("method %s is not allowed on %s (allowed: %s)", method, core.Quote(p), allowed), allow: allowed}
		}
		return r, nil
	}
	bad := func(err error) (dataRoute, *httpError) {
		return dataRoute{}, &httpError{code: http.StatusBadRequest, msg: err.Error()}
	}
	switch {
	case p == "/data":
		return allow(dataRoute{kind: routeQuery}, get, "GET, HEAD")
	case p == "/pool":
		return allow(dataRoute{kind: routePool}, get, "GET, HEAD")
	case p == "/step/definition":
		return allow(dataRoute{kind: routeDefinition}, get, "GET, HEAD")
	case strings.HasPrefix(p, "/step/output/"):
		name := strings.TrimPrefix(p, "/step/output/")
		if err := core.CheckName("step name", name); err != nil || name == "" || strings.Contains(name, "/") {
			return bad(fmt.Errorf("bad step name %s: want the name of a step of the lease's run (name or name[i])", core.Quote(name)))
		}
		return allow(dataRoute{kind: routeOutput, step: name}, get, "GET, HEAD")
	case strings.HasPrefix(p, "/data/"):
		segs := strings.Split(strings.TrimPrefix(p, "/data/"), "/")
		if len(segs) > 2 {
			break
		}
		id := segs[0]
		if err := store.ValidateID(id); err != nil {
			return bad(err)
		}
		if len(segs) == 1 {
			w := method == http.MethodPut || method == http.MethodDelete
			return allow(dataRoute{kind: routeVersions, id: id, write: w}, get || w, "GET, HEAD, PUT, DELETE")
		}
		switch v := segs[1]; v {
		case "append":
			return allow(dataRoute{kind: routeStream, id: id, write: method == http.MethodPost}, get || method == http.MethodPost, "GET, HEAD, POST")
		case "latest":
			return allow(dataRoute{kind: routeVersion, id: id}, get, "GET, HEAD")
		default:
			n, err := parseVersion(v)
			if err != nil {
				return bad(err)
			}
			return allow(dataRoute{kind: routeVersion, id: id, version: n}, get, "GET, HEAD")
		}
	case strings.HasPrefix(p, "/bundle/"):
		fp, rest, hasRest := strings.Cut(strings.TrimPrefix(p, "/bundle/"), "/")
		if err := store.ValidateFingerprint(fp); err != nil {
			return bad(err)
		}
		if !hasRest {
			return allow(dataRoute{kind: routeBundle, fp: fp}, get, "GET, HEAD")
		}
		rel, ok := strings.CutPrefix(rest, "file/")
		if !ok {
			break
		}
		if err := store.ValidateRelPath(rel); err != nil {
			return bad(err)
		}
		return allow(dataRoute{kind: routeBundleFile, fp: fp, rel: rel}, get, "GET, HEAD")
	}
	return dataRoute{}, &httpError{code: http.StatusNotFound, msg: fmt.Sprintf("no such data-plane path: %s (want /data, /data/{id}, /data/{id}/{version|latest|append}, /bundle/{sha256}, /bundle/{sha256}/file/{path}, /step/definition, /step/output/{step}, /pool)", core.Quote(p))}
}

// parseVersion parses a version: a decimal number from 1, no sign, no
// leading zero.
func parseVersion(s string) (uint64, error) {
	n, err := strconv.ParseUint(s, 10, 63)
	if err != nil || n == 0 || s[0] == '0' {
		return 0, fmt.Errorf("bad version %q: want a number from 1, or latest", s)
	}
	return n, nil
}

// parseLease reads a write's lease from the Tether-Lease header or ?lease=.
func parseLease(r *http.Request) (core.LeaseID, error) {
	v := r.Header.Get(LeaseHeader)
	if q := r.URL.Query().Get("lease"); v == "" {
		v = q
	}
	if v == "" {
		return 0, fmt.Errorf("a write needs its lease: send %s: <lease id> (or ?lease=)", LeaseHeader)
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("bad lease %q: want a lease id (a number from 1)", v)
	}
	return core.LeaseID(n), nil
}

// bearer returns the bearer credential of a request, "" if there is none.
func bearer(r *http.Request) string {
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(tok)
}

// ---- the handler ----

type dataPlane struct {
	d   *Driver
	mem *budget
}

func (p *dataPlane) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	end := time.Now().Add(dataTimeout)
	ctx, cancel := context.WithDeadline(r.Context(), end)
	defer cancel()
	r = r.WithContext(ctx)
	// The context does not bound reading the body; read deadlines do (see
	// idleBody), and none is read before the request is authenticated.
	// The request's own deadline replaces the one every body got with its
	// headers (BodyTimeout, bodyDeadline) before anything here can wait,
	// for room in the budget above all: HTTP/2 closes a body for good
	// once its read deadline passes, whatever deadline is set after.
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(end)
	body := &idleBody{r: r.Body, rc: rc, idle: p.d.opts.BodyIdleTimeout, end: end}
	r.Body = body
	cw := &countedResponse{ResponseWriter: w}
	w = cw
	defer func() { // SPEC §16: the data plane's bytes in and out
		p.d.m.dataBytes.WithLabelValues("in").Add(float64(body.n))
		p.d.m.dataBytes.WithLabelValues("out").Add(float64(cw.n))
	}()
	if err := p.serve(w, r); err != nil {
		if r.ContentLength != 0 && !body.eof {
			// The body was not read to its end: never wait for the rest of
			// it (HTTP/1.1 would try to read it to reuse the connection).
			_ = body.rc.SetReadDeadline(time.Now())
			if r.ProtoMajor == 1 {
				w.Header().Set("Connection", "close")
			}
		}
		p.fail(w, r, err)
	}
}

// idleBody cuts a request body that stops arriving: before each read it
// moves the request's read deadline to now + idle (never past end, the
// request's own deadline), so a body must keep coming, and a stalled one
// is answered 408 instead of holding its request (SPEC §14).
type idleBody struct {
	r        io.ReadCloser
	rc       *http.ResponseController
	idle     time.Duration
	end      time.Time
	deadline time.Time
	eof      bool
	n        int64 // bytes read
}

func (b *idleBody) Read(p []byte) (int, error) {
	b.deadline = time.Now().Add(b.idle)
	if b.end.Before(b.deadline) {
		b.deadline = b.end
	}
	_ = b.rc.SetReadDeadline(b.deadline)
	n, err := b.r.Read(p)
	b.n += int64(n)
	switch {
	case errors.Is(err, io.EOF):
		b.eof = true
	case err != nil && !time.Now().Before(b.deadline) && b.deadline.Equal(b.end):
		return n, fmt.Errorf("%w: it was not all sent within the request's deadline (%v)", ErrBodyStalled, err)
	case err != nil && !time.Now().Before(b.deadline):
		return n, fmt.Errorf("%w: no byte of it arrived for %s (%v)", ErrBodyStalled, b.idle, err)
	}
	return n, err
}

func (b *idleBody) Close() error { return b.r.Close() }

// fail answers an error as JSON with its status.
func (p *dataPlane) fail(w http.ResponseWriter, r *http.Request, err error) {
	var he *httpError
	if !errors.As(err, &he) {
		he = p.classify(err)
	}
	p.d.m.dataRefusals.WithLabelValues(refusalReason(he.code)).Inc()
	if he.code >= 500 {
		p.d.log.Warn("data-plane request failed", "method", r.Method, "path", r.URL.Path, "status", he.code, "err", he.msg)
	}
	writeError(w, he, "tether-data")
}

func (p *dataPlane) classify(err error) *httpError {
	var mbe *http.MaxBytesError
	switch {
	case errors.Is(err, ErrUnauthenticated):
		return &httpError{code: http.StatusUnauthorized, msg: err.Error()}
	case errors.Is(err, core.ErrUndeclaredOutput):
		return &httpError{code: http.StatusForbidden, msg: err.Error()}
	case errors.Is(err, ErrFenced), errors.Is(err, store.ErrRequestReused), errors.Is(err, store.ErrRequestLost):
		return &httpError{code: http.StatusConflict, msg: strings.TrimPrefix(err.Error(), "store: ")}
	case errors.Is(err, core.ErrNoSuchStep), errors.Is(err, core.ErrUnknownLease):
		return &httpError{code: http.StatusNotFound, msg: err.Error()}
	case errors.Is(err, store.ErrRequestsFull):
		return &httpError{code: http.StatusRequestEntityTooLarge, msg: strings.TrimPrefix(err.Error(), "store: ")}
	case errors.Is(err, store.ErrBadRequestID), errors.Is(err, store.ErrBadAttribute):
		return &httpError{code: http.StatusBadRequest, msg: strings.TrimPrefix(err.Error(), "store: ")}
	case errors.Is(err, ErrSecretRefused):
		return &httpError{code: http.StatusForbidden, msg: err.Error()}
	case errors.Is(err, ErrNoSecrets):
		return &httpError{code: http.StatusServiceUnavailable, msg: err.Error()}
	case errors.Is(err, store.ErrNotFound):
		return &httpError{code: http.StatusNotFound, msg: strings.TrimPrefix(err.Error(), "store: ")}
	case errors.Is(err, store.ErrStreamFull), errors.As(err, &mbe), errors.Is(err, store.ErrTooLarge):
		return &httpError{code: http.StatusRequestEntityTooLarge, msg: strings.TrimPrefix(err.Error(), "store: ")}
	case errors.Is(err, ErrBodyStalled):
		return &httpError{code: http.StatusRequestTimeout, msg: err.Error()}
	case errors.Is(err, store.ErrBadID), errors.Is(err, store.ErrBadFingerprint), errors.Is(err, store.ErrBadPath):
		return &httpError{code: http.StatusBadRequest, msg: strings.TrimPrefix(err.Error(), "store: ")}
	}
	return (&api{d: p.d}).classify(err)
}

// serveOperator answers an operator's read of the data plane (the operator
// API authenticated it); path is the data-plane path.
func (p *dataPlane) serveOperator(w http.ResponseWriter, r *http.Request, path string) {
	err := func() error {
		rt, herr := parseDataPath(r.Method, path)
		if herr != nil {
			return herr
		}
		return serveRead(w, r, p.d.st, rt)
	}()
	if err != nil {
		p.fail(w, r, err)
	}
}

func (p *dataPlane) serve(w http.ResponseWriter, r *http.Request) error {
	if strings.HasPrefix(r.URL.Path, "/secret/") || r.URL.Path == "/token" {
		cred := bearer(r)
		if cred == "" {
			return fmt.Errorf("%w: missing (send Authorization: Bearer <session credential>)", ErrUnauthenticated)
		}
		if r.URL.Path == "/token" {
			return p.token(w, r, cred) // SPEC §14a
		}
		return p.secret(w, r, cred) // SPEC §14a
	}
	rt, herr := parseDataPath(r.Method, r.URL.Path)
	if herr != nil {
		return herr
	}
	cred := bearer(r)
	if cred == "" {
		return fmt.Errorf("%w: missing (send Authorization: Bearer <session credential>)", ErrUnauthenticated)
	}
	ds := p.d.st
	if rt.write {
		return p.write(w, r, rt, cred)
	}
	if err := p.d.authenticate(r.Context(), cred, 0); err != nil {
		return err
	}
	switch rt.kind {
	case routeDefinition, routeOutput, routePool:
		return p.serveStep(w, r, rt, credWorker(cred))
	}
	return serveRead(w, r, ds, rt)
}

// write authenticates and fences one PUT or append on its headers, then
// reads its body and has the loop fence and persist it.
func (p *dataPlane) write(w http.ResponseWriter, r *http.Request, rt dataRoute, cred string) error {
	lease, err := parseLease(r)
	if err != nil {
		return &httpError{code: http.StatusBadRequest, msg: err.Error()}
	}
	req, err := requestID(r)
	if err != nil {
		return err
	}
	kind := store.OpPut
	switch {
	case rt.kind == routeStream:
		kind = store.OpAppend
	case r.Method == http.MethodDelete:
		kind = store.OpDelete
	}
	// A repeat is answered before any fence: its lease may have ended
	// since the first answer, which it gets again.
	if req != "" {
		if done, err := p.repeat(w, r, cred, lease, req, kind, rt.id); done || err != nil {
			return err
		}
	}
	// Refuse early, before reading (and holding) a byte of a body nobody
	// may write; the decisive check is made on the loop, at the write.
	if err := p.d.authenticateTo(r.Context(), cred, lease, rt.id); err != nil {
		// The first of a repeat may have become durable since the look
		// above, in the group the early check waited for.
		if req != "" && errors.Is(err, ErrFenced) {
			if done, rerr := p.repeat(w, r, cred, lease, req, kind, rt.id); done || rerr != nil {
				return rerr
			}
		}
		return err
	}
	switch kind {
	case store.OpAppend:
		return p.appendBody(w, r, rt, cred, lease, req)
	case store.OpDelete:
		op := store.DataOp{Kind: store.OpDelete, ID: rt.id, Lease: uint64(lease), Request: req}
		res, err := p.d.writeData(r.Context(), cred, lease, op, nil)
		if err != nil {
			return err
		}
		answerWrite(w, kind, res)
		return nil
	}
	attrs, err := attributes(r)
	if err != nil {
		return err
	}
	limit := p.d.opts.MaxPutBody
	if r.ContentLength > limit {
		return tooLarge(r.ContentLength, limit)
	}
	ref, err := p.d.st.WriteBlob(http.MaxBytesReader(w, r.Body, limit), limit)
	if err != nil {
		return bodyError(err, limit)
	}
	op := store.DataOp{Kind: store.OpPut, ID: rt.id, Lease: uint64(lease), Blob: ref, Request: req, Attributes: attrs}
	res, err := p.d.writeData(r.Context(), cred, lease, op, func() { p.d.st.ReleaseBlob(ref) })
	if err != nil {
		return err
	}
	answerWrite(w, kind, res)
	return nil
}

// appendBody reads an append's body into memory, within the budget, and
// has the loop fence and persist it with its group's records.
func (p *dataPlane) appendBody(w http.ResponseWriter, r *http.Request, rt dataRoute, cred string, lease core.LeaseID, req string) error {
	// A declared length that would pass the stream's bound is refused
	// before its body is read (SPEC §14); the write decides again.
	if max := p.d.opts.MaxStream; r.ContentLength > 0 && max > 0 {
		if m, err := p.d.st.Stream(rt.id); err == nil && m.Length+r.ContentLength > max {
			return fmt.Errorf("%w: stream %q holds %d bytes, %d more would pass %d", store.ErrStreamFull, rt.id, m.Length, r.ContentLength, max)
		}
	}
	body, held, err := p.readBody(w, r, p.d.opts.MaxAppendBody)
	if err != nil {
		return err
	}
	defer p.mem.release(held)
	if len(body) == 0 {
		return &httpError{code: http.StatusBadRequest, msg: "an append needs a non-empty body"}
	}
	op := store.DataOp{Kind: store.OpAppend, ID: rt.id, Body: body, Lease: uint64(lease), MaxStream: p.d.opts.MaxStream, Request: req}
	res, err := p.d.writeData(r.Context(), cred, lease, op, nil)
	if err != nil {
		return err
	}
	answerWrite(w, store.OpAppend, res)
	return nil
}

func tooLarge(n, limit int64) error {
	return &httpError{code: http.StatusRequestEntityTooLarge, msg: fmt.Sprintf("request body of %d bytes is larger than the limit of %d bytes", n, limit)}
}

// bodyError turns an error reading a write's body into its answer.
func bodyError(err error, limit int64) error {
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe), errors.Is(err, errOverCapacity), errors.Is(err, store.ErrTooLarge):
		return &httpError{code: http.StatusRequestEntityTooLarge, msg: fmt.Sprintf("request body larger than the limit of %d bytes", limit)}
	case errors.Is(err, ErrBodyStalled):
		return &httpError{code: http.StatusRequestTimeout, msg: err.Error()}
	}
	return &httpError{code: http.StatusBadRequest, msg: fmt.Sprintf("reading the request body: %v", err)}
}

// readBody reads a body of at most limit bytes into memory, within the
// budget of bodies held at once; the caller releases held bytes of it.
func (p *dataPlane) readBody(w http.ResponseWriter, r *http.Request, limit int64) (body []byte, held int64, err error) {
	if r.ContentLength > limit {
		return nil, 0, tooLarge(r.ContentLength, limit)
	}
	held = limit // a body of unknown length may use the whole limit
	if r.ContentLength >= 0 {
		held = r.ContentLength
	}
	if err := p.mem.acquire(r.Context(), held); err != nil {
		return nil, 0, err
	}
	// Made only once the budget has room: a request waiting for it holds
	// no buffer; and whole, so appending never grows it past what it holds.
	body = make([]byte, 0, held)
	_, err = io.Copy(&sliceWriter{b: &body, max: held}, http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		p.mem.release(held)
		return nil, 0, bodyError(err, limit)
	}
	return body, held, nil
}

// errOverCapacity is returned by sliceWriter when a body is longer than its
// declared Content-Length.
var errOverCapacity = errors.New("body longer than its Content-Length")

// sliceWriter appends to a slice without growing it past max, so the memory
// budget that was acquired is the memory used.
type sliceWriter struct {
	b   *[]byte
	max int64
}

func (s *sliceWriter) Write(p []byte) (int, error) {
	if int64(len(*s.b)+len(p)) > s.max {
		return 0, errOverCapacity
	}
	*s.b = append(*s.b, p...)
	return len(p), nil
}

// serveRead answers the read routes from the store.
func serveRead(w http.ResponseWriter, r *http.Request, ds store.DataPlane, rt dataRoute) error {
	switch rt.kind {
	case routeQuery:
		q, err := parseQuery(r.URL.Query())
		if err != nil {
			return err
		}
		items, next, err := ds.QueryData(q)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, dataplane.Query{Items: items, Next: next})
		return nil
	case routeVersions:
		vs, err := ds.Versions(rt.id)
		if err != nil {
			return err
		}
		out := dataplane.Versions{ID: rt.id, Versions: vs}
		if m, err := ds.Stream(rt.id); err == nil {
			out.Stream = &m
		} else if !errors.Is(err, store.ErrNotFound) {
			return err
		}
		if len(vs) == 0 && out.Stream == nil {
			return fmt.Errorf("%w: data %q has no versions and no stream", store.ErrNotFound, rt.id)
		}
		if out.Versions == nil {
			out.Versions = []store.DataMeta{}
		}
		writeJSON(w, http.StatusOK, out)
		return nil
	case routeVersion:
		m, err := ds.Data(rt.id, rt.version)
		if err != nil {
			return err
		}
		h := w.Header()
		h.Set("ETag", `"`+m.SHA256+`"`)
		h.Set(dataplane.VersionHeader, strconv.FormatUint(m.Version, 10))
		h.Set(dataplane.SHA256Header, m.SHA256)
		if rt.version == 0 {
			h.Set("Cache-Control", "no-cache") // latest moves; a numbered version never changes
			h.Set("Content-Location", fmt.Sprintf("/data/%s/%d", m.ID, m.Version))
		} else {
			h.Set("Cache-Control", "private, max-age=31536000, immutable")
		}
		if inm := r.Header.Get("If-None-Match"); inm != "" && strings.Contains(inm, `"`+m.SHA256+`"`) {
			w.WriteHeader(http.StatusNotModified)
			return nil
		}
		return sendBytes(w, r, m.Size, ds.DataReader(m))
	case routeStream:
		m, err := ds.Stream(rt.id)
		if err != nil {
			return err
		}
		var off int64
		if v := r.URL.Query().Get("offset"); v != "" {
			off, err = strconv.ParseInt(v, 10, 64)
			if err != nil || off < 0 {
				return &httpError{code: http.StatusBadRequest, msg: fmt.Sprintf("bad offset %q: want a number from 0", v)}
			}
		}
		if off > m.Length {
			return &httpError{code: http.StatusRequestedRangeNotSatisfiable, msg: fmt.Sprintf("offset %d is past the end of stream %q (%d bytes)", off, rt.id, m.Length)}
		}
		w.Header().Set(dataplane.StreamLengthHeader, strconv.FormatInt(m.Length, 10))
		w.Header().Set("Cache-Control", "no-cache")
		return sendBytes(w, r, m.Length-off, ds.StreamReader(rt.id, off, m.Length))
	case routeBundle, routeBundleFile:
		m, err := ds.Bundle(rt.fp)
		if err != nil {
			return err
		}
		off, size := int64(0), m.Size
		if rt.kind == routeBundleFile {
			if !m.Tar {
				return fmt.Errorf("%w: bundle %s is not a tar archive, so it has no files", store.ErrNotFound, rt.fp)
			}
			span, err := ds.BundleFile(rt.fp, rt.rel)
			if err != nil {
				return err
			}
			off, size = span.Offset, span.Size
		} else {
			w.Header().Set("ETag", `"`+m.Fingerprint+`"`)
		}
		w.Header().Set("Cache-Control", "private, max-age=31536000, immutable")
		return sendBytes(w, r, size, ds.BundleReader(m, off, size))
	}
	return fmt.Errorf("orchestrator: unhandled data route %d", rt.kind)
}

// sendBytes answers 200 with size bytes from rd. Once the header is sent an
// error can only cut the body short, which the client sees as a short read
// against Content-Length.
func sendBytes(w http.ResponseWriter, r *http.Request, size int64, rd io.Reader) error {
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Length", strconv.FormatInt(size, 10))
	h.Set("X-Content-Type-Options", "nosniff")
	if c, ok := rd.(io.Closer); ok {
		defer c.Close()
	}
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return nil
	}
	if _, err := io.Copy(w, rd); err != nil {
		panic(http.ErrAbortHandler) // the status is sent: abort the stream so the client cannot mistake it for whole
	}
	return nil
}

// ---- the driver's side ----

// precheck is the data plane's early check of a request's credential (and
// lease, if not zero), answered by the loop before it steps its next batch.
type precheck struct {
	cred   string
	lease  core.LeaseID
	id     string // the data id written, for declared outputs
	reply  chan error
	secret string // a secret's name: its read (or, put, write) is checked too (SPEC §14a)
	put    bool
}

// authenticate checks a session credential on the loop and, for a lease
// other than zero, that the lease is current for its worker: an early
// check, made on a request's headers, that only refuses (the decisive one
// is made at the write). It sees the state the last durable batch left and
// never waits for a commit.
func (d *Driver) authenticate(ctx context.Context, cred string, lease core.LeaseID) error {
	return d.authenticateTo(ctx, cred, lease, "")
}

// authenticateTo is authenticate for a write to data id (declared outputs,
// SPEC §14).
func (d *Driver) authenticateTo(ctx context.Context, cred string, lease core.LeaseID, id string) error {
	reply := make(chan error, 1)
	if err := d.push(ctx, precheck{cred: cred, lease: lease, id: id, reply: reply}); err != nil {
		return err
	}
	select {
	case err := <-reply:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-d.done:
		select {
		case err := <-reply:
			return err
		default:
			return ErrClosed
		}
	}
}

// precheck answers an early check (loop goroutine): the core's decision,
// asked as a query of the state the last batch left.
func (d *Driver) precheck(pc precheck) error {
	if pc.secret != "" {
		return dataRefusal(d.o.CheckSecret(time.Now(), pc.cred, pc.lease, pc.secret, pc.put))
	}
	return dataRefusal(d.o.CheckWriteTo(time.Now(), pc.cred, pc.lease, pc.id))
}

// dataRefusal translates the core's answer to a data-plane request into the
// error the request is answered with: 401 for the credential, 409 for the
// lease (SPEC §14); nil when admitted.
func dataRefusal(a core.DataAnswer) error {
	err := a.Err()
	switch {
	case err == nil:
		return nil
	case a.Refusal.Credential():
		return fmt.Errorf("%w: %v", ErrUnauthenticated, err)
	case a.Refusal == core.RefusedUndeclaredOutput:
		return fmt.Errorf("%w: %w", ErrFenced, err) // 403: classify finds core.ErrUndeclaredOutput first
	case a.Refusal == core.RefusedSecretNotDeclared:
		return fmt.Errorf("%w: %v", ErrSecretRefused, err)
	}
	return fmt.Errorf("%w: %v", ErrFenced, err)
}

// writeData hands a write to the loop and waits until it is durable (or
// refused). A write whose context ends first may still be applied. release,
// if set, is called once the loop has answered the write (or can no longer
// take it): the blob an op names stays pinned until then.
func (d *Driver) writeData(ctx context.Context, cred string, lease core.LeaseID, op store.DataOp, release func()) (store.DataResult, error) {
	if release == nil {
		release = func() {}
	}
	reply := make(chan dataAnswer, 1)
	if err := d.push(ctx, dataWrite{cred: cred, lease: lease, op: op, reply: reply}); err != nil {
		release()
		return store.DataResult{}, err
	}
	select {
	case a, ok := <-reply:
		release()
		switch {
		case !ok:
			return store.DataResult{}, ErrClosed
		case a.err != nil:
			return store.DataResult{}, a.err
		case a.res.Err != nil:
			return store.DataResult{}, a.res.Err
		}
		return a.res, nil
	case <-ctx.Done():
		go func() { <-reply; release() }() // the loop answers (or closes) every write it took
		return store.DataResult{}, ctx.Err()
	}
}

// writeBlob streams body into a pinned blob (at most limit bytes), has the
// loop apply op naming it, and releases the blob once answered.
func (d *Driver) writeBlob(ctx context.Context, cred string, lease core.LeaseID, op store.DataOp, body io.Reader, limit int64) (store.DataResult, error) {
	ref, err := d.st.WriteBlob(body, limit)
	if err != nil {
		return store.DataResult{}, err
	}
	op.Blob = ref
	return d.writeData(ctx, cred, lease, op, func() { d.st.ReleaseBlob(ref) })
}

// PutData stores body as the next version of id, fenced by lease, for the
// worker whose session credential cred is; it returns once the version is
// durable. It is what PUT /data/{id} does after reading the body, without
// the early check: the fence is decided on the loop alone.
func (d *Driver) PutData(ctx context.Context, cred string, lease core.LeaseID, id string, body []byte) (store.DataMeta, error) {
	if err := store.ValidateID(id); err != nil {
		return store.DataMeta{}, err
	}
	res, err := d.writeBlob(ctx, cred, lease, store.DataOp{Kind: store.OpPut, ID: id, Lease: uint64(lease)}, bytes.NewReader(body), int64(len(body)))
	return res.Data, err
}

// AppendData appends body to id's stream, fenced by lease, like PutData.
func (d *Driver) AppendData(ctx context.Context, cred string, lease core.LeaseID, id string, body []byte) (store.AppendResult, error) {
	if err := store.ValidateID(id); err != nil {
		return store.AppendResult{}, err
	}
	if len(body) == 0 {
		return store.AppendResult{}, fmt.Errorf("%w: an empty append", store.ErrBadOp)
	}
	res, err := d.writeData(ctx, cred, lease, store.DataOp{Kind: store.OpAppend, ID: id, Body: body, Lease: uint64(lease), MaxStream: d.opts.MaxStream}, nil)
	return res.Append, err
}

// PutBundle stores a bundle (content-addressed by its SHA-256) and returns
// its metadata, like PutBundleFrom.
func (d *Driver) PutBundle(ctx context.Context, body []byte) (store.BundleMeta, error) {
	return d.PutBundleFrom(ctx, bytes.NewReader(body), int64(len(body)))
}

// PutBundleFrom streams a bundle of at most limit bytes into a blob (off
// the loop; more is store.ErrTooLarge) and stores it, content-addressed by
// its SHA-256; an uncompressed tar is indexed, from the blob, so that its
// files can be fetched one by one. It returns once the bundle is durable.
func (d *Driver) PutBundleFrom(ctx context.Context, body io.Reader, limit int64) (store.BundleMeta, error) {
	ref, err := d.st.WriteBlob(body, limit)
	if err != nil {
		return store.BundleMeta{}, fmt.Errorf("put bundle: %w", err)
	}
	f, err := d.st.OpenBlob(ref.SHA256)
	if err != nil {
		d.st.ReleaseBlob(ref)
		return store.BundleMeta{}, fmt.Errorf("put bundle: %w", err)
	}
	files, _ := store.TarIndexReader(f, ref.Size) // nil when it is not an indexable tar
	f.Close()
	res, err := d.writeData(ctx, "", 0, store.DataOp{Kind: store.OpBundle, Blob: ref, Files: files}, func() { d.st.ReleaseBlob(ref) })
	if err != nil {
		return store.BundleMeta{}, fmt.Errorf("put bundle: %w", err)
	}
	return res.Bundle, nil
}

// admitWrite has the core decide one data write at its place among the
// group's inputs (loop goroutine): step steps the core.DataWrite into the
// group. An operator's bundle upload is not the core's to decide (the
// operator API authenticated it).
func (d *Driver) admitWrite(in *dataWrite, step func(core.Input) core.Ready) error {
	if in.op.Kind == store.OpSecretPut || in.op.Kind == store.OpSecretDelete {
		return d.admitSecret(in, step) // SPEC §14a
	}
	if in.cred == "" && in.op.Kind == store.OpBundle {
		in.op.At = time.Now()
		return nil
	}
	if in.op.Request != "" {
		// A repeat of a write admitted but not yet durable is not decided
		// again (its lease may have ended meanwhile): the store answers it
		// with the first's answer, in the same order (RepeatOnly).
		k := requestKey{lease: in.lease, id: in.op.Request}
		if pr, ok := d.pendingReq[k]; ok && pr.worker == credWorker(in.cred) && d.o.CheckWrite(time.Now(), in.cred, 0).Refusal == core.WriteAdmitted {
			in.op.RepeatOnly, in.op.Worker, in.op.At = true, string(pr.worker), d.o.Now()
			pr.n++
			d.pendingReq[k] = pr
			return nil
		}
	}
	rd := step(core.DataWrite{Credential: in.cred, Lease: in.lease, ID: in.op.ID})
	in.op.At = d.o.Now()
	if len(rd.Writes) != 1 {
		return fmt.Errorf("%w: the core answered %d writes for one", ErrFenced, len(rd.Writes))
	}
	if err := dataRefusal(rd.Writes[0]); err != nil {
		// A refused repeat whose first is durable (it landed after the
		// handler looked) gets the first's answer from the store.
		if a := rd.Writes[0]; in.op.Request != "" && a.Worker != "" && !a.Refusal.Credential() {
			if e, ok, _ := d.st.Request(uint64(in.lease), in.op.Request); ok && core.WorkerID(e.Worker) == a.Worker {
				in.op.RepeatOnly, in.op.Worker = true, e.Worker
				k := requestKey{lease: in.lease, id: in.op.Request}
				pr := d.pendingReq[k]
				pr.worker, pr.n = a.Worker, pr.n+1
				d.pendingReq[k] = pr
				return nil
			}
		}
		return err
	}
	a := rd.Writes[0]
	in.op.Worker, in.op.Run, in.op.Step = string(a.Worker), string(a.Run), string(a.Step)
	if in.op.Request != "" {
		k := requestKey{lease: in.lease, id: in.op.Request}
		pr := d.pendingReq[k]
		pr.worker, pr.n = a.Worker, pr.n+1
		d.pendingReq[k] = pr
	}
	return nil
}

// ---- the memory budget ----

// budget bounds the bytes of append bodies held in memory at once; a
// request waits for room (or its context). Only an authenticated write
// whose lease was current at its headers acquires any.
type budget struct {
	mu   sync.Mutex
	free int64
	room chan struct{} // closed when bytes are released
}

func newBudget(n int64) *budget { return &budget{free: n, room: make(chan struct{})} }

func (b *budget) acquire(ctx context.Context, n int64) error {
	for {
		b.mu.Lock()
		if b.free >= n {
			b.free -= n
			b.mu.Unlock()
			return nil
		}
		room := b.room
		b.mu.Unlock()
		select {
		case <-room:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (b *budget) release(n int64) {
	b.mu.Lock()
	b.free += n
	close(b.room)
	b.room = make(chan struct{})
	b.mu.Unlock()
}

// dataURL is the data plane's base URL for a listener address.
func dataURL(tls bool, addr string) string {
	u := url.URL{Scheme: "http", Host: addr}
	if tls {
		u.Scheme = "https"
	}
	return u.String()
}
