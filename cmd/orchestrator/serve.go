package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/core"
)

// Defaults of serve.
const (
	defaultAddr       = "127.0.0.1:7420"
	defaultDataDir    = "./tether-data"
	defaultConfigFile = "server-config.yaml"
	adminTokenFile    = "admin-token"
	storeFile         = "tether.db"
	shutdownTimeout   = 10 * time.Second
	maxConfigSize     = 1 << 20
)

var serveCmd = &command{
	path:  "serve",
	short: "run the orchestrator: control plane, operator API and store",
	long: `Run the orchestrator in the foreground until SIGINT or SIGTERM.

It keeps all durable state in <data-dir>/tether.db (bbolt; an existing file is
restored: in-flight steps wait for their workers to reconnect) and listens on
--addr for workers (WebSocket at /control, the HTTP/2 data plane at /data/ and
/bundle/) and operators (HTTP JSON API under /api/). On the first start it
creates an admin token in <data-dir>/admin-token (mode 0600) and prints it
once; client commands read that file.

Without a certificate everything is cleartext: HTTP/1.1 and HTTP/2 with prior
knowledge (h2c). With --tls-cert and --tls-key (PEM files) everything is TLS,
HTTP/2 negotiated by ALPN: workers then connect to wss://HOST:PORT/control
(with 'worker connect --ca FILE' for a private CA) and clients use
https://HOST:PORT (with --ca FILE).

The optional config file (YAML) may set addr, data_dir (relative to the
file's directory) and the recovery sweeper's knobs (SPEC §5):

  addr: 127.0.0.1:7420
  data_dir: ./tether-data
  tls:                                # optional; paths relative to the file's directory
    cert_file: tls/server.crt
    key_file: tls/server.key
  recovery:
    heartbeat_timeout_secs: 120       # a silent worker is stale after this
    sweep_interval_secs: 60           # how often the sweeper runs
    unmatched_step_timeout_secs: 30   # a queued step no worker can take fails after this
    heartbeat_interval_secs: 30       # workers heartbeat this often; silent for 2 intervals, no new work
    dispatch_ack_secs: 10             # a dispatch not started or rejected by then is requeued
  http:                               # the HTTP server's limits (SPEC §12); flags of the same names
    idle_timeout_secs: 120            # an idle keep-alive or HTTP/2 connection is closed
    header_timeout_secs: 10           # TLS handshake, request headers, h2c preface
    body_timeout_secs: 30             # an operator API request body
    write_timeout_secs: 30            # a write the peer accepts no byte of for this long closes it
    max_tcp_conns: 3072               # concurrent connections (default: 1024 control + 2048)
    max_conns_per_addr: 2304          # of one source address (default: 3/4 of max_tcp_conns)

Flags given on the command line override the file; an unknown key is an
error naming its line. The sweeper is always on.

Shutdown (SIGINT/SIGTERM) stops accepting requests, lets operator requests in
progress finish, commits what is already queued, closes every worker's
connection with a going-away close frame (1001), and exits 0: nothing already
answered is lost, and workers keep running their steps and reconnect to the
next start within their grace window. SIGHUP is ignored.`,
	example: `  orchestrator serve --data-dir /var/lib/tether --addr 0.0.0.0:7420
  orchestrator serve --config /etc/tether/server-config.yaml --log-format json`,
	nargs: 0,
	flags: func(fs *flag.FlagSet, o *options) {
		fs.StringVar(&o.addr, "addr", defaultAddr, "listen `address` for workers (/control) and the operator API (/api/)")
		fs.StringVar(&o.dataDir, "data-dir", defaultDataDir, "`directory` of the store (tether.db) and the admin token")
		fs.StringVar(&o.config, "config", defaultConfigFile, "server config `file` (YAML); optional unless given explicitly")
		fs.StringVar(&o.tlsCert, "tls-cert", "", "serve TLS with this certificate `file` (PEM, the chain); needs --tls-key")
		fs.StringVar(&o.tlsKey, "tls-key", "", "the TLS private key `file` (PEM)")
		httpFlags(fs, &o.http)
	},
	run: serve,
}

// serverConfig is the config file, with defaults filled in.
type serverConfig struct {
	Addr              string
	DataDir           string
	TLSCert, TLSKey   string // both or neither
	HeartbeatTimeout  time.Duration
	SweepInterval     time.Duration
	UnmatchedTimeout  time.Duration
	HeartbeatInterval time.Duration
	DispatchAck       time.Duration
	HTTP              httpLimits
}

// httpLimits are the HTTP server's limits (SPEC §12); zero means the
// orchestrator's default.
type httpLimits struct {
	IdleTimeout, HeaderTimeout, BodyTimeout, WriteTimeout time.Duration
	MaxTCPConns, MaxConnsPerAddr                          int
}

// httpFlags defines serve's flags for the HTTP server's limits.
func httpFlags(fs *flag.FlagSet, h *httpLimits) {
	fs.DurationVar(&h.IdleTimeout, "idle-timeout", orchestrator.DefaultIdleTimeout, "close a keep-alive or HTTP/2 connection idle for this `duration`")
	fs.DurationVar(&h.HeaderTimeout, "header-timeout", orchestrator.DefaultHeaderTimeout, "a TLS handshake, a request's headers or an h2c preface must arrive within this `duration`")
	fs.DurationVar(&h.BodyTimeout, "body-timeout", orchestrator.DefaultBodyTimeout, "an operator API request body must arrive within this `duration`")
	fs.DurationVar(&h.WriteTimeout, "write-timeout", orchestrator.DefaultWriteTimeout, "close a connection (reset an HTTP/2 stream) whose peer accepts nothing of a write for this `duration`")
	fs.IntVar(&h.MaxTCPConns, "max-tcp-conns", 0, "cap on concurrent TCP connections (`n`; 0: 1024 control connections + 2048); over it a connection is refused at once")
	fs.IntVar(&h.MaxConnsPerAddr, "max-conns-per-addr", 0, "cap on one source address's TCP connections (`n`; 0: 3/4 of --max-tcp-conns)")
}

func defaultServerConfig() serverConfig {
	d := core.DefaultConfig()
	return serverConfig{
		Addr: defaultAddr, DataDir: defaultDataDir,
		HeartbeatTimeout: d.HeartbeatTimeout, SweepInterval: d.SweepInterval, UnmatchedTimeout: d.UnmatchedTimeout,
		HeartbeatInterval: d.HeartbeatInterval, DispatchAck: d.DispatchAck,
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
	mapping(doc.Content[0], "server config", []string{"addr", "data_dir", "tls", "recovery", "http"}, errf, func(key string, v *yaml.Node) {
		switch key {
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
		case "http":
			known := []string{"idle_timeout_secs", "header_timeout_secs", "body_timeout_secs", "write_timeout_secs", "max_tcp_conns", "max_conns_per_addr"}
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
				}
			})
		}
	})
	if len(errs) == 0 && cfg.HeartbeatInterval >= cfg.HeartbeatTimeout {
		errs = append(errs, fmt.Sprintf("%s: recovery: heartbeat_interval_secs (%s) must be shorter than heartbeat_timeout_secs (%s)",
			path, cfg.HeartbeatInterval, cfg.HeartbeatTimeout))
	}
	if len(errs) > 0 {
		return cfg, errors.New(strings.Join(errs, "\n  "))
	}
	return cfg, nil
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
	if (cfg.TLSCert == "") != (cfg.TLSKey == "") {
		return cfg, usageErrorf("TLS needs both a certificate and a key (--tls-cert and --tls-key)")
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
	}{{"max-tcp-conns", &cfg.HTTP.MaxTCPConns, e.opts.http.MaxTCPConns}, {"max-conns-per-addr", &cfg.HTTP.MaxConnsPerAddr, e.opts.http.MaxConnsPerAddr}} {
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
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	token, created, err := ensureAdminToken(cfg.DataDir)
	if err != nil {
		return err
	}
	tokenPath := filepath.Join(cfg.DataDir, adminTokenFile)
	if created {
		fmt.Fprintf(e.stdout, "Admin token (saved to %s, mode 0600; printed only on this first start):\n  %s\n", tokenPath, token)
	} else if fi, err := os.Stat(tokenPath); err == nil && fi.Mode().Perm()&0o077 != 0 {
		log.Warn("admin token file is readable by other users; chmod 600 it", "path", tokenPath, "mode", fi.Mode().Perm().String())
	}
	var tlsConf *tls.Config
	if cfg.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
		if err != nil {
			return usageErrorf("TLS certificate: %v", err)
		}
		tlsConf = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	storePath := filepath.Join(cfg.DataDir, storeFile)
	d, err := orchestrator.Start(orchestrator.Options{
		Addr:      cfg.Addr,
		StorePath: storePath,
		Config: core.Config{
			HeartbeatTimeout:  cfg.HeartbeatTimeout,
			SweepInterval:     cfg.SweepInterval,
			UnmatchedTimeout:  cfg.UnmatchedTimeout,
			HeartbeatInterval: cfg.HeartbeatInterval,
			DispatchAck:       cfg.DispatchAck,
			Env:               orchestrator.EnvSnapshot(),
		},
		Logger:     log,
		AdminToken: token,
		TLS:        tlsConf,

		// The HTTP server's limits (SPEC §12).
		IdleTimeout:     cfg.HTTP.IdleTimeout,
		HeaderTimeout:   cfg.HTTP.HeaderTimeout,
		BodyTimeout:     cfg.HTTP.BodyTimeout,
		WriteTimeout:    cfg.HTTP.WriteTimeout,
		MaxTCPConns:     cfg.HTTP.MaxTCPConns,
		MaxConnsPerAddr: cfg.HTTP.MaxConnsPerAddr,
	})
	if err != nil {
		return err
	}
	log.Info("recovery sweeper", "heartbeat_timeout", cfg.HeartbeatTimeout.String(), "sweep_interval", cfg.SweepInterval.String(),
		"unmatched_step_timeout", cfg.UnmatchedTimeout.String(), "heartbeat_interval", cfg.HeartbeatInterval.String(),
		"dispatch_ack", cfg.DispatchAck.String())
	fmt.Fprintf(e.stdout, "Tether orchestrator listening on %s (store %s)\n  workers connect to: %s\n  operator API:       %s\n  data plane:         %s\n",
		d.Addr(), storePath, d.URL(), d.APIURL(), d.DataURL())
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
	path := filepath.Join(dataDir, adminTokenFile)
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
