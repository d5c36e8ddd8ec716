package store

import "errors"

// ErrDeposed is returned when another orchestrator has taken the lead (a
// newer epoch); the caller must stop acting (SPEC §11).
var ErrDeposed = errors.New("store: deposed: another orchestrator has taken the lead (a newer epoch)")

// ErrEarlierFailed is a Pipeline place's error when an earlier place's
// batch failed: nothing of this one was applied either.
var ErrEarlierFailed = errors.New("store: an earlier batch of the pipeline failed")
