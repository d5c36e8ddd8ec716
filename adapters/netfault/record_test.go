package netfault

import (
	"math"
	"testing"
	"time"

	"github.com/tether-run/tether/adapters/wire"
	"github.com/tether-run/tether/core"
	"github.com/tether-run/tether/spec"
)

// feed hands the recorder one encoded frame as if it passed link in dir.
func feed(t *testing.T, r *Recorder, link uint64, dir Dir, m core.Msg) {
	t.Helper()
	b, err := wire.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	r.message(Message{Link: link, Dir: dir, Op: OpText, Data: b, At: time.Now()})
}

// TestRecorder: reports become operations keyed by the worker of their
// link; a retransmission on a new link of the same worker is the same
// operation and the answer on that link ends it; an answer on another
// worker's link ends nothing; a report never answered stays open (unknown
// output, no return); undecodable text is counted. The history checks, and
// a doctored double commit does not.
func TestRecorder(t *testing.T) {
	r := NewRecorder()
	step := core.StepID("run-1/a")
	ok := core.Outcome{Status: core.OutcomeSuccess}
	call := time.Now()
	r.Submit(call, time.Now(), []core.StepID{step, "run-1/b"}, "")

	feed(t, r, 1, Up, core.Hello{Version: 1, Worker: "w1", Slots: 1})
	feed(t, r, 2, Up, core.Hello{Version: 1, Worker: "w2", Slots: 1})
	rep := core.Report{Step: step, Lease: 3, Request: 1, Outcome: ok}
	feed(t, r, 1, Up, rep)
	feed(t, r, 2, Down, core.Answer{Lease: 3, Request: 1, Verdict: core.Committed}) // w2's link: not w1's answer
	feed(t, r, 3, Up, core.Hello{Version: 1, Worker: "w1", Slots: 1})               // w1 reconnects
	feed(t, r, 3, Up, rep)                                                          // and re-sends
	feed(t, r, 3, Down, core.Answer{Lease: 3, Request: 1, Verdict: core.Committed})
	feed(t, r, 2, Up, core.Report{Step: "run-1/b", Lease: 4, Request: 1, Outcome: ok}) // never answered
	r.message(Message{Link: 2, Dir: Up, Op: OpText, Data: []byte("not json"), At: time.Now()})
	r.message(Message{Link: 2, Dir: Up, Op: OpPing, Data: []byte("x"), At: time.Now()})
	st, err := r.Frames(), r.Err()
	if len(st) != 8 || err != nil {
		t.Errorf("%d frames (want 8), tap error %v", len(st), err)
	}
	if r.Undecodable() != 1 {
		t.Errorf("undecodable = %d, want 1", r.Undecodable())
	}
	if r.Pending() != 1 {
		t.Errorf("pending = %d, want 1 (b's report)", r.Pending())
	}
	r.Query(time.Now(), time.Now(), step, core.StateSuccess, &ok)

	ops := r.Ops()
	var reports []spec.StepInput
	for _, op := range ops {
		if in := op.Input.(spec.StepInput); in.Kind == spec.OpReport {
			reports = append(reports, in)
			out := op.Output.(spec.StepOutput)
			switch in.Step {
			case step:
				if in.Worker != "w1" || out.Verdict != core.Committed || op.Return == math.MaxInt64 || op.Return < op.Call {
					t.Errorf("a's report: %+v → %+v [%d, %d]", in, out, op.Call, op.Return)
				}
			default:
				if in.Worker != "w2" || !out.Unknown || op.Return != math.MaxInt64 {
					t.Errorf("b's report: %+v → %+v, want open", in, out)
				}
			}
		}
	}
	if len(reports) != 2 || len(ops) != 5 {
		t.Fatalf("%d operations, %d reports; want 5 and 2:%s", len(ops), len(reports), Describe(ops))
	}
	if err := Check(ops); err != nil {
		t.Fatal(err)
	}
	bad, found := DoubleCommit(ops)
	if !found || len(bad) != len(ops)+1 {
		t.Fatalf("DoubleCommit found %v, %d ops", found, len(bad))
	}
	if err := Check(bad); err == nil {
		t.Fatalf("a doubly committed history passed:%s", Describe(bad))
	}
	if _, found := DoubleCommit(ops[:1]); found {
		t.Error("DoubleCommit doctored a history without a commit")
	}
}

// TestRecorderIntercept: the intercept sees each decoded frame once it is
// recorded (the history already holds a report when its frame is seen).
func TestRecorderIntercept(t *testing.T) {
	r := NewRecorder()
	var seen []string
	r.Intercept(func(f Frame) {
		seen = append(seen, f.Msg.Kind())
		if _, ok := f.Msg.(core.Report); ok && len(r.Ops()) != 1 {
			t.Errorf("the report was not recorded before the intercept saw it")
		}
	})
	feed(t, r, 1, Up, core.Hello{Version: 1, Worker: "w1", Slots: 1})
	feed(t, r, 1, Up, core.Report{Step: "run-1/a", Lease: 1, Request: 1, Outcome: core.Outcome{Status: core.OutcomeSuccess}})
	r.message(Message{Link: 1, Dir: Up, Op: OpText, Data: []byte("{"), At: time.Now()})
	if want := []string{(core.Hello{}).Kind(), (core.Report{}).Kind()}; len(seen) != 2 || seen[0] != want[0] || seen[1] != want[1] {
		t.Errorf("intercept saw %v, want %v", seen, want)
	}
}

// TestVerify: a history with a COMMITTED report verifies; an empty one does
// not (it could not show the check bites); a history in which a second
// worker's report on the same step is also COMMITTED fails the model.
func TestVerify(t *testing.T) {
	if err := Verify(NewRecorder()); err == nil {
		t.Error("an empty history verified; want: no COMMITTED report")
	}
	step := core.StepID("run-1/a")
	ok := core.Outcome{Status: core.OutcomeSuccess}
	build := func(twice bool) *Recorder {
		r := NewRecorder()
		r.Submit(time.Now(), time.Now(), []core.StepID{step}, "")
		feed(t, r, 1, Up, core.Hello{Version: 1, Worker: "w1", Slots: 1})
		feed(t, r, 1, Up, core.Report{Step: step, Lease: 1, Request: 1, Outcome: ok})
		feed(t, r, 1, Down, core.Answer{Lease: 1, Request: 1, Verdict: core.Committed})
		if twice {
			feed(t, r, 2, Up, core.Hello{Version: 1, Worker: "w2", Slots: 1})
			feed(t, r, 2, Up, core.Report{Step: step, Lease: 2, Request: 1, Outcome: ok})
			feed(t, r, 2, Down, core.Answer{Lease: 2, Request: 1, Verdict: core.Committed})
		}
		return r
	}
	if err := Verify(build(false)); err != nil {
		t.Errorf("a good history: %v", err)
	}
	if err := Verify(build(true)); err == nil {
		t.Error("a history with two COMMITTED reports for one step verified")
	}
}
