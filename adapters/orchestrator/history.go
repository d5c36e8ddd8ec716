package orchestrator

// The operator API's reads of archived runs (SPEC §7a, §12). A run leaves
// the core in the batch that finishes it; the API then reads it from the
// store's history, each read a short read transaction of its own, never
// through the loop. Live runs still come from the loop (Driver.Snapshot),
// which holds live work only. Both answer in the same shape: the views
// below are built from one runSource, whichever side it came from.

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/tether-run/tether/adapters/store"
	"github.com/tether-run/tether/core"
)

// History is the store's history of archived runs, read without the loop
// (each call a short read transaction of its own).
func (d *Driver) History() store.Histories { return d.st }

// Listing limits of GET /api/runs.
const (
	DefaultRunsLimit = 100
	MaxRunsLimit     = 1000
)

// runStatuses are the statuses a run may have (the ?status= filter).
var runStatuses = []string{"running", "waiting", "cancelling", "failing", "success", "failed", "cancelled"}

// runSource is one run as the API shows it, live or archived.
type runSource struct {
	run    core.RunRecord
	status string
	steps  []core.StepRecord  // in the run's order
	writes map[string]bool    // by step name: its declaration writes
	leases []core.LeaseRecord // the run's, by id
	events []core.ServerEvent
}

// liveRun reads a live run and its steps from the core (what a listing
// needs); false if it is not there.
func liveRun(o *core.Orchestrator, id core.RunID) (runSource, bool) {
	r, st, ok := o.Run(id)
	if !ok {
		return runSource{}, false
	}
	src := runSource{run: r, status: st}
	for _, sid := range r.Steps {
		if s, ok := o.StepByID(sid); ok {
			src.steps = append(src.steps, s)
		}
	}
	return src, true
}

// liveSource reads a live run from the core, all the API shows of it;
// false if it is not there.
func liveSource(o *core.Orchestrator, id core.RunID) (runSource, bool) {
	src, ok := liveRun(o, id)
	if !ok {
		return runSource{}, false
	}
	r := src.run
	src.writes, src.events = map[string]bool{}, o.Events(id)
	inRun := map[core.StepID]bool{}
	for _, s := range src.steps {
		inRun[s.ID] = true
	}
	for i := range r.Spec.Steps {
		src.writes[r.Spec.Steps[i].Name] = r.Spec.Steps[i].Writes
	}
	for _, l := range o.Leases() {
		if inRun[l.Step] {
			src.leases = append(src.leases, l)
		}
	}
	return src, true
}

// archivedSource is an archived run's history as a runSource.
func archivedSource(h core.RunHistory) runSource {
	src := runSource{run: h.Run, status: h.Status, steps: h.Steps, writes: map[string]bool{}, leases: h.Leases, events: h.Events}
	for i := range h.Run.Spec.Steps {
		src.writes[h.Run.Spec.Steps[i].Name] = h.Run.Spec.Steps[i].Writes
	}
	sort.Slice(src.leases, func(i, j int) bool { return src.leases[i].ID < src.leases[j].ID })
	return src
}

// summary is the run's line of a listing.
func (src *runSource) summary() APIRun {
	r := src.run
	v := APIRun{
		ID: string(r.ID), Name: r.Spec.Name, Status: src.status, Parent: string(r.Parent),
		SubmittedAt: r.SubmittedAt, Deadline: r.Deadline, CancelReason: r.CancelReason,
		Steps: len(r.Steps), States: map[string]int{}, RerunOf: string(r.RerunOf),
	}
	if r.Finished {
		v.FinishedAt = r.FinishedAt
	}
	for _, s := range src.steps {
		v.States[s.State.String()]++
	}
	return v
}

// summaryView is an archived run's line of a listing, from the store's
// index: the same fields as summary's.
func summaryView(s store.RunSummary) APIRun {
	return APIRun{
		ID: string(s.ID), Name: s.Name, Status: s.Status, Parent: string(s.Parent),
		SubmittedAt: s.SubmittedAt, FinishedAt: s.FinishedAt, Deadline: s.Deadline, CancelReason: s.CancelReason,
		Steps: s.Steps, States: s.States,
	}
}

// detail is GET /api/runs/{id}'s answer; names gives workers' names.
func (src *runSource) detail(names map[core.WorkerID]string) APIRunDetail {
	out := APIRunDetail{Run: src.summary(), Status: src.status, Steps: []APIStep{}, Events: []APIEvent{}, ParentStep: string(src.run.ParentStep),
		Group: src.run.Spec.Group.Name, Schedule: src.run.Schedule, FireAt: src.run.FireAt}
	// The tree: the workflow steps' children and the API's, in submit order.
	var kids []core.RunID
	for _, s := range src.steps {
		if s.Child != "" {
			kids = append(kids, s.Child)
		}
	}
	kids = append(kids, src.run.Children...)
	sort.SliceStable(kids, func(i, j int) bool { return runNumber(kids[i]) < runNumber(kids[j]) })
	for _, c := range kids {
		out.Children = append(out.Children, string(c))
	}
	last := map[core.StepID]core.LeaseRecord{} // leases are sorted by id: the last one wins
	for _, l := range src.leases {
		last[l.Step] = l
	}
	tryLimit := map[string]int{} // by step name: 1 + its retry attempts (SPEC §1 RETRY)
	for i := range src.run.Spec.Steps {
		if r := src.run.Spec.Steps[i].Retry; r != nil {
			tryLimit[src.run.Spec.Steps[i].Name] = 1 + r.Attempts
		}
	}
	for _, s := range src.steps {
		v := APIStep{
			ID: string(s.ID), Name: s.Name, Item: s.Item, State: s.State.String(),
			Class: string(s.Class), Message: s.Message, SkippedBy: string(s.SkippedBy),
			Attempts: s.Attempts, QueuedAt: s.QueuedAt, StartedAt: s.StartedAt, FinishedAt: s.FinishedAt,
			Writes: src.writes[s.Name], Child: string(s.Child),
		}
		if n := tryLimit[s.Name]; n > 0 {
			v.Try, v.TryLimit = s.Tries+1, n
		}
		for _, dep := range s.Deps {
			v.Deps = append(v.Deps, string(dep))
		}
		if l, ok := last[s.ID]; ok {
			v.Lease, v.WorkerID, v.Worker = uint64(l.ID), string(l.Worker), names[l.Worker]
		}
		if s.Outcome != nil && (s.Outcome.Status == core.OutcomeSuccess || s.Outcome.Status == core.OutcomeFailure) {
			code := s.Outcome.ExitCode
			v.ExitCode = &code
		}
		out.Steps = append(out.Steps, v)
	}
	for _, ev := range src.events {
		out.Events = append(out.Events, APIEvent{Seq: ev.Seq, At: ev.At, Step: string(ev.Step), Kind: ev.Kind, Message: ev.Message})
	}
	return out
}

// runNumber is n of "run-n" (0 if it is not one).
func runNumber(id core.RunID) uint64 {
	n, _ := strconv.ParseUint(strings.TrimPrefix(string(id), "run-"), 10, 64)
	return n
}

// matchSteps returns the steps ?step= selects ("build", every forEach
// instance; "build[1]", one; or a full id), in the run's order.
func (src *runSource) matchSteps(step string) []core.StepID {
	var out []core.StepID
	for _, s := range src.steps {
		if step != "" && s.Name != step && string(s.ID) != string(src.run.ID)+"/"+step && string(s.ID) != step {
			continue
		}
		out = append(out, s.ID)
	}
	return out
}

func logLine(l core.StepLogLine) APILogLine {
	return APILogLine{
		Step: string(l.Step), Lease: uint64(l.Lease), Seq: l.Line.Seq, At: l.Line.At,
		Text: l.Line.Text, Event: l.Event, Gap: l.Line.Seq == 0 && !l.Event,
	}
}

// workerNames reads every worker's name through a snapshot.
func (a *api) workerNames(ctx context.Context) (map[core.WorkerID]string, error) {
	names := map[core.WorkerID]string{}
	err := a.d.Snapshot(ctx, func(o *core.Orchestrator) {
		for _, w := range o.Workers() {
			names[w.ID] = w.Name
		}
	})
	return names, err
}

// history reads an archived run; false if the store has none of it.
func (a *api) history(id core.RunID) (core.RunHistory, bool, error) {
	h, err := a.d.st.History(id)
	if errors.Is(err, store.ErrNotFound) {
		return core.RunHistory{}, false, nil
	}
	if err != nil {
		return core.RunHistory{}, false, err
	}
	return h, true, nil
}

// eachArchivedPage hands f the stored lines of the given steps' leases,
// a page (at most store.MaxLogPage lines) at a time, in the steps' order,
// each step's in lease order: what a reader of a long log holds at once is
// one page, not the log.
func (a *api) eachArchivedPage(src *runSource, steps []core.StepID, f func([]core.StepLogLine) error) error {
	for _, sid := range steps {
		var leases []core.LeaseID
		for _, l := range src.leases {
			if l.Step == sid {
				leases = append(leases, l.ID)
			}
		}
		for after := ""; len(leases) > 0; {
			page, next, err := a.d.st.HistoryLogs(leases, after, store.MaxLogPage)
			if err != nil {
				return err
			}
			if err := f(page); err != nil {
				return err
			}
			if next == "" {
				break
			}
			after = next
		}
	}
	return nil
}

// runQuery is GET /api/runs's parameters.
type runQuery struct {
	filter store.RunFilter
	cursor uint64
	limit  int
}

func parseRunQuery(q url.Values, now time.Time) (runQuery, error) {
	rq := runQuery{limit: DefaultRunsLimit}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxRunsLimit {
			return rq, errorf(http.StatusBadRequest, "limit %s is not a whole number from 1 to %d", core.Quote(v), MaxRunsLimit)
		}
		rq.limit = n
	}
	if v := q.Get("cursor"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || n == 0 {
			return rq, errorf(http.StatusBadRequest, "cursor %s is not a cursor this API answered (next_cursor)", core.Quote(v))
		}
		rq.cursor = n
	}
	if v := q.Get("status"); v != "" {
		ok := false
		for _, s := range runStatuses {
			ok = ok || s == v
		}
		if !ok {
			return rq, errorf(http.StatusBadRequest, "status %s is not a run status (one of %v)", core.Quote(v), runStatuses)
		}
		rq.filter.Status = v
	}
	rq.filter.Name = q.Get("name")
	if v := q.Get("since"); v != "" {
		if t, err := time.Parse(time.RFC3339, v); err == nil {
			rq.filter.Since = t
		} else if d, err := time.ParseDuration(v); err == nil && d > 0 {
			rq.filter.Since = now.Add(-d)
		} else {
			return rq, errorf(http.StatusBadRequest, "since %s is neither an RFC 3339 time (2026-01-02T15:04:05Z) nor a positive duration (24h)", core.Quote(v))
		}
	}
	return rq, nil
}

// listRuns answers GET /api/runs: runs newest first (by run number), live
// ones from a snapshot and archived ones from the store's index. The
// snapshot is read first: a run archived after it is in the store by the
// time the store is read, so no run falls between the two (one read by
// both is shown once). The cursor is a run number, so a run archived
// between two pages is neither lost nor shown twice.
func (a *api) listRuns(r *http.Request) (int, any, error) {
	rq, err := parseRunQuery(r.URL.Query(), time.Now())
	if err != nil {
		return 0, nil, err
	}
	type entry struct {
		seq uint64
		run APIRun
	}
	var live []entry
	err = a.d.Snapshot(r.Context(), func(o *core.Orchestrator) {
		for _, id := range o.RunIDs() {
			seq, ok := store.RunSeq(id)
			if !ok || (rq.cursor != 0 && seq >= rq.cursor) {
				continue
			}
			src, ok := liveRun(o, id)
			if ok && rq.filter.Match(src.status, src.run.Spec.Name, src.run.SubmittedAt) {
				live = append(live, entry{seq, src.summary()})
			}
		}
	})
	if err != nil {
		return 0, nil, err
	}
	arch, lo, err := a.d.st.ListRuns(rq.filter, rq.cursor, rq.limit) // every run numbered in [lo, cursor) was examined
	if err != nil {
		return 0, nil, err
	}
	seen := map[string]bool{}
	var all []entry
	for _, s := range arch {
		seen[string(s.ID)] = true
		all = append(all, entry{s.Seq, summaryView(s)})
	}
	for _, e := range live {
		if e.seq >= lo && !seen[e.run.ID] {
			all = append(all, e)
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].seq > all[j].seq })
	out := APIRunList{Runs: []APIRun{}}
	next := lo
	if len(all) > rq.limit {
		all = all[:rq.limit]
		next = all[len(all)-1].seq
	}
	for _, e := range all {
		out.Runs = append(out.Runs, e.run)
	}
	if next != 0 {
		out.NextCursor = strconv.FormatUint(next, 10)
	}
	return http.StatusOK, out, nil
}

// archivedErr is the answer to a change of an archived run.
func archivedErr(id core.RunID) error {
	return errorf(http.StatusConflict, "run %s already finished (archived)", id)
}

// runOfStep is the run a step id names ("run-1/name").
func runOfStep(id core.StepID) core.RunID {
	for i := 0; i < len(id); i++ {
		if id[i] == '/' {
			return core.RunID(id[:i])
		}
	}
	return ""
}
