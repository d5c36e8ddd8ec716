// Package fuzz holds Tether's go test -fuzz targets for everything that
// decodes bytes, and for byte streams decoded into core inputs:
//
//   - FuzzRestore: arbitrary records handed to core.Restore;
//   - FuzzRecordRoundTrip: arbitrary bytes as a record value of each kind
//     for core.DecodeRecord; decoded records re-encode canonically;
//   - FuzzRunSpec and FuzzWorkflow: workflow definitions (JSON, and YAML
//     through adapters/workflow) validated and submitted to an orchestrator;
//   - FuzzInputStream: a byte stream decoded into the events around a real
//     Orchestrator and real Workers (messages, process exits, time, resets,
//     restarts, lost batches, forged reports), checked by spec.Checker after
//     every event;
//   - FuzzHelloFrame: a frame from an unidentified connection, decoded
//     and stepped into an Orchestrator (the Hello → core path);
//   - FuzzWorkerFrames: frames from the orchestrator, decoded and stepped
//     into an enrolled Worker.
//
// The wire codec's FuzzDecode lives with it in adapters/wire; the operator
// API's bodies and arguments (FuzzAPIRequest), the data plane's paths
// (FuzzParseDataPath) and headers (FuzzDataPlaneHeaders) in
// adapters/orchestrator; the worker's step endpoint (FuzzStepEndpoint) in
// adapters/worker. `make fuzz` runs every one for FUZZTIME. `go test
// ./fuzz` (and so `make test`) replays the seeds and the committed corpora
// under testdata/fuzz/<Target>/; `go test ./fuzz -run '^$' -fuzz
// '^<Target>$' -fuzztime 30s` explores.
package fuzz
