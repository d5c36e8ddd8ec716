package spec

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/tether-run/tether/core"
	"pgregory.net/rapid"
)

// TestDecodeLeaseRecMatchesEncodingJSON: the checker reads a lease record
// as json.Unmarshal into a leaseRec reads it — the same fields, or an
// error where it errs — for records as the core writes them and with
// bytes changed, inserted or removed (a field the checker does not read
// may be what breaks).
func TestDecodeLeaseRecMatchesEncodingJSON(t *testing.T) {
	str := rapid.OneOf(rapid.StringMatching(`[a-z0-9/-]{0,6}`), rapid.SampledFrom([]string{"<&>", `q"`, "ü"}))
	rapid.Check(t, func(t *rapid.T) {
		l := core.LeaseRecord{ID: core.LeaseID(rapid.Uint64().Draw(t, "id")), Step: core.StepID(str.Draw(t, "step")),
			Worker: core.WorkerID(str.Draw(t, "worker")), GrantedAt: time.Unix(rapid.Int64Range(0, 1<<32).Draw(t, "at"), 0).UTC(),
			Current: rapid.Bool().Draw(t, "current"), Started: rapid.Bool().Draw(t, "started"), Held: rapid.Bool().Draw(t, "held"),
			EndReason: str.Draw(t, "end"), Committed: rapid.Bool().Draw(t, "committed")}
		if rapid.Bool().Draw(t, "answers") {
			l.Answers = []core.AnsweredReport{{Request: 1, Outcome: core.Outcome{Status: core.OutcomeSuccess}, Verdict: core.Verdict(rapid.Uint8().Draw(t, "verdict"))}}
		}
		b, _ := json.Marshal(l)
		for range rapid.IntRange(0, 2).Draw(t, "edits") {
			i := rapid.IntRange(0, len(b)).Draw(t, "at")
			c := rapid.SampledFrom([]byte(`{}[]":,09-tfx`)).Draw(t, "byte")
			if rapid.Bool().Draw(t, "insert") || i == len(b) {
				b = append(b[:i], append([]byte{c}, b[i:]...)...)
			} else {
				b[i] = c
			}
		}
		var got, want leaseRec
		gotErr, wantErr := decodeLeaseRec(b, &got), json.Unmarshal(b, &want)
		if (gotErr == nil) != (wantErr == nil) || (wantErr == nil && !reflect.DeepEqual(got, want)) {
			t.Fatalf("%s: decodeLeaseRec %+v (%v), encoding/json %+v (%v)", b, got, gotErr, want, wantErr)
		}
	})
}
