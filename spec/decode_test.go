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

// TestDecodeWorkerAndTokenRecMatchEncodingJSON: the checker reads worker
// and token records as json.Unmarshal into a workerRec or a tokenRec reads
// them, for records as the core writes them and with bytes changed,
// inserted or removed.
func TestDecodeWorkerAndTokenRecMatchEncodingJSON(t *testing.T) {
	str := rapid.OneOf(rapid.StringMatching(`[a-z0-9/-]{0,6}`), rapid.SampledFrom([]string{"<&>", `q"`, "ü"}))
	at := func(t *rapid.T, label string) time.Time {
		return time.Unix(rapid.Int64Range(0, 1<<32).Draw(t, label), rapid.Int64Range(0, 999).Draw(t, label+"-ns")).UTC()
	}
	rapid.Check(t, func(t *rapid.T) {
		var b []byte
		if rapid.Bool().Draw(t, "worker") {
			w := core.WorkerRecord{ID: core.WorkerID(str.Draw(t, "id")), Name: str.Draw(t, "name"), Token: str.Draw(t, "token"),
				Platform: str.Draw(t, "platform"), Slots: rapid.IntRange(-2, 64).Draw(t, "slots"), Ahead: rapid.IntRange(0, 4).Draw(t, "ahead"),
				Active: rapid.Bool().Draw(t, "active"), Revoked: rapid.Bool().Draw(t, "revoked"), Draining: rapid.Bool().Draw(t, "draining"),
				Grace: time.Duration(rapid.Int64().Draw(t, "grace")), CredExpiry: at(t, "exp"), LastHeartbeat: at(t, "hb"), EnrolledAt: at(t, "enrolled")}
			w.CredHash[rapid.IntRange(0, 31).Draw(t, "hashAt")] = rapid.Byte().Draw(t, "hash")
			if rapid.Bool().Draw(t, "tags") {
				w.Tags = []string{str.Draw(t, "tag")}
			}
			if rapid.Bool().Draw(t, "labels") {
				w.Labels = map[string]string{str.Draw(t, "lk"): str.Draw(t, "lv")}
			}
			if rapid.Bool().Draw(t, "gone") {
				w.DisconnectedAt, w.GraceUntil = at(t, "disc"), at(t, "until")
			}
			b, _ = json.Marshal(w)
		} else {
			tr := core.TokenRecord{Name: str.Draw(t, "name"), CreatedAt: at(t, "created"), ExpiresAt: at(t, "expires"),
				Consumed: rapid.Bool().Draw(t, "consumed"), Worker: core.WorkerID(str.Draw(t, "w")), Revoked: rapid.Bool().Draw(t, "revoked")}
			tr.Hash[rapid.IntRange(0, 31).Draw(t, "hashAt")] = rapid.Byte().Draw(t, "hash")
			b, _ = json.Marshal(tr)
		}
		for range rapid.IntRange(0, 2).Draw(t, "edits") {
			i := rapid.IntRange(0, len(b)).Draw(t, "at")
			c := rapid.SampledFrom([]byte(`{}[]":,09-tfxZ`)).Draw(t, "byte")
			if rapid.Bool().Draw(t, "insert") || i == len(b) {
				b = append(b[:i], append([]byte{c}, b[i:]...)...)
			} else {
				b[i] = c
			}
		}
		var gotW, wantW workerRec
		gotErr, wantErr := decodeWorkerRec(b, &gotW), json.Unmarshal(b, &wantW)
		if (gotErr == nil) != (wantErr == nil) || (wantErr == nil && !reflect.DeepEqual(gotW, wantW)) {
			t.Fatalf("%s: decodeWorkerRec %+v (%v), encoding/json %+v (%v)", b, gotW, gotErr, wantW, wantErr)
		}
		var gotT, wantT tokenRec
		gotErr, wantErr = decodeTokenRec(b, &gotT), json.Unmarshal(b, &wantT)
		if (gotErr == nil) != (wantErr == nil) || (wantErr == nil && !reflect.DeepEqual(gotT, wantT)) {
			t.Fatalf("%s: decodeTokenRec %+v (%v), encoding/json %+v (%v)", b, gotT, gotErr, wantT, wantErr)
		}
	})
}
