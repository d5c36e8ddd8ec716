package sim

import (
	"fmt"
	"regexp"
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
// client-visible operations for porcupine, and what every execution printed
// for the log continuity check.
type history struct {
	steps     spec.History
	reports   map[[2]uint64]int // (lease, request) → op index
	runs      []core.RunID
	dispatch  map[core.LeaseID]core.Dispatch
	printedN  map[leaseKey]int
	printedB  map[leaseKey]int64 // bytes printed, a line counting its text and newline (core.LineBytes)
	workerIdx map[core.WorkerID]int
	writing   map[string]bool        // "run/step name" → declared write-bearing
	notes     []porcupine.Annotation // faults, shown on the visualization
}

func newHistory() *history {
	return &history{reports: map[[2]uint64]int{}, dispatch: map[core.LeaseID]core.Dispatch{},
		printedN: map[leaseKey]int{}, printedB: map[leaseKey]int64{}, workerIdx: map[core.WorkerID]int{}, writing: map[string]bool{}}
}

func nanos(t time.Time) int64 { return t.Sub(t0).Nanoseconds() }

func (h *history) begin(now time.Time, client int, in spec.StepInput) int {
	return h.steps.Begin(client, in, nanos(now))
}

func (h *history) end(i int, now time.Time, out spec.StepOutput) {
	h.steps.End(i, out, nanos(now))
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

func (h *history) printed(w core.WorkerID, l core.LeaseID, text string) {
	k := leaseKey{w, l}
	h.printedN[k]++
	h.printedB[k] += int64(core.LineBytes(text))
}

// markerDrops reads the lines and bytes a drop marker (core.DropMarker)
// reports; zero for any other line.
func markerDrops(text string) (lines int, bytes int64) {
	if m := dropRe.FindStringSubmatch(text); m != nil {
		n, _ := strconv.Atoi(m[1])
		b, _ := strconv.ParseInt(m[2], 10, 64)
		return n, b
	}
	return 0, 0
}

// finish is the history, every operation that never returned closed as
// unknown, returning never.
func (h *history) finish() []porcupine.Operation { return h.steps.Ops() }

// largestStep is the most operations one step's history holds.
func (h *history) largestStep() int {
	n := map[core.StepID]int{}
	most := 0
	for i := range h.steps.Len() {
		s := h.steps.Input(i).Step
		n[s]++
		most = max(most, n[s])
	}
	return most
}

var dropRe = regexp.MustCompile(`^--- Output dropped: (\d+) log lines \((\d+) bytes\)`)

// checkLogs is the log continuity check (SPEC §13): for every committed
// lease, the stored numbered lines are exactly 1..n, each once, and beside
// the drop markers among them they are what the execution printed, except
// what those markers account for, exactly, in lines and in bytes. Logs are acknowledged, so nothing
// may be missing for having been lost on the wire or in a crash.
func (h *history) checkLogs(o spec.View, linesOf func(core.LeaseRecord) []core.StepLogLine) (string, int, bool) {
	markers := 0
	for _, l := range o.Leases() {
		if !l.Committed {
			continue
		}
		k := leaseKey{l.Worker, l.ID}
		printed, printedB := h.printedN[k], h.printedB[k]
		seen := map[uint64]bool{}
		var numbered, stored, droppedN int
		var storedB, droppedB int64
		for _, ln := range linesOf(l) {
			if ln.Lease != l.ID || ln.Event || ln.Line.Seq == 0 {
				continue // events, and offline gap markers (they report no loss)
			}
			if seen[ln.Line.Seq] {
				return fmt.Sprintf("lease %d: line %d stored twice", l.ID, ln.Line.Seq), markers, false
			}
			seen[ln.Line.Seq] = true
			numbered++
			if n, b := markerDrops(ln.Line.Text); n > 0 {
				markers++
				droppedN += n
				droppedB += b
				continue
			}
			stored++
			storedB += int64(core.LineBytes(ln.Line.Text))
		}
		for s := uint64(1); s <= uint64(numbered); s++ {
			if !seen[s] {
				return fmt.Sprintf("lease %d on %s: line %d missing of %d stored (printed %d)", l.ID, l.Worker, s, numbered, printed), markers, false
			}
		}
		if stored+droppedN != printed || storedB+droppedB != printedB {
			return fmt.Sprintf("lease %d on %s: printed %d lines (%d bytes); stored %d (%d bytes), drop markers account for %d (%d bytes)",
				l.ID, l.Worker, printed, printedB, stored, storedB, droppedN, droppedB), markers, false
		}
	}
	return "", markers, true
}
