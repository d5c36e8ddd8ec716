package store

import "errors"

// ErrDeposed is returned when another orchestrator has taken the lead (a
// newer epoch); the caller must stop acting (SPEC §11).
var ErrDeposed = errors.New("store: deposed: another orchestrator has taken the lead (a newer epoch)")
