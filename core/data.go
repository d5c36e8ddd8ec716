package core

import (
	"fmt"
	"strings"
	"time"
)

// The data plane's decision (SPEC §14): whether a write (a PUT or an
// append) with a given session credential and lease may be stored. The
// driver steps a DataWrite at the write's place among its inputs and stores
// the write, in the same durable group as the batch's records, only if the
// batch's answer admits it. Deciding changes nothing: a DataWrite by itself
// produces no records (timers due by then fire first, as for any input, and
// those may).

// DataWrite asks whether a data-plane write under Lease, made with the
// session credential Credential, may be stored now. Req is the driver's id
// for the write; its answer (Ready.Writes) carries it back.
type DataWrite struct {
	Req        uint64
	Credential string
	Lease      LeaseID
	// ID is the data id written ("" for none): a step that declares its
	// outputs may write only those (SPEC §14, declared writes).
	ID string
}

func (DataWrite) isInput() {}

// WriteRefusal says why a data-plane request is refused; WriteAdmitted
// (zero) admits it.
type WriteRefusal uint8

const (
	WriteAdmitted            WriteRefusal = iota
	RefusedUnauthenticated                // malformed, unknown or wrong credential
	RefusedCredentialExpired              // the credential's validity lapsed (§9)
	RefusedWorkerRevoked                  // its worker was revoked
	RefusedWorkerInactive                 // its worker was deregistered; it rejoins when it reconnects
	RefusedUnknownLease                   // no such lease, or another worker's
	RefusedLeaseNotCurrent                // the lease ended: superseded, expired, triaged, its step finished or cancelled
	RefusedUndeclaredOutput               // the lease's step declares outputs, and not this data id (403)
	RefusedSecretNotDeclared              // the lease's step does not declare the secret (SPEC §14a)
	RefusedSecretsFull                    // a new secret past MaxSecrets (SPEC §14a)
	RefusedLeaseNotStarted                // a write-bearing step's lease whose START is not recorded: its process has not started (SPEC §14)
)

func (r WriteRefusal) String() string {
	switch r {
	case WriteAdmitted:
		return "admitted"
	case RefusedUnauthenticated:
		return "unauthenticated"
	case RefusedCredentialExpired:
		return "credential-expired"
	case RefusedWorkerRevoked:
		return "worker-revoked"
	case RefusedWorkerInactive:
		return "worker-inactive"
	case RefusedUnknownLease:
		return "unknown-lease"
	case RefusedLeaseNotCurrent:
		return "lease-not-current"
	case RefusedUndeclaredOutput:
		return "undeclared-output"
	case RefusedSecretNotDeclared:
		return "secret-not-declared"
	case RefusedSecretsFull:
		return "secrets-full"
	case RefusedLeaseNotStarted:
		return "lease-not-started"
	}
	return "invalid"
}

// Credential reports whether the refusal is of the credential (401) rather
// than of the lease (409).
func (r WriteRefusal) Credential() bool {
	return r >= RefusedUnauthenticated && r <= RefusedWorkerInactive
}

// DataAnswer answers a DataWrite (or a CheckWrite query): Refusal is
// WriteAdmitted or why not; Worker is the credential's worker once it was
// accepted; Detail is the human reason of a lease refusal (how the lease
// ended), for the refusal's message only. Run and Step name the lease's
// step once the lease was found (the data plane records them with what
// the write makes).
type DataAnswer struct {
	Req     uint64
	Worker  WorkerID
	Lease   LeaseID
	Refusal WriteRefusal
	Detail  string
	Run     RunID
	Step    StepID
}

// Err renders a refusal as the error the data plane answers with, wrapping
// the sentinel of its kind (nil when admitted).
func (a DataAnswer) Err() error {
	switch a.Refusal {
	case WriteAdmitted:
		return nil
	case RefusedUnauthenticated:
		return ErrBadCredential
	case RefusedCredentialExpired:
		return fmt.Errorf("%w for worker %s", ErrCredentialExpired, a.Worker)
	case RefusedWorkerRevoked:
		return fmt.Errorf("%w: worker %s was revoked", ErrNotInPool, a.Worker)
	case RefusedWorkerInactive:
		return fmt.Errorf("%w: worker %s was deregistered; it rejoins when it reconnects", ErrNotInPool, a.Worker)
	case RefusedUnknownLease:
		return fmt.Errorf("%w %d for worker %s", ErrUnknownLease, a.Lease, a.Worker)
	case RefusedLeaseNotCurrent:
		return fmt.Errorf("%w: lease %d: %s", ErrNotCurrent, a.Lease, a.Detail)
	case RefusedUndeclaredOutput:
		return fmt.Errorf("%w: lease %d: %s", ErrUndeclaredOutput, a.Lease, a.Detail)
	case RefusedSecretNotDeclared:
		return fmt.Errorf("%w: lease %d may not use secret %s", ErrSecretNotDeclared, a.Lease, Quote(a.Detail))
	case RefusedSecretsFull:
		return fmt.Errorf("secret %s refused: at most %d secrets", Quote(a.Detail), MaxSecrets)
	case RefusedLeaseNotStarted:
		return fmt.Errorf("%w: lease %d: its step writes and its START is not recorded, so its process has not started", ErrNotStarted, a.Lease)
	}
	return fmt.Errorf("data write refused (%d)", a.Refusal)
}

// CheckWrite answers "may the holder of this session credential write
// under lease l at now?" (SPEC §14) without changing anything: the
// credential must be valid and its worker in the pool (§9), and the lease
// current and that worker's. A zero lease checks the credential alone (a
// read). The driver's early check of a request's headers asks it; the
// decisive check is the DataWrite input, which answers the same.
func (o *Orchestrator) CheckWrite(now time.Time, credential string, l LeaseID) DataAnswer {
	return o.CheckWriteTo(now, credential, l, "")
}

// CheckWriteTo is CheckWrite for a write to data id (SPEC §14, declared
// writes): once the lease is current, a step that declares outputs may
// write only those ids ("" asks nothing of them).
func (o *Orchestrator) CheckWriteTo(now time.Time, credential string, l LeaseID, id string) DataAnswer {
	w, r := o.authenticate(now, credential)
	a := DataAnswer{Lease: l, Refusal: r}
	if w != nil {
		a.Worker = w.ID
	}
	if r != WriteAdmitted || l == 0 {
		return a
	}
	a.Refusal, a.Detail = o.fence(w.ID, l)
	if lr := o.leases[l]; lr != nil && lr.Worker == w.ID {
		a.Step = lr.Step
		if s := o.steps[lr.Step]; s != nil {
			a.Run = s.Run
		}
	}
	if a.Refusal == WriteAdmitted {
		// A write-bearing step's process starts only once its START is
		// durable (§4), so nothing of it writes before: a write under a
		// lease not started would be the output of no run of the step,
		// and would stay if the lease were requeued as never started.
		if lr := o.leases[l]; !lr.Started && o.specOf[lr.Step].Writes {
			a.Refusal = RefusedLeaseNotStarted
		}
	}
	if a.Refusal == WriteAdmitted {
		a.Refusal, a.Detail = o.output(l, id)
	}
	return a
}

// dataWrite decides one DataWrite at the orchestrator's time and answers
// it in the batch. A write needs a lease: a zero one is unknown.
func (o *Orchestrator) dataWrite(in DataWrite) {
	a := o.CheckWriteTo(o.now, in.Credential, in.Lease, in.ID)
	if in.Lease == 0 && a.Refusal == WriteAdmitted {
		a.Refusal = RefusedUnknownLease
	}
	a.Req = in.Req
	o.rd.Writes = append(o.rd.Writes, a)
}

// authenticate is Authenticate's decision: the credential's worker (nil if
// it names none, or the secret does not match) and whether it is refused.
// The credential reads "<worker id>.<secret>"; the secret is checked
// against its stored hash in constant time.
func (o *Orchestrator) authenticate(now time.Time, credential string) (*WorkerRecord, WriteRefusal) {
	wid, secret, ok := strings.Cut(credential, ".")
	w := o.workers[WorkerID(wid)]
	var hash [32]byte // a missing worker is compared too, so timing says little
	if w != nil {
		hash = w.CredHash
	}
	match := checkSecret(hash, secret)
	switch {
	case !ok || wid == "" || secret == "" || w == nil || !match:
		return nil, RefusedUnauthenticated
	case w.Revoked:
		return w, RefusedWorkerRevoked
	case !now.Before(w.CredExpiry):
		return w, RefusedCredentialExpired
	case !w.Active:
		return w, RefusedWorkerInactive
	}
	return w, WriteAdmitted
}

// fence is Fence's decision: whether lease l is current and worker w's,
// and if it ended, how (the lease's end reason).
func (o *Orchestrator) fence(w WorkerID, l LeaseID) (WriteRefusal, string) {
	lr := o.leases[l]
	if lr == nil {
		if o.closedFind(w, l) != nil {
			return RefusedLeaseNotCurrent, "its run finished" // archived (SPEC §7a)
		}
	}
	switch {
	case lr == nil || lr.Worker != w:
		return RefusedUnknownLease, ""
	case !lr.Current:
		return RefusedLeaseNotCurrent, lr.EndReason
	}
	if wr := o.workers[w]; wr == nil || wr.Revoked {
		return RefusedWorkerRevoked, ""
	}
	return WriteAdmitted, ""
}
