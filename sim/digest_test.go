package sim

import (
	"fmt"
	"testing"
	"time"

	"github.com/tether-run/tether/core"
	"pgregory.net/rapid"
)

// TestDigestFormatsMatchFmt: the trace digest's hand-written lines are
// fmt.Appendf's with the formats the stored trace hashes were made with,
// byte for byte, for any field values (states and events out of range,
// strings with quotes and invalid UTF-8, negative numbers).
func TestDigestFormatsMatchFmt(t *testing.T) {
	str := rapid.OneOf(rapid.String(), rapid.StringMatching(`[a-z0-9/.-]{0,8}`),
		rapid.SampledFrom([]string{"", `q"`, "\xff\xfe", "tab\there", "ü\n"}))
	rapid.Check(t, func(t *rapid.T) {
		prefix := []byte(str.Draw(t, "prefix"))
		tr := core.StepTransition{Step: core.StepID(str.Draw(t, "step")), From: core.State(rapid.Uint8().Draw(t, "from")),
			Event: core.Event(rapid.Uint8().Draw(t, "event")), To: core.State(rapid.Uint8().Draw(t, "to"))}
		want := fmt.Appendf(append([]byte{}, prefix...), "transition %s %s %s %s\n", tr.Step, tr.From, tr.Event, tr.To)
		if got := appendTransition(append([]byte{}, prefix...), tr); string(got) != string(want) {
			t.Fatalf("transition %+v: %q, fmt %q", tr, got, want)
		}
		a := core.APIAnswer{Call: core.CallID(rapid.Uint64().Draw(t, "call")), Err: str.Draw(t, "err"),
			Run: core.RunID(str.Draw(t, "run")), Token: str.Draw(t, "token"), Code: str.Draw(t, "code")}
		want = fmt.Appendf(append([]byte{}, prefix...), "answer call=%d err=%q run=%s token=%q\n", a.Call, a.Err, a.Run, a.Token)
		if got := appendAnswer(append([]byte{}, prefix...), a); string(got) != string(want) {
			t.Fatalf("answer %+v: %q, fmt %q", a, got, want)
		}
		lease := core.LeaseID(rapid.Uint64().Draw(t, "lease"))
		var env map[string]string
		if rapid.Bool().Draw(t, "env") {
			env = rapid.MapOf(str, str).Draw(t, "envs")
		}
		var secrets []string
		if rapid.Bool().Draw(t, "secrets") {
			secrets = rapid.SliceOf(str).Draw(t, "secretList")
		}
		msgs := []core.Msg{
			core.LogAck{Lease: lease, Lines: rapid.Uint64().Draw(t, "lines"), Events: rapid.Uint64().Draw(t, "events")},
			core.StartAck{Lease: lease, Request: rapid.Uint64().Draw(t, "req"), OK: rapid.Bool().Draw(t, "ok"), Reason: str.Draw(t, "reason")},
			core.Answer{Lease: lease, Request: rapid.Uint64().Draw(t, "req2"), Verdict: core.Verdict(rapid.Uint8().Draw(t, "verdict")), Reason: str.Draw(t, "reason2")},
			core.Cancel{Lease: lease, Reason: str.Draw(t, "reason3")},
			core.Dispatch{Lease: lease, Step: core.StepID(str.Draw(t, "dstep")), Run: core.RunID(str.Draw(t, "drun")), Command: str.Draw(t, "cmd"),
				Env: env, Writes: rapid.Bool().Draw(t, "writes"), Timeout: time.Duration(rapid.Int64().Draw(t, "timeout")),
				Attempt: rapid.Int().Draw(t, "attempt"), Secrets: secrets, SecretsAs: str.Draw(t, "as")},
			core.Refreshed{Request: 3, TTL: time.Minute},
		}
		for _, msg := range msgs {
			m := core.Envelope{Conn: core.ConnID(rapid.Uint64().Draw(t, "conn")), Msg: msg}
			want = fmt.Appendf(append([]byte{}, prefix...), "message conn=%d %s %+v\n", m.Conn, m.Msg.Kind(), m.Msg)
			if got := appendMessage(append([]byte{}, prefix...), m); string(got) != string(want) {
				t.Fatalf("message %+v: %q, fmt %q", m, got, want)
			}
		}
		e := core.ServerEvent{Run: core.RunID(str.Draw(t, "erun")), Seq: rapid.Int().Draw(t, "seq"),
			At: time.Unix(0, rapid.Int64().Draw(t, "at")), Step: core.StepID(str.Draw(t, "estep")), Kind: str.Draw(t, "kind")}
		want = fmt.Appendf(append([]byte{}, prefix...), "event %s #%d at=%d %s %s\n", e.Run, e.Seq, e.At.UnixNano(), e.Step, e.Kind)
		if got := appendEvent(append([]byte{}, prefix...), e); string(got) != string(want) {
			t.Fatalf("event %+v: %q, fmt %q", e, got, want)
		}
	})
}
