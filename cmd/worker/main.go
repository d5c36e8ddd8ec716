// Command worker runs a Tether worker: it enrolls with the orchestrator with a
// one-time token, dials home over the WebSocket control plane, and runs the
// steps it is given as `sh -c` processes. Run `worker --help` for details.
package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tether-run/tether/adapters/logging"
	"github.com/tether-run/tether/adapters/tlsconf"
	"github.com/tether-run/tether/adapters/worker"
	"github.com/tether-run/tether/core"
)

// Exit codes of the worker binary. 2 and 3 are the core's
// (core.WorkerExitDisconnected, core.WorkerExitRefused); usage errors
// therefore use 64 (EX_USAGE), so that 2 keeps one meaning for a supervisor.
const (
	exitOK           = 0
	exitError        = 1
	exitDisconnected = core.WorkerExitDisconnected // 2
	exitRefused      = core.WorkerExitRefused      // 3
	exitStateLocked  = 4                           // another process holds the state directory
	exitUsage        = 64
)

const (
	defaultURL        = "ws://127.0.0.1:7420/control"
	defaultConfigFile = "worker-config.yaml"
	maxConfigSize     = 1 << 20

	// The range of --max-reconnect-delay.
	defaultMaxReconnectDelay = 60 * time.Second
	minMaxReconnectDelay     = 100 * time.Millisecond
	maxMaxReconnectDelay     = time.Hour

	// The range of --output-cap (SPEC §10): what one step's output may
	// store; beyond it lines are dropped and counted in one gap marker.
	defaultOutputCapBytes = 64 << 20
	minOutputCapBytes     = 1 << 10
	maxOutputCapBytes     = 1 << 40
	// The range of --drain-timeout.
	defaultDrainTimeout = 10 * time.Minute
	minDrainTimeout     = time.Millisecond
	maxDrainTimeout     = 24 * time.Hour
)

const exitCodesHelp = `Exit codes:
  0   drained after SIGINT or SIGTERM: every step finished (or, after a
      second signal or --drain-timeout, was stopped) and was reported
  1   error (cannot start)
  2   disconnected from the orchestrator under --no-reconnect (or never
      connected); core.WorkerExitDisconnected
  3   refused by the orchestrator for good: unknown, replayed (already used),
      expired or revoked token, expired credential, protocol version;
      core.WorkerExitRefused. Also: the saved identity was refused and no
      --token was given to enroll a new one
  4   the state directory is locked by another worker process: two
      processes never share one identity
  64  usage (bad flags, arguments or config file). Not 2: 2 is taken by the
      worker protocol above.`

const topHelp = `worker — a Tether worker.

A worker dials the orchestrator's control plane, enrolls once with a one-time
enrollment token, and runs the steps the orchestrator leases to it as
'sh -c' processes, streaming their output back. Each step process can use the
orchestrator's data plane through the worker: $TETHER_DATA_URL (a loopback
URL), with "Authorization: Bearer $TETHER_DATA_TOKEN"; the worker attaches the
step's lease ($TETHER_LEASE) to its writes. If the connection drops it
keeps its steps running, buffers their output, and reconnects with backoff
(1 s, x1.5, up to --max-reconnect-delay, 60 s by default; the orchestrator
holds its steps for twice that); --no-reconnect exits instead. A restarted
worker process is the same worker: its identity (instance id and session
credential) is kept in --state-dir.

Usage:
  worker connect [flags]
  worker connect --help
  worker step COMMAND [ARGS]     (inside a step; see worker step --help)

Commands:
  connect   enroll with a token and run steps until stopped
  step      a step's capability verbs: data put|get|append|rm|versions|query,
            output, definition, secret get|put, token create, pool

Example:
  orchestrator token create builder-1 --ttl 1h     # on the orchestrator host
  export TETHER_WORKER_TOKEN=builder-1.SECRET     # on the worker host
  worker connect --url ws://orch.internal:7420/control \
      --tags script,docker --labels zone=eu --slots 4

` + exitCodesHelp + "\n"

const connectHelp = `Usage: worker connect [flags]

Enroll with the orchestrator with a one-time token and run leased steps until
drained (exit 0), until refused for good (exit 3), or, with --no-reconnect,
until the connection is lost (exit 2).

The first SIGINT or SIGTERM drains the worker: it takes no new work (the
orchestrator dispatches nothing more to it), lets its running steps finish
and reports them, then exits 0. A second signal, or --drain-timeout after the
first, stops the steps still running (SIGTERM to each step's process group,
SIGKILL 10 s later) and reports them stopped: the orchestrator re-dispatches a
stopped no-write step and fails a write-bearing one (class worker-stopped).
SIGHUP is ignored. On Linux a step's whole process tree dies with the worker,
even when the worker is killed with SIGKILL.

The token (NAME.SECRET from 'orchestrator token create NAME') enrolls this
worker once; the worker is named NAME unless --name says otherwise. Give it
in $TETHER_WORKER_TOKEN or with --token-file FILE: --token works too, but
other users of the host can read a command line (ps), so the worker warns.
The flags override the variable, which overrides the config file.

Identity across restarts: the worker keeps its instance id and session
credential in --state-dir (file worker.json, mode 0600, next to worker.lock),
by default $STATE_DIRECTORY (systemd's StateDirectory=), else
$XDG_STATE_HOME/tether, else ~/.local/state/tether. A process restarted with
the same directory (after a crash, kill -9 or 'systemctl restart') reconnects
as the same worker without a token, as long as the credential is valid (15
minutes from its last refresh; a connected worker refreshes every 5); the
steps the old process was running are reported lost and handled as after a
disconnect (never started: requeued; no-write: re-run; write-bearing:
failed). The
name, tags, labels, platform and slots are those it enrolled with; --ahead
is the restarted process's own. Only one
process may use a directory at a time: a second one exits 4. If the saved
credential is refused (expired, or its token revoked: 'orchestrator token
revoke NAME' is how a copied state file is disabled), the worker says so
and, when an enrollment token is given too ($TETHER_WORKER_TOKEN,
--token-file, --token or the config file), enrolls a new instance with it
(and saves that); without one it exits 3. The token itself stays single-use. To
start afresh, remove worker.json. Under systemd: StateDirectory=tether-worker,
StateDirectoryMode=0700, Restart=always, RestartPreventExitStatus=3 4.

Lease-ahead: with --ahead N (0..64, whatever --slots; default 0) the worker
also holds up to N granted steps it has not started yet, beyond its slots,
so the next step is already here when a slot frees: short steps run back to
back without a round trip to the orchestrator between them. A held step
waits behind this worker's running one even if another worker frees up
first, so it suits short steps, not long ones. A held step is a step never
started: if this worker drains, goes silent or is lost, it goes back to the
queue and runs elsewhere.

With --single-use the worker is scaler-managed: it runs one step, then
exits 0 (2 if its connection is lost first); it keeps no saved identity, so
it needs a token each time and many may run side by side on one host.

Steps are matched to workers by target (--name), labels, platform and tags:
a step runs here only if every tag it requires is in --tags (type script needs
"script", runner docker needs "docker", and so on, plus the step's own tags:).

Highly available orchestrators (SPEC §11): give --url once for each
orchestrator of the group (or one host name that resolves to each of
them). Each connection attempt dials them in turn, starting with the one
last connected to: a standby refuses with 503 and names the leader (header
Tether-Leader), which is dialed next; any other failure moves on to the next
URL; only when all failed does the backoff above apply. The data plane
(the worker's and its steps') follows the same leader; a write refused by a
deposed leader is sent again, with its request id, to the new one.

Against an orchestrator that serves TLS, use a wss:// URL; --ca names the PEM
file of the CA that signed its certificate when it is not a public one.

Step processes get TETHER_DATA_URL, TETHER_DATA_TOKEN and TETHER_LEASE: e.g.
  worker step data put build.out out.tar
(or curl -X PUT --data-binary @out.tar -H "Authorization: Bearer
$TETHER_DATA_TOKEN" "$TETHER_DATA_URL/data/build.out") stores a new version
of build.out under the step's lease; 'worker step --help' lists the verbs.

Each step runs in a fresh directory under --work-dir, $TETHER_SCRATCH (its
cwd), removed when it ends unless --keep-scratch. Files it leaves in
$TETHER_OUTPUT_DIR are uploaded as data (id = file name) before it reports;
a symbolic link, a subdirectory, a name that is no data id, more than 256
files or 1 GiB, or a failed upload fails the step. From this process's
environment a step inherits only PATH HOME USER LOGNAME SHELL LANG LANGUAGE
LC_* TZ TMPDIR and what --pass-env names (never TETHER_*); the workflow's
env: is laid over that. Data versions steps read are cached here, checked
by SHA-256, up to --cache-size.

The optional config file (YAML) takes the same settings; flags given on the
command line override it, and an unknown key is an error naming its line:

  url: ws://127.0.0.1:7420/control    # or a list: [ws://a:7420, ws://b:7420]
  ca: /etc/tether/ca.pem
  token: builder-1.0123abcd...
  name: builder-1
  tags: [script, docker]
  labels: {zone: eu, disk: ssd}
  platform: linux/amd64
  slots: 4
  ahead: 0                            # steps held beyond the slots, 0..64
  no_reconnect: false
  single_use: false
  max_reconnect_delay: 60s
  output_cap: 64MiB
  drain_timeout: 10m
  state_dir: /var/lib/tether-worker
  work_dir: /var/lib/tether-worker/work
  keep_scratch: false
  cache_size: 256MiB
  pass_env: [GOPATH, "GIT_*"]

Example:
  TETHER_WORKER_TOKEN=builder-1.SECRET worker connect --url ws://127.0.0.1:7420/control --tags script --slots 2
  worker connect --url ws://127.0.0.1:7420/control --token-file /run/secrets/tether-token
  worker connect --config /etc/tether/worker-config.yaml --log-format json

Flags:
`

func main() {
	if len(os.Args) > 1 && os.Args[1] == worker.ShimArg {
		// A step's shim (§10), re-executed by this binary: not a command.
		os.Exit(worker.ShimMain(os.Args[2:]))
	}
	// SIGINT and SIGTERM drain (§10); SIGHUP is ignored: a worker has no
	// configuration to reload, and a closed terminal must not stop its steps.
	ignoreHangups()
	stops := make(chan os.Signal, 2)
	signal.Notify(stops, os.Interrupt, syscall.SIGTERM)
	stop, err := cpuProfile(os.Getenv(cpuProfileEnv))
	if err != nil {
		fmt.Fprintf(os.Stderr, "worker: $%s: %v\n", cpuProfileEnv, err)
		os.Exit(exitError)
	}
	code := runWith(context.Background(), stops, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// ignoreHangups makes the worker ignore SIGHUP (SPEC §10) by catching it
// and dropping it, not with signal.Ignore: an ignored signal stays ignored
// across exec, so every step would start with SIGHUP ignored, while a
// caught one is back at its default in a child.
func ignoreHangups() {
	hups := make(chan os.Signal, 1)
	signal.Notify(hups, syscall.SIGHUP)
	go func() {
		for range hups {
		}
	}()
}

// cpuProfileEnv names a file for the process's CPU profile, written from
// start to exit (Go's runtime/pprof format): how the end-to-end benchmark
// profiles its worker processes (PERFORMANCE.md beside it).
const cpuProfileEnv = "TETHER_WORKER_CPUPROFILE"

// cpuProfile starts a CPU profile into path (none when path is empty); stop
// ends it and closes the file.
func cpuProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// settings are the worker's settings: defaults, then the config file, then flags.
type settings struct {
	// URLs are the orchestrators' control planes, the first dialed first
	// (SPEC §11: a group of a leader and standbys).
	URLs     []string
	Token    string
	Name     string
	Tags     []string
	Labels   map[string]string
	Platform string
	Slots    int
	// Ahead: steps held granted, not started, beyond the slots (SPEC §3
	// lease-ahead): 0..64, whatever the slots.
	Ahead       int
	NoReconnect bool
	// SingleUse: one step, then exit (scaler-managed, SPEC §10); no state
	// directory is used, as the instance is never restarted.
	SingleUse bool
	// MaxReconnectDelay caps the reconnect backoff; the orchestrator's
	// grace window for this worker is twice it. Zero: the default (60 s).
	MaxReconnectDelay time.Duration
	CA                string // PEM file of CAs to trust for wss:// and https://
	// OutputCapBytes caps what one step's output may store (SPEC §10).
	// Zero: the default (64 MiB).
	OutputCapBytes int64
	Noop           bool // --executor noop: a benchmarking aid
	// DrainTimeout: how long a drain lets running steps finish before it
	// stops them. Zero: the default (10 m).
	DrainTimeout time.Duration
	// StateDir keeps the worker's identity across restarts (SPEC §9);
	// empty: worker.DefaultStateDir.
	StateDir string
	// TokenOnArgv: the token came from --token, which ps shows to every
	// user of the host (a warning is logged).
	TokenOnArgv bool
	// WorkDir holds each step's scratch and output directories (SPEC §10);
	// empty: work/ in the state directory.
	WorkDir     string
	KeepScratch bool     // keep each step's directories after it ends
	CacheBytes  int64    // the read cache's bound; zero: the default; -1: off
	PassEnv     []string // more variables of the worker's environment a step inherits
}

// Where else the enrollment token may come from than --token (SPEC §9).
const (
	workerTokenEnv  = "TETHER_WORKER_TOKEN"
	maxTokenFile    = 4 << 10
	tokenOnArgvWarn = "the enrollment token was given with --token: other users of this host can read it in the process list (ps); prefer $" + workerTokenEnv + " or --token-file"
)

// getenv reads the environment (a variable for a test).
var getenv = os.Getenv

// stdin is what worker step reads (a variable for a test).
var stdin io.Reader = os.Stdin

// run runs the worker until it exits; ctx ending stops it at once (its
// step processes are killed).
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runWith(ctx, nil, args, stdout, stderr)
}

// runWith is run where each value on stops asks the worker to drain (the
// first) or to stop its steps (the next).
func runWith(ctx context.Context, stops <-chan os.Signal, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, topHelp)
		return exitUsage
	}
	switch args[0] {
	case "-h", "--help", "-help", "help":
		if len(args) > 1 && args[0] == "help" && args[1] == "connect" {
			return runWith(ctx, stops, []string{"connect", "--help"}, stdout, stderr)
		}
		fmt.Fprint(stdout, topHelp)
		return exitOK
	case "connect":
	case "step":
		return runStep(ctx, args[1:], stdin, stdout, stderr)
	default:
		fmt.Fprintf(stderr, "worker: unknown command %q\n\n%s", args[0], topHelp)
		return exitUsage
	}
	final, logFormat, logLevel, err := parseConnect(args[1:], stdout)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		return usage(stderr, err)
	}
	log, err := logging.New(stderr, logFormat, logLevel)
	if err != nil {
		return usage(stderr, err)
	}
	if final.TokenOnArgv {
		log.Warn(tokenOnArgvWarn)
	}
	return connect(ctx, stops, final, log)
}

// parseConnect resolves connect's settings: defaults, then the config file,
// then the flags given. Help is printed to stdout (and flag.ErrHelp returned).
func parseConnect(args []string, stdout io.Writer) (final settings, logFormat, logLevel string, err error) {
	flags := flag.NewFlagSet("worker connect", flag.ContinueOnError)
	flags.SetOutput(io.Discard)
	var (
		s            settings
		tags, labels string
		config       string
		executor     string
		outputCap    string
	)
	flags.Var((*urlList)(&s.URLs), "url", "orchestrator control plane `URL` (ws:// or wss://; http(s):// and a bare host:port work too); repeat it for each orchestrator of a highly available group (default "+defaultURL+")")
	flags.StringVar(&s.Token, "token", "", "enrollment `token` NAME.SECRET (required unless --state-dir holds a saved identity); ps shows it: prefer $"+workerTokenEnv+" or --token-file")
	var tokenFile string
	flags.StringVar(&tokenFile, "token-file", "", "read the enrollment token from this `file`")
	flags.StringVar(&s.Name, "name", "", "worker `name` (default: the token's NAME)")
	flags.StringVar(&tags, "tags", "", "comma-separated capability `tags`, e.g. script,docker")
	flags.StringVar(&labels, "labels", "", "comma-separated `key=value` labels, e.g. zone=eu,disk=ssd")
	flags.StringVar(&s.Platform, "platform", "", "`platform` for steps that declare one, e.g. linux/amd64")
	flags.IntVar(&s.Slots, "slots", 1, "steps run at once (`N`, 1..1024)")
	flags.IntVar(&s.Ahead, "ahead", 0, "steps held beyond the slots, granted but not started, so the next starts when a slot frees (`N`, 0..64; suits short steps)")
	flags.StringVar(&s.CA, "ca", "", "trust the orchestrator's TLS certificate if this CA `file` (PEM) signed it")
	flags.BoolVar(&s.SingleUse, "single-use", false, "scaler-managed: run one step, then exit 0 (no reconnect, no grace; slots 1; no saved identity, so --state-dir is not used)")
	flags.BoolVar(&s.NoReconnect, "no-reconnect", false, "exit (code 2) when the connection is lost instead of reconnecting; no grace window")
	flags.DurationVar(&s.MaxReconnectDelay, "max-reconnect-delay", defaultMaxReconnectDelay,
		"longest `duration` to wait between reconnect attempts (100ms..1h); the orchestrator holds this worker's steps for twice this after a disconnect")
	flags.StringVar(&outputCap, "output-cap", "64MiB",
		"most output one step may store, a `size` in bytes or with KiB, MiB or GiB (1KiB..1TiB); the rest is dropped and counted in one gap marker")
	flags.DurationVar(&s.DrainTimeout, "drain-timeout", defaultDrainTimeout,
		"after SIGINT/SIGTERM, how long (`duration`, 1ms..24h) running steps may take to finish before they are stopped")
	flags.StringVar(&executor, "executor", "sh", "how steps run, by `name`: sh (sh -c COMMAND) or noop (no process; every step exits 0 at once: a benchmarking aid)")
	flags.StringVar(&config, "config", defaultConfigFile, "worker config `file` (YAML); optional unless given explicitly")
	flags.StringVar(&logFormat, "log-format", "text", "log `format` on stderr: text or json")
	flags.StringVar(&logLevel, "log-level", "info", "log `level`: debug, info, warn or error")
	flags.StringVar(&s.WorkDir, "work-dir", "", "`directory` of each step's scratch (its cwd, $TETHER_SCRATCH) and output ($TETHER_OUTPUT_DIR) directories (default: work/ in the state directory)")
	flags.BoolVar(&s.KeepScratch, "keep-scratch", false, "keep each step's directories after it ends (a debugging aid: nothing removes them)")
	var cacheSize string
	flags.StringVar(&cacheSize, "cache-size", "256MiB", "bound of the read cache of data versions steps read, a `size` (KiB, MiB, GiB; 0: no cache)")
	var passEnv string
	flags.StringVar(&passEnv, "pass-env", "", "comma-separated glob `patterns` of more variables of the worker's environment its steps inherit (default: only PATH HOME USER LOGNAME SHELL LANG LANGUAGE LC_* TZ TMPDIR)")
	flags.StringVar(&s.StateDir, "state-dir", "", "`directory` that keeps the worker's identity across restarts (default $STATE_DIRECTORY, else $XDG_STATE_HOME/tether, else ~/.local/state/tether)")
	err = flags.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, connectHelp)
		printFlags(stdout, flags)
		fmt.Fprintf(stdout, "\n%s\n", exitCodesHelp)
		return settings{}, "", "", err
	}
	if err == nil && flags.NArg() > 0 {
		err = fmt.Errorf("takes no arguments, got %q", flags.Args())
	}
	if err != nil {
		return settings{}, "", "", err
	}
	set := map[string]bool{}
	flags.Visit(func(f *flag.Flag) { set[f.Name] = true })

	// Config file, then the flags given.
	final = settings{URLs: []string{defaultURL}, Slots: 1}
	src, rerr := os.ReadFile(config)
	switch {
	case rerr == nil:
		if final, err = loadConfig(config, src); err != nil {
			return settings{}, "", "", fmt.Errorf("bad config file:\n  %v", err)
		}
	case errors.Is(rerr, fs.ErrNotExist) && !set["config"]:
	default:
		return settings{}, "", "", fmt.Errorf("config file: %v", rerr)
	}
	if set["url"] {
		final.URLs = s.URLs
	}
	if v := getenv(workerTokenEnv); v != "" {
		final.Token = strings.TrimSpace(v)
	}
	switch {
	case set["token"] && set["token-file"]:
		return settings{}, "", "", errors.New("--token and --token-file: give one of them")
	case set["token"]:
		final.Token, final.TokenOnArgv = s.Token, true
	case set["token-file"]:
		if final.Token, err = readTokenFile(tokenFile); err != nil {
			return settings{}, "", "", err
		}
	}
	if set["name"] {
		final.Name = s.Name
	}
	if set["tags"] {
		final.Tags = splitList(tags)
	}
	if set["labels"] {
		if final.Labels, err = parseLabels(labels); err != nil {
			return settings{}, "", "", err
		}
	}
	if set["platform"] {
		final.Platform = s.Platform
	}
	if set["slots"] {
		final.Slots = s.Slots
	}
	if set["ahead"] {
		final.Ahead = s.Ahead
	}
	if set["no-reconnect"] {
		final.NoReconnect = s.NoReconnect
	}
	if set["single-use"] {
		final.SingleUse = s.SingleUse
	}
	if set["max-reconnect-delay"] {
		if err := checkMaxReconnectDelay(s.MaxReconnectDelay); err != nil {
			return settings{}, "", "", fmt.Errorf("--max-reconnect-delay %s: %v", s.MaxReconnectDelay, err)
		}
		final.MaxReconnectDelay = s.MaxReconnectDelay
	}
	if set["ca"] {
		final.CA = s.CA
	}
	if set["output-cap"] {
		n, err := parseOutputCap(outputCap)
		if err != nil {
			return settings{}, "", "", fmt.Errorf("--output-cap %s: %v", outputCap, err)
		}
		final.OutputCapBytes = n
	}
	if set["drain-timeout"] {
		if err := checkDrainTimeout(s.DrainTimeout); err != nil {
			return settings{}, "", "", fmt.Errorf("--drain-timeout %s: %v", s.DrainTimeout, err)
		}
		final.DrainTimeout = s.DrainTimeout
	}
	if set["state-dir"] {
		if s.StateDir == "" {
			return settings{}, "", "", errors.New("--state-dir: want a directory")
		}
		final.StateDir = s.StateDir
	}
	if set["work-dir"] {
		if s.WorkDir == "" {
			return settings{}, "", "", errors.New("--work-dir: want a directory")
		}
		final.WorkDir = s.WorkDir
	}
	if set["keep-scratch"] {
		final.KeepScratch = s.KeepScratch
	}
	if set["cache-size"] {
		if final.CacheBytes, err = parseCacheSize(cacheSize); err != nil {
			return settings{}, "", "", fmt.Errorf("--cache-size %s: %v", cacheSize, err)
		}
	}
	if set["pass-env"] {
		if final.PassEnv, err = parsePassEnv(passEnv); err != nil {
			return settings{}, "", "", fmt.Errorf("--pass-env: %v", err)
		}
	}
	switch executor {
	case "sh":
	case "noop":
		final.Noop = true
	default:
		return settings{}, "", "", fmt.Errorf("--executor %q: want sh or noop", executor)
	}
	// --token is required only without a saved identity: connect decides.
	if name, secret, ok := strings.Cut(final.Token, "."); final.Token != "" && (!ok || name == "" || secret == "") {
		return settings{}, "", "", errors.New("the enrollment token (--token, --token-file, $" + workerTokenEnv + " or the config file's token) must read NAME.SECRET")
	}
	if final.SingleUse && final.Slots != 1 {
		return settings{}, "", "", fmt.Errorf("--single-use runs one step: --slots %d must be 1 (or left out)", final.Slots)
	}
	if final.SingleUse && final.Token == "" {
		return settings{}, "", "", errors.New("--single-use needs an enrollment token ($" + workerTokenEnv + ", --token-file or --token): a single-use worker keeps no saved identity")
	}
	if final.Slots < 1 || final.Slots > 1024 {
		return settings{}, "", "", fmt.Errorf("--slots %d: want 1..1024", final.Slots)
	}
	if final.SingleUse && final.Ahead != 0 {
		return settings{}, "", "", fmt.Errorf("--single-use runs one step: --ahead %d must be 0 (or left out)", final.Ahead)
	}
	if final.Ahead < 0 || final.Ahead > core.MaxWorkerAhead {
		return settings{}, "", "", fmt.Errorf("--ahead %d: want 0..%d", final.Ahead, core.MaxWorkerAhead)
	}
	for i, u := range final.URLs {
		if final.URLs[i], err = controlURL(u); err != nil {
			return settings{}, "", "", err
		}
	}
	final.URLs = slices.Compact(final.URLs)
	if final.Name == "" {
		final.Name, _, _ = strings.Cut(final.Token, ".")
	}
	return final, logFormat, logLevel, nil
}

// readTokenFile reads an enrollment token from a file (its surrounding
// white space dropped).
func readTokenFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("--token-file: %v", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxTokenFile+1))
	switch {
	case err != nil:
		return "", fmt.Errorf("--token-file: %v", err)
	case len(b) > maxTokenFile:
		return "", fmt.Errorf("--token-file %s: more than %d bytes; it holds one token, NAME.SECRET", path, maxTokenFile)
	case len(bytes.TrimSpace(b)) == 0:
		return "", fmt.Errorf("--token-file %s is empty; it holds one token, NAME.SECRET", path)
	}
	return string(bytes.TrimSpace(b)), nil
}

func usage(stderr io.Writer, err error) int {
	fmt.Fprintf(stderr, "worker connect: %v\nRun 'worker connect --help' for usage.\n", err)
	return exitUsage
}

// connect runs the worker until it exits or ctx ends. It holds the state
// directory's lock throughout, and boots from the identity saved there if
// any, else enrolls with the token (SPEC §9). Each value on stops is a
// SIGINT or SIGTERM: the first drains the worker, the next stops its steps
// (§10).
func connect(ctx context.Context, stops <-chan os.Signal, s settings, log *slog.Logger) int {
	var tlsConf *tls.Config
	if s.CA != "" {
		pool, err := tlsconf.LoadCA(s.CA)
		if err != nil {
			log.Error("cannot read the CA file", "ca", s.CA, "err", err)
			return exitUsage
		}
		tlsConf = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	var shim string
	if !s.Noop && worker.ShimSupported {
		// Each step runs under a shim, this binary re-executed, so that the
		// step's process tree dies with the worker (§10). The noop executor
		// forks nothing.
		exe, err := os.Executable()
		if err != nil {
			log.Error("cannot find this executable for the step shim", "err", err)
			return exitError
		}
		shim = exe
	}
	if s.SingleUse {
		// Single use (SPEC §10): a scaler-managed instance is never
		// restarted as itself (its Hello with a credential is refused), so
		// it keeps no identity and many run side by side on one host; its
		// steps' directories go in a temporary one unless --work-dir.
		if s.WorkDir == "" {
			dir, err := os.MkdirTemp("", "tether-worker-")
			if err != nil {
				log.Error("cannot make a work directory", "err", err)
				return exitError
			}
			defer os.RemoveAll(dir)
			s.WorkDir = filepath.Join(dir, "work")
		}
		code, _, err := connectOnce(ctx, stops, s, nil, nil, tlsConf, shim, log)
		switch {
		case err != nil && ctx.Err() != nil:
			return exitOK
		case err != nil:
			log.Error("worker stopped", "err", err)
			return exitError
		case code == exitOK:
			log.Info("single-use worker done: its step was reported")
		default:
			log.Error("single-use worker exiting", "code", code)
		}
		return code
	}
	if s.StateDir == "" {
		dir, err := worker.DefaultStateDir()
		if err != nil {
			log.Error("cannot find a state directory", "err", err)
			return exitUsage
		}
		s.StateDir = dir
	}
	sd, err := worker.OpenStateDir(s.StateDir)
	if errors.Is(err, worker.ErrStateLocked) {
		log.Error("another worker process runs with this state directory; two processes never share an identity: give this one its own --state-dir",
			"state_dir", s.StateDir, "err", err, "code", exitStateLocked)
		return exitStateLocked
	}
	if err != nil {
		log.Error("cannot open the state directory", "state_dir", s.StateDir, "err", err)
		return exitError
	}
	defer sd.Close()
	saved, err := sd.Load()
	if err != nil {
		log.Error("cannot use the saved identity; remove the state file to enroll anew with --token", "err", err)
		return exitError
	}
	if saved == nil && s.Token == "" {
		fmt.Fprintf(os.Stderr, "worker connect: an enrollment token is required ($TETHER_WORKER_TOKEN, --token-file or --token): no saved identity in %s (NAME.SECRET from 'orchestrator token create NAME')\nRun 'worker connect --help' for usage.\n", sd.Dir())
		return exitUsage
	}
	for {
		code, x, err := connectOnce(ctx, stops, s, sd, saved, tlsConf, shim, log)
		switch {
		case err != nil && ctx.Err() != nil: // SIGINT/SIGTERM
			return exitOK
		case err != nil:
			log.Error("worker stopped", "err", err)
			return exitError
		case x != nil && x.CredentialRefused && s.Token != "":
			// The saved identity is gone; the operator gave a token: enroll
			// a new instance with it, as they would expect (SPEC §9).
			log.Warn("the saved identity was refused for good; enrolling a new instance with the enrollment token given",
				"worker_id", string(saved.Worker), "reason", x.Reason, "state_file", sd.Path())
			saved = nil
			continue
		case x != nil && x.CredentialRefused:
			log.Error("the saved identity was refused for good; start the worker with --token NAME.SECRET (a new token from 'orchestrator token create NAME') to enroll a new instance",
				"worker_id", string(saved.Worker), "reason", x.Reason, "state_file", sd.Path(), "code", code)
			return code
		}
		switch code {
		case exitOK:
			log.Info("worker drained")
		case exitDisconnected:
			log.Error("worker exiting: disconnected and not reconnecting", "code", code)
		case exitRefused:
			log.Error("worker exiting: refused by the orchestrator", "code", code)
		default:
			log.Warn("worker exiting", "code", code)
		}
		return code
	}
}

// connectOnce runs one worker instance: the saved one, or (saved nil) a new
// one enrolled with the token, whose credential is saved before it acts on
// anything else. It returns the core's exit code and exit, or Run's error.
func connectOnce(ctx context.Context, stops <-chan os.Signal, s settings, sd *worker.StateDir, saved *worker.State, tlsConf *tls.Config, shim string, log *slog.Logger) (int, *core.WorkerExit, error) {
	cfg := core.WorkerConfig{
		Name: s.Name, Tags: s.Tags, Labels: s.Labels, Platform: s.Platform, Slots: s.Slots, Ahead: s.Ahead,
		NoReconnect: s.NoReconnect, BackoffMax: s.MaxReconnectDelay, SingleUse: s.SingleUse,
		OutputCapBytes: s.OutputCapBytes, DrainTimeout: s.DrainTimeout,
	}
	if saved != nil {
		if s.Name != "" && s.Name != saved.Name {
			log.Warn("the worker keeps the name it enrolled with", "name", saved.Name, "ignored", s.Name)
		}
		cfg.ID, cfg.Name, cfg.Credential = saved.Worker, saved.Name, saved.Credential
	} else {
		id, err := newUUID()
		if err != nil {
			return 0, nil, fmt.Errorf("cannot draw the instance id: %w", err)
		}
		cfg.ID, cfg.Token = core.WorkerID(id), s.Token
	}
	d, err := worker.New(worker.Options{
		URL:    s.URLs[0],
		URLs:   s.URLs[1:],
		TLS:    tlsConf,
		Logger: log,
		Noop:   s.Noop,
		Shim:   shim,
		Config: cfg,
		// A step's surroundings (SPEC §10).
		WorkDir:     workDir(s, sd),
		KeepScratch: s.KeepScratch,
		CacheBytes:  s.CacheBytes,
		PassEnv:     s.PassEnv,
		SaveCredential: func(cred string) error {
			if sd == nil {
				return nil // single use: nothing to restart from
			}
			return sd.Save(worker.State{Worker: cfg.ID, Name: cfg.Name, Credential: cred, URL: s.URLs[0], URLs: s.URLs, EnrolledAt: time.Now().UTC()})
		},
	})
	if err != nil {
		return 0, nil, fmt.Errorf("cannot start the worker: %w", err)
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		if stops == nil {
			return
		}
		for n := 1; ; n++ {
			var sig os.Signal
			select {
			case <-done:
				return
			case sig = <-stops:
			}
			if n == 1 {
				log.Info("draining: no new steps; running steps may finish", "signal", sig.String(),
					"drain_timeout", cmp.Or(s.DrainTimeout, defaultDrainTimeout))
			} else {
				log.Warn("stopping the running steps", "signal", sig.String())
			}
			if !d.Drain() {
				return
			}
		}
	}()
	log.Info("worker starting", "worker", cfg.Name, "worker_id", string(cfg.ID), "url", strings.Join(s.URLs, " "), "tags", strings.Join(s.Tags, ","),
		"slots", s.Slots, "ahead", s.Ahead, "no_reconnect", s.NoReconnect, "max_reconnect_delay", cmp.Or(s.MaxReconnectDelay, defaultMaxReconnectDelay),
		"noop_executor", s.Noop, "step_shim", shim != "", "output_cap_bytes", cmp.Or(s.OutputCapBytes, defaultOutputCapBytes),
		"state_file", statePath(sd), "saved_identity", saved != nil, "single_use", s.SingleUse)
	code, err := d.Run(ctx)
	if err != nil {
		return 0, nil, err
	}
	return code, d.Exit(), nil
}

// newUUID returns a random (version 4, RFC 9562) UUID from crypto/rand.
func newUUID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // variant 10
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:]), nil
}

// controlURL normalizes the orchestrator URL: http(s) becomes ws(s), a bare
// host:port gets ws://, and an empty path gets /control.
func controlURL(raw string) (string, error) {
	if !strings.Contains(raw, "://") {
		raw = "ws://" + raw
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("--url %q: want ws://HOST:PORT/control", raw)
	}
	switch u.Scheme {
	case "ws", "wss":
	case "http":
		u.Scheme = "ws"
	case "https":
		u.Scheme = "wss"
	default:
		return "", fmt.Errorf("--url %q: scheme must be ws or wss", raw)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/control"
	}
	return u.String(), nil
}

// urlList is --url, repeatable.
type urlList []string

func (l *urlList) String() string {
	if l == nil {
		return ""
	}
	return strings.Join(*l, " ")
}

func (l *urlList) Set(v string) error {
	*l = append(*l, v)
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func parseLabels(s string) (map[string]string, error) {
	m := map[string]string{}
	for _, p := range splitList(s) {
		k, v, ok := strings.Cut(p, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("--labels: %q is not key=value", p)
		}
		m[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return m, nil
}

// loadConfig reads a worker config file over the defaults.
func loadConfig(path string, src []byte) (settings, error) {
	s := settings{URLs: []string{defaultURL}, Slots: 1}
	if len(src) > maxConfigSize {
		return s, fmt.Errorf("%s: %d bytes, at most %d", path, len(src), maxConfigSize)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(src, &doc); err != nil {
		return s, fmt.Errorf("%s: %v", path, err)
	}
	if len(doc.Content) == 0 {
		return s, nil
	}
	var errs []string
	errf := func(n *yaml.Node, format string, args ...any) {
		errs = append(errs, fmt.Sprintf("%s:%d: %s", path, n.Line, fmt.Sprintf(format, args...)))
	}
	scalar := func(n *yaml.Node, key string) string {
		if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
			errf(n, "%s must be a string", key)
			return ""
		}
		return n.Value
	}
	root := doc.Content[0]
	known := []string{"url", "ca", "token", "name", "tags", "labels", "platform", "slots", "ahead", "no_reconnect", "max_reconnect_delay", "output_cap", "drain_timeout", "state_dir",
		"work_dir", "keep_scratch", "cache_size", "pass_env", "single_use"}
	if root.Kind != yaml.MappingNode {
		errf(root, "worker config must be a mapping of keys to values")
		return s, errors.New(strings.Join(errs, "\n  "))
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if seen[k.Value] {
			errf(k, "key %q appears twice", k.Value)
			continue
		}
		seen[k.Value] = true
		switch k.Value {
		case "url":
			s.URLs = nil
			if v.Kind == yaml.SequenceNode {
				for _, c := range v.Content {
					s.URLs = append(s.URLs, scalar(c, "url entries"))
				}
			} else {
				s.URLs = []string{scalar(v, k.Value)}
			}
			if len(s.URLs) == 0 {
				errf(v, "url must be a URL or a list of them")
			}
		case "ca":
			s.CA = scalar(v, k.Value)
			if s.CA != "" && !filepath.IsAbs(s.CA) {
				s.CA = filepath.Join(filepath.Dir(path), s.CA)
			}
		case "token":
			s.Token = scalar(v, k.Value)
		case "state_dir":
			s.StateDir = scalar(v, k.Value)
			if s.StateDir != "" && !filepath.IsAbs(s.StateDir) {
				s.StateDir = filepath.Join(filepath.Dir(path), s.StateDir)
			}
		case "work_dir":
			s.WorkDir = scalar(v, k.Value)
			if s.WorkDir != "" && !filepath.IsAbs(s.WorkDir) {
				s.WorkDir = filepath.Join(filepath.Dir(path), s.WorkDir)
			}
		case "keep_scratch":
			if v.Kind != yaml.ScalarNode || v.Decode(&s.KeepScratch) != nil {
				errf(v, "keep_scratch must be true or false, not %q", v.Value)
			}
		case "cache_size":
			n, err := parseCacheSize(v.Value)
			if v.Kind != yaml.ScalarNode || err != nil {
				errf(v, "cache_size must be a size such as 256MiB (0: no cache), not %q", v.Value)
			}
			s.CacheBytes = n
		case "pass_env":
			var pats []string
			if v.Kind == yaml.SequenceNode {
				for _, c := range v.Content {
					pats = append(pats, scalar(c, "pass_env entries"))
				}
			} else {
				pats = splitList(scalar(v, k.Value))
			}
			for _, p := range pats {
				if err := worker.CheckEnvPattern(p); err != nil {
					errf(v, "pass_env: %v", err)
				}
			}
			s.PassEnv = pats
		case "name":
			s.Name = scalar(v, k.Value)
		case "platform":
			s.Platform = scalar(v, k.Value)
		case "tags":
			switch v.Kind {
			case yaml.SequenceNode:
				for _, c := range v.Content {
					if t := scalar(c, "tags entries"); t != "" {
						s.Tags = append(s.Tags, t)
					}
				}
			case yaml.ScalarNode:
				s.Tags = splitList(v.Value)
			default:
				errf(v, "tags must be a list")
			}
		case "labels":
			if v.Kind != yaml.MappingNode {
				errf(v, "labels must be a mapping of keys to strings")
				continue
			}
			s.Labels = map[string]string{}
			for j := 0; j+1 < len(v.Content); j += 2 {
				s.Labels[scalar(v.Content[j], "labels keys")] = scalar(v.Content[j+1], "labels values")
			}
		case "slots":
			n, err := strconv.Atoi(v.Value)
			if v.Kind != yaml.ScalarNode || err != nil || n < 1 || n > 1024 {
				errf(v, "slots must be a whole number 1..1024, not %q", v.Value)
			}
			s.Slots = n
		case "ahead":
			n, err := strconv.Atoi(v.Value)
			if v.Kind != yaml.ScalarNode || err != nil || n < 0 || n > core.MaxWorkerAhead {
				errf(v, "ahead must be a whole number 0..%d, not %q", core.MaxWorkerAhead, v.Value)
			}
			s.Ahead = n
		case "no_reconnect":
			var b bool
			if v.Kind != yaml.ScalarNode || v.Decode(&b) != nil {
				errf(v, "no_reconnect must be true or false, not %q", v.Value)
			}
			s.NoReconnect = b
		case "single_use":
			var b bool
			if v.Kind != yaml.ScalarNode || v.Decode(&b) != nil {
				errf(v, "single_use must be true or false, not %q", v.Value)
			}
			s.SingleUse = b
		case "max_reconnect_delay":
			d, err := time.ParseDuration(v.Value)
			if err == nil {
				err = checkMaxReconnectDelay(d)
			}
			if v.Kind != yaml.ScalarNode || err != nil {
				errf(v, "max_reconnect_delay must be a duration from 100ms to 1h such as 30s, not %q", v.Value)
			}
			s.MaxReconnectDelay = d
		case "output_cap":
			n, err := parseOutputCap(v.Value)
			if v.Kind != yaml.ScalarNode || err != nil {
				errf(v, "output_cap must be a size from 1KiB to 1TiB such as 64MiB, not %q", v.Value)
			}
			s.OutputCapBytes = n
		case "drain_timeout":
			d, err := time.ParseDuration(v.Value)
			if err == nil {
				err = checkDrainTimeout(d)
			}
			if v.Kind != yaml.ScalarNode || err != nil {
				errf(v, "drain_timeout must be a duration from 1ms to 24h such as 10m, not %q", v.Value)
			}
			s.DrainTimeout = d
		default:
			errf(k, "unknown key %q (known: %s)", k.Value, strings.Join(known, ", "))
		}
	}
	if len(errs) > 0 {
		return s, errors.New(strings.Join(errs, "\n  "))
	}
	return s, nil
}

// ErrBadSize is returned for an --output-cap that is not a size in range.
var ErrBadSize = errors.New("want a size in bytes, or with KiB, MiB or GiB, from 1KiB to 1TiB")

// parseOutputCap reads a size: a whole number of bytes, or one followed by
// KiB, MiB or GiB (powers of 1024).
func parseOutputCap(v string) (int64, error) {
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}} {
		if strings.HasSuffix(v, u.suffix) {
			v, mult = strings.TrimSuffix(v, u.suffix), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 || n > maxOutputCapBytes/mult || n*mult < minOutputCapBytes {
		return 0, ErrBadSize
	}
	return n * mult, nil
}

// parseCacheSize reads --cache-size: 0 (no cache: -1 in settings) or a
// size of at least 1 KiB.
func parseCacheSize(v string) (int64, error) {
	if strings.TrimSpace(v) == "0" {
		return -1, nil
	}
	return parseOutputCap(v)
}

// parsePassEnv reads --pass-env's comma-separated glob patterns.
func parsePassEnv(v string) ([]string, error) {
	pats := splitList(v)
	for _, p := range pats {
		if err := worker.CheckEnvPattern(p); err != nil {
			return nil, err
		}
	}
	return pats, nil
}

// checkMaxReconnectDelay keeps the backoff cap in a range where twice it
// (the grace window) is meaningful.
func checkMaxReconnectDelay(d time.Duration) error {
	if d < minMaxReconnectDelay || d > maxMaxReconnectDelay {
		return fmt.Errorf("want %s..%s", minMaxReconnectDelay, maxMaxReconnectDelay)
	}
	return nil
}

// checkDrainTimeout keeps --drain-timeout positive and bounded.
func checkDrainTimeout(d time.Duration) error {
	if d < minDrainTimeout || d > maxDrainTimeout {
		return fmt.Errorf("want %s..%s", minDrainTimeout, maxDrainTimeout)
	}
	return nil
}

// printFlags lists a flag set GNU-style ("--name VALUE  usage (default …)").
func printFlags(w io.Writer, fs *flag.FlagSet) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	sort.Strings(names)
	for _, n := range names {
		f := fs.Lookup(n)
		arg, use := flag.UnquoteUsage(f)
		name := "--" + f.Name
		if arg != "" {
			name += " " + strings.ToUpper(arg)
		}
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" {
			use += " (default " + f.DefValue + ")"
		}
		fmt.Fprintf(tw, "  %s\t%s\n", name, use)
	}
	tw.Flush()
}

// statePath is the state file's path, or "" for a worker that keeps none.
func statePath(sd *worker.StateDir) string {
	if sd == nil {
		return ""
	}
	return sd.Path()
}

// workDir is where the worker's steps get their directories (SPEC §10):
// --work-dir, else work/ in the state directory.
func workDir(s settings, sd *worker.StateDir) string {
	if s.WorkDir != "" || sd == nil {
		return s.WorkDir
	}
	return filepath.Join(sd.Dir(), "work")
}
