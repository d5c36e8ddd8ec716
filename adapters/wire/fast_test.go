package wire

import (
	"bytes"
	"reflect"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/tether-run/tether/core"
)

// genText draws plain strings (which the fast paths take) and strings that
// need escaping or are not ASCII (which they leave to encoding/json).
func genText() *rapid.Generator[string] {
	return rapid.OneOf(
		rapid.Just(""),
		rapid.StringMatching(`[a-zA-Z0-9 /.\[\]_=$;:-]{1,16}`),
		rapid.SampledFrom([]string{"<x>&", `"q"`, "a\\b", "tab\t", "\x00", "\xff", "é", "\u2028", "1.5µs"}),
		rapid.String(),
	)
}

func genWhen() *rapid.Generator[time.Time] {
	return rapid.Custom(func(t *rapid.T) time.Time {
		switch rapid.IntRange(0, 3).Draw(t, "kind") {
		case 0:
			return time.Time{}
		case 1:
			return time.Unix(rapid.Int64Range(-62135596800, 253402300799).Draw(t, "sec"), rapid.Int64Range(0, 999999999).Draw(t, "nsec")).
				In(time.FixedZone("", 60*rapid.IntRange(-14*60, 14*60).Draw(t, "offset")))
		case 2:
			return time.Date(rapid.IntRange(-2, 10001).Draw(t, "year"), 1, 2, 3, 4, 5, 6, time.UTC)
		}
		return time.Unix(rapid.Int64Range(0, 4102444800).Draw(t, "sec"), rapid.Int64Range(0, 999999999).Draw(t, "nsec")).UTC()
	})
}

func genLines() *rapid.Generator[[]core.LogLine] {
	return rapid.Custom(func(t *rapid.T) []core.LogLine {
		if rapid.IntRange(0, 4).Draw(t, "nil") == 0 {
			return nil
		}
		return rapid.SliceOfN(rapid.Custom(func(t *rapid.T) core.LogLine {
			return core.LogLine{Seq: rapid.Uint64().Draw(t, "seq"), At: genWhen().Draw(t, "at"), Text: genText().Draw(t, "text")}
		}), 0, 3).Draw(t, "lines")
	})
}

func genHeartbeat() *rapid.Generator[core.Msg] {
	return rapid.Custom(func(t *rapid.T) core.Msg {
		var h core.Heartbeat
		for range rapid.IntRange(0, 3).Draw(t, "refs") {
			h.InFlight = append(h.InFlight, core.LeaseRef{Step: core.StepID(genText().Draw(t, "step")),
				Lease: core.LeaseID(rapid.Uint64().Draw(t, "lease")), Held: rapid.Bool().Draw(t, "held")})
		}
		if h.InFlight == nil && rapid.Bool().Draw(t, "empty") {
			h.InFlight = []core.LeaseRef{} // encodes as nil does
		}
		return h
	})
}

// genHot draws a message of a kind the fast paths handle.
func genHot() *rapid.Generator[core.Msg] {
	lease := func(t *rapid.T) core.LeaseID { return core.LeaseID(rapid.Uint64().Draw(t, "lease")) }
	return rapid.Custom(func(t *rapid.T) core.Msg {
		switch rapid.IntRange(0, 8).Draw(t, "kind") {
		case 8:
			return genHeartbeat().Draw(t, "heartbeat")
		case 0:
			return core.Start{Lease: lease(t), Request: rapid.Uint64().Draw(t, "req")}
		case 7:
			return core.Held{Lease: lease(t)}
		case 1:
			return core.Report{Step: core.StepID(genText().Draw(t, "step")), Lease: lease(t), Request: rapid.Uint64().Draw(t, "req"),
				Outcome: core.Outcome{Status: core.OutcomeStatus(rapid.IntRange(1, 4).Draw(t, "status")),
					ExitCode: rapid.Int().Draw(t, "code"), Message: genText().Draw(t, "msg")}}
		case 2:
			return core.StartAck{Lease: lease(t), Request: rapid.Uint64().Draw(t, "req"), OK: rapid.Bool().Draw(t, "ok"), Reason: genText().Draw(t, "reason")}
		case 3:
			return core.Answer{Lease: lease(t), Request: rapid.Uint64().Draw(t, "req"), Verdict: core.Verdict(rapid.IntRange(1, 3).Draw(t, "verdict")),
				Reason: genText().Draw(t, "reason")}
		case 4:
			d := core.Dispatch{Lease: lease(t), Step: core.StepID(genText().Draw(t, "step")), Run: core.RunID(genText().Draw(t, "run")),
				Command: genText().Draw(t, "cmd"), Writes: rapid.Bool().Draw(t, "writes"),
				Timeout: time.Duration(rapid.Int64().Draw(t, "timeout")), Attempt: rapid.Int().Draw(t, "attempt")}
			if env := rapid.MapOfN(genText(), genText(), 0, 4).Draw(t, "env"); len(env) > 0 {
				d.Env = env
			}
			return d
		case 5:
			return core.Logs{Lease: lease(t), Lines: genLines().Draw(t, "lines")}
		}
		return core.Events{Lease: lease(t), Events: genLines().Draw(t, "events")}
	})
}

// plainMsg reports whether every string of m's frame is plain ASCII (then
// the fast decoder must take it) and every time is one JSON can say.
func plainMsg(b []byte) bool {
	for _, c := range b {
		if c == '\\' || c >= 0x80 {
			return false
		}
	}
	return true
}

func TestFastEncodeMatches(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m := genHot().Draw(t, "msg")
		want, werr := encodeReflect(m)
		got, ok := fastEncode(m)
		switch {
		case !ok && werr == nil:
			t.Fatalf("fast encode declined %s, which encodes as %s", core.DescribeMsg(m), want)
		case ok && werr != nil:
			t.Fatalf("fast encode took %s, which fails to encode: %v", core.DescribeMsg(m), werr)
		case ok && !bytes.Equal(got, want):
			t.Fatalf("fast encode of %s:\n got %s\nwant %s", core.DescribeMsg(m), got, want)
		}
	})
}

func TestFastDecodeMatches(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m := genHot().Draw(t, "msg")
		b, err := encodeReflect(m)
		if err != nil {
			t.Skip("not encodable")
		}
		want, werr := decodeReflect(b)
		got, ok := fastDecode(b)
		if !ok {
			if plainMsg(b) && werr == nil {
				t.Fatalf("fast decode declined the canonical, plain frame %s", b)
			}
			return
		}
		if werr != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("fast decode of %s:\n got %#v\nwant %#v (err %v)", b, got, want, werr)
		}
	})
}

// The fast paths take the samples of their kinds.
func TestFastPathsTakeTheSamples(t *testing.T) {
	for _, m := range samples {
		b, ok := fastEncode(m)
		if !ok {
			continue // not a hot kind
		}
		if _, ok := fastDecode(b); !ok && plainMsg(b) {
			t.Errorf("fast decode declined %s", b)
		}
	}
	// A frame off the canonical form goes the reflective way, with the
	// same result.
	for _, f := range []string{
		`{"v":1,"type":"start","body":{"request":2,"lease":4}}`,
		`{"v":1,"type":"heartbeat","body":{"in_flight":[]}}`,
		`{"v":1,"type":"heartbeat","body":{"in_flight":null}}`,
		`{"v":1,"type":"heartbeat","body":{"in_flight":[{"lease":4,"step":"s"}]}}`,
		`{"v":1,"type":"heartbeat","body":{"in_flight":[{"step":"s","lease":4,"held":false}]}}`,
		`{"v":1,"type":"heartbeat","body":{ }}`,
		`{"v":1,"type":"heartbeat","body":{"x":1}}`,
		`{"v":1, "type":"start","body":{"lease":4,"request":2}}`,
		`{"v":1,"type":"start","body":{"Lease":4,"request":2}}`,
		`{"v":1,"type":"start","body":{"lease":4,"request":2,"x":1}}`,
		`{"v":1,"type":"dispatch","body":{"lease":1,"step":"s","run":"r","command":"c","env":{"B":"1","A":"2"},"timeout":"0s","attempt":1}}`,
		`{"v":1,"type":"dispatch","body":{"lease":1,"step":"s","run":"r","command":"c","env":{"A":"1","A":"2"},"timeout":"0s","attempt":1}}`,
	} {
		if _, ok := fastDecode([]byte(f)); ok {
			t.Errorf("fast decode took the non-canonical %s", f)
		}
		if _, err := Decode([]byte(f)); err != nil {
			t.Errorf("Decode(%s): %v", f, err)
		}
	}
}

// A heartbeat the fast decoder cannot take fails as it did before it took
// any: the reflective decoder's error, word for word.
func TestHeartbeatBadFramesErrAsBefore(t *testing.T) {
	for _, f := range []string{
		`{"v":1,"type":"heartbeat","body":{"in_flight":3}}`,
		`{"v":1,"type":"heartbeat","body":{"in_flight":[{"step":"s","lease":-1}]}}`,
		`{"v":1,"type":"heartbeat","body":{"in_flight":[{"step":"s","lease":1}]`,
		`{"v":1,"type":"heartbeat","body":{"in_flight":[{"step":"s","lease":1,"held":"yes"}]}}`,
		`{"v":1,"type":"heartbeat","body":[]}`,
		`{"v":1,"type":"heartbeat"}`,
		`{"v":2,"type":"heartbeat","body":{}}`,
		`{"v":1,"type":"heartbeat","body":{"in_flight":[{"step":"s","lease":18446744073709551616}]}}`,
	} {
		_, want := decodeReflect([]byte(f))
		m, err := Decode([]byte(f))
		if want == nil || err == nil || err.Error() != want.Error() {
			t.Errorf("Decode(%s) = %v, %v; want the reflective decoder's error %v", f, m, err, want)
		}
	}
}

// The fast decoder on a heartbeat's canonical frame with bytes changed,
// cut or dropped: it never panics, and what it takes the reflective
// decoder reads the same.
func TestHeartbeatFastDecodeOnGarbage(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		h := genHeartbeat().Draw(t, "hb")
		b, err := encodeReflect(h)
		if err != nil {
			t.Skip("not encodable")
		}
		b = bytes.Clone(b)
		for range rapid.IntRange(1, 3).Draw(t, "edits") {
			i := rapid.IntRange(0, len(b)-1).Draw(t, "at")
			switch rapid.IntRange(0, 2).Draw(t, "edit") {
			case 0:
				b[i] = rapid.Byte().Draw(t, "byte")
			case 1:
				b = b[:i]
			default:
				b = append(b[:i:i], b[i+1:]...)
			}
			if len(b) == 0 {
				break
			}
		}
		fm, ok := fastDecode(b)
		rm, rerr := decodeReflect(b)
		if ok && (rerr != nil || !reflect.DeepEqual(fm, rm)) {
			t.Fatalf("fast decode of %q gives %#v; reflective (%#v, %v)", b, fm, rm, rerr)
		}
	})
}

// BenchmarkCodec encodes and decodes the messages of one step (dispatch,
// start, start-ack, report, answer), by the fast paths and by encoding/json.
func BenchmarkCodec(b *testing.B) {
	step := []core.Msg{
		core.Dispatch{Lease: 12345, Step: "run-17/s123", Run: "run-17", Command: "true", Timeout: 0, Attempt: 1},
		core.Start{Lease: 12345, Request: 678},
		core.StartAck{Lease: 12345, Request: 678, OK: true},
		core.Report{Step: "run-17/s123", Lease: 12345, Request: 679, Outcome: core.Outcome{Status: core.OutcomeSuccess}},
		core.Answer{Lease: 12345, Request: 679, Verdict: core.Committed},
	}
	for _, c := range []struct {
		name string
		enc  func(core.Msg) ([]byte, error)
		dec  func([]byte) (core.Msg, error)
	}{{"fast", Encode, Decode}, {"reflect", encodeReflect, decodeReflect}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				for _, m := range step {
					f, err := c.enc(m)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := c.dec(f); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
