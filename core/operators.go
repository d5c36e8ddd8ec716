package core

import (
	"encoding/hex"
	"fmt"
	"strings"
	"time"
)

// Operator tokens and the audit log (SPEC §15a). An operator token is
// "<name>.<secret hex>"; the core keeps its name, the SHA-256 of the whole
// token and whether it is read-only. Every operator action decided here is
// recorded, accepted or refused, as one audit entry in the same batch as
// the action: the entry is durable exactly when the action is.

// Kinds of the operator-token and audit records.
const (
	KindOperator = "operator"
	// KindAudit records are appended and never rewritten; they are not
	// state (Restore skips them, the store keeps them apart, SPEC §7a's
	// retention prunes them).
	KindAudit = "audit"
)

// AdminOperator is the name of the operator token kept in the data
// directory's admin-token file (SetAdmin).
const AdminOperator = "admin"

// ActorServer is the actor of what the orchestrator does on its own (the
// admin token's mapping at start); no operator token can have this name.
const ActorServer = "(server)"

// ActorLocal is the actor recorded when a call comes with none (an
// in-process caller of the driver, not the operator API).
const ActorLocal = "(local)"

// MaxOperators bounds the operator tokens kept, revoked ones included.
const MaxOperators = 1000

// Audit limits: longer targets and messages are cut (SPEC §12).
const (
	MaxAuditTarget  = 256
	MaxAuditMessage = 1024
)

// Audited actions (AuditEntry.Action).
const (
	ActionSubmit         = "run.submit"
	ActionRerun          = "run.rerun"
	ActionCancel         = "run.cancel"
	ActionApprove        = "step.approve"
	ActionReject         = "step.reject"
	ActionTokenCreate    = "token.create"
	ActionTokenRevoke    = "token.revoke"
	ActionOperatorCreate = "operator-token.create"
	ActionOperatorRevoke = "operator-token.revoke"
	ActionOperatorReset  = "operator-token.reset" // the admin-token file named a new secret (SetAdmin)
	// Reserved for actions that come with later parts of the API; they are
	// recorded through the same entry (Audit): secret.put, schedule.change.
	ActionSecretPut      = "secret.put"
	ActionScheduleChange = "schedule.change"
)

// Audit outcomes and the codes of refusals (the operator API's codes,
// SPEC §15).
const (
	OutcomeAccepted = "accepted"
	OutcomeRefused  = "refused"

	CodeInvalid   = "invalid"
	CodeNotFound  = "not_found"
	CodeConflict  = "conflict"
	CodeForbidden = "forbidden"
)

// OperatorRecord is a named operator token; only its hash is kept.
type OperatorRecord struct {
	Name      string
	Hash      [32]byte // SHA-256 of the whole token
	ReadOnly  bool     `json:",omitempty"`
	CreatedAt time.Time
	CreatedBy string    `json:",omitempty"`
	Revoked   bool      `json:",omitempty"`
	RevokedAt time.Time `json:",omitzero"`
}

// AuditEntry is one recorded operator action: who (the operator token's
// name), what (action, target, outcome and, refused, the code and why)
// and when (the orchestrator's clock).
type AuditEntry struct {
	Seq     uint64
	At      time.Time
	Actor   string
	Action  string
	Target  string `json:",omitempty"`
	Outcome string
	Code    string `json:",omitempty"`
	Message string `json:",omitempty"`
}

func operatorKey(name string) string { return KindOperator + "/" + name }

// AuditKey is the key of the audit entry of sequence number seq: text
// order is numeric order.
func AuditKey(seq uint64) string { return fmt.Sprintf("%s/%020d", KindAudit, seq) }

// IsAuditKey reports whether key names an audit entry.
func IsAuditKey(key string) bool { return strings.HasPrefix(key, KindAudit+"/") }

// Inputs of the operator tokens and the audit log.
type (
	// CreateOperator creates a named operator token whose secret the
	// driver drew at random; its answer's Token is shown once.
	CreateOperator struct {
		Call     CallID
		Actor    string
		Name     string
		ReadOnly bool
		Secret   [32]byte
	}
	// RevokeOperator revokes an operator token for good.
	RevokeOperator struct {
		Call  CallID
		Actor string
		Name  string
	}
	// SetAdmin maps the data directory's admin-token file onto the operator
	// token AdminOperator (SPEC §15a): created when absent; given this hash,
	// full access and no revocation when its hash differs (the file was
	// replaced); left as it is (revoked too) when the hash is the same.
	SetAdmin struct {
		Call CallID
		Hash [32]byte
	}
	// Audit records an operator action refused before it reached the core
	// (a read-only token, a malformed request, an unknown run), or one
	// decided elsewhere; it is answered once durable.
	Audit struct {
		Call  CallID
		Entry AuditEntry // Seq and At are the core's
	}
)

func (CreateOperator) isInput() {}
func (RevokeOperator) isInput() {}
func (SetAdmin) isInput()       {}
func (Audit) isInput()          {}

// CheckOperatorName checks an operator token's name: 1 to 64 letters,
// digits, '-' or '_'.
func CheckOperatorName(name string) error {
	ok := name != "" && len(name) <= 64
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			ok = false
		}
	}
	if !ok {
		return fmt.Errorf("operator token name %s must be 1-64 letters, digits, '-' or '_'", Quote(name))
	}
	return nil
}

func actorOr(a string) string {
	if a == "" {
		return ActorLocal
	}
	return a
}

func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}

// audit appends one audit entry to the batch.
func (o *Orchestrator) audit(e AuditEntry) {
	o.meta.AuditSeq++
	o.markMeta()
	e.Seq, e.At = o.meta.AuditSeq, o.now
	e.Actor = cut(actorOr(e.Actor), 64)
	e.Target, e.Message = cut(e.Target, MaxAuditTarget), cut(e.Message, MaxAuditMessage)
	if e.Outcome == "" {
		e.Outcome = OutcomeAccepted
	}
	o.audits = append(o.audits, Record{Key: AuditKey(e.Seq), Value: encode(e)})
	o.rd.Audit = append(o.rd.Audit, e)
}

// accept records an accepted action.
func (o *Orchestrator) accept(actor, action, target string) {
	o.audit(AuditEntry{Actor: actor, Action: action, Target: target, Outcome: OutcomeAccepted})
}

// deny refuses a call: one audit entry, and the answer with the reason.
func (o *Orchestrator) deny(call CallID, actor, action, target, code, msg string) {
	o.audit(AuditEntry{Actor: actor, Action: action, Target: target, Outcome: OutcomeRefused, Code: code, Message: msg})
	o.answer(APIAnswer{Call: call, Err: msg, Code: code})
}

func (o *Orchestrator) markOperator(t *OperatorRecord) { o.dirty[operatorKey(t.Name)] = true }

func (o *Orchestrator) createOperator(in CreateOperator) {
	act := ActionOperatorCreate
	if err := CheckOperatorName(in.Name); err != nil {
		o.deny(in.Call, in.Actor, act, in.Name, CodeInvalid, err.Error())
		return
	}
	if o.operators[in.Name] != nil {
		o.deny(in.Call, in.Actor, act, in.Name, CodeConflict, fmt.Sprintf("operator token %q already exists (names are never reused)", in.Name))
		return
	}
	if len(o.operators) >= MaxOperators {
		o.deny(in.Call, in.Actor, act, in.Name, CodeConflict, fmt.Sprintf("at most %d operator tokens", MaxOperators))
		return
	}
	tok := in.Name + "." + hex.EncodeToString(in.Secret[:])
	t := &OperatorRecord{Name: in.Name, Hash: hashSecret([]byte(tok)), ReadOnly: in.ReadOnly, CreatedAt: o.now, CreatedBy: actorOr(in.Actor)}
	o.operators[t.Name] = t
	o.markOperator(t)
	target := t.Name
	if t.ReadOnly {
		target += " (read-only)"
	}
	o.accept(in.Actor, act, target)
	o.logf(LevelInfo, "operator token created", "operator", t.Name, "read_only", fmt.Sprint(t.ReadOnly), "by", actorOr(in.Actor))
	o.answer(APIAnswer{Call: in.Call, Token: tok})
}

func (o *Orchestrator) revokeOperator(in RevokeOperator) {
	t := o.operators[in.Name]
	if t == nil {
		o.deny(in.Call, in.Actor, ActionOperatorRevoke, in.Name, CodeNotFound, fmt.Sprintf("unknown operator token %q", in.Name))
		return
	}
	if !t.Revoked {
		t.Revoked, t.RevokedAt = true, o.now
		o.markOperator(t)
		o.logf(LevelInfo, "operator token revoked", "operator", t.Name, "by", actorOr(in.Actor))
	}
	o.accept(in.Actor, ActionOperatorRevoke, t.Name)
	o.answer(APIAnswer{Call: in.Call})
}

func (o *Orchestrator) setAdmin(in SetAdmin) {
	t := o.operators[AdminOperator]
	switch {
	case t == nil:
		t = &OperatorRecord{Name: AdminOperator, Hash: in.Hash, CreatedAt: o.now, CreatedBy: ActorServer}
		o.operators[t.Name] = t
		o.markOperator(t)
		o.accept(ActorServer, ActionOperatorCreate, t.Name)
	case t.Hash != in.Hash:
		t.Hash, t.ReadOnly, t.Revoked, t.RevokedAt = in.Hash, false, false, time.Time{}
		o.markOperator(t)
		o.accept(ActorServer, ActionOperatorReset, t.Name)
	}
	o.answer(APIAnswer{Call: in.Call})
}

func (o *Orchestrator) auditInput(in Audit) {
	o.audit(in.Entry)
	o.answer(APIAnswer{Call: in.Call})
}

// Operators returns every operator token, sorted by name (hashes
// included: the driver authenticates with them; never show them).
func (o *Orchestrator) Operators() []OperatorRecord {
	out := make([]OperatorRecord, 0, len(o.operators))
	for _, n := range sortedKeys(o.operators) {
		out = append(out, *o.operators[n])
	}
	return out
}
