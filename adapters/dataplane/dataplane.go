// Package dataplane is the data plane's protocol (SPEC §14): the JSON
// bodies that the orchestrator answers with and the store keeps, which the
// worker and the operator's client read, and the headers both ends name.
// Each is defined here once, so no two packages can disagree on a field; the
// store (DataMeta, StreamMeta, AppendResult, BundleMeta) and the client
// (DataVersion, DataStream, DataVersions, Bundle) name them by aliases.
package dataplane

import "time"

// Headers of the data plane.
const (
	// LeaseHeader names the lease a write is made under (or ?lease=).
	LeaseHeader = "Tether-Lease"
	// VersionHeader, SHA256Header and StreamLengthHeader describe what a
	// read returns: the version read, its SHA-256, the stream's length.
	VersionHeader      = "Tether-Version"
	SHA256Header       = "Tether-SHA256"
	StreamLengthHeader = "Tether-Stream-Length"
	// RequestIDHeader names a write (PUT, append, DELETE) within its lease:
	// a repeat of (lease, request id) gets the first answer and writes
	// nothing (SPEC §14, idempotent writes).
	RequestIDHeader = "Tether-Request-Id"
	// AttributeHeader sets one attribute (k=v) of the version a PUT
	// creates; repeatable.
	AttributeHeader = "Tether-Attribute"
)

// Version describes one immutable version of a data item: the answer to a
// PUT, and the store's record of it.
type Version struct {
	ID      string    `json:"id"`
	Version uint64    `json:"version"`
	Size    int64     `json:"size"`
	SHA256  string    `json:"sha256"`
	Created time.Time `json:"created"`
	Worker  string    `json:"worker,omitempty"`
	Lease   uint64    `json:"lease,omitempty"`
	// Run and Step name the step whose lease wrote it (SPEC §14: queries
	// and readOutput select by them); empty in a store written before.
	Run  string `json:"run,omitempty"`
	Step string `json:"step,omitempty"`
	// Deleted marks a tombstone (DELETE /data/{id}): it has no bytes, and
	// latest names no version while it is the newest.
	Deleted bool `json:"deleted,omitempty"`
	// Attributes are the PUT's Tether-Attribute pairs.
	Attributes map[string]string `json:"attributes,omitempty"`
}

// Query answers GET /data?… (and GET /api/data?…): versions sorted by
// (id, version), and the cursor of the next page ("" at the end).
type Query struct {
	Items []Version `json:"items"`
	Next  string    `json:"next"`
}

// Stream describes a data item's append stream.
type Stream struct {
	ID      string    `json:"id"`
	Length  int64     `json:"length"`
	Appends uint64    `json:"appends"`
	Updated time.Time `json:"updated"`
}

// Appended is where one append landed: the answer to an append.
type Appended struct {
	ID     string `json:"id"`
	Offset int64  `json:"offset"` // where the appended bytes start
	Size   int64  `json:"size"`   // how many were appended
	Length int64  `json:"length"` // the stream's length after the append
}

// Versions answers GET /data/{id} and GET /api/data/{id}: a data item's
// versions and its append stream, if it has one.
type Versions struct {
	ID       string    `json:"id"`
	Versions []Version `json:"versions"`
	Stream   *Stream   `json:"stream,omitempty"`
}

// Bundle describes a stored content-addressed bundle: the answer to PUT
// /api/bundles and GET /api/bundles/{fingerprint}.
type Bundle struct {
	Fingerprint string    `json:"fingerprint"`
	Size        int64     `json:"size"`
	Created     time.Time `json:"created"`
	Tar         bool      `json:"tar"`             // files can be fetched one by one
	Files       int       `json:"files,omitempty"` // how many (Tar)
	Existed     bool      `json:"existed,omitempty"`
}
