package core

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"
)

// encode renders a record's value as canonical JSON: exactly what
// encoding/json's Marshal produces. The records written on every step
// (meta, step, lease, server event, log line, worker, token) are rendered by hand, which
// is several times faster; encode_test.go checks over random values that
// the bytes are the same. Anything unusual (a time outside RFC 3339's
// years) takes encoding/json's path, and so its panic.
func encode(v any) []byte {
	var scratch []byte
	return encodeScratch(&scratch, v)
}

// encodeScratch is encode rendering into *scratch, which it keeps for the
// next call, and returning an exact-size copy (the value is kept in the
// orchestrator's cache and the store's batch).
func encodeScratch(scratch *[]byte, v any) []byte {
	e := recEncoder{b: (*scratch)[:0]}
	switch v := v.(type) {
	case MetaRecord:
		e.meta(&v)
	case *MetaRecord:
		e.meta(v)
	case *StepRecord:
		e.step(v)
	case *LeaseRecord:
		e.lease(v)
	case ServerEvent:
		e.event(&v)
	case *ServerEvent:
		e.event(v)
	case StepLogLine:
		e.logLine(&v)
	case *StepLogLine:
		e.logLine(v)
	case *RunRecord:
		e.run(v)
	case *RunHistory:
		e.history(v)
	case *WorkerRecord:
		e.worker(v)
	case *TokenRecord:
		e.token(v)
	default:
		e.bad = true
	}
	if !e.bad {
		*scratch = e.b
		return append(make([]byte, 0, len(e.b)), e.b...)
	}
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("core: encoding a record cannot fail: %v", err))
	}
	return b
}

// recEncoder appends JSON; bad is set when a value needs encoding/json.
type recEncoder struct {
	b   []byte
	bad bool
}

// key opens a field: `{"Name":` for the first, `,"Name":` after.
func (e *recEncoder) key(first bool, name string) {
	if first {
		e.b = append(e.b, '{')
	} else {
		e.b = append(e.b, ',')
	}
	e.b = append(e.b, '"')
	e.b = append(e.b, name...)
	e.b = append(e.b, '"', ':')
}

func (e *recEncoder) end() { e.b = append(e.b, '}') }

func (e *recEncoder) str(s string) { e.b = appendJSONString(e.b, s) }

func (e *recEncoder) int(n int) { e.b = strconv.AppendInt(e.b, int64(n), 10) }

func (e *recEncoder) uint(n uint64) { e.b = strconv.AppendUint(e.b, n, 10) }

func (e *recEncoder) bool(v bool) { e.b = strconv.AppendBool(e.b, v) }

// time renders t as time.Time.MarshalJSON does; a time it refuses (a year
// outside 0-9999, a zone offset of 24 hours or more) marks the record bad.
func (e *recEncoder) time(t time.Time) {
	n0 := len(e.b) + 1
	e.b = append(e.b, '"')
	e.b = t.AppendFormat(e.b, time.RFC3339Nano)
	b := e.b
	switch {
	case len(b) < n0+5 || b[n0+4] != '-': // the year must be exactly 4 digits wide
		e.bad = true
	case b[len(b)-1] != 'Z':
		c := b[len(b)-len("Z07:00")]
		h := 10*(b[len(b)-5]-'0') + (b[len(b)-4] - '0')
		if ('0' <= c && c <= '9') || h >= 24 {
			e.bad = true
		}
	}
	e.b = append(e.b, '"')
}

// appendJSONString appends s as encoding/json quotes it (with HTML
// escaping). Plain printable ASCII is copied; anything else takes
// encoding/json's path.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always encodes
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// encStrings renders a string slice as encoding/json does (nil is null).
func encStrings[S ~string](e *recEncoder, ss []S) {
	if ss == nil {
		e.b = append(e.b, "null"...)
		return
	}
	e.b = append(e.b, '[')
	for i, s := range ss {
		if i > 0 {
			e.b = append(e.b, ',')
		}
		e.str(string(s))
	}
	e.b = append(e.b, ']')
}

func (e *recEncoder) meta(m *MetaRecord) {
	e.key(true, "RunSeq")
	e.uint(m.RunSeq)
	e.key(false, "LeaseSeq")
	e.uint(m.LeaseSeq)
	e.key(false, "NextSweep")
	e.time(m.NextSweep)
	if !m.RestoredAt.IsZero() {
		e.key(false, "RestoredAt")
		e.time(m.RestoredAt)
	}
	if m.AuditSeq != 0 {
		e.key(false, "AuditSeq")
		e.uint(m.AuditSeq)
	}
	e.end()
}

func (e *recEncoder) step(s *StepRecord) {
	e.key(true, "ID")
	e.str(string(s.ID))
	e.key(false, "Run")
	e.str(string(s.Run))
	e.key(false, "Name")
	e.str(s.Name)
	e.key(false, "Index")
	e.int(s.Index)
	if s.Item != "" {
		e.key(false, "Item")
		e.str(s.Item)
	}
	e.key(false, "Deps")
	encStrings(e, s.Deps)
	e.key(false, "State")
	e.uint(uint64(s.State))
	if s.Class != "" {
		e.key(false, "Class")
		e.str(string(s.Class))
	}
	if s.Message != "" {
		e.key(false, "Message")
		e.str(s.Message)
	}
	if s.SkippedBy != "" {
		e.key(false, "SkippedBy")
		e.str(string(s.SkippedBy))
	}
	e.key(false, "Attempts")
	e.int(s.Attempts)
	e.key(false, "Lease")
	e.uint(uint64(s.Lease))
	for _, f := range [...]struct {
		name string
		t    time.Time
	}{{"QueuedAt", s.QueuedAt}, {"StartedAt", s.StartedAt}, {"WaitUntil", s.WaitUntil}, {"HoldUntil", s.HoldUntil}, {"ForceAt", s.ForceAt}, {"TimeoutAt", s.TimeoutAt}} {
		if !f.t.IsZero() {
			e.key(false, f.name)
			e.time(f.t)
		}
	}
	if s.Outcome != nil {
		e.key(false, "Outcome")
		e.outcome(s.Outcome)
	}
	if !s.FinishedAt.IsZero() {
		e.key(false, "FinishedAt")
		e.time(s.FinishedAt)
	}
	e.key(false, "EverStarted")
	e.bool(s.EverStarted)
	if s.RejectedBy != "" {
		e.key(false, "RejectedBy")
		e.str(string(s.RejectedBy))
	}
	if len(s.RequiredTags) > 0 {
		e.key(false, "RequiredTags")
		encStrings(e, s.RequiredTags)
	}
	if len(s.MissedBy) > 0 {
		e.key(false, "MissedBy")
		encStrings(e, s.MissedBy)
	}
	if s.Tries != 0 {
		e.key(false, "Tries")
		e.int(s.Tries)
	}
	e.optStr("ReusedFrom", string(s.ReusedFrom))
	e.optStr("Child", string(s.Child))
	e.end()
}

func (e *recEncoder) outcome(o *Outcome) {
	e.key(true, "Status")
	e.uint(uint64(o.Status))
	e.key(false, "ExitCode")
	e.int(o.ExitCode)
	e.key(false, "Message")
	e.str(o.Message)
	e.end()
}

func (e *recEncoder) lease(l *LeaseRecord) {
	e.key(true, "ID")
	e.uint(uint64(l.ID))
	e.key(false, "Step")
	e.str(string(l.Step))
	e.key(false, "Worker")
	e.str(string(l.Worker))
	e.key(false, "GrantedAt")
	e.time(l.GrantedAt)
	e.key(false, "Current")
	e.bool(l.Current)
	e.key(false, "Started")
	e.bool(l.Started)
	if l.Held {
		e.key(false, "Held")
		e.bool(true)
	}
	if !l.Deadline.IsZero() {
		e.key(false, "Deadline")
		e.time(l.Deadline)
	}
	if l.EndReason != "" {
		e.key(false, "EndReason")
		e.str(l.EndReason)
	}
	e.key(false, "Committed")
	e.bool(l.Committed)
	if l.LogClosed {
		e.key(false, "LogClosed")
		e.bool(true)
	}
	if len(l.Answers) > 0 {
		e.key(false, "Answers")
		e.b = append(e.b, '[')
		for i := range l.Answers {
			a := &l.Answers[i]
			if i > 0 {
				e.b = append(e.b, ',')
			}
			e.key(true, "Request")
			e.uint(a.Request)
			e.key(false, "Outcome")
			e.outcome(&a.Outcome)
			e.key(false, "Verdict")
			e.uint(uint64(a.Verdict))
			if a.Reason != "" {
				e.key(false, "Reason")
				e.str(a.Reason)
			}
			e.end()
		}
		e.b = append(e.b, ']')
	}
	e.end()
}

func (e *recEncoder) event(ev *ServerEvent) {
	e.key(true, "Run")
	e.str(string(ev.Run))
	e.key(false, "Seq")
	e.int(ev.Seq)
	e.key(false, "At")
	e.time(ev.At)
	e.key(false, "Step")
	e.str(string(ev.Step))
	e.key(false, "Kind")
	e.str(ev.Kind)
	e.key(false, "Message")
	e.str(ev.Message)
	if ev.Cause != "" {
		e.key(false, "Cause")
		e.str(string(ev.Cause))
	}
	if ev.Worker != "" {
		e.key(false, "Worker")
		e.str(string(ev.Worker))
	}
	if ev.Lease != 0 {
		e.key(false, "Lease")
		e.uint(uint64(ev.Lease))
	}
	e.end()
}

func (e *recEncoder) logLine(l *StepLogLine) {
	e.key(true, "Step")
	e.str(string(l.Step))
	e.key(false, "Lease")
	e.uint(uint64(l.Lease))
	e.key(false, "Index")
	e.int(l.Index)
	e.key(false, "Event")
	e.bool(l.Event)
	e.key(false, "Line")
	e.key(true, "Seq")
	e.uint(l.Line.Seq)
	e.key(false, "At")
	e.time(l.Line.At)
	e.key(false, "Text")
	e.str(l.Line.Text)
	e.end()
	e.end()
}

// history renders an archived run: the run through encoding/json (its spec
// is arbitrary), the rest by hand. Steps, leases and events are nil-free
// slices when the run has any (a run has at least one step).
func (e *recEncoder) history(h *RunHistory) {
	e.historyOf(&h.Head, &h.Run, h.Status, pointers(h.Steps), h.Steps == nil, pointers(h.Leases), h.Leases == nil, h.Events)
}

// encodeHistory renders, as encode does a RunHistory, the history of run
// r from the live records (archive): the same bytes as a RunHistory of
// copies, whose Steps are null when r has none and Leases null when no
// step had one (encode_test.go).
func encodeHistory(scratch *[]byte, head *HistoryHead, r *RunRecord, status string, steps []*StepRecord, leases []*LeaseRecord, events []ServerEvent) []byte {
	e := recEncoder{b: (*scratch)[:0]}
	e.historyOf(head, r, status, steps, len(steps) == 0, leases, len(leases) == 0, events)
	*scratch = e.b
	if e.bad { // what encode would render through encoding/json (and so its panic)
		h := RunHistory{Head: *head, Run: *r, Status: status, Events: events}
		for _, s := range steps {
			h.Steps = append(h.Steps, *s)
		}
		for _, l := range leases {
			h.Leases = append(h.Leases, *l)
		}
		return encode(&h)
	}
	return append(make([]byte, 0, len(e.b)), e.b...)
}

// historyOf renders a history's parts; a list marked null is null, as
// encoding/json renders a nil slice.
func (e *recEncoder) historyOf(head *HistoryHead, r *RunRecord, status string,
	steps []*StepRecord, stepsNull bool, leases []*LeaseRecord, leasesNull bool, events []ServerEvent) {
	e.key(true, "Head")
	e.historyHead(head)
	e.key(false, "Run")
	e.run(r)
	e.key(false, "Status")
	e.str(status)
	e.key(false, "Steps")
	encList(e, len(steps), stepsNull, func(i int) { e.step(steps[i]) })
	e.key(false, "Leases")
	encList(e, len(leases), leasesNull, func(i int) { e.lease(leases[i]) })
	e.key(false, "Events")
	encSlice(e, events, func(ev *ServerEvent) { e.event(ev) })
	e.end()
}

// pointers points at each element of xs.
func pointers[T any](xs []T) []*T {
	ps := make([]*T, len(xs))
	for i := range xs {
		ps[i] = &xs[i]
	}
	return ps
}

// encList renders n elements as a JSON array, or null when isNil.
func encList(e *recEncoder, n int, isNil bool, one func(int)) {
	if isNil {
		e.b = append(e.b, "null"...)
		return
	}
	e.b = append(e.b, '[')
	for i := range n {
		if i > 0 {
			e.b = append(e.b, ',')
		}
		one(i)
	}
	e.b = append(e.b, ']')
}

func (e *recEncoder) run(r *RunRecord) {
	e.key(true, "ID")
	e.str(string(r.ID))
	e.key(false, "Spec")
	e.runSpec(&r.Spec)
	e.optStr("Parent", string(r.Parent))
	e.optStr("ParentStep", string(r.ParentStep))
	e.optInt("Depth", int64(r.Depth))
	if len(r.Children) > 0 {
		e.key(false, "Children")
		encStrings(e, r.Children)
	}
	e.optStr("Schedule", r.Schedule)
	e.optTime("FireAt", r.FireAt)
	e.optBool("GroupWait", r.GroupWait)
	e.key(false, "SubmittedAt")
	e.time(r.SubmittedAt)
	e.optTime("Deadline", r.Deadline)
	e.optStr("CancelReason", r.CancelReason)
	e.key(false, "CancelClass")
	e.str(string(r.CancelClass))
	e.key(false, "Steps")
	encStrings(e, r.Steps)
	e.key(false, "Failed")
	e.bool(r.Failed)
	e.key(false, "Finished")
	e.bool(r.Finished)
	e.optTime("FinishedAt", r.FinishedAt)
	e.optStr("RerunOf", string(r.RerunOf))
	e.end()
}

// runSpec renders a RunSpec, whose optional fields are omitzero.
func (e *recEncoder) runSpec(s *RunSpec) {
	e.key(true, "Name")
	e.str(s.Name)
	e.optInt("Timeout", int64(s.Timeout))
	e.optMap("Env", s.Env)
	e.group(&s.Group)
	e.key(false, "Steps")
	encSlice(e, s.Steps, func(st *StepSpec) { e.stepSpec(st) })
	e.end()
}

func (e *recEncoder) stepSpec(s *StepSpec) {
	e.key(true, "Name")
	e.str(s.Name)
	e.key(false, "Command")
	e.str(s.Command)
	e.optStrings("DependsOn", s.DependsOn)
	e.optBool("Writes", s.Writes)
	e.optStr("Type", s.Type)
	e.optStr("Runner", s.Runner)
	e.optStrings("Tags", s.Tags)
	e.optMap("Labels", s.Labels)
	e.optStr("Target", s.Target)
	e.optStr("Platform", s.Platform)
	e.optInt("Timeout", int64(s.Timeout))
	e.optMap("Env", s.Env)
	e.optStrings("ForEach", s.ForEach)
	e.optInt("Concurrency", int64(s.Concurrency))
	e.group(&s.Group)
	e.optBool("Hold", s.Hold)
	e.optInt("HoldExpiry", int64(s.HoldExpiry))
	e.optInt("Wait", int64(s.Wait))
	e.optStrings("Outputs", s.Outputs)
	if s.Retry != nil {
		e.key(false, "Retry")
		e.retry(s.Retry)
	}
	e.optBool("Idempotent", s.Idempotent)
	e.optStrings("Secrets", s.Secrets)
	e.optStr("SecretsAs", s.SecretsAs)
	e.optStrings("PutSecrets", s.PutSecrets)
	if s.Workflow != nil {
		e.key(false, "Workflow")
		e.runSpec(s.Workflow)
	}
	e.optMap("With", s.With)
	e.end()
}

// retry renders a RetryPolicy (Attempts always, the rest omitzero).
func (e *recEncoder) retry(p *RetryPolicy) {
	e.key(true, "Attempts")
	e.int(p.Attempts)
	e.optInt("Backoff", int64(p.Backoff))
	if p.Codes != nil {
		e.key(false, "Codes")
		encSlice(e, p.Codes, func(c *int) { e.int(*c) })
	}
	e.optBool("OnTimeout", p.OnTimeout)
	e.end()
}

// optInt renders field name unless n is zero (omitzero).
func (e *recEncoder) optInt(name string, n int64) {
	if n != 0 {
		e.key(false, name)
		e.b = strconv.AppendInt(e.b, n, 10)
	}
}

// optBool renders field name unless v is false (omitzero).
func (e *recEncoder) optBool(name string, v bool) {
	if v {
		e.key(false, name)
		e.bool(v)
	}
}

// optStrings renders field name unless ss is nil (omitzero: an empty
// slice is not zero).
func (e *recEncoder) optStrings(name string, ss []string) {
	if ss != nil {
		e.key(false, name)
		encStrings(e, ss)
	}
}

// optMap renders field name unless m is nil (omitzero), its keys sorted
// as encoding/json sorts them.
func (e *recEncoder) optMap(name string, m map[string]string) {
	if m == nil {
		return
	}
	e.key(false, name)
	e.b = append(e.b, '{')
	for i, k := range sortedKeys(m) {
		if i > 0 {
			e.b = append(e.b, ',')
		}
		e.str(k)
		e.b = append(e.b, ':')
		e.str(m[k])
	}
	e.b = append(e.b, '}')
}

// hash renders a [32]byte as encoding/json does: an array of numbers.
func (e *recEncoder) hash(h *[32]byte) {
	e.b = append(e.b, '[')
	for i, c := range h {
		if i > 0 {
			e.b = append(e.b, ',')
		}
		e.b = strconv.AppendUint(e.b, uint64(c), 10)
	}
	e.b = append(e.b, ']')
}

// worker renders a WorkerRecord: written at every enrollment, Hello,
// disconnect and grace change, and with the heartbeat clock (§8).
func (e *recEncoder) worker(w *WorkerRecord) {
	e.key(true, "ID")
	e.str(string(w.ID))
	e.key(false, "Name")
	e.str(w.Name)
	e.key(false, "Token")
	e.str(w.Token)
	if len(w.Tags) > 0 {
		e.key(false, "Tags")
		encStrings(e, w.Tags)
	}
	if len(w.Labels) > 0 {
		e.optMap("Labels", w.Labels)
	}
	e.optStr("Platform", w.Platform)
	e.key(false, "Slots")
	e.int(w.Slots)
	if w.Ahead != 0 {
		e.key(false, "Ahead")
		e.int(w.Ahead)
	}
	e.key(false, "Scaler")
	e.bool(w.Scaler)
	e.key(false, "Grace")
	e.b = strconv.AppendInt(e.b, int64(w.Grace), 10)
	e.key(false, "Active")
	e.bool(w.Active)
	e.key(false, "Revoked")
	e.bool(w.Revoked)
	e.key(false, "CredHash")
	e.hash(&w.CredHash)
	e.key(false, "CredExpiry")
	e.time(w.CredExpiry)
	e.key(false, "LastHeartbeat")
	e.time(w.LastHeartbeat)
	e.optTime("DisconnectedAt", w.DisconnectedAt)
	e.optTime("GraceUntil", w.GraceUntil)
	e.key(false, "EnrolledAt")
	e.time(w.EnrolledAt)
	if w.Draining {
		e.key(false, "Draining")
		e.bool(true)
	}
	e.end()
}

func (e *recEncoder) token(t *TokenRecord) {
	e.key(true, "Name")
	e.str(t.Name)
	e.key(false, "Hash")
	e.hash(&t.Hash)
	e.key(false, "CreatedAt")
	e.time(t.CreatedAt)
	e.key(false, "ExpiresAt")
	e.time(t.ExpiresAt)
	e.key(false, "Consumed")
	e.bool(t.Consumed)
	e.optStr("Worker", string(t.Worker))
	e.key(false, "Revoked")
	e.bool(t.Revoked)
	e.end()
}

// optStr renders field name unless s is empty (omitempty).
func (e *recEncoder) optStr(name, s string) {
	if s != "" {
		e.key(false, name)
		e.str(s)
	}
}

// optTime renders field name unless t is zero (omitzero).
func (e *recEncoder) optTime(name string, t time.Time) {
	if !t.IsZero() {
		e.key(false, name)
		e.time(t)
	}
}

func (e *recEncoder) historyHead(h *HistoryHead) {
	e.key(true, "Run")
	e.str(string(h.Run))
	e.key(false, "Name")
	e.str(h.Name)
	e.key(false, "Status")
	e.str(h.Status)
	e.optStr("Parent", string(h.Parent))
	e.key(false, "SubmittedAt")
	e.time(h.SubmittedAt)
	e.optTime("FinishedAt", h.FinishedAt)
	e.optTime("Deadline", h.Deadline)
	e.optStr("CancelReason", h.CancelReason)
	e.key(false, "Steps")
	e.int(h.Steps)
	e.key(false, "States")
	if h.States == nil {
		e.b = append(e.b, "null"...)
	} else {
		e.b = append(e.b, '{')
		for i, k := range sortedKeys(h.States) { // encoding/json sorts a map's keys
			if i > 0 {
				e.b = append(e.b, ',')
			}
			e.str(k)
			e.b = append(e.b, ':')
			e.int(h.States[k])
		}
		e.b = append(e.b, '}')
	}
	e.end()
}

// encSlice renders a slice of records as encoding/json does (nil is null).
func encSlice[T any](e *recEncoder, xs []T, one func(*T)) {
	encList(e, len(xs), xs == nil, func(i int) { one(&xs[i]) })
}
