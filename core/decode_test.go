package core

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

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

// editJSON changes up to three bytes of b: one replaced, inserted or
// removed, drawn from JSON's punctuation, digits and letters of literals.
func editJSON(t *rapid.T, b []byte) []byte {
	for range rapid.IntRange(0, 3).Draw(t, "edits") {
		if len(b) == 0 {
			break
		}
		i := rapid.IntRange(0, len(b)).Draw(t, "at")
		c := rapid.SampledFrom([]byte(`{}[]":,0123456789-tfnlue\ Zx`)).Draw(t, "byte")
		switch rapid.IntRange(0, 2).Draw(t, "edit") {
		case 0:
			if i < len(b) {
				b[i] = c
			}
		case 1:
			b = append(b[:i], append([]byte{c}, b[i:]...)...)
		default:
			if i < len(b) {
				b = append(b[:i], b[i+1:]...)
			}
		}
	}
	return b
}

// checkDecode: decode reads b as json.Unmarshal reads it into a zero T —
// the same value (nil and empty slices told apart), or an error where
// encoding/json errs, and never a panic.
func checkDecode[T any](t interface{ Fatalf(string, ...any) }, b []byte, decode func([]byte, *T) error) {
	var got, want T
	gotErr, wantErr := decode(b, &got), json.Unmarshal(b, &want)
	if (gotErr == nil) != (wantErr == nil) {
		t.Fatalf("%s: hand decoder error %v, encoding/json %v", b, gotErr, wantErr)
	}
	if wantErr == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("%s: hand decoder\n%+v\nencoding/json\n%+v", b, got, want)
	}
}

// TestDecodeRecordsMatchEncodingJSON: step, lease and server event
// records decode as json.Unmarshal decodes them, for what the encoder
// writes of any value (every optional field present or not, strings
// needing escapes, times in any zone) and for that with bytes changed,
// inserted or removed.
func TestDecodeRecordsMatchEncodingJSON(t *testing.T) {
	marshal := func(t *rapid.T, v any) []byte {
		if rapid.IntRange(0, 3).Draw(t, "plain") > 0 {
			plainStrings(reflect.ValueOf(v))
		}
		b, err := json.Marshal(v)
		if err != nil {
			t.Skip("a value encoding/json refuses")
		}
		return editJSON(t, b)
	}
	t.Run("step", rapid.MakeCheck(func(t *rapid.T) {
		checkDecode(t, marshal(t, genStepRecord().Draw(t, "step")), decodeStep)
	}))
	t.Run("lease", rapid.MakeCheck(func(t *rapid.T) {
		checkDecode(t, marshal(t, genLeaseRecord().Draw(t, "lease")), decodeLease)
	}))
	t.Run("event", rapid.MakeCheck(func(t *rapid.T) {
		ev := genServerEvent().Draw(t, "event")
		checkDecode(t, marshal(t, &ev), decodeEvent)
	}))
	t.Run("run", rapid.MakeCheck(func(t *rapid.T) {
		r := genRunRecord().Draw(t, "run")
		r.ParentStep, r.Depth, r.Schedule = StepID(genString().Draw(t, "pstep")), rapid.Int().Draw(t, "depth"), genString().Draw(t, "schedule")
		r.FireAt, r.GroupWait = genTime().Draw(t, "fire"), rapid.Bool().Draw(t, "wait")
		if ids := genStrings("children").Draw(t, "children"); ids != nil {
			r.Children = []RunID{}
			for _, id := range ids {
				r.Children = append(r.Children, RunID(id))
			}
		}
		checkDecode(t, marshal(t, &r), decodeRun)
	}))
	t.Run("history", rapid.MakeCheck(func(t *rapid.T) {
		checkDecode(t, marshal(t, genRunHistory().Draw(t, "history")), decodeHistory)
	}))
	hash := func(t *rapid.T) (h [32]byte) {
		copy(h[:], rapid.SliceOfN(rapid.Byte(), 32, 32).Draw(t, "hash"))
		return h
	}
	t.Run("worker", rapid.MakeCheck(func(t *rapid.T) {
		w := &WorkerRecord{ID: WorkerID(genString().Draw(t, "id")), Name: genString().Draw(t, "name"), Token: genString().Draw(t, "token"),
			Tags: genStrings("tags").Draw(t, "tags"), Platform: genString().Draw(t, "platform"), Slots: rapid.Int().Draw(t, "slots"),
			Ahead: rapid.IntRange(-1, 64).Draw(t, "ahead"), Scaler: rapid.Bool().Draw(t, "scaler"),
			Grace: time.Duration(rapid.Int64().Draw(t, "grace")), Active: rapid.Bool().Draw(t, "active"), Revoked: rapid.Bool().Draw(t, "revoked"),
			CredHash: hash(t), CredExpiry: genTime().Draw(t, "exp"), LastHeartbeat: genTime().Draw(t, "hb"),
			DisconnectedAt: genTime().Draw(t, "disc"), GraceUntil: genTime().Draw(t, "grace-until"), EnrolledAt: genTime().Draw(t, "enrolled"),
			Draining: rapid.Bool().Draw(t, "draining")}
		switch rapid.IntRange(0, 2).Draw(t, "labels-kind") {
		case 1:
			w.Labels = genEnv("labels").Draw(t, "labels")
		case 2:
			w.Labels = rapid.MapOf(rapid.StringMatching(`[a-z]{1,4}`), rapid.StringMatching(`[a-z0-9]{0,4}`)).Draw(t, "plain-labels")
		}
		checkDecode(t, marshal(t, w), decodeWorker)
	}))
	t.Run("token", rapid.MakeCheck(func(t *rapid.T) {
		tr := &TokenRecord{Name: genString().Draw(t, "name"), Hash: hash(t), CreatedAt: genTime().Draw(t, "created"),
			ExpiresAt: genTime().Draw(t, "expires"), Consumed: rapid.Bool().Draw(t, "consumed"),
			Worker: WorkerID(genString().Draw(t, "worker")), Revoked: rapid.Bool().Draw(t, "revoked")}
		checkDecode(t, marshal(t, tr), decodeToken)
	}))
}

// plainStrings replaces every string inside v that encoding/json would
// escape with a plain one, so that the hand decoders' own path is the one
// tested (one string needing an escape sends a record to encoding/json).
func plainStrings(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			plainStrings(v.Elem())
		}
	case reflect.Struct:
		for i := range v.NumField() {
			plainStrings(v.Field(i))
		}
	case reflect.Slice:
		for i := range v.Len() {
			plainStrings(v.Index(i))
		}
	case reflect.Map: // a map's values are not settable: left as they are
	case reflect.String:
		if v.CanSet() {
			var b []byte
			for _, c := range []byte(v.String()) {
				if c >= 0x20 && c < 0x7f && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
					b = append(b, c)
				}
			}
			v.SetString(string(b))
		}
	}
}

// TestDecodeRecordsEdges: numbers out of their field's range, trailing
// bytes, nulls and garbage decode (or fail) as encoding/json has them.
func TestDecodeRecordsEdges(t *testing.T) {
	at := `"2026-01-01T00:00:01Z"`
	steps := []string{
		`{"ID":"a","Run":"r","Name":"a","Index":0,"Deps":null,"State":256,"Attempts":0,"Lease":0,"EverStarted":false}`,
		`{"ID":"a","Run":"r","Name":"a","Index":0,"Deps":null,"State":255,"Attempts":0,"Lease":0,"EverStarted":false}`,
		`{"ID":"a","Run":"r","Name":"a","Index":0,"Deps":[],"State":1,"Attempts":0,"Lease":0,"EverStarted":false} `,
		`{"ID":"a","Run":"r","Name":"a","Index":0,"Deps":[],"State":1,"Attempts":0,"Lease":0,"EverStarted":false}x`,
		`{"ID":"a","Run":"r","Name":"a","Index":0,"Deps":[],"State":1,"Attempts":0,"Lease":-1,"EverStarted":false}`,
		`{"ID":"a","Run":"r","Name":"a","Index":0,"Deps":[],"State":1,"Attempts":0,"Lease":18446744073709551616,"EverStarted":false}`,
		`{"ID":"a","Run":"r","Name":"a","Index":9223372036854775808,"Deps":[],"State":1,"Attempts":0,"Lease":0,"EverStarted":false}`,
		`{"ID":"a","Run":"r","Name":"a","Index":0,"Deps":[],"State":1,"Attempts":0,"Lease":0,"Outcome":null,"EverStarted":false}`,
		`{"ID":"a","Run":"r","Name":"a","Index":0,"Deps":[],"State":1,"Attempts":0,"Lease":0,"Outcome":{"Status":300,"ExitCode":0,"Message":""},"EverStarted":false}`,
		`{"ID":"a","Run":"r","Name":"a","Index":0,"Deps":[],"State":1,"Attempts":0,"Lease":0,"QueuedAt":"yesterday","EverStarted":false}`,
		`{"ID":"a","ID":"b","Run":"r","Name":"a","Index":0,"Deps":[],"State":1,"Attempts":0,"Lease":0,"EverStarted":false}`,
		`{"id":"a","Run":"r","Name":"a","Index":0,"Deps":[],"State":1,"Attempts":0,"Lease":0,"EverStarted":false}`,
		`{"ID":"a","Run":"r","Name":"a","Index":0,"Deps":["x",],"State":1,"Attempts":0,"Lease":0,"EverStarted":false}`,
		``, `{`, `null`, `[]`, `{}`, `"x"`, `{"ID":1}`,
	}
	leases := []string{
		`{"ID":1,"Step":"s","Worker":"w","GrantedAt":` + at + `,"Current":true,"Started":false,"Committed":false,"Answers":[{"Request":1,"Outcome":{"Status":1,"ExitCode":0,"Message":""},"Verdict":256}]}`,
		`{"ID":1,"Step":"s","Worker":"w","GrantedAt":` + at + `,"Current":true,"Started":false,"Committed":false,"Answers":[]}`,
		`{"ID":1,"Step":"s","Worker":"w","GrantedAt":` + at + `,"Current":true,"Started":false,"Committed":false,"Answers":null}`,
		`{"ID":1,"Step":"s","Worker":"w","GrantedAt":` + at + `,"Current":true,"Started":false,"Committed":false}}`,
		`{"ID":1,"Step":"s","Worker":"w","GrantedAt":` + at + `,"Current":1,"Started":false,"Committed":false}`,
		``, `{`, `null`, `{}`,
	}
	events := []string{
		`{"Run":"r","Seq":1,"At":` + at + `,"Step":"","Kind":"k","Message":"","Lease":0}`,
		`{"Run":"r","Seq":1,"At":` + at + `,"Step":"","Kind":"k","Message":"","Lease":-1}`,
		`{"Run":"r","Seq":1,"At":` + at + `,"Step":"","Kind":"k","Message":"\u0041"}`,
		``, `{`, `null`, `{}`,
	}
	for _, b := range steps {
		checkDecode(t, []byte(b), decodeStep)
	}
	for _, b := range leases {
		checkDecode(t, []byte(b), decodeLease)
	}
	for _, b := range events {
		checkDecode(t, []byte(b), decodeEvent)
	}
	for _, b := range []string{
		`{"Name":"t","Hash":[1,2],"CreatedAt":` + at + `,"ExpiresAt":` + at + `,"Consumed":false,"Revoked":false}`,
		`{"Name":"t","Hash":[` + strings.Repeat("0,", 32) + `0],"CreatedAt":` + at + `,"ExpiresAt":` + at + `,"Consumed":false,"Revoked":false}`,
		`{"Name":"t","Hash":[256` + strings.Repeat(",0", 31) + `],"CreatedAt":` + at + `,"ExpiresAt":` + at + `,"Consumed":false,"Revoked":false}`,
		`{"Name":"t","Hash":[9` + strings.Repeat(",0", 31) + `],"CreatedAt":` + at + `,"ExpiresAt":` + at + `,"Consumed":false,"Revoked":false}`,
	} {
		checkDecode(t, []byte(b), decodeToken)
	}
	wk := `{"ID":"w","Name":"n","Token":"t","Slots":1,"Scaler":false,"Grace":-5,"Active":true,"Revoked":false,"CredHash":[` + strings.Repeat("7,", 31) + `7],"CredExpiry":` + at + `,"LastHeartbeat":` + at + `,"EnrolledAt":` + at
	for _, b := range []string{
		wk + `}`, wk + `,"Draining":true}`,
		strings.Replace(wk, `"Slots":1`, `"Slots":1,"Ahead":2`, 1) + `}`,
		strings.Replace(wk, `"Token":"t"`, `"Token":"t","Labels":{"a":"1","a":"2","b":""}`, 1) + `}`,
		strings.Replace(wk, `"Token":"t"`, `"Token":"t","Labels":{}`, 1) + `}`,
		strings.Replace(wk, `"Token":"t"`, `"Token":"t","Labels":null`, 1) + `}`,
		strings.Replace(wk, `"Token":"t"`, `"Token":"t","Labels":{"a":1}`, 1) + `}`,
		strings.Replace(wk, `"Grace":-5`, `"Grace":9223372036854775808`, 1) + `}`,
	} {
		checkDecode(t, []byte(b), decodeWorker)
	}
	head := `{"Head":{"Run":"r","Name":"n","Status":"ok","SubmittedAt":` + at + `,"Steps":0,"States":null}`
	run := `{"ID":"r","Spec":{"Name":"n","Steps":null},"SubmittedAt":` + at + `,"CancelClass":"","Steps":null,"Failed":false,"Finished":true}`
	for _, b := range []string{
		head + `,"Run":` + run + `,"Status":"ok","Steps":[],"Leases":null,"Events":[]}`,
		head + `,"Run":` + run + `,"Status":"ok","Steps":[],"Leases":null,"Events":[]} `,
		head + `,"Run":{"ID":"r}"],"Status":"ok","Steps":[],"Leases":null,"Events":[]}`,
		head + `,"Run":{"ID":"\"}"},"Status":"ok","Steps":[],"Leases":null,"Events":[]}`,
		head + `,"Run":{"ID":"r","Spec":{"Name":"n","Steps":null}}}`,
		head + `,"Run":{"ID":"r","Depth":"x"},"Status":"ok","Steps":[],"Leases":null,"Events":[]}`,
		head + `,"Run":{"ID":"r"},"Status":"ok","Steps":[{}],"Leases":null,"Events":[]}`,
		head + `,"Run":[],"Status":"ok","Steps":[],"Leases":null,"Events":[]}`,
		`{"Head":null,"Run":{}}`, `{"Head":{`, `{"Head":{}`,
		strings.Replace(head, `null`, `{}`, 1) + `,"Run":` + run + `,"Status":"ok","Steps":[],"Leases":null,"Events":[]}`,
		strings.Replace(head, `null`, `{"a":1,"b":-2,"a":3}`, 1) + `,"Run":` + run + `,"Status":"ok","Steps":[],"Leases":null,"Events":[]}`,
		strings.Replace(head, `null`, `{"a":"1"}`, 1) + `,"Run":` + run + `,"Status":"ok","Steps":[],"Leases":null,"Events":[]}`,
		strings.Replace(head, `null`, `{"a":1.5}`, 1) + `,"Run":` + run + `,"Status":"ok","Steps":[],"Leases":null,"Events":[]}`,
		strings.Replace(head, `null`, `{"a":1,}`, 1) + `,"Run":` + run + `,"Status":"ok","Steps":[],"Leases":null,"Events":[]}`,
	} {
		checkDecode(t, []byte(b), decodeHistory)
	}
	for _, b := range []string{
		run, run + ` `, run + `}`, strings.TrimSuffix(run, `}`),
		strings.Replace(run, `"Steps":null,`, `"Steps":[],`, 1),
		strings.Replace(run, `"Steps":null,`, `"Steps":["a",1],`, 1),
		strings.Replace(run, `"SubmittedAt"`, `"Depth":3,"Children":[],"GroupWait":true,"SubmittedAt"`, 1),
		strings.Replace(run, `"SubmittedAt"`, `"Depth":-1,"Children":null,"SubmittedAt"`, 1),
		strings.Replace(run, `"SubmittedAt"`, `"Depth":1e3,"SubmittedAt"`, 1),
		strings.Replace(run, `"SubmittedAt"`, `"GroupWait":1,"SubmittedAt"`, 1),
		strings.Replace(run, `"Finished":true`, `"Finished":true,"RerunOf":"r0"`, 1),
		strings.Replace(run, `"Finished":true`, `"Finished":true,"Finished":false`, 1),
		strings.Replace(run, `{"Name":"n","Steps":null}`, `{"Name":"n","Steps":[{"Name":"a","Command":"}"}]}`, 1),
		strings.Replace(run, `{"Name":"n","Steps":null}`, `{"Name":"n","Steps":[}`, 1),
		strings.Replace(run, `{"Name":"n","Steps":null}`, `null`, 1),
		strings.Replace(run, `"ID":"r"`, `"ID":"r"`, 1),
		``, `{`, `null`, `{}`, `[]`,
	} {
		checkDecode(t, []byte(b), decodeRun)
	}
}

// TestDecodeRecordsFastPath: what the encoder writes of plain values is
// read by hand, not handed to encoding/json (else the hand decoders are
// dead code and their speed gone).
func TestDecodeRecordsFastPath(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 1, 5, time.UTC)
	s := &StepRecord{ID: "r1/a", Run: "r1", Name: "a", Index: -1, Item: "x", Deps: []StepID{"r1/b"}, State: 3, Class: "c", Message: "m",
		SkippedBy: "r1/c", Attempts: 2, Lease: 7, QueuedAt: at, StartedAt: at, WaitUntil: at, HoldUntil: at, ForceAt: at, TimeoutAt: at,
		Outcome: &Outcome{Status: OutcomeFailure, ExitCode: -2, Message: "no"}, FinishedAt: at, EverStarted: true, RejectedBy: "w1",
		RequiredTags: []string{"gpu"}, MissedBy: []WorkerID{"w2"}, Tries: 1, ReusedFrom: "r0/a", Child: "r2"}
	l := &LeaseRecord{ID: 9, Step: "r1/a", Worker: "w1", GrantedAt: at, Current: true, Started: true, Held: true, Deadline: at, EndReason: "e",
		Committed: true, LogClosed: true, Answers: []AnsweredReport{{Request: 1, Outcome: Outcome{Status: 1}, Verdict: 2, Reason: "r"}, {Request: 2}}}
	ev := &ServerEvent{Run: "r1", Seq: 3, At: at, Step: "r1/a", Kind: "k", Message: "m", Cause: "c", Worker: "w1", Lease: 9}
	for _, c := range []struct {
		v    any
		fast func([]byte) bool
	}{
		{s, func(b []byte) bool { return fastStep(b, &StepRecord{}) }},
		{&StepRecord{}, func(b []byte) bool { return fastStep(b, &StepRecord{}) }},
		{l, func(b []byte) bool { return fastLease(b, &LeaseRecord{}) }},
		{&LeaseRecord{}, func(b []byte) bool { return fastLease(b, &LeaseRecord{}) }},
		{ev, func(b []byte) bool { return fastEvent(b, &ServerEvent{}) }},
		{&ServerEvent{}, func(b []byte) bool { return fastEvent(b, &ServerEvent{}) }},
		{&RunHistory{Run: RunRecord{ID: "r1", Spec: RunSpec{Name: "n", Env: map[string]string{"a": "b"}}}, Status: "ok",
			Steps: []StepRecord{*s}, Leases: []LeaseRecord{*l}, Events: []ServerEvent{*ev}}, func(b []byte) bool { return fastHistory(b, &RunHistory{}) }},
		{&RunHistory{}, func(b []byte) bool { return fastHistory(b, &RunHistory{}) }},
		{&RunHistory{Head: HistoryHead{Run: "r1", Parent: "r0", SubmittedAt: at, FinishedAt: at, Deadline: at, CancelReason: "c", Steps: 2,
			States: map[string]int{"failed": 1, "succeeded": 1}}, Run: RunRecord{ID: "r1", Steps: []StepID{"r1/a"}}},
			func(b []byte) bool { return fastHistory(b, &RunHistory{}) }},
		{&RunRecord{ID: "r1", Spec: RunSpec{Name: "n", Steps: []StepSpec{{Name: "a", Command: "x"}}}, Parent: "r0", ParentStep: "r0/w", Depth: 1,
			Children: []RunID{"r2"}, Schedule: "s", FireAt: at, GroupWait: true, SubmittedAt: at, Deadline: at, CancelReason: "c", CancelClass: "k",
			Steps: []StepID{"r1/a"}, Failed: true, Finished: true, FinishedAt: at, RerunOf: "r9"},
			func(b []byte) bool { p := scan{b: b}; return p.run(&RunRecord{}) && p.i == len(b) }},
		{&RunRecord{}, func(b []byte) bool { p := scan{b: b}; return p.run(&RunRecord{}) && p.i == len(b) }},
		{&RunRecord{ID: "r1", Spec: RunSpec{Name: "n", Timeout: 5, Env: map[string]string{"b": "1", "a": ""}, Group: ConcurrencyGroup{Name: "g", Max: 2, CancelInProgress: true},
			Steps: []StepSpec{{Name: "a", Command: "x", DependsOn: []string{"b"}, Writes: true, Type: "script", Runner: "local", Tags: []string{"t"},
				Labels: map[string]string{"k": "v"}, Target: "w", Platform: "p", Timeout: 1, Env: map[string]string{}, ForEach: []string{"i"}, Concurrency: 3,
				Group: ConcurrencyGroup{Name: "s"}, Hold: true, HoldExpiry: 2, Wait: 3, Outputs: []string{"o*"},
				Retry: &RetryPolicy{Attempts: 2, Backoff: 4, Codes: []int{1, 7}, OnTimeout: true}, Idempotent: true, Secrets: []string{"s"}, SecretsAs: "env",
				PutSecrets: []string{}, Workflow: &RunSpec{Name: "c", Steps: []StepSpec{{Name: "d", Command: "y", Retry: &RetryPolicy{Codes: []int{}}}}},
				With: map[string]string{"w": "v"}}, {Name: "b", Command: ""}}}},
			func(b []byte) bool { p := scan{b: b}; return p.run(&RunRecord{}) && p.i == len(b) }},
		{&WorkerRecord{ID: "w1", Tags: []string{"a"}, Labels: map[string]string{"k": "v", "a": "b"}, Platform: "p", Ahead: 1, DisconnectedAt: at, GraceUntil: at, Draining: true},
			func(b []byte) bool { return fastWorker(b, &WorkerRecord{}) }},
		{&WorkerRecord{}, func(b []byte) bool { return fastWorker(b, &WorkerRecord{}) }},
		{&TokenRecord{Name: "t", Worker: "w1"}, func(b []byte) bool { return fastToken(b, &TokenRecord{}) }},
		{&TokenRecord{}, func(b []byte) bool { return fastToken(b, &TokenRecord{}) }},
	} {
		if b := encode(c.v); !c.fast(b) {
			t.Errorf("%s: not read by hand", b)
		}
	}
}
