package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	flag "github.com/spf13/pflag"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.yaml.in/yaml/v3"

	"github.com/tether-run/tether/adapters/heapfloor"
	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/core"
)

// Defaults of serve.
const (
	defaultAddr       = "127.0.0.1:7420"
	defaultDataDir    = "./tether-data"
	defaultConfigFile = "server-config.yaml"
	adminTokenFile    = "admin-token"
	metricsTokenEnv   = "TETHER_METRICS_TOKEN" // rather than argv, which ps shows
	storeEnv          = "TETHER_STORE"         // the default of --store
	storeFile         = "tether.db"
	shutdownTimeout   = 10 * time.Second
	maxConfigSize     = 1 << 20
	// maxRecoverySecs bounds every recovery setting (7 days): longer means
	// a typo, and a larger number of seconds would overflow a duration.
	maxRecoverySecs = 7 * 24 * 60 * 60
)

var serveCmd = &command{
	path:  "serve",
	short: "run the orchestrator: control plane, operator API and store",
	long: `Run the orchestrator in the foreground until SIGINT or SIGTERM.

It keeps all durable state in its store (an existing store is restored:
in-flight steps wait for their workers to reconnect) and listens on
--addr for workers (WebSocket at /control, the HTTP/2 data plane at /data/ and
/bundle/) and operators (HTTP JSON API under /api/; probes at /livez and
/readyz, Prometheus metrics at /metrics, SPEC §16). On the first start it
creates an admin token in <data-dir>/admin-token (or --admin-token-file;
mode 0600) and prints it once; client commands read that file.

The store is named by --store (default: $TETHER_STORE, else
bbolt:<data-dir>/tether.db):

  bbolt:PATH     one bbolt file (and PATH.blobs/ beside it) on this machine;
                 PATH relative to the working directory
  postgres://…   a PostgreSQL database (a connection URL, postgresql:// too)

On PostgreSQL any number of serve processes may share one database, one
leading at a time (SPEC §11). Each starts as a standby: /livez answers 200,
/readyz 503 ("standby; leader at URL"), the operator API (/api/…) and the
status page redirect (307) to the leader, /metrics is served (tether_leader
0, the epoch), and every other path (the workers' /control, /data/,
/bundle/, …) answers 503 with the header Tether-Leader: URL (when one
leads). The leader renews a lease in the database (--leader-lease, default
10s, judged by the database's clock); when it lapses a standby takes over,
restores from the database exactly as a restart does (SPEC §7), and serves
on the address it already holds. A leader that finds another has taken
over, whose commit's outcome is unknown after a store error, or that could
not renew its lease for a whole lease, stops at once and exits with status 75: run serve under a supervisor that restarts
it (systemd Restart=always); it comes back as a standby. On SIGINT/SIGTERM
a leader shuts down and resigns, so a standby takes over at once.
Every orchestrator of a PostgreSQL store must name, with
--secrets-key-file and --admin-token-file, the same secrets key and admin
token (each file is created on the first start when missing: copy both to
the other hosts before starting them; one with another key or admin token
exits 2), and --advertise the URL the others, the workers and the clients
reach it at (default: http(s)://--addr when it names a host).

Without a certificate everything is cleartext: HTTP/1.1 and HTTP/2 with prior
knowledge (h2c). With --tls-cert and --tls-key (PEM files) everything is TLS,
HTTP/2 negotiated by ALPN: workers then connect to wss://HOST:PORT/control
(with 'worker connect --ca FILE' for a private CA) and clients use
https://HOST:PORT (with --ca FILE).

The optional config file (YAML) may set addr, data_dir (relative to the
file's directory), the recovery sweeper's knobs (SPEC §5) and the limits on
worker connections (SPEC §12):

  addr: 127.0.0.1:7420
  data_dir: ./tether-data
  retention: 720h                     # finished runs, gone workers, used tokens (SPEC §7a); --retain
  tls:                                # optional; paths relative to the file's directory
    cert_file: tls/server.crt
    key_file: tls/server.key
  recovery:
    heartbeat_timeout_secs: 120       # a silent worker is stale after this
    sweep_interval_secs: 60           # how often the sweeper runs
    unmatched_step_timeout_secs: 30   # a queued step no worker can take fails after this
    heartbeat_interval_secs: 30       # workers heartbeat this often; silent for 2 intervals, no new work
    dispatch_ack_secs: 10             # a dispatch not started or rejected by then is requeued
  limits:                             # what one request may send (SPEC §12)
    max_submit_body_bytes: 1048576    # a workflow definition (POST /api/runs); at most 1048576
  memory:                             # SPEC §12
    heap_floor_bytes: 0               # the heap may grow to this before the Go collector runs (0: GOGC alone); at most 1099511627776; --heap-floor
  control:                            # worker connections (SPEC §12)
    max_conns: 1024                   # connections that sent a Hello, in all (not per address)
    max_unauth_conns: 256             # connections without an accepted Hello, in all
    max_unauth_conns_per_addr: 32     # ... from one source address
    hello_timeout_secs: 5             # a connection's Hello must arrive within this
  data:                               # the data plane's limits (SPEC §12, §14); each also a --data-* flag
    max_put_body_bytes: 67108864      # one PUT /data/{id} (64 MiB); over it: 413
    max_append_body_bytes: 1048576    # one append (1 MiB); over it: 413
    max_stream_bytes: 1073741824      # an append stream's length (1 GiB); past it: 413
    max_bundle_body_bytes: 268435456  # one bundle upload (256 MiB); over it: 413
    max_append_in_flight_bytes: 268435456 # append bodies held in memory at once; more wait
    body_idle_timeout_secs: 30        # a write's body that sends nothing for this long: 408
  http:                               # the HTTP server's limits (SPEC §12); flags of the same names
    idle_timeout_secs: 120            # an idle keep-alive or HTTP/2 connection is closed
    header_timeout_secs: 10           # TLS handshake, request headers, h2c preface
    body_timeout_secs: 30             # an operator API request body
    write_timeout_secs: 30            # a write the peer accepts no byte of for this long closes it
    max_tcp_conns: 3072               # concurrent connections (default: 1024 control + 2048)
    max_conns_per_addr: 2304          # of one source address (default: 3/4 of max_tcp_conns)
    refusals_per_sec: 50              # one address refused faster than this: its next requests wait
    work_per_sec: 50000               # what one address's control frames may cost a second (a busy worker: 3-4 a step)

Flags given on the command line override the file; an unknown key is an
error naming its line. The sweeper is always on. Each recovery setting is 1 s
to 7 days, and together they must make sense: heartbeat_timeout_secs at
least 2 heartbeat intervals, sweep_interval_secs at most
heartbeat_timeout_secs; serve refuses anything else, naming the key.

serve binds --addr before it creates anything: on a port in use it exits
without making the data directory, the store or an admin token. A data
directory another orchestrator serves is refused (its store file is locked).

Shutdown (SIGINT/SIGTERM) stops accepting requests, lets operator requests in
progress finish, commits what is already queued, closes every worker's
connection with a going-away close frame (1001), and exits 0: nothing already
answered is lost, and workers keep running their steps and reconnect to the
next start within their grace window. SIGHUP is ignored.`,
	example: `  orchestrator serve --data-dir /var/lib/tether --addr 0.0.0.0:7420
  orchestrator serve --config /etc/tether/server-config.yaml --log-format json
  orchestrator serve --addr 10.0.0.5:7420 --store postgres://tether@db/tether \
      --secrets-key-file /etc/tether/secrets-key --admin-token-file /etc/tether/admin-token`,
	nargs: 0,
	flags: func(fs *flag.FlagSet, o *options) {
		fs.StringVar(&o.addr, "addr", defaultAddr, "listen `address` for workers (/control) and the operator API (/api/)")
		fs.StringVar(&o.dataDir, "data-dir", defaultDataDir, "`directory` of the store (tether.db) and the admin token")
		fs.StringVar(&o.config, "config", defaultConfigFile, "server config `file` (YAML); optional unless given explicitly")
		fs.StringVar(&o.tlsCert, "tls-cert", "", "serve TLS with this certificate `file` (PEM, the chain); needs --tls-key")
		fs.StringVar(&o.tlsKey, "tls-key", "", "the TLS private key `file` (PEM)")
		fs.StringVar(&o.retain, "retain", "720h", "keep finished runs, gone workers and used tokens this long (`duration`: 720h, 30d, 1m; SPEC §7a)")
		fs.StringVar(&o.metricsToken, "metrics-token", "", "bearer `token` /metrics asks for (default: $"+metricsTokenEnv+"; neither: /metrics is open, SPEC §16)")
		fs.StringVar(&o.secretsKeyFile, "secrets-key-file", "", "the key `file` sealing secrets at rest (64 hex digits; created, mode 0600, when missing; default the store file's path + .secrets-key); every orchestrator serving one store needs the same (SPEC §14a)")
		fs.StringVar(&o.store, "store", "", "the `store`: bbolt:PATH or postgres://… (default: $"+storeEnv+", else bbolt:<data-dir>/tether.db; SPEC §11)")
		fs.StringVar(&o.adminTokenFile, "admin-token-file", "", "the admin token `file` (created, mode 0600, when missing; default <data-dir>/admin-token); every orchestrator of a PostgreSQL store needs the same")
		fs.StringVar(&o.advertise, "advertise", "", "with a PostgreSQL store: the base `URL` other orchestrators, workers and clients reach this one at (default: http(s)://--addr, when it names a host)")
		fs.DurationVar(&o.leaderLease, "leader-lease", defaultLeaderLease, "with a PostgreSQL store: the leader's lease (`duration`, 1s to 10m): a standby takes over once it lapses unrenewed (SPEC §11)")
		fs.StringVar(&o.pprof, "pprof", "", "serve Go's runtime profiles (/debug/pprof/) on this loopback `address`; off by default")
		fs.Int64Var(&o.heapFloor, "heap-floor", 0, "let the heap grow to this many `bytes` before the Go collector runs (0, the default: GOGC alone; at most 1 TiB, and half of GOMEMLIMIT); fewer collections under load, so shorter loop batches, for about this much more memory (SPEC §12)")
		fs.Int64Var(&o.maxSubmitBody, "max-submit-body", orchestrator.DefaultMaxSubmitBody, "largest workflow definition accepted by POST /api/runs, in `bytes` (at most 1048576)")
		fs.IntVar(&o.maxConns, "max-conns", defaultMaxConns, "worker connections that sent a Hello, at most (`n`, not per address)")
		fs.IntVar(&o.maxUnauthConns, "max-unauth-conns", orchestrator.DefaultMaxUnauthConns, "connections without an accepted Hello, at most (`n`)")
		fs.IntVar(&o.maxUnauthConnsPerAddr, "max-unauth-conns-per-addr", orchestrator.DefaultMaxUnauthConnsPerAddr, "connections without an accepted Hello from one source address, at most (`n`)")
		fs.IntVar(&o.maxEventStreams, "max-event-streams", orchestrator.DefaultMaxEventStreams, "live event streams (SPEC §17) open at once, at most (`n`)")
		fs.DurationVar(&o.helloTimeout, "hello-timeout", orchestrator.DefaultHelloTimeout, "a new worker connection must send its Hello within this (`duration`)")
		fs.StringSliceVar(&o.shipEnv, "ship-env", nil, "ship the orchestrator's own environment variables whose names match these glob `patterns` (comma-separated or repeated, e.g. AWS_REGION,GIT_*) with every dispatch; default none (SPEC §8)")
		dataFlags(fs, &o.data)
		httpFlags(fs, &o.http)
	},
	run: serve,
}

// serverConfig is the config file, with defaults filled in.
type serverConfig struct {
	Addr              string
	DataDir           string
	StorePath         string // the bbolt file (--store, $TETHER_STORE; default <DataDir>/tether.db)
	StoreDSN          string // or the PostgreSQL database (--store postgres://…)
	AdminTokenFile    string // --admin-token-file; default <DataDir>/admin-token
	Advertise         string // --advertise: this orchestrator's base URL (PostgreSQL)
	LeaderLease       time.Duration
	TLSCert, TLSKey   string // both or neither
	HeartbeatTimeout  time.Duration
	SweepInterval     time.Duration
	UnmatchedTimeout  time.Duration
	HeartbeatInterval time.Duration
	DispatchAck       time.Duration
	MaxSubmitBody     int64         // limits: max_submit_body_bytes
	HeapFloor         int64         // memory: heap_floor_bytes (SPEC §12)
	Retention         time.Duration // retention: (SPEC §7a)
	// Control-plane admission (control: keys, SPEC §12).
	MaxConns, MaxUnauthConns, MaxUnauthConnsPerAddr int
	HelloTimeout                                    time.Duration
	MaxEventStreams                                 int        // --max-event-streams (SPEC §17)
	ShipEnv                                         []string   // --ship-env (SPEC §8)
	Data                                            dataLimits // zero fields: the driver's defaults
	HTTP                                            httpLimits
}

// httpLimits are the HTTP server's limits (SPEC §12); zero means the
// orchestrator's default.
type httpLimits struct {
	IdleTimeout, HeaderTimeout, BodyTimeout, WriteTimeout time.Duration
	MaxTCPConns, MaxConnsPerAddr                          int
	RefusalsPerSec, WorkPerSec                            int
}

// httpFlags defines serve's flags for the HTTP server's limits.
func httpFlags(fs *flag.FlagSet, h *httpLimits) {
	fs.DurationVar(&h.IdleTimeout, "idle-timeout", orchestrator.DefaultIdleTimeout, "close a keep-alive or HTTP/2 connection idle for this `duration`")
	fs.DurationVar(&h.HeaderTimeout, "header-timeout", orchestrator.DefaultHeaderTimeout, "a TLS handshake, a request's headers or an h2c preface must arrive within this `duration`")
	fs.DurationVar(&h.BodyTimeout, "body-timeout", orchestrator.DefaultBodyTimeout, "an operator API request body must arrive within this `duration`")
	fs.DurationVar(&h.WriteTimeout, "write-timeout", orchestrator.DefaultWriteTimeout, "close a connection (reset an HTTP/2 stream) whose peer accepts nothing of a write for this `duration`")
	fs.IntVar(&h.MaxTCPConns, "max-tcp-conns", 0, "cap on concurrent TCP connections (`n`; 0: 1024 control connections + 2048); over it a connection is refused at once")
	fs.IntVar(&h.MaxConnsPerAddr, "max-conns-per-addr", 0, "cap on one source address's TCP connections (`n`; 0: 3/4 of --max-tcp-conns)")
	fs.IntVar(&h.RefusalsPerSec, "refusals-per-sec", 0, "refusals per second one source address may earn before its next requests wait (`n`; 0: 50)")
	fs.IntVar(&h.WorkPerSec, "work-per-sec", 0, "work units per second one source address's control frames may cost before its next frame waits (`n`; 0: 50000; a busy worker spends 3-4 a step)")
}

// dataLimits are the data plane's limits (SPEC §12, §14): config keys
// under data:, and --data-* flags. Zero means the driver's default.
type dataLimits struct {
	MaxPutBodyBytes        int64
	MaxAppendBodyBytes     int64
	MaxStreamBytes         int64
	MaxBundleBodyBytes     int64
	MaxAppendInFlightBytes int64
	BodyIdleTimeoutSecs    int64
}

// dataLimitKeys maps each data: config key (and, with "data-" before it and
// dashes for underscores, its flag) to its field and its default.
func dataLimitKeys(l *dataLimits) []struct {
	key  string
	v    *int64
	def  int64
	unit string
} {
	return []struct {
		key  string
		v    *int64
		def  int64
		unit string
	}{
		{"max_put_body_bytes", &l.MaxPutBodyBytes, orchestrator.DefaultMaxPutBody, "bytes of one PUT /data/{id} body"},
		{"max_append_body_bytes", &l.MaxAppendBodyBytes, orchestrator.DefaultMaxAppendBody, "bytes of one append body"},
		{"max_stream_bytes", &l.MaxStreamBytes, orchestrator.DefaultMaxStream, "bytes of an append stream"},
		{"max_bundle_body_bytes", &l.MaxBundleBodyBytes, orchestrator.DefaultMaxBundleBody, "bytes of one bundle upload"},
		{"max_append_in_flight_bytes", &l.MaxAppendInFlightBytes, orchestrator.DefaultMaxDataInFlight, "bytes of append bodies held in memory at once"},
		{"body_idle_timeout_secs", &l.BodyIdleTimeoutSecs, int64(orchestrator.DefaultBodyIdleTimeout / time.Second), "seconds a write's body may send nothing before it is cut (408)"},
	}
}

// dataFlags defines the --data-* flags (zero: the config file's value, or
// the default).
func dataFlags(fs *flag.FlagSet, l *dataLimits) {
	for _, k := range dataLimitKeys(l) {
		fs.Int64Var(k.v, "data-"+strings.ReplaceAll(k.key, "_", "-"), 0, fmt.Sprintf("data plane: at most `n` %s (default %d; config data.%s)", k.unit, k.def, k.key))
	}
}

// apply sets the driver options of these limits.
func (l dataLimits) apply(o *orchestrator.Options) {
	o.MaxPutBody, o.MaxAppendBody, o.MaxStream = l.MaxPutBodyBytes, l.MaxAppendBodyBytes, l.MaxStreamBytes
	o.MaxBundleBody, o.MaxDataInFlight = l.MaxBundleBodyBytes, l.MaxAppendInFlightBytes
	o.BodyIdleTimeout = time.Duration(l.BodyIdleTimeoutSecs) * time.Second
}

// defaultMaxConns is the default of --max-conns (orchestrator.Options.MaxConns).
const defaultMaxConns = 1024

func defaultServerConfig() serverConfig {
	d := core.DefaultConfig()
	return serverConfig{
		Addr: defaultAddr, DataDir: defaultDataDir,
		HeartbeatTimeout: d.HeartbeatTimeout, SweepInterval: d.SweepInterval, UnmatchedTimeout: d.UnmatchedTimeout,
		HeartbeatInterval: d.HeartbeatInterval, DispatchAck: d.DispatchAck,
		MaxSubmitBody: orchestrator.DefaultMaxSubmitBody, Retention: d.Retention,
		MaxConns: defaultMaxConns, MaxUnauthConns: orchestrator.DefaultMaxUnauthConns,
		MaxUnauthConnsPerAddr: orchestrator.DefaultMaxUnauthConnsPerAddr, HelloTimeout: orchestrator.DefaultHelloTimeout,
	}
}

// loadServerConfig reads a config file over the defaults. Relative data_dir
// is taken relative to the file's directory.
func loadServerConfig(path string, src []byte) (serverConfig, error) {
	cfg := defaultServerConfig()
	if len(src) > maxConfigSize {
		return cfg, fmt.Errorf("%s: %d bytes, at most %d", path, len(src), maxConfigSize)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(src, &doc); err != nil {
		return cfg, fmt.Errorf("%s: %v", path, err)
	}
	if len(doc.Content) == 0 {
		return cfg, nil // an empty file: defaults
	}
	var errs []string
	errf := func(n *yaml.Node, format string, args ...any) {
		errs = append(errs, fmt.Sprintf("%s:%d: %s", path, n.Line, fmt.Sprintf(format, args...)))
	}
	str := func(n *yaml.Node, key string) string {
		if n.Kind != yaml.ScalarNode || n.Tag == "!!null" || n.Value == "" {
			errf(n, "%s must be a non-empty string", key)
			return ""
		}
		return n.Value
	}
	secs := func(n *yaml.Node, key string) time.Duration {
		v, err := strconv.Atoi(n.Value)
		if n.Kind != yaml.ScalarNode || err != nil || v <= 0 {
			errf(n, "%s must be a positive whole number of seconds, not %q", key, n.Value)
			return 0
		}
		if v > maxRecoverySecs {
			errf(n, "%s is %d seconds, at most %d (7 days); lower it", key, v, maxRecoverySecs)
			return 0
		}
		return time.Duration(v) * time.Second
	}
	relative := func(p string) string {
		if p != "" && !filepath.IsAbs(p) {
			p = filepath.Join(filepath.Dir(path), p)
		}
		return p
	}
	count := func(n *yaml.Node, key string) int {
		v, err := strconv.Atoi(n.Value)
		if n.Kind != yaml.ScalarNode || err != nil || v <= 0 {
			errf(n, "%s must be a positive whole number, not %q", key, n.Value)
			return 0
		}
		return v
	}
	mapping(doc.Content[0], "server config", []string{"addr", "data_dir", "tls", "retention", "recovery", "limits", "memory", "control", "data", "http"}, errf, func(key string, v *yaml.Node) {
		switch key {
		case "retention":
			d, err := parseRetention(v.Value)
			if v.Kind != yaml.ScalarNode || err != nil {
				errf(v, "retention: %v", err)
			}
			cfg.Retention = d
		case "addr":
			cfg.Addr = str(v, key)
		case "data_dir":
			if dir := str(v, key); dir != "" {
				cfg.DataDir = relative(dir)
			}
		case "tls":
			mapping(v, "tls", []string{"cert_file", "key_file"}, errf, func(key string, v *yaml.Node) {
				switch key {
				case "cert_file":
					cfg.TLSCert = relative(str(v, key))
				case "key_file":
					cfg.TLSKey = relative(str(v, key))
				}
			})
			if (cfg.TLSCert == "") != (cfg.TLSKey == "") {
				errf(v, "tls needs both cert_file and key_file")
			}
		case "recovery":
			known := []string{"heartbeat_timeout_secs", "sweep_interval_secs", "unmatched_step_timeout_secs", "heartbeat_interval_secs", "dispatch_ack_secs"}
			mapping(v, "recovery", known, errf, func(key string, v *yaml.Node) {
				switch key {
				case "heartbeat_timeout_secs":
					cfg.HeartbeatTimeout = secs(v, key)
				case "sweep_interval_secs":
					cfg.SweepInterval = secs(v, key)
				case "unmatched_step_timeout_secs":
					cfg.UnmatchedTimeout = secs(v, key)
				case "heartbeat_interval_secs":
					cfg.HeartbeatInterval = secs(v, key)
				case "dispatch_ack_secs":
					cfg.DispatchAck = secs(v, key)
				}
			})
		case "limits":
			mapping(v, "limits", []string{"max_submit_body_bytes"}, errf, func(key string, v *yaml.Node) {
				switch key {
				case "max_submit_body_bytes":
					cfg.MaxSubmitBody = bytesLimit(v, key, errf, orchestrator.DefaultMaxSubmitBody)
				}
			})
		case "memory":
			mapping(v, "memory", []string{"heap_floor_bytes"}, errf, func(key string, v *yaml.Node) {
				var n int64
				if v.Kind != yaml.ScalarNode || v.ShortTag() == "!!null" || v.Decode(&n) != nil || n < 0 || n > heapfloor.FloorMax {
					errf(v, "%s must be a whole number of bytes from 0 (off) to %d, not %q", key, int64(heapfloor.FloorMax), v.Value)
					return
				}
				cfg.HeapFloor = n
			})
		case "control":
			known := []string{"max_conns", "max_unauth_conns", "max_unauth_conns_per_addr", "hello_timeout_secs"}
			mapping(v, "control", known, errf, func(key string, v *yaml.Node) {
				switch key {
				case "max_conns":
					cfg.MaxConns = count(v, key)
				case "max_unauth_conns":
					cfg.MaxUnauthConns = count(v, key)
				case "max_unauth_conns_per_addr":
					cfg.MaxUnauthConnsPerAddr = count(v, key)
				case "hello_timeout_secs":
					cfg.HelloTimeout = secs(v, key)
				}
			})
		case "data":
			keys := dataLimitKeys(&cfg.Data)
			known := make([]string, len(keys))
			for i, k := range keys {
				known[i] = k.key
			}
			mapping(v, "data", known, errf, func(key string, v *yaml.Node) {
				for _, k := range keys {
					if k.key == key {
						n, err := strconv.ParseInt(v.Value, 10, 64)
						if v.Kind != yaml.ScalarNode || err != nil || n <= 0 {
							errf(v, "data: %s must be a positive whole number, not %q", key, v.Value)
						}
						*k.v = n
					}
				}
			})
		case "http":
			known := []string{"idle_timeout_secs", "header_timeout_secs", "body_timeout_secs", "write_timeout_secs", "max_tcp_conns", "max_conns_per_addr", "refusals_per_sec", "work_per_sec"}
			mapping(v, "http", known, errf, func(key string, v *yaml.Node) {
				switch key {
				case "idle_timeout_secs":
					cfg.HTTP.IdleTimeout = secs(v, key)
				case "header_timeout_secs":
					cfg.HTTP.HeaderTimeout = secs(v, key)
				case "body_timeout_secs":
					cfg.HTTP.BodyTimeout = secs(v, key)
				case "write_timeout_secs":
					cfg.HTTP.WriteTimeout = secs(v, key)
				case "max_tcp_conns":
					cfg.HTTP.MaxTCPConns = count(v, key)
				case "max_conns_per_addr":
					cfg.HTTP.MaxConnsPerAddr = count(v, key)
				case "refusals_per_sec":
					cfg.HTTP.RefusalsPerSec = count(v, key)
				case "work_per_sec":
					cfg.HTTP.WorkPerSec = count(v, key)
				}
			})
		}
	})
	if len(errs) == 0 && cfg.HeartbeatInterval >= cfg.HeartbeatTimeout {
		errs = append(errs, fmt.Sprintf("%s: recovery: heartbeat_interval_secs (%s) must be shorter than heartbeat_timeout_secs (%s)",
			path, cfg.HeartbeatInterval, cfg.HeartbeatTimeout))
	} else if len(errs) == 0 {
		for _, e := range cfg.recoveryErrors() {
			errs = append(errs, path+": recovery: "+e)
		}
	}
	if len(errs) > 0 {
		return cfg, errors.New(strings.Join(errs, "\n  "))
	}
	return cfg, nil
}

// recoveryErrors checks the recovery settings against each other (SPEC §5,
// §12): each is positive and at most maxRecoverySecs on its own (the
// parser checks that), and together they must make sense. Each message
// names the keys and what to change.
func (c serverConfig) recoveryErrors() []string {
	var errs []string
	secs := func(d time.Duration) int64 { return int64(d / time.Second) }
	// A worker heartbeats every interval; one that misses a single
	// heartbeat must not be stale already (SPEC §5, §8: silent after 2
	// intervals, stale after the timeout).
	if c.HeartbeatTimeout < core.MaxSilentHeartbeats*c.HeartbeatInterval {
		errs = append(errs, fmt.Sprintf("heartbeat_timeout_secs (%d) is shorter than %d heartbeat intervals (heartbeat_interval_secs %d × %d = %d): "+
			"every worker would go stale between two heartbeats; raise heartbeat_timeout_secs to at least %d or lower heartbeat_interval_secs to at most %d",
			secs(c.HeartbeatTimeout), core.MaxSilentHeartbeats, secs(c.HeartbeatInterval), core.MaxSilentHeartbeats,
			secs(core.MaxSilentHeartbeats*c.HeartbeatInterval), secs(core.MaxSilentHeartbeats*c.HeartbeatInterval),
			secs(c.HeartbeatTimeout)/core.MaxSilentHeartbeats))
	}
	// Stale workers are found by the sweeper: sweeping less often than the
	// timeout would let a dead worker keep its steps for up to twice it.
	if c.SweepInterval > c.HeartbeatTimeout {
		errs = append(errs, fmt.Sprintf("sweep_interval_secs (%d) is longer than heartbeat_timeout_secs (%d): a stale worker would be found only at the next sweep, "+
			"up to %d s late; lower sweep_interval_secs to at most %d", secs(c.SweepInterval), secs(c.HeartbeatTimeout), secs(c.SweepInterval), secs(c.HeartbeatTimeout)))
	}
	return errs
}

// bytesLimit reads a size in bytes, 1 to most.
func bytesLimit(n *yaml.Node, key string, errf func(*yaml.Node, string, ...any), most int64) int64 {
	var v int64
	if n.Kind != yaml.ScalarNode || n.Decode(&v) != nil || v <= 0 || v > most {
		errf(n, "%s must be a whole number of bytes from 1 to %d, not %q", key, most, n.Value)
		return most
	}
	return v
}

// mapping walks a YAML mapping, reporting unknown and repeated keys.
func mapping(n *yaml.Node, what string, known []string, errf func(*yaml.Node, string, ...any), f func(key string, v *yaml.Node)) {
	if n.Kind != yaml.MappingNode {
		errf(n, "%s must be a mapping of keys to values", what)
		return
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		switch {
		case seen[k.Value]:
			errf(k, "%s: key %q appears twice", what, k.Value)
		case !contains(known, k.Value):
			errf(k, "%s: unknown key %q (known: %s)", what, k.Value, strings.Join(known, ", "))
		default:
			seen[k.Value] = true
			f(k.Value, v)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// resolveServeConfig merges defaults, the config file and the flags set on
// the command line.
func resolveServeConfig(e *env) (serverConfig, error) {
	set := map[string]bool{}
	e.flags.Visit(func(f *flag.Flag) { set[f.Name] = true })
	cfg := defaultServerConfig()
	src, err := os.ReadFile(e.opts.config)
	switch {
	case err == nil:
		if cfg, err = loadServerConfig(e.opts.config, src); err != nil {
			return cfg, usageErrorf("bad config file:\n  %v", err)
		}
	case errors.Is(err, fs.ErrNotExist) && !set["config"]:
		// The default file is optional.
	default:
		return cfg, usageErrorf("config file: %v", err)
	}
	if set["addr"] {
		cfg.Addr = e.opts.addr
	}
	if set["data-dir"] {
		cfg.DataDir = e.opts.dataDir
	}
	if set["tls-cert"] {
		cfg.TLSCert = e.opts.tlsCert
	}
	if set["tls-key"] {
		cfg.TLSKey = e.opts.tlsKey
	}
	if set["retain"] {
		d, err := parseRetention(e.opts.retain)
		if err != nil {
			return cfg, usageErrorf("--retain: %v", err)
		}
		cfg.Retention = d
	}
	if set["max-submit-body"] {
		if e.opts.maxSubmitBody <= 0 || e.opts.maxSubmitBody > orchestrator.DefaultMaxSubmitBody {
			return cfg, usageErrorf("--max-submit-body %d: want 1 to %d bytes", e.opts.maxSubmitBody, orchestrator.DefaultMaxSubmitBody)
		}
		cfg.MaxSubmitBody = e.opts.maxSubmitBody
	}
	if set["heap-floor"] {
		if e.opts.heapFloor < 0 || e.opts.heapFloor > heapfloor.FloorMax {
			return cfg, usageErrorf("--heap-floor %d: want 0 (off) to %d bytes", e.opts.heapFloor, int64(heapfloor.FloorMax))
		}
		cfg.HeapFloor = e.opts.heapFloor
	}
	if (cfg.TLSCert == "") != (cfg.TLSKey == "") {
		return cfg, usageErrorf("TLS needs both a certificate and a key (--tls-cert and --tls-key)")
	}
	if _, _, err := net.SplitHostPort(cfg.Addr); err != nil {
		return cfg, usageErrorf("listen address %q (--addr or addr:): want HOST:PORT, like 127.0.0.1:7420 or :7420", cfg.Addr)
	}
	if cfg.DataDir == "" {
		return cfg, usageErrorf("the data directory (--data-dir or data_dir:) is empty; name a directory")
	}
	spec, from := "", "$"+storeEnv
	if e.getenv != nil { // nil: a test resolving flags alone
		spec = e.getenv(storeEnv)
	}
	if set["store"] {
		spec, from = e.opts.store, "--store"
	}
	if cfg.StorePath, cfg.StoreDSN, err = parseStore(spec, cfg.DataDir); err != nil {
		return cfg, usageErrorf("%s: %v", from, err) // not echoed: a URL may carry a password
	}
	cfg.AdminTokenFile = filepath.Join(cfg.DataDir, adminTokenFile)
	if set["admin-token-file"] {
		if e.opts.adminTokenFile == "" {
			return cfg, usageErrorf("--admin-token-file is empty; name a file")
		}
		cfg.AdminTokenFile = e.opts.adminTokenFile
	}
	cfg.LeaderLease = defaultLeaderLease
	if set["leader-lease"] {
		if e.opts.leaderLease < minLeaderLease || e.opts.leaderLease > maxLeaderLease {
			return cfg, usageErrorf("--leader-lease %s: want %s to %s", e.opts.leaderLease, minLeaderLease, maxLeaderLease)
		}
		cfg.LeaderLease = e.opts.leaderLease
	}
	if set["advertise"] {
		if cfg.Advertise, err = advertiseURL(e.opts.advertise); err != nil {
			return cfg, usageErrorf("--advertise %v", err)
		}
	}
	if cfg.StoreDSN != "" {
		// SPEC §11, §14a: whichever orchestrator leads opens what the
		// others sealed, and takes the operators' admin token.
		for _, f := range []string{"secrets-key-file", "admin-token-file"} {
			if !set[f] || (f == "secrets-key-file" && e.opts.secretsKeyFile == "") {
				return cfg, usageErrorf("a PostgreSQL store needs --%s: every orchestrator sharing the store must use the same file "+
					"(created on the first start when missing; copy it to the other hosts before starting them)", f)
			}
		}
	} else if set["advertise"] || set["leader-lease"] {
		return cfg, usageErrorf("--advertise and --leader-lease are for a PostgreSQL store (--store postgres://…); a bbolt store has one orchestrator")
	}
	if set["max-conns"] {
		cfg.MaxConns = e.opts.maxConns
	}
	if set["max-unauth-conns"] {
		cfg.MaxUnauthConns = e.opts.maxUnauthConns
	}
	if set["max-unauth-conns-per-addr"] {
		cfg.MaxUnauthConnsPerAddr = e.opts.maxUnauthConnsPerAddr
	}
	if set["hello-timeout"] {
		cfg.HelloTimeout = e.opts.helloTimeout
	}
	cfg.MaxEventStreams = orchestrator.DefaultMaxEventStreams
	if set["max-event-streams"] {
		cfg.MaxEventStreams = e.opts.maxEventStreams
	}
	if set["ship-env"] {
		for _, p := range e.opts.shipEnv {
			if err := orchestrator.CheckShipEnvPattern(p); err != nil {
				return cfg, usageErrorf("--ship-env: %v", err)
			}
		}
		cfg.ShipEnv = e.opts.shipEnv
	}
	switch {
	case cfg.MaxEventStreams <= 0:
		return cfg, usageErrorf("--max-event-streams must be positive")
	case cfg.MaxConns <= 0 || cfg.MaxUnauthConns <= 0 || cfg.MaxUnauthConnsPerAddr <= 0:
		return cfg, usageErrorf("--max-conns, --max-unauth-conns and --max-unauth-conns-per-addr must be positive")
	case cfg.MaxUnauthConnsPerAddr > cfg.MaxUnauthConns:
		return cfg, usageErrorf("--max-unauth-conns-per-addr (%d) must not exceed --max-unauth-conns (%d)", cfg.MaxUnauthConnsPerAddr, cfg.MaxUnauthConns)
	case cfg.HelloTimeout < time.Second:
		return cfg, usageErrorf("--hello-timeout (%s) must be at least 1s: a worker on a slow link needs that to say hello", cfg.HelloTimeout)
	}
	flagLimits := e.opts.data
	for i, k := range dataLimitKeys(&flagLimits) {
		name := "data-" + strings.ReplaceAll(k.key, "_", "-")
		if !set[name] {
			continue
		}
		if *k.v <= 0 {
			return cfg, usageErrorf("--%s must be a positive whole number, not %d", name, *k.v)
		}
		*dataLimitKeys(&cfg.Data)[i].v = *k.v
	}
	for _, f := range []struct {
		name string
		v    *time.Duration
		flag time.Duration
	}{{"idle-timeout", &cfg.HTTP.IdleTimeout, e.opts.http.IdleTimeout}, {"header-timeout", &cfg.HTTP.HeaderTimeout, e.opts.http.HeaderTimeout},
		{"body-timeout", &cfg.HTTP.BodyTimeout, e.opts.http.BodyTimeout}, {"write-timeout", &cfg.HTTP.WriteTimeout, e.opts.http.WriteTimeout}} {
		if set[f.name] {
			if f.flag <= 0 {
				return cfg, usageErrorf("--%s must be a positive duration, not %s", f.name, f.flag)
			}
			*f.v = f.flag
		}
	}
	for _, f := range []struct {
		name string
		v    *int
		flag int
	}{{"max-tcp-conns", &cfg.HTTP.MaxTCPConns, e.opts.http.MaxTCPConns}, {"max-conns-per-addr", &cfg.HTTP.MaxConnsPerAddr, e.opts.http.MaxConnsPerAddr},
		{"refusals-per-sec", &cfg.HTTP.RefusalsPerSec, e.opts.http.RefusalsPerSec}, {"work-per-sec", &cfg.HTTP.WorkPerSec, e.opts.http.WorkPerSec}} {
		if set[f.name] {
			if f.flag < 0 {
				return cfg, usageErrorf("--%s must be 0 (the default) or a positive number, not %d", f.name, f.flag)
			}
			*f.v = f.flag
		}
	}
	return cfg, nil
}

func serve(ctx context.Context, e *env, _ []string) error {
	log, err := newLogger(e.stderr, e.opts.logFormat, e.opts.logLevel)
	if err != nil {
		return err
	}
	cfg, err := resolveServeConfig(e)
	if err != nil {
		return err
	}
	// Bind first (SPEC §12): a port in use must fail before anything is
	// created on disk or an admin token is printed.
	var tlsConf *tls.Config
	if cfg.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
		if err != nil {
			return usageErrorf("TLS certificate: %v", err)
		}
		tlsConf = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("cannot listen on %s: the address is already in use (another orchestrator, or another program, listens there); "+
				"stop it or choose another address with --addr or addr: in the config file; nothing was created", cfg.Addr)
		}
		return fmt.Errorf("cannot listen on %s: %w; nothing was created", cfg.Addr, err)
	}
	started := false
	defer func() {
		if !started {
			ln.Close()
		}
	}()
	if cfg.StoreDSN == "" || filepath.Dir(cfg.AdminTokenFile) == filepath.Clean(cfg.DataDir) {
		if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
			return fmt.Errorf("data dir: %w", err)
		}
	}
	tokenPath := cfg.AdminTokenFile
	token, created, err := ensureAdminTokenFile(tokenPath)
	if err != nil {
		return err
	}
	if created {
		fmt.Fprintf(e.stdout, "Admin token (saved to %s, mode 0600; printed only on this first start):\n  %s\n", tokenPath, token)
	} else if fi, err := os.Stat(tokenPath); err == nil && fi.Mode().Perm()&0o077 != 0 {
		log.Warn("admin token file is readable by other users; chmod 600 it", "path", tokenPath, "mode", fi.Mode().Perm().String())
	}
	storePath := cfg.StorePath
	shipped := orchestrator.ShipEnv(cfg.ShipEnv)
	if len(cfg.ShipEnv) > 0 {
		names := make([]string, 0, len(shipped))
		for k := range shipped {
			names = append(names, k)
		}
		sort.Strings(names)
		log.Info("every dispatch ships these variables of the orchestrator's environment (--ship-env; the denylist still applies)",
			"patterns", strings.Join(cfg.ShipEnv, ","), "names", strings.Join(names, ","))
	}
	opts := orchestrator.Options{
		Addr:      cfg.Addr,
		Listener:  ln,
		StorePath: storePath,
		// SPEC §14a: empty means the file next to the store.
		SecretsKeyFile: e.opts.secretsKeyFile,
		Config: core.Config{
			HeartbeatTimeout:  cfg.HeartbeatTimeout,
			SweepInterval:     cfg.SweepInterval,
			UnmatchedTimeout:  cfg.UnmatchedTimeout,
			HeartbeatInterval: cfg.HeartbeatInterval,
			DispatchAck:       cfg.DispatchAck,
			Retention:         cfg.Retention,
			Env:               shipped, // none unless --ship-env (SPEC §8)
		},
		Logger:        log,
		AdminToken:    token,
		MetricsToken:  cmp.Or(e.opts.metricsToken, e.getenv(metricsTokenEnv)),
		TLS:           tlsConf,
		MaxSubmitBody: cfg.MaxSubmitBody,
		// Control-plane admission (SPEC §12).
		MaxConns:              cfg.MaxConns,
		MaxUnauthConns:        cfg.MaxUnauthConns,
		MaxUnauthConnsPerAddr: cfg.MaxUnauthConnsPerAddr,
		HelloTimeout:          cfg.HelloTimeout,
		MaxEventStreams:       cfg.MaxEventStreams,
		// The HTTP server's limits (SPEC §12).
		IdleTimeout:     cfg.HTTP.IdleTimeout,
		HeaderTimeout:   cfg.HTTP.HeaderTimeout,
		BodyTimeout:     cfg.HTTP.BodyTimeout,
		WriteTimeout:    cfg.HTTP.WriteTimeout,
		MaxTCPConns:     cfg.HTTP.MaxTCPConns,
		MaxConnsPerAddr: cfg.HTTP.MaxConnsPerAddr,
		RefusalsPerSec:  cfg.HTTP.RefusalsPerSec,
		WorkPerSec:      cfg.HTTP.WorkPerSec,
	}
	cfg.Data.apply(&opts)
	if cfg.HeapFloor > 0 {
		if stop, err := heapfloor.Start(uint64(cfg.HeapFloor)); err != nil { // ErrStarted: another serve in this process (a test's) keeps one
			log.Warn("heap floor not kept", "err", err)
		} else {
			defer stop()
		}
	}
	if e.opts.pprof != "" {
		at, stop, err := servePprof(e.opts.pprof, log)
		if err != nil {
			return err
		}
		defer stop()
		log.Info("runtime profiles", "url", "http://"+at+"/debug/pprof/")
	}
	if cfg.StoreDSN != "" {
		started = true // serveLeading owns the listener
		return serveLeading(ctx, e, log, cfg, ln, opts)
	}
	d, err := orchestrator.Start(opts)
	started = true // Start closed the listener if it failed
	if err != nil {
		return err
	}
	log.Info("recovery sweeper", "heartbeat_timeout", cfg.HeartbeatTimeout.String(), "sweep_interval", cfg.SweepInterval.String(),
		"unmatched_step_timeout", cfg.UnmatchedTimeout.String(), "heartbeat_interval", cfg.HeartbeatInterval.String(),
		"dispatch_ack", cfg.DispatchAck.String(), "retention", cfg.Retention.String())
	fmt.Fprintf(e.stdout, "Tether orchestrator listening on %s (store %s)\n  workers connect to: %s\n  operator API:       %s\n  data plane:         %s\n",
		d.Addr(), storePath, d.URL(), d.APIURL(), d.DataURL())
	fmt.Fprintf(e.stdout, "  status page:        %s/ (log in with the admin token; SPEC §18)\n", d.DataURL())
	select {
	case <-ctx.Done():
		log.Info("shutting down", "reason", "signal")
		sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		if err := d.Shutdown(sctx); err != nil {
			return fmt.Errorf("shutdown: %w", err)
		}
		log.Info("orchestrator stopped")
		return nil
	case <-d.Done():
		if err := d.Close(); err != nil {
			return fmt.Errorf("orchestrator stopped: %w", err)
		}
		return errors.New("orchestrator stopped unexpectedly")
	}
}

// ensureAdminToken returns the admin token of dataDir, creating it (256
// random bits, hex, file mode 0600) if there is none; created says so.
// Creation is atomic and exclusive: a temp file is linked into place.
func ensureAdminToken(dataDir string) (token string, created bool, err error) {
	return ensureAdminTokenFile(filepath.Join(dataDir, adminTokenFile))
}

// ensureAdminTokenFile is ensureAdminToken of the file at path.
func ensureAdminTokenFile(path string) (token string, created bool, err error) {
	dataDir := filepath.Dir(path)
	if tok, err := readAdminToken(path); err == nil {
		return tok, false, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", false, err
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", false, fmt.Errorf("admin token: %w", err)
	}
	tok := hex.EncodeToString(b[:])
	tmp, err := os.CreateTemp(dataDir, ".admin-token-*")
	if err != nil {
		return "", false, fmt.Errorf("admin token: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return "", false, fmt.Errorf("admin token: %w", err)
	}
	_, werr := io.WriteString(tmp, tok+"\n")
	serr := tmp.Sync()
	if cerr := tmp.Close(); werr == nil && serr == nil && cerr != nil {
		werr = cerr
	}
	if werr != nil || serr != nil {
		return "", false, fmt.Errorf("admin token: write %s: %w", tmp.Name(), errors.Join(werr, serr))
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) { // another process won the race
			tok, err := readAdminToken(path)
			return tok, false, err
		}
		return "", false, fmt.Errorf("admin token: %w", err)
	}
	return tok, true, nil
}

// readAdminToken reads an admin token file.
func readAdminToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	tok := string(bytes.TrimSpace(b))
	if tok == "" {
		return "", fmt.Errorf("admin token file %s is empty", path)
	}
	return tok, nil
}

// minRetention is the shortest retention serve accepts: shorter would prune
// a run's history before an operator could look at it.
const minRetention = time.Minute

// parseRetention reads a retention: a Go duration (720h, 90m) or a whole
// number of days (30d), at least a minute.
func parseRetention(s string) (time.Duration, error) {
	var d time.Duration
	if n, ok := strings.CutSuffix(s, "d"); ok {
		days, err := strconv.Atoi(n)
		if err != nil || days <= 0 || days > 100*365 {
			return 0, fmt.Errorf("%q: want a duration like 720h or a number of days like 30d", s)
		}
		d = time.Duration(days) * 24 * time.Hour
	} else {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			return 0, fmt.Errorf("%q: want a duration like 720h or a number of days like 30d", s)
		}
	}
	if d < minRetention {
		return 0, fmt.Errorf("%q: at least %s", s, minRetention)
	}
	return d, nil
}

// parseStore resolves a store's name (--store, $TETHER_STORE; SPEC §11) to
// the bbolt file it names (empty means <dataDir>/tether.db) or the
// PostgreSQL database's connection URL.
func parseStore(spec, dataDir string) (path, dsn string, err error) {
	switch {
	case spec == "":
		return filepath.Join(dataDir, storeFile), "", nil
	case strings.HasPrefix(spec, "bbolt:"):
		path := strings.TrimPrefix(spec, "bbolt:")
		if path == "" {
			return "", "", errors.New("bbolt: names no file; want bbolt:PATH")
		}
		return path, "", nil
	case strings.HasPrefix(spec, "postgres://"), strings.HasPrefix(spec, "postgresql://"):
		if _, err := pgxpool.ParseConfig(spec); err != nil {
			return "", "", errors.New("the URL does not parse as a PostgreSQL connection string")
		}
		return "", spec, nil
	}
	return "", "", errors.New("unknown kind of store; want bbolt:PATH or postgres://…")
}
