package core

import (
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// TestGroupRunIDsIsRunIDsFiltered: GroupRunIDs is RunIDs less the runs
// naming no group, in the same order, over runs submitted at the same
// instant and with ids of the same length (the order's ties).
func TestGroupRunIDsIsRunIDsFiltered(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		o := &Orchestrator{}
		o.init()
		n := rapid.IntRange(0, 30).Draw(t, "runs")
		for range n {
			id := RunID(rapid.StringMatching(`r-[a-c]{1,3}`).Draw(t, "id"))
			r := &RunRecord{ID: id, SubmittedAt: time.Unix(rapid.Int64Range(0, 3).Draw(t, "at"), 0).UTC()}
			r.Spec.Group.Name = rapid.SampledFrom([]string{"", "", "g", "h"}).Draw(t, "group")
			r.Finished = rapid.Bool().Draw(t, "finished")
			o.runs[id] = r
		}
		var want []RunID
		for _, id := range o.RunIDs() {
			if o.runs[id].Spec.Group.Name != "" {
				want = append(want, id)
			}
		}
		if got := o.GroupRunIDs(); !slices.Equal(got, want) {
			t.Fatalf("GroupRunIDs() = %v, RunIDs filtered %v", got, want)
		}
	})
}

// TestWorkerClockIsWorkersLastHeartbeat: WorkerClock is the LastHeartbeat
// Workers reports (the live clock, not the recorded one), and zero for an
// unknown worker.
func TestWorkerClockIsWorkersLastHeartbeat(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		o := &Orchestrator{}
		o.init()
		n := rapid.IntRange(0, 8).Draw(t, "workers")
		for range n {
			id := WorkerID(rapid.StringMatching(`w[0-9]`).Draw(t, "id"))
			o.workers[id] = &WorkerRecord{ID: id, LastHeartbeat: time.Unix(rapid.Int64Range(0, 9).Draw(t, "recorded"), 0),
				clock: time.Unix(rapid.Int64Range(0, 9).Draw(t, "clock"), 0)}
		}
		for _, w := range o.Workers() {
			if got, ok := o.WorkerClock(w.ID); !ok || !got.Equal(w.LastHeartbeat) {
				t.Fatalf("WorkerClock(%s) = %v, %v; Workers says %v", w.ID, got, ok, w.LastHeartbeat)
			}
		}
		if got, ok := o.WorkerClock("unknown"); ok || !got.IsZero() {
			t.Fatalf("WorkerClock(unknown) = %v, %v", got, ok)
		}
	})
}

// TestLeaseLogsViewIsStable: a view of a lease's log holds the lines of
// index from on, stays as it was while the log grows (the orchestrator
// only appends), and an append to the view never reaches the log (its
// capacity is its length).
func TestLeaseLogsViewIsStable(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		o := &Orchestrator{}
		o.init()
		add := func(n int) {
			for range n {
				i := len(o.logs[7])
				o.logs[7] = append(o.logs[7], StepLogLine{Lease: 7, Index: i, Line: LogLine{Seq: uint64(i + 1), Text: "x"}})
			}
		}
		add(rapid.IntRange(0, 40).Draw(t, "before"))
		from := rapid.IntRange(0, 45).Draw(t, "from")
		v := o.LeaseLogsView(7, from)
		if want := max(0, len(o.logs[7])-from); len(v) != want || cap(v) != len(v) {
			t.Fatalf("view from %d of %d lines: len %d cap %d, want len %d = cap", from, len(o.logs[7]), len(v), cap(v), want)
		}
		snap := slices.Clone(v)
		add(rapid.IntRange(0, 40).Draw(t, "after"))
		if !slices.Equal(v, snap) {
			t.Fatal("the view changed as the log grew")
		}
		_ = append(v, StepLogLine{Lease: 7, Index: -1})
		for _, l := range o.logs[7] {
			if l.Index < 0 {
				t.Fatal("an append to the view reached the log")
			}
		}
		if len(o.LeaseLogsView(8, 0)) != 0 {
			t.Fatal("a view of a lease with no log is not empty")
		}
	})
}
