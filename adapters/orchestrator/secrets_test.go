package orchestrator_test

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/client"
	"github.com/tether-run/tether/core"
)

// leaseFor submits a one-step run of sp targeted at w and starts it.
func (r *dataRig) leaseFor(w *hand, sp core.StepSpec) core.Dispatch {
	r.t.Helper()
	sp.Target, sp.Command, sp.Writes = w.name, "true", true
	if _, err := r.d.Submit(r.ctx, core.RunSpec{Name: sp.Name, Steps: []core.StepSpec{sp}}); err != nil {
		r.t.Fatal(err)
	}
	dm, ok := w.recv().(core.Dispatch)
	if !ok {
		r.t.Fatalf("want a Dispatch, got %s", core.DescribeMsg(dm))
	}
	w.send(core.Start{Lease: dm.Lease, Request: 1})
	if m, ok := w.recv().(core.StartAck); !ok || !m.OK {
		r.t.Fatalf("want StartAck OK, got %s", core.DescribeMsg(m))
	}
	return dm
}

// TestSecrets: an operator stores, lists and removes secrets (audited,
// never shown); a step's lease reads exactly the secrets its step names
// and writes only those it names in put_secrets (403 otherwise, 409 once
// the lease ended); the store file holds no value in the clear (SPEC §14a).
func TestSecrets(t *testing.T) {
	r := startData(t, orchestrator.Options{})
	op := r.operator()
	value := []byte("hunter2-correct-horse\nline two")
	if _, err := op.PutSecret(r.ctx, "DB_PASS", value); err != nil {
		t.Fatal(err)
	}
	if _, err := op.PutSecret(r.ctx, "OTHER", []byte("other-value")); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct {
		name  string
		value []byte
	}{{"1BAD", []byte("x")}, {"DB_PASS", nil}, {"BIG", make([]byte, core.MaxSecretBytes+1)}} {
		var ce *client.Error
		if _, err := op.PutSecret(r.ctx, bad.name, bad.value); !errors.As(err, &ce) || (ce.Status != 400 && ce.Status != 413) {
			t.Fatalf("put %q (%d bytes): %v, want 400 or 413", bad.name, len(bad.value), err)
		}
	}
	list, err := op.Secrets(r.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Secrets) != 2 || list.Secrets[0].Name != "DB_PASS" || list.Secrets[0].Size != len(value) || list.Secrets[0].UpdatedBy != core.AdminOperator {
		t.Fatalf("secrets: %+v", list.Secrets)
	}

	w := r.enroll("w1")
	// Its env: values are sealed at rest too, live (nosy's run) and
	// archived (reader's, once it finished).
	dm := r.leaseFor(w, core.StepSpec{Name: "reader", Secrets: []string{"DB_PASS"}, PutSecrets: []string{"MINTED"}, Env: map[string]string{"E": "env-value-archived-7d2a"}})
	if !slices.Equal(dm.Secrets, []string{"DB_PASS"}) {
		t.Fatalf("the dispatch names secrets %q, want DB_PASS", dm.Secrets)
	}
	got := r.expect("GET", "/secret/DB_PASS", nil, w.cred, dm.Lease, 200)
	if !bytes.Equal(got.body, value) {
		t.Fatalf("GET /secret/DB_PASS = %q, want %q", got.body, value)
	}
	if msg := r.expect("GET", "/secret/OTHER", nil, w.cred, dm.Lease, 403).errorText(t); !strings.Contains(msg, "not declared") {
		t.Fatalf("undeclared read: %s", msg)
	}
	r.expect("GET", "/secret/DB_PASS", nil, w.cred, 0, 400)              // a read names its lease
	r.expect("GET", "/secret/DB_PASS", nil, "w1-id.nope", dm.Lease, 401) // and its credential
	r.expect("PUT", "/secret/DB_PASS", []byte("overwrite"), w.cred, dm.Lease, 403)
	var put client.Secret
	if err := json.Unmarshal(r.expect("PUT", "/secret/MINTED", []byte("minted-token-value"), w.cred, dm.Lease, 201).body, &put); err != nil {
		t.Fatal(err)
	}
	list, err = op.Secrets(r.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Secrets) != 3 || list.Secrets[0].Name != "DB_PASS" || list.Secrets[1].Name != "MINTED" || list.Secrets[1].UpdatedBy != "step "+string(dm.Step) {
		t.Fatalf("secrets after the step's put: %+v", list.Secrets)
	}
	if put != list.Secrets[1] { // the step hears what the record says (SPEC §14a)
		t.Fatalf("the step's put answered %+v; the record is %+v", put, list.Secrets[1])
	}

	other := r.leaseFor(w, core.StepSpec{Name: "nosy", Env: map[string]string{"E": "env-value-live-41c9"}})
	r.expect("GET", "/secret/DB_PASS", nil, w.cred, other.Lease, 403)
	w.finish(dm)
	r.expect("GET", "/secret/DB_PASS", nil, w.cred, dm.Lease, 409) // the lease ended

	if err := op.RemoveSecret(r.ctx, "OTHER"); err != nil {
		t.Fatal(err)
	}
	var ce *client.Error
	if err := op.RemoveSecret(r.ctx, "OTHER"); !errors.As(err, &ce) || ce.Status != 404 {
		t.Fatalf("second rm: %v, want 404", err)
	}
	audit, err := op.Audit(r.ctx, client.AuditOptions{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	var actions []string
	for _, e := range audit.Entries {
		if strings.HasPrefix(e.Action, "secret.") {
			actions = append(actions, e.Action+" "+e.Target+" "+e.Outcome)
		}
	}
	want := []string{"secret.rm OTHER refused", "secret.rm OTHER accepted", "secret.put MINTED accepted", "secret.put BIG refused", "secret.put DB_PASS refused",
		"secret.put 1BAD refused", "secret.put OTHER accepted", "secret.put DB_PASS accepted"}
	if !slices.Equal(actions, want) {
		t.Fatalf("audited:\n%s\nwant:\n%s", strings.Join(actions, "\n"), strings.Join(want, "\n"))
	}

	// Nothing of a value is in the clear on disk (nor encoded), and the
	// key sits apart from the store, mode 0600.
	r.d.Close()
	for _, v := range [][]byte{value, []byte("minted-token-value"), []byte("hunter2-correct-horse"), []byte("env-value-archived-7d2a"), []byte("env-value-live-41c9")} {
		for _, enc := range [][]byte{v, []byte(base64.StdEncoding.EncodeToString(v)), []byte(hex.EncodeToString(v))} {
			filepath.Walk(filepath.Dir(r.opts.StorePath), func(p string, fi os.FileInfo, err error) error {
				if err == nil && fi.Mode().IsRegular() {
					if b, _ := os.ReadFile(p); bytes.Contains(b, enc) {
						t.Errorf("%s holds %q", p, enc)
					}
				}
				return nil
			})
		}
	}
	if fi, err := os.Stat(r.opts.StorePath + ".secrets-key"); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("secrets key file: %v %v", fi, err)
	}
	// Sealed is not lost: the next start opens the runs and the secrets.
	r.restart()
	if h, err := r.operator().Run(r.ctx, string(dm.Run)); err != nil || h.Status != "success" {
		t.Fatalf("the archived run after a restart: %+v %v", h, err)
	}
	// Without its key file, the store is refused at start, naming it,
	// instead of a new key being made.
	r.d.Close()
	os.Rename(r.opts.StorePath+".secrets-key", r.opts.StorePath+".moved")
	if _, err := orchestrator.Start(r.opts); err == nil || !strings.Contains(err.Error(), "secrets key file") {
		t.Fatalf("a sealed store without its key: %v", err)
	}
}

// TestSecretsWrongKey: a store restarted with another key answers a
// secret's read with an error that names the key, never other bytes.
func TestSecretsWrongKey(t *testing.T) {
	dir := t.TempDir()
	r := startData(t, orchestrator.Options{StorePath: filepath.Join(dir, "tether.db")})
	if _, err := r.operator().PutSecret(r.ctx, "K", []byte("the-value")); err != nil {
		t.Fatal(err)
	}
	w := r.enroll("w1")
	other := filepath.Join(dir, "other.key")
	os.WriteFile(other, []byte(strings.Repeat("ab", 32)+"\n"), 0o600)
	r.opts.SecretsKeyFile = other
	r.restart()
	w = r.enroll("w2")
	dm := r.leaseFor(w, core.StepSpec{Name: "reader", Secrets: []string{"K"}})
	a := r.expect("GET", "/secret/K", nil, w.cred, dm.Lease, 500)
	if msg := a.errorText(t); !strings.Contains(msg, "secrets key") || strings.Contains(msg, "the-value") {
		t.Fatalf("wrong key: %s", msg)
	}
}
