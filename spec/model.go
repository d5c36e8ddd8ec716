package spec

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"

	"github.com/anishathalye/porcupine"
	"github.com/tether-run/tether/core"
)

// OpKind is the kind of a client-visible operation on one step.
type OpKind uint8

// The operations of the step register. A run-level operation is recorded as
// one operation per step of the run (a submit once the run's step ids are
// known, a cancel for each of its steps).
const (
	OpSubmit OpKind = iota + 1 // the step was submitted (as part of its run)
	OpReport                   // a worker's complete|fail report and its answer
	OpCancel                   // the step's run was cancelled
	OpQuery                    // an operator read the step
)

func (k OpKind) String() string {
	switch k {
	case OpSubmit:
		return "submit"
	case OpReport:
		return "report"
	case OpCancel:
		return "cancel"
	case OpQuery:
		return "query"
	}
	return fmt.Sprintf("op(%d)", uint8(k))
}

// StepInput is an operation's input. Worker, Lease, Request and Outcome are
// set for OpReport only. Worker is the reporting worker instance: a report
// names its lease, but only the lease's own worker can commit or repeat it,
// so two workers' reports with the same lease, request id and outcome are
// different operations (the other worker's is REJECTED). A history that
// leaves Worker empty treats every report as coming from one worker.
type StepInput struct {
	Kind    OpKind
	Step    core.StepID
	Worker  core.WorkerID
	Lease   core.LeaseID
	Request uint64
	Outcome core.Outcome
	// Retries is, for OpSubmit, the step's `retry:` attempts (SPEC §1
	// RETRY): a committed failure may then reopen the register, up to
	// that many times.
	Retries int
	// Reused is, for OpSubmit, the outcome a rerun's step took over from
	// the run it reruns (REUSE, SPEC §2): the register starts committed.
	Reused *core.Outcome
}

// StepOutput is what the caller saw. Verdict answers a report; State and
// Outcome answer a query (Outcome nil: no outcome); Err is an API error
// (unknown step, finished run); Unknown means the call timed out and its
// effect is unknown (its Return is then set to the end of time).
type StepOutput struct {
	Verdict core.Verdict
	State   core.State
	Outcome *core.Outcome
	Err     string
	Unknown bool
}

// regState is the model's state of one step: what the register promises to
// clients, not the hidden lease bookkeeping behind it.
type regState struct {
	submitted bool
	committed bool
	commit    reportKey
	cancelled bool         // a cancel took effect before anything committed
	maxLease  core.LeaseID // greatest lease of the step shown to exist (a CANCELLED or COMMITTED answer)
	answers   []answered   // every answered report, sorted by key
	retries   int          // the step's retry attempts (SPEC §1 RETRY)
	tries     int          // retries taken: committed failures that reopened the register
}

// reopen is a retry (SPEC §1 RETRY), decided in the batch that commits a
// failure: the commit stays answered (a repeat of it gets COMMITTED), and
// the register holds no outcome again, for the next try.
func (s regState) reopen() regState {
	s = s.record(s.commit, core.Committed)
	s.committed, s.commit = false, reportKey{}
	s.tries++
	return s
}

// retriable says a committed state may have been retried instead.
func (s regState) retriable() bool {
	return s.committed && !s.cancelled && s.commit.outcome.Status != core.OutcomeSuccess && s.tries < s.retries
}

type reportKey struct {
	worker  core.WorkerID
	lease   core.LeaseID
	request uint64
	outcome core.Outcome
}

type answered struct {
	key     reportKey
	verdict core.Verdict
}

func compareKeys(a, b reportKey) int {
	return cmp.Or(strings.Compare(string(a.worker), string(b.worker)), cmp.Compare(a.lease, b.lease), cmp.Compare(a.request, b.request),
		cmp.Compare(a.outcome.Status, b.outcome.Status), cmp.Compare(a.outcome.ExitCode, b.outcome.ExitCode),
		strings.Compare(a.outcome.Message, b.outcome.Message))
}

func (s regState) answerOf(k reportKey) (core.Verdict, bool) {
	i, ok := slices.BinarySearchFunc(s.answers, k, func(a answered, k reportKey) int { return compareKeys(a.key, k) })
	if !ok {
		return core.VerdictNone, false
	}
	return s.answers[i].verdict, true
}

// record returns a copy of s that remembers an answered report.
func (s regState) record(k reportKey, v core.Verdict) regState {
	i, found := slices.BinarySearchFunc(s.answers, k, func(a answered, k reportKey) int { return compareKeys(a.key, k) })
	if found {
		return s
	}
	n := make([]answered, 0, len(s.answers)+1)
	n = append(n, s.answers[:i]...)
	n = append(n, answered{k, v})
	s.answers = append(n, s.answers[i:]...)
	return s
}

func (s regState) prove(l core.LeaseID) regState {
	s.maxLease = max(s.maxLease, l)
	return s
}

// expected is the terminal state a committed outcome implies.
func expected(o core.Outcome) core.State {
	if o.Status == core.OutcomeSuccess {
		return core.StateSuccess
	}
	return core.StateFailed
}

// stepModel is the nondeterministic sequential specification of one step.
func stepModel(state, input, output any) []any {
	s := state.(regState)
	in := input.(StepInput)
	out := output.(StepOutput)
	one := func(ok bool, n regState) []any {
		if !ok {
			return nil
		}
		return []any{n}
	}
	switch in.Kind {
	case OpSubmit:
		n := s
		n.submitted = true
		n.retries = in.Retries
		if in.Reused != nil {
			n.committed, n.commit = true, reportKey{outcome: *in.Reused}
		}
		switch {
		case out.Unknown:
			if s.submitted {
				return []any{s}
			}
			return []any{s, n}
		case out.Err != "":
			return []any{s}
		}
		return one(!s.submitted, n)

	case OpCancel:
		n := s
		if !s.committed {
			n.cancelled = true
		}
		switch {
		case out.Unknown:
			return []any{s, n}
		case out.Err != "":
			return []any{s}
		}
		return one(s.submitted, n)

	case OpQuery:
		switch {
		case out.Unknown:
			return []any{s}
		case out.Err != "":
			return one(!s.submitted, s)
		case !s.submitted:
			return nil
		case s.committed:
			return one(out.Outcome != nil && *out.Outcome == s.commit.outcome && out.State == expected(s.commit.outcome), s)
		case out.Outcome != nil || out.State == core.StateSuccess:
			return nil // an outcome nobody was answered COMMITTED for
		case s.cancelled:
			switch out.State {
			case core.StateCancelling, core.StateCancelled, core.StateFailed, core.StateSkipped:
				return []any{s}
			}
			return nil
		}
		return []any{s}

	case OpReport:
		k := reportKey{in.Worker, in.Lease, in.Request, in.Outcome}
		if v, ok := s.answerOf(k); ok {
			// An exact repeat gets the recorded answer again.
			return one(out.Unknown || out.Verdict == v, s)
		}
		if s.committed && k == s.commit {
			// The commit was made by a call whose answer was lost.
			if out.Unknown {
				return []any{s}
			}
			return one(out.Verdict == core.Committed, s.record(k, core.Committed))
		}
		canCommit := s.submitted && !s.committed && in.Lease >= s.maxLease &&
			(!s.cancelled || in.Outcome.Status == core.OutcomeCleanupFailed)
		commit := func() regState {
			n := s
			n.committed, n.commit = true, k
			return n.prove(in.Lease)
		}
		if out.Unknown {
			if canCommit {
				if c := commit(); c.retriable() {
					return []any{s, c, c.reopen()}
				}
				return []any{s, commit()}
			}
			return []any{s}
		}
		switch out.Verdict {
		case core.Committed:
			if !canCommit {
				return nil
			}
			c := commit().record(k, core.Committed)
			if c.retriable() {
				return []any{c, c.reopen()}
			}
			return []any{c}
		case core.Cancelled:
			return one(s.submitted, s.prove(in.Lease).record(k, core.Cancelled))
		case core.Rejected:
			return []any{s.record(k, core.Rejected)}
		}
		return nil
	}
	return nil
}

func equalStates(a, b any) bool {
	x, y := a.(regState), b.(regState)
	return x.submitted == y.submitted && x.committed == y.committed && x.commit == y.commit && x.tries == y.tries && x.retries == y.retries &&
		x.cancelled == y.cancelled && x.maxLease == y.maxLease && slices.Equal(x.answers, y.answers)
}

func hashState(a any) uint64 {
	s := a.(regState)
	h := fnv.New64a()
	fmt.Fprintf(h, "%v|%v|%v|%v|%d|%d|%d", s.submitted, s.committed, s.commit, s.cancelled, s.maxLease, len(s.answers), s.tries)
	return h.Sum64()
}

func describeInput(in StepInput) string {
	if in.Kind == OpReport {
		w := ""
		if in.Worker != "" {
			w = " worker=" + string(in.Worker)
		}
		return fmt.Sprintf("report(%s%s lease=%d req=%d %s)", in.Step, w, in.Lease, in.Request, describeOutcome(in.Outcome))
	}
	return fmt.Sprintf("%s(%s)", in.Kind, in.Step)
}

func describeOutput(in StepInput, out StepOutput) string {
	switch {
	case out.Unknown:
		return "?"
	case out.Err != "":
		return "error: " + out.Err
	case in.Kind == OpReport:
		return out.Verdict.String()
	case in.Kind == OpQuery:
		if out.Outcome == nil {
			return out.State.String() + ", no outcome"
		}
		return out.State.String() + ", " + describeOutcome(*out.Outcome)
	}
	return "ok"
}

func describeState(a any) string {
	s := a.(regState)
	var parts []string
	if !s.submitted {
		parts = append(parts, "not submitted")
	}
	if s.committed {
		parts = append(parts, fmt.Sprintf("committed lease %d req %d %s", s.commit.lease, s.commit.request, describeOutcome(s.commit.outcome)))
	}
	if s.cancelled {
		parts = append(parts, "cancelled")
	}
	if s.maxLease > 0 {
		parts = append(parts, fmt.Sprintf("lease ≥ %d", s.maxLease))
	}
	if len(parts) == 0 {
		return "open"
	}
	return strings.Join(parts, "; ")
}

// partitionByStep splits a history by step: steps are independent registers.
func partitionByStep(history []porcupine.Operation) [][]porcupine.Operation {
	idx := map[core.StepID]int{}
	var parts [][]porcupine.Operation
	for _, op := range history {
		s := op.Input.(StepInput).Step
		i, ok := idx[s]
		if !ok {
			i = len(parts)
			idx[s] = i
			parts = append(parts, nil)
		}
		parts[i] = append(parts[i], op)
	}
	return parts
}

// StepModel is the porcupine model of the step register (SPEC §13,
// linearizability), partitioned by step. Per step its state is the committed
// report (worker, lease, request id, outcome) if any, whether a cancel took
// effect, the greatest lease shown to exist, and every answered report. A report is
// answered COMMITTED only if nothing is committed yet, no cancel took effect
// (except a cleanup-failed report after a cancel), and no greater lease of
// the step was shown to exist (a superseded lease never commits); an exact
// repeat of an answered report (the same worker too) gets the same answer (so
// a repeat of the committed report gets COMMITTED); CANCELLED and REJECTED are otherwise
// always legal, since the model cannot see lease currency. A query returns
// the committed outcome with the state it implies (success for ok, failed
// otherwise), never an outcome that was not committed, never "no outcome"
// after a commit; after a cancel took effect on an uncommitted step it shows
// cancelling, cancelled, failed or skipped. An Unknown output (the call timed
// out) allows both "took effect" and "did not".
//
// A step's history that holds no successful submit is checked as if the
// step existed from the start (callers that do not record submits).
// Task steps, whose outcome the orchestrator commits itself, do not belong
// in histories.
var StepModel = (&porcupine.NondeterministicModel{
	Partition: partitionByStep,
	// A step whose submit was not seen (its answer lost to a crash) may
	// have any retry policy (SPEC §12's most).
	Init:  func() []any { return []any{regState{}, regState{submitted: true, retries: core.MaxRetryAttempts}} },
	Step:  stepModel,
	Equal: equalStates,
	Hash:  hashState,
	DescribeOperation: func(input, output any) string {
		in := input.(StepInput)
		return describeInput(in) + " → " + describeOutput(in, output.(StepOutput))
	},
	DescribeState: describeState,
}).ToModel()

// MaxStepOps is the most operations of one step's history that CheckSteps
// checks. Porcupine's search is exponential in a partition's concurrency, so
// a bound on the work is needed, and it must not be a wall-clock timeout:
// a verdict that depends on the machine's speed is not a function of the
// history. A step over the bound is not checked, and the check is
// inconclusive. The simulator's steps stay far below it (their histories
// are a few reports, cancels and queries; TestSim's summary line names the
// largest, and a seed over it fails the test as inconclusive).
const MaxStepOps = 200

// HistoryVerdict is what CheckSteps made of a history.
type HistoryVerdict uint8

const (
	// Linearizable: every step's history was checked and is linearizable.
	Linearizable HistoryVerdict = iota
	// NotLinearizable: some step's history is not linearizable (a
	// violation, whatever the other steps' histories are).
	NotLinearizable
	// Inconclusive: every step checked is linearizable, but some were not
	// checked (see HistoryCheck.Unchecked): neither a pass nor a violation.
	Inconclusive
)

func (v HistoryVerdict) String() string {
	switch v {
	case Linearizable:
		return "linearizable"
	case NotLinearizable:
		return "not linearizable"
	case Inconclusive:
		return "inconclusive"
	}
	return "invalid"
}

// UncheckedStep is a step whose history was too long to check.
type UncheckedStep struct {
	Step core.StepID
	Ops  int
}

// HistoryCheck is CheckSteps' answer.
type HistoryCheck struct {
	Verdict   HistoryVerdict
	Bound     int                         // the most operations of one step's history checked
	Checked   int                         // operations checked
	Unchecked []UncheckedStep             // steps over the bound, in step order
	Info      porcupine.LinearizationInfo // of the steps checked, for porcupine.Visualize
}

// Why says what made a check inconclusive ("" if it was not).
func (c HistoryCheck) Why() string {
	if c.Verdict != Inconclusive {
		return ""
	}
	parts := make([]string, len(c.Unchecked))
	for i, u := range c.Unchecked {
		parts[i] = fmt.Sprintf("%s has %d operations", u.Step, u.Ops)
	}
	what := "step history was"
	if len(c.Unchecked) > 1 {
		what = "step histories were"
	}
	return fmt.Sprintf("%d %s not checked, being over the bound of %d operations per step (%s)",
		len(c.Unchecked), what, c.Bound, strings.Join(parts, "; "))
}

// CheckSteps checks a history of step operations for linearizability
// against StepModel without a wall-clock timeout, so that its verdict is a
// function of the history alone: each step's history (StepModel's
// partition) of at most maxStepOps operations is checked to the end
// (porcupine, given no timeout, answers only Ok or Illegal); a longer one is
// not checked. A violation in a checked step is NotLinearizable even when
// others went unchecked; otherwise any unchecked step makes the verdict
// Inconclusive.
func CheckSteps(ops []porcupine.Operation, maxStepOps int) HistoryCheck {
	c := HistoryCheck{Bound: maxStepOps}
	var keep []porcupine.Operation
	for _, part := range partitionByStep(ops) {
		if len(part) > maxStepOps {
			c.Unchecked = append(c.Unchecked, UncheckedStep{Step: part[0].Input.(StepInput).Step, Ops: len(part)})
			continue
		}
		keep = append(keep, part...)
	}
	slices.SortFunc(c.Unchecked, func(a, b UncheckedStep) int { return cmp.Compare(a.Step, b.Step) })
	c.Checked = len(keep)
	res, info := porcupine.CheckOperationsVerbose(StepModel, keep, 0)
	c.Info = info
	switch {
	case res == porcupine.Illegal:
		c.Verdict = NotLinearizable
	case res != porcupine.Ok:
		// Without a timeout porcupine answers only Ok or Illegal.
		panic(fmt.Sprintf("porcupine answered %s without a timeout", res))
	case len(c.Unchecked) > 0:
		c.Verdict = Inconclusive
	}
	return c
}
