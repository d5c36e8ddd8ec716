package fuzz

import (
	"bytes"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/tether-run/tether/adapters/wire"
	"github.com/tether-run/tether/core"
)

// frameSeeds are encoded frames of each direction, the seeds of the frame
// targets below.
func frameSeeds(t testing.TB) [][]byte {
	var out [][]byte
	for _, m := range []core.Msg{
		core.Hello{Version: core.ProtocolVersion, Token: "t1.00000000000000000000000000000000", Worker: "w1", Name: "w1", Tags: []string{"script"},
			Labels: map[string]string{"zone": "eu"}, Platform: "linux", Slots: 2, MaxDelay: time.Minute},
		core.Hello{Version: core.ProtocolVersion, Credential: "w1.x", Worker: "w1", InFlight: []core.LeaseRef{{Lease: 1, Step: "run-1/a"}}},
		core.Hello{Version: 1, Token: "t1.00000000000000000000000000000000", Worker: "w\x1b[2J", Name: "w\x1b[2J", Tags: []string{"a\r\nb"}, Slots: 1},
		core.Welcome{Worker: "w1", Credential: "w1.x", CredentialTTL: time.Minute, Heartbeat: 30 * time.Second},
		core.Refused{Reason: "bad token \x1b[2J", Fatal: true},
		core.Dispatch{Lease: 1, Step: "run-1/a", Run: "run-1", Command: "echo", Env: map[string]string{"A": "b"}, Writes: true, Timeout: time.Second},
		core.StartAck{Lease: 1, OK: true},
		core.Cancel{Lease: 1},
		core.Answer{Lease: 1, Request: 1, Verdict: core.Committed},
		core.LogAck{Lease: 1, Lines: 3, Events: 1},
	} {
		b, err := wire.Encode(m)
		if err != nil {
			t.Fatalf("encode %T: %v", m, err)
		}
		out = append(out, b)
	}
	return out
}

// FuzzHelloFrame: a frame from an unidentified connection, decoded as the
// orchestrator's connection reader decodes it (wire.Decode) and stepped
// into an Orchestrator that has one enrollment token. Decoding refuses with
// an error or yields a message; stepped, a Hello is answered with exactly
// one Welcome or one Refused whose reason holds no raw control character,
// and whatever the message, the core never panics and its batch's records
// restore (SPEC §9, §11, §12). withToken swaps a decoded Hello's token for
// the valid one, to reach the checks behind the token's.
func FuzzHelloFrame(f *testing.F) {
	for _, b := range frameSeeds(f) {
		f.Add(b, false)
		f.Add(b, true)
	}
	f.Fuzz(func(t *testing.T, frame []byte, withToken bool) {
		m, err := wire.Decode(frame)
		if err != nil {
			if err.Error() == "" {
				t.Fatalf("an empty decode error for %q", frame)
			}
			return
		}
		now := time.Unix(1_700_000_000, 0)
		o := core.NewOrchestrator(core.Config{})
		var disk []core.Record
		rd := o.Step(now, core.CreateToken{Call: 1, Name: "t1", TTL: time.Hour})
		disk = append(disk, rd.Records...)
		tok := rd.Answers[0].Token
		h, isHello := m.(core.Hello)
		if isHello && withToken {
			h.Token, h.Credential = tok, ""
			m = h
		}
		rd = o.Step(now.Add(time.Second), core.Received{Conn: 1, Msg: m})
		disk = append(disk, rd.Records...)
		if isHello {
			var answers []core.Msg
			for _, e := range rd.Messages {
				if e.Conn == 1 {
					answers = append(answers, e.Msg)
				}
			}
			if len(answers) == 0 {
				t.Fatalf("Hello %+v: no answer", h)
			}
			switch a := answers[0].(type) {
			case core.Welcome:
			case core.Refused:
				if a.Reason == "" || strings.ContainsFunc(a.Reason, func(r rune) bool { return r != ' ' && !unicode.IsPrint(r) }) {
					t.Fatalf("Hello %+v refused with reason %q", h, a.Reason)
				}
			default:
				t.Fatalf("Hello %+v answered first with %T", h, a)
			}
		}
		if _, _, err := core.Restore(core.Config{}, now.Add(2*time.Second), disk); err != nil {
			t.Fatalf("the records of %T do not restore: %v", m, err)
		}
	})
}

// FuzzWorkerFrames: frames from the orchestrator, split at newlines,
// decoded as the worker's connection reader decodes them and stepped into a
// connected, enrolled core.Worker. The worker never panics, and every
// message it sends back encodes (the driver could send it), so a hostile
// or broken orchestrator cannot make a worker crash or emit a frame it
// cannot encode (SPEC §9, §10).
func FuzzWorkerFrames(f *testing.F) {
	seeds := frameSeeds(f)
	f.Add(bytes.Join(seeds[3:], []byte("\n")))
	for _, b := range seeds[3:] {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, stream []byte) {
		now := time.Unix(1_700_000_000, 0)
		w := core.NewWorker(core.WorkerConfig{ID: "w1", Name: "w1", Token: "t1.00000000000000000000000000000000", Slots: 2})
		step := func(in core.WorkerInput) {
			now = now.Add(10 * time.Millisecond)
			rd := w.Step(now, in)
			for _, m := range rd.Send {
				if _, err := wire.Encode(m); err != nil {
					t.Fatalf("after %T the worker sends %T, which does not encode: %v", in, m, err)
				}
			}
		}
		step(core.WBoot{})
		step(core.WConnected{Conn: 1})
		step(core.WReceived{Msg: core.Welcome{Worker: "w1", Credential: "w1.x", CredentialTTL: time.Minute, Heartbeat: 30 * time.Second}})
		for _, frame := range bytes.Split(stream, []byte("\n")) {
			m, err := wire.Decode(frame)
			if err != nil {
				continue // the real reader closes the connection; nothing reaches the core
			}
			step(core.WReceived{Msg: m})
			step(core.WTick{})
		}
	})
}
