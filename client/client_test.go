package client_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/adapters/store"
	"github.com/tether-run/tether/client"
)

const admin = "client-test-admin-token-0123456789"

// secretsKey seals the test orchestrator's secrets and runs (SPEC §14a);
// a backup is checked with it put next to the copy.
var secretsKey = bytes.Repeat([]byte{0x5a}, 32)

func start(t *testing.T) (*client.Client, context.Context) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	d, err := orchestrator.Start(orchestrator.Options{
		Addr: "127.0.0.1:0", StorePath: filepath.Join(t.TempDir(), "tether.db"), AdminToken: admin, SecretsKey: secretsKey,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	c, err := client.New(d.DataURL()+"/", admin) // a trailing slash, no /api
	if err != nil {
		t.Fatal(err)
	}
	return c, ctx
}

func must[T any](t *testing.T, what string) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return v
	}
}

// TestClientAgainstDriver calls every method of the client against a real
// orchestrator and checks what each answers: a run submitted, listed,
// shown, its held steps approved and
// rejected, cancelled; tokens created, listed, revoked; a bundle stored and
// described; a backup streamed; errors typed.
func TestClientAgainstDriver(t *testing.T) {
	c, ctx := start(t)

	src := "name: gates\nsteps:\n  - name: publish\n    hold: true\n    run: echo ship\n  - name: drop\n    hold: true\n    run: echo drop\n" +
		"  - name: after\n    depends_on: [drop]\n    run: echo after\n"
	run := must[string](t, "Submit")(c.Submit(ctx, "gates.yaml", []byte(src)))
	if run != "run-1" {
		t.Fatalf("Submit: %q, want run-1", run)
	}
	list := must[*client.RunList](t, "Runs")(c.Runs(ctx, client.RunsOptions{Limit: 5, Name: "gates"}))
	if len(list.Runs) != 1 || list.Runs[0].ID != run || list.Runs[0].Steps != 3 {
		t.Fatalf("Runs: %+v", list)
	}
	if l := must[*client.RunList](t, "Runs")(c.Runs(ctx, client.RunsOptions{Name: "other"})); len(l.Runs) != 0 {
		t.Fatalf("Runs of another workflow: %+v", l)
	}
	det := must[*client.RunDetail](t, "Run")(c.Run(ctx, run))
	if det.Run.ID != run || len(det.Steps) != 3 || det.Status != "running" {
		t.Fatalf("Run: %+v", det)
	}
	ans := must[*client.StepAnswer](t, "Approve")(c.Approve(ctx, run+"/publish"))
	if ans.Step != run+"/publish" || ans.State != "queued" {
		t.Fatalf("Approve: %+v", ans)
	}
	ans = must[*client.StepAnswer](t, "Reject")(c.Reject(ctx, run+"/drop"))
	if ans.State != "cancelled" {
		t.Fatalf("Reject: %+v", ans)
	}
	if _, err := c.Approve(ctx, run+"/drop"); client.ErrorCode(err) != client.CodeConflict {
		t.Fatalf("Approve of a rejected step: %v, want code conflict", err)
	}
	logs := must[*client.Logs](t, "Logs")(c.Logs(ctx, run, "drop"))
	if logs.Run != run || logs.Step != "drop" || logs.Lines == nil {
		t.Fatalf("Logs: %+v", logs)
	}
	if _, err := c.Logs(ctx, run, "nope"); client.ErrorCode(err) != client.CodeNotFound {
		t.Fatalf("Logs of an unknown step: %v, want code not_found", err)
	}
	if err := c.Cancel(ctx, run, "enough"); err != nil {
		t.Fatalf("Cancel: %v", err)
	}
	for {
		det = must[*client.RunDetail](t, "Run")(c.Run(ctx, run))
		if det.Status == "cancelled" {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the run never ended cancelled: %+v", det)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if det.Run.CancelReason != "enough" {
		t.Fatalf("cancel reason %q, want enough", det.Run.CancelReason)
	}

	tok := must[*client.CreatedToken](t, "CreateToken")(c.CreateToken(ctx, "w1", 2*time.Hour))
	if tok.Name != "w1" || tok.Token == "" || time.Until(tok.ExpiresAt) < time.Hour {
		t.Fatalf("CreateToken: %+v", tok)
	}
	if err := c.RevokeToken(ctx, "w1"); err != nil {
		t.Fatalf("RevokeToken: %v", err)
	}
	toks := must[*client.TokenList](t, "Tokens")(c.Tokens(ctx))
	if len(toks.Tokens) != 1 || toks.Tokens[0].State != "revoked" {
		t.Fatalf("Tokens: %+v", toks)
	}
	if err := c.RevokeToken(ctx, "nope"); client.ErrorCode(err) != client.CodeNotFound {
		t.Fatalf("RevokeToken of an unknown token: %v", err)
	}
	if ws := must[*client.WorkerList](t, "Workers")(c.Workers(ctx)); ws.Workers == nil || len(ws.Workers) != 0 {
		t.Fatalf("Workers: %+v", ws)
	}

	b := must[*client.Bundle](t, "PutBundle")(c.PutBundle(ctx, bytes.NewReader([]byte("not a tar"))))
	if len(b.Fingerprint) != 64 || b.Size != 9 || b.Tar || b.Existed {
		t.Fatalf("PutBundle: %+v", b)
	}
	if again := must[*client.Bundle](t, "PutBundle")(c.PutBundle(ctx, bytes.NewReader([]byte("not a tar")))); !again.Existed {
		t.Fatalf("PutBundle of the same bytes: %+v, want Existed", again)
	}
	if got := must[*client.Bundle](t, "Bundle")(c.Bundle(ctx, b.Fingerprint)); got.Fingerprint != b.Fingerprint || got.Size != 9 {
		t.Fatalf("Bundle: %+v", got)
	}
	if _, err := c.DataVersions(ctx, "none"); client.ErrorCode(err) != client.CodeNotFound {
		t.Fatalf("DataVersions of nothing: %v", err)
	}
	if _, err := c.Data(ctx, "none", "latest"); client.ErrorCode(err) != client.CodeNotFound {
		t.Fatalf("Data of nothing: %v", err)
	}
	// Secrets (SPEC §14a): stored, listed without a value, removed.
	if s := must[*client.Secret](t, "PutSecret")(c.PutSecret(ctx, "TOKEN", []byte("v4lue"))); s.Name != "TOKEN" || s.Size != 5 {
		t.Fatalf("PutSecret: %+v", s)
	}
	if l := must[*client.SecretList](t, "Secrets")(c.Secrets(ctx)); len(l.Secrets) != 1 || l.Secrets[0].Name != "TOKEN" || l.Secrets[0].UpdatedBy != "admin" {
		t.Fatalf("Secrets: %+v", l)
	}
	if err := c.RemoveSecret(ctx, "NONE"); client.ErrorCode(err) != client.CodeNotFound {
		t.Fatalf("RemoveSecret of nothing: %v", err)
	}
	if _, err := c.PutSecret(ctx, "bad-name", []byte("x")); client.ErrorCode(err) != client.CodeInvalid {
		t.Fatalf("PutSecret of a bad name: %v", err)
	}
	rc := must[io.ReadCloser](t, "Backup")(c.Backup(ctx))
	dst := filepath.Join(t.TempDir(), "backup.db")
	err := store.Unpack(rc, dst)
	rc.Close()
	if err != nil {
		t.Fatalf("unpacking the backup: %v", err)
	}
	if _, err := store.Check(dst); !errors.Is(err, store.ErrNoSecretsKey) {
		t.Fatalf("checking the backup without its key: %v", err)
	}
	os.WriteFile(dst+".secrets-key", []byte(hex.EncodeToString(secretsKey)), 0o600)
	if rep, err := store.Check(dst); err != nil || !rep.Sound() {
		t.Fatalf("the backup: %v %v", rep, err)
	}
	var doc map[string]any
	if err := json.Unmarshal(must[[]byte](t, "OpenAPI")(c.OpenAPI(ctx)), &doc); err != nil || doc["paths"] == nil {
		t.Fatalf("OpenAPI: %v %v", doc, err)
	}
}

// New refuses a URL that is not http(s)://HOST.
func TestNewRefusesBadURLs(t *testing.T) {
	for _, u := range []string{"", "localhost:7420", "ftp://h", "http://"} {
		if _, err := client.New(u, "t"); err == nil {
			t.Errorf("New(%q) accepted", u)
		}
	}
}
