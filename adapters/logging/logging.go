// Package logging builds the structured logger both binaries write to
// stderr (--log-format, --log-level), and names the fields that tie a log
// line to what it concerns (SPEC §16).
package logging

import (
	"fmt"
	"io"
	"log/slog"
	"strconv"

	"github.com/tether-run/tether/core"
)

// The fields a log line carries when it concerns a worker, a lease, a step
// or a run (SPEC §16): the same keys on both binaries, in both formats.
const (
	Worker = core.FieldWorker
	Lease  = core.FieldLease
	Step   = core.FieldStep
	Run    = core.FieldRun
)

// New returns a logger writing to w in format "text" (the default, also
// for "") or "json", at level "debug", "info", "warn" or "error". The error
// names the flag at fault.
func New(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text", "":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

// LeaseAttrs are the fields of a line about a lease: the lease, and its
// step and run when the step is known.
func LeaseAttrs(lease core.LeaseID, step core.StepID) []any {
	if step == "" {
		return []any{Lease, uint64(lease)}
	}
	return []any{Lease, uint64(lease), Step, string(step), Run, string(step.Run())}
}

// numericFields are core log fields that are numbers: the core's fields are
// strings, so they are logged as numbers here, for dashboards that
// aggregate them (the recovery log line's, SPEC §4) and so that "lease" has
// one type on every line of both binaries (SPEC §16).
var numericFields = map[string]bool{"recovery_duration": true, "buffered_messages_count": true, Lease: true, "lines": true, "bytes": true}

// CoreAttr turns one of the core's log fields into an attribute.
func CoreAttr(f core.Field) slog.Attr {
	if numericFields[f.Key] {
		if n, err := strconv.ParseInt(f.Value, 10, 64); err == nil {
			return slog.Int64(f.Key, n)
		}
	}
	return slog.String(f.Key, f.Value)
}
