// Command orchestrator runs Tether's orchestrator (serve) and talks to a
// running one over its operator HTTP API (token, run, step and worker
// commands). Run `orchestrator --help` for the commands and exit codes.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
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
	url, adminToken, dataDir, ca string
	json                         bool
	timeout                      time.Duration

	// serve
	addr, config, tlsCert, tlsKey string
	maxSubmitBody                 int64
	retain                        string
	pprof                         string
	metricsToken                  string
	// serve: control-plane admission (SPEC §12)
	maxConns, maxUnauthConns, maxUnauthConnsPerAddr int
	helloTimeout                                    time.Duration
	data                                            dataLimits // the data plane's --data-* flags
	http                                            httpLimits // the HTTP server's --*-timeout and connection flags

	// command-specific
	ttl    time.Duration
	step   string
	reason string
	out    string
	// store backup
	offline bool
	// run list
	limit               int
	status, name, since string
}

// env is what a command runs with.
type env struct {
	stdout, stderr io.Writer
	getenv         func(string) string
	opts           *options
	flags          *flag.FlagSet
}

// command is one leaf command.
type command struct {
	path    string // "run logs"
	args    string // positional arguments, for the usage line: "RUN"
	nargs   int
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
}

const topHelp = `orchestrator — Tether's orchestrator, and the operator's client for it.

The orchestrator owns all durable state of Tether (runs, steps, leases, the
worker pool, enrollment tokens, the data steps write) in one bbolt file,
hands steps to workers that dial its WebSocket control plane at /control,
serves their HTTP/2 data plane at /data/ and /bundle/, and serves an operator
HTTP JSON API under /api/ on the same address, authenticated with an admin
token. TLS is on with serve --tls-cert and --tls-key.

Usage:
  orchestrator COMMAND [ARGS] [flags]
  orchestrator COMMAND --help

Commands:
%s
Getting started:
  orchestrator serve --data-dir ./tether-data          # prints the admin token once
  orchestrator token create builder-1 --ttl 1h         # prints NAME.SECRET, once
  worker connect --url ws://127.0.0.1:7420/control --token builder-1.SECRET
  orchestrator run submit examples/dag.yaml            # prints the run id
  orchestrator run show run-1
  orchestrator run logs run-1

Client commands find the orchestrator with --url (default
http://127.0.0.1:7420) and the admin token with --admin-token, else
$TETHER_ADMIN_TOKEN, else the file <--data-dir>/admin-token.

` + exitCodesHelp + "\n"

func commandList() string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	for _, c := range commands {
		fmt.Fprintf(tw, "  %s %s\t%s\n", c.path, c.args, c.short)
	}
	tw.Flush()
	return b.String()
}

// run runs the command line and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	if len(args) == 0 {
		fmt.Fprintf(stderr, topHelp, commandList())
		return exitUsage
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "-help" || args[0] == "help" {
		if len(args) > 1 && args[0] == "help" {
			return run(ctx, append(args[1:], "--help"), stdout, stderr, getenv)
		}
		fmt.Fprintf(stdout, topHelp, commandList())
		return exitOK
	}
	cmd, rest := findCommand(args)
	if cmd == nil {
		return groupHelp(args, stdout, stderr)
	}
	o := &options{}
	fs := flag.NewFlagSet("orchestrator "+cmd.path, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.logFormat, "log-format", "text", "log `format` on stderr: text or json")
	fs.StringVar(&o.logLevel, "log-level", "info", "log `level`: debug, info, warn or error")
	cmd.flags(fs, o)
	pos, err := parseInterspersed(fs, rest)
	if errors.Is(err, flag.ErrHelp) {
		printHelp(stdout, cmd, fs)
		return exitOK
	}
	if err == nil && cmd.nargs >= 0 && len(pos) != cmd.nargs {
		err = fmt.Errorf("want %d argument%s (%s), got %d: %q", cmd.nargs, plural(cmd.nargs), strings.TrimSpace(cmd.args), len(pos), pos)
		if cmd.nargs == 0 {
			err = fmt.Errorf("takes no arguments, got %q", pos)
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "orchestrator %s: %v\nUsage: orchestrator %s %s[flags]   (orchestrator %s --help for more)\n",
			cmd.path, err, cmd.path, withSpace(cmd.args), cmd.path)
		return exitUsage
	}
	e := &env{stdout: stdout, stderr: stderr, getenv: getenv, opts: o, flags: fs}
	if err := cmd.run(ctx, e, pos); err != nil {
		fmt.Fprintf(stderr, "orchestrator %s: %v\n", cmd.path, err)
		return exitCode(err)
	}
	return exitOK
}

// boolFlags are the flags that take no value; findCommand must know them to
// tell "--json run" from "--url URL".
var boolFlags = map[string]bool{"json": true, "h": true, "help": true, "offline": true}

// findCommand finds the longest command whose words are the first words of
// the arguments that are not flags (flags may come first: "orchestrator
// --url U run list"); rest is the arguments without those words.
func findCommand(args []string) (*command, []string) {
	idx := wordPositions(args)
	var best *command
	for _, c := range commands {
		words := strings.Fields(c.path)
		if len(words) > len(idx) || (best != nil && len(words) <= len(strings.Fields(best.path))) {
			continue
		}
		match := true
		for j, w := range words {
			if args[idx[j]] != w {
				match = false
			}
		}
		if match {
			best = c
		}
	}
	if best == nil {
		return nil, nil
	}
	drop := map[int]bool{}
	for _, i := range idx[:len(strings.Fields(best.path))] {
		drop[i] = true
	}
	var rest []string
	for i, a := range args {
		if !drop[i] {
			rest = append(rest, a)
		}
	}
	return best, rest
}

// wordPositions returns the positions of the arguments that are neither flags
// nor flag values.
func wordPositions(args []string) []int {
	var idx []int
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			break
		}
		if strings.HasPrefix(a, "-") && len(a) > 1 {
			name := strings.TrimLeft(a, "-")
			if !strings.Contains(name, "=") && !boolFlags[name] {
				i++ // its value
			}
			continue
		}
		idx = append(idx, i)
	}
	return idx
}

// groupHelp answers "orchestrator token" or an unknown command.
func groupHelp(all []string, stdout, stderr io.Writer) int {
	var args []string
	for _, i := range wordPositions(all) {
		args = append(args, all[i])
	}
	help := false
	for _, a := range all {
		if a == "--help" || a == "-h" || a == "-help" {
			help = true
		}
	}
	if len(args) == 0 {
		fmt.Fprintf(stderr, "orchestrator: no command given. Commands:\n%s\nRun 'orchestrator --help' for more.\n", commandList())
		return exitUsage
	}
	var subs []*command
	for _, c := range commands {
		if strings.HasPrefix(c.path, args[0]+" ") {
			subs = append(subs, c)
		}
	}
	if len(subs) == 0 {
		fmt.Fprintf(stderr, "orchestrator: unknown command %q. Commands:\n%s\nRun 'orchestrator --help' for more.\n", strings.Join(args, " "), commandList())
		return exitUsage
	}
	w, code := stderr, exitUsage
	if help && len(args) == 1 {
		w, code = stdout, exitOK
	} else if len(args) > 1 {
		fmt.Fprintf(stderr, "orchestrator %s: unknown command %q\n\n", args[0], args[1])
	}
	fmt.Fprintf(w, "Usage: orchestrator %s COMMAND [ARGS] [flags]\n\nCommands:\n", args[0])
	sort.Slice(subs, func(i, j int) bool { return subs[i].path < subs[j].path })
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, c := range subs {
		fmt.Fprintf(tw, "  %s %s\t%s\n", c.path, c.args, c.short)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nRun 'orchestrator %s COMMAND --help' for details.\n", args[0])
	return code
}

func printHelp(w io.Writer, c *command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "Usage: orchestrator %s %s[flags]\n\n%s\n", c.path, withSpace(c.args), strings.TrimSpace(c.long))
	if c.example != "" {
		fmt.Fprintf(w, "\nExample:\n%s\n", strings.TrimRight(c.example, "\n"))
	}
	fmt.Fprintf(w, "\nFlags:\n")
	printFlags(w, fs)
	fmt.Fprintf(w, "\n%s\n", exitCodesHelp)
}

func equalWords(a, b []string) bool {
	for i := range b {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

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
