package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	flag "github.com/spf13/pflag"

	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/client"
)

// stepRig is a serving orchestrator and one worker process, with the worker
// binary on the worker's PATH (so its steps can call `worker step …`).
type stepRig struct {
	t        *testing.T
	ctx      context.Context
	orchBin  string
	dataDir  string
	httpURL  string
	workDir  string
	serve    *proc
	worker   *proc
	workerIn string // the worker binary
}

// newStepRig starts serve (with serveArgs and SERVER_SECRET and SHIPPED in
// its environment) and a worker (with WORKER_SECRET in its environment).
func newStepRig(t *testing.T, serveArgs []string, workerArgs ...string) *stepRig {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the binaries")
	}
	ctx, cancel := context.WithTimeout(t.Context(), e2eTimeout)
	t.Cleanup(cancel)
	orchBin, workerBin := buildBinaries(t, ctx)
	// Inherited by both processes: the worker passes PATH to its steps.
	t.Setenv("PATH", filepath.Dir(workerBin)+string(os.PathListSeparator)+os.Getenv("PATH"))
	t.Setenv("SERVER_SECRET", "server-secret-value")
	t.Setenv("SHIPPED", "yes")
	t.Setenv("WORKER_SECRET", "worker-secret-value")
	r := &stepRig{t: t, ctx: ctx, orchBin: orchBin, dataDir: filepath.Join(t.TempDir(), "data"), workDir: filepath.Join(t.TempDir(), "work"), workerIn: workerBin}
	serve := start(t, ctx, "orchestrator serve", orchBin, append([]string{"serve", "--addr", "127.0.0.1:0", "--data-dir", r.dataDir}, serveArgs...)...)
	var wsURL string
	poll(t, ctx, "serve to print its address", func() bool {
		select {
		case <-serve.done:
			t.Fatalf("serve exited %d:\n%s", serve.code, serve.stderr)
		default:
		}
		if m := serveURLRE.FindStringSubmatch(serve.stdout.String()); m != nil {
			wsURL = "ws://" + m[1] + "/control"
			return true
		}
		return false
	})
	r.serve, r.httpURL = serve, "http://"+strings.TrimSuffix(strings.TrimPrefix(wsURL, "ws://"), "/control")
	token := strings.TrimSpace(r.mustCLI("token", "create", "w1"))
	r.worker = start(t, ctx, "worker w1", workerBin, append([]string{"connect", "--url", wsURL, "--token", token, "--tags", "script",
		"--slots", "2", "--work-dir", r.workDir}, workerArgs...)...)
	return r
}

func (r *stepRig) cli(args ...string) (string, string, int) {
	r.t.Helper()
	return orchCLI(r.t, r.ctx, r.orchBin, append(args, "--url", r.httpURL, "--data-dir", r.dataDir)...)
}

func (r *stepRig) mustCLI(args ...string) string {
	r.t.Helper()
	out, errOut, code := r.cli(args...)
	if code != 0 {
		r.t.Fatalf("orchestrator %q: exit %d\n%s", args, code, errOut)
	}
	return out
}

// run submits a workflow and waits for it to finish; it returns its detail
// and its logs.
func (r *stepRig) run(yaml string) (client.RunDetail, string) {
	r.t.Helper()
	f := filepath.Join(r.t.TempDir(), "wf.yaml")
	if err := os.WriteFile(f, []byte(yaml), 0o600); err != nil {
		r.t.Fatal(err)
	}
	id := strings.TrimSpace(r.mustCLI("run", "submit", f))
	var det client.RunDetail
	poll(r.t, r.ctx, id+" to finish", func() bool {
		if err := json.Unmarshal([]byte(r.mustCLI("run", "show", id, "--json")), &det); err != nil {
			r.t.Fatal(err)
		}
		return !det.Run.FinishedAt.IsZero()
	})
	return det, r.mustCLI("run", "logs", id)
}

func stepOf(det client.RunDetail, name string) client.Step {
	for _, s := range det.Steps {
		if s.Name == name {
			return s
		}
	}
	return client.Step{}
}

// A shell step uses `worker step …` for every verb the data plane serves
// today (put with attributes, get by version and latest, -o, append,
// versions, a missing id's exit 4), runs in a fresh scratch directory that
// is its cwd and is removed after it, gets none of the orchestrator's
// environment but what --ship-env names and none of the worker's but PATH
// and the like, and leaves a file in $TETHER_OUTPUT_DIR that is stored
// (persistFile) before its report, so the next step reads it.
func TestStepVerbsThroughAWorker(t *testing.T) {
	r := newStepRig(t, []string{"--ship-env", "SHIP*"})
	det, logs := r.run(`name: verbs
steps:
  - name: produce
    writes: true
    run: |
      set -e
      test "$(pwd -P)" = "$(cd "$TETHER_SCRATCH" && pwd -P)" || { echo "cwd $(pwd) is not TETHER_SCRATCH $TETHER_SCRATCH"; exit 9; }
      test -z "$(ls -A)" || { echo "scratch not empty"; exit 9; }
      echo "server secret: [${SERVER_SECRET:-}] worker secret: [${WORKER_SECRET:-}] shipped: [${SHIPPED:-}] token: [${TETHER_WORKER_TOKEN:-}]"
      echo hello > in.txt
      worker step data put report.txt in.txt --attr kind=report
      echo again | worker step data put report.txt -
      printf 'line1\n' | worker step data append build.log -
      echo persisted > "$TETHER_OUTPUT_DIR/result.txt"
      echo "$TETHER_SCRATCH" > "$TETHER_OUTPUT_DIR/scratch-path"
  - name: consume
    depends_on: [produce]
    run: |
      set -e
      worker step data get report.txt -o got.txt
      echo "got: $(cat got.txt)"
      echo "v1: $(worker step data get report.txt --version 1)"
      echo "persisted: $(worker step data get result.txt)"
      worker step data versions report.txt
      worker step data get nothing-here > /dev/null 2>&1 || echo "missing: exit $?"
      old=$(worker step data get scratch-path)
      test ! -e "$old" && echo "produce's scratch is gone"
`)
	if det.Status != "success" {
		t.Fatalf("run finished %s:\n%+v\n%s\n--- worker:\n%s", det.Status, det.Steps, logs, r.worker.stderr)
	}
	for _, want := range []string{
		"server secret: [] worker secret: [] shipped: [yes] token: []",
		`"id":"report.txt","version":1`, `"id":"report.txt","version":2`, `"id":"build.log","offset":0`,
		"[tether] persistFile: stored result.txt version 1", "[tether] persistFile: stored scratch-path version 1",
		"got: again", "v1: hello", "persisted: persisted", `"versions":[`, "missing: exit 4", "produce's scratch is gone",
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("the logs lack %q:\n%s", want, logs)
		}
	}
	if out := r.mustCLI("data", "get", "result.txt"); out != "persisted\n" {
		t.Errorf("orchestrator data get result.txt: %q", out)
	}
	// Every step's directory is gone once it ended.
	if left, _ := filepath.Glob(filepath.Join(r.workDir, "step-*")); len(left) != 0 {
		t.Errorf("step directories left behind: %q", left)
	}
}

// examples/step.yaml runs to success and stores what it says.
func TestStepExample(t *testing.T) {
	r := newStepRig(t, nil)
	src, err := os.ReadFile("examples/step.yaml")
	if err != nil {
		t.Fatal(err)
	}
	det, logs := r.run(string(src))
	if det.Status != "success" || !strings.Contains(logs, "summary: built") {
		t.Fatalf("examples/step.yaml: %s\n%s", det.Status, logs)
	}
	if out := r.mustCLI("data", "get", "summary.txt"); out != "built\n" {
		t.Errorf("summary.txt: %q", out)
	}
}

// A file the step leaves in $TETHER_OUTPUT_DIR that cannot be stored fails
// the step with a message naming it (a symbolic link is never followed, an
// undeclared output is refused 403), and nothing of a refused directory is
// stored; --keep-scratch keeps the step's directories.
func TestStepOutputDirRefusals(t *testing.T) {
	r := newStepRig(t, nil, "--keep-scratch")
	det, logs := r.run(`name: refusals
steps:
  - name: link
    run: |
      echo fine > "$TETHER_OUTPUT_DIR/a-fine-file"
      ln -s /etc/passwd "$TETHER_OUTPUT_DIR/passwd"
  - name: badname
    run: echo x > "$TETHER_OUTPUT_DIR/.hidden"
  - name: stopped
    timeout: 1s
    run: |
      echo never > "$TETHER_OUTPUT_DIR/from-a-stopped-step"
      exec sleep 30
  - name: undeclared
    outputs: [declared.txt]
    run: |
      echo yes > "$TETHER_OUTPUT_DIR/declared.txt"
      echo no > "$TETHER_OUTPUT_DIR/zz-undeclared.txt"
`)
	if det.Status != "failed" {
		t.Fatalf("run finished %s, want failed:\n%s", det.Status, logs)
	}
	link, bad := stepOf(det, "link"), stepOf(det, "badname")
	if link.State != "failed" || !strings.Contains(link.Message, "passwd is a symbolic link") {
		t.Errorf("step link: %s %q, want failed naming the link", link.State, link.Message)
	}
	if bad.State != "failed" || !strings.Contains(bad.Message, "data id") {
		t.Errorf("step badname: %s %q, want failed naming the data id rule", bad.State, bad.Message)
	}
	// A file the step did not declare (outputs:) is refused by the
	// orchestrator (SPEC §14): the step fails naming it; the declared one,
	// uploaded first (name order), is stored.
	if und := stepOf(det, "undeclared"); und.State != "failed" || !strings.Contains(und.Message, "zz-undeclared.txt") || !strings.Contains(und.Message, "403") {
		t.Errorf("step undeclared: %s %q, want failed naming zz-undeclared.txt and the 403", und.State, und.Message)
	}
	// A step the worker stopped (here its timeout) is not uploaded: its
	// outcome is the stop's. (The orchestrator fences its lease at the
	// timeout as well, so an upload would be refused anyway.)
	if st := stepOf(det, "stopped"); st.Class != "step-timeout" {
		t.Errorf("step stopped: %s class %q %q, want step-timeout", st.State, st.Class, st.Message)
	}
	if _, _, code := r.cli("data", "get", "from-a-stopped-step"); code == 0 {
		t.Error("the output directory of a stopped step was uploaded")
	}
	if out, _, code := r.cli("data", "get", "declared.txt"); code != 0 || out != "yes\n" {
		t.Errorf("the declared output: exit %d %q, want it stored", code, out)
	}
	if _, errOut, code := r.cli("data", "get", "a-fine-file"); code == 0 {
		t.Errorf("a file of a refused output directory was stored (%s)", errOut)
	}
	if !strings.Contains(logs, "[tether] persistFile:") {
		t.Errorf("the step's log does not say why:\n%s", logs)
	}
	if kept, _ := filepath.Glob(filepath.Join(r.workDir, "step-*", "scratch")); len(kept) != 4 {
		t.Errorf("--keep-scratch: %d scratch directories kept, want 4", len(kept))
	}
}

// The verbs the orchestrator serves once its side of SPEC §14's contract
// is in (query, delete, readOutput, readDefinition, the pool): each is
// checked through a real step when the orchestrator serves its path, and
// skipped, saying so, when it does not yet.
func TestStepVerbsOfTheWholeContract(t *testing.T) {
	r := newStepRig(t, nil)
	det, logs := r.run(`name: contract
steps:
  - name: first
    writes: true
    run: |
      echo one | worker step data put q.one - --attr kind=q
      echo two | worker step data put q.two -
  - name: second
    depends_on: [first]
    writes: true
    run: |
      for v in "data query --prefix q. --attr kind=q" "data rm q.two" "output first" "definition" "pool"; do
        out=$(worker step $v 2>&1); rc=$?; printf 'verb [%s] exit %s out %s\n' "$v" "$rc" "$out"
      done
`)
	if det.Status != "success" {
		t.Fatalf("run finished %s:\n%s", det.Status, logs)
	}
	verbs := map[string]string{}
	for _, l := range strings.Split(logs, "\n") {
		if _, rest, ok := strings.Cut(l, "verb ["); ok {
			v, res, _ := strings.Cut(rest, "] ")
			verbs[v] = res
		}
	}
	for _, c := range []struct{ name, verb, want string }{
		{"query", "data query --prefix q. --attr kind=q", `"items":[{"id":"q.one"`},
		{"rm", "data rm q.two", `"deleted":true`},
		{"output", "output first", `"step":"run-1/first","state":"success","exit":0,"writes":[{"id":"q.one"`},
		{"definition", "definition", `"step":"run-1/second","workflow":{"Name":"contract"`},
		{"pool", "pool", `"workers":[`},
	} {
		verb, want := c.verb, c.want
		t.Run(c.name, func(t *testing.T) {
			res, ok := verbs[verb]
			switch {
			case !ok:
				t.Fatalf("the step did not run %q:\n%s", verb, logs)
			case notServedYet(res):
				t.Skipf("the orchestrator does not serve %q yet: %s", verb, res)
			case !strings.HasPrefix(res, "exit 0") || !strings.Contains(res, want):
				t.Errorf("worker step %s: %s; want exit 0 and %s", verb, res, want)
			}
		})
	}
}

// notServedYet recognizes the answers of an orchestrator without SPEC §14's
// newer routes: the status page's HTML for an unrouted path, 405 for DELETE
// on a data id, and /data read as an empty id.
func notServedYet(res string) bool {
	return strings.Contains(res, "<!doctype html>") || strings.Contains(res, "method DELETE is not allowed") ||
		strings.Contains(res, `GET /data: store: bad data id ""`)
}

// serve --ship-env: patterns resolve to exactly the matching variables of
// the orchestrator's environment, none by default; a bad pattern is a
// usage error.
func TestServeShipEnv(t *testing.T) {
	t.Setenv("SHIP_A", "a")
	t.Setenv("SHIP_B", "b")
	t.Setenv("OTHER_SECRET", "s")
	resolve := func(args ...string) (serverConfig, error) {
		o := &options{}
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		serveCmd.flags(fs, o)
		if err := fs.Parse(append([]string{"--data-dir", t.TempDir()}, args...)); err != nil {
			t.Fatal(err)
		}
		return resolveServeConfig(&env{opts: o, flags: fs})
	}
	cfg, err := resolve()
	if err != nil || len(orchestrator.ShipEnv(cfg.ShipEnv)) != 0 {
		t.Errorf("no --ship-env: %v shipped, %v; want nothing", orchestrator.ShipEnv(cfg.ShipEnv), err)
	}
	cfg, err = resolve("--ship-env", "SHIP_A", "--ship-env", "SHIP_B,NOPE*")
	if got := orchestrator.ShipEnv(cfg.ShipEnv); err != nil || len(got) != 2 || got["SHIP_A"] != "a" || got["SHIP_B"] != "b" {
		t.Errorf("--ship-env SHIP_A --ship-env SHIP_B,NOPE*: %v, %v", got, err)
	}
	if _, err := resolve("--ship-env", "["); exitCode(err) != exitUsage {
		t.Errorf("--ship-env [: %v, want a usage error", err)
	}
}

// worker step secret get|put through a real step: a declared secret reads
// back exactly, put_secrets: lets a step store one, and an undeclared name
// is refused (exit 3, 403). Skipped, saying so, while the orchestrator has
// no secrets (no `orchestrator secret put`, or secrets: unknown to the
// parser).
func TestStepSecretVerbs(t *testing.T) {
	r := newStepRig(t, nil)
	val := filepath.Join(t.TempDir(), "v")
	os.WriteFile(val, []byte("s3cr3t-value"), 0o600)
	for _, name := range []string{"TOKEN", "OTHER"} {
		if _, errOut, code := r.cli("secret", "put", name, "--from-file", val); code != 0 {
			t.Skipf("the orchestrator has no secrets yet: secret put: exit %d %s", code, errOut)
		}
	}
	f := filepath.Join(t.TempDir(), "wf.yaml")
	os.WriteFile(f, []byte(`name: secrets
steps:
  - name: use
    secrets: [TOKEN]
    put_secrets: [MINTED]
    run: |
      echo "got [$(worker step secret get TOKEN)]"
      printf minted | worker step secret put MINTED && echo "put ok"
      worker step secret get OTHER; echo "other exit $?"
`), 0o600)
	if _, errOut, code := r.cli("run", "submit", f); code != 0 {
		t.Skipf("the orchestrator does not take secrets: yet: %s", errOut)
	}
	var det client.RunDetail
	poll(t, r.ctx, "run-1 to finish", func() bool {
		json.Unmarshal([]byte(r.mustCLI("run", "show", "run-1", "--json")), &det)
		return !det.Run.FinishedAt.IsZero()
	})
	logs := r.mustCLI("run", "logs", "run-1")
	for _, want := range []string{"put ok", "other exit 3"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the logs lack %q:\n%s", want, logs)
		}
	}
	// The value itself is redacted from stored logs; the step saw it whole
	// if it did not print something else.
	if !strings.Contains(logs, "got [") || strings.Contains(logs, "got []") {
		t.Errorf("secret get TOKEN printed nothing:\n%s", logs)
	}
	if !strings.Contains(r.mustCLI("secret", "list"), "MINTED") {
		t.Errorf("secret put MINTED from the step is not listed")
	}
}
