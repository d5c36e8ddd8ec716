// Command orchestrator runs Tether's orchestrator (serve) and talks to a
// running one over its operator HTTP API (token, run, step and worker
// commands). Run `orchestrator --help` for the commands and exit codes.
package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	flag "github.com/spf13/pflag"
)

func main() {
	// SIGHUP is ignored: serve has no configuration to reload, and a closed
	// terminal must not stop it. SIGINT and SIGTERM shut down cleanly.
	signal.Ignore(syscall.SIGHUP)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// options holds every flag value; each command registers the ones it takes.
type options struct {
	logFormat, logLevel string

	// client commands
	urls                    []string // --url, repeatable: one highly available group (SPEC §11)
	adminToken, dataDir, ca string
	output                  string // -o: table, json or yaml
	json                    bool   // --json: -o json
	timeout                 time.Duration

	// serve
	addr, config, tlsCert, tlsKey string
	maxSubmitBody                 int64
	retain                        string
	pprof                         string
	metricsToken                  string
	heapFloor                     int64 // serve --heap-floor (SPEC §12)
	// serve: control-plane admission (SPEC §12)
	maxConns, maxUnauthConns, maxUnauthConnsPerAddr int
	maxEventStreams                                 int // serve --max-event-streams
	helloTimeout                                    time.Duration
	data                                            dataLimits // the data plane's --data-* flags
	http                                            httpLimits // the HTTP server's --*-timeout and connection flags

	shipEnv []string // serve --ship-env (SPEC §8)

	// command-specific
	ttl time.Duration
	// intoSecret: token create --into-secret (SPEC §14a).
	intoSecret string
	step       string
	parent     string // run submit --parent
	reason     string
	out        string
	// run rerun
	failedOnly bool
	// schedule create: per invocation, never package variables (a test
	// runs several commands at once)
	sched struct{ cron, tz, catchUp string }
	// store backup
	offline bool
	// run list
	limit               int
	status, name, since string
	// run show, logs, submit
	exitStatus, follow, wait bool
	// operator-token create, audit
	readOnly      bool
	actor, action string
	// secret put; serve --secrets-key-file (SPEC §14a)
	fromFile, secretsKeyFile string
	// serve --store, --admin-token-file, --advertise, --leader-lease (SPEC §11)
	store, adminTokenFile, advertise string
	leaderLease                      time.Duration
}

// env is what a command runs with.
type env struct {
	stdout, stderr io.Writer
	getenv         func(string) string
	opts           *options
	flags          *flag.FlagSet // the command's flags (pflag: Changed tells a flag given)
	root           *cobra.Command
}

// command is one leaf command; the cobra command tree is built from the
// table (cli.go).
type command struct {
	path    string // "run logs"
	args    string // positional arguments, for the usage line: "RUN"
	nargs   int    // -1: the command checks its arguments itself
	short   string
	long    string
	example string
	flags   func(fs *flag.FlagSet, o *options)
	run     func(ctx context.Context, e *env, args []string) error
}

var commands []*command

func init() {
	commands = []*command{serveCmd}
	commands = append(commands, clientCommands()...)
	commands = append(commands, storeCommands()...)
	commands = append(commands, operatorCommands()...)
	commands = append(commands, secretCommands()...)
	commands = append(commands, scheduleCommands()...)
	commands = append(commands, versionCmd, completionCmd)
}

const topHelp = `orchestrator — Tether's orchestrator, and the operator's client for it.

The orchestrator owns all durable state of Tether (runs, steps, leases, the
worker pool, enrollment tokens, the data steps write) in its store — one
bbolt file, or a PostgreSQL database it shares with standbys (serve --help) —
hands steps to workers that dial its WebSocket control plane at /control,
serves their HTTP/2 data plane at /data/ and /bundle/, and serves an operator
HTTP JSON API under /api/ on the same address, authenticated with an admin
token. TLS is on with serve --tls-cert and --tls-key.

Usage:
  orchestrator COMMAND [ARGS] [flags]
  orchestrator COMMAND --help

Commands:
%s
Getting started (dag.yaml: see 'orchestrator run submit --help'):
  orchestrator serve --data-dir ./tether-data          # prints the admin token once
  orchestrator token create builder-1 --ttl 1h         # prints NAME.SECRET, once
  TETHER_WORKER_TOKEN=builder-1.SECRET worker connect --url ws://127.0.0.1:7420/control
  orchestrator run submit dag.yaml --wait              # follows it; exit code = its outcome
  orchestrator run show run-1
  orchestrator run logs run-1 --follow

Client commands find the orchestrator with --url, else $TETHER_URL, else
http://127.0.0.1:7420, and the admin token with --admin-token, else
$TETHER_ADMIN_TOKEN, else the file <--data-dir>/admin-token. Read commands
print a table, or the API's answer with -o json or -o yaml.

` + exitCodesHelp + "\n"

func withSpace(s string) string {
	if s == "" {
		return ""
	}
	return s + " "
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
