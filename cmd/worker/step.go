package main

// worker step …: the capability verbs for a step's own shell (SPEC §14),
// spoken to the step endpoint of the worker that runs it ($TETHER_DATA_URL,
// $TETHER_DATA_TOKEN), so that a shell step needs no curl.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tether-run/tether/adapters/dataplane"
	"github.com/tether-run/tether/adapters/worker"
	"github.com/tether-run/tether/core"
)

// Exit codes of worker step.
const (
	stepExitFailed   = 1  // no answer (after the retries), a 5xx, a local I/O error, corrupt bytes
	stepExitRefused  = 3  // a 4xx other than 404 and 409: the request is wrong or not allowed
	stepExitNotFound = 4  // 404: no such data, version, step, secret
	stepExitFenced   = 5  // 409: the step's lease ended; nothing was written
	stepExitUsage    = 64 // bad arguments, or not inside a step ($TETHER_DATA_URL unset)
)

const stepHelp = `Usage: worker step COMMAND [ARGS] [FLAGS]

The capability verbs for a step's own shell (SPEC §14). They speak to the
worker running the step through $TETHER_DATA_URL with $TETHER_DATA_TOKEN,
which every step process gets; the worker attaches the step's lease. The
worker binary must be on the step's PATH, which the step inherits from its
worker.

Commands:
  data put NAME FILE|-      store FILE (- : stdin) as the next version of NAME;
                            prints the version (JSON). --attr k=v (repeatable)
  data get NAME             write a version of NAME to stdout, checked against
                            its SHA-256. --version N (default: the latest),
                            -o FILE (written whole, then renamed into place)
  data append NAME FILE|-   append FILE (- : stdin) to NAME's stream; prints
                            where it landed (JSON)
  data rm NAME              delete NAME: a tombstone version (JSON)
  data versions NAME        NAME's versions and stream (JSON)
  data query                versions by --prefix P, --run R, --step S,
                            --attr k=v (repeatable), --since T, --until T
                            (RFC 3339), --limit N, --after CURSOR (JSON:
                            {"items", "next"})
  output STEP               an upstream step's outcome, writes and declared
                            outputs (JSON)
  definition                this run's workflow and this step's definition (JSON)
  secret get NAME           a secret this step declares (secrets:), to stdout
  secret put NAME           store stdin as secret NAME (put_secrets: only)
  token create NAME         mint an enrollment token for a worker straight
                            into a secret: --into-secret S (one the step
                            declares in put_secrets:), --ttl D (default 24h);
                            the token is never printed (SPEC §14a)
  pool                      the workers of the pool (JSON); --label k=v
                            (repeatable) and --state S (connected,
                            disconnected, draining, inactive, revoked) keep
                            the matching ones; --count prints how many

Every write (put, append, rm, secret put) carries a Tether-Request-Id,
drawn once (or --request-id ID, 1-64 of [A-Za-z0-9._-]), and is sent again
with the same id when its answer is lost (no connection, a 5xx): at most 6
times over about 15 s. The orchestrator answers a repeat with the first
answer, so a retried write is written once.

Example (in a step's run:):
  make && tar czf $TETHER_SCRATCH/out.tgz dist/
  worker step data put build.out out.tgz --attr arch=amd64
  worker step data get build.out --version 3 -o prev.tgz
  worker step output compile

Exit codes:
  0   done
  1   failed: no answer after the retries, the orchestrator failed (5xx), a
      local file could not be read or written, or the bytes read do not
      match their SHA-256
  3   refused (400, 401, 403, 413, …): the message says why
  4   not found (404)
  5   fenced (409): the step's lease ended; nothing was written
  64  usage: bad arguments, or $TETHER_DATA_URL or $TETHER_DATA_TOKEN unset
      (not inside a step)
`

// stepErr is a worker step failure with its exit code.
type stepErr struct {
	code int
	msg  string
}

func (e *stepErr) Error() string { return e.msg }

func stepFail(code int, format string, args ...any) error {
	return &stepErr{code: code, msg: fmt.Sprintf(format, args...)}
}

// stepRetry is how worker step sends a write again (a variable for a test).
var stepRetry = worker.DefaultRetry

// stepClient speaks to the step endpoint.
type stepClient struct {
	base   *url.URL
	token  string
	hc     *http.Client
	retry  worker.Retry
	stderr io.Writer
}

func newStepClient(stderr io.Writer) (*stepClient, error) {
	raw, tok := getenv(worker.EnvDataURL), getenv(worker.EnvDataToken)
	if raw == "" || tok == "" {
		return nil, stepFail(stepExitUsage, "$%s and $%s are unset: worker step runs inside a step, whose worker sets them", worker.EnvDataURL, worker.EnvDataToken)
	}
	u, err := url.Parse(strings.TrimRight(raw, "/"))
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, stepFail(stepExitUsage, "$%s = %q: want http://HOST:PORT", worker.EnvDataURL, raw)
	}
	tr := &http.Transport{Proxy: nil, DialContext: (&net.Dialer{Timeout: 10 * time.Second}).DialContext}
	return &stepClient{base: u, token: tok, hc: &http.Client{Transport: tr}, retry: stepRetry, stderr: stderr}, nil
}

// do sends one request; a write (requestID set) is sent again, with the
// same id, after a lost answer (no connection or a 5xx), while the retry
// policy allows. body must then be nil or an io.ReadSeeker at its start.
func (c *stepClient) do(ctx context.Context, method, path string, q url.Values, hdr http.Header, body io.ReadSeeker, size int64) (*http.Response, error) {
	u := *c.base
	u.Path = c.base.Path + path
	u.RawQuery = q.Encode()
	attempts := 1
	if hdr.Get(worker.RequestIDHeader) != "" {
		attempts = max(c.retry.Attempts, 1)
	}
	delay := c.retry.First
	for attempt := 1; ; attempt++ {
		var rd io.Reader
		if body != nil {
			if _, err := body.Seek(0, io.SeekStart); err != nil {
				return nil, stepFail(stepExitFailed, "rewinding the body: %v", err)
			}
			rd = struct{ io.Reader }{body} // the client closes a body it sent: hide Close, the body is sent again
		}
		req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
		if err != nil {
			return nil, stepFail(stepExitUsage, "%v", err)
		}
		if body != nil {
			req.ContentLength = size
		}
		for k, vs := range hdr {
			req.Header[k] = vs
		}
		req.Header.Set("Authorization", "Bearer "+c.token)
		resp, err := c.hc.Do(req)
		var failure error
		switch {
		case err != nil:
			failure = stepFail(stepExitFailed, "%s %s: %v", method, path, err)
		case resp.StatusCode/100 == 2 && attempts == 1:
			return resp, nil
		case resp.StatusCode/100 == 2:
			// A write's answer is lost as surely when its body breaks off:
			// read it whole here (a small JSON body).
			b, rerr := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
			if rerr == nil {
				resp.Body = io.NopCloser(bytes.NewReader(b))
				return resp, nil
			}
			failure = stepFail(stepExitFailed, "%s %s: reading the answer: %v", method, path, rerr)
		default:
			failure = answerFailure(resp, method, path)
			resp.Body.Close()
			if resp.StatusCode < 500 {
				return nil, failure
			}
		}
		if attempt >= attempts || ctx.Err() != nil {
			return nil, failure
		}
		fmt.Fprintf(c.stderr, "worker step: %v; sending it again (request id %s, attempt %d of %d)\n", failure, hdr.Get(worker.RequestIDHeader), attempt+1, attempts)
		time.Sleep(delay)
		delay = min(2*delay, c.retry.Max)
	}
}

func answerFailure(resp *http.Response, method, path string) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var e struct {
		Error   string `json:"error"`
		Message string `json:"message"`
	}
	msg := strings.TrimSpace(string(b))
	if json.Unmarshal(b, &e) == nil && (e.Error != "" || e.Message != "") {
		msg = e.Error
		if msg == "" {
			msg = e.Message
		}
	}
	code := stepExitFailed
	switch {
	case resp.StatusCode == http.StatusNotFound:
		code = stepExitNotFound
	case resp.StatusCode == http.StatusConflict:
		code = stepExitFenced
	case resp.StatusCode/100 == 4:
		code = stepExitRefused
	}
	return stepFail(code, "%s %s: %s (HTTP %d)", method, path, msg, resp.StatusCode)
}

// writeHeader returns a write's headers: its request id (given or fresh).
func writeHeader(requestID string) (http.Header, error) {
	if requestID == "" {
		requestID = worker.NewRequestID()
	} else if !worker.ValidRequestID(requestID) {
		return nil, stepFail(stepExitUsage, "--request-id %q: want 1-64 of [A-Za-z0-9._-]", requestID)
	}
	h := http.Header{}
	h.Set(worker.RequestIDHeader, requestID)
	return h, nil
}

// stepFlags parses flags anywhere among the arguments and returns the
// positional ones.
func stepFlags(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// openBody opens FILE, or spools stdin (-) to a temporary file so that a
// write can be sent again; the caller calls done.
func openBody(arg string, stdin io.Reader) (r io.ReadSeeker, size int64, done func(), err error) {
	if arg != "-" {
		f, err := os.Open(arg)
		if err != nil {
			return nil, 0, nil, stepFail(stepExitFailed, "%v", err)
		}
		fi, err := f.Stat()
		if err == nil && !fi.Mode().IsRegular() {
			err = fmt.Errorf("%s is not a regular file", arg)
		}
		if err != nil {
			f.Close()
			return nil, 0, nil, stepFail(stepExitFailed, "%v", err)
		}
		return f, fi.Size(), func() { f.Close() }, nil
	}
	f, err := os.CreateTemp(getenv(worker.EnvScratch), "stdin-")
	if err != nil {
		return nil, 0, nil, stepFail(stepExitFailed, "holding stdin: %v", err)
	}
	os.Remove(f.Name())
	n, err := io.Copy(f, stdin)
	if err != nil {
		f.Close()
		return nil, 0, nil, stepFail(stepExitFailed, "reading stdin: %v", err)
	}
	return f, n, func() { f.Close() }, nil
}

// printJSON copies a JSON answer to stdout, one value and a newline.
func printJSON(stdout io.Writer, resp *http.Response) error {
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return stepFail(stepExitFailed, "reading the answer: %v", err)
	}
	var buf bytes.Buffer
	if json.Compact(&buf, b) != nil {
		buf.Reset()
		buf.Write(bytes.TrimSpace(b))
	}
	buf.WriteByte('\n')
	_, err = stdout.Write(buf.Bytes())
	return err
}

// runStep runs worker step ARGS and returns its exit code.
func runStep(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	err := stepCommand(ctx, args, stdin, stdout, stderr)
	var se *stepErr
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(stdout, stepHelp)
		return exitOK
	case errors.As(err, &se):
		fmt.Fprintf(stderr, "worker step: %s\n", se.msg)
		if se.code == stepExitUsage {
			fmt.Fprintln(stderr, "Run 'worker step --help' for usage.")
		}
		return se.code
	default:
		fmt.Fprintf(stderr, "worker step: %v\nRun 'worker step --help' for usage.\n", err)
		return stepExitUsage
	}
}

func stepCommand(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return stepFail(stepExitUsage, "a command is required")
	}
	verb := args[0]
	args = args[1:]
	if verb == "data" || verb == "secret" || verb == "token" {
		if len(args) == 0 {
			return stepFail(stepExitUsage, "%s: a subcommand is required", verb)
		}
		if args[0] == "--help" || args[0] == "-help" || args[0] == "-h" || args[0] == "help" {
			verb = "--help" // a group's help is the whole list
			return stepCommand(ctx, []string{verb}, stdin, stdout, stderr)
		}
		verb, args = verb+" "+args[0], args[1:]
	}
	fs := flag.NewFlagSet("worker step "+verb, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var (
		version, out, requestID  string
		attrList                 listFlag
		prefix, run, step, since string
		until, after             string
		limit                    int
		labelList                listFlag
		state                    string
		count                    bool
		intoSecret, ttl          string
	)
	switch verb {
	case "data put":
		fs.Var(&attrList, "attr", "")
		fs.StringVar(&requestID, "request-id", "", "")
	case "data append", "data rm", "secret put":
		fs.StringVar(&requestID, "request-id", "", "")
	case "data get":
		fs.StringVar(&version, "version", "", "")
		fs.StringVar(&out, "o", "", "")
	case "data query":
		fs.StringVar(&prefix, "prefix", "", "")
		fs.StringVar(&run, "run", "", "")
		fs.StringVar(&step, "step", "", "")
		fs.Var(&attrList, "attr", "")
		fs.StringVar(&since, "since", "", "")
		fs.StringVar(&until, "until", "", "")
		fs.StringVar(&after, "after", "", "")
		fs.IntVar(&limit, "limit", 0, "")
	case "token create":
		fs.StringVar(&intoSecret, "into-secret", "", "")
		fs.StringVar(&ttl, "ttl", "", "")
	case "pool":
		fs.Var(&labelList, "label", "")
		fs.StringVar(&state, "state", "", "")
		fs.BoolVar(&count, "count", false, "")
	case "data versions", "output", "definition", "secret get":
	case "-h", "--help", "help":
		return flag.ErrHelp
	default:
		return stepFail(stepExitUsage, "unknown command %q", verb)
	}
	pos, err := stepFlags(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	if err != nil {
		return stepFail(stepExitUsage, "%s: %v", verb, err)
	}
	want := map[string]int{"data put": 2, "data append": 2, "data get": 1, "data rm": 1, "data versions": 1, "output": 1,
		"secret get": 1, "secret put": 1, "token create": 1, "data query": 0, "definition": 0, "pool": 0}[verb]
	if len(pos) != want {
		return stepFail(stepExitUsage, "%s takes %d argument(s), got %d: %q", verb, want, len(pos), pos)
	}
	if strings.HasPrefix(verb, "data ") && verb != "data query" && !worker.ValidDataID(pos[0]) {
		return stepFail(stepExitUsage, "%s: %q is not a data id: 1-128 of [A-Za-z0-9._-], the first a letter or digit", verb, pos[0])
	}
	c, err := newStepClient(stderr)
	if err != nil {
		return err
	}
	q := url.Values{}
	switch verb {
	case "data put", "data append":
		hdr, err := writeHeader(requestID)
		if err != nil {
			return err
		}
		for _, a := range attrList {
			if k, _, ok := strings.Cut(a, "="); !ok || k == "" {
				return stepFail(stepExitUsage, "--attr %q: want k=v", a)
			}
			hdr.Add(worker.AttributeHeader, a)
		}
		body, size, done, err := openBody(pos[1], stdin)
		if err != nil {
			return err
		}
		defer done()
		method, path := http.MethodPut, "/data/"+pos[0]
		if verb == "data append" {
			method, path = http.MethodPost, path+"/append"
		}
		resp, err := c.do(ctx, method, path, q, hdr, body, size)
		if err != nil {
			return err
		}
		return printJSON(stdout, resp)
	case "data rm":
		hdr, err := writeHeader(requestID)
		if err != nil {
			return err
		}
		resp, err := c.do(ctx, http.MethodDelete, "/data/"+pos[0], q, hdr, nil, 0)
		if err != nil {
			return err
		}
		return printJSON(stdout, resp)
	case "data get":
		v := "latest"
		if version != "" {
			if n, err := strconv.ParseUint(version, 10, 64); err != nil || n == 0 {
				return stepFail(stepExitUsage, "--version %q: want a version number (1, 2, …)", version)
			}
			v = version
		}
		resp, err := c.do(ctx, http.MethodGet, "/data/"+pos[0]+"/"+v, q, nil, nil, 0)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		return saveVerified(resp, out, stdout)
	case "data versions":
		return getJSON(ctx, c, "/data/"+pos[0], q, stdout)
	case "data query":
		for k, v := range map[string]string{"prefix": prefix, "run": run, "step": step, "since": since, "until": until, "after": after} {
			if v != "" {
				q.Set(k, v)
			}
		}
		for _, name := range []string{"since", "until"} {
			if v := q.Get(name); v != "" {
				if _, err := time.Parse(time.RFC3339, v); err != nil {
					return stepFail(stepExitUsage, "--%s %q: want an RFC 3339 time such as 2026-01-02T15:04:05Z", name, v)
				}
			}
		}
		if limit < 0 {
			return stepFail(stepExitUsage, "--limit %d: want a positive number", limit)
		}
		if limit > 0 {
			q.Set("limit", strconv.Itoa(limit))
		}
		for _, a := range attrList {
			k, v, ok := strings.Cut(a, "=")
			if !ok || k == "" {
				return stepFail(stepExitUsage, "--attr %q: want k=v", a)
			}
			q.Add("attr."+k, v)
		}
		return getJSON(ctx, c, "/data", q, stdout)
	case "output":
		return getJSON(ctx, c, "/step/output/"+pos[0], q, stdout)
	case "definition":
		return getJSON(ctx, c, "/step/definition", q, stdout)
	case "pool":
		if len(labelList) == 0 && state == "" && !count {
			return getJSON(ctx, c, "/pool", q, stdout)
		}
		return poolFiltered(ctx, c, labelList, state, count, stdout)
	case "secret get":
		resp, err := c.do(ctx, http.MethodGet, "/secret/"+pos[0], q, nil, nil, 0)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if _, err := io.Copy(stdout, io.LimitReader(resp.Body, maxSecretBytes)); err != nil {
			return stepFail(stepExitFailed, "reading the secret: %v", err)
		}
		return nil
	case "token create":
		if intoSecret == "" {
			return stepFail(stepExitUsage, "token create: --into-secret NAME is required: a step's token is stored as a secret it declares in put_secrets:, never printed")
		}
		body, err := json.Marshal(map[string]string{"name": pos[0], "ttl": ttl, "into_secret": intoSecret})
		if err != nil {
			return stepFail(stepExitFailed, "%v", err)
		}
		resp, err := c.do(ctx, http.MethodPost, "/token", q, http.Header{"Content-Type": {"application/json"}}, bytes.NewReader(body), int64(len(body)))
		if err != nil {
			return err
		}
		return printJSON(stdout, resp)
	case "secret put":
		hdr, err := writeHeader(requestID)
		if err != nil {
			return err
		}
		b, err := io.ReadAll(io.LimitReader(stdin, maxSecretBytes+1))
		switch {
		case err != nil:
			return stepFail(stepExitFailed, "reading stdin: %v", err)
		case len(b) > maxSecretBytes:
			return stepFail(stepExitUsage, "secret put: stdin holds more than %d bytes", maxSecretBytes)
		}
		resp, err := c.do(ctx, http.MethodPut, "/secret/"+pos[0], q, hdr, bytes.NewReader(b), int64(len(b)))
		if err != nil {
			return err
		}
		return printJSON(stdout, resp)
	}
	return stepFail(stepExitUsage, "unknown command %q", verb)
}

// maxSecretBytes bounds a secret's value read or written by worker step.
const maxSecretBytes = core.MaxSecretBytes // SPEC §14a

func getJSON(ctx context.Context, c *stepClient, path string, q url.Values, stdout io.Writer) error {
	resp, err := c.do(ctx, http.MethodGet, path, q, nil, nil, 0)
	if err != nil {
		return err
	}
	return printJSON(stdout, resp)
}

// saveVerified writes a version's bytes to out ("" or "-": stdout), checked
// against the SHA-256 the answer announced: a file is written beside out
// and renamed into place only when they match; on stdout a mismatch is
// reported (exit 1) after the bytes.
func saveVerified(resp *http.Response, out string, stdout io.Writer) error {
	want := resp.Header.Get(dataplane.SHA256Header)
	h := sha256.New()
	var w io.Writer = stdout
	var tmp *os.File
	if out != "" && out != "-" {
		var err error
		if tmp, err = os.CreateTemp(filepath.Dir(out), "."+filepath.Base(out)+".part-"); err != nil {
			return stepFail(stepExitFailed, "%v", err)
		}
		defer func() {
			if tmp != nil {
				tmp.Close()
				os.Remove(tmp.Name())
			}
		}()
		w = tmp
	}
	if _, err := io.Copy(io.MultiWriter(w, h), resp.Body); err != nil {
		return stepFail(stepExitFailed, "reading the version: %v", err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); want != "" && got != want {
		return stepFail(stepExitFailed, "the bytes read have sha256 %s, not the %s announced", got, want)
	}
	if tmp == nil {
		return nil
	}
	if err := tmp.Close(); err != nil {
		return stepFail(stepExitFailed, "%v", err)
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return stepFail(stepExitFailed, "%v", err)
	}
	tmp = nil
	return nil
}

// poolFiltered prints the workers of GET /pool that carry every label and
// are in state (if given): as the same JSON, or their number with count.
// It lets a shell step that keeps a pool of workers alive count them
// without a JSON tool.
func poolFiltered(ctx context.Context, c *stepClient, labels []string, state string, count bool, stdout io.Writer) error {
	want := map[string]string{}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return stepFail(stepExitUsage, "--label %q: want k=v", l)
		}
		want[k] = v
	}
	resp, err := c.do(ctx, http.MethodGet, "/pool", url.Values{}, nil, nil, 0)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var pool struct {
		Workers []map[string]any `json:"workers"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxPoolAnswer)).Decode(&pool); err != nil {
		return stepFail(stepExitFailed, "reading the pool: %v", err)
	}
	kept := []map[string]any{}
	for _, w := range pool.Workers {
		if state != "" && w["state"] != state {
			continue
		}
		have, _ := w["labels"].(map[string]any)
		match := true
		for k, v := range want {
			if have[k] != v {
				match = false
			}
		}
		if match {
			kept = append(kept, w)
		}
	}
	if count {
		_, err := fmt.Fprintln(stdout, len(kept))
		return err
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(map[string]any{"workers": kept})
}

// maxPoolAnswer bounds the pool answer poolFiltered reads (a pool of
// 10,000 workers with labels fits).
const maxPoolAnswer = 64 << 20
