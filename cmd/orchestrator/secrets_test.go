package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/tether-run/tether/adapters/orchestrator"
)

// secretsWorkflow: a step that reads DB_PASS as a file, one that reads it
// as an env var, each printing its digest and then the value itself (which
// must reach the logs as ***), one that names no secret and asks the
// data plane for it anyway, and one that writes the secret it names in
// put_secrets (201) and one it does not (403), through the step endpoint.
const secretsWorkflow = `name: secrets
steps:
  - name: files
    secrets: [DB_PASS]
    run: |
      test "$(stat -c %a "$TETHER_SECRETS_DIR")" = 700 || exit 21
      test "$(stat -c %a "$TETHER_SECRETS_DIR/DB_PASS")" = 600 || exit 22
      echo "file sha $(sha256sum < "$TETHER_SECRETS_DIR/DB_PASS" | cut -c1-64)"
      echo "dir $TETHER_SECRETS_DIR"
      echo "leak: $(cat "$TETHER_SECRETS_DIR/DB_PASS")"
      test -z "$DB_PASS" || exit 23
  - name: envform
    secrets: [DB_PASS]
    secrets_as: env
    run: |
      echo "env sha $(printf %s "$DB_PASS" | sha256sum | cut -c1-64)"
      echo "leak: $DB_PASS"
      test -z "$TETHER_SECRETS_DIR" || exit 24
  - name: nosy
    run: |
      code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $TETHER_DATA_TOKEN" "$TETHER_DATA_URL/secret/DB_PASS")
      echo "nosy got $code"
      test "$code" = 403 || exit 25
      test -z "$TETHER_SECRETS_DIR" || exit 26
  - name: minter
    put_secrets: [MINTED]
    run: |
      code=$(printf minted-in-a-step-5e1 | curl -s -o /dev/null -w '%{http_code}' -X PUT --data-binary @- -H "Authorization: Bearer $TETHER_DATA_TOKEN" "$TETHER_DATA_URL/secret/MINTED")
      echo "minter got $code"
      test "$code" = 201 || exit 27
      code=$(printf x | curl -s -o /dev/null -w '%{http_code}' -X PUT --data-binary @- -H "Authorization: Bearer $TETHER_DATA_TOKEN" "$TETHER_DATA_URL/secret/DB_PASS")
      test "$code" = 403 || exit 28
`

// TestSecretsEndToEnd is SPEC §14a's acceptance, with the real binaries: a
// secret put from stdin reaches exactly the steps that name it (as a 0600
// file in a 0700 directory removed afterwards, or as an env var); a step
// that does not name it is refused 403; and then neither the value nor
// its base64 or hex is found in the store files, a backup, the
// orchestrator's and the worker's logs, run show -o json, or the API's
// run, logs and events answers.
func TestSecretsEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binaries")
	}
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("the nosy step needs curl")
	}
	ctx, cancel := context.WithTimeout(t.Context(), e2eTimeout)
	defer cancel()
	orchBin, workerBin := buildBinaries(t, ctx)
	dataDir := filepath.Join(t.TempDir(), "data")
	serve := start(t, ctx, "orchestrator serve", orchBin, "serve", "--addr", "127.0.0.1:0", "--data-dir", dataDir, "--log-level", "debug")
	urlRE := regexp.MustCompile(`workers connect to: (ws://127\.0\.0\.1:\d+/control)`)
	var wsURL string
	poll(t, ctx, "serve to print its address", func() bool {
		m := urlRE.FindStringSubmatch(serve.stdout.String())
		if m != nil {
			wsURL = m[1]
		}
		return m != nil
	})
	httpURL := "http://" + strings.TrimSuffix(strings.TrimPrefix(wsURL, "ws://"), "/control")
	cli := func(stdin []byte, args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.CommandContext(ctx, orchBin, append(args, "--url", httpURL, "--data-dir", dataDir)...)
		cmd.Env = append(os.Environ(), "TETHER_ADMIN_TOKEN=")
		cmd.Stdin = bytes.NewReader(stdin)
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		cmd.Run()
		return o.String(), e.String(), cmd.ProcessState.ExitCode()
	}
	must := func(stdin []byte, args ...string) string {
		t.Helper()
		out, errOut, code := cli(stdin, args...)
		if code != 0 {
			t.Fatalf("orchestrator %q: exit %d\n%s", args, code, errOut)
		}
		return out
	}

	value := "tether-acceptance-S3cret-9f1c"
	sum := sha256.Sum256([]byte(value))
	digest := hex.EncodeToString(sum[:])
	must([]byte(value), "secret", "put", "DB_PASS")
	if _, errOut, code := cli(nil, "secret", "put", "EMPTY"); code != exitUsage || !strings.Contains(errOut, "empty") {
		t.Fatalf("an empty value: exit %d %q, want 2", code, errOut)
	}
	if list := must(nil, "secret", "list"); !strings.Contains(list, "DB_PASS") || !strings.Contains(list, "29") {
		t.Fatalf("secret list:\n%s", list)
	}
	// --from-file, byte for byte; a value over 64 KiB and a missing file
	// are usage errors; rm removes.
	big := filepath.Join(t.TempDir(), "big")
	os.WriteFile(big, make([]byte, 64<<10+1), 0o600)
	if _, errOut, code := cli(nil, "secret", "put", "BIG", "--from-file", big); code != exitUsage || !strings.Contains(errOut, "longer than 65536") {
		t.Fatalf("a value over the limit: exit %d %q, want 2", code, errOut)
	}
	if _, _, code := cli(nil, "secret", "put", "BIG", "--from-file", big+".none"); code != exitUsage {
		t.Fatalf("a missing file: exit %d, want 2", code)
	}
	small := filepath.Join(t.TempDir(), "small")
	os.WriteFile(small, []byte("x\n"), 0o600)
	var put struct{ Size int }
	if err := json.Unmarshal([]byte(must(nil, "secret", "put", "SMALL", "--from-file", small, "-o", "json")), &put); err != nil || put.Size != 2 {
		t.Fatalf("secret put --from-file: %+v %v", put, err)
	}
	must(nil, "secret", "rm", "SMALL")
	if _, _, code := cli(nil, "secret", "rm", "SMALL"); code != exitRefused {
		t.Fatalf("rm of an unknown secret: exit %d, want 3", code)
	}

	token := strings.TrimSpace(must(nil, "token", "create", "w1", "--ttl", "10m"))
	w := start(t, ctx, "worker w1", workerBin, "connect", "--url", wsURL, "--token", token, "--log-level", "debug")
	wf := filepath.Join(t.TempDir(), "secrets.yaml")
	os.WriteFile(wf, []byte(secretsWorkflow), 0o600)
	run := strings.TrimSpace(must(nil, "run", "submit", wf, "--wait"))
	var det orchestrator.APIRunDetail
	showJSON := must(nil, "run", "show", "run-1", "-o", "json")
	if err := json.Unmarshal([]byte(showJSON), &det); err != nil || det.Status != "success" {
		t.Fatalf("run %s: %v %s\n%s\n%s", run, err, det.Status, showJSON, must(nil, "run", "logs", "run-1"))
	}
	logs := must(nil, "run", "logs", "run-1")
	for _, want := range []string{"file sha " + digest, "env sha " + digest, "leak: ***", "nosy got 403", "minter got 201"} {
		if !strings.Contains(logs, want) {
			t.Errorf("run logs lack %q:\n%s", want, logs)
		}
	}
	if m := regexp.MustCompile(`dir (\S+)`).FindStringSubmatch(logs); m == nil {
		t.Errorf("no secrets dir in the logs:\n%s", logs)
	} else if _, err := os.Stat(m[1]); !os.IsNotExist(err) {
		t.Errorf("the secrets dir %s outlived its step: %v", m[1], err)
	}

	if list := must(nil, "secret", "list"); !strings.Contains(list, "MINTED") || !strings.Contains(list, "step run-1/minter") {
		t.Errorf("secret list lacks the step's put:\n%s", list)
	}

	// A secret nobody stored fails its step before the process starts.
	missing, ran := filepath.Join(t.TempDir(), "missing.yaml"), filepath.Join(t.TempDir(), "ran")
	os.WriteFile(missing, []byte("name: missing\nsteps:\n  - name: a\n    secrets: [MISSING]\n    run: touch "+ran+"\n"), 0o600)
	if _, errOut, code := cli(nil, "run", "submit", missing, "--wait"); code != 10 {
		t.Errorf("a step naming a missing secret: exit %d, want 10 (failed)\n%s", code, errOut)
	}
	if show := must(nil, "run", "show", "run-2"); !strings.Contains(show, "secrets: secret MISSING") {
		t.Errorf("run show does not say the secret is missing:\n%s", show)
	}
	if _, err := os.Stat(ran); !os.IsNotExist(err) {
		t.Errorf("the step's process ran without its secret: %v", err)
	}

	// The API's answers about the run.
	admin, _ := os.ReadFile(filepath.Join(dataDir, "admin-token"))
	var answers []byte
	for _, p := range []string{"/api/runs/run-1", "/api/runs/run-1/logs", "/api/runs/run-1/events", "/api/secrets", "/api/audit"} {
		req, _ := http.NewRequestWithContext(ctx, "GET", httpURL+p, nil)
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(admin)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: %d %s", p, resp.StatusCode, b)
		}
		answers = append(answers, b...)
	}
	if !bytes.Contains(answers, []byte("leak: ***")) {
		t.Fatalf("the API's answers lack the redacted lines:\n%s", answers)
	}
	backup := filepath.Join(t.TempDir(), "backup.db")
	must(nil, "store", "backup", backup)

	// Stop both, so their logs are whole, then look everywhere.
	w.signal(t, 15)
	w.wait(t, ctx)
	serve.signal(t, 15)
	serve.wait(t, ctx)
	needles := map[string][]byte{
		"the value":        []byte(value),
		"the minted value": []byte("minted-in-a-step-5e1"),
		"base64":           []byte(base64.StdEncoding.EncodeToString([]byte(value))),
		"base64url":        []byte(base64.RawURLEncoding.EncodeToString([]byte(value))),
		"hex":              []byte(hex.EncodeToString([]byte(value))),
	}
	hay := map[string][]byte{
		"run show -o json":          []byte(showJSON),
		"run logs":                  []byte(logs),
		"the API's answers":         answers,
		"the orchestrator's stdout": []byte(serve.stdout.String()),
		"the orchestrator's stderr": []byte(serve.stderr.String()),
		"the worker's stdout":       []byte(w.stdout.String()),
		"the worker's stderr":       []byte(w.stderr.String()),
	}
	for _, dir := range []string{dataDir, filepath.Dir(backup)} {
		filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
			if err == nil && fi.Mode().IsRegular() {
				b, _ := os.ReadFile(p)
				hay[p] = b
			}
			return nil
		})
	}
	if _, ok := hay[backup]; !ok {
		t.Fatalf("no backup at %s", backup)
	}
	for where, b := range hay {
		for what, n := range needles {
			if bytes.Contains(b, n) {
				t.Errorf("%s holds %s of the secret", where, what)
			}
		}
	}
}
