package fuzz

import (
	"errors"
	"testing"
	"time"

	"github.com/tether-run/tether/core"
)

// FuzzRestore feeds arbitrary records to core.Restore: a damaged store must
// give a clear error (ErrBadRecord) or a working orchestrator, never a panic.
func FuzzRestore(f *testing.F) {
	f.Add("run/run-1", []byte(`{"ID":"run-1","Steps":["run-1/a"]}`))
	f.Add("step/run-1/a", []byte(`{"ID":"run-1/a","Run":"run-1","State":2}`))
	f.Add("lease/00000000000000000001", []byte(`{"ID":1,"Step":"x","Worker":"w","Current":true}`))
	f.Add("meta", []byte(`{"RunSeq":3}`))
	f.Add("bogus/1", []byte(`{}`))
	f.Fuzz(func(t *testing.T, key string, value []byte) {
		o, _, err := core.Restore(core.Config{}, time.Unix(0, 0), []core.Record{{Key: key, Value: value}})
		if err != nil {
			if !errors.Is(err, core.ErrBadRecord) {
				t.Fatalf("error is not ErrBadRecord: %v", err)
			}
			return
		}
		o.Step(time.Unix(60, 0), core.Tick{})
	})
}
