package core

import (
	"encoding/json"
	"strconv"
	"time"
)

// decodeLogLine decodes a log line's record value exactly as
// json.Unmarshal into a zero StepLogLine does. What logLine (encode.go)
// writes — every field in its order, no space, strings of printable ASCII
// without escapes — is read by hand, its time through the same
// time.Time.UnmarshalJSON encoding/json calls; anything else goes through
// encoding/json. A restore reads every live lease's lines, and a long-lived
// store holds many.
func decodeLogLine(b []byte, v *StepLogLine) error {
	if fastLogLine(b, v) {
		return nil
	}
	*v = StepLogLine{}
	return json.Unmarshal(b, v)
}

func fastLogLine(b []byte, v *StepLogLine) bool {
	p := scan{b: b}
	var step, text string
	ok := p.lit(`{"Step":`) && p.str(&step) &&
		p.lit(`,"Lease":`) && p.uint((*uint64)(&v.Lease)) &&
		p.lit(`,"Index":`) && p.int(&v.Index) &&
		p.lit(`,"Event":`) && p.bool(&v.Event) &&
		p.lit(`,"Line":{"Seq":`) && p.uint(&v.Line.Seq) &&
		p.lit(`,"At":`) && p.time(&v.Line.At) &&
		p.lit(`,"Text":`) && p.str(&text) &&
		p.lit(`}}`) && p.i == len(b)
	v.Step, v.Line.Text = StepID(step), text
	return ok
}

// scan reads a JSON value's canonical form from b at i.
type scan struct {
	b []byte
	i int
}

func (p *scan) lit(s string) bool {
	if len(p.b)-p.i < len(s) || string(p.b[p.i:p.i+len(s)]) != s {
		return false
	}
	p.i += len(s)
	return true
}

// quoted returns the end of a string of printable ASCII without '"' or
// '\\' starting at i (its closing quote's index), or -1.
func (p *scan) quoted() int {
	if p.i >= len(p.b) || p.b[p.i] != '"' {
		return -1
	}
	for j := p.i + 1; j < len(p.b); j++ {
		switch c := p.b[j]; {
		case c == '"':
			return j
		case c < 0x20 || c >= 0x7f || c == '\\':
			return -1
		}
	}
	return -1
}

func (p *scan) str(s *string) bool {
	j := p.quoted()
	if j < 0 {
		return false
	}
	*s = string(p.b[p.i+1 : j])
	p.i = j + 1
	return true
}

// digits returns the end of a JSON number's digits at i (an optional minus
// sign when signed), with no leading zero, or -1.
func (p *scan) digits(signed bool) int {
	j := p.i
	if signed && j < len(p.b) && p.b[j] == '-' {
		j++
	}
	k := j
	for k < len(p.b) && '0' <= p.b[k] && p.b[k] <= '9' {
		k++
	}
	if k == j || (p.b[j] == '0' && k > j+1) {
		return -1
	}
	return k
}

func (p *scan) uint(n *uint64) bool {
	k := p.digits(false)
	if k < 0 {
		return false
	}
	v, err := strconv.ParseUint(string(p.b[p.i:k]), 10, 64)
	if err != nil {
		return false
	}
	*n, p.i = v, k
	return true
}

func (p *scan) int(n *int) bool {
	k := p.digits(true)
	if k < 0 {
		return false
	}
	v, err := strconv.ParseInt(string(p.b[p.i:k]), 10, strconv.IntSize)
	if err != nil {
		return false
	}
	*n, p.i = int(v), k
	return true
}

func (p *scan) bool(v *bool) bool {
	switch {
	case p.lit("true"):
		*v = true
	case p.lit("false"):
		*v = false
	default:
		return false
	}
	return true
}

func (p *scan) time(t *time.Time) bool {
	j := p.quoted()
	if j < 0 || t.UnmarshalJSON(p.b[p.i:j+1]) != nil {
		return false
	}
	p.i = j + 1
	return true
}

// u8 reads a number that fits a uint8 (State, Verdict, OutcomeStatus);
// encoding/json refuses a greater one.
func (p *scan) u8(n *uint8) bool {
	var v uint64
	i := p.i
	if !p.uint(&v) || v > 255 {
		p.i = i
		return false
	}
	*n = uint8(v)
	return true
}

// strs reads an array of strings: null is nil, [] an empty slice, as
// encoding/json decodes them into a nil slice.
func strs[S ~string](p *scan, ss *[]S) bool {
	if p.lit("null") {
		*ss = nil
		return true
	}
	if !p.lit("[") {
		return false
	}
	out := []S{}
	for !p.lit("]") {
		if len(out) > 0 && !p.lit(",") {
			return false
		}
		var s string
		if !p.str(&s) {
			return false
		}
		out = append(out, S(s))
	}
	*ss = out
	return true
}

// optStr reads `,"Name":"…"` when it comes next.
func (p *scan) optStr(field string, s *string) bool {
	return !p.lit(field) || p.str(s)
}

// optTime reads `,"Name":"<time>"` when it comes next.
func (p *scan) optTime(field string, t *time.Time) bool {
	return !p.lit(field) || p.time(t)
}

func (p *scan) outcome(o *Outcome) bool {
	return p.lit(`{"Status":`) && p.u8((*uint8)(&o.Status)) &&
		p.lit(`,"ExitCode":`) && p.int(&o.ExitCode) &&
		p.lit(`,"Message":`) && p.str(&o.Message) && p.lit("}")
}

// decodeStep, decodeLease and decodeEvent decode a record's value
// exactly as json.Unmarshal into a zero value does: what encode.go writes
// (its fields in its order, strings of printable ASCII without escapes)
// by hand, anything else through encoding/json. A restore decodes every
// live step and lease, and the checker every lease written.
func decodeStep(b []byte, v *StepRecord) error {
	if fastStep(b, v) {
		return nil
	}
	*v = StepRecord{}
	return json.Unmarshal(b, v)
}

func fastStep(b []byte, v *StepRecord) bool {
	p := scan{b: b}
	return p.step(v) && p.i == len(b)
}

func (p *scan) step(v *StepRecord) bool {
	var id, run, class, skipped, rejected, reused, child string
	ok := p.lit(`{"ID":`) && p.str(&id) &&
		p.lit(`,"Run":`) && p.str(&run) &&
		p.lit(`,"Name":`) && p.str(&v.Name) &&
		p.lit(`,"Index":`) && p.int(&v.Index) &&
		p.optStr(`,"Item":`, &v.Item) &&
		p.lit(`,"Deps":`) && strs(p, &v.Deps) &&
		p.lit(`,"State":`) && p.u8((*uint8)(&v.State)) &&
		p.optStr(`,"Class":`, &class) &&
		p.optStr(`,"Message":`, &v.Message) &&
		p.optStr(`,"SkippedBy":`, &skipped) &&
		p.lit(`,"Attempts":`) && p.int(&v.Attempts) &&
		p.lit(`,"Lease":`) && p.uint((*uint64)(&v.Lease)) &&
		p.optTime(`,"QueuedAt":`, &v.QueuedAt) &&
		p.optTime(`,"StartedAt":`, &v.StartedAt) &&
		p.optTime(`,"WaitUntil":`, &v.WaitUntil) &&
		p.optTime(`,"HoldUntil":`, &v.HoldUntil) &&
		p.optTime(`,"ForceAt":`, &v.ForceAt) &&
		p.optTime(`,"TimeoutAt":`, &v.TimeoutAt)
	if ok && p.lit(`,"Outcome":`) {
		v.Outcome = &Outcome{}
		ok = p.outcome(v.Outcome)
	}
	ok = ok && p.optTime(`,"FinishedAt":`, &v.FinishedAt) &&
		p.lit(`,"EverStarted":`) && p.bool(&v.EverStarted) &&
		p.optStr(`,"RejectedBy":`, &rejected) &&
		(!p.lit(`,"RequiredTags":`) || strs(p, &v.RequiredTags)) &&
		(!p.lit(`,"MissedBy":`) || strs(p, &v.MissedBy)) &&
		(!p.lit(`,"Tries":`) || p.int(&v.Tries)) &&
		p.optStr(`,"ReusedFrom":`, &reused) &&
		p.optStr(`,"Child":`, &child) &&
		p.lit("}")
	v.ID, v.Run, v.Class, v.SkippedBy = StepID(id), RunID(run), FailureClass(class), StepID(skipped)
	v.RejectedBy, v.ReusedFrom, v.Child = WorkerID(rejected), StepID(reused), RunID(child)
	return ok
}

func decodeLease(b []byte, v *LeaseRecord) error {
	if fastLease(b, v) {
		return nil
	}
	*v = LeaseRecord{}
	return json.Unmarshal(b, v)
}

// DecodeLease decodes a lease record's value as json.Unmarshal into a zero
// LeaseRecord does, several times faster (the checker reads every lease
// written).
func DecodeLease(b []byte, v *LeaseRecord) error { return decodeLease(b, v) }

func fastLease(b []byte, v *LeaseRecord) bool {
	p := scan{b: b}
	return p.lease(v) && p.i == len(b)
}

func (p *scan) lease(v *LeaseRecord) bool {
	var step, worker string
	ok := p.lit(`{"ID":`) && p.uint((*uint64)(&v.ID)) &&
		p.lit(`,"Step":`) && p.str(&step) &&
		p.lit(`,"Worker":`) && p.str(&worker) &&
		p.lit(`,"GrantedAt":`) && p.time(&v.GrantedAt) &&
		p.lit(`,"Current":`) && p.bool(&v.Current) &&
		p.lit(`,"Started":`) && p.bool(&v.Started) &&
		(!p.lit(`,"Held":`) || p.bool(&v.Held)) &&
		p.optTime(`,"Deadline":`, &v.Deadline) &&
		p.optStr(`,"EndReason":`, &v.EndReason) &&
		p.lit(`,"Committed":`) && p.bool(&v.Committed) &&
		(!p.lit(`,"LogClosed":`) || p.bool(&v.LogClosed))
	v.Step, v.Worker = StepID(step), WorkerID(worker)
	if ok && p.lit(`,"Answers":`) {
		ok = p.answers(&v.Answers)
	}
	return ok && p.lit("}")
}

func (p *scan) answers(as *[]AnsweredReport) bool {
	if p.lit("null") {
		*as = nil
		return true
	}
	if !p.lit("[") {
		return false
	}
	out := []AnsweredReport{}
	for !p.lit("]") {
		if len(out) > 0 && !p.lit(",") {
			return false
		}
		var a AnsweredReport
		if !(p.lit(`{"Request":`) && p.uint(&a.Request) &&
			p.lit(`,"Outcome":`) && p.outcome(&a.Outcome) &&
			p.lit(`,"Verdict":`) && p.u8((*uint8)(&a.Verdict)) &&
			p.optStr(`,"Reason":`, &a.Reason) && p.lit("}")) {
			return false
		}
		out = append(out, a)
	}
	*as = out
	return true
}

func decodeEvent(b []byte, v *ServerEvent) error {
	if fastEvent(b, v) {
		return nil
	}
	*v = ServerEvent{}
	return json.Unmarshal(b, v)
}

func fastEvent(b []byte, v *ServerEvent) bool {
	p := scan{b: b}
	return p.event(v) && p.i == len(b)
}

func (p *scan) event(v *ServerEvent) bool {
	var run, step, cause, worker string
	ok := p.lit(`{"Run":`) && p.str(&run) &&
		p.lit(`,"Seq":`) && p.int(&v.Seq) &&
		p.lit(`,"At":`) && p.time(&v.At) &&
		p.lit(`,"Step":`) && p.str(&step) &&
		p.lit(`,"Kind":`) && p.str(&v.Kind) &&
		p.lit(`,"Message":`) && p.str(&v.Message) &&
		p.optStr(`,"Cause":`, &cause) &&
		p.optStr(`,"Worker":`, &worker) &&
		(!p.lit(`,"Lease":`) || p.uint((*uint64)(&v.Lease))) &&
		p.lit("}")
	v.Run, v.Step, v.Cause, v.Worker = RunID(run), StepID(step), Cause(cause), WorkerID(worker)
	return ok
}

// decodeHistory decodes an archived run's record as json.Unmarshal into a
// zero RunHistory does: what encode.go writes by hand but the run's spec
// (any shape), which goes through encoding/json alone; anything else
// wholly through encoding/json. The checker reads every run archived.
func decodeHistory(b []byte, h *RunHistory) error {
	if fastHistory(b, h) {
		return nil
	}
	*h = RunHistory{}
	return json.Unmarshal(b, h)
}

func fastHistory(b []byte, h *RunHistory) bool {
	p := scan{b: b}
	return p.lit(`{"Head":`) && p.head(&h.Head) &&
		p.lit(`,"Run":`) && p.run(&h.Run) &&
		p.lit(`,"Status":`) && p.str(&h.Status) &&
		p.lit(`,"Steps":`) && records(&p, &h.Steps, (*scan).step) &&
		p.lit(`,"Leases":`) && records(&p, &h.Leases, (*scan).lease) &&
		p.lit(`,"Events":`) && records(&p, &h.Events, (*scan).event) &&
		p.lit("}") && p.i == len(b)
}

func (p *scan) head(h *HistoryHead) bool {
	var run, parent string
	ok := p.lit(`{"Run":`) && p.str(&run) &&
		p.lit(`,"Name":`) && p.str(&h.Name) &&
		p.lit(`,"Status":`) && p.str(&h.Status) &&
		p.optStr(`,"Parent":`, &parent) &&
		p.lit(`,"SubmittedAt":`) && p.time(&h.SubmittedAt) &&
		p.optTime(`,"FinishedAt":`, &h.FinishedAt) &&
		p.optTime(`,"Deadline":`, &h.Deadline) &&
		p.optStr(`,"CancelReason":`, &h.CancelReason) &&
		p.lit(`,"Steps":`) && p.int(&h.Steps) &&
		p.lit(`,"States":`) && p.intMap(&h.States) &&
		p.lit("}")
	h.Run, h.Parent = RunID(run), RunID(parent)
	return ok
}

// decodeRun decodes a run's record as json.Unmarshal into a zero
// RunRecord does: what encode.go writes, its spec too, by hand; anything
// else wholly through encoding/json. A restore decodes every live run, the checker every
// archived one.
func decodeRun(b []byte, v *RunRecord) error {
	p := scan{b: b}
	if p.run(v) && p.i == len(b) {
		return nil
	}
	*v = RunRecord{}
	return json.Unmarshal(b, v)
}

func (p *scan) run(v *RunRecord) bool {
	var id, parent, parentStep, class, rerunOf string
	ok := p.lit(`{"ID":`) && p.str(&id) &&
		p.lit(`,"Spec":`) && p.runSpec(&v.Spec, 0) &&
		p.optStr(`,"Parent":`, &parent) &&
		p.optStr(`,"ParentStep":`, &parentStep) &&
		(!p.lit(`,"Depth":`) || p.int(&v.Depth)) &&
		(!p.lit(`,"Children":`) || strs(p, &v.Children)) &&
		p.optStr(`,"Schedule":`, &v.Schedule) &&
		p.optTime(`,"FireAt":`, &v.FireAt) &&
		(!p.lit(`,"GroupWait":`) || p.bool(&v.GroupWait)) &&
		p.lit(`,"SubmittedAt":`) && p.time(&v.SubmittedAt) &&
		p.optTime(`,"Deadline":`, &v.Deadline) &&
		p.optStr(`,"CancelReason":`, &v.CancelReason) &&
		p.lit(`,"CancelClass":`) && p.str(&class) &&
		p.lit(`,"Steps":`) && strs(p, &v.Steps) &&
		p.lit(`,"Failed":`) && p.bool(&v.Failed) &&
		p.lit(`,"Finished":`) && p.bool(&v.Finished) &&
		p.optTime(`,"FinishedAt":`, &v.FinishedAt) &&
		p.optStr(`,"RerunOf":`, &rerunOf) &&
		p.lit("}")
	v.ID, v.Parent, v.ParentStep, v.CancelClass, v.RerunOf = RunID(id), RunID(parent), StepID(parentStep), FailureClass(class), RunID(rerunOf)
	return ok
}

// maxSpecNesting bounds the child workflows (StepSpec.Workflow) a run spec
// is read through by hand; a deeper one (beyond MaxRunDepth: never valid)
// goes through encoding/json.
const maxSpecNesting = 2 * MaxRunDepth

// runSpec reads a RunSpec as encode.go's runSpec writes it (json.Marshal's
// bytes): its fields in order, the omitzero ones present or not.
func (p *scan) runSpec(v *RunSpec, depth int) bool {
	if depth > maxSpecNesting {
		return false
	}
	return p.lit(`{"Name":`) && p.str(&v.Name) &&
		(!p.lit(`,"Timeout":`) || p.int64((*int64)(&v.Timeout))) &&
		(!p.lit(`,"Env":`) || p.strMap(&v.Env)) &&
		(!p.lit(`,"Group":`) || p.group(&v.Group)) &&
		p.lit(`,"Steps":`) && records(p, &v.Steps, func(p *scan, s *StepSpec) bool { return p.stepSpec(s, depth) }) &&
		p.lit("}")
}

func (p *scan) group(g *ConcurrencyGroup) bool {
	return p.lit(`{"Name":`) && p.str(&g.Name) &&
		(!p.lit(`,"Max":`) || p.int(&g.Max)) &&
		(!p.lit(`,"CancelInProgress":`) || p.bool(&g.CancelInProgress)) &&
		p.lit("}")
}

func (p *scan) stepSpec(v *StepSpec, depth int) bool {
	return p.lit(`{"Name":`) && p.str(&v.Name) &&
		p.lit(`,"Command":`) && p.str(&v.Command) &&
		(!p.lit(`,"DependsOn":`) || strs(p, &v.DependsOn)) &&
		(!p.lit(`,"Writes":`) || p.bool(&v.Writes)) &&
		p.optStr(`,"Type":`, &v.Type) &&
		p.optStr(`,"Runner":`, &v.Runner) &&
		(!p.lit(`,"Tags":`) || strs(p, &v.Tags)) &&
		(!p.lit(`,"Labels":`) || p.strMap(&v.Labels)) &&
		p.optStr(`,"Target":`, &v.Target) &&
		p.optStr(`,"Platform":`, &v.Platform) &&
		(!p.lit(`,"Timeout":`) || p.int64((*int64)(&v.Timeout))) &&
		(!p.lit(`,"Env":`) || p.strMap(&v.Env)) &&
		(!p.lit(`,"ForEach":`) || strs(p, &v.ForEach)) &&
		(!p.lit(`,"Concurrency":`) || p.int(&v.Concurrency)) &&
		(!p.lit(`,"Group":`) || p.group(&v.Group)) &&
		(!p.lit(`,"Hold":`) || p.bool(&v.Hold)) &&
		(!p.lit(`,"HoldExpiry":`) || p.int64((*int64)(&v.HoldExpiry))) &&
		(!p.lit(`,"Wait":`) || p.int64((*int64)(&v.Wait))) &&
		(!p.lit(`,"Outputs":`) || strs(p, &v.Outputs)) &&
		(!p.lit(`,"Retry":`) || p.retry(&v.Retry)) &&
		(!p.lit(`,"Idempotent":`) || p.bool(&v.Idempotent)) &&
		(!p.lit(`,"Secrets":`) || strs(p, &v.Secrets)) &&
		p.optStr(`,"SecretsAs":`, &v.SecretsAs) &&
		(!p.lit(`,"PutSecrets":`) || strs(p, &v.PutSecrets)) &&
		(!p.lit(`,"Workflow":`) || p.workflow(&v.Workflow, depth+1)) &&
		(!p.lit(`,"With":`) || p.strMap(&v.With)) &&
		p.lit("}")
}

func (p *scan) workflow(w **RunSpec, depth int) bool {
	*w = &RunSpec{}
	return p.runSpec(*w, depth)
}

func (p *scan) retry(r **RetryPolicy) bool {
	v := &RetryPolicy{}
	*r = v
	return p.lit(`{"Attempts":`) && p.int(&v.Attempts) &&
		(!p.lit(`,"Backoff":`) || p.int64((*int64)(&v.Backoff))) &&
		(!p.lit(`,"Codes":`) || records(p, &v.Codes, (*scan).int)) &&
		(!p.lit(`,"OnTimeout":`) || p.bool(&v.OnTimeout)) &&
		p.lit("}")
}

// records reads an array of records as encoding/json reads it into a nil
// slice (null is nil, [] an empty slice), each element by one.
func records[T any](p *scan, xs *[]T, one func(*scan, *T) bool) bool {
	if p.lit("null") {
		*xs = nil
		return true
	}
	if !p.lit("[") {
		return false
	}
	out := []T{}
	for !p.lit("]") {
		if len(out) > 0 && !p.lit(",") {
			return false
		}
		var x T
		if !one(p, &x) {
			return false
		}
		out = append(out, x)
	}
	*xs = out
	return true
}

// decodeWorker and decodeToken decode a worker's or an enrollment token's
// record as json.Unmarshal into a zero value does: what json.Marshal
// writes of them (fields in order, plain strings, a hash of exactly 32
// numbers) by hand, anything else through encoding/json. A restore
// decodes every worker and token.
func decodeWorker(b []byte, v *WorkerRecord) error {
	if fastWorker(b, v) {
		return nil
	}
	*v = WorkerRecord{}
	return json.Unmarshal(b, v)
}

// DecodeWorker and DecodeToken are decodeWorker and decodeToken, for the
// checker, which reads every worker and token record written.
func DecodeWorker(b []byte, v *WorkerRecord) error { return decodeWorker(b, v) }

// DecodeToken: DecodeWorker.
func DecodeToken(b []byte, v *TokenRecord) error { return decodeToken(b, v) }

func fastWorker(b []byte, v *WorkerRecord) bool {
	p := scan{b: b}
	var id string
	ok := p.lit(`{"ID":`) && p.str(&id) &&
		p.lit(`,"Name":`) && p.str(&v.Name) &&
		p.lit(`,"Token":`) && p.str(&v.Token) &&
		(!p.lit(`,"Tags":`) || strs(&p, &v.Tags)) &&
		(!p.lit(`,"Labels":`) || p.strMap(&v.Labels)) &&
		p.optStr(`,"Platform":`, &v.Platform) &&
		p.lit(`,"Slots":`) && p.int(&v.Slots) &&
		(!p.lit(`,"Ahead":`) || p.int(&v.Ahead)) &&
		p.lit(`,"Scaler":`) && p.bool(&v.Scaler) &&
		p.lit(`,"Grace":`) && p.int64((*int64)(&v.Grace)) &&
		p.lit(`,"Active":`) && p.bool(&v.Active) &&
		p.lit(`,"Revoked":`) && p.bool(&v.Revoked) &&
		p.lit(`,"CredHash":`) && p.hash(&v.CredHash) &&
		p.lit(`,"CredExpiry":`) && p.time(&v.CredExpiry) &&
		p.lit(`,"LastHeartbeat":`) && p.time(&v.LastHeartbeat) &&
		p.optTime(`,"DisconnectedAt":`, &v.DisconnectedAt) &&
		p.optTime(`,"GraceUntil":`, &v.GraceUntil) &&
		p.lit(`,"EnrolledAt":`) && p.time(&v.EnrolledAt) &&
		(!p.lit(`,"Draining":`) || p.bool(&v.Draining)) &&
		p.lit("}") && p.i == len(b)
	v.ID = WorkerID(id)
	return ok
}

func decodeToken(b []byte, v *TokenRecord) error {
	if fastToken(b, v) {
		return nil
	}
	*v = TokenRecord{}
	return json.Unmarshal(b, v)
}

func fastToken(b []byte, v *TokenRecord) bool {
	p := scan{b: b}
	var worker string
	ok := p.lit(`{"Name":`) && p.str(&v.Name) &&
		p.lit(`,"Hash":`) && p.hash(&v.Hash) &&
		p.lit(`,"CreatedAt":`) && p.time(&v.CreatedAt) &&
		p.lit(`,"ExpiresAt":`) && p.time(&v.ExpiresAt) &&
		p.lit(`,"Consumed":`) && p.bool(&v.Consumed) &&
		p.optStr(`,"Worker":`, &worker) &&
		p.lit(`,"Revoked":`) && p.bool(&v.Revoked) &&
		p.lit("}") && p.i == len(b)
	v.Worker = WorkerID(worker)
	return ok
}

func (p *scan) int64(n *int64) bool {
	k := p.digits(true)
	if k < 0 {
		return false
	}
	v, err := strconv.ParseInt(string(p.b[p.i:k]), 10, 64)
	if err != nil {
		return false
	}
	*n, p.i = v, k
	return true
}

// hash reads an array of exactly 32 numbers that fit a byte (encoding/json
// also takes fewer or more, which this leaves to it).
func (p *scan) hash(h *[32]byte) bool {
	if !p.lit("[") {
		return false
	}
	for i := range h {
		if (i > 0 && !p.lit(",")) || !p.u8(&h[i]) {
			return false
		}
	}
	return p.lit("]")
}

// intMap reads an object of integers into a new map as strMap does.
func (p *scan) intMap(m *map[string]int) bool {
	if p.lit("null") {
		return true
	}
	if !p.lit("{") {
		return false
	}
	out := map[string]int{}
	for n := 0; !p.lit("}"); n++ {
		var k string
		var v int
		if (n > 0 && !p.lit(",")) || !p.str(&k) || !p.lit(":") || !p.int(&v) {
			return false
		}
		out[k] = v
	}
	*m = out
	return true
}

// strMap reads an object of strings into a new map (later keys win, as
// with encoding/json); {} is an empty map, null leaves it nil.
func (p *scan) strMap(m *map[string]string) bool {
	if p.lit("null") {
		return true
	}
	if !p.lit("{") {
		return false
	}
	out := map[string]string{}
	for n := 0; !p.lit("}"); n++ {
		var k, v string
		if (n > 0 && !p.lit(",")) || !p.str(&k) || !p.lit(":") || !p.str(&v) {
			return false
		}
		out[k] = v
	}
	*m = out
	return true
}
