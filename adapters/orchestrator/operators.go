package orchestrator

// Operator tokens and the audit log (SPEC §15a). The core keeps the
// operator tokens (records, restored at start) and decides every operator
// call with an audit entry in the same durable batch. The HTTP side
// authenticates a request's bearer against a read-only copy of the
// tokens, replaced by the loop whenever a released group changed them: no
// loop round trip per request. A read-only token may call every GET of
// the API; anything else is answered 403 (forbidden) and audited.

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/tether-run/tether/adapters/store"
	"github.com/tether-run/tether/client"
	"github.com/tether-run/tether/core"
)

// operatorView is the HTTP side's copy of the operator tokens, by name.
type operatorView map[string]core.OperatorRecord

// refreshOperators replaces the copy from the core (loop goroutine, or
// Start before the loop runs).
func (d *Driver) refreshOperators() {
	v := operatorView{}
	for _, t := range d.o.Operators() {
		v[t.Name] = t
	}
	d.operators.Store(&v)
}

// changesOperators says whether a released batch changed an operator token.
func changesOperators(rd core.Ready) bool {
	for _, e := range rd.Audit {
		if e.Outcome == core.OutcomeAccepted && strings.HasPrefix(e.Action, "operator-token.") {
			return true
		}
	}
	return false
}

// operator finds the live operator token of a bearer: "<name>.<secret>"
// names its token; a bearer without a name (the admin-token file's) is
// the admin token's. The hash is compared in constant time.
func (d *Driver) operator(tok string) (core.OperatorRecord, bool) {
	v := d.operators.Load()
	if tok == "" || v == nil {
		return core.OperatorRecord{}, false
	}
	name, _, named := strings.Cut(tok, ".")
	t, ok := (*v)[name]
	if !named || !ok {
		t, ok = (*v)[core.AdminOperator]
	}
	got := sha256.Sum256([]byte(tok))
	if !ok || subtle.ConstantTimeCompare(got[:], t.Hash[:]) != 1 || t.Revoked {
		return core.OperatorRecord{}, false
	}
	return t, true
}

// ---- the actor of a call ----

type actorKey struct{}

// WithActor returns ctx carrying the operator token name that the
// Driver's calls record as their actor (SPEC §15a); the operator API sets
// it from the request's token. Without one the actor is core.ActorLocal.
func WithActor(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, actorKey{}, name)
}

func actorOf(ctx context.Context) string {
	s, _ := ctx.Value(actorKey{}).(string)
	return s
}

// auditNote, in a request's context, says whether the core answered one
// of its calls (and so audited it): the API audits a refusal only when
// the core did not.
type auditNote struct{ decided bool }

type noteKey struct{}

func noted(ctx context.Context) {
	if n, ok := ctx.Value(noteKey{}).(*auditNote); ok {
		n.decided = true
	}
}

// ---- the Driver's calls ----

// CreateOperator creates a named operator token and returns it
// ("<name>.<secret>"); it is shown only once.
func (d *Driver) CreateOperator(ctx context.Context, name string, readOnly bool) (string, error) {
	a, err := d.do(ctx, func(id core.CallID) core.Input {
		return core.CreateOperator{Call: id, Actor: actorOf(ctx), Name: name, ReadOnly: readOnly}
	})
	if err != nil {
		return "", fmt.Errorf("create operator token %q: %w", name, err)
	}
	return a.Token, nil
}

// RevokeOperator revokes an operator token for good.
func (d *Driver) RevokeOperator(ctx context.Context, name string) error {
	_, err := d.do(ctx, func(id core.CallID) core.Input { return core.RevokeOperator{Call: id, Actor: actorOf(ctx), Name: name} })
	if err != nil {
		return fmt.Errorf("revoke operator token %q: %w", name, err)
	}
	return nil
}

// RecordRefusal audits an operator action refused before the core saw it
// and returns once the entry is durable.
func (d *Driver) RecordRefusal(ctx context.Context, action, target string, code client.Code, msg string) error {
	e := core.AuditEntry{Actor: actorOf(ctx), Action: action, Target: target, Outcome: core.OutcomeRefused, Code: string(code), Message: msg}
	_, err := d.do(ctx, func(id core.CallID) core.Input { return core.Audit{Call: id, Entry: e} })
	return err
}

// ---- the API side ----

var errForbidden = &httpError{code: http.StatusForbidden, msg: "this operator token is read-only: it may read (GET), not change anything"}

// auditAction is the audited action of a route that changes something.
func auditAction(method, path string) string {
	switch method + " " + path {
	case "POST /api/runs":
		return core.ActionSubmit
	case "POST /api/runs/{id}/cancel":
		return core.ActionCancel
	case "POST /api/runs/{id}/rerun":
		return core.ActionRerun
	case "POST /api/steps/{run}/{step}/approve":
		return core.ActionApprove
	case "POST /api/steps/{run}/{step}/reject":
		return core.ActionReject
	case "POST /api/tokens":
		return core.ActionTokenCreate
	case "DELETE /api/tokens/{name}":
		return core.ActionTokenRevoke
	case "POST /api/operator-tokens":
		return core.ActionOperatorCreate
	case "DELETE /api/operator-tokens/{name}":
		return core.ActionOperatorRevoke
	case "PUT /api/secrets/{name}":
		return core.ActionSecretPut
	case "DELETE /api/secrets/{name}":
		return core.ActionSecretRemove
	case "POST /api/schedules":
		return core.ActionScheduleCreate
	case "POST /api/schedules/{name}/pause":
		return core.ActionSchedulePause
	case "POST /api/schedules/{name}/resume":
		return core.ActionScheduleResume
	case "DELETE /api/schedules/{name}":
		return core.ActionScheduleDelete
	case "PUT /api/bundles":
		return "bundle.put"
	case "GET /api/store/backup":
		return "store.backup"
	}
	return strings.ToLower(method) + " " + path
}

// auditTarget is what a request acts on, from its path.
func auditTarget(r *http.Request) string {
	switch {
	case r.PathValue("id") != "":
		return r.PathValue("id")
	case r.PathValue("step") != "":
		return r.PathValue("run") + "/" + r.PathValue("step")
	case r.PathValue("name") != "":
		return r.PathValue("name")
	}
	return r.URL.Query().Get("file")
}

// refused audits a refusal the API met itself (the core audits its own),
// on a context of its own: the request's may have ended.
func (a *api) refused(r *http.Request, actor string, err error) {
	var he *httpError
	if !errors.As(err, &he) {
		he = a.classify(err)
	}
	if he.code >= 500 || he.code == http.StatusUnauthorized {
		return // not a decision: the action may yet be taken, or nobody asked
	}
	ctx, cancel := context.WithTimeout(WithActor(context.WithoutCancel(r.Context()), actor), apiTimeout)
	defer cancel()
	if err := a.d.RecordRefusal(ctx, auditAction(r.Method, r.Pattern[strings.IndexByte(r.Pattern, ' ')+1:]), auditTarget(r), client.CodeFor(he.code), he.msg); err != nil {
		a.d.log.Warn("cannot audit a refused operator call", "method", r.Method, "path", r.URL.Path, "err", err)
	}
}

func (a *api) createOperator(r *http.Request) (int, any, error) {
	var req client.OperatorTokenRequest
	if err := decodeJSON(r, &req); err != nil {
		return 0, nil, err
	}
	tok, err := a.d.CreateOperator(r.Context(), req.Name, req.ReadOnly)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, client.CreatedOperatorToken{Name: req.Name, Token: tok, ReadOnly: req.ReadOnly}, nil
}

func (a *api) listOperators(ctx context.Context) (int, any, error) {
	out := client.OperatorTokenList{OperatorTokens: []client.OperatorToken{}}
	err := a.d.Snapshot(ctx, func(o *core.Orchestrator) {
		for _, t := range o.Operators() {
			out.OperatorTokens = append(out.OperatorTokens, client.OperatorToken{Name: t.Name, ReadOnly: t.ReadOnly,
				CreatedAt: t.CreatedAt, CreatedBy: t.CreatedBy, Revoked: t.Revoked, RevokedAt: t.RevokedAt})
		}
	})
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, out, nil
}

func (a *api) revokeOperator(r *http.Request) (int, any, error) {
	name := r.PathValue("name")
	if err := a.d.RevokeOperator(r.Context(), name); err != nil {
		return 0, nil, err
	}
	return http.StatusOK, client.RevokedToken{Revoked: name}, nil
}

func (a *api) listAudit(r *http.Request) (int, any, error) {
	q := r.URL.Query()
	rq, err := parseRunQuery(url.Values{"limit": q["limit"], "cursor": q["cursor"], "since": q["since"]}, time.Now())
	if err != nil {
		return 0, nil, err
	}
	entries, next, err := a.d.st.Audit(store.AuditQuery{Before: rq.cursor, Since: rq.filter.Since, Actor: q.Get("actor"), Action: q.Get("action"), Limit: rq.limit})
	if err != nil {
		return 0, nil, err
	}
	out := client.AuditList{Entries: make([]client.AuditEntry, 0, len(entries))}
	for _, e := range entries {
		out.Entries = append(out.Entries, client.AuditEntry{Seq: e.Seq, At: e.At, Actor: e.Actor, Action: e.Action, Target: e.Target,
			Outcome: e.Outcome, Code: client.Code(e.Code), Message: e.Message})
	}
	if next != 0 {
		out.NextCursor = strconv.FormatUint(next, 10)
	}
	return http.StatusOK, out, nil
}
