package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tether-run/tether/core"
)

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 123456789, time.UTC)

// samples holds at least one message of every kind, with every field set
// (and one sparse variant where nil and zero values must survive).
var samples = []core.Msg{
	core.Hello{Version: 1, Token: "ci.00ff", Worker: "0b9e-uuid", Name: "w1", Tags: []string{"docker", "script"},
		Labels: map[string]string{"zone": "a"}, Platform: "linux/amd64", Slots: 4, Scaler: true,
		MaxDelay: 60 * time.Second, InFlight: []core.LeaseRef{{Step: "run-1/a", Lease: 7}}},
	core.Hello{Version: 2, Credential: "0b9e-uuid.abcd", Worker: "0b9e-uuid", Slots: 2, Ahead: 2,
		InFlight: []core.LeaseRef{{Step: "run-1/a", Lease: 7}, {Step: "run-1/b", Lease: 8, Held: true}}},
	core.Hello{Version: 1, Credential: "0b9e-uuid.abcd", Worker: "0b9e-uuid", Slots: 1},
	core.Heartbeat{InFlight: []core.LeaseRef{{Step: "run-1/a", Lease: 7}, {Step: "run-1/b[2]", Lease: 9}}},
	core.Heartbeat{},
	core.Start{Lease: 7, Request: 3},
	core.Held{Lease: 8},
	core.RejectDispatch{Lease: 8, Reason: "busy"},
	core.Report{Step: "run-1/a", Lease: 7, Request: 4, Outcome: core.Outcome{Status: core.OutcomeSuccess}},
	core.Report{Step: "run-1/a", Lease: 7, Request: 5, Outcome: core.Outcome{Status: core.OutcomeFailure, ExitCode: 2, Message: "exit status 2"}},
	core.Report{Step: "run-1/a", Lease: 7, Request: 6, Outcome: core.Outcome{Status: core.OutcomeCancelled, ExitCode: 143}},
	core.Report{Step: "run-1/a", Lease: 7, Request: 7, Outcome: core.Outcome{Status: core.OutcomeCleanupFailed, Message: "rm failed"}},
	core.Logs{Lease: 7, Lines: []core.LogLine{{Seq: 0, At: t0, Text: "--- gap ---"}, {Seq: 1, At: t0.Add(time.Millisecond), Text: "héllo \"world\"\t\x01"}}},
	core.Events{Lease: 7, Events: []core.LogLine{{Seq: 1, At: t0, Text: "capability get-data"}}},
	core.Refresh{Request: 11},
	core.Drain{},
	core.Report{Step: "run-1/a", Lease: 7, Request: 8, Outcome: core.Outcome{Status: core.OutcomeWorkerStopped, ExitCode: 143, Message: "the worker was stopped while draining"}},
	core.Welcome{Worker: "0b9e-uuid", Credential: "0b9e-uuid.abcd", CredentialTTL: 15 * time.Minute, Heartbeat: 30 * time.Second, Cancel: []core.LeaseID{3, 5}},
	core.Welcome{Worker: "0b9e-uuid", CredentialTTL: 1500 * time.Microsecond, Heartbeat: time.Nanosecond},
	core.Refused{Reason: "unknown enrollment token", Fatal: true},
	core.Dispatch{Lease: 7, Step: "run-1/build[1]", Run: "run-1", Command: "echo $TETHER_ITEM; sleep 0.2",
		Env: map[string]string{"TETHER_ITEM": "b", "A": "1"}, Writes: true, Timeout: 90 * time.Second, Attempt: 2},
	core.StartAck{Lease: 7, Request: 3, OK: true},
	core.StartAck{Lease: 7, Request: 3, Reason: "lease no longer current"},
	core.Cancel{Lease: 7, Reason: "cancelled by operator"},
	core.Answer{Lease: 7, Request: 4, Verdict: core.Committed},
	core.Answer{Lease: 7, Request: 4, Verdict: core.Cancelled, Reason: "lease lost authority"},
	core.Answer{Lease: 7, Request: 4, Verdict: core.Rejected, Reason: "unknown lease"},
	core.Refreshed{Request: 11, TTL: 15 * time.Minute},
	core.LogAck{Lease: 7, Lines: 1000, Events: 3},
	core.Close{Reason: "superseded by a new connection"},
}

func TestRoundTripEveryKind(t *testing.T) {
	seen := map[string]bool{}
	for _, m := range samples {
		b, err := Encode(m)
		if err != nil {
			t.Fatalf("Encode %s: %v", m.Kind(), err)
		}
		var f struct {
			V    int             `json:"v"`
			Type string          `json:"type"`
			Body json.RawMessage `json:"body"`
		}
		if err := json.Unmarshal(b, &f); err != nil || f.V != Version || f.Type != m.Kind() || len(f.Body) == 0 {
			t.Fatalf("Encode %s: frame %s is not {v:1,type,body} (err %v)", m.Kind(), b, err)
		}
		got, err := Decode(b)
		if err != nil {
			t.Fatalf("Decode %s: %v (frame %s)", m.Kind(), err, b)
		}
		if !reflect.DeepEqual(got, m) {
			t.Errorf("%s round trip:\n got %s\nwant %s", m.Kind(), core.DescribeMsg(got), core.DescribeMsg(m))
		}
		seen[m.Kind()] = true
	}
	for _, k := range Kinds() {
		if !seen[k] {
			t.Errorf("no round-trip sample of kind %q", k)
		}
	}
	if n := len(Kinds()); n != 19 {
		t.Errorf("codec knows %d kinds, want the 19 of core/msg.go: %v", n, Kinds())
	}
}

type alien struct{}

func (alien) Kind() string { return "alien" }

type impostor struct{}

func (impostor) Kind() string { return "hello" }

func TestEncodeErrors(t *testing.T) {
	for _, m := range []core.Msg{nil, alien{}, impostor{}, &core.Hello{}} {
		if _, err := Encode(m); !errors.Is(err, ErrUnknownType) {
			t.Errorf("Encode(%T): err = %v, want ErrUnknownType", m, err)
		}
	}
	big := core.Logs{Lease: 1, Lines: []core.LogLine{{Seq: 1, Text: strings.Repeat("x", MaxFrame)}}}
	if _, err := Encode(big); !errors.Is(err, ErrFrameTooLarge) {
		t.Errorf("Encode(oversize): err = %v, want ErrFrameTooLarge", err)
	}
}

func TestDecodeMalformed(t *testing.T) {
	cases := []struct {
		name  string
		frame string
		want  error
	}{
		{"empty", ``, ErrMalformed},
		{"not json", `hello`, ErrMalformed},
		{"truncated", `{"v":1,"type":"start","body":{"lease":1`, ErrMalformed},
		{"trailing data", `{"v":1,"type":"start","body":{"lease":1}} {}`, ErrMalformed},
		{"array", `[1,2]`, ErrMalformed},
		{"null", `null`, ErrVersion},
		{"no version", `{"type":"start","body":{}}`, ErrVersion},
		{"version 2", `{"v":2,"type":"start","body":{}}`, ErrVersion},
		{"version string", `{"v":"1","type":"start","body":{}}`, ErrMalformed},
		{"unknown type", `{"v":1,"type":"launch","body":{}}`, ErrUnknownType},
		{"no type", `{"v":1,"body":{}}`, ErrUnknownType},
		{"no body", `{"v":1,"type":"start"}`, ErrMalformed},
		{"null body", `{"v":1,"type":"start","body":null}`, ErrMalformed},
		{"array body", `{"v":1,"type":"start","body":[]}`, ErrMalformed},
		{"wrong field type", `{"v":1,"type":"start","body":{"lease":"seven"}}`, ErrMalformed},
		{"negative lease", `{"v":1,"type":"start","body":{"lease":-1}}`, ErrMalformed},
		{"bad verdict", `{"v":1,"type":"answer","body":{"lease":1,"request":1,"verdict":"MAYBE"}}`, ErrMalformed},
		{"bad duration", `{"v":1,"type":"refreshed","body":{"request":1,"ttl":"soon"}}`, ErrMalformed},
		{"numeric duration", `{"v":1,"type":"refreshed","body":{"request":1,"ttl":900}}`, ErrMalformed},
		{"bad time", `{"v":1,"type":"logs","body":{"lease":1,"lines":[{"seq":1,"at":"yesterday","text":"x"}]}}`, ErrMalformed},
		{"oversize", `{"v":1,"type":"close","body":{"reason":"` + strings.Repeat("x", MaxFrame) + `"}}`, ErrFrameTooLarge},
	}
	for _, c := range cases {
		m, err := Decode([]byte(c.frame))
		if !errors.Is(err, c.want) {
			t.Errorf("%s: Decode = (%v, %v), want error %v", c.name, m, err, c.want)
		}
	}
}

// An unknown outcome status is a malformed report, not a malformed frame:
// it decodes with the invalid status, which the core answers REJECTED, and
// the connection stays (SPEC §3).
func TestDecodeUnknownOutcomeStatus(t *testing.T) {
	m, err := Decode([]byte(`{"v":1,"type":"report","body":{"step":"s","lease":1,"request":1,"outcome":{"status":"meh"}}}`))
	want := core.Report{Step: "s", Lease: 1, Request: 1}
	if err != nil || !reflect.DeepEqual(m, want) {
		t.Fatalf("Decode = (%#v, %v), want %#v", m, err, want)
	}
}

// Unknown body fields are ignored: a newer peer may add optional fields
// without a version bump.
func TestDecodeIgnoresUnknownBodyFields(t *testing.T) {
	m, err := Decode([]byte(`{"v":1,"type":"start","body":{"lease":4,"request":2,"future":true}}`))
	if err != nil || !reflect.DeepEqual(m, core.Start{Lease: 4, Request: 2}) {
		t.Fatalf("Decode = (%v, %v)", m, err)
	}
}

// FuzzDecode: Decode never panics, and whatever it accepts re-encodes to a
// frame that decodes to the same message.
func FuzzDecode(f *testing.F) {
	for _, m := range samples {
		b, err := Encode(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"v":1,"type":"logs","body":{"lease":1,"lines":null}}`))
	f.Add([]byte(`{"v":1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		// What the fast decoder takes, the reflective one reads the same.
		if fm, ok := fastDecode(b); ok {
			if rm, err := decodeReflect(b); err != nil || !reflect.DeepEqual(fm, rm) {
				t.Fatalf("fast decode of %q gives %#v; reflective (%#v, %v)", b, fm, rm, err)
			}
		}
		m, err := Decode(b)
		if err != nil {
			return
		}
		b2, err := Encode(m)
		if err != nil {
			if errors.Is(err, ErrFrameTooLarge) || bytes.Contains(b, []byte(`"at"`)) {
				return // re-encoding may grow (escapes) or meet a time JSON cannot render
			}
			t.Fatalf("re-encode of accepted %q: %v", b, err)
		}
		m2, err := Decode(b2)
		if err != nil || !reflect.DeepEqual(m, m2) {
			t.Fatalf("accepted %q re-decodes to (%v, %v)", b, m2, err)
		}
	})
}
