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
//     every event.
//
// The wire codec's FuzzDecode lives with it in adapters/wire. `go test
// ./fuzz` (and so `make test`) replays the seeds and the committed corpora
// under testdata/fuzz/<Target>/; `go test ./fuzz -run '^$' -fuzz
// '^<Target>$' -fuzztime 30s` explores.
package fuzz
