package core

import "fmt"

// State is a step's execution state. The eleven states and the transition
// table below are SPEC §1's; the one row that takes a started step back to
// the queue (recovering --REQUEUE--> queued) is argued there.
type State uint8

const (
	StatePending State = iota
	StateQueued
	StateRunning
	StateRecovering
	StateCancelling
	StateHeld
	StateWaiting
	StateSuccess
	StateFailed
	StateCancelled
	StateSkipped
	numStates
)

var stateNames = [numStates]string{
	"pending", "queued", "running", "recovering", "cancelling", "held", "waiting",
	"success", "failed", "cancelled", "skipped",
}

func (s State) String() string {
	if s < numStates {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// Terminal reports whether s is one of success, failed, cancelled, skipped.
// A terminal state never changes again.
func (s State) Terminal() bool {
	return s == StateSuccess || s == StateFailed || s == StateCancelled || s == StateSkipped
}

// ParseState is the inverse of State.String.
func ParseState(s string) (State, bool) {
	for i, n := range stateNames {
		if n == s {
			return State(i), true
		}
	}
	return 0, false
}

// Event is an input to the step state machine.
type Event uint8

const (
	EvEnqueue Event = iota
	EvCancel
	EvSkip
	EvHold
	EvWait
	EvStart
	EvFail
	EvSucceed
	EvCancelGraceful
	EvRecover
	EvCancelForce
	EvComplete
	EvApprove
	EvReject
	EvExpire
	EvTimerDone
	EvRequeue
	EvRetry
	EvReuse
	numEvents
)

var eventNames = [numEvents]string{
	"ENQUEUE", "CANCEL", "SKIP", "HOLD", "WAIT", "START", "FAIL", "SUCCEED",
	"CANCEL_GRACEFUL", "RECOVER", "CANCEL_FORCE", "COMPLETE", "APPROVE", "REJECT",
	"EXPIRE", "TIMER_DONE", "REQUEUE", "RETRY", "REUSE",
}

func (e Event) String() string {
	if e < numEvents {
		return eventNames[e]
	}
	return fmt.Sprintf("event(%d)", uint8(e))
}

// ParseEvent is the inverse of Event.String.
func ParseEvent(s string) (Event, bool) {
	for i, n := range eventNames {
		if n == s {
			return Event(i), true
		}
	}
	return 0, false
}

// Transition is one row of the step transition table.
type Transition struct {
	From  State
	Event Event
	To    State
}

// Transitions is the complete table. Every (state, event) pair not listed is
// refused: Next returns false and the step does not change.
var Transitions = []Transition{
	{StatePending, EvEnqueue, StateQueued},
	{StatePending, EvCancel, StateCancelled},
	{StatePending, EvSkip, StateSkipped},
	{StatePending, EvHold, StateHeld},
	{StatePending, EvWait, StateWaiting},
	{StateQueued, EvStart, StateRunning},
	{StateQueued, EvFail, StateFailed},
	{StateQueued, EvCancel, StateCancelled},
	{StateRunning, EvSucceed, StateSuccess},
	{StateRunning, EvFail, StateFailed},
	{StateRunning, EvCancel, StateCancelled},
	{StateRunning, EvCancelGraceful, StateCancelling},
	{StateRunning, EvRecover, StateRecovering},
	{StateRecovering, EvStart, StateRunning},
	{StateRecovering, EvFail, StateFailed},
	{StateRecovering, EvCancel, StateCancelled},
	{StateRecovering, EvRequeue, StateQueued},
	{StateCancelling, EvCancelForce, StateCancelled},
	{StateCancelling, EvComplete, StateCancelled},
	{StateCancelling, EvFail, StateFailed},
	{StateHeld, EvApprove, StateQueued},
	{StateHeld, EvReject, StateCancelled},
	{StateHeld, EvExpire, StateCancelled},
	{StateHeld, EvCancel, StateCancelled},
	{StateWaiting, EvTimerDone, StateQueued},
	{StateWaiting, EvCancel, StateCancelled},
	{StateRunning, EvRetry, StateWaiting},
	{StatePending, EvReuse, StateSuccess},
}

var table = func() (t [numStates][numEvents]State) {
	for s := range t {
		for e := range t[s] {
			t[s][e] = numStates // refused
		}
	}
	for _, r := range Transitions {
		t[r.From][r.Event] = r.To
	}
	return t
}()

// Next returns the state that event e leads to from s, or false when the
// table refuses the pair.
func Next(s State, e Event) (State, bool) {
	if s >= numStates || e >= numEvents {
		return s, false
	}
	to := table[s][e]
	if to == numStates {
		return s, false
	}
	return to, true
}

// FailureClass says why a step failed (or, for cancelled steps, why it was
// cancelled). Every failed step carries one.
type FailureClass string

const (
	ClassNone              FailureClass = ""
	ClassExecution         FailureClass = "execution"
	ClassDisconnect        FailureClass = "disconnect"
	ClassStaleWorker       FailureClass = "stale-worker"
	ClassStepTimeout       FailureClass = "step-timeout"
	ClassRunTimeout        FailureClass = "run-timeout"
	ClassUnmatched         FailureClass = "unmatched"
	ClassAttemptsExhausted FailureClass = "attempts-exhausted"
	ClassCleanup           FailureClass = "cancel-cleanup"
	ClassRevoked           FailureClass = "revoked"
	ClassOperator          FailureClass = "operator"
	ClassGate              FailureClass = "gate"
	ClassWorkerStopped     FailureClass = "worker-stopped"
	ClassChild             FailureClass = "child-run"   // a workflow step took its child run's outcome (SPEC §2)
	ClassConcurrency       FailureClass = "concurrency" // superseded in a concurrency group (SPEC §8a)
)
