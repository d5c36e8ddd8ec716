package orchestrator_test

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/tether-run/tether/adapters/dataplane"
	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/adapters/worker"
	"github.com/tether-run/tether/core"
)

// verbsEnv makes the test binary play a step process that calls the
// data plane's verbs through its worker's step endpoint (see verbsMain).
const verbsEnv = "TETHER_TEST_VERBS_PROCESS"

func init() {
	if os.Getenv(verbsEnv) != "" {
		os.Exit(verbsMain())
	}
}

// verbsMain calls each verb of SPEC §14 with plain HTTP, with nothing but
// the environment the worker gave it, printing "ok NAME" per check; it
// exits 1 at the first failure.
func verbsMain() int {
	base, tok := os.Getenv(worker.EnvDataURL), os.Getenv(worker.EnvDataToken)
	call := func(method, path, body string, hdr ...string) (int, string) {
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		if err != nil {
			return 0, err.Error()
		}
		if body == "" {
			req.Body, req.ContentLength = nil, 0
		}
		req.Header.Set("Authorization", "Bearer "+tok)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Add(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	first := ""
	checks := []struct {
		name         string
		method, path string
		body         string
		hdr          []string
		want         int
		wantBody     string
	}{
		{"put with a request id", "PUT", "/data/v.out", "one", []string{dataplane.RequestIDHeader, "r1", dataplane.AttributeHeader, "kind=report"}, http.StatusCreated, `"version": 1`},
		{"the same request again", "PUT", "/data/v.out", "one", []string{dataplane.RequestIDHeader, "r1"}, http.StatusCreated, "FIRST"},
		{"query", "GET", "/data?prefix=v.&attr.kind=report", "", nil, http.StatusOK, `"version": 1`},
		{"one version", "GET", "/data/v.out", "", nil, http.StatusOK, `"version": 1`},
		{"delete", "DELETE", "/data/v.out", "", []string{dataplane.RequestIDHeader, "d1"}, http.StatusCreated, `"deleted": true`},
		{"latest of a deleted id", "GET", "/data/v.out/latest", "", nil, http.StatusNotFound, "deleted"},
		{"pinned version", "GET", "/data/v.out/1", "", nil, http.StatusOK, "one"},
		{"undeclared output", "PUT", "/data/elsewhere", "x", nil, http.StatusForbidden, "declared outputs"},
		{"definition", "GET", "/step/definition", "", nil, http.StatusOK, `"Outputs": [`},
		{"output", "GET", "/step/output/s", "", nil, http.StatusOK, `"state": "running"`},
		{"pool", "GET", "/pool", "", nil, http.StatusOK, `"name": "w1"`},
	}
	for _, c := range checks {
		code, body := call(c.method, c.path, c.body, c.hdr...)
		ok := code == c.want && strings.Contains(body, c.wantBody)
		if c.wantBody == "FIRST" {
			ok = code == c.want && body == first
		}
		if first == "" {
			first = body
		}
		if !ok {
			fmt.Printf("FAIL %s: HTTP %d %q; want %d with %q\n", c.name, code, body, c.want, c.wantBody)
			return 1
		}
		fmt.Printf("ok %s\n", c.name)
	}
	return 0
}

// TestStepVerbs: a real worker runs a step process that calls every verb
// the orchestrator serves a step (SPEC §14's table) through the worker's
// step endpoint with plain HTTP: idempotent put (a repeat answers the same
// bytes), attributes and a query, delete, declared outputs (403),
// readDefinition, readOutput, the pool. Planted bug: with the endpoint
// not forwarding Tether-Request-Id, the repeat made version 2 and this
// test failed at "the same request again".
func TestStepVerbs(t *testing.T) {
	r := startData(t, orchestrator.Options{})
	f := startWorkers(t, r.ctx, r.d, "w1")
	defer f.stop(t)
	cmd := verbsEnv + "=1 exec '" + os.Args[0] + "' -test.run='^$'"
	run, err := r.d.Submit(r.ctx, core.RunSpec{Name: "verbs", Steps: []core.StepSpec{{Name: "s", Command: cmd, Writes: true, Outputs: []string{"v.*"}}}})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, r.ctx, r.d, "the run to finish", finished(run))
	var (
		status string
		lines  []string
	)
	viewer{r.d}.Snapshot(r.ctx, func(o view) {
		status = runStatus(o, run)
		for _, l := range o.StepLogs(core.StepID(string(run) + "/s")) {
			lines = append(lines, l.Line.Text)
		}
	})
	out := strings.Join(lines, "\n")
	if status != "success" || strings.Count(out, "ok ") != 11 {
		t.Fatalf("run %s; the step printed:\n%s", status, out)
	}
	if vs := storedVersions(t, r, "v.out"); len(vs) != 2 || !vs[1].Deleted {
		t.Fatalf("versions %+v: want the put and its tombstone", vs)
	}
}
