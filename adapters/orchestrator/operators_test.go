package orchestrator_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/adapters/store"
	"github.com/tether-run/tether/client"
	"github.com/tether-run/tether/core"
)

// auditOf returns the whole audit log, newest first, following the cursor.
func auditOf(t *testing.T, ctx context.Context, c *client.Client, o client.AuditOptions) []client.AuditEntry {
	t.Helper()
	var out []client.AuditEntry
	for {
		page, err := c.Audit(ctx, o)
		if err != nil {
			t.Fatalf("audit: %v", err)
		}
		out = append(out, page.Entries...)
		if page.NextCursor == "" {
			return out
		}
		o.Cursor = page.NextCursor
	}
}

func clientFor(t *testing.T, d *orchestrator.Driver, token string) *client.Client {
	t.Helper()
	c, err := client.New(d.DataURL(), token)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestReadOnlyOperatorToken walks every route of the operator API with a
// read-only token: each GET is served (whatever its answer, never 401 or
// 403), each other method (and the backup, a copy of everything) is
// refused 403 forbidden, changes nothing, and
// leaves one refused audit entry naming the token. /metrics, when a
// metrics token is set, takes the read-only token too. Once revoked, the
// token is refused 401 everywhere.
func TestReadOnlyOperatorToken(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	d, err := orchestrator.Start(orchestrator.Options{Addr: "127.0.0.1:0", StorePath: filepath.Join(t.TempDir(), "tether.db"),
		AdminToken: adminToken, MetricsToken: "scrape-secret", Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	admin := clientFor(t, d, adminToken)
	ro, err := admin.CreateOperatorToken(ctx, "dash", true)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(ro.Token, "dash.") || !ro.ReadOnly {
		t.Fatalf("created %+v, want a read-only token dash.<secret>", ro)
	}
	send := func(method, path, tok string) (int, client.ErrorBody) {
		req, _ := http.NewRequestWithContext(ctx, method, d.DataURL()+path, strings.NewReader("{}"))
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var e client.ErrorBody
		json.NewDecoder(resp.Body).Decode(&e)
		return resp.StatusCode, e
	}
	mutating := 0
	for _, rt := range orchestrator.APIRouteList() {
		if rt.Public {
			continue
		}
		path := rt.Path
		for _, p := range []string{"{id}", "{run}", "{step}", "{name}", "{fingerprint}", "{version}"} {
			path = strings.ReplaceAll(path, p, "x")
		}
		code, e := send(rt.Method, path, ro.Token)
		if rt.Method == http.MethodGet && !rt.Full {
			if code == http.StatusUnauthorized || code == http.StatusForbidden {
				t.Errorf("read-only GET %s: HTTP %d %s, want it served", rt.Path, code, e.Message)
			}
			continue
		}
		mutating++
		if code != http.StatusForbidden || e.Code != client.CodeForbidden {
			t.Errorf("read-only %s %s: HTTP %d code %q, want 403 forbidden", rt.Method, rt.Path, code, e.Code)
		}
	}
	if mutating < 8 {
		t.Fatalf("only %d routes change something: the walk missed the table", mutating)
	}
	runs, err := admin.Runs(ctx, client.RunsOptions{})
	if err != nil || len(runs.Runs) != 0 {
		t.Fatalf("a refused call changed something: runs %+v, %v", runs, err)
	}
	refused := auditOf(t, ctx, admin, client.AuditOptions{Actor: "dash"})
	if len(refused) != mutating {
		t.Errorf("%d audit entries for dash, want one per refused route (%d): %+v", len(refused), mutating, refused)
	}
	for _, e := range refused {
		if e.Outcome != core.OutcomeRefused || e.Code != client.CodeForbidden {
			t.Errorf("audit entry %+v, want refused forbidden", e)
		}
	}

	if code, _ := send("GET", "/metrics", ro.Token); code != http.StatusOK {
		t.Errorf("/metrics with a read-only operator token: HTTP %d, want 200", code)
	}
	if code, _ := send("GET", "/metrics", "wrong"); code != http.StatusUnauthorized {
		t.Errorf("/metrics with a wrong token: HTTP %d, want 401", code)
	}

	if err := admin.RevokeOperatorToken(ctx, "dash"); err != nil {
		t.Fatal(err)
	}
	if code, e := send("GET", "/api/runs", ro.Token); code != http.StatusUnauthorized || e.Code != client.CodeUnauthorized {
		t.Errorf("revoked token: HTTP %d %q, want 401 unauthorized", code, e.Code)
	}
	if code, _ := send("GET", "/metrics", ro.Token); code != http.StatusUnauthorized {
		t.Errorf("/metrics with a revoked operator token: HTTP %d, want 401", code)
	}
	list, err := admin.OperatorTokens(ctx)
	if err != nil || len(list.OperatorTokens) != 2 || !list.OperatorTokens[1].Revoked || list.OperatorTokens[0].Name != core.AdminOperator {
		t.Fatalf("operator tokens %+v, %v; want admin and dash (revoked)", list, err)
	}
	b, _ := json.Marshal(list)
	if strings.Contains(string(b), strings.TrimPrefix(ro.Token, "dash.")) {
		t.Fatalf("the list shows a secret: %s", b)
	}
}

// applyLog wraps the bbolt store and keeps every batch it made durable.
type applyLog struct {
	*store.Store
	mu      sync.Mutex
	batches [][]core.Record
}

func (s *applyLog) Apply(recs []core.Record) error {
	err := s.Store.Apply(recs)
	if err == nil {
		s.mu.Lock()
		s.batches = append(s.batches, append([]core.Record(nil), recs...))
		s.mu.Unlock()
	}
	return err
}

func (s *applyLog) ApplyWithData(recs []core.Record, ops []store.DataOp) ([]store.DataResult, error) {
	res, err := s.Store.ApplyWithData(recs, ops)
	if err == nil {
		s.mu.Lock()
		s.batches = append(s.batches, append([]core.Record(nil), recs...))
		s.mu.Unlock()
	}
	return res, err
}

// TestAuditEveryAction: every operator action leaves exactly one audit
// entry with the acting token's name, accepted or refused (by the core or
// before it) with its code; the entry of an accepted action is in the very
// commit that made the action durable; the admin token of an existing data
// directory still works after a restart, and the log survives it.
func TestAuditEveryAction(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	path := filepath.Join(t.TempDir(), "tether.db")
	bst, err := store.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	st := &applyLog{Store: bst}
	d, err := orchestrator.Start(orchestrator.Options{Addr: "127.0.0.1:0", Store: st, AdminToken: adminToken, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	admin := clientFor(t, d, adminToken)
	ops, err := admin.CreateOperatorToken(ctx, "ops", false)
	if err != nil {
		t.Fatal(err)
	}
	c := clientFor(t, d, ops.Token)
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	run1, err := c.Submit(ctx, "gated.yaml", []byte("name: gated\nsteps:\n  - name: a\n    run: \"true\"\n    hold: true\n  - name: b\n    run: \"true\"\n    hold: true\n"))
	must("submit", err)
	waitHeld := func() {
		for {
			rd, err := c.Run(ctx, run1)
			must("run", err)
			held := 0
			for _, s := range rd.Steps {
				if s.State == "held" {
					held++
				}
			}
			if held == 2 {
				return
			}
			select {
			case <-ctx.Done():
				t.Fatalf("steps never held: %+v", rd.Steps)
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	waitHeld()
	_, err = c.Approve(ctx, run1+"/a")
	must("approve", err)
	_, err = c.Reject(ctx, run1+"/b")
	must("reject", err)
	run2, err := c.Submit(ctx, "two.yaml", []byte("name: two\nsteps:\n  - name: a\n    run: \"true\"\n"))
	must("submit 2", err)
	must("cancel", c.Cancel(ctx, run2, "enough"))
	_, err = c.CreateToken(ctx, "w1", time.Hour)
	must("token create", err)
	must("token revoke", c.RevokeToken(ctx, "w1"))
	_, err = c.CreateOperatorToken(ctx, "temp", true)
	must("operator create", err)
	must("operator revoke", c.RevokeOperatorToken(ctx, "temp"))
	// Refused: by the core (a step no longer held), before it (a finished
	// run, archived; an unknown run; an invalid definition).
	if _, err := c.Approve(ctx, run1+"/a"); client.ErrorCode(err) != client.CodeConflict {
		t.Fatalf("approve of a step no longer held: %v, want conflict", err)
	}
	if err := c.Cancel(ctx, run2, ""); client.ErrorCode(err) != client.CodeConflict {
		t.Fatalf("cancel of a finished run: %v, want conflict", err)
	}
	if err := c.Cancel(ctx, "run-99", ""); client.ErrorCode(err) != client.CodeNotFound {
		t.Fatalf("cancel of an unknown run: %v, want not_found", err)
	}
	if _, err := c.Submit(ctx, "bad.yaml", []byte("name: bad\nsteps: []\n")); client.ErrorCode(err) != client.CodeInvalid {
		t.Fatalf("an invalid submit: %v, want invalid", err)
	}

	want := []struct{ action, target, outcome string }{
		{core.ActionSubmit, run1, core.OutcomeAccepted},
		{core.ActionApprove, run1 + "/a", core.OutcomeAccepted},
		{core.ActionReject, run1 + "/b", core.OutcomeAccepted},
		{core.ActionSubmit, run2, core.OutcomeAccepted},
		{core.ActionCancel, run2, core.OutcomeAccepted},
		{core.ActionTokenCreate, "w1", core.OutcomeAccepted},
		{core.ActionTokenRevoke, "w1", core.OutcomeAccepted},
		{core.ActionOperatorCreate, "temp (read-only)", core.OutcomeAccepted},
		{core.ActionOperatorRevoke, "temp", core.OutcomeAccepted},
		{core.ActionApprove, run1 + "/a", core.OutcomeRefused},
		{core.ActionCancel, run2, core.OutcomeRefused},
		{core.ActionCancel, "run-99", core.OutcomeRefused},
		{core.ActionSubmit, "bad.yaml", core.OutcomeRefused},
	}
	check := func(c *client.Client) {
		t.Helper()
		got := auditOf(t, ctx, c, client.AuditOptions{Actor: "ops", Limit: 5})
		if len(got) != len(want) {
			t.Fatalf("%d audit entries for ops, want %d: %+v", len(got), len(want), got)
		}
		for i, w := range want {
			e := got[len(got)-1-i] // newest first
			if e.Actor != "ops" || e.Action != w.action || e.Target != w.target || e.Outcome != w.outcome {
				t.Errorf("audit entry %d: %+v, want %s %s %s by ops", i, e, w.action, w.target, w.outcome)
			}
			if (e.Outcome == core.OutcomeRefused) != (e.Code != "") {
				t.Errorf("audit entry %d: %+v: a refusal, and only one, has a code", i, e)
			}
		}
		if got := auditOf(t, ctx, c, client.AuditOptions{Action: core.ActionOperatorCreate}); len(got) != 3 || got[2].Actor != core.ActorServer || got[1].Actor != core.AdminOperator {
			t.Errorf("operator-token.create entries %+v, want admin by (server), ops by admin, temp by ops", got)
		}
	}
	check(c)

	// The submit's entry is in the commit that holds the run.
	st.mu.Lock()
	together := false
	for _, b := range st.batches {
		run, audit := false, false
		for _, r := range b {
			run = run || r.Key == "run/"+run1
			if core.IsAuditKey(r.Key) && strings.Contains(string(r.Value), `"run.submit"`) && strings.Contains(string(r.Value), `"`+run1+`"`) {
				audit = true
			}
		}
		if run && audit {
			together = true
		}
	}
	st.mu.Unlock()
	if !together {
		t.Errorf("no commit holds both %s's first record and its audit entry", run1)
	}

	// Restart on the same data: the admin token still works, no second
	// admin token is recorded, the log is whole, the tokens are kept.
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	d2, err := orchestrator.Start(orchestrator.Options{Addr: "127.0.0.1:0", StorePath: path, AdminToken: adminToken, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d2.Close() })
	admin2 := clientFor(t, d2, adminToken)
	check(admin2)
	if _, err := clientFor(t, d2, ops.Token).Runs(ctx, client.RunsOptions{}); err != nil {
		t.Errorf("ops after the restart: %v", err)
	}
}

// TestAuditRetention: the retention's pruner deletes the audit entries
// recorded before its cutoff and keeps the later ones.
func TestAuditRetention(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	d, err := orchestrator.Start(orchestrator.Options{Addr: "127.0.0.1:0", StorePath: filepath.Join(t.TempDir(), "tether.db"),
		AdminToken: adminToken, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	admin := clientFor(t, d, adminToken)
	for _, n := range []string{"old-1", "old-2"} {
		if _, err := admin.CreateToken(ctx, n, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	old := auditOf(t, ctx, admin, client.AuditOptions{})
	cutoff := old[0].At.Add(time.Nanosecond)
	for !time.Now().After(cutoff) { // the next entry's clock reading is past the cutoff
		time.Sleep(time.Millisecond)
	}
	if _, err := admin.CreateToken(ctx, "new", time.Hour); err != nil {
		t.Fatal(err)
	}
	st, err := orchestrator.PruneOnce(d, cutoff)
	if err != nil {
		t.Fatal(err)
	}
	left := auditOf(t, ctx, admin, client.AuditOptions{})
	if st.Audit != len(old) || len(left) != 1 || left[0].Target != "new" {
		t.Fatalf("pruned %d of the %d old entries; left %+v, want only the token new's", st.Audit, len(old), left)
	}
}

// TestWebSessionActsAsItsToken: a status page session acts with the
// operator token it logged in with: its cancel is audited under that
// token's name; a read-only session sees the pages but its actions are
// refused 403 (audited) and change nothing; revoking the token ends the
// session.
func TestWebSessionActsAsItsToken(t *testing.T) {
	r := startAPI(t)
	admin := r.client()
	ops, err := admin.CreateOperatorToken(r.ctx, "alice", false)
	r.ok("create alice", err)
	view, err := admin.CreateOperatorToken(r.ctx, "viewer", true)
	r.ok("create viewer", err)
	var sub orchestrator.APISubmitted
	r.expect("POST", "/runs", []byte("name: held\nsteps:\n  - name: a\n    hold: true\n    run: echo a\n"), http.StatusCreated, &sub)

	ro := newWebClient(t, r)
	if a := ro.login(view.Token); a.code != http.StatusSeeOther {
		t.Fatalf("read-only login: HTTP %d", a.code)
	}
	tok := ro.csrf("/runs/" + sub.Run) // the page is served (the logout form carries the token)
	if a := ro.do("GET", "/runs/"+sub.Run, nil, nil); strings.Contains(a.body, `id="cancel-form"`) || strings.Contains(a.body, `class="approve"`) {
		t.Errorf("a read-only session's run page offers actions it may not take")
	}
	if a := ro.do("POST", "/runs/"+sub.Run+"/cancel", url.Values{"csrf": {tok}}, nil); a.code != http.StatusForbidden {
		t.Errorf("a read-only session's cancel: HTTP %d, want 403: %.300s", a.code, a.body)
	}
	if a := ro.do("POST", "/steps/approve", url.Values{"csrf": {tok}, "step": {sub.Run + "/a"}}, nil); a.code != http.StatusForbidden {
		t.Errorf("a read-only session's approve: HTTP %d, want 403", a.code)
	}
	if det := r.waitRun(sub.Run, "running", func(orchestrator.APIRunDetail) bool { return true }); det.Status != "running" || det.Steps[0].State != "held" {
		t.Fatalf("a read-only session changed the run: %s, step %s", det.Status, det.Steps[0].State)
	}

	rw := newWebClient(t, r)
	if a := rw.login(ops.Token); a.code != http.StatusSeeOther {
		t.Fatalf("login: HTTP %d", a.code)
	}
	tok = rw.csrf("/runs/" + sub.Run)
	if a := rw.do("GET", "/runs/"+sub.Run, nil, nil); !strings.Contains(a.body, `id="cancel-form"`) || !strings.Contains(a.body, `class="approve"`) {
		t.Errorf("a full session's run page lacks the cancel form or the approve button")
	}
	if a := rw.do("POST", "/runs/"+sub.Run+"/cancel", url.Values{"csrf": {tok}}, nil); a.code != http.StatusSeeOther {
		t.Fatalf("cancel: HTTP %d: %.300s", a.code, a.body)
	}
	got := auditOf(t, r.ctx, admin, client.AuditOptions{Action: core.ActionCancel})
	if len(got) != 2 || got[0].Actor != "alice" || got[0].Outcome != core.OutcomeAccepted ||
		got[1].Actor != "viewer" || got[1].Code != client.CodeForbidden {
		t.Errorf("cancel entries %+v, want viewer's refused (forbidden), then alice's accepted", got)
	}
	if got := auditOf(t, r.ctx, admin, client.AuditOptions{Action: core.ActionApprove}); len(got) != 1 || got[0].Actor != "viewer" {
		t.Errorf("approve entries %+v, want viewer's refusal", got)
	}

	r.ok("revoke alice", admin.RevokeOperatorToken(r.ctx, "alice"))
	if a := rw.do("GET", "/", nil, nil); a.code != http.StatusSeeOther || !strings.HasPrefix(a.h.Get("Location"), "/login") {
		t.Errorf("a revoked token's session: HTTP %d to %q, want a redirect to /login", a.code, a.h.Get("Location"))
	}
}

// TestAdminSharedRefusesAnotherToken: on a shared store (SPEC §11, §15a)
// an orchestrator whose admin-token file differs from the store's is
// refused at Start and writes nothing; on a store of its own the same
// start is a reset of the token, and the old one stops working.
func TestAdminSharedRefusesAnotherToken(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tether.db")
	start := func(token string, shared bool) (*orchestrator.Driver, error) {
		return orchestrator.Start(orchestrator.Options{Addr: "127.0.0.1:0", StorePath: path, AdminToken: token, AdminShared: shared, Logger: testLogger(t)})
	}
	d, err := start("first-admin-token", true) // the first start sets it
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	if _, err := start("other-admin-token", true); !errors.Is(err, orchestrator.ErrAdminMismatch) {
		t.Fatalf("a shared store started with another admin token: %v; want ErrAdminMismatch", err)
	}
	d, err = start("first-admin-token", true) // the same token still leads, and still works
	if err != nil {
		t.Fatalf("the store's own admin token refused after a mismatch: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	if code, _ := get(t, ctx, d.APIURL()+"/runs", "first-admin-token"); code != http.StatusOK {
		t.Errorf("the admin token after a refused start: %d; want 200", code)
	}
	d.Close()
	d, err = start("other-admin-token", false) // not shared: a reset
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if code, _ := get(t, ctx, d.APIURL()+"/runs", "first-admin-token"); code != http.StatusUnauthorized {
		t.Errorf("the replaced admin token after a reset: %d; want 401", code)
	}
}

// TestOperatorCallRefusals: a refusal's status follows the core's code
// (SPEC §15): an invalid operator token name 400 `invalid`, an unknown one
// 404 `not_found`, a name taken 409 `conflict`, and the audit entry says the
// code the caller heard; a secret with no secrets key 503 `unavailable`.
func TestOperatorCallRefusals(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	st, err := store.Open(filepath.Join(t.TempDir(), "tether.db")) // given as Options.Store, without a secrets key
	if err != nil {
		t.Fatal(err)
	}
	d, err := orchestrator.Start(orchestrator.Options{Addr: "127.0.0.1:0", Store: st, AdminToken: adminToken, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	admin := clientFor(t, d, adminToken)
	refused := func(what string, err error, status int, code client.Code) {
		t.Helper()
		var e *client.Error
		if !errors.As(err, &e) || e.Status != status || e.Code != code {
			t.Errorf("%s: %v, want HTTP %d %s", what, err, status, code)
		}
	}
	_, err = admin.CreateOperatorToken(ctx, "bad name!", false)
	refused("an operator token named \"bad name!\"", err, http.StatusBadRequest, client.CodeInvalid)
	refused("revoking an unknown operator token", admin.RevokeOperatorToken(ctx, "nosuch"), http.StatusNotFound, client.CodeNotFound)
	if _, err := admin.CreateOperatorToken(ctx, "ops", false); err != nil {
		t.Fatal(err)
	}
	_, err = admin.CreateOperatorToken(ctx, "ops", true)
	refused("a second operator token named ops", err, http.StatusConflict, client.CodeConflict)
	_, err = admin.PutSecret(ctx, "K", []byte("v"))
	refused("a secret put without a secrets key", err, http.StatusServiceUnavailable, client.CodeUnavailable)

	codes := map[string]string{}
	for _, e := range auditOf(t, ctx, admin, client.AuditOptions{}) {
		if e.Outcome == "refused" {
			codes[e.Target] = string(e.Code)
		}
	}
	for target, want := range map[string]client.Code{"bad name!": client.CodeInvalid, "nosuch": client.CodeNotFound, "ops": client.CodeConflict} {
		if codes[target] != string(want) {
			t.Errorf("the audit's refusal of %q: code %q, want %q (the code answered)", target, codes[target], want)
		}
	}
}

// TestAuditActionEveryChange: every route that changes something is
// audited under a named action (SPEC §15a: `run.rerun`, `secret.put`, …),
// so a refusal before the core is found by its action like the core's own.
func TestAuditActionEveryChange(t *testing.T) {
	n := 0
	for _, rt := range orchestrator.APIRouteList() {
		if rt.Method == http.MethodGet || rt.Public {
			continue
		}
		n++
		if a := orchestrator.AuditAction(rt.Method, rt.Path); strings.ContainsAny(a, " /") {
			t.Errorf("%s %s is audited as %q, not a named action", rt.Method, rt.Path, a)
		}
	}
	if n < 16 {
		t.Fatalf("only %d routes change something: the walk missed the table", n)
	}
}
