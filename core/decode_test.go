package core

import (
	"encoding/json"
	"reflect"
	"testing"

	"pgregory.net/rapid"
)

// TestDecodeLogLineMatchesEncodingJSON: a log line's record decodes as
// json.Unmarshal decodes it — the same value, or an error where it errs —
// for what the encoder writes and for that with a byte changed, inserted
// or removed.
func TestDecodeLogLineMatchesEncodingJSON(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ln := StepLogLine{Step: StepID(genString().Draw(t, "step")), Lease: LeaseID(rapid.Uint64().Draw(t, "lease")),
			Index: rapid.Int().Draw(t, "index"), Event: rapid.Bool().Draw(t, "event"),
			Line: LogLine{Seq: rapid.Uint64().Draw(t, "seq"), At: genTime().Draw(t, "at"), Text: genString().Draw(t, "text")}}
		b, err := json.Marshal(ln) // what the encoder writes (TestEncodeMatchesEncodingJSON)
		if err != nil {
			t.Skip("a time encoding/json refuses")
		}
		if n := rapid.IntRange(0, 3).Draw(t, "edits"); n > 0 && len(b) > 0 {
			for range n {
				i := rapid.IntRange(0, len(b)-1).Draw(t, "at")
				c := rapid.SampledFrom([]byte(`{}":,0123456789-tfnue\ Zx`)).Draw(t, "byte")
				switch rapid.IntRange(0, 2).Draw(t, "edit") {
				case 0:
					b[i] = c
				case 1:
					b = append(b[:i], append([]byte{c}, b[i:]...)...)
				default:
					b = append(b[:i], b[i+1:]...)
				}
				if len(b) == 0 {
					break
				}
			}
		}
		var got, want StepLogLine
		gotErr, wantErr := decodeLogLine(b, &got), json.Unmarshal(b, &want)
		if (gotErr == nil) != (wantErr == nil) {
			t.Fatalf("%s: decodeLogLine error %v, encoding/json %v", b, gotErr, wantErr)
		}
		if wantErr == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: decodeLogLine\n%+v\nencoding/json\n%+v", b, got, want)
		}
	})
}
