package spec

import (
	"math"

	"github.com/anishathalye/porcupine"
)

// History records a history of step operations for CheckSteps as they
// happen: Begin records an operation's input at its call, End its output at
// its return. An operation that never returns (a report whose answer was
// lost: it may or may not have taken effect) has an unknown output and
// returns never, after every other (Ops). Times are nanoseconds from any
// origin the recorder keeps fixed. The simulator and the fault tests on real
// sockets (adapters/netfault) both record with it. It is not safe for
// concurrent use.
type History struct {
	ops  []porcupine.Operation
	open []bool
}

// Begin records an operation's call by client (porcupine's client id: one
// per worker, one for the operator) and returns its index.
func (h *History) Begin(client int, in StepInput, call int64) int {
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Call: call})
	h.open = append(h.open, true)
	return len(h.ops) - 1
}

// End records operation i's output and return; an operation that returned
// already keeps its first return.
func (h *History) End(i int, out StepOutput, ret int64) {
	if !h.open[i] {
		return
	}
	h.open[i] = false
	h.ops[i].Output = out
	h.ops[i].Return = ret
}

// Len is how many operations were recorded.
func (h *History) Len() int { return len(h.ops) }

// Input is operation i's input.
func (h *History) Input(i int) StepInput { return h.ops[i].Input.(StepInput) }

// Open says whether operation i still awaits its return.
func (h *History) Open(i int) bool { return h.open[i] }

// Pending is how many operations still await their return.
func (h *History) Pending() int {
	n := 0
	for _, o := range h.open {
		if o {
			n++
		}
	}
	return n
}

// Ops returns a copy of the history, each operation still open with an
// unknown output and a return after every other.
func (h *History) Ops() []porcupine.Operation {
	out := append([]porcupine.Operation(nil), h.ops...)
	for i := range out {
		if h.open[i] {
			out[i].Output = StepOutput{Unknown: true}
			out[i].Return = math.MaxInt64
		}
	}
	return out
}
