// Package client is a Go client of Tether's operator API (SPEC §15): typed
// methods for its routes, its request and answer types, and a typed *Error
// for every error answer.
//
//	c, err := client.New("http://127.0.0.1:7420", adminToken)
//	run, err := c.Submit(ctx, "build.yaml", definition)
//	det, err := c.Run(ctx, run)
//	if client.ErrorCode(err) == client.CodeNotFound { ... }
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tether-run/tether/adapters/dataplane"
)

// DefaultMaxAnswer bounds a JSON answer read into memory (a run's logs can
// be large).
const DefaultMaxAnswer = 256 << 20

// Client calls one orchestrator's operator API. It is safe for concurrent
// use.
type Client struct {
	bases     []string // "http://host:port/api", the given URLs in order
	token     string
	hc        *http.Client
	maxAnswer int64
	more      []string // WithURLs' raw URLs, checked by New

	mu  sync.Mutex
	cur string // the base that answered last (the leader, SPEC §11): tried first
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient sends the requests with hc (its transport's TLS settings,
// its timeout); the default is http.DefaultClient.
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.hc = hc } }

// WithMaxAnswer bounds a JSON answer to n bytes.
func WithMaxAnswer(n int64) Option { return func(c *Client) { c.maxAnswer = n } }

// WithURLs adds more orchestrators of one highly available group (SPEC
// §11), tried in order after New's URL when one cannot be reached or is a
// standby that knows no leader.
func WithURLs(urls ...string) Option { return func(c *Client) { c.more = append(c.more, urls...) } }

// LeaderHeader names the header with which a standby orchestrator answers
// (SPEC §11): the leader's advertised base URL. A 307 carrying it is
// followed by the client itself, with the token, to that URL alone (never
// to the Location of a redirect that does not carry it).
const LeaderHeader = "Tether-Leader"

// maxLeaderHops bounds how many standbys' pointers one request follows.
const maxLeaderHops = 3

// New returns a client of the orchestrator at baseURL (http:// or
// https://HOST:PORT, with or without its /api suffix), authenticated with
// the admin token.
func New(baseURL, adminToken string, opts ...Option) (*Client, error) {
	c := &Client{token: adminToken, hc: http.DefaultClient, maxAnswer: DefaultMaxAnswer}
	for _, o := range opts {
		o(c)
	}
	for _, raw := range append([]string{baseURL}, c.more...) {
		b, err := apiBase(raw)
		if err != nil {
			return nil, err
		}
		if !slices.Contains(c.bases, b) {
			c.bases = append(c.bases, b)
		}
	}
	c.more = nil
	c.cur = c.bases[0]
	// A redirect carrying LeaderHeader is followed by send, not by the
	// http.Client (which would follow its Location, with or without the
	// token depending on the host).
	hc := *c.hc
	check := hc.CheckRedirect
	hc.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if req.Response != nil && req.Response.Header.Get(LeaderHeader) != "" {
			return http.ErrUseLastResponse
		}
		if m := via[0].Method; m != http.MethodGet && m != http.MethodHead {
			// A request that changes something is never sent to another
			// address (SPEC §15): net/http would resend a POST to a 301's
			// Location as a GET and call its answer success.
			return http.ErrUseLastResponse
		}
		if check != nil {
			return check(req, via)
		}
		if len(via) >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		return nil
	}
	c.hc = &hc
	return c, nil
}

// apiBase turns an orchestrator URL into its API's base, "…/api".
func apiBase(raw string) (string, error) {
	u, err := url.Parse(strings.TrimRight(raw, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("client: URL %q: want http://HOST:PORT or https://HOST:PORT", raw)
	}
	return strings.TrimSuffix(u.String(), "/api") + "/api", nil
}

// URL returns the base URL (without /api) of the orchestrator that answered
// last, at first the one given to New.
func (c *Client) URL() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.TrimSuffix(c.cur, "/api")
}

// Error is an error answer of the API.
type Error struct {
	Status  int    // the HTTP status
	Code    Code   // its stable code
	Message string // for people
}

func (e *Error) Error() string { return fmt.Sprintf("%s (HTTP %d, %s)", e.Message, e.Status, e.Code) }

// ErrorCode returns the code of an *Error in err's chain, "" if there is
// none (the orchestrator was not reached, or its answer was not an error).
func ErrorCode(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// Do sends one request to the API (path below /api, query included) and
// returns a 2xx answer, whose body the caller closes; any other answer is an
// *Error. Typed methods cover every route; Do is for what they do not.
func (c *Client) Do(ctx context.Context, method, path string, body io.Reader, contentType string) (*http.Response, error) {
	h := http.Header{"Accept": {"application/json"}}
	if contentType != "" {
		h.Set("Content-Type", contentType)
	}
	return c.send(ctx, method, path, body, h)
}

// send is Do with the request's headers (the token is added). It starts at
// the orchestrator that answered last; a standby's 307 or 503 carrying
// LeaderHeader sends it to the leader named there (at most maxLeaderHops
// times); a URL that cannot be reached, or a standby that knows no leader,
// sends it to the next URL given (a request that may have arrived, a write
// whose connection broke after it was sent, is not sent again). A body is
// sent again only when the request can replay it (GetBody: a *bytes.Reader,
// *bytes.Buffer or *strings.Reader).
func (c *Client) send(ctx context.Context, method, path string, body io.Reader, h http.Header) (*http.Response, error) {
	c.mu.Lock()
	queue := []string{c.cur}
	c.mu.Unlock()
	for _, b := range c.bases {
		if b != queue[0] {
			queue = append(queue, b)
		}
	}
	var (
		getBody func() (io.ReadCloser, error)
		lastErr error
		hops    int
	)
	for i := 0; i < len(queue); i++ {
		base := queue[i]
		var rd io.Reader = body
		if i > 0 && body != nil {
			if getBody == nil {
				return nil, lastErr // the body cannot be sent twice
			}
			b, err := getBody()
			if err != nil {
				return nil, lastErr
			}
			rd = b
		}
		req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
		if err != nil {
			return nil, err
		}
		if i == 0 {
			getBody = req.GetBody
		}
		req.Header = h.Clone()
		req.Header.Set("Authorization", "Bearer "+c.token)
		resp, err := c.hc.Do(req)
		if err != nil {
			lastErr = fmt.Errorf("cannot reach the orchestrator at %s: %w", strings.TrimSuffix(base, "/api"), err)
			if ctx.Err() == nil && (notSent(err) || method == http.MethodGet || method == http.MethodHead) {
				continue
			}
			return nil, lastErr
		}
		if resp.StatusCode/100 == 2 {
			c.mu.Lock()
			c.cur = base
			c.mu.Unlock()
			return resp, nil
		}
		e, standby := answerError(resp)
		if resp.StatusCode/100 == 3 && resp.Header.Get(LeaderHeader) == "" {
			e.Message = fmt.Sprintf("the server at %s redirected the request to %q (HTTP %d): a request that changes something is not sent to another address; give the orchestrator's own URL",
				strings.TrimSuffix(base, "/api"), resp.Header.Get("Location"), resp.StatusCode)
			return nil, e
		}
		if leader := resp.Header.Get(LeaderHeader); leader != "" && hops < maxLeaderHops &&
			(resp.StatusCode == http.StatusTemporaryRedirect || resp.StatusCode == http.StatusServiceUnavailable) {
			if lb, err := apiBase(leader); err == nil && lb != base {
				hops++
				lastErr = e
				rest := slices.DeleteFunc(slices.Clone(queue[i+1:]), func(s string) bool { return s == lb })
				queue = append(append(queue[:i+1:i+1], lb), rest...)
				continue
			}
		}
		if resp.StatusCode == http.StatusServiceUnavailable && standby {
			lastErr = e // no leader known there: another URL may lead
			continue
		}
		if leader := resp.Header.Get(LeaderHeader); leader != "" {
			e.Message = fmt.Sprintf("%s: the leader is %s, after %d hops (at most %d)", e.Message, leader, hops, maxLeaderHops)
		} else {
			c.mu.Lock()
			c.cur = base // it answered: the next call starts there (SPEC §15)
			c.mu.Unlock()
		}
		return nil, e
	}
	return nil, lastErr
}

// notSent says whether a transport error happened before the request could
// reach the server (its connection was never made), so that sending it to
// another orchestrator cannot make it twice.
func notSent(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// answerError reads an error answer (and closes it) into an *Error;
// standby says it is a standby's refusal ({"error": "standby", …}, SPEC §11).
func answerError(resp *http.Response) (e *Error, standby bool) {
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return &Error{Status: resp.StatusCode, Code: CodeFor(resp.StatusCode), Message: "reading the answer: " + err.Error()}, false
	}
	e = &Error{Status: resp.StatusCode, Code: CodeFor(resp.StatusCode), Message: strings.TrimSpace(string(b))}
	var eb ErrorBody
	if json.Unmarshal(b, &eb) == nil {
		standby = eb.Error == "standby"
		if eb.Code != "" {
			e.Code = eb.Code
		}
		switch {
		case eb.Message != "":
			e.Message = eb.Message
		case eb.Error != "":
			e.Message = eb.Error
		}
	}
	if e.Message == "" {
		e.Message = http.StatusText(resp.StatusCode)
	}
	return e, standby
}

// call sends one request and decodes a 2xx JSON answer into out.
func (c *Client) call(ctx context.Context, method, path string, body io.Reader, contentType string, out any) error {
	resp, err := c.Do(ctx, method, path, body, contentType)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, c.maxAnswer+1))
	if err != nil {
		return fmt.Errorf("reading the answer: %w", err)
	}
	if int64(len(b)) > c.maxAnswer {
		return fmt.Errorf("the answer is larger than %d bytes", c.maxAnswer)
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("undecodable answer from the orchestrator: %w", err)
	}
	return nil
}

func jsonBody(v any) io.Reader {
	b, _ := json.Marshal(v)
	return bytes.NewReader(b)
}

// stepPath is a step id's path: "run-1/name[i]" → "run-1/name%5Bi%5D".
func stepPath(id string) string {
	run, name, _ := strings.Cut(id, "/")
	return url.PathEscape(run) + "/" + url.PathEscape(name)
}

// ---- runs ----

// Submit submits a workflow definition (YAML); file names it in errors
// (default "workflow"). It returns the new run's id.
func (c *Client) Submit(ctx context.Context, file string, definition []byte) (string, error) {
	return c.SubmitChild(ctx, "", file, definition)
}

// SubmitChild is Submit of a child run of run parent (SPEC §2; "" for
// none): cancelling the parent cancels it. The parent must be live.
func (c *Client) SubmitChild(ctx context.Context, parent, file string, definition []byte) (string, error) {
	q := url.Values{}
	if file != "" {
		q.Set("file", file)
	}
	if parent != "" {
		q.Set("parent", parent)
	}
	path := "/runs"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out Submitted
	if err := c.call(ctx, http.MethodPost, path, bytes.NewReader(definition), "application/yaml", &out); err != nil {
		return "", err
	}
	if out.Run == "" {
		return "", errors.New("the orchestrator's answer to a submit names no run")
	}
	return out.Run, nil
}

// RunsOptions selects a page of GET /api/runs; zero fields select nothing.
type RunsOptions struct {
	Limit  int    // runs in the page (the server's default, 100, when 0; at most 1000)
	Cursor string // RunList.NextCursor of the previous page
	Status string // only runs of this status
	Name   string // only runs of this workflow
	Since  string // submitted at or after an RFC 3339 time, or within a duration ("24h")
}

// Runs returns one page of runs, newest first, live and archived.
func (c *Client) Runs(ctx context.Context, o RunsOptions) (*RunList, error) {
	q := url.Values{}
	for k, v := range map[string]string{"cursor": o.Cursor, "status": o.Status, "name": o.Name, "since": o.Since} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if o.Limit != 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	path := "/runs"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out RunList
	if err := c.call(ctx, http.MethodGet, path, nil, "", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Run returns a run: its status, steps and server events.
func (c *Client) Run(ctx context.Context, id string) (*RunDetail, error) {
	var out RunDetail
	if err := c.call(ctx, http.MethodGet, "/runs/"+url.PathEscape(id), nil, "", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Cancel cancels a run; reason is recorded on it ("" for the default).
func (c *Client) Cancel(ctx context.Context, id, reason string) error {
	var out Submitted
	return c.call(ctx, http.MethodPost, "/runs/"+url.PathEscape(id)+"/cancel", jsonBody(CancelRequest{Reason: reason}), "application/json", &out)
}

// Rerun starts a new run of run id's definition and returns its id; with
// failedOnly the steps that succeeded in id are reused, not run (SPEC §2).
func (c *Client) Rerun(ctx context.Context, id string, failedOnly bool) (string, error) {
	var out Submitted
	if err := c.call(ctx, http.MethodPost, "/runs/"+url.PathEscape(id)+"/rerun", jsonBody(RerunRequest{FailedOnly: failedOnly}), "application/json", &out); err != nil {
		return "", err
	}
	return out.Run, nil
}

// Logs returns a run's stored log lines; step, if not "", keeps one step
// (NAME, all its forEach instances, or NAME[i]).
func (c *Client) Logs(ctx context.Context, id, step string) (*Logs, error) {
	path := "/runs/" + url.PathEscape(id) + "/logs"
	if step != "" {
		path += "?step=" + url.QueryEscape(step)
	}
	var out Logs
	if err := c.call(ctx, http.MethodGet, path, nil, "", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Approve opens the gate of a held step (its id, "run-1/name" or
// "run-1/name[i]").
func (c *Client) Approve(ctx context.Context, step string) (*StepAnswer, error) {
	return c.gate(ctx, step, "approve")
}

// Reject rejects a held step: it is cancelled.
func (c *Client) Reject(ctx context.Context, step string) (*StepAnswer, error) {
	return c.gate(ctx, step, "reject")
}

func (c *Client) gate(ctx context.Context, step, action string) (*StepAnswer, error) {
	var out StepAnswer
	if err := c.call(ctx, http.MethodPost, "/steps/"+stepPath(step)+"/"+action, nil, "", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ---- tokens and workers ----

// CreateToken creates an enrollment token valid for ttl (the server's
// default, 24h, when 0). Its secret is in this answer only.
func (c *Client) CreateToken(ctx context.Context, name string, ttl time.Duration) (*CreatedToken, error) {
	return c.createToken(ctx, TokenRequest{Name: name}, ttl)
}

// CreateTokenIntoSecret creates an enrollment token and stores it as
// secret (SPEC §9, §14a) without ever answering it: a step that declares
// the secret reads it, to start a worker.
func (c *Client) CreateTokenIntoSecret(ctx context.Context, name string, ttl time.Duration, secret string) (*CreatedToken, error) {
	return c.createToken(ctx, TokenRequest{Name: name, IntoSecret: secret}, ttl)
}

func (c *Client) createToken(ctx context.Context, req TokenRequest, ttl time.Duration) (*CreatedToken, error) {
	if ttl != 0 {
		req.TTL = ttl.String()
	}
	var out CreatedToken
	if err := c.call(ctx, http.MethodPost, "/tokens", jsonBody(req), "application/json", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Tokens lists the enrollment tokens, without their secrets.
func (c *Client) Tokens(ctx context.Context) (*TokenList, error) {
	var out TokenList
	if err := c.call(ctx, http.MethodGet, "/tokens", nil, "", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// RevokeToken revokes an enrollment token.
func (c *Client) RevokeToken(ctx context.Context, name string) error {
	var out RevokedToken
	return c.call(ctx, http.MethodDelete, "/tokens/"+url.PathEscape(name), nil, "", &out)
}

// Workers lists the enrolled worker instances.
func (c *Client) Workers(ctx context.Context) (*WorkerList, error) {
	var out WorkerList
	if err := c.call(ctx, http.MethodGet, "/workers", nil, "", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ---- bundles, data, backup ----

// PutBundle uploads a bundle (a *bytes.Reader, *bytes.Buffer or
// *strings.Reader is sent with its length); Existed tells whether it was
// already stored.
func (c *Client) PutBundle(ctx context.Context, body io.Reader) (*Bundle, error) {
	var out Bundle
	if err := c.call(ctx, http.MethodPut, "/bundles", body, "application/octet-stream", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Bundle describes a stored bundle.
func (c *Client) Bundle(ctx context.Context, fingerprint string) (*Bundle, error) {
	var out Bundle
	if err := c.call(ctx, http.MethodGet, "/bundles/"+url.PathEscape(fingerprint), nil, "", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// DataVersions lists a data item's versions and its append stream.
func (c *Client) DataVersions(ctx context.Context, id string) (*DataVersions, error) {
	var out DataVersions
	if err := c.call(ctx, http.MethodGet, "/data/"+url.PathEscape(id), nil, "", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// DataBody is the bytes of a data item; the caller closes it.
type DataBody struct {
	io.ReadCloser
	Version string // the Tether-Version header: which version ("" for a stream)
	Size    int64  // Content-Length, -1 when unknown
}

// Data opens a data item's bytes: version is a number, "latest", or
// "append" for its append stream.
func (c *Client) Data(ctx context.Context, id, version string) (*DataBody, error) {
	resp, err := c.Do(ctx, http.MethodGet, "/data/"+url.PathEscape(id)+"/"+url.PathEscape(version), nil, "")
	if err != nil {
		return nil, err
	}
	return &DataBody{ReadCloser: resp.Body, Version: resp.Header.Get(dataplane.VersionHeader), Size: resp.ContentLength}, nil
}

// Backup opens a consistent backup of the store, a tar stream (store.Unpack
// reads it); the caller closes it. The server sets no deadline on it: bound
// it with ctx, and give this client an http.Client without a Timeout.
func (c *Client) Backup(ctx context.Context) (io.ReadCloser, error) {
	resp, err := c.Do(ctx, http.MethodGet, "/store/backup", nil, "")
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// OpenAPI returns the API's OpenAPI 3 document.
func (c *Client) OpenAPI(ctx context.Context) ([]byte, error) {
	var out json.RawMessage
	if err := c.call(ctx, http.MethodGet, "/openapi.json", nil, "", &out); err != nil {
		return nil, err
	}
	return out, nil
}

// CreateOperatorToken creates a named operator token, read-only or not,
// and returns it; its secret is shown only in this answer.
func (c *Client) CreateOperatorToken(ctx context.Context, name string, readOnly bool) (*CreatedOperatorToken, error) {
	var out CreatedOperatorToken
	req := OperatorTokenRequest{Name: name, ReadOnly: readOnly}
	if err := c.call(ctx, http.MethodPost, "/operator-tokens", jsonBody(req), "application/json", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// OperatorTokens lists the operator tokens, revoked ones too, without
// their secrets.
func (c *Client) OperatorTokens(ctx context.Context) (*OperatorTokenList, error) {
	var out OperatorTokenList
	if err := c.call(ctx, http.MethodGet, "/operator-tokens", nil, "", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// RevokeOperatorToken revokes an operator token for good: its next
// request is answered 401.
func (c *Client) RevokeOperatorToken(ctx context.Context, name string) error {
	var out RevokedToken
	return c.call(ctx, http.MethodDelete, "/operator-tokens/"+url.PathEscape(name), nil, "", &out)
}

// AuditOptions selects a page of GET /api/audit; zero fields select nothing.
type AuditOptions struct {
	Limit  int    // entries in the page (100 when 0; at most 1000)
	Cursor string // AuditList.NextCursor of the previous page
	Since  string // recorded at or after an RFC 3339 time, or within a duration ("24h")
	Actor  string // only this operator token's actions
	Action string // only this action (run.submit, operator-token.create, ...)
}

// Audit returns one page of the audit log, newest first.
func (c *Client) Audit(ctx context.Context, o AuditOptions) (*AuditList, error) {
	q := url.Values{}
	for k, v := range map[string]string{"cursor": o.Cursor, "since": o.Since, "actor": o.Actor, "action": o.Action} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if o.Limit != 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	path := "/audit"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out AuditList
	if err := c.call(ctx, http.MethodGet, path, nil, "", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// CreateSchedule creates a cron schedule (SPEC §8a).
func (c *Client) CreateSchedule(ctx context.Context, req ScheduleRequest) (*Schedule, error) {
	var out Schedule
	if err := c.call(ctx, http.MethodPost, "/schedules", jsonBody(req), "application/json", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Schedules lists the schedules, by name.
func (c *Client) Schedules(ctx context.Context) (*ScheduleList, error) {
	var out ScheduleList
	if err := c.call(ctx, http.MethodGet, "/schedules", nil, "", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Schedule shows one schedule with its next fire times.
func (c *Client) Schedule(ctx context.Context, name string) (*Schedule, error) {
	var out Schedule
	if err := c.call(ctx, http.MethodGet, "/schedules/"+url.PathEscape(name), nil, "", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// PauseSchedule pauses a schedule; ResumeSchedule resumes it (fire times
// in the pause are not caught up).
func (c *Client) PauseSchedule(ctx context.Context, name string) (*Schedule, error) {
	return c.scheduleOp(ctx, name, "pause")
}

// ResumeSchedule resumes a paused schedule.
func (c *Client) ResumeSchedule(ctx context.Context, name string) (*Schedule, error) {
	return c.scheduleOp(ctx, name, "resume")
}

func (c *Client) scheduleOp(ctx context.Context, name, op string) (*Schedule, error) {
	var out Schedule
	if err := c.call(ctx, http.MethodPost, "/schedules/"+url.PathEscape(name)+"/"+op, nil, "", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// DeleteSchedule deletes a schedule; its runs are left alone.
func (c *Client) DeleteSchedule(ctx context.Context, name string) error {
	var out DeletedSchedule
	return c.call(ctx, http.MethodDelete, "/schedules/"+url.PathEscape(name), nil, "", &out)
}
