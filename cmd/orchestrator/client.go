package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	flag "github.com/spf13/pflag"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/adapters/tlsconf"
	"github.com/tether-run/tether/adapters/workflow"
	"github.com/tether-run/tether/client"
)

const (
	defaultURL     = "http://127.0.0.1:7420"
	adminTokenEnv  = "TETHER_ADMIN_TOKEN"
	urlEnv         = "TETHER_URL"
	defaultTimeout = 30 * time.Second
	bundleTimeout  = 10*time.Minute + 30*time.Second // bundle put's default: a body's 10 minutes and an answer's 30 s (SPEC §12)
	maxAnswerSize  = 256 << 20                       // a run's logs can be large
)

const clientHelp = `

The orchestrator is found with --url, else $TETHER_URL; the admin token is
--admin-token, else $TETHER_ADMIN_TOKEN, else the file
<--data-dir>/admin-token. Output is a table for people; -o json prints the
API's JSON answer instead, -o yaml the same as YAML.`

// clientFlags registers the flags every client command takes.
func clientFlags(extra func(fs *flag.FlagSet, o *options)) func(fs *flag.FlagSet, o *options) {
	return func(fs *flag.FlagSet, o *options) {
		fs.StringArrayVar(&o.urls, "url", []string{defaultURL}, "orchestrator `URL` (its operator API is under /api/); https:// when it serves TLS; repeat it for each orchestrator of a highly available group (a standby's answer names the leader, which is then asked); $"+urlEnv+" (comma-separated) when not given")
		fs.Lookup("url").DefValue = defaultURL // printed as the URL, not "[http://…]"
		fs.StringVar(&o.ca, "ca", "", "trust the orchestrator's TLS certificate if this CA `file` (PEM) signed it")
		fs.StringVar(&o.adminToken, "admin-token", "", "admin or other operator `token` (default: $"+adminTokenEnv+", then <data-dir>/admin-token)")
		fs.StringVar(&o.dataDir, "data-dir", defaultDataDir, "orchestrator data `directory` holding admin-token")
		outputFlags(fs, o)
		fs.DurationVar(&o.timeout, "timeout", defaultTimeout, "give up on the orchestrator after this `duration`")
		if extra != nil {
			extra(fs, o)
		}
	}
}

func clientCommands() []*command {
	return []*command{
		{
			path: "token create", args: "NAME", nargs: 1,
			short: "create a one-time enrollment token for a worker",
			long: `Create a named, time-boxed enrollment token and print it (NAME.SECRET) on
stdout. The secret is shown only this once; the orchestrator keeps only its
hash. The token enrolls exactly one worker process, once: give it to
'worker connect' in $TETHER_WORKER_TOKEN or with --token-file. A worker
enrolled with it is named NAME unless it says otherwise. With --into-secret
the token is stored as that secret (SPEC §14a) and printed nowhere: a step
that declares the secret reads it to start a worker.` + clientHelp,
			example: `  orchestrator token create builder-1 --ttl 2h
  TETHER_WORKER_TOKEN=$(orchestrator token create builder-2) worker connect --url ws://127.0.0.1:7420/control
  orchestrator token create pool-7 --into-secret POOL_TOKEN`,
			flags: clientFlags(func(fs *flag.FlagSet, o *options) {
				fs.DurationVar(&o.ttl, "ttl", orchestrator.DefaultTokenTTL, "the token is valid for this `duration`")
				fs.StringVar(&o.intoSecret, "into-secret", "", "store the token as this `secret` instead of printing it")
			}),
			run: tokenCreate,
		},
		{
			path: "token list", nargs: 0,
			short: "list enrollment tokens (never their secrets)",
			long: `List every enrollment token: name, state (unused, consumed, expired,
revoked), when it was created and expires, and the worker instance that
consumed it. Secrets are never shown.` + clientHelp,
			example: "  orchestrator token list",
			flags:   clientFlags(nil),
			run:     tokenList,
		},
		{
			path: "token revoke", args: "NAME", nargs: 1,
			short: "revoke a token; its worker is disconnected and loses its leases",
			long: `Revoke an enrollment token. An unused token can no longer enroll; the worker
it enrolled is disconnected for good, and each of its in-flight steps is
triaged (never-started and no-write steps are requeued, started write-bearing
steps fail with class "revoked").` + clientHelp,
			example: "  orchestrator token revoke builder-1",
			flags:   clientFlags(nil),
			run:     tokenRevoke,
		},
		{
			path: "run submit", args: "FILE", nargs: 1,
			short: "submit a workflow (YAML) and print the run id",
			long: `Submit a workflow definition (YAML; FILE "-" reads stdin) and print the new
run's id on stdout. An invalid definition is refused with the line of each
problem. A small DAG (save it as dag.yaml; a checkout has more in
cmd/orchestrator/examples/):

` + exampleWorkflow + `
--wait then follows the run over its live stream (SPEC §17), printing each
step's state as it changes on stderr, as 'run watch' does, and exits with
the run's outcome: 0 success, 10 failed, 11 cancelled.

A step with 'workflow: FILE' (a path ending .yaml or .yml, relative to the
file naming it) starts a child run of that workflow and takes its outcome;
'with:' gives the child its inputs, as env over the child's own. The files
are read here and sent inlined, at most 4 runs deep, a cycle of files
refused. --parent RUN submits the run as a child of RUN: cancelling RUN
cancels it.` + clientHelp,
			example: `  orchestrator run submit dag.yaml
  orchestrator run submit - < dag.yaml
  RUN=$(orchestrator run submit dag.yaml) && orchestrator run show "$RUN"
  orchestrator run submit dag.yaml --wait && echo "the run succeeded"
  orchestrator run submit cleanup.yaml --parent run-12`,
			flags: clientFlags(func(fs *flag.FlagSet, o *options) {
				fs.BoolVar(&o.wait, "wait", false, "follow the run to its end; the exit code is its outcome")
				fs.StringVar(&o.parent, "parent", "", "submit it as a child run of this live `RUN` (cancelling RUN cancels it)")
			}),
			run: runSubmit,
		},
		{
			path: "run list", nargs: 0,
			short: "list runs with their status, newest first",
			long: `List runs, newest first, with their status and step counts: live runs and
finished (archived) ones alike. --limit says how many (default 100); more
than a page of the API (1000) is fetched page by page. --status keeps the
runs of one status (running, waiting, cancelling, failing, success, failed,
cancelled), --name those of one workflow, --since those submitted at or
after a time (RFC 3339) or within a duration (24h). With --json the answer
is the API's, its next_cursor continuing the listing.` + clientHelp,
			example: "  orchestrator run list\n  orchestrator run list --status failed --since 24h\n  orchestrator run list --name release --limit 5000 --json",
			flags: clientFlags(func(fs *flag.FlagSet, o *options) {
				fs.IntVar(&o.limit, "limit", orchestrator.DefaultRunsLimit, "list at most `N` runs")
				fs.StringVar(&o.status, "status", "", "only runs of this `status`")
				fs.StringVar(&o.name, "name", "", "only runs of the workflow of this `name`")
				fs.StringVar(&o.since, "since", "", "only runs submitted since this `time` (RFC 3339) or within this duration (24h)")
			}),
			run: runList,
		},
		{
			path: "run show", args: "RUN", nargs: 1,
			short: "show a run: status, steps, server events",
			long: `Show one run: its status; each step's state, attempts, worker, exit code,
failure class and message; and the run's server events (recovery and
lifecycle events, in order). With --exit-status the exit code is the run's
outcome: 0 success, 10 failed, 11 cancelled, and 12 while it has not ended
(waiting, running, failing or cancelling; 'run watch' waits for the end).` + clientHelp,
			example: "  orchestrator run show run-1\n  orchestrator run show run-1 -o json | jq -r .status\n  orchestrator run show run-1 --exit-status >/dev/null; echo $?",
			flags: clientFlags(func(fs *flag.FlagSet, o *options) {
				fs.BoolVar(&o.exitStatus, "exit-status", false, "exit with the run's outcome: 0 success, 10 failed, 11 cancelled, 12 not ended")
			}),
			run: runShow,
		},
		{
			path: "run cancel", args: "RUN", nargs: 1,
			short: "cancel every non-terminal step of a run",
			long: `Cancel a run. Running steps on connected workers are stopped (SIGTERM, then
SIGKILL after the kill grace) and end cancelled; every other unfinished step
is cancelled at once. Cancelling a finished run is refused (exit 3).` + clientHelp,
			example: `  orchestrator run cancel run-4 --reason "wrong branch"`,
			flags: clientFlags(func(fs *flag.FlagSet, o *options) {
				fs.StringVar(&o.reason, "reason", "", "why, recorded on the run (default \"cancelled by operator\")")
			}),
			run: runCancel,
		},
		{
			path: "run rerun", args: "RUN", nargs: 1,
			short: "start a new run of a run's definition",
			long: `Start a new run of RUN's definition (live or archived) and print its id on
stdout; the new run records that it reruns RUN ('run show' says "Rerun of").
With --failed-only the steps that succeeded in RUN are not run again: they
are created already succeeded with RUN's outcome, and the steps after them
proceed (SPEC §2). --wait follows the new run as 'run submit --wait' does.` + clientHelp,
			example: "  orchestrator run rerun run-4\n  orchestrator run rerun run-4 --failed-only --wait",
			flags: clientFlags(func(fs *flag.FlagSet, o *options) {
				fs.BoolVar(&o.failedOnly, "failed-only", false, "reuse the steps that succeeded in RUN; run only the others")
				fs.BoolVar(&o.wait, "wait", false, "follow the new run to its end; the exit code is its outcome")
			}),
			run: runRerun,
		},
		{
			path: "run logs", args: "RUN", nargs: 1,
			short: "print the stored output of a run's steps",
			long: `Print the stored log lines of a run's steps, lease by lease, with the
worker's timestamps. Gap markers ("--- Orchestrator offline for …") show where
a worker buffered output while disconnected. --step NAME limits the output to
one step (all its forEach instances) or one instance (NAME[i]).

--follow prints the lines stored so far, then each line as the orchestrator
stores it, over the run's live stream (SPEC §17; a stream that breaks is
reopened where it stopped), until the run ends; the exit code is then the
run's outcome: 0 success, 10 failed, 11 cancelled. With -o json each event
of the stream is one line, {"kind","id","data"}.` + clientHelp,
			example: "  orchestrator run logs run-1\n  orchestrator run logs run-1 --step build[2]\n  orchestrator run logs run-1 --follow",
			flags: clientFlags(func(fs *flag.FlagSet, o *options) {
				fs.StringVar(&o.step, "step", "", "only this step `NAME` (or NAME[i])")
				fs.BoolVarP(&o.follow, "follow", "f", false, "print lines as they come until the run ends; the exit code is its outcome")
			}),
			run: runLogs,
		},
		{
			path: "run watch", args: "RUN", nargs: 1,
			short: "print a run's step states as they change, until it ends",
			long: `Follow a run over its live stream (SPEC §17): one line for each step's state
as it changes (its attempt, worker and exit code when it has them), each
state once, in the order the orchestrator committed them, then the run's
outcome ("run run-1 success"). The exit code is the outcome: 0 success, 10
failed, 11 cancelled. A stream that breaks (the orchestrator restarts) is
reopened where it stopped. With -o json each event of the stream is one
line, {"kind","id","data"}.` + clientHelp,
			example: "  orchestrator run watch run-1\n  orchestrator run watch run-1 -o json | jq -c 'select(.kind==\"step\") | .data'",
			flags:   clientFlags(nil),
			run: func(ctx context.Context, e *env, args []string) error {
				return watch(ctx, e, e.stdout, args[0])
			},
		},
		{
			path: "step approve", args: "STEP", nargs: 1,
			short: "approve a held step (hold: true); it is queued",
			long: `Open the gate of a step that declares "hold: true" and is waiting for an
operator: the step is queued for a worker. STEP is the step's id,
RUN/NAME or RUN/NAME[i] (see 'run show').` + clientHelp,
			example: "  orchestrator step approve run-1/publish",
			flags:   clientFlags(nil),
			run:     func(ctx context.Context, e *env, args []string) error { return stepGate(ctx, e, args[0], true) },
		},
		{
			path: "step reject", args: "STEP", nargs: 1,
			short: "reject a held step; it is cancelled",
			long: `Reject a held step: it is cancelled (class "gate") and its dependents are
skipped. STEP is RUN/NAME or RUN/NAME[i].` + clientHelp,
			example: "  orchestrator step reject run-1/publish",
			flags:   clientFlags(nil),
			run:     func(ctx context.Context, e *env, args []string) error { return stepGate(ctx, e, args[0], false) },
		},
		{
			path: "bundle put", args: "FILE", nargs: 1,
			short: "upload a bundle; prints its fingerprint",
			long: `Upload FILE as a bundle: content-addressed by the SHA-256 of its bytes, which
is printed (the same bytes again are stored once). Workers fetch it with
GET /bundle/FINGERPRINT on the data plane; an uncompressed tar archive is
indexed, so a step can fetch one file of it with
GET /bundle/FINGERPRINT/file/PATH.` + clientHelp,
			example: "  tar -cf model.tar model/ && orchestrator bundle put model.tar",
			flags: clientFlags(func(fs *flag.FlagSet, o *options) {
				// The orchestrator reads a bundle's body for up to 10
				// minutes, then answers within 30 s (SPEC §12).
				o.timeout = bundleTimeout
				fs.Lookup("timeout").DefValue = bundleTimeout.String()
			}),
			run: bundlePut,
		},
		{
			path: "data get", args: "ID [VERSION]", nargs: -1,
			short: "print a data item a step wrote (a version, or its append stream)",
			long: `Print the bytes of a data item that steps wrote through the data plane.
VERSION is a number, "latest" (the default), or "append" for the item's
append stream (live logs). --out FILE writes them to FILE instead.` + clientHelp,
			example: "  orchestrator data get build.out\n  orchestrator data get build.out 2 --out build-2.tar\n  orchestrator data get deploy.log append",
			flags: clientFlags(func(fs *flag.FlagSet, o *options) {
				fs.StringVar(&o.out, "out", "", "write to this `file` instead of stdout")
			}),
			run: dataGet,
		},
		{
			path: "data versions", args: "ID", nargs: 1,
			short: "list the versions of a data item",
			long: `List the versions of a data item (version, size, sha256, when, which worker
and lease wrote it) and its append stream's length.` + clientHelp,
			example: "  orchestrator data versions build.out",
			flags:   clientFlags(nil),
			run:     dataVersions,
		},
		dataQueryCmd,
		{
			path: "worker list", nargs: 0,
			short: "list enrolled workers and their state",
			long: `List every enrolled worker instance: id, name, state (connected,
disconnected — within its grace window —, inactive, revoked), tags, slots,
current leases and last heartbeat.` + clientHelp,
			example: "  orchestrator worker list",
			flags:   clientFlags(nil),
			run:     workerList,
		},
	}
}

// ---- the HTTP client (package client) ----

// newClient returns the API client of the command's flags; timeout bounds
// each request (0: none; negative: a live stream's client, --timeout
// bounding only the wait for an answer's headers).
func newClient(e *env, timeout time.Duration) (*client.Client, error) {
	o := e.opts
	raws, from := o.urls, "--url"
	if v := e.getenv(urlEnv); v != "" && !e.flags.Changed("url") {
		raws, from = strings.Split(v, ","), "$"+urlEnv
	}
	var urls []string
	for _, raw := range raws {
		raw = strings.TrimSpace(raw)
		u, err := url.Parse(strings.TrimRight(raw, "/"))
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, usageErrorf("%s %q: want http://HOST:PORT", from, raw)
		}
		urls = append(urls, u.String())
	}
	if len(urls) == 0 {
		return nil, usageErrorf("%s: no URL", from)
	}
	tok := o.adminToken
	if tok == "" {
		tok = e.getenv(adminTokenEnv)
	}
	if tok == "" {
		path := filepath.Join(o.dataDir, adminTokenFile)
		t, err := readAdminToken(path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return nil, usageErrorf("no admin token: pass --admin-token, set $%s, or point --data-dir at the orchestrator's data directory (%s does not exist)", adminTokenEnv, path)
		case err != nil:
			return nil, usageErrorf("admin token: %v", err)
		}
		tok = t
	}
	hc := &http.Client{Timeout: max(timeout, 0)}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if timeout < 0 {
		// a live stream: no deadline on the whole answer; --timeout bounds
		// the wait for its headers
		tr.ResponseHeaderTimeout = o.timeout
	}
	if len(urls) > 1 && o.timeout > 0 {
		// Each URL gets an equal share of --timeout to connect (at least
		// 1 s): a host gone silent — a dead leader's answers no SYN —
		// cannot use it all up before the others are tried, and a dial
		// that failed sent nothing, so any request moves on (SPEC §15).
		share := max(o.timeout/time.Duration(len(urls)), time.Second)
		tr.DialContext = (&net.Dialer{Timeout: share, KeepAlive: 30 * time.Second}).DialContext
	}
	if o.ca != "" {
		pool, err := tlsconf.LoadCA(o.ca)
		if err != nil {
			return nil, usageErrorf("--ca: %v", err)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	}
	hc.Transport = tr
	return client.New(urls[0], tok, client.WithHTTPClient(hc), client.WithMaxAnswer(maxAnswerSize), client.WithURLs(urls[1:]...))
}

// answerErr turns a client error into the command's: an error answer
// (escaped: its message may quote a hostile name) exits 3 when the
// orchestrator refused (4xx), 1 otherwise.
func answerErr(err error) error {
	var ce *client.Error
	if !errors.As(err, &ce) {
		return err
	}
	aerr := fmt.Errorf("%s (HTTP %d)", escapeText(ce.Message, true), ce.Status)
	if ce.Status/100 == 4 {
		return &exitErr{code: exitRefused, err: aerr}
	}
	return aerr
}

// outputFlags registers -o (--output) and --json.
func outputFlags(fs *flag.FlagSet, o *options) {
	fs.StringVarP(&o.output, "output", "o", "table", "output `format`: table, json (the API's answer) or yaml (the same as YAML)")
	fs.BoolVar(&o.json, "json", false, "the same as -o json")
}

// printStructured prints v, the API's answer, when -o asks for JSON or
// YAML, and says so; with -o table it prints nothing (the command prints
// its table).
func (e *env) printStructured(v any) (bool, error) {
	format, err := e.format()
	switch {
	case err != nil:
		return true, err
	case format == "json":
		return true, printJSON(e.stdout, v)
	case format == "yaml":
		return true, printYAML(e.stdout, v)
	}
	return false, nil
}

// format is -o's format: table, json or yaml (--json: json).
func (e *env) format() (string, error) {
	switch {
	case e.opts.json:
		return "json", nil
	case e.opts.output == "":
		return "table", nil
	case e.opts.output == "table" || e.opts.output == "json" || e.opts.output == "yaml":
		return e.opts.output, nil
	}
	return "", usageErrorf("-o %q: want table, json or yaml", e.opts.output)
}

// print prints v as -o asks, table printing the table.
func (e *env) print(v any, table func() error) error {
	if ok, err := e.printStructured(v); ok {
		return err
	}
	return table()
}

// printYAML prints v as YAML: its JSON (the API's answer, in its fields'
// order) re-encoded in block style.
func printYAML(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return err
	}
	blockStyle(&doc)
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return err
	}
	return enc.Close()
}

// blockStyle drops the flow style JSON's braces gave the nodes; a string's
// quotes are dropped too, the encoder quoting it again where YAML would
// read it as another type.
func blockStyle(n *yaml.Node) {
	n.Style &^= yaml.FlowStyle | yaml.DoubleQuotedStyle
	for _, c := range n.Content {
		blockStyle(c)
	}
}

// printJSON prints v indented.
func printJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// withClient runs f with a client and a context bounded by --timeout.
func withClient(ctx context.Context, e *env, f func(ctx context.Context, c *client.Client) error) error {
	c, err := newClient(e, e.opts.timeout)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, e.opts.timeout)
	defer cancel()
	return answerErr(f(ctx, c))
}

// ---- commands ----

func tokenCreate(ctx context.Context, e *env, args []string) error {
	return withClient(ctx, e, func(ctx context.Context, c *client.Client) error {
		if e.opts.intoSecret != "" {
			out, err := c.CreateTokenIntoSecret(ctx, args[0], e.opts.ttl, e.opts.intoSecret)
			if err != nil {
				return err
			}
			if ok, err := e.printStructured(out); ok {
				return err
			}
			fmt.Fprintf(e.stdout, "token %s stored as secret %s, expires %s\n", out.Name, out.IntoSecret, fmtTime(out.ExpiresAt))
			return nil
		}
		out, err := c.CreateToken(ctx, args[0], e.opts.ttl)
		if err != nil {
			return err
		}
		if ok, err := e.printStructured(out); ok {
			return err
		}
		fmt.Fprintln(e.stdout, out.Token)
		ws := strings.Replace(c.URL(), "http", "ws", 1) + "/control"
		fmt.Fprintf(e.stderr, "Enrollment token %q expires %s. It is shown only this once and enrolls one worker:\n  TETHER_WORKER_TOKEN=%[4]s worker connect --url %[3]s\n",
			out.Name, fmtTime(out.ExpiresAt), ws, out.Token)
		return nil
	})
}

func tokenList(ctx context.Context, e *env, _ []string) error {
	return withClient(ctx, e, func(ctx context.Context, c *client.Client) error {
		out, err := c.Tokens(ctx)
		if err != nil {
			return err
		}
		if ok, err := e.printStructured(out); ok {
			return err
		}
		tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tSTATE\tCREATED\tEXPIRES\tCONSUMED BY")
		for _, t := range out.Tokens {
			by := "-"
			if t.ConsumedBy != "" {
				by = cell(t.ConsumedBy)
				if t.WorkerName != "" {
					by = cell(t.WorkerName) + " (" + cell(t.ConsumedBy) + ")"
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", cell(t.Name), cell(t.State), fmtTime(t.CreatedAt), fmtTime(t.ExpiresAt), by)
		}
		return tw.Flush()
	})
}

func tokenRevoke(ctx context.Context, e *env, args []string) error {
	return withClient(ctx, e, func(ctx context.Context, c *client.Client) error {
		if err := c.RevokeToken(ctx, args[0]); err != nil {
			return err
		}
		if ok, err := e.printStructured(client.RevokedToken{Revoked: args[0]}); ok {
			return err
		}
		fmt.Fprintf(e.stdout, "token %s revoked\n", cell(args[0]))
		return nil
	})
}

func runSubmit(ctx context.Context, e *env, args []string) error {
	var src []byte
	var err error
	name := args[0]
	if name == "-" {
		src, err = io.ReadAll(io.LimitReader(os.Stdin, orchestrator.MaxAPIBody+1))
		name = "stdin"
	} else if src, err = os.ReadFile(name); err == nil && childFiles(src) {
		// Its child workflow files are ours to read (SPEC §2): resolved
		// and checked here, sent inlined.
		if _, src, err = workflow.ParseFile(name); err != nil {
			return &exitErr{code: exitRefused, err: err} // as the orchestrator's refusal of it would be
		}
	}
	if err != nil {
		return fmt.Errorf("read workflow: %w", err)
	}
	return startedRun(ctx, e, func(ctx context.Context, c *client.Client) (string, error) {
		return c.SubmitChild(ctx, e.opts.parent, filepath.Base(name), src)
	})
}

// startedRun starts a run with start, prints its id on stdout (or -o's
// answer), and with --wait follows it: its steps as they change, for
// people, on stderr (stdout holds only the run's id, for a script), and
// its outcome as the exit code.
func startedRun(ctx context.Context, e *env, start func(context.Context, *client.Client) (string, error)) error {
	var run string
	err := withClient(ctx, e, func(ctx context.Context, c *client.Client) error {
		var err error
		if run, err = start(ctx, c); err != nil {
			return err
		}
		out := client.Submitted{Run: run}
		if ok, err := e.printStructured(out); ok {
			return err
		}
		fmt.Fprintln(e.stdout, out.Run)
		return nil
	})
	if err != nil || !e.opts.wait {
		return err
	}
	o := *e.opts
	o.output, o.json = "table", false
	we := *e
	we.opts = &o
	return watch(ctx, &we, e.stderr, run)
}

// childFiles reports whether a definition may name a child workflow file:
// only then is it parsed here (otherwise it is sent as it is, and the
// orchestrator's errors are the ones shown).
func childFiles(src []byte) bool {
	return bytes.Contains(src, []byte("workflow:"))
}

// runList pages through GET /api/runs (SPEC §12) until --limit runs or the
// last page.
func runList(ctx context.Context, e *env, _ []string) error {
	if e.opts.limit < 1 {
		return usageErrorf("--limit %d: list at least 1 run", e.opts.limit)
	}
	return withClient(ctx, e, func(ctx context.Context, c *client.Client) error {
		out := client.RunList{Runs: []client.Run{}}
		q := client.RunsOptions{Status: e.opts.status, Name: e.opts.name, Since: e.opts.since}
		for len(out.Runs) < e.opts.limit {
			q.Limit = min(e.opts.limit-len(out.Runs), orchestrator.MaxRunsLimit)
			page, err := c.Runs(ctx, q)
			if err != nil {
				return err
			}
			out.Runs = append(out.Runs, page.Runs...)
			out.NextCursor = page.NextCursor
			if page.NextCursor == "" {
				break
			}
			q.Cursor = page.NextCursor
		}
		if ok, err := e.printStructured(out); ok {
			return err
		}
		tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "RUN\tNAME\tSTATUS\tSTEPS\tSUBMITTED\tFINISHED")
		for _, r := range out.Runs {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", cell(r.ID), cell(orDash(r.Name)), cell(r.Status), stateCounts(r), fmtTime(r.SubmittedAt), fmtTime(r.FinishedAt))
		}
		return tw.Flush()
	})
}

// stateCounts renders "3/5 success, 1 running".
func stateCounts(r client.Run) string {
	states := make([]string, 0, len(r.States))
	for s := range r.States {
		states = append(states, s)
	}
	sort.Strings(states)
	parts := []string{}
	for _, s := range states {
		parts = append(parts, fmt.Sprintf("%d %s", r.States[s], s))
	}
	return fmt.Sprintf("%d (%s)", r.Steps, strings.Join(parts, ", "))
}

func runShow(ctx context.Context, e *env, args []string) error {
	return withClient(ctx, e, func(ctx context.Context, c *client.Client) error {
		out, err := c.Run(ctx, args[0])
		if err != nil {
			return err
		}
		table := func() error {
			if err := showRun(e, out); err != nil {
				return err
			}
			return showTree(ctx, e, c, out)
		}
		if err := e.print(out, table); err != nil || !e.opts.exitStatus {
			return err
		}
		return outcome(out.Run.ID, out.Status)
	})
}

// maxTreeRuns bounds the child runs 'run show' fetches to draw a tree.
const maxTreeRuns = 256

// showTree prints a run's tree of child runs (SPEC §2), each with its
// status and the step that started it, fetching each child in turn.
func showTree(ctx context.Context, e *env, c *client.Client, out *client.RunDetail) error {
	if len(out.Children) == 0 {
		return nil
	}
	fmt.Fprintln(e.stdout, "\nChild runs:")
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fetched := 0
	var walk func(ids []string, depth int) error
	walk = func(ids []string, depth int) error {
		for _, id := range ids {
			indent := strings.Repeat("  ", depth)
			if fetched++; fetched > maxTreeRuns {
				fmt.Fprintf(tw, "  %s…\t(more child runs: see run show of each)\t\n", indent)
				return nil
			}
			d, err := c.Run(ctx, id)
			if err != nil {
				fmt.Fprintf(tw, "  %s%s\t%s\t\n", indent, cell(id), escapeText(oneLine(err.Error()), false))
				continue
			}
			by := "submitted with --parent"
			if d.ParentStep != "" {
				by = "step " + cell(d.ParentStep)
			}
			fmt.Fprintf(tw, "  %s%s\t%s\t%s\n", indent, cell(id), cell(d.Status), by)
			if err := walk(d.Children, depth+1); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(out.Children, 0); err != nil {
		return err
	}
	return tw.Flush()
}

// showRun prints a run as a table.
func showRun(e *env, out *client.RunDetail) error {
	{
		r := out.Run
		fmt.Fprintf(e.stdout, "Run %s %q: %s\n", cell(r.ID), r.Name, cell(out.Status))
		if r.Parent != "" {
			fmt.Fprintf(e.stdout, "Parent run %s", cell(r.Parent))
			if out.ParentStep != "" {
				fmt.Fprintf(e.stdout, " (started by step %s)", cell(out.ParentStep))
			}
			fmt.Fprintln(e.stdout)
		}
		fmt.Fprintf(e.stdout, "Submitted %s", fmtTime(r.SubmittedAt))
		if !r.FinishedAt.IsZero() {
			fmt.Fprintf(e.stdout, ", finished %s (%s)", fmtTime(r.FinishedAt), r.FinishedAt.Sub(r.SubmittedAt).Round(time.Millisecond))
		}
		fmt.Fprintln(e.stdout)
		if r.CancelReason != "" {
			fmt.Fprintf(e.stdout, "Cancelled: %s\n", escapeText(oneLine(r.CancelReason), false))
		}
		if r.RerunOf != "" {
			fmt.Fprintf(e.stdout, "Rerun of %s\n", cell(r.RerunOf))
		}
		if out.Group != "" {
			fmt.Fprintf(e.stdout, "Concurrency group %s\n", cell(out.Group))
		}
		if out.Schedule != "" {
			fmt.Fprintf(e.stdout, "Started by schedule %s for its fire time %s\n", cell(out.Schedule), fmtTime(out.FireAt))
		}
		fmt.Fprintln(e.stdout)
		tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "STEP\tSTATE\tATTEMPTS\tWORKER\tEXIT\tWRITES\tCLASS\tMESSAGE")
		for _, s := range out.Steps {
			exit := "-"
			if s.ExitCode != nil {
				exit = fmt.Sprint(*s.ExitCode)
			}
			msg := s.Message
			if s.SkippedBy != "" {
				msg = strings.TrimSpace(msg + " (skipped by " + s.SkippedBy + ")")
			}
			if s.Child != "" && !strings.Contains(msg, s.Child) {
				msg = strings.TrimSuffix("child run "+s.Child+": "+msg, ": ")
			}
			writes := "no"
			if s.Writes {
				writes = "yes"
			}
			attempts := fmt.Sprint(s.Attempts)
			if s.TryLimit > 0 {
				attempts += fmt.Sprintf(" (try %d/%d)", s.Try, s.TryLimit) // SPEC §1 RETRY
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", cell(s.ID), cell(s.State), attempts, cell(orDash(s.Worker)), exit, writes, cell(orDash(s.Class)),
				orDash(escapeText(oneLine(msg), false)))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintln(e.stdout, "\nServer events:")
		tw = tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
		for _, ev := range out.Events {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", ev.At.Local().Format("15:04:05.000"), cell(ev.Kind), cell(orDash(ev.Step)), escapeText(oneLine(ev.Message), false))
		}
		return tw.Flush()
	}
}

// outcome is the exit code of a run's status: nil (0) for success, 10
// failed, 11 cancelled, 12 not ended yet (waiting, running, failing,
// cancelling).
func outcome(run, status string) error {
	switch status {
	case "success":
		return nil
	case "failed":
		return &exitErr{code: exitRunFailed, err: fmt.Errorf("run %s failed", cell(run))}
	case "cancelled":
		return &exitErr{code: exitRunCancelled, err: fmt.Errorf("run %s was cancelled", cell(run))}
	}
	return &exitErr{code: exitRunUnfinished, err: fmt.Errorf("run %s has not ended: %s", cell(run), cell(status))}
}

// runRerun is POST /api/runs/{id}/rerun (SPEC §2): the new run's id on
// stdout, then with --wait its steps on stderr and its outcome as the exit
// code, as runSubmit.
func runRerun(ctx context.Context, e *env, args []string) error {
	return startedRun(ctx, e, func(ctx context.Context, c *client.Client) (string, error) {
		return c.Rerun(ctx, args[0], e.opts.failedOnly)
	})
}

func runCancel(ctx context.Context, e *env, args []string) error {
	return withClient(ctx, e, func(ctx context.Context, c *client.Client) error {
		if err := c.Cancel(ctx, args[0], e.opts.reason); err != nil {
			return err
		}
		out := client.Submitted{Run: args[0]}
		if ok, err := e.printStructured(out); ok {
			return err
		}
		fmt.Fprintf(e.stdout, "run %s cancelling\n", cell(out.Run))
		return nil
	})
}

func runLogs(ctx context.Context, e *env, args []string) error {
	if e.opts.follow {
		return followLogs(ctx, e, args[0])
	}
	return withClient(ctx, e, func(ctx context.Context, c *client.Client) error {
		out, err := c.Logs(ctx, args[0], e.opts.step)
		if err != nil {
			return err
		}
		if ok, err := e.printStructured(out); ok {
			return err
		}
		for _, l := range out.Lines {
			text := l.Text
			if l.Event {
				text = "(event) " + text
			}
			printLogLine(e.stdout, l.At, l.Step, text)
		}
		return nil
	})
}

// printLogLine prints one line of a step's log: the step's own bytes as it
// wrote them (colours included); the step id is a name and is escaped.
func printLogLine(w io.Writer, at time.Time, step, text string) {
	fmt.Fprintf(w, "%s %s | %s\n", at.Local().Format("15:04:05.000"), cell(step), text)
}

func stepGate(ctx context.Context, e *env, step string, approve bool) error {
	action := "reject"
	if approve {
		action = "approve"
	}
	return withClient(ctx, e, func(ctx context.Context, c *client.Client) error {
		gate := c.Reject
		if approve {
			gate = c.Approve
		}
		out, err := gate(ctx, step)
		if err != nil {
			return err
		}
		if ok, err := e.printStructured(out); ok {
			return err
		}
		fmt.Fprintf(e.stdout, "step %s %sd: now %s\n", cell(out.Step), action, cell(out.State))
		return nil
	})
}

func workerList(ctx context.Context, e *env, _ []string) error {
	return withClient(ctx, e, func(ctx context.Context, c *client.Client) error {
		out, err := c.Workers(ctx)
		if err != nil {
			return err
		}
		if ok, err := e.printStructured(out); ok {
			return err
		}
		return printWorkers(e.stdout, out.Workers)
	})
}

// printWorkers is `worker list`'s table: AHEAD is the leases each worker
// may hold ahead beyond its slots (SPEC §3), so LEASES may exceed SLOTS.
func printWorkers(out io.Writer, ws []client.Worker) error {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tID\tSTATE\tTAGS\tSLOTS\tAHEAD\tLEASES\tLAST HEARTBEAT")
	for _, w := range ws {
		tags := make([]string, len(w.Tags))
		for i, t := range w.Tags {
			tags[i] = cell(t)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\n", cell(w.Name), cell(w.ID), cell(w.State), orDash(strings.Join(tags, ",")), w.Slots, w.Ahead, w.Leases, fmtTime(w.LastHeartbeat))
	}
	return tw.Flush()
}

// ---- formatting ----

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Local().Format("2006-01-02 15:04:05")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 200 {
		s = strings.ToValidUTF8(s[:200], "") + "…"
	}
	return s
}

func bundlePut(ctx context.Context, e *env, args []string) error {
	body, err := os.ReadFile(args[0])
	if err != nil {
		return fmt.Errorf("read bundle: %w", err)
	}
	return withClient(ctx, e, func(ctx context.Context, c *client.Client) error {
		out, err := c.PutBundle(ctx, bytes.NewReader(body))
		if err != nil {
			return err
		}
		if ok, err := e.printStructured(out); ok {
			return err
		}
		fmt.Fprintln(e.stdout, out.Fingerprint)
		kind := "opaque (not an uncompressed tar: no per-file access)"
		if out.Tar {
			kind = fmt.Sprintf("tar with %d files", out.Files)
		}
		state := "stored"
		if out.Existed {
			state = "already stored"
		}
		fmt.Fprintf(e.stderr, "Bundle %s: %d bytes, %s, %s.\n", args[0], out.Size, kind, state)
		return nil
	})
}

func dataGet(ctx context.Context, e *env, args []string) error {
	if len(args) < 1 || len(args) > 2 {
		return usageErrorf("want ID [VERSION], got %q", args)
	}
	version := "latest"
	if len(args) == 2 {
		version = args[1]
	}
	return withClient(ctx, e, func(ctx context.Context, c *client.Client) error {
		resp, err := c.Data(ctx, args[0], version)
		if err != nil {
			return err
		}
		defer resp.Close()
		w := e.stdout
		if e.opts.out != "" {
			f, err := os.Create(e.opts.out)
			if err != nil {
				return err
			}
			defer f.Close()
			w = f
		}
		n, err := io.Copy(w, resp)
		if err == nil && resp.Size >= 0 && n != resp.Size {
			err = fmt.Errorf("the answer was cut short: %d of %d bytes", n, resp.Size)
		}
		if err != nil {
			return fmt.Errorf("reading %s: %w", args[0], err)
		}
		if e.opts.out != "" {
			fmt.Fprintf(e.stderr, "%s version %s: %d bytes written to %s\n", args[0], resp.Version, n, e.opts.out)
		}
		return nil
	})
}

func dataVersions(ctx context.Context, e *env, args []string) error {
	return withClient(ctx, e, func(ctx context.Context, c *client.Client) error {
		out, err := c.DataVersions(ctx, args[0])
		if err != nil {
			return err
		}
		if ok, err := e.printStructured(out); ok {
			return err
		}
		tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "VERSION\tSIZE\tSHA256\tCREATED\tWORKER\tLEASE")
		for _, v := range out.Versions {
			sum := cell(v.SHA256)
			if v.Deleted {
				sum = "(deleted)" // a tombstone (SPEC §14)
			}
			fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%d\n", v.Version, v.Size, sum, fmtTime(v.Created), cell(orDash(v.Worker)), v.Lease)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if out.Stream != nil {
			fmt.Fprintf(e.stdout, "append stream: %d bytes in %d appends, last %s\n", out.Stream.Length, out.Stream.Appends, fmtTime(out.Stream.Updated))
		}
		return nil
	})
}
