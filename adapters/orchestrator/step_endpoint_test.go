package orchestrator_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/adapters/worker"
	"github.com/tether-run/tether/core"
)

// stepEnv makes the test binary play a step process (see stepMain).
const stepEnv = "TETHER_TEST_STEP_PROCESS"

func TestMain(m *testing.M) {
	if os.Getenv(stepEnv) != "" {
		os.Exit(stepMain())
	}
	if os.Getenv(swarmEnv) != "" {
		os.Exit(swarmMain()) // BenchmarkIdleWorkers's swarm (bench_idle_test.go)
	}
	os.Exit(m.Run())
}

// stepMain is a step process that uses the data plane through its worker's
// step endpoint, with nothing but the environment the worker gave it. It
// prints "token=… url=…" and one "ok …" line per check; it exits 1 on the
// first failure.
func stepMain() int {
	base, tok, lease := os.Getenv(worker.EnvDataURL), os.Getenv(worker.EnvDataToken), os.Getenv(worker.EnvLease)
	fmt.Printf("token=%s url=%s lease=%s\n", tok, base, lease)
	call := func(method, path, token, body string) (int, string, error) {
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		if err != nil {
			return 0, "", err
		}
		if body == "" {
			req.Body, req.ContentLength = nil, 0
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	checks := []struct {
		name              string
		method, path, tok string
		body              string
		want              int
		wantBody          string
	}{
		{"put", "PUT", "/data/step.out", tok, "made by a step", http.StatusCreated, `"version": 1`},
		// A lease in the query is the step's own business: the endpoint
		// attaches the step's lease whatever it says.
		{"put with a foreign lease", "PUT", "/data/step.out?lease=999", tok, "second", http.StatusCreated, `"lease": ` + lease},
		{"append", "POST", "/data/step.log/append", tok, "line one\n", http.StatusOK, `"offset": 0`},
		{"get", "GET", "/data/step.out/1", tok, "", http.StatusOK, "made by a step"},
		{"bad token", "PUT", "/data/step.out", "not-the-token", "x", http.StatusUnauthorized, "step token"},
		{"other path", "GET", "/api/workers", tok, "", http.StatusNotFound, "no such path"},
		{"orchestrator error passes through", "GET", "/data/step.out/9", tok, "", http.StatusNotFound, "not found"},
	}
	for _, c := range checks {
		code, body, err := call(c.method, c.path, c.tok, c.body)
		if err != nil || code != c.want || !strings.Contains(body, c.wantBody) {
			fmt.Printf("FAIL %s: HTTP %d %q (%v); want %d with %q\n", c.name, code, body, err, c.want, c.wantBody)
			return 1
		}
		fmt.Printf("ok %s\n", c.name)
	}
	return 0
}

// TestStepEndpoint: a real worker runs a step process that reads and writes
// the data plane through the worker's loopback endpoint (TETHER_DATA_URL,
// TETHER_DATA_TOKEN): its writes carry its lease, and its token stops
// working once it has exited.
func TestStepEndpoint(t *testing.T) {
	r := startData(t, orchestrator.Options{})
	f := startWorkers(t, r.ctx, r.d, "w1")
	defer f.stop(t)
	cmd := stepEnv + "=1 exec '" + os.Args[0] + "' -test.run='^$'"
	run, err := r.d.Submit(r.ctx, core.RunSpec{Name: "endpoint", Steps: []core.StepSpec{{Name: "s", Command: cmd, Writes: true}}})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, r.ctx, r.d, "the run to finish", finished(run))
	var (
		status string
		lines  []string
		lease  core.LeaseID
	)
	viewer{r.d}.Snapshot(r.ctx, func(o view) {
		status = runStatus(o, run)
		for _, l := range o.StepLogs(core.StepID(string(run) + "/s")) {
			lines = append(lines, l.Line.Text)
			lease = l.Lease
		}
	})
	out := strings.Join(lines, "\n")
	if status != "success" || strings.Count(out, "\nok ") != 7 {
		t.Fatalf("run %s; the step printed:\n%s", status, out)
	}
	vs := storedVersions(t, r, "step.out")
	if len(vs) != 2 || vs[0].Lease != uint64(lease) || vs[1].Lease != uint64(lease) || vs[0].Worker == "" {
		t.Fatalf("versions %+v: want two, both under the step's lease %d", vs, lease)
	}

	// The step's token died with it.
	var tok, url string
	for _, f := range strings.Fields(lines[0]) {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "token":
			tok = v
		case "url":
			url = v
		case "lease":
			if v != strconv.FormatUint(uint64(lease), 10) {
				t.Fatalf("%s = %s, the step's lease is %d", worker.EnvLease, v, lease)
			}
		}
	}
	req, _ := http.NewRequestWithContext(r.ctx, "GET", url+"/data/step.out/1", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var e orchestrator.APIError
	json.NewDecoder(resp.Body).Decode(&e)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("the token of an exited step: HTTP %d %q, want 401", resp.StatusCode, e.Error)
	}
}
