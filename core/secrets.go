package core

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// Secrets (SPEC §14a). The core keeps each secret's name, size and who
// changed it last, decides every change (an operator's put or removal, a
// step's put) with its audit entry, and decides which lease may read which
// secret. A secret's value never enters the core: the driver writes it,
// encrypted, in the same store transaction as the batch that admitted it,
// the way a data write rides its group (SPEC §14).

// KindSecret is the kind of a secret's record (its name and size, never
// its value).
const KindSecret = "secret"

// Secret limits (SPEC §12).
const (
	MaxSecrets         = 1000     // secrets kept
	MaxSecretBytes     = 64 << 10 // one value
	MaxSecretNameBytes = 64
	MaxStepSecrets     = 32 // names one step lists in secrets: (and as many in put_secrets:)
)

// SecretsAs values: how a step receives its secrets.
const (
	SecretsAsFiles = "files" // the default: files in $TETHER_SECRETS_DIR
	SecretsAsEnv   = "env"   // environment variables NAME=value
)

// Audited actions of secrets (secret.put is ActionSecretPut).
const ActionSecretRemove = "secret.rm"

// SecretRecord describes a secret: never its value.
type SecretRecord struct {
	Name      string
	Size      int
	UpdatedAt time.Time
	UpdatedBy string // the operator token's name, or "step <id>"
}

// ErrSecretNotDeclared is the refusal of a step's secret read or write
// for a name its step does not declare.
var ErrSecretNotDeclared = errors.New("secret not declared by the step")

// CheckSecretName checks a secret's name: 1-64 of [A-Za-z0-9_], not
// starting with a digit, so that it is also an environment variable's name
// and a file's.
func CheckSecretName(name string) error {
	ok := name != "" && len(name) <= MaxSecretNameBytes && !(name[0] >= '0' && name[0] <= '9')
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			ok = false
		}
	}
	if !ok {
		return fmt.Errorf("secret name %s must be 1-%d letters, digits or '_', not starting with a digit", Quote(name), MaxSecretNameBytes)
	}
	return nil
}

func secretKey(name string) string { return KindSecret + "/" + name }

func (o *Orchestrator) markSecret(name string) { o.dirty[secretKey(name)] = true }

// Inputs of secrets.
type (
	// PutSecret stores a secret of Size bytes under Name for an operator
	// (SPEC §14a). Its answer admits the value, which the driver stores
	// with the batch; a refused one stores nothing.
	PutSecret struct {
		Call  CallID
		Actor string
		Name  string
		Size  int
	}
	// RemoveSecret removes a secret.
	RemoveSecret struct {
		Call  CallID
		Actor string
		Name  string
	}
	// SecretWrite asks whether a step's put of secret Name (Size bytes),
	// under Lease with the session credential Credential, may be stored
	// now: a DataWrite whose lease's step also declares Name in
	// put_secrets:. It is answered in Ready.Writes; admitted, the secret's
	// record changes in the same batch.
	SecretWrite struct {
		Req        uint64
		Credential string
		Lease      LeaseID
		Name       string
		Size       int
	}
)

func (PutSecret) isInput()    {}
func (RemoveSecret) isInput() {}
func (SecretWrite) isInput()  {}

func (o *Orchestrator) putSecret(in PutSecret) {
	act := ActionSecretPut
	if err := CheckSecretName(in.Name); err != nil {
		o.deny(in.Call, in.Actor, act, in.Name, CodeInvalid, err.Error())
		return
	}
	if msg := checkSecretSize(in.Size); msg != "" {
		o.deny(in.Call, in.Actor, act, in.Name, CodeInvalid, msg)
		return
	}
	if o.secrets[in.Name] == nil && len(o.secrets) >= MaxSecrets {
		o.deny(in.Call, in.Actor, act, in.Name, CodeConflict, fmt.Sprintf("at most %d secrets", MaxSecrets))
		return
	}
	o.setSecret(in.Name, in.Size, actorOr(in.Actor))
	o.accept(in.Actor, act, in.Name)
	o.answer(APIAnswer{Call: in.Call})
}

func checkSecretSize(n int) string {
	switch {
	case n <= 0:
		return "a secret's value must not be empty"
	case n > MaxSecretBytes:
		return fmt.Sprintf("a secret's value is at most %d bytes, this one %d", MaxSecretBytes, n)
	}
	return ""
}

func (o *Orchestrator) setSecret(name string, size int, by string) {
	o.secrets[name] = &SecretRecord{Name: name, Size: size, UpdatedAt: o.now, UpdatedBy: by}
	o.markSecret(name)
}

func (o *Orchestrator) removeSecret(in RemoveSecret) {
	if o.secrets[in.Name] == nil {
		o.deny(in.Call, in.Actor, ActionSecretRemove, in.Name, CodeNotFound, fmt.Sprintf("unknown secret %s", Quote(in.Name)))
		return
	}
	delete(o.secrets, in.Name)
	o.markSecret(in.Name)
	o.accept(in.Actor, ActionSecretRemove, in.Name)
	o.answer(APIAnswer{Call: in.Call})
}

// CheckSecret answers "may the holder of this session credential, under
// lease l, read (put false) or write (put true) secret name at now?"
// (SPEC §14a): the write decision of CheckWrite, then the lease's step
// must list name in secrets: (a read) or put_secrets: (a write).
// Existence is not decided here: a read of a name nobody stored is the
// store's 404.
func (o *Orchestrator) CheckSecret(now time.Time, credential string, l LeaseID, name string, put bool) DataAnswer {
	a := o.CheckWrite(now, credential, l)
	if a.Refusal == WriteAdmitted && l == 0 {
		a.Refusal = RefusedUnknownLease
	}
	if a.Refusal != WriteAdmitted {
		return a
	}
	var sp *StepSpec
	if lr := o.leases[l]; lr != nil {
		sp = o.specOf[lr.Step]
	}
	names := []string(nil)
	if sp != nil {
		names = sp.Secrets
		if put {
			names = sp.PutSecrets
		}
	}
	if !slices.Contains(names, name) {
		a.Refusal = RefusedSecretNotDeclared
		a.Detail = name
	}
	return a
}

// secretWrite decides one SecretWrite and, admitted, records the change.
func (o *Orchestrator) secretWrite(in SecretWrite) {
	a := o.CheckSecret(o.now, in.Credential, in.Lease, in.Name, true)
	if a.Refusal == WriteAdmitted {
		switch {
		case checkSecretSize(in.Size) != "": // the data plane refuses these first
			a.Refusal, a.Detail = RefusedSecretNotDeclared, in.Name
		case o.secrets[in.Name] == nil && len(o.secrets) >= MaxSecrets:
			a.Refusal, a.Detail = RefusedSecretsFull, in.Name
		default:
			by := "step " + string(o.leases[in.Lease].Step)
			o.setSecret(in.Name, in.Size, by)
			o.accept(by, ActionSecretPut, in.Name) // audited as an operator's put, the step its actor
		}
	}
	a.Req = in.Req
	o.rd.Writes = append(o.rd.Writes, a)
}

// Secrets returns every secret's record, sorted by name (never a value).
func (o *Orchestrator) Secrets() []SecretRecord {
	out := make([]SecretRecord, 0, len(o.secrets))
	for _, n := range sortedKeys(o.secrets) {
		out = append(out, *o.secrets[n])
	}
	return out
}

// checkStepSecrets checks a step's secrets:, secrets_as: and put_secrets:.
func checkStepSecrets(s StepSpec) error {
	switch s.SecretsAs {
	case "", SecretsAsFiles, SecretsAsEnv:
	default:
		return invalid("step %q: secrets_as is %s; want %q or %q", s.Name, Quote(s.SecretsAs), SecretsAsFiles, SecretsAsEnv)
	}
	for _, l := range []struct {
		field string
		names []string
	}{{"secrets", s.Secrets}, {"put_secrets", s.PutSecrets}} {
		if len(l.names) > MaxStepSecrets {
			return invalid("step %q: %s lists %d names, at most %d", s.Name, l.field, len(l.names), MaxStepSecrets)
		}
		for i, n := range l.names {
			if err := CheckSecretName(n); err != nil {
				return invalid("step %q: %s: %v", s.Name, l.field, err)
			}
			if slices.Contains(l.names[:i], n) {
				return invalid("step %q: %s lists %s twice", s.Name, l.field, Quote(n))
			}
		}
	}
	return nil
}
