package orchestrator_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tether-run/tether/adapters/logging"
	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/adapters/worker"
	"github.com/tether-run/tether/core"
)

// get sends one GET (with a bearer token unless it is empty) and returns
// the status and body.
func get(t *testing.T, ctx context.Context, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// runWorker enrolls and runs one worker (cfg with a fresh token named
// after it) until the returned function stops it.
func runWorker(t *testing.T, ctx context.Context, d *orchestrator.Driver, log *slog.Logger, cfg core.WorkerConfig) (stop func()) {
	t.Helper()
	tok, err := d.CreateToken(ctx, cfg.Name, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Token = tok
	w, err := worker.New(worker.Options{URL: d.URL(), Logger: log, Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); w.Run(wctx) }()
	return func() { cancel(); <-done }
}

// TestHealthProbes: /livez and /readyz answer 200 in plain text while the
// driver serves, without any token; only GET and HEAD are probes.
func TestHealthProbes(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	d, err := orchestrator.Start(orchestrator.Options{
		Addr: "127.0.0.1:0", StorePath: filepath.Join(t.TempDir(), "tether.db"),
		Logger: testLogger(t), AdminToken: adminToken, MetricsToken: "m",
	})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for _, path := range []string{"/livez", "/readyz"} {
		code, body := get(t, ctx, d.DataURL()+path, "")
		if code != http.StatusOK || body != "ok\n" {
			t.Errorf("GET %s = %d %q, want 200 \"ok\\n\"", path, code, body)
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, d.DataURL()+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("POST %s = %d, want 405", path, resp.StatusCode)
		}
	}
}

// series parses Prometheus text exposition into value by series
// ("name{labels}" exactly as exposed, or "name").
func series(t *testing.T, text string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// TestMetricsAfterARun runs steps on a real worker (one over its output
// cap), holds a gate, has the data plane refuse one request, and scrapes
// /metrics: the token is required when set, the gauges count the live
// steps by state, and the counters and histograms saw the grants, the
// starts, the commits and the dropped output.
func TestMetricsAfterARun(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	const token = "metrics-secret"
	d, err := orchestrator.Start(orchestrator.Options{
		Addr: "127.0.0.1:0", StorePath: filepath.Join(t.TempDir(), "tether.db"),
		Logger: testLogger(t), MetricsToken: token,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	defer runWorker(t, ctx, d, testLogger(t).With("side", "worker"), core.WorkerConfig{Name: "w1", OutputCapBytes: 100})()

	run, err := d.Submit(ctx, core.RunSpec{Name: "metrics", Steps: []core.StepSpec{
		{Name: "a", Command: "echo a"},
		{Name: "loud", Command: "for i in $(seq 10 29); do echo line-$i-of-some-output; done"},
		{Name: "gate", Command: "echo gate", Hold: true, DependsOn: []string{"a", "loud"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, d, "a and loud done, gate held", func(o view) bool {
		s, _ := o.StepByID(core.StepID(run + "/gate"))
		a, _ := o.StepByID(core.StepID(run + "/a"))
		l, _ := o.StepByID(core.StepID(run + "/loud"))
		return s.State == core.StateHeld && a.State == core.StateSuccess && l.State == core.StateSuccess
	})
	if code, _ := get(t, ctx, d.DataURL()+"/data/x", ""); code != http.StatusUnauthorized {
		t.Fatalf("GET /data/x without a credential = %d, want 401", code)
	}

	for _, bad := range []string{"", "wrong"} {
		if code, _ := get(t, ctx, d.DataURL()+"/metrics", bad); code != http.StatusUnauthorized {
			t.Errorf("GET /metrics with token %q = %d, want 401", bad, code)
		}
	}
	code, body := get(t, ctx, d.DataURL()+"/metrics", token)
	if code != http.StatusOK {
		t.Fatalf("GET /metrics = %d %s", code, body)
	}
	m := series(t, body)
	want := map[string]float64{
		`tether_steps{state="success"}`:                              2,
		`tether_steps{state="held"}`:                                 1,
		`tether_steps{state="queued"}`:                               0,
		`tether_runs{state="running"}`:                               1,
		`tether_queue_depth`:                                         0,
		`tether_workers_connected`:                                   1,
		`tether_workers_recovering`:                                  0,
		`tether_leases_in_grace`:                                     0,
		`tether_lease_grants_total`:                                  2,
		`tether_dispatch_latency_seconds_count`:                      2,
		`tether_submit_to_start_seconds_count`:                       2,
		`tether_data_plane_refusals_total{reason="unauthenticated"}`: 1,
		`tether_data_plane_refusals_total{reason="out_of_range"}`:    0, // named, and there from the start
	}
	for k, v := range want {
		if got, ok := m[k]; !ok || got != v {
			t.Errorf("%s = %v (exposed: %v), want %v", k, got, ok, v)
		}
	}
	// The loud step printed 20 lines of 23 bytes (with the newline) against
	// a cap of 100 bytes: 4 fit, 16 were dropped and counted.
	if got := m[`tether_log_lines_dropped_total{reason="output_cap"}`]; got != 16 {
		t.Errorf("log lines dropped over the output cap = %v, want 16", got)
	}
	if got := m[`tether_log_bytes_dropped_total{reason="output_cap"}`]; got != 16*23 {
		t.Errorf("log bytes dropped over the output cap = %v, want %d", got, 16*23)
	}
	for _, k := range []string{"tether_commit_duration_seconds_count", "tether_commit_batch_records_sum", "tether_data_plane_bytes_total{direction=\"out\"}", "go_goroutines"} {
		if m[k] <= 0 {
			t.Errorf("%s = %v, want > 0", k, m[k])
		}
	}
	if _, ok := m["process_resident_memory_bytes"]; !ok {
		t.Errorf("the process collector's process_resident_memory_bytes is not exposed")
	}
}

// jsonLines decodes a JSON log, one object per line; a line that is not
// JSON fails the test.
func jsonLines(t *testing.T, who, text string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("%s: log line %q is not JSON: %v", who, line, err)
		}
		out = append(out, m)
	}
	return out
}

// TestLogFieldsJSON: with the JSON logger both binaries use (--log-format
// json), the lines about a lease carry "lease", "step" and "run" (the
// worker's, its "worker_id" too) on both sides, with the right values
// (SPEC §16): a step that runs, and one the orchestrator cancels.
func TestLogFieldsJSON(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	var olog, wlog lockedBuffer
	ol, err := logging.New(&olog, "json", "info")
	if err != nil {
		t.Fatal(err)
	}
	wl, _ := logging.New(&wlog, "json", "info")
	d, err := orchestrator.Start(orchestrator.Options{Addr: "127.0.0.1:0", StorePath: filepath.Join(t.TempDir(), "tether.db"), Logger: ol})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	stopWorker := runWorker(t, ctx, d, wl, core.WorkerConfig{Name: "w1"})

	run, err := d.Submit(ctx, core.RunSpec{Name: "logs", Steps: []core.StepSpec{
		{Name: "a", Command: "echo a"},
		{Name: "slow", Command: "sleep 30", DependsOn: []string{"a"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	slow := core.StepID(run + "/slow")
	waitFor(t, ctx, d, "slow running", func(o view) bool { s, _ := o.StepByID(slow); return s.State == core.StateRunning })
	if err := d.CancelRun(ctx, run, "test over"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, d, "run finished", finished(run))
	stopWorker()

	var workerID string
	seen := map[string]bool{}
	for _, m := range jsonLines(t, "worker", wlog.String()) {
		msg, _ := m["msg"].(string)
		if id, ok := m["worker_id"].(string); !ok || id == "" {
			t.Errorf("worker line %v has no worker_id", m)
		} else {
			workerID = id
		}
		_, hasLease := m["lease"]
		if strings.Contains(msg, "lease ") && !hasLease {
			t.Errorf("worker line about a lease lacks the lease field: %v", m)
		}
		if !hasLease {
			continue
		}
		if _, ok := m["lease"].(float64); !ok {
			t.Errorf("worker line %v: lease is not a number", m)
		}
		step, _ := m["step"].(string)
		if (step != string(run)+"/a" && step != string(slow)) || m["run"] != string(run) {
			t.Errorf("worker line %v: step %q run %v, want a step of %s", m, step, m["run"], run)
		}
		seen[msg] = true
	}
	for _, msg := range []string{"step process started", "step process exited", "signalling step"} {
		if !seen[msg] {
			t.Errorf("no worker line %q with a lease's fields", msg)
		}
	}
	if !slices.ContainsFunc(slices.Collect(maps.Keys(seen)), func(s string) bool { return strings.Contains(s, "cancelled by orchestrator") }) {
		t.Errorf("the core's line about the cancelled lease lacks its fields; lines with them: %v", seen)
	}

	enrolled := false
	for _, m := range jsonLines(t, "orchestrator", olog.String()) {
		if l, ok := m["lease"]; ok {
			if _, ok := l.(float64); !ok {
				t.Errorf("orchestrator line %v: lease is not a number", m)
			}
		}
		switch m["msg"] {
		case "worker enrolled":
			enrolled = m["worker_id"] == workerID
		case "server event":
			if m["run"] != string(run) {
				t.Errorf("server event %v lacks its run", m)
			}
		}
	}
	if !enrolled {
		t.Errorf("no orchestrator line \"worker enrolled\" with worker_id %q", workerID)
	}
}
