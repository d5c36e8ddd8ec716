package core

// Cause says, in a type a checker can match, what made the orchestrator do
// what a server event records (or refuse or close a connection): the
// trigger, not the outcome. A failed step's outcome is its FailureClass; the
// event that failed it carries the Cause that set the failure off (a step
// failed attempts-exhausted by a grace expiry has class attempts-exhausted
// and cause grace-expired). Events record it with the worker and the lease
// it concerns (ServerEvent.Cause, .Worker, .Lease); messages' texts are for
// people and may change, causes may not without a SPEC change.
type Cause string

// Causes of step events (SPEC §3, §4, §5).
const (
	CauseNone Cause = ""
	// CauseDisconnected: the worker's connection dropped; its running
	// steps are held (recovering) for its grace window (§4).
	CauseDisconnected Cause = "disconnected"
	// CauseRestarted: the orchestrator restarted; every running step is
	// held (recovering) for its worker's grace window (§4).
	CauseRestarted Cause = "orchestrator-restarted"
	// CauseReclaimed: the worker reconnected within its window reporting
	// the lease; the step runs on (§4).
	CauseReclaimed Cause = "reclaimed"
	// CauseGraceExpired: the worker did not reconnect within its recovery
	// window (2 × its declared max reconnect delay, §4).
	CauseGraceExpired Cause = "grace-expired"
	// CauseNoGrace: a worker without a grace window (scaler-managed, or
	// --no-reconnect, §4) disconnected: triaged in the same batch.
	CauseNoGrace Cause = "no-grace"
	// CauseStaleWorker: the worker sent nothing for the heartbeat timeout
	// and was found by a sweep (§5).
	CauseStaleWorker Cause = "stale-worker"
	// CauseRevoked: the worker's enrollment token was revoked (§7).
	CauseRevoked Cause = "revoked"
	// CauseLost: the worker reconnected without reporting a lease it held:
	// its execution was lost (§4).
	CauseLost Cause = "execution-lost"
	// CauseDispatchMissed: a dispatch was neither started nor rejected by
	// the dispatch-ack deadline (§3).
	CauseDispatchMissed Cause = "dispatch-missed"
	// CauseDispatchRejected: the worker rejected a dispatch (§3).
	CauseDispatchRejected Cause = "dispatch-rejected"
	// CauseWorkerStopped: the worker reported a step stopped because the
	// worker itself was stopped (§4).
	CauseWorkerStopped Cause = "worker-stopped"
	// CauseUnmatched: a sweep found the step queued for the unmatched
	// window with no active worker matching it (§5).
	CauseUnmatched Cause = "unmatched"
	// CauseStepTimeout: the step's timeout passed while it ran (§5).
	CauseStepTimeout Cause = "step-timeout"
)

// Causes of a refused Hello or a closed session (Refused.Cause,
// Close.Cause; SPEC §7, §9). Not on the wire: the reason's text is.
const (
	CauseProtocol          Cause = "protocol"           // a version, field or order the protocol does not allow
	CauseBadCredential     Cause = "bad-credential"     // malformed, or matches no enrolled instance
	CauseCredentialExpired Cause = "credential-expired" // the credential's TTL passed since it last slid (§7)
	CauseTokenRevoked      Cause = "token-revoked"      // the enrollment token (or its worker's) was revoked
	CauseTokenUnknown      Cause = "token-unknown"      // malformed or unknown enrollment token
	CauseTokenUsed         Cause = "token-used"         // a single-use token already consumed
	CauseTokenExpired      Cause = "token-expired"      // the enrollment token's TTL passed
	CauseScalerSingleUse   Cause = "scaler-single-use"  // a scaler-managed instance reconnecting
	CauseAlreadyEnrolled   Cause = "already-enrolled"   // enrollment of an instance id already in the pool
	CauseSuperseded        Cause = "superseded"         // a newer connection of the same worker took over
	CauseLimit             Cause = "limit"              // a Hello field over its limit (§12)
)
