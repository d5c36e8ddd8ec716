package main

// Hostile names (issue 11, finding 3): names with NUL, ESC, CR or LF sent to
// the real operator API are refused with a clear 400 naming the field, while
// a genuine worker runs a workflow; and names an older store holds are
// printed escaped by the CLI (SPEC §12).

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"

	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/adapters/store"
	"github.com/tether-run/tether/client"
	"github.com/tether-run/tether/core"
)

// attackBadNamesResult is what attackBadNames saw.
type attackBadNamesResult struct {
	Sent int
	// Refused counts the clear refusals by kind: "token name", "run name",
	// "step name", "tag", "label key", "label value", "target", "lookup"
	// (an unknown token, run or step whose name holds control characters:
	// 404).
	Refused map[string]int
	// Errors lists every answer that was not the expected refusal (an
	// accepted name, another status, an error message holding a raw
	// control character, a transport error), at most maxBadNamesErrors.
	Errors []string
}

// maxBadNamesErrors bounds attackBadNamesResult.Errors.
const maxBadNamesErrors = 20

// badNamesDialer dials from 127.0.0.2, so per-address limits of the
// orchestrator see the attacker apart from genuine clients on 127.0.0.1.
var badNamesDialer = &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 5 * time.Second}

// badNameSamples are the hostile names: terminal escapes (clear screen, set the
// title, recolour), a forged line, NUL, a bare CR, DEL, a right-to-left
// override.
var badNameSamples = []string{
	"w\x1b[2J\x1b[H", "title\x1b]0;pwned\x07", "red\x1b[31m", "forged\nlevel=ERROR msg=\"fake\"",
	"nul\x00byte", "cr\roverwrite", "del\x7f", "evil\u202egnp.exe",
}

// attackBadNames runs the attack against the orchestrator at addr
// (host:port, cleartext) with the admin token until ctx is done and returns
// what it observed: token names, a run's name, step names, tags, label keys
// and values and targets holding control characters, each sent to the
// operator API from 127.0.0.2; each must be refused with a 400 (404 for a
// lookup) whose JSON error names the field and holds no raw control
// character. workers requests run at once.
func attackBadNames(ctx context.Context, t *testing.T, addr, adminToken string, workers int) attackBadNamesResult {
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: badNamesDialer.DialContext, MaxIdleConnsPerHost: workers}}
	defer hc.CloseIdleConnections()
	base := "http://" + addr + "/api"
	type attempt struct {
		kind, method, path, body string
		status                   int
	}
	yamlQ := strconv.QuoteToASCII // its escapes (\x1b, \u202e, \a, \n) are YAML's in double quotes
	var attempts []attempt
	for i, n := range badNameSamples {
		tok, _ := json.Marshal(orchestrator.APITokenRequest{Name: n, TTL: "1m"})
		attempts = append(attempts,
			attempt{"token name", "POST", "/tokens", string(tok), http.StatusBadRequest},
			attempt{"run name", "POST", "/runs?file=bad.yaml", "name: " + yamlQ(n) + "\nsteps:\n  - name: a\n    run: echo\n", http.StatusBadRequest},
			attempt{"step name", "POST", "/runs?file=bad.yaml", "steps:\n  - name: " + yamlQ(n) + "\n    run: echo\n", http.StatusBadRequest},
			attempt{"tag", "POST", "/runs?file=bad.yaml", "steps:\n  - name: a\n    run: echo\n    tags: [" + yamlQ(n) + "]\n", http.StatusBadRequest},
			attempt{"label key", "POST", "/runs?file=bad.yaml", "steps:\n  - name: a\n    run: echo\n    labels: {" + yamlQ(n) + ": x}\n", http.StatusBadRequest},
			attempt{"label value", "POST", "/runs?file=bad.yaml", "steps:\n  - name: a\n    run: echo\n    labels: {zone: " + yamlQ(n) + "}\n", http.StatusBadRequest},
			attempt{"target", "POST", "/runs?file=bad.yaml", "steps:\n  - name: a\n    run: echo\n    target: " + yamlQ(n) + "\n", http.StatusBadRequest},
			attempt{"lookup", "DELETE", "/tokens/" + url.PathEscape(n), "", http.StatusNotFound},
			attempt{"lookup", "POST", "/runs/" + url.PathEscape(n) + "/cancel", "", http.StatusNotFound},
			attempt{"lookup", "POST", "/steps/run-1/" + url.PathEscape(n) + fmt.Sprint(i) + "/approve", "", http.StatusNotFound},
		)
	}
	res := attackBadNamesResult{Refused: map[string]int{}}
	var mu sync.Mutex
	record := func(kind, problem string) {
		mu.Lock()
		defer mu.Unlock()
		res.Sent++
		if problem == "" {
			res.Refused[kind]++
		} else if len(res.Errors) < maxBadNamesErrors {
			res.Errors = append(res.Errors, problem)
		}
	}
	one := func(a attempt) {
		req, err := http.NewRequestWithContext(ctx, a.method, base+a.path, strings.NewReader(a.body))
		if err != nil {
			record(a.kind, err.Error())
			return
		}
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := hc.Do(req)
		if err != nil {
			if ctx.Err() == nil {
				record(a.kind, fmt.Sprintf("%s %s: %v", a.method, a.path, err))
			}
			return
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		var ae orchestrator.APIError
		switch {
		case resp.StatusCode != a.status:
			record(a.kind, fmt.Sprintf("%s %s with a bad %s: %d %s, want %d", a.method, a.path, a.kind, resp.StatusCode, b, a.status))
		case json.Unmarshal(b, &ae) != nil || ae.Code != client.CodeFor(a.status) || ae.Message == "":
			record(a.kind, fmt.Sprintf("%s %s: answer %q is not a JSON error with code %s", a.method, a.path, b, client.CodeFor(a.status)))
		case a.kind != "lookup" && !strings.Contains(ae.Message, a.kind+" "):
			record(a.kind, fmt.Sprintf("%s %s: error %q does not name the field %q", a.method, a.path, ae.Message, a.kind))
		case strings.ContainsFunc(ae.Message, func(r rune) bool { return r != '\n' && r != ' ' && !unicode.IsPrint(r) }):
			record(a.kind, fmt.Sprintf("%s %s: error %q holds a raw control character", a.method, a.path, ae.Message))
		default:
			record(a.kind, "")
		}
	}
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; ctx.Err() == nil; i += workers {
				one(attempts[i%len(attempts)])
			}
		}(w)
	}
	wg.Wait()
	return res
}

// TestHostileBadNames: against a real `orchestrator serve`, attackBadNames
// runs from 127.0.0.2 with 4 concurrent requests while a genuine worker
// binary runs a 20-step workflow to success and operator calls answer.
// Every bad name of every kind must be refused at least once (8 names × 10
// kinds of request, a few hundred requests in the seconds the workflow
// takes), none accepted: on the old code (b5f896c) the token names and most
// workflow names were accepted (201), which this test reports.
func TestHostileBadNames(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binaries")
	}
	ctx, cancel := context.WithTimeout(t.Context(), faultTimeout)
	defer cancel()
	orchBin, workerBin := buildBinaries(t, ctx)
	dataDir := filepath.Join(t.TempDir(), "data")
	sp := startServe(t, ctx, orchBin, "orchestrator serve", "127.0.0.1:0", dataDir)
	adminB, err := os.ReadFile(filepath.Join(dataDir, adminTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	admin := strings.TrimSpace(string(adminB))
	api := apiClient{t: t, ctx: ctx, base: "http://" + sp.addr + "/api", token: admin}

	actx, stop := context.WithCancel(ctx)
	results := make(chan attackBadNamesResult, 1)
	go func() { results <- attackBadNames(actx, t, sp.addr, admin, 4) }()

	// The genuine operator and worker, on 127.0.0.1, during the attack.
	start(t, ctx, "worker builder-1", workerBin, "connect", "--url", "ws://"+sp.addr+"/control", "--token", api.enroll("builder-1"))
	var src strings.Builder
	src.WriteString("name: genuine\nsteps:\n")
	for i := 0; i < 20; i++ {
		fmt.Fprintf(&src, "  - name: s%d\n    run: echo step %d\n", i, i)
		if i > 0 {
			fmt.Fprintf(&src, "    depends_on: [s%d]\n", i-1)
		}
	}
	run := api.submit("genuine.yaml", src.String())
	// It takes about a second alone; 30 s is generous on 2 busy cores.
	var det client.RunDetail
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if det = api.run(run); !det.Run.FinishedAt.IsZero() {
			break
		}
	}
	if det.Status != "success" {
		t.Errorf("the genuine run is %s after 30 s of the attack, want success: %+v", det.Status, det.Steps)
	}
	runs := api.runs()
	stop()
	res := <-results

	t.Logf("attack: %d requests, refused %v", res.Sent, res.Refused)
	for _, e := range res.Errors {
		t.Errorf("attack: %s", e)
	}
	for _, kind := range []string{"token name", "run name", "step name", "tag", "label key", "label value", "target", "lookup"} {
		if res.Refused[kind] == 0 {
			t.Errorf("no %s refusal seen (%d requests sent)", kind, res.Sent)
		}
	}
	// Nothing of the attack was created: one run, one token.
	if len(runs.Runs) != 1 {
		t.Errorf("%d runs exist, want only the genuine one", len(runs.Runs))
	}
	if toks := api.tokens(); len(toks) != 1 || toks[0].Name != "builder-1" {
		t.Errorf("tokens %+v, want only builder-1", toks)
	}
}

// TestCLIEscapesStoredNames: a store written before names were checked
// holds a token, a worker, a run, a step, a tag, a failure message and an
// event with ESC, CR, NUL, BEL and a right-to-left override. Every client
// command that prints them prints them escaped; a step's own log line is
// printed as the step wrote it (colours included).
func TestCLIEscapesStoredNames(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	const (
		tokName  = "tok\x1b[2J"
		wName    = "w\x1b]0;pwned\x07"
		wID      = core.WorkerID("wid\r1")
		runName  = "nightly\x1b[31m"
		stepName = "b\x1bc"
		tag      = "gpu\x00"
		msg      = "step exited with code 1: \x1b[31mred\r\nforged line"
		logText  = "\x1b[32mgreen output\x1b[0m"
	)
	now := time.Now().UTC().Truncate(time.Second)
	rid := core.RunID("run-1")
	sid := core.StepID(string(rid) + "/" + stepName)
	records := []struct {
		key string
		v   any
	}{
		{"meta", core.MetaRecord{RunSeq: 1, LeaseSeq: 1, NextSweep: now.Add(time.Minute)}},
		{"token/" + tokName, core.TokenRecord{Name: tokName, CreatedAt: now, ExpiresAt: now.Add(time.Hour), Consumed: true, Worker: wID}},
		{"worker/" + string(wID), core.WorkerRecord{ID: wID, Name: wName, Token: tokName, Tags: []string{"script", tag}, Slots: 1,
			Grace: time.Minute, Active: false, CredExpiry: now, LastHeartbeat: now, EnrolledAt: now}},
		{"run/" + string(rid), core.RunRecord{ID: rid, Spec: core.RunSpec{Name: runName, Steps: []core.StepSpec{{Name: stepName, Command: "x"}}},
			SubmittedAt: now, Steps: []core.StepID{sid}, Failed: true, Finished: true, FinishedAt: now, CancelClass: ""}},
		{"step/" + string(sid), core.StepRecord{ID: sid, Run: rid, Name: stepName, Index: -1, State: core.StateFailed, Class: "execution", Message: msg,
			Attempts: 1, FinishedAt: now, EverStarted: true, Outcome: &core.Outcome{Status: core.OutcomeFailure, ExitCode: 1}}},
		{fmt.Sprintf("lease/%020d", 1), core.LeaseRecord{ID: 1, Step: sid, Worker: wID, GrantedAt: now, Started: true, Committed: true}},
		{fmt.Sprintf("log/%020d/%010d", 1, 0), core.StepLogLine{Step: sid, Lease: 1, Line: core.LogLine{Seq: 1, At: now, Text: logText}}},
		{fmt.Sprintf("event/%s/%08d", rid, 1), core.ServerEvent{Run: rid, Seq: 1, At: now, Kind: "run-failed\x1b[K", Step: sid, Message: "failed \u202eevil"}},
	}
	var recs []core.Record
	for _, r := range records {
		b, err := json.Marshal(r.v)
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, core.Record{Key: r.key, Value: b})
	}
	path := filepath.Join(t.TempDir(), "tether.db")
	st, err := store.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Apply(recs); err != nil {
		t.Fatal(err)
	}
	st.Close()
	d, err := orchestrator.Start(orchestrator.Options{Addr: "127.0.0.1:0", StorePath: path, AdminToken: "admin",
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()

	cli := func(args ...string) string {
		t.Helper()
		var stdout, stderr bytes.Buffer
		code := run(ctx, append(args, "--url", d.DataURL(), "--admin-token", "admin"), &stdout, &stderr, func(string) string { return "" })
		if code != exitOK {
			t.Fatalf("%q: exit %d: %s", args, code, stderr.String())
		}
		return stdout.String()
	}
	raw := func(s string) bool {
		return strings.ContainsFunc(s, func(r rune) bool { return r != '\n' && r != ' ' && !unicode.IsPrint(r) })
	}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"token", "list"}, []string{`"tok\x1b[2J"`, `"w\x1b]0;pwned\a" ("wid\r1")`}},
		{[]string{"worker", "list"}, []string{`"w\x1b]0;pwned\a"`, `"wid\r1"`, `script,"gpu\x00"`}},
		{[]string{"run", "list"}, []string{`"nightly\x1b[31m"`}},
		{[]string{"run", "show", "run-1"}, []string{`"nightly\x1b[31m"`, `"run-1/b\x1bc"`, `"w\x1b]0;pwned\a"`,
			`step exited with code 1: \x1b[31mred\r forged line`, `"run-failed\x1b[K"`, `failed \u202eevil`}},
	} {
		out := cli(c.args...)
		if raw(out) {
			t.Errorf("%q printed a raw control character:\n%q", c.args, out)
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("%q: output lacks %s:\n%s", c.args, w, out)
			}
		}
	}
	// The step's own output stays as it wrote it; its id is escaped.
	logs := cli("run", "logs", "run-1")
	if !strings.Contains(logs, `"run-1/b\x1bc" | `+logText+"\n") {
		t.Errorf("run logs: %q, want the escaped step id and the raw line %q", logs, logText)
	}
	// An error message from the orchestrator is escaped too.
	var stderr bytes.Buffer
	if code := run(ctx, []string{"token", "revoke", "x\x1b[2J", "--url", d.DataURL(), "--admin-token", "admin"}, io.Discard, &stderr, func(string) string { return "" }); code != exitRefused || raw(stderr.String()) {
		t.Errorf("token revoke of an unknown hostile name: exit %d, stderr %q; want %d, escaped", code, stderr.String(), exitRefused)
	}
}
