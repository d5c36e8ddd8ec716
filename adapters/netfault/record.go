package netfault

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/tether-run/tether/adapters/wire"
	"github.com/tether-run/tether/core"
	"github.com/tether-run/tether/spec"
)

// Frame is one decoded control-plane message a Recorder saw pass.
type Frame struct {
	Link uint64
	Dir  Dir
	Msg  core.Msg
	At   time.Time
}

// Recorder builds the history of step operations (spec.StepInput and
// spec.StepOutput, for spec.CheckSteps) from what passes real sockets: use
// Tap as a Proxy's tap. It translates and decides nothing: a report frame
// going up is a report operation's call (a retransmission of a report still
// open is the same operation), and the answer frame coming down on a link of
// the same worker is its return; the worker of a link is the one its Hello
// named. Operator calls made by the test (submit, cancel, query) are added
// with Submit, Cancel and Query. Times are the wall clock's, read as the
// bytes pass the proxy: a report's call before the orchestrator can have
// read it, its answer's return after the orchestrator sent it. Its methods
// are safe for concurrent use.
type Recorder struct {
	tap MessageTap
	t0  time.Time

	mu          sync.Mutex
	steps       spec.History
	workerOf    map[uint64]core.WorkerID // link → the worker its Hello named
	client      map[core.WorkerID]int    // porcupine client ids, for the visualization
	frames      []Frame
	undecodable int
	intercept   func(Frame)
}

// operatorClient is the porcupine client id of the test's operator calls.
const operatorClient = 0

// NewRecorder returns an empty recorder; its clock starts now.
func NewRecorder() *Recorder {
	r := &Recorder{t0: time.Now(), workerOf: map[uint64]core.WorkerID{}, client: map[core.WorkerID]int{}}
	r.tap.OnMessage = r.message
	return r
}

// Tap is the recorder's tap, for Listen.
func (r *Recorder) Tap() Tap { return &r.tap }

// Err returns the tap's parse errors, if any (a test should assert none).
func (r *Recorder) Err() error { return r.tap.Err() }

func (r *Recorder) nanos(t time.Time) int64 { return t.Sub(r.t0).Nanoseconds() }

func (r *Recorder) message(m Message) {
	if m.Op != OpText {
		return
	}
	msg, err := wire.Decode(m.Data)
	r.mu.Lock()
	if err != nil {
		r.undecodable++
		r.mu.Unlock()
		return
	}
	f := Frame{Link: m.Link, Dir: m.Dir, Msg: msg, At: m.At}
	r.frames = append(r.frames, f)
	r.record(f)
	intercept := r.intercept
	r.mu.Unlock()
	if intercept != nil {
		intercept(f)
	}
}

// Intercept has f called with every decoded frame, after it is recorded and
// before the chunk that completes it is forwarded: a test can cut the proxy
// there, so that the frame never arrives. f runs on the proxy's goroutine
// for that link and direction; it must not block for long.
func (r *Recorder) Intercept(f func(Frame)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.intercept = f
}

// record translates one frame into the history (r.mu held).
func (r *Recorder) record(m Frame) {
	switch msg := m.Msg.(type) {
	case core.Hello:
		if m.Dir == Up {
			r.workerOf[m.Link] = msg.Worker
		}
	case core.Report:
		if m.Dir != Up {
			return
		}
		if _, ok := r.workerOf[m.Link]; !ok {
			// A report before any Hello is no worker's: the orchestrator
			// closes the link with a protocol error and answers nothing.
			return
		}
		in := spec.StepInput{Kind: spec.OpReport, Step: msg.Step, Worker: r.workerOf[m.Link],
			Lease: msg.Lease, Request: msg.Request, Outcome: msg.Outcome}
		for i := range r.steps.Len() {
			if r.steps.Open(i) && r.steps.Input(i) == in {
				return // a retransmission of an open report: the same operation
			}
		}
		r.begin(r.clientOf(in.Worker), in, m.At)
	case core.Answer:
		if m.Dir != Down {
			return
		}
		w := r.workerOf[m.Link]
		for i := range r.steps.Len() {
			in := r.steps.Input(i)
			if r.steps.Open(i) && in.Kind == spec.OpReport && in.Worker == w && in.Lease == msg.Lease && in.Request == msg.Request {
				r.end(i, spec.StepOutput{Verdict: msg.Verdict}, m.At)
				return
			}
		}
	}
}

func (r *Recorder) clientOf(w core.WorkerID) int {
	c, ok := r.client[w]
	if !ok {
		c = len(r.client) + 1
		r.client[w] = c
	}
	return c
}

func (r *Recorder) begin(client int, in spec.StepInput, at time.Time) int {
	return r.steps.Begin(client, in, r.nanos(at))
}

func (r *Recorder) end(i int, out spec.StepOutput, at time.Time) {
	r.steps.End(i, out, r.nanos(at))
}

func (r *Recorder) operator(kind spec.OpKind, call, ret time.Time, steps []core.StepID, out spec.StepOutput) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range steps {
		r.end(r.begin(operatorClient, spec.StepInput{Kind: kind, Step: s}, call), out, ret)
	}
}

// Submit records a submit the test made between call and ret, one
// operation per step of the run; errMsg is the error it got, if any.
func (r *Recorder) Submit(call, ret time.Time, steps []core.StepID, errMsg string) {
	r.operator(spec.OpSubmit, call, ret, steps, spec.StepOutput{Err: errMsg})
}

// Cancel records a run cancel, one operation per step of the run.
func (r *Recorder) Cancel(call, ret time.Time, steps []core.StepID, errMsg string) {
	r.operator(spec.OpCancel, call, ret, steps, spec.StepOutput{Err: errMsg})
}

// Query records a read of a step: its state and committed outcome (nil:
// none) as read between call and ret.
func (r *Recorder) Query(call, ret time.Time, step core.StepID, state core.State, outcome *core.Outcome) {
	var oc *core.Outcome
	if outcome != nil {
		c := *outcome
		oc = &c
	}
	r.operator(spec.OpQuery, call, ret, []core.StepID{step}, spec.StepOutput{State: state, Outcome: oc})
}

// Ops returns a copy of the history; operations still open (a report whose
// answer never came) have an unknown output and never return.
func (r *Recorder) Ops() []porcupine.Operation {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.steps.Ops()
}

// Pending is how many recorded operations still await their return (a
// report whose answer has not passed yet). An answer can trail the state it
// reports on, so a test that expects every report answered waits for 0.
func (r *Recorder) Pending() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.steps.Pending()
}

// Frames returns every decoded frame so far, in the order they were seen.
func (r *Recorder) Frames() []Frame {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Frame(nil), r.frames...)
}

// Undecodable is how many text messages did not decode as wire frames.
func (r *Recorder) Undecodable() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.undecodable
}

// Check checks ops for linearizability against spec.StepModel, without a
// wall-clock timeout (spec.CheckSteps: the verdict never depends on the
// machine's speed); the error lists the history when it is not
// linearizable, or says why the check was inconclusive.
func Check(ops []porcupine.Operation) error {
	c := spec.CheckSteps(ops, spec.MaxStepOps)
	switch c.Verdict {
	case spec.Linearizable:
		return nil
	case spec.Inconclusive:
		return fmt.Errorf("history of %d operations: %s: %s", len(ops), c.Verdict, c.Why())
	}
	return fmt.Errorf("history of %d operations is %s against spec.StepModel:%s", len(ops), c.Verdict, Describe(ops))
}

// Describe lists a history, one operation a line, in call order.
func Describe(ops []porcupine.Operation) string {
	var b strings.Builder
	for _, op := range ops {
		ret := "never"
		if op.Return != math.MaxInt64 {
			ret = time.Duration(op.Return).String()
		}
		fmt.Fprintf(&b, "\n  [%v .. %s] client %d: %s", time.Duration(op.Call), ret, op.ClientId, spec.StepModel.DescribeOperation(op.Input, op.Output))
	}
	return b.String()
}

// DoubleCommit doctors a history, to show that the check bites: it returns a
// copy of ops with one more report after the first report answered
// COMMITTED, by the same worker under the same lease with another request id
// and another outcome, also answered COMMITTED (a step committed twice). ok
// is false when ops hold no COMMITTED report.
func DoubleCommit(ops []porcupine.Operation) (doctored []porcupine.Operation, ok bool) {
	for _, op := range ops {
		in := op.Input.(spec.StepInput)
		out, _ := op.Output.(spec.StepOutput)
		if in.Kind != spec.OpReport || out.Unknown || out.Verdict != core.Committed {
			continue
		}
		dup := op
		in.Request += 1 << 32
		in.Outcome = core.Outcome{Status: core.OutcomeFailure, ExitCode: in.Outcome.ExitCode + 1, Message: "doctored"}
		dup.Input = in
		dup.Call, dup.Return = op.Return+1, op.Return+2
		return append(append([]porcupine.Operation(nil), ops...), dup), true
	}
	return nil, false
}

// Verify is what every fault test asks of a recorded history: the tap
// parsed all the traffic, the history passes the porcupine model, it holds a
// COMMITTED report, and the same history with that step committed twice
// fails the model (so the check is known to bite). It returns every problem
// found, joined; nil when all hold.
func Verify(rec *Recorder) error {
	var errs []error
	if err := rec.Err(); err != nil {
		errs = append(errs, fmt.Errorf("the tap could not parse the traffic: %w", err))
	}
	ops := rec.Ops()
	if err := Check(ops); err != nil {
		errs = append(errs, err)
	}
	bad, ok := DoubleCommit(ops)
	switch {
	case !ok:
		errs = append(errs, fmt.Errorf("the history holds no COMMITTED report:%s", Describe(ops)))
	case Check(bad) == nil:
		errs = append(errs, fmt.Errorf("a history with a step committed twice passed the check:%s", Describe(bad)))
	}
	return errors.Join(errs...)
}
