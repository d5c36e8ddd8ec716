package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/adapters/worker"
	"github.com/tether-run/tether/client"
	"github.com/tether-run/tether/core"
)

const cliToken = "cli-test-admin-token-0123456789abcdef"

// cliWorld is an orchestrator in the test's process with one worker, and
// the command line run against it in-process.
type cliWorld struct {
	t   *testing.T
	ctx context.Context
	d   *orchestrator.Driver
	dir string
}

func newCLIWorld(t *testing.T, withWorker bool) *cliWorld {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	d, err := orchestrator.Start(orchestrator.Options{
		Addr: "127.0.0.1:0", StorePath: filepath.Join(t.TempDir(), "tether.db"), AdminToken: cliToken,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	if withWorker {
		tok, err := d.CreateToken(ctx, "w1", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		w, err := worker.New(worker.Options{URL: d.URL(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			Config: core.WorkerConfig{Name: "w1", Token: tok}})
		if err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); w.Run(wctx) }()
		t.Cleanup(func() { wcancel(); <-done })
	}
	return &cliWorld{t: t, ctx: ctx, d: d, dir: t.TempDir()}
}

// cli runs the command line with this orchestrator's URL and admin token
// and returns its output and exit code.
func (w *cliWorld) cli(args ...string) (stdout, stderr string, code int) {
	w.t.Helper()
	var out, errb syncBuffer
	code = run(w.ctx, append(args, "--url", w.d.DataURL(), "--admin-token", cliToken), &out, &errb, func(string) string { return "" })
	return out.String(), errb.String(), code
}

func (w *cliWorld) must(want int, args ...string) string {
	w.t.Helper()
	out, errOut, code := w.cli(args...)
	if code != want {
		w.t.Fatalf("%q: exit %d, want %d\nstdout: %s\nstderr: %s", args, code, want, out, errOut)
	}
	return out
}

// workflow writes a one-file workflow and returns its path.
func (w *cliWorld) workflow(name, steps string) string {
	w.t.Helper()
	p := filepath.Join(w.dir, name+".yaml")
	if err := os.WriteFile(p, []byte("name: "+name+"\nsteps:\n"+steps), 0o600); err != nil {
		w.t.Fatal(err)
	}
	return p
}

// waitStatus waits for the run's status.
func (w *cliWorld) waitStatus(run, status string) {
	w.t.Helper()
	poll(w.t, w.ctx, run+" to be "+status, func() bool {
		var det client.RunDetail
		json.Unmarshal([]byte(w.must(exitOK, "run", "show", run, "-o", "json")), &det)
		return det.Status == status
	})
}

// run show --exit-status and run submit --wait exit with the run's
// outcome: 0 success, 10 failed, 11 cancelled, and (show) 12 while it has
// not ended.
func TestRunOutcomeExitCodes(t *testing.T) {
	w := newCLIWorld(t, true)
	ok := w.workflow("ok", "  - name: a\n    run: echo fine\n")
	bad := w.workflow("bad", "  - name: a\n    run: exit 7\n")
	held := w.workflow("held", "  - name: a\n    run: echo never\n    hold: true\n")

	// --wait: the run id on stdout, the outcome as the exit code.
	if out := w.must(exitOK, "run", "submit", ok, "--wait"); strings.TrimSpace(out) != "run-1" {
		t.Errorf("submit --wait printed %q on stdout, want only the run id", out)
	}
	w.must(exitRunFailed, "run", "submit", bad, "--wait")
	var out, errb syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(w.ctx, []string{"run", "submit", held, "--wait", "--url", w.d.DataURL(), "--admin-token", cliToken}, &out, &errb, func(string) string { return "" })
	}()
	poll(t, w.ctx, "the held run's id", func() bool { return strings.TrimSpace(out.String()) == "run-3" })
	w.waitStatus("run-3", "running")
	w.must(exitRunUnfinished, "run", "show", "run-3", "--exit-status")
	w.must(exitOK, "run", "cancel", "run-3")
	if code := <-done; code != exitRunCancelled {
		t.Errorf("submit --wait of a cancelled run: exit %d, want %d\n%s", code, exitRunCancelled, errb.String())
	}
	if !strings.Contains(errb.String(), "run-3/a") || !strings.Contains(errb.String(), "run run-3 cancelled") {
		t.Errorf("submit --wait did not show the steps and the outcome on stderr:\n%s", errb.String())
	}

	for run, want := range map[string]int{"run-1": exitOK, "run-2": exitRunFailed, "run-3": exitRunCancelled} {
		w.must(want, "run", "show", run, "--exit-status")
		w.must(exitOK, "run", "show", run) // without the flag: 0
	}
	w.must(exitRefused, "run", "show", "run-42", "--exit-status")
}

// run logs --follow prints a line the step writes after the follower
// started, and ends (exit 0) when the run ends; run watch prints each
// step's states once each, in order, then the outcome.
func TestFollowAndWatch(t *testing.T) {
	w := newCLIWorld(t, true)
	gate := filepath.Join(w.dir, "go")
	wf := w.workflow("slow", fmt.Sprintf("  - name: first\n    run: echo early\n  - name: later\n    depends_on: [first]\n    run: |\n      echo before\n      while [ ! -e %s ]; do sleep 0.02; done\n      echo after-the-gate\n", gate))
	run1 := strings.TrimSpace(w.must(exitOK, "run", "submit", wf))

	type result struct {
		code     int
		out, err *syncBuffer
	}
	follow := func(args ...string) chan result {
		ch := make(chan result, 1)
		out, errb := &syncBuffer{}, &syncBuffer{}
		go func() {
			code := run(w.ctx, append(args, "--url", w.d.DataURL(), "--admin-token", cliToken), out, errb, func(string) string { return "" })
			ch <- result{code, out, errb}
		}()
		return ch
	}
	logsOut := &syncBuffer{}
	logsDone := make(chan int, 1)
	go func() {
		logsDone <- run(w.ctx, []string{"run", "logs", run1, "--follow", "--url", w.d.DataURL(), "--admin-token", cliToken}, logsOut, io.Discard, func(string) string { return "" })
	}()
	watchDone := follow("run", "watch", run1)
	only := follow("run", "logs", run1, "-f", "--step", "first")
	poll(t, w.ctx, "the follower to print the line before the gate", func() bool { return strings.Contains(logsOut.String(), "before") })
	if strings.Contains(logsOut.String(), "after-the-gate") {
		t.Fatal("the line after the gate came before the gate opened")
	}
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if code := <-logsDone; code != exitOK {
		t.Fatalf("run logs --follow: exit %d", code)
	}
	logs := logsOut.String()
	for _, want := range []string{run1 + "/first | early", run1 + "/later | before", run1 + "/later | after-the-gate"} {
		if !strings.Contains(logs, want) {
			t.Errorf("run logs --follow lacks %q:\n%s", want, logs)
		}
	}
	if strings.Index(logs, "before") > strings.Index(logs, "after-the-gate") {
		t.Errorf("lines out of order:\n%s", logs)
	}
	if r := <-only; r.code != exitOK || !strings.Contains(r.out.String(), "early") || strings.Contains(r.out.String(), "before") {
		t.Errorf("run logs -f --step first: exit %d:\n%s%s", r.code, r.out, r.err)
	}

	r := <-watchDone
	if r.code != exitOK {
		t.Fatalf("run watch: exit %d\n%s", r.code, r.err)
	}
	lines := strings.Split(strings.TrimSpace(r.out.String()), "\n")
	if last := lines[len(lines)-1]; last != "run "+run1+" success" {
		t.Errorf("run watch ends with %q, want the outcome", last)
	}
	order := []string{"pending", "queued", "running", "success"}
	seen := map[string][]string{}
	for _, l := range lines[:len(lines)-1] {
		f := strings.Fields(l)
		seen[f[0]] = append(seen[f[0]], f[1])
	}
	for _, step := range []string{run1 + "/first", run1 + "/later"} {
		states := seen[step]
		// each state once, in the order of the table, ending in success
		pos := -1
		for _, s := range states {
			i := slices.Index(order, s)
			if i <= pos {
				t.Errorf("step %s: states %q: %q repeated or out of order", step, states, s)
			}
			pos = i
		}
		if len(states) == 0 || states[len(states)-1] != "success" {
			t.Errorf("step %s: states %q, want them to end in success", step, states)
		}
	}
	if !slices.Contains(seen[run1+"/later"], "running") {
		t.Errorf("run watch did not see the gated step running: %q", seen[run1+"/later"])
	}
	w.must(exitRefused, "run", "logs", run1, "--follow", "--step", "ghost")
}

// Against a stream that breaks mid-run (it closes before "end", and the
// reopened stream repeats the snapshot's states), run watch prints each
// state once, and run logs --follow prints each line once, gap markers
// included, resuming with the last id heard.
func TestFollowReconnects(t *testing.T) {
	var mu sync.Mutex
	var ids []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n := len(ids)
		ids = append(ids, r.Header.Get("Last-Event-ID"))
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		step := func(state, id string) string {
			return fmt.Sprintf("event: step\nid: %s\ndata: {\"run\":\"run-1\",\"step\":\"run-1/a\",\"state\":%q,\"attempts\":1,\"worker\":\"w-1\",\"lease\":1}\n\n", id, state)
		}
		line := func(kind, text, id string) string {
			return fmt.Sprintf("event: %s\nid: %s\ndata: {\"run\":\"run-1\",\"step\":\"run-1/a\",\"lease\":1,\"at\":\"2026-01-01T00:00:00Z\",\"text\":%q}\n\n", kind, id, text)
		}
		if n%2 == 0 { // the first connection of each command: breaks
			io.WriteString(w, step("queued", "0:")+step("running", "0:")+"event: run\nid: 0:\ndata: {\"run\":\"run-1\",\"status\":\"running\"}\n\n"+
				line("log", "one", "0:1.1")+line("gap", "--- Orchestrator offline for 3s", "0:1.2"))
			return
		}
		io.WriteString(w, step("running", "0:1.2")+"event: run\nid: 0:1.2\ndata: {\"run\":\"run-1\",\"status\":\"running\"}\n\n"+
			line("log", "two", "0:1.3")+step("success", "0:1.3")+"event: end\nid: 0:1.3\ndata: {\"run\":\"run-1\",\"status\":\"failed\"}\n\n")
	}))
	defer srv.Close()
	defer func(d time.Duration) { client.FollowRetryMin = d }(client.FollowRetryMin)
	client.FollowRetryMin = time.Millisecond
	cli := func(args ...string) (string, int) {
		var out, errb bytes.Buffer
		code := run(t.Context(), append(args, "--url", srv.URL, "--admin-token", "t"), &out, &errb, func(string) string { return "" })
		return out.String() + errb.String(), code
	}
	out, code := cli("run", "watch", "run-1")
	var states []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(l)
		if f[0] == "run" { // the outcome: "run run-1 failed"
			f = f[1:]
		}
		states = append(states, f[1])
	}
	if code != exitRunFailed || !slices.Equal(states, []string{"queued", "running", "success", "failed"}) {
		t.Errorf("run watch: exit %d, states %q; want 10 and queued, running, success, then the run failed:\n%s", code, states, out)
	}
	out, code = cli("run", "logs", "run-1", "--follow")
	if code != exitRunFailed || strings.Count(out, "| one") != 1 || strings.Count(out, "| --- Orchestrator offline for 3s") != 1 || strings.Count(out, "| two") != 1 {
		t.Errorf("run logs --follow: exit %d, want 10 and each line once:\n%s", code, out)
	}
	if !slices.Equal(ids, []string{"", "0:1.2", "", "0:1.2"}) {
		t.Errorf("Last-Event-ID of each connection %q", ids)
	}
}

// -o json prints the API's answer and -o yaml the same as YAML, for the
// read commands; a bad -o is a usage error.
func TestOutputFormats(t *testing.T) {
	w := newCLIWorld(t, false)
	wf := w.workflow("held", "  - name: a\n    run: echo x\n    hold: true\n")
	run1 := strings.TrimSpace(w.must(exitOK, "run", "submit", wf))
	w.must(exitOK, "token", "create", "t1")
	c, err := client.New(w.d.DataURL(), cliToken)
	if err != nil {
		t.Fatal(err)
	}
	det, err := c.Run(w.ctx, run1)
	if err != nil {
		t.Fatal(err)
	}
	toks, err := c.Tokens(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	norm := func(b []byte, unmarshal func([]byte, any) error) any {
		t.Helper()
		var v any
		if err := unmarshal(b, &v); err != nil {
			t.Fatalf("%v:\n%s", err, b)
		}
		j, _ := json.Marshal(v) // YAML's ints and JSON's floats alike
		var n any
		json.Unmarshal(j, &n)
		return n
	}
	for _, c := range []struct {
		args []string
		api  any
	}{
		{[]string{"run", "show", run1}, det},
		{[]string{"token", "list"}, toks},
		{[]string{"run", "list"}, nil},
		{[]string{"worker", "list"}, nil},
	} {
		js := w.must(exitOK, append(c.args, "-o", "json")...)
		ym := w.must(exitOK, append(c.args, "--output", "yaml")...)
		if c.api != nil {
			want, _ := json.Marshal(c.api)
			if got := norm([]byte(js), json.Unmarshal); !reflect.DeepEqual(got, norm(want, json.Unmarshal)) {
				t.Errorf("%q -o json is not the API's answer:\n%s\nwant\n%s", c.args, js, want)
			}
		}
		if !reflect.DeepEqual(norm([]byte(ym), yaml.Unmarshal), norm([]byte(js), json.Unmarshal)) {
			t.Errorf("%q: -o yaml and -o json differ:\n%s\n%s", c.args, ym, js)
		}
		if strings.Contains(ym, "{") && !strings.Contains(js, "{}") {
			t.Errorf("%q -o yaml is in flow style:\n%s", c.args, ym)
		}
		w.must(exitUsage, append(c.args, "-o", "xml")...)
	}
	// A string that reads as another type in YAML stays a string.
	var v map[string]any
	yaml.Unmarshal([]byte(w.must(exitOK, "run", "submit", w.workflow("123", "  - name: \"true\"\n    run: echo\n    hold: true\n"), "-o", "yaml")), &v)
	if _, ok := v["run"].(string); !ok {
		t.Errorf("run submit -o yaml: %#v", v)
	}
}

// $TETHER_URL and $TETHER_ADMIN_TOKEN are used when the flags are not
// given, and the flags override them.
func TestEnvironment(t *testing.T) {
	w := newCLIWorld(t, false)
	env := func(vars map[string]string) func(string) string { return func(k string) string { return vars[k] } }
	cli := func(getenv func(string) string, args ...string) (string, int) {
		var out, errb bytes.Buffer
		code := run(w.ctx, append(args, "--timeout", "5s"), &out, &errb, getenv)
		return errb.String(), code
	}
	good := env(map[string]string{urlEnv: w.d.DataURL(), adminTokenEnv: cliToken})
	if errOut, code := cli(good, "run", "list"); code != exitOK {
		t.Errorf("from the environment: exit %d: %s", code, errOut)
	}
	if errOut, code := cli(good, "run", "list", "--url", "http://127.0.0.1:1"); code != exitError {
		t.Errorf("--url over $TETHER_URL: exit %d, want 1 (unreachable): %s", code, errOut)
	}
	if errOut, code := cli(good, "run", "list", "--admin-token", "wrong"); code != exitRefused {
		t.Errorf("--admin-token over $TETHER_ADMIN_TOKEN: exit %d, want 3: %s", code, errOut)
	}
	badURL := env(map[string]string{urlEnv: "ftp://nowhere", adminTokenEnv: cliToken})
	if errOut, code := cli(badURL, "run", "list", "--url", w.d.DataURL()); code != exitOK {
		t.Errorf("--url over a bad $TETHER_URL: exit %d: %s", code, errOut)
	}
	if errOut, code := cli(badURL, "run", "list"); code != exitUsage || !strings.Contains(errOut, "$TETHER_URL") {
		t.Errorf("a bad $TETHER_URL: exit %d, want 2 naming it: %s", code, errOut)
	}
}

// completion prints a script for each shell and refuses another (exit 2).
func TestCompletion(t *testing.T) {
	for _, sh := range []string{"bash", "zsh", "fish"} {
		var out bytes.Buffer
		if code := run(t.Context(), []string{"completion", sh}, &out, io.Discard, func(string) string { return "" }); code != exitOK || !strings.Contains(out.String(), "orchestrator") || out.Len() < 1000 {
			t.Errorf("completion %s: exit %d, %d bytes", sh, code, out.Len())
		}
	}
	// The scripts ask the binary (cobra's __complete): -o's formats.
	var out bytes.Buffer
	run(t.Context(), []string{"__complete", "run", "show", "run-1", "-o", ""}, &out, io.Discard, func(string) string { return "" })
	if got := strings.Fields(out.String()); len(got) < 3 || !slices.Equal(got[:3], []string{"table", "json", "yaml"}) {
		t.Errorf("completing -o: %q", got)
	}
	for _, args := range [][]string{{"completion", "tcsh"}, {"completion"}} {
		if code := run(t.Context(), args, io.Discard, io.Discard, func(string) string { return "" }); code != exitUsage {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
	}
}

// version reads the build information: module, version, VCS commit and
// dirty flag, Go version.
func TestVersion(t *testing.T) {
	bi := &debug.BuildInfo{GoVersion: "go1.99", Main: debug.Module{Path: "github.com/tether-run/tether", Version: "v1.2.3"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "true"}, {Key: "vcs.time", Value: "2026-01-01T00:00:00Z"}}}
	v := versionOf(bi)
	if v != (versionInfo{Module: "github.com/tether-run/tether", Version: "v1.2.3", Commit: "abc123", Time: "2026-01-01T00:00:00Z", Modified: true, Go: "go1.99"}) {
		t.Errorf("versionOf: %+v", v)
	}
	if testing.Short() {
		return
	}
	ctx, cancel := context.WithTimeout(t.Context(), e2eTimeout)
	defer cancel()
	orchBin, _ := buildBinaries(t, ctx)
	out, errOut, code := orchCLI(t, ctx, orchBin, "version", "-o", "json")
	var got versionInfo
	if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil {
		t.Fatalf("version -o json: exit %d, %v\n%s%s", code, err, out, errOut)
	}
	if got.Module != "github.com/tether-run/tether" || got.Go != runtime.Version() || got.Version == "" {
		t.Errorf("version of the binary: %+v, want the module and %s", got, runtime.Version())
	}
	if out, _, _ := orchCLI(t, ctx, orchBin, "version"); !strings.Contains(out, runtime.Version()) || !strings.Contains(out, "commit") {
		t.Errorf("version:\n%s", out)
	}
}

// operator-token create, list and revoke, and audit: a token's actions are
// audited under its name, a read-only token's change is refused (3), a
// revoked token is refused (3); list and audit print the API's answer
// with -o json and the same as YAML.
func TestOperatorTokensAndAudit(t *testing.T) {
	w := newCLIWorld(t, false)
	as := func(token string, want int, args ...string) string {
		t.Helper()
		var out, errb bytes.Buffer
		if code := run(w.ctx, append(args, "--url", w.d.DataURL()), &out, &errb, func(k string) string {
			if k == adminTokenEnv {
				return token
			}
			return ""
		}); code != want {
			t.Fatalf("%q as %q: exit %d, want %d\n%s%s", args, token, code, want, out.String(), errb.String())
		}
		return out.String()
	}
	alice := strings.TrimSpace(w.must(exitOK, "operator-token", "create", "alice"))
	viewer := strings.TrimSpace(w.must(exitOK, "operator-token", "create", "viewer", "--read-only"))
	if !strings.HasPrefix(alice, "alice.") || !strings.HasPrefix(viewer, "viewer.") {
		t.Fatalf("operator-token create printed %q, %q", alice, viewer)
	}
	wf := w.workflow("held", "  - name: a\n    run: echo x\n    hold: true\n")
	run1 := strings.TrimSpace(as(alice, exitOK, "run", "submit", wf))
	as(viewer, exitOK, "run", "show", run1)
	as(viewer, exitRefused, "run", "cancel", run1)

	var list client.OperatorTokenList
	json.Unmarshal([]byte(w.must(exitOK, "operator-token", "list", "-o", "json")), &list)
	var names []string
	for _, o := range list.OperatorTokens {
		names = append(names, fmt.Sprintf("%s:%v", o.Name, o.ReadOnly))
	}
	if !slices.Contains(names, "alice:false") || !slices.Contains(names, "viewer:true") {
		t.Errorf("operator-token list: %q", names)
	}
	if table := w.must(exitOK, "operator-token", "list"); !strings.Contains(table, "viewer") || !strings.Contains(table, "read-only") {
		t.Errorf("operator-token list:\n%s", table)
	}

	var audit client.AuditList
	json.Unmarshal([]byte(w.must(exitOK, "audit", "--actor", "alice", "-o", "json")), &audit)
	if len(audit.Entries) != 1 || audit.Entries[0].Action != "run.submit" || audit.Entries[0].Target != run1 || audit.Entries[0].Outcome != "accepted" {
		t.Errorf("audit --actor alice: %+v, want the one submit", audit.Entries)
	}
	c, _ := client.New(w.d.DataURL(), cliToken)
	api, err := c.Audit(w.ctx, client.AuditOptions{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	js := w.must(exitOK, "audit", "-o", "json")
	want, _ := json.Marshal(api)
	var got, exp any
	json.Unmarshal([]byte(js), &got)
	json.Unmarshal(want, &exp)
	if !reflect.DeepEqual(got, exp) {
		t.Errorf("audit -o json is not the API's answer:\n%s\nwant %s", js, want)
	}
	var ym any
	yaml.Unmarshal([]byte(w.must(exitOK, "audit", "-o", "yaml")), &ym)
	if yj, _ := json.Marshal(ym); !bytes.Equal(yj, mustJSON(got)) {
		t.Errorf("audit -o yaml differs from -o json:\n%s", yj)
	}
	table := w.must(exitOK, "audit", "--limit", "2")
	if n := strings.Count(strings.TrimSpace(table), "\n"); n != 2 || !strings.Contains(w.must(exitOK, "audit"), "forbidden") {
		t.Errorf("audit table (--limit 2: %d rows):\n%s", n, table)
	}

	w.must(exitOK, "operator-token", "revoke", "alice")
	as(alice, exitRefused, "run", "list")
	w.must(exitRefused, "operator-token", "revoke", "ghost")
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// TestCLIFollowsLeader: --url repeated (and $TETHER_URL comma-separated)
// names a highly available group (SPEC §15): the first refuses
// connections, the second is a standby whose 307 names the leader, which
// answers, with the token.
func TestCLIFollowsLeader(t *testing.T) {
	var got []string
	var mu sync.Mutex
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.URL.Path+" "+r.Header.Get("Authorization"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"tokens":[]}`)
	}))
	defer leader.Close()
	standby := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(client.LeaderHeader, leader.URL)
		http.Redirect(w, r, leader.URL+r.URL.RequestURI(), http.StatusTemporaryRedirect)
	}))
	defer standby.Close()
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	for _, c := range []struct {
		args []string
		env  string
	}{
		{args: []string{"--url", dead.URL, "--url", standby.URL}},
		{env: dead.URL + "," + standby.URL},
	} {
		var out, errb bytes.Buffer
		args := append([]string{"token", "list", "--admin-token", "t"}, c.args...)
		code := run(t.Context(), args, &out, &errb, func(k string) string {
			if k == urlEnv {
				return c.env
			}
			return ""
		})
		if code != 0 {
			t.Fatalf("token list %q ($TETHER_URL %q): exit %d\n%s", c.args, c.env, code, errb.String())
		}
	}
	if !slices.Equal(got, []string{"/api/tokens Bearer t", "/api/tokens Bearer t"}) {
		t.Fatalf("the leader got %q; want the token list twice, with the token", got)
	}
}

// silentListener is a loopback address whose host seems gone: its accept
// queue is full (backlog 0, one connection queued, none accepted), so the
// kernel drops every further SYN and a dial hangs, as one to a dead host
// does.
func silentListener(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	for i := 0; ; i++ { // fill the queue until a dial hangs
		c, err := net.DialTimeout("tcp", addr, 300*time.Millisecond)
		if err != nil {
			break
		}
		t.Cleanup(func() { c.Close() })
		if i == 8 {
			t.Fatalf("%s still completes connections with its accept queue full: this test needs a kernel that drops SYNs then (Linux does)", addr)
		}
	}
	return addr
}

// TestCLIPassesOverASilentHost: the first --url's host answers no SYN (a
// dead leader's): the CLI gives each URL a share of --timeout to connect,
// so even a write (which is never sent twice) reaches the next one within
// the timeout (SPEC §15).
func TestCLIPassesOverASilentHost(t *testing.T) {
	var got []string
	var mu sync.Mutex
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Method+" "+r.URL.Path)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"name":"ci","token":"ci.SECRET"}`)
	}))
	defer leader.Close()
	silent := "http://" + silentListener(t)
	var out, errb bytes.Buffer
	args := []string{"token", "create", "ci", "--admin-token", "t", "--timeout", "4s", "--url", silent, "--url", leader.URL}
	if code := run(t.Context(), args, &out, &errb, func(string) string { return "" }); code != 0 {
		t.Fatalf("token create past a silent first URL: exit %d\n%s", code, errb.String())
	}
	if !slices.Equal(got, []string{"POST /api/tokens"}) {
		t.Fatalf("the second URL got %q; want the one POST", got)
	}
}

// TestWorkerListTable: `worker list` shows each worker's ahead (SPEC §3)
// beside its slots, in its own column, so a worker holding more leases than
// slots reads as lease-ahead, not as a bug.
func TestWorkerListTable(t *testing.T) {
	var b bytes.Buffer
	if err := printWorkers(&b, []client.Worker{
		{Name: "fast", ID: "w-1", State: "connected", Tags: []string{"linux"}, Slots: 1, Ahead: 4, Leases: 5},
		{Name: "plain", ID: "w-2", State: "connected", Slots: 2, Leases: 1},
	}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	want := [][]string{
		{"NAME", "ID", "STATE", "TAGS", "SLOTS", "AHEAD", "LEASES", "LAST", "HEARTBEAT"},
		{"fast", "w-1", "connected", "linux", "1", "4", "5", "-"},
		{"plain", "w-2", "connected", "-", "2", "0", "1", "-"},
	}
	if len(lines) != len(want) {
		t.Fatalf("worker list:\n%s", b.String())
	}
	for i, l := range lines {
		if got := strings.Fields(l); !slices.Equal(got, want[i]) {
			t.Errorf("worker list line %d: %q, want %q", i, got, want[i])
		}
	}
}
