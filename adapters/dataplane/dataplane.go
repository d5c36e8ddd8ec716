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
