package sim

import (
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/tether-run/tether/core"
	"github.com/tether-run/tether/spec"
)

const opClientOperator = 1 << 20

type leaseKey struct {
	w core.WorkerID
	l core.LeaseID
}

// history is what the simulator records for the end-of-run checks: the
// client-visible operations for porcupine, and every log line printed or lost
// for the log continuity check.
type history struct {
	ops       []porcupine.Operation
	open      []bool
	reports   map[[2]uint64]int // (lease, request) → op index
	runs      []core.RunID
	dispatch  map[core.LeaseID]core.Dispatch
	printedN  map[leaseKey]int
	lostSeqs  map[leaseKey]map[uint64]bool
	inflight  map[leaseKey]map[uint64]int // lines on the wire right now
	lostDrops map[leaseKey]int            // drops reported by gap markers that were lost or are still on the wire
	workerIdx map[core.WorkerID]int
	writing   map[string]bool        // "run/step name" → declared write-bearing
	notes     []porcupine.Annotation // faults, shown on the visualization
}

func newHistory() *history {
	return &history{reports: map[[2]uint64]int{}, dispatch: map[core.LeaseID]core.Dispatch{},
		printedN: map[leaseKey]int{}, lostSeqs: map[leaseKey]map[uint64]bool{}, inflight: map[leaseKey]map[uint64]int{}, lostDrops: map[leaseKey]int{}, workerIdx: map[core.WorkerID]int{}, writing: map[string]bool{}}
}

func nanos(t time.Time) int64 { return t.Sub(t0).Nanoseconds() }

func (h *history) begin(now time.Time, client int, in spec.StepInput) int {
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Call: nanos(now)})
	h.open = append(h.open, true)
	return len(h.ops) - 1
}

func (h *history) end(i int, now time.Time, out spec.StepOutput) {
	if !h.open[i] {
		return
	}
	h.open[i] = false
	h.ops[i].Output = out
	h.ops[i].Return = nanos(now)
}

func (h *history) reportSent(now time.Time, wid core.WorkerID, m core.Report) {
	k := [2]uint64{uint64(m.Lease), m.Request}
	if _, ok := h.reports[k]; ok {
		return // a retransmission: the same operation
	}
	client, ok := h.workerIdx[wid]
	if !ok {
		client = len(h.workerIdx)
		h.workerIdx[wid] = client
	}
	h.reports[k] = h.begin(now, client, spec.StepInput{Kind: spec.OpReport, Step: m.Step, Lease: m.Lease, Request: m.Request, Outcome: m.Outcome})
}

func (h *history) delivered(now time.Time, m core.Msg) {
	switch m := m.(type) {
	case core.Answer:
		if i, ok := h.reports[[2]uint64{uint64(m.Lease), m.Request}]; ok {
			h.end(i, now, spec.StepOutput{Verdict: m.Verdict})
		}
	case core.Dispatch:
		h.dispatch[m.Lease] = m
	}
}

// submitted records a run's steps as the operator declared them.
func (h *history) submitted(run core.RunID, rs core.RunSpec) {
	for _, s := range rs.Steps {
		h.writing[string(run)+"/"+s.Name] = s.Writes
	}
}

// writes says whether a step ("run-1/a", "run-1/a[0]") was declared
// write-bearing when its run was submitted (or, if the submit's answer was
// lost, what the worker was told).
func (h *history) writes(step core.StepID) bool {
	id, _, _ := strings.Cut(string(step), "[")
	if w, ok := h.writing[id]; ok {
		return w
	}
	for _, d := range h.dispatch {
		if d.Step == step {
			return d.Writes
		}
	}
	return false
}

func (h *history) printed(w core.WorkerID, l core.LeaseID) { h.printedN[leaseKey{w, l}]++ }

// onWire counts a Logs message's lines onto (+1) or off (-1) the wire.
func (h *history) onWire(w core.WorkerID, m core.Logs, d int) {
	k := leaseKey{w, m.Lease}
	if h.inflight[k] == nil {
		h.inflight[k] = map[uint64]int{}
	}
	for _, ln := range m.Lines {
		if ln.Seq != 0 {
			h.inflight[k][ln.Seq] += d
		} else {
			h.lostDrops[k] += d * markerDrops(ln.Text)
		}
	}
}

// lostMarker accounts for a gap marker lost on the wire.
func (h *history) lostMarker(w core.WorkerID, l core.LeaseID, text string) {
	h.lostDrops[leaseKey{w, l}] += markerDrops(text)
}

func markerDrops(text string) int {
	if m := dropRe.FindStringSubmatch(text); m != nil {
		n, _ := strconv.Atoi(m[1])
		return n
	}
	return 0
}

func (h *history) lostLine(w core.WorkerID, l core.LeaseID, seq uint64) {
	k := leaseKey{w, l}
	if h.lostSeqs[k] == nil {
		h.lostSeqs[k] = map[uint64]bool{}
	}
	h.lostSeqs[k][seq] = true
}

// finish closes every operation that never returned: unknown, Return = max.
func (h *history) finish() []porcupine.Operation {
	for i := range h.ops {
		if h.open[i] {
			h.open[i] = false
			h.ops[i].Output = spec.StepOutput{Unknown: true}
			h.ops[i].Return = math.MaxInt64
		}
	}
	return h.ops
}

var dropRe = regexp.MustCompile(`(\d+) log lines dropped due to buffer overflow`)

// checkLogs is the log continuity check: for every committed lease, the lines
// the orchestrator stored equal what the execution printed, except lines a
// gap marker reports dropped (exactly) and lines the simulator saw lost on a
// dead socket or in an orchestrator crash, or still on the wire at the end.
func (h *history) checkLogs(o *core.Orchestrator) (string, bool) {
	leases := o.Leases()
	for _, l := range leases {
		if !l.Committed {
			continue
		}
		k := leaseKey{l.Worker, l.ID}
		printed := h.printedN[k]
		seen := map[uint64]bool{}
		dropped := 0
		for _, ln := range o.StepLogs(l.Step) {
			if ln.Lease != l.ID || ln.Event {
				continue
			}
			if ln.Line.Seq == 0 {
				dropped += markerDrops(ln.Line.Text)
				continue
			}
			if seen[ln.Line.Seq] {
				return fmt.Sprintf("lease %d: line %d stored twice", l.ID, ln.Line.Seq), false
			}
			seen[ln.Line.Seq] = true
			if int(ln.Line.Seq) > printed {
				return fmt.Sprintf("lease %d: stored line %d but the execution printed only %d", l.ID, ln.Line.Seq, printed), false
			}
		}
		missing := 0
		var first []uint64
		for s := uint64(1); s <= uint64(printed); s++ {
			if !seen[s] && !h.lostSeqs[k][s] && h.inflight[k][s] == 0 {
				missing++
				if len(first) < 5 {
					first = append(first, s)
				}
			}
		}
		if missing != dropped+h.lostDrops[k] {
			sort.Slice(first, func(i, j int) bool { return first[i] < first[j] })
			return fmt.Sprintf("lease %d on %s: %d of %d printed lines missing (first %v), gap markers account for %d (+%d in markers lost on the wire)",
				l.ID, l.Worker, missing, printed, first, dropped, h.lostDrops[k]), false
		}
	}
	return "", true
}
