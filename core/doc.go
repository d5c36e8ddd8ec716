// Package core holds Tether's two pure state machines: the Orchestrator, which
// owns all durable truth (runs, steps, leases, the worker pool, tokens), and
// the Worker, the logic inside every worker process. The simulator, the model
// checker, the real adapters and the binaries all drive these two; nothing else
// decides.
//
// Neither machine does I/O, reads a clock, draws global randomness or starts a
// goroutine. Each is a plain struct, not safe for concurrent use, changed only
// by Step(now, input), which returns one batch of effects as values. The
// orchestrator's clock is the only one that decides truth; the worker's clock
// only measures durations.
//
// # Driving an Orchestrator
//
// The driver owns one Orchestrator on one goroutine and loops:
//
//  1. Gather inputs: messages and closes from worker connections (Received,
//     Disconnected), operator API calls (Submit, CancelRun, ...), and a Tick
//     when the last batch's Deadline has passed. Fill Received.Entropy and
//     CreateToken.Secret from a cryptographic source.
//  2. Call Step(now, input) with the orchestrator's clock reading. Several
//     inputs may be stepped one after another and their batches merged (group
//     commit) as long as steps 3-5 treat the merged batch as one.
//  3. Save every Record of the batch to stable storage in one atomic
//     transaction and sync it. Nothing of the batch may leave the process
//     before this returns: this is what makes a COMMITTED answer, a START
//     acknowledgement and a lease grant survive a crash.
//  4. Only then send the batch's Messages in order, each on its connection;
//     after a Close or Refused message, close that connection and do not
//     report its Disconnected. Then return the Answers to their callers.
//     Steps 3 and 4 may overlap the stepping of later inputs (a pipeline)
//     as long as batches become durable, and then leave, in the order they
//     were stepped, and nothing answers from the state before the state it
//     reads is durable.
//  5. Arrange a Tick no later than Deadline. When several inputs were merged
//     into one batch, the last Ready's Deadline is the machine's earliest
//     timer (each Ready's Deadline is computed from the whole state).
//  6. On restart, load every record and call Restore(cfg, now, records); its
//     Ready is handled like any other batch (it re-arms every in-flight
//     promise with fresh deadlines).
//
// # Driving a Worker
//
//  1. Call Step(now, WBoot{}) once, with the worker's local clock. A process
//     restarted with the identity an earlier one saved boots with
//     WorkerConfig.Credential (SPEC §9).
//  2. If Credential() changed (the enrollment Welcome), save it durably
//     first when the worker keeps its identity across restarts. Then do
//     what the WorkerReady says, in this order: send Send in order on the
//     current connection; Close that connection if asked (and report no
//     WDisconnected for it); Dial if asked and report WConnected or
//     WDialFailed; carry out Exec commands (start a step process in its own
//     process group, SIGTERM or SIGKILL the group); write Logs, each at its
//     Level; if Exit is set, exit with its code (step processes die with the
//     worker).
//  3. Feed back every transport event (WDisconnected), every message
//     (WReceived), step output (WExecOutput: the lines read at once), every
//     process exit (WExecExited, after all of the process's output), a WDrain
//     for each SIGTERM or SIGINT (SPEC §10: the first drains, the next stops
//     the steps), and a WTick when Deadline passes. After each Step, read no
//     more output of a lease for which OutputPaused holds (SPEC §10:
//     backpressure).
//
// # Determinism
//
// Both machines are deterministic functions of their inputs (and, for the
// Worker, its seed). Map iteration never decides output order. Clone gives an
// independent copy and Fingerprint a 64-bit hash of the canonical state, for
// the model checker. An Orchestrator rebuilt by Restore from the records of
// every batch so far holds the same durable state as the one that wrote them.
package core
