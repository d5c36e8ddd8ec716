package core

import (
	"bytes"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// The hand-written encoders must produce exactly encoding/json's bytes: the
// records are the durable format, and Clone and Fingerprint hash them.

// genString draws strings that exercise every escaping rule: HTML
// characters, quotes, control characters, invalid UTF-8, U+2028.
func genString() *rapid.Generator[string] {
	return rapid.OneOf(
		rapid.Just(""),
		rapid.StringMatching(`[a-z0-9/\[\]-]{1,12}`),
		rapid.SampledFrom([]string{"<b>&</b>", `say "hi"\n`, "tab\there", "\x00\x1f\x7f", "\xff\xfe bad", "line\u2028sep\u2029", "ünï", "a\\b"}),
		rapid.String(),
	)
}

func genTime() *rapid.Generator[time.Time] {
	return rapid.Custom(func(t *rapid.T) time.Time {
		switch rapid.IntRange(0, 4).Draw(t, "kind") {
		case 0:
			return time.Time{}
		case 1: // a zone with an offset, and nanoseconds
			loc := time.FixedZone("z", rapid.IntRange(-14*3600, 14*3600).Draw(t, "offset"))
			return time.Unix(rapid.Int64Range(-62135596800, 253402300799).Draw(t, "sec"), rapid.Int64Range(0, 999999999).Draw(t, "nsec")).In(loc)
		case 2: // the monotonic reading must not matter
			return time.Now()
		}
		return time.Unix(rapid.Int64Range(0, 4102444800).Draw(t, "sec"), rapid.Int64Range(0, 999999999).Draw(t, "nsec")).UTC()
	})
}

func genOutcome() *rapid.Generator[Outcome] {
	return rapid.Custom(func(t *rapid.T) Outcome {
		return Outcome{Status: OutcomeStatus(rapid.Uint8().Draw(t, "status")), ExitCode: rapid.Int().Draw(t, "code"), Message: genString().Draw(t, "msg")}
	})
}

func genStrings(label string) *rapid.Generator[[]string] {
	return rapid.Custom(func(t *rapid.T) []string {
		switch rapid.IntRange(0, 2).Draw(t, label+"-kind") {
		case 0:
			return nil
		case 1:
			return []string{}
		}
		return rapid.SliceOfN(genString(), 1, 4).Draw(t, label)
	})
}

func genEnv(label string) *rapid.Generator[map[string]string] {
	return rapid.Custom(func(t *rapid.T) map[string]string {
		switch rapid.IntRange(0, 2).Draw(t, label+"-kind") {
		case 0:
			return nil
		case 1:
			return map[string]string{}
		}
		return rapid.MapOfN(genString(), genString(), 1, 4).Draw(t, label)
	})
}

// drawLocks draws the fields of SPEC §8a on a run and its steps.
func drawLocks(t *rapid.T, r *RunRecord) {
	r.GroupWait, r.Schedule, r.FireAt = rapid.Bool().Draw(t, "groupWait"), genString().Draw(t, "schedule"), genTime().Draw(t, "fireAt")
	r.Spec.Group = genGroup().Draw(t, "group")
	for i := range r.Spec.Steps {
		r.Spec.Steps[i].Group = genGroup().Draw(t, "sgroup")
	}
}

// genGroup draws a concurrency group, zero or not (any field alone).
func genGroup() *rapid.Generator[ConcurrencyGroup] {
	return rapid.Custom(func(t *rapid.T) ConcurrencyGroup {
		if rapid.Bool().Draw(t, "zero") {
			return ConcurrencyGroup{}
		}
		return ConcurrencyGroup{Name: genString().Draw(t, "gname"), Max: rapid.SampledFrom([]int{0, rapid.Int().Draw(t, "gmax")}).Draw(t, "gmaxOf"),
			CancelInProgress: rapid.Bool().Draw(t, "gcancel")}
	})
}

// genRunRecord draws a run whose spec sets each optional field or leaves
// it zero (nil, or empty but not nil).
func genRunRecord() *rapid.Generator[RunRecord] {
	return rapid.Custom(func(t *rapid.T) RunRecord {
		dur := func(label string) time.Duration {
			return rapid.SampledFrom([]time.Duration{0, time.Duration(rapid.Int64().Draw(t, label))}).Draw(t, label+"Of")
		}
		r := RunRecord{ID: RunID(genString().Draw(t, "id")), Parent: RunID(genString().Draw(t, "parent")),
			Spec:        RunSpec{Name: genString().Draw(t, "name"), Timeout: dur("timeout"), Env: genEnv("env").Draw(t, "env")},
			SubmittedAt: genTime().Draw(t, "submitted"), Deadline: genTime().Draw(t, "deadline"),
			CancelReason: genString().Draw(t, "reason"), CancelClass: FailureClass(genString().Draw(t, "class")),
			Failed: rapid.Bool().Draw(t, "failed"), Finished: rapid.Bool().Draw(t, "finished"), FinishedAt: genTime().Draw(t, "finishedAt")}
		r.RerunOf = RunID(genString().Draw(t, "rerunOf"))
		if ids := genStrings("steps").Draw(t, "steps"); ids != nil {
			r.Steps = make([]StepID, len(ids))
			for i, id := range ids {
				r.Steps[i] = StepID(id)
			}
		}
		if n := rapid.IntRange(-1, 3).Draw(t, "specs"); n >= 0 {
			r.Spec.Steps = []StepSpec{}
			for range n {
				r.Spec.Steps = append(r.Spec.Steps, StepSpec{Name: genString().Draw(t, "sname"), Command: genString().Draw(t, "cmd"),
					DependsOn: genStrings("deps").Draw(t, "deps"), Writes: rapid.Bool().Draw(t, "writes"), Type: genString().Draw(t, "type"),
					Runner: genString().Draw(t, "runner"), Tags: genStrings("tags").Draw(t, "tags"), Labels: genEnv("labels").Draw(t, "labels"),
					Target: genString().Draw(t, "target"), Platform: genString().Draw(t, "platform"), Timeout: dur("stimeout"),
					Env: genEnv("senv").Draw(t, "senv"), ForEach: genStrings("items").Draw(t, "items"),
					Concurrency: rapid.SampledFrom([]int{0, rapid.Int().Draw(t, "conc")}).Draw(t, "concOf"), Hold: rapid.Bool().Draw(t, "hold"),
					HoldExpiry: dur("expiry"), Wait: dur("wait")})
				r.Spec.Steps[len(r.Spec.Steps)-1].Outputs = genStrings("outputs").Draw(t, "outputs") // SPEC §14, declared writes
				sp := &r.Spec.Steps[len(r.Spec.Steps)-1]
				sp.Idempotent = rapid.Bool().Draw(t, "idempotent")
				sp.Secrets, sp.SecretsAs, sp.PutSecrets = genStrings("secrets").Draw(t, "secrets"), genString().Draw(t, "secretsAs"), genStrings("puts").Draw(t, "puts") // SPEC §14a
				if rapid.Bool().Draw(t, "retry") {
					sp.Retry = &RetryPolicy{Attempts: rapid.Int().Draw(t, "attempts"), Backoff: dur("backoff"), OnTimeout: rapid.Bool().Draw(t, "ontimeout"),
						Codes: rapid.SampledFrom([][]int{nil, {}, {rapid.Int().Draw(t, "code"), 7}}).Draw(t, "codes")}
				}
				if rapid.Bool().Draw(t, "child") { // a child workflow (SPEC §2), one level
					sp.Workflow = &RunSpec{Name: genString().Draw(t, "cname"), Env: genEnv("cenv").Draw(t, "cenv"),
						Steps: []StepSpec{{Name: genString().Draw(t, "csname"), Command: genString().Draw(t, "ccmd")}}}
				}
				sp.With = genEnv("with").Draw(t, "with")
			}
		}
		r.ParentStep = StepID(genString().Draw(t, "parentStep"))
		if kids := genStrings("children").Draw(t, "children"); kids != nil {
			r.Children = make([]RunID, len(kids))
			for i, k := range kids {
				r.Children[i] = RunID(k)
			}
		}
		r.Depth = rapid.SampledFrom([]int{0, rapid.Int().Draw(t, "depth")}).Draw(t, "depthOf")
		drawLocks(t, &r) // SPEC §8a
		return r
	})
}

func genStepRecord() *rapid.Generator[*StepRecord] {
	return rapid.Custom(func(t *rapid.T) *StepRecord {
		s := &StepRecord{
			ID: StepID(genString().Draw(t, "id")), Run: RunID(genString().Draw(t, "run")), Name: genString().Draw(t, "name"),
			Index: rapid.Int().Draw(t, "index"), Item: genString().Draw(t, "item"),
			State: State(rapid.Uint8().Draw(t, "state")), Class: FailureClass(genString().Draw(t, "class")),
			Message: genString().Draw(t, "message"), SkippedBy: StepID(genString().Draw(t, "skipped")),
			Attempts: rapid.Int().Draw(t, "attempts"), Lease: LeaseID(rapid.Uint64().Draw(t, "lease")),
			QueuedAt: genTime().Draw(t, "queued"), StartedAt: genTime().Draw(t, "started"), TimeoutAt: genTime().Draw(t, "timeoutat"), WaitUntil: genTime().Draw(t, "wait"),
			HoldUntil: genTime().Draw(t, "hold"), ForceAt: genTime().Draw(t, "force"), FinishedAt: genTime().Draw(t, "finished"),
			EverStarted: rapid.Bool().Draw(t, "ever"), RejectedBy: WorkerID(genString().Draw(t, "rejected")),
			RequiredTags: genStrings("tags").Draw(t, "tags"),
		}
		s.Tries = rapid.SampledFrom([]int{0, rapid.Int().Draw(t, "tries")}).Draw(t, "triesOf")
		s.ReusedFrom = StepID(genString().Draw(t, "reusedFrom"))
		if deps := genStrings("deps").Draw(t, "deps"); deps != nil {
			s.Deps = make([]StepID, len(deps))
			for i, d := range deps {
				s.Deps[i] = StepID(d)
			}
		}
		if missed := genStrings("missed").Draw(t, "missed"); missed != nil {
			s.MissedBy = make([]WorkerID, len(missed))
			for i, w := range missed {
				s.MissedBy[i] = WorkerID(w)
			}
		}
		if rapid.Bool().Draw(t, "has-outcome") {
			o := genOutcome().Draw(t, "outcome")
			s.Outcome = &o
		}
		s.Child = RunID(genString().Draw(t, "child"))
		return s
	})
}

func genLeaseRecord() *rapid.Generator[*LeaseRecord] {
	return rapid.Custom(func(t *rapid.T) *LeaseRecord {
		l := &LeaseRecord{
			ID: LeaseID(rapid.Uint64().Draw(t, "id")), Step: StepID(genString().Draw(t, "step")), Worker: WorkerID(genString().Draw(t, "worker")),
			GrantedAt: genTime().Draw(t, "granted"), Current: rapid.Bool().Draw(t, "current"), Started: rapid.Bool().Draw(t, "started"),
			Deadline: genTime().Draw(t, "deadline"), EndReason: genString().Draw(t, "reason"), Committed: rapid.Bool().Draw(t, "committed"), LogClosed: rapid.Bool().Draw(t, "log closed"),
		}
		switch rapid.IntRange(0, 2).Draw(t, "answers-kind") {
		case 1:
			l.Answers = []AnsweredReport{}
		case 2:
			l.Answers = rapid.SliceOfN(rapid.Custom(func(t *rapid.T) AnsweredReport {
				return AnsweredReport{Request: rapid.Uint64().Draw(t, "req"), Outcome: genOutcome().Draw(t, "outcome"),
					Verdict: Verdict(rapid.Uint8().Draw(t, "verdict")), Reason: genString().Draw(t, "reason")}
			}), 1, 3).Draw(t, "answers")
		}
		return l
	})
}

func genServerEvent() *rapid.Generator[ServerEvent] {
	return rapid.Custom(func(t *rapid.T) ServerEvent {
		return ServerEvent{Run: RunID(genString().Draw(t, "run")), Seq: rapid.Int().Draw(t, "seq"), At: genTime().Draw(t, "at"),
			Step: StepID(genString().Draw(t, "step")), Kind: genString().Draw(t, "kind"), Message: genString().Draw(t, "msg"),
			Cause:  Cause(rapid.SampledFrom([]string{"", "grace-expired", genString().Draw(t, "cause")}).Draw(t, "causeOf")),
			Worker: WorkerID(rapid.SampledFrom([]string{"", genString().Draw(t, "worker")}).Draw(t, "workerOf")),
			Lease:  LeaseID(rapid.SampledFrom([]uint64{0, rapid.Uint64().Draw(t, "lease")}).Draw(t, "leaseOf"))}
	})
}

func genRunHistory() *rapid.Generator[*RunHistory] {
	return rapid.Custom(func(t *rapid.T) *RunHistory {
		h := &RunHistory{Run: genRunRecord().Draw(t, "run"), Status: genString().Draw(t, "status")}
		n := rapid.IntRange(-1, 3).Draw(t, "n") // -1: nil slices
		if n >= 0 {
			h.Steps, h.Leases, h.Events = []StepRecord{}, []LeaseRecord{}, []ServerEvent{}
		}
		for i := 0; i < n; i++ {
			h.Steps = append(h.Steps, StepRecord{ID: StepID(genString().Draw(t, "sid")), State: State(rapid.Uint8().Draw(t, "state")),
				FinishedAt: genTime().Draw(t, "sfin"), Outcome: &Outcome{Status: OutcomeSuccess, Message: genString().Draw(t, "msg")}})
			h.Leases = append(h.Leases, LeaseRecord{ID: LeaseID(rapid.Uint64().Draw(t, "lid")), Step: h.Steps[i].ID,
				EndReason: genString().Draw(t, "end"), Committed: rapid.Bool().Draw(t, "committed"), LogClosed: rapid.Bool().Draw(t, "log closed"),
				Answers: []AnsweredReport{{Request: rapid.Uint64().Draw(t, "req"), Outcome: genOutcome().Draw(t, "outcome")}}})
			h.Events = append(h.Events, ServerEvent{Run: h.Run.ID, Seq: i + 1, At: genTime().Draw(t, "at"), Kind: genString().Draw(t, "kind")})
		}
		if rapid.Bool().Draw(t, "derived") {
			h.Head = h.DeriveHead()
		} else {
			h.Head = HistoryHead{Run: RunID(genString().Draw(t, "hrun")), Name: genString().Draw(t, "hname"), Status: genString().Draw(t, "hstatus"),
				Parent:      RunID(rapid.SampledFrom([]string{"", genString().Draw(t, "hparent")}).Draw(t, "hparentOf")),
				SubmittedAt: genTime().Draw(t, "hsub"), FinishedAt: rapid.SampledFrom([]time.Time{{}, genTime().Draw(t, "hfin")}).Draw(t, "hfinOf"),
				Deadline:     rapid.SampledFrom([]time.Time{{}, genTime().Draw(t, "hdl")}).Draw(t, "hdlOf"),
				CancelReason: rapid.SampledFrom([]string{"", genString().Draw(t, "hcancel")}).Draw(t, "hcancelOf"),
				Steps:        rapid.Int().Draw(t, "hsteps")}
			if m := rapid.IntRange(-1, 3).Draw(t, "hstates"); m >= 0 {
				h.Head.States = map[string]int{}
				for j := 0; j < m; j++ {
					h.Head.States[genString().Draw(t, "hstate")] = rapid.Int().Draw(t, "hcount")
				}
			}
		}
		return h
	})
}

func genHash(t *rapid.T, label string) (h [32]byte) {
	for i := range h {
		h[i] = rapid.Uint8().Draw(t, label)
	}
	return h
}

func genWorkerRecord() *rapid.Generator[*WorkerRecord] {
	return rapid.Custom(func(t *rapid.T) *WorkerRecord {
		return &WorkerRecord{ID: WorkerID(genString().Draw(t, "id")), Name: genString().Draw(t, "name"), Token: genString().Draw(t, "token"),
			Tags: genStrings("tags").Draw(t, "tags"), Labels: genEnv("labels").Draw(t, "labels"), Platform: genString().Draw(t, "platform"),
			Slots: rapid.Int().Draw(t, "slots"), Ahead: rapid.SampledFrom([]int{0, rapid.Int().Draw(t, "ahead")}).Draw(t, "aheadOf"),
			Scaler: rapid.Bool().Draw(t, "scaler"), Grace: time.Duration(rapid.Int64().Draw(t, "grace")),
			Active: rapid.Bool().Draw(t, "active"), Revoked: rapid.Bool().Draw(t, "revoked"), CredHash: genHash(t, "cred"),
			CredExpiry: genTime().Draw(t, "expiry"), LastHeartbeat: genTime().Draw(t, "heartbeat"), DisconnectedAt: genTime().Draw(t, "disconnected"),
			GraceUntil: genTime().Draw(t, "graceUntil"), EnrolledAt: genTime().Draw(t, "enrolled"), Draining: rapid.Bool().Draw(t, "draining"),
			clock: genTime().Draw(t, "clock")}
	})
}

func genTokenRecord() *rapid.Generator[*TokenRecord] {
	return rapid.Custom(func(t *rapid.T) *TokenRecord {
		return &TokenRecord{Name: genString().Draw(t, "name"), Hash: genHash(t, "hash"), CreatedAt: genTime().Draw(t, "created"),
			ExpiresAt: genTime().Draw(t, "expires"), Consumed: rapid.Bool().Draw(t, "consumed"), Worker: WorkerID(genString().Draw(t, "worker")),
			Revoked: rapid.Bool().Draw(t, "revoked")}
	})
}

func checkEncode(t *rapid.T, v any) {
	want, err := json.Marshal(v)
	if err != nil {
		t.Skip("encoding/json refuses it")
	}
	if got := encode(v); !bytes.Equal(got, want) {
		t.Fatalf("encode(%T):\n got %s\nwant %s", v, got, want)
	}
}

func TestEncodeMatchesEncodingJSON(t *testing.T) {
	t.Run("meta", rapid.MakeCheck(func(t *rapid.T) {
		checkEncode(t, MetaRecord{RunSeq: rapid.Uint64().Draw(t, "runs"), LeaseSeq: rapid.Uint64().Draw(t, "leases"), NextSweep: genTime().Draw(t, "sweep"),
			RestoredAt: rapid.SampledFrom([]time.Time{{}, genTime().Draw(t, "restored")}).Draw(t, "restoredOf")})
	}))
	t.Run("step", rapid.MakeCheck(func(t *rapid.T) { checkEncode(t, genStepRecord().Draw(t, "step")) }))
	t.Run("lease", rapid.MakeCheck(func(t *rapid.T) { checkEncode(t, genLeaseRecord().Draw(t, "lease")) }))
	t.Run("event", rapid.MakeCheck(func(t *rapid.T) { checkEncode(t, genServerEvent().Draw(t, "event")) }))
	t.Run("run", rapid.MakeCheck(func(t *rapid.T) {
		r := genRunRecord().Draw(t, "run")
		checkEncode(t, &r)
	}))
	t.Run("history", rapid.MakeCheck(func(t *rapid.T) { checkEncode(t, genRunHistory().Draw(t, "history")) }))
	t.Run("worker", rapid.MakeCheck(func(t *rapid.T) { checkEncode(t, genWorkerRecord().Draw(t, "worker")) }))
	t.Run("token", rapid.MakeCheck(func(t *rapid.T) { checkEncode(t, genTokenRecord().Draw(t, "token")) }))
	t.Run("log", rapid.MakeCheck(func(t *rapid.T) {
		checkEncode(t, StepLogLine{Step: StepID(genString().Draw(t, "step")), Lease: LeaseID(rapid.Uint64().Draw(t, "lease")),
			Index: rapid.Int().Draw(t, "index"), Event: rapid.Bool().Draw(t, "event"),
			Line: LogLine{Seq: rapid.Uint64().Draw(t, "seq"), At: genTime().Draw(t, "at"), Text: genString().Draw(t, "text")}})
	}))
}

// A time encoding/json refuses makes encode panic, as it always did.
func TestEncodeRefusesWhatEncodingJSONRefuses(t *testing.T) {
	for _, tm := range []time.Time{
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2020, 1, 1, 0, 0, 0, 0, time.FixedZone("far", 24*3600)),
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("encode of a step queued at %v did not panic", tm)
				}
			}()
			encode(&StepRecord{QueuedAt: tm})
		}()
	}
}

// TestKeysMatchSprintf: the keys formatted by hand are fmt.Sprintf's, for
// any number, its width exceeded or not, negative or not.
func TestKeysMatchSprintf(t *testing.T) {
	num := func(label string) *rapid.Generator[uint64] {
		return rapid.OneOf(rapid.Uint64Range(0, 20), rapid.Uint64(), rapid.SampledFrom([]uint64{9, 10, 99999999, 100000000, 9999999999, 1<<63 - 1, 1 << 63, 1<<64 - 1}))
	}
	rapid.Check(t, func(t *rapid.T) {
		u, n := num("u").Draw(t, "u"), int(num("n").Draw(t, "n"))
		run := RunID(genString().Draw(t, "run"))
		for _, c := range []struct{ got, want string }{
			{leaseKey(LeaseID(u)), fmt.Sprintf("%s/%020d", KindLease, u)},
			{leaseKeyID(LeaseID(u)), fmt.Sprintf("%020d", u)},
			{closedKey(u), fmt.Sprintf("%s/%020d", KindClosed, u)},
			{eventKey(run, n), fmt.Sprintf("%s/%s/%08d", KindEvent, run, n)},
			{logKey(LeaseID(u), n), fmt.Sprintf("%s/%020d/%010d", KindLog, u, n)},
		} {
			if c.got != c.want {
				t.Fatalf("got %q, want %q", c.got, c.want)
			}
		}
	})
}

// TestEncodeHistoryMatchesEncode: encodeHistory (archive's, from the live
// records) renders a history as encode renders the RunHistory of copies
// whose empty lists are nil, which is encoding/json's rendering; and
// where encoding/json refuses a time, it panics as encode does.
func TestEncodeHistoryMatchesEncode(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		h := genRunHistory().Draw(t, "history")
		if len(h.Steps) == 0 {
			h.Steps = nil
		}
		if len(h.Leases) == 0 {
			h.Leases = nil
		}
		if len(h.Run.Steps) == 0 {
			h.Run.Steps = nil // archive writes a run's empty list null, as its copy held it
		}
		var steps []*StepRecord
		for i := range h.Steps {
			steps = append(steps, &h.Steps[i])
		}
		var leases []*LeaseRecord
		for i := range h.Leases {
			leases = append(leases, &h.Leases[i])
		}
		want, err := json.Marshal(h)
		var got []byte
		panicked := func() (p bool) {
			defer func() { p = recover() != nil }()
			var scratch []byte
			got = encodeHistory(&scratch, &h.Head, &h.Run, h.Status, steps, leases, h.Events)
			return false
		}()
		switch {
		case err != nil && !panicked:
			t.Fatalf("encoding/json refuses the history (%v), encodeHistory rendered %s", err, got)
		case err == nil && panicked:
			t.Fatalf("encodeHistory panicked on a history encoding/json renders as %s", want)
		case err == nil && !bytes.Equal(got, want):
			t.Fatalf("encodeHistory:\n got %s\nwant %s", got, want)
		}
	})
}
