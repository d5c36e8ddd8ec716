package store

import (
	"io"
	"time"

	"github.com/tether-run/tether/core"
)

// Backend is everything the orchestrator's driver and its API need of
// durable storage (SPEC §7, §11): one contract, whatever keeps the bytes.
// *Store (bbolt, one file and a blob directory) is one; the contract test
// suite in adapters/store/storetest checks any other against the same
// promises. Its methods are safe for concurrent use. Each piece's methods
// state what they promise; "durable" means on stable storage, so a crash
// after the call returned nil loses none of it.
type Backend interface {
	Records
	DataPlane
	Histories
	AuditLog
	Secrets
	Retention
	Maintenance
}

var _ Backend = (*Store)(nil)

// Records is the live state (SPEC §11): restored at start, then changed
// one batch at a time by the driver's loop.
type Records interface {
	// Apply makes a batch of records durable in one atomic transaction:
	// upserts put their value, deletes remove their key, in order (a later
	// record of one key wins). When it returns nil the whole batch is
	// durable; on error the batch was not acknowledged, and may or may not
	// be durable (an entry of a log written whole before its fdatasync
	// failed is replayed at the next open): the caller releases nothing of
	// it and stops (SPEC §11). An empty batch writes nothing, but fails as
	// any batch would on a closed or broken store (and a store that fences,
	// as PostgreSQL's does, still proves its leadership with it).
	Apply(recs []core.Record) error
	// Load returns the live records and the log lines of the live leases,
	// sorted by key; not the history of archived runs (SPEC §7a) nor the
	// audit log. A sealed record the secrets key does not open is an error
	// (ErrSecretsKey), never other bytes.
	Load() ([]core.Record, error)
	// Close releases the backend; closing twice is harmless. Calls after it
	// return ErrClosed.
	Close() error
}

// Pipeline is what a Backend may add to Records (SPEC §11): more than one
// batch of records in flight at once, made durable in an order the caller
// fixes. A Backend without it takes one Apply at a time (bbolt: its log
// syncs each Apply in turn).
type Pipeline interface {
	// PipelineDepth is how many places may be outstanding at once (≥ 1).
	PipelineDepth() int
	// Reserve takes the next place in the commit order: places are in the
	// order of the Reserve calls, which one goroutine makes. It returns the
	// function that applies the place's batch as Apply does (an empty
	// batch too, as one transaction). Each is called exactly once, from
	// any goroutine, concurrently with the other places' functions. What
	// is durable is always every batch of a prefix of the places, never a
	// later one without every earlier one: a function returns nil only
	// once its batch and every earlier place's are durable; if an earlier
	// place fails, it fails too (its error wraps ErrEarlierFailed) and
	// none of its batch is applied. As with Apply, a place reported failed
	// may still be durable (its commit landed, the answer was lost): a
	// later place may then land after it, and what is durable is still a
	// prefix; the caller releases nothing after a failure. Once the failed places' functions have
	// all returned, the next Reserve starts again after what is durable.
	// Apply and ApplyWithData are not called while a place is outstanding.
	Reserve() func(recs []core.Record) error
}

// DataPlane is the data plane's storage (SPEC §14): versioned values,
// append streams, bundles, and the blobs that hold their bytes.
type DataPlane interface {
	// ApplyWithData is Apply plus data-plane writes, all in one atomic
	// transaction: when it returns nil the records and every accepted op
	// are durable, and after a crash either all of them or none are there.
	// Ops apply in order: each put of an id gets the next version (1, 2,
	// 3, …), each accepted append starts where the stream ended. A refused
	// op (its DataResult.Err: a stale append offset, a stream over its
	// limit, …) writes nothing and does not abort the rest. An op whose
	// request id (lease, id) was answered before gets that first answer
	// again, with Repeat set, and writes nothing.
	ApplyWithData(recs []core.Record, ops []DataOp) ([]DataResult, error)
	// WriteBlob streams r (at most limit bytes, else ErrTooLarge) into a
	// durable blob and pins it: it is not collected until ReleaseBlob, so
	// a DataOp may name it. Called off the driver's loop.
	WriteBlob(r io.Reader, limit int64) (BlobRef, error)
	// ReleaseBlob unpins a blob once the write naming it was answered; a
	// blob no record names and nothing pins is then removed.
	ReleaseBlob(ref BlobRef)
	// OpenBlob opens a blob by its SHA-256 (hex) for reading.
	OpenBlob(sha string) (io.ReadSeekCloser, error)
	// Data is one version of id (0: the latest); ErrNotFound if none.
	Data(id string, version uint64) (DataMeta, error)
	// Request is the answer a data write with request id (lease, id) got,
	// if it was committed.
	Request(lease uint64, id string) (RequestEntry, bool, error)
	// QueryData lists the latest versions matching q, a page at a time.
	QueryData(q DataQuery) ([]DataMeta, string, error)
	// Versions lists every version of id, oldest first.
	Versions(id string) ([]DataMeta, error)
	// Stream is an append stream's length and state; ErrNotFound if none.
	Stream(id string) (StreamMeta, error)
	// Bundle is a bundle's manifest by fingerprint; ErrNotFound if none.
	Bundle(fp string) (BundleMeta, error)
	// BundleFile locates one file of a bundle.
	BundleFile(fp, relPath string) (FileSpan, error)
	// DataReader reads a version's bytes.
	DataReader(m DataMeta) io.ReadCloser
	// StreamReader reads a stream's bytes in [offset, end).
	StreamReader(id string, offset, end int64) io.Reader
	// BundleReader reads size bytes of a bundle's archive from offset.
	BundleReader(m BundleMeta, offset, size int64) io.ReadCloser
}

// Histories is the history of archived runs (SPEC §7a), read without the
// driver's loop, each call a consistent read of its own.
type Histories interface {
	// History is an archived run's history; ErrNotFound if none.
	History(run core.RunID) (core.RunHistory, error)
	// HistoryLogs pages through the log lines of the given leases.
	HistoryLogs(leases []core.LeaseID, after string, limit int) ([]core.StepLogLine, string, error)
	// ListRuns pages through the archived runs matching f, newest first.
	ListRuns(f RunFilter, cursor uint64, limit int) ([]RunSummary, uint64, error)
	// ArchivedRuns counts the archived runs.
	ArchivedRuns() (int, error)
}

// AuditLog reads the operator audit log (SPEC §15a); its entries are
// records, written by Apply.
type AuditLog interface {
	// Audit pages through the entries matching q, oldest first.
	Audit(q AuditQuery) ([]core.AuditEntry, uint64, error)
}

// Secrets are the sealed values of SPEC §14a; they and every run's record
// (its env:) are sealed with AES-GCM under the secrets key.
type Secrets interface {
	// SetSecretsKey gives the backend its key (SecretsKeySize bytes), once,
	// before it serves secrets; without it nothing is sealed.
	SetSecretsKey(key []byte) error
	// HoldsSealed says whether the backend holds values sealed with a key,
	// so a start without that key must refuse rather than make a new one;
	// an error when it cannot tell (a start must not guess then either).
	HoldsSealed() (bool, error)
	// Secret is secret name's value: ErrNotFound if there is none,
	// ErrSecretsKey if the backend's key does not open it.
	Secret(name string) ([]byte, error)
}

// Retention deletes what is older than the retention (SPEC §7a), off the
// driver's loop: each call works in transactions of at most budget
// deletions each, so a commit of the loop never waits for it long.
type Retention interface {
	// PruneHistory deletes archived runs (and their log lines) that ended
	// before cutoff.
	PruneHistory(cutoff time.Time, budget int) (PruneStats, error)
	// PruneData deletes data versions created before cutoff (never an
	// id's newest), streams last appended before it, and bundles uploaded
	// before it that keepBundle (a live run names it) does not keep; blobs
	// no record names any more are removed.
	PruneData(cutoff time.Time, keepBundle func(fp string) bool, budget int) (PruneStats, error)
	// PruneAudit deletes the audit entries older than cutoff.
	PruneAudit(cutoff time.Time, budget int) (PruneStats, error)
}

// Maintenance is what the operator API and the driver's housekeeping ask
// of the backend beyond its data.
type Maintenance interface {
	// Backup writes a consistent snapshot of the backend to w while it is
	// in use (SPEC §7); a backend whose snapshots are taken by other means
	// returns an error wrapping errors.ErrUnsupported before writing.
	Backup(w io.Writer) error
	// ReleaseMapped lets go of memory held for past reads (bbolt: the
	// file's mapped pages); a backend holding none returns nil.
	ReleaseMapped() error
}
