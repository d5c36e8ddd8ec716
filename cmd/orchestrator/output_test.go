package main

// Step output on the real binaries (SPEC §10): a worker process, connected
// through a netfault proxy, runs steps that print as fast as they can.
// Nothing is lost without an exact gap marker, and a flood never costs the
// worker its connection.

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/tether-run/tether/core"
)

// lines returns a step's stored log lines (no events), in stored order.
func (r *binRig) lines(step core.StepID) []core.LogLine {
	r.t.Helper()
	var out []core.LogLine
	if err := (coreViewer{r.d}).Snapshot(r.ctx, func(o coreView) {
		for _, l := range o.StepLogs(step) {
			if !l.Event {
				out = append(out, l.Line)
			}
		}
	}); err != nil {
		r.t.Fatal(err)
	}
	return out
}

// checkSeq checks that lines are "1".."n" with sequence numbers 1..n, in
// order, each once.
func checkSeq(t *testing.T, lines []core.LogLine, n int) {
	t.Helper()
	got := 0
	for _, l := range lines {
		if l.Seq == 0 {
			continue // an offline gap marker: it reports no loss
		}
		got++
		if l.Seq != uint64(got) || l.Text != strconv.Itoa(got) {
			t.Fatalf("stored line %d is seq %d %q; want seq %d %q (%d lines stored)", got, l.Seq, l.Text, got, strconv.Itoa(got), len(lines))
		}
	}
	if got != n {
		t.Fatalf("stored %d of %d lines", got, n)
	}
}

// TestOutputFlood: a step prints 200,000 lines as fast as it can. All of
// them are stored, in order, once; the worker never lost its connection
// (one accepted link, no step went recovering).
func TestOutputFlood(t *testing.T) {
	r := startBinRig(t)
	w := r.startWorker("flood")
	const n = 200000
	run := r.submit(core.RunSpec{Name: "flood", Steps: []core.StepSpec{{Name: "seq", Command: fmt.Sprintf("seq 1 %d", n)}}})
	r.waitFor("the run to finish", runFinished(run))
	step := stepID(run, "seq")
	lines := r.lines(step)
	v := r.view(run)
	t.Logf("stored %d lines of %d; links accepted by the proxy: %d", len(lines), n, r.p.Accepted())
	if s := v.steps[step]; s.State != core.StateSuccess {
		t.Fatalf("the step did not succeed:\n%s", v)
	}
	checkSeq(t, lines, n)
	if _, ok := v.event(step, "step-recovering"); ok || r.p.Accepted() != 1 || strings.Contains(w.stderr.String(), "connection lost") {
		t.Errorf("the worker lost its connection during the flood (links %d):\n%s", r.p.Accepted(), v)
	}
	checkHistory(t, r.rec)
}

var dropMarkerRE = regexp.MustCompile(`^--- Output dropped: (\d+) log lines \((\d+) bytes\) over the output cap of (\d+) bytes\. ---$`)

// TestOutputCap: a step runs `yes | head -c 200M` (104,857,600 two-byte
// lines, 200 times its worker's 1 MiB output cap) while another step on the
// same worker prints along.
// Exactly one drop marker is stored, and its counts add up: stored bytes +
// dropped bytes = printed bytes, likewise lines. No step goes recovering.
func TestOutputCap(t *testing.T) {
	r := startBinRigFor(t, 4*faultTimeout) // 200 MB through the worker, under -race too
	w := r.startWorker("capped", "--output-cap", "1MiB", "--slots", "2")
	const printed = 200 << 20 // bytes: "y" and a newline, 104,857,600 times
	line := "y"
	run := r.submit(core.RunSpec{Name: "cap", Steps: []core.StepSpec{
		{Name: "yes", Command: "yes | head -c 200M"},
		{Name: "other", Command: "i=0; while [ $i -lt 20 ]; do echo tick $i; sleep 0.1; i=$((i+1)); done"},
	}})
	r.waitFor("the run to finish", runFinished(run))
	v := r.view(run)
	for _, s := range v.steps {
		if s.State != core.StateSuccess {
			t.Fatalf("step %s did not succeed:\n%s", s.ID, v)
		}
		if _, ok := v.event(s.ID, "step-recovering"); ok {
			t.Errorf("step %s went recovering:\n%s", s.ID, v)
		}
	}
	var markers []string
	var stored, storedB int64
	for i, l := range r.lines(stepID(run, "yes")) {
		if dropMarkerRE.MatchString(l.Text) {
			markers = append(markers, l.Text)
			continue
		}
		if l.Seq != uint64(i+1) || l.Text != line {
			t.Fatalf("stored line %d is seq %d %q", i, l.Seq, l.Text)
		}
		stored++
		storedB += int64(core.LineBytes(l.Text))
	}
	if len(markers) != 1 {
		t.Fatalf("%d drop markers, want exactly 1: %q", len(markers), markers)
	}
	m := dropMarkerRE.FindStringSubmatch(markers[0])
	dropped, droppedB, capB := atoi64(m[1]), atoi64(m[2]), atoi64(m[3])
	t.Logf("stored %d lines (%d bytes); the marker reports %d lines (%d bytes) dropped over a cap of %d", stored, storedB, dropped, droppedB, capB)
	if capB != 1<<20 || storedB > capB || storedB+droppedB != printed || stored+dropped != printed/2 {
		t.Errorf("counts do not add up: stored %d lines (%d bytes) + dropped %d (%d bytes), printed %d lines (%d bytes), cap %d",
			stored, storedB, dropped, droppedB, printed/2, printed, capB)
	}
	if got := len(r.lines(stepID(run, "other"))); got != 20 {
		t.Errorf("the other step stored %d of its 20 lines", got)
	}
	if r.p.Accepted() != 1 || strings.Contains(w.stderr.String(), "connection lost") {
		t.Errorf("the worker lost its connection (links %d)", r.p.Accepted())
	}
	checkHistory(t, r.rec)
}

func atoi64(s string) int64 {
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}

// TestOutputCutMidFlood: the worker's link is cut while a step floods and
// restored within the grace window. After the reconnect every line is there
// exactly once, in order: what was unacknowledged is sent again.
func TestOutputCutMidFlood(t *testing.T) {
	r := startBinRig(t)
	// Grace 10 s: the worker's redials (1 s, 1.5 s, …) come well within it.
	r.startWorker("cut", "--max-reconnect-delay", "5s")
	const n = 200000
	run := r.submit(core.RunSpec{Name: "cut", Steps: []core.StepSpec{{Name: "seq", Command: fmt.Sprintf("seq 1 %d", n)}}})
	step := stepID(run, "seq")
	r.waitFor("some of the flood to be stored", func(o coreView) bool { return len(o.StepLogs(step)) > 1000 })
	if got := r.p.Cut(); got != 1 {
		t.Fatalf("Cut severed %d links, want the worker's one", got)
	}
	poll(t, r.ctx, "the worker to redial", func() bool { return r.p.Refused() > 0 })
	r.p.Restore()
	r.waitFor("the run to finish", runFinished(run))
	v := r.view(run)
	if s := v.steps[step]; s.State != core.StateSuccess {
		t.Fatalf("the step did not succeed:\n%s", v)
	}
	if _, ok := v.event(step, "step-reclaimed"); !ok {
		t.Errorf("the step was not reclaimed after the cut:\n%s", v)
	}
	checkSeq(t, r.lines(step), n)
	checkHistory(t, r.rec)
}
