package orchestrator_test

// Archival through the real orchestrator (SPEC §7a, §12): late reports of an
// archived lease over real sockets, the API's reads of archived runs, the
// listing's pages and filters, and restarts that load live state only.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	bolt "go.etcd.io/bbolt"

	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/adapters/store"
	"github.com/tether-run/tether/client"
	"github.com/tether-run/tether/core"
)

// archRig is a real orchestrator with the API, restartable on its file,
// whose logs are kept for inspection.
type archRig struct {
	*apiRig
	logs *lockedBuffer
}

func startArch(t *testing.T, path string) *archRig {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	t.Cleanup(cancel)
	if path == "" {
		path = filepath.Join(t.TempDir(), "tether.db")
	}
	logs := &lockedBuffer{}
	d, err := orchestrator.Start(orchestrator.Options{
		Addr: "127.0.0.1:0", StorePath: path, AdminToken: adminToken,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return &archRig{apiRig: &apiRig{t: t, ctx: ctx, d: d, path: path}, logs: logs}
}

func (r *archRig) restart() *archRig {
	r.t.Helper()
	if err := r.d.Close(); err != nil {
		r.t.Fatal(err)
	}
	return startArch(r.t, r.path)
}

// liveRuns is how many runs the core holds.
func (r *archRig) liveRuns() int {
	n := 0
	if err := r.d.Snapshot(r.ctx, func(o *core.Orchestrator) { n = len(o.RunIDs()) }); err != nil {
		r.t.Fatal(err)
	}
	return n
}

func (r *archRig) inCore(run string) bool {
	ok := false
	r.d.Snapshot(r.ctx, func(o *core.Orchestrator) { _, _, ok = o.Run(core.RunID(run)) })
	return ok
}

// dialRaw connects a hand-driven worker to the control plane.
func (r *archRig) dialRaw() rawWorker {
	r.t.Helper()
	ws, _, err := websocket.DefaultDialer.DialContext(r.ctx, "ws://"+r.d.Addr()+"/control", nil)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { ws.Close() })
	return rawWorker{r.t, ws}
}

// next reads until a message of type T arrives.
func next[T core.Msg](w rawWorker) T {
	w.t.Helper()
	for {
		if m, ok := w.recv().(T); ok {
			return m
		}
	}
}

func (r *archRig) submit(spec core.RunSpec) string {
	r.t.Helper()
	run, err := r.d.Submit(r.ctx, spec)
	if err != nil {
		r.t.Fatal(err)
	}
	return string(run)
}

func (r *archRig) showJSON(path string) []byte {
	r.t.Helper()
	return r.expect("GET", path, nil, http.StatusOK, nil)
}

// TestArchiveLateReportOverSockets: a worker's report commits its run's last
// step, and the answer is lost (the worker closes its socket right after
// sending). The run finishes and leaves the core. The worker reconnects
// listing the lease and sends the same report again: COMMITTED, from the
// closed-lease table; and again after the orchestrator restarts. The run
// and its log stay readable through the API all along.
func TestArchiveLateReportOverSockets(t *testing.T) {
	r := startArch(t, "")
	tok, err := r.d.CreateToken(r.ctx, "w1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	w := r.dialRaw()
	hello := core.Hello{Version: core.ProtocolVersion, Token: tok, Worker: "w1-0001", Name: "w1", Slots: 1, MaxDelay: time.Second}
	w.send(hello)
	cred := next[core.Welcome](w).Credential
	run := r.submit(core.RunSpec{Name: "late", Steps: []core.StepSpec{{Name: "a", Command: "echo hi"}}})
	disp := next[core.Dispatch](w)
	w.send(core.Start{Lease: disp.Lease, Request: 1})
	if ack := next[core.StartAck](w); !ack.OK {
		t.Fatalf("start refused: %+v", ack)
	}
	w.send(core.Logs{Lease: disp.Lease, Lines: []core.LogLine{{Seq: 1, At: time.Now(), Text: "hi"}}})
	next[core.LogAck](w)
	rep := core.Report{Step: disp.Step, Lease: disp.Lease, Request: 2, Outcome: core.Outcome{Status: core.OutcomeSuccess}}
	w.send(rep)
	w.ws.Close() // the answer is lost with the socket

	r.waitRun(run, "the run to succeed", func(d orchestrator.APIRunDetail) bool { return d.Status == "success" })
	if r.inCore(run) {
		t.Fatalf("%s succeeded and is still in the core", run)
	}
	logs, err := r.client().Logs(r.ctx, run, "")
	r.ok("logs", err)
	if len(logs.Lines) != 1 || logs.Lines[0].Text != "hi" {
		t.Fatalf("archived run's logs: %+v", logs)
	}
	shown := r.showJSON("/runs/" + run)

	// The worker reconnects with the lease in flight and re-sends.
	resend := func(r *archRig, when string) {
		t.Helper()
		w := r.dialRaw()
		h := hello
		h.Token, h.Credential, h.InFlight = "", cred, []core.LeaseRef{{Step: disp.Step, Lease: disp.Lease}}
		w.send(h)
		if wel := next[core.Welcome](w); len(wel.Cancel) != 0 {
			t.Fatalf("%s: Welcome cancels %v: a committed lease's answer is on its way (SPEC §7a)", when, wel.Cancel)
		}
		w.send(rep)
		if a := w.answer(disp.Lease, rep.Request); a.Verdict != core.Committed {
			t.Fatalf("%s: the re-sent report is answered %v (%s), want COMMITTED", when, a.Verdict, a.Reason)
		}
		w.ws.Close()
	}
	resend(r, "after archival")

	r = r.restart()
	if n := r.liveRuns(); n != 0 {
		t.Fatalf("after restart the core holds %d runs, want 0", n)
	}
	if !strings.Contains(r.logs.String(), "live_runs=0 archived_runs=1") {
		t.Fatalf("restore log does not count live and archived runs:\n%s", r.logs.String())
	}
	if again := r.showJSON("/runs/" + run); !bytes.Equal(again, shown) {
		t.Fatalf("after restart the run shows\n%s\nbefore\n%s", again, shown)
	}
	resend(r, "after restart")
}

// TestAPIArchivedRunSameShape shows a run just before its last report
// commits (live) and just after (archived). A finished run is never shown
// live (it leaves the core in the batch that finishes it), so the two differ
// by what that report changed and nothing else: the step finished before is
// shown byte for byte the same, the events before are a prefix of those
// after, every field shown live is shown archived, and the only new fields
// are the run's finish, the failed step's class and message, and the step
// its new events name. The logs, and the whole answer after a restart, are
// byte for byte the same.
func TestAPIArchivedRunSameShape(t *testing.T) {
	r := startArch(t, "")
	tok, err := r.d.CreateToken(r.ctx, "w1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	w := r.dialRaw()
	w.send(core.Hello{Version: core.ProtocolVersion, Token: tok, Worker: "w1-0001", Name: "w1", Slots: 1, MaxDelay: time.Second})
	next[core.Welcome](w)
	run := r.submit(core.RunSpec{Name: "shape", Steps: []core.StepSpec{
		{Name: "a", Command: "true", Writes: true},
		{Name: "b", Command: "false", DependsOn: []string{"a"}},
	}})
	finish := func(code int, req uint64) {
		d := next[core.Dispatch](w)
		w.send(core.Start{Lease: d.Lease, Request: req})
		next[core.StartAck](w)
		w.send(core.Logs{Lease: d.Lease, Lines: []core.LogLine{{Seq: 1, At: time.Unix(1700000000, 0).UTC(), Text: "out of " + string(d.Step)}}})
		next[core.LogAck](w)
		st := core.OutcomeSuccess
		if code != 0 {
			st = core.OutcomeFailure
		}
		w.send(core.Report{Step: d.Step, Lease: d.Lease, Request: req + 1, Outcome: core.Outcome{Status: st, ExitCode: code}})
		if a := w.answer(d.Lease, req+1); a.Verdict != core.Committed {
			t.Fatalf("report of %s: %v", d.Step, a.Verdict)
		}
	}
	finish(0, 1)
	var before, after orchestrator.APIRunDetail
	beforeJSON := r.showJSON("/runs/" + run)
	json.Unmarshal(beforeJSON, &before)
	logsBefore := r.showJSON("/runs/" + run + "/logs?step=a")
	if !r.inCore(run) {
		t.Fatal("the run left the core before it finished")
	}
	finish(3, 10)
	afterJSON := r.showJSON("/runs/" + run)
	json.Unmarshal(afterJSON, &after)
	if r.inCore(run) {
		t.Fatal("the failed run is still in the core")
	}
	if after.Status != "failed" || after.Run.Status != "failed" || after.Run.FinishedAt.IsZero() {
		t.Fatalf("archived run: %s", afterJSON)
	}
	if a, b := mustJSON(t, before.Steps[0]), mustJSON(t, after.Steps[0]); a != b {
		t.Fatalf("step a changed on archival:\n%s\n%s", a, b)
	}
	if !reflect.DeepEqual(before.Events, after.Events[:len(before.Events)]) {
		t.Fatalf("events before archival are not a prefix of those after:\n%s\n%s", beforeJSON, afterJSON)
	}
	// Every field shown live is shown archived; the only new ones are
	// what the last report set: the run's finish, step b's failure, and the
	// step of its events (the only event before names no step).
	live, arch := fieldsOf(t, beforeJSON), fieldsOf(t, afterJSON)
	var added []string
	for _, f := range arch {
		if !slices.Contains(live, f) {
			added = append(added, f)
		}
	}
	for _, f := range live {
		if !slices.Contains(arch, f) {
			t.Fatalf("field %s shown live is not shown archived:\n%s\n%s", f, beforeJSON, afterJSON)
		}
	}
	if w := []string{".events[].step", ".run.finished", ".steps[].class", ".steps[].message"}; !reflect.DeepEqual(added, w) {
		t.Fatalf("archival added fields %v, want %v:\n%s\n%s", added, w, beforeJSON, afterJSON)
	}
	if got := r.showJSON("/runs/" + run + "/logs?step=a"); !bytes.Equal(got, logsBefore) {
		t.Fatalf("step a's logs changed on archival:\n%s\n%s", logsBefore, got)
	}
	logsAll := r.showJSON("/runs/" + run + "/logs")
	var lg orchestrator.APILogs
	json.Unmarshal(logsAll, &lg)
	if len(lg.Lines) != 2 || lg.Lines[0].Step != run+"/a" || lg.Lines[1].Step != run+"/b" {
		t.Fatalf("archived logs: %s", logsAll)
	}
	c := r.client()
	_, err = c.Logs(r.ctx, run, "zzz")
	r.wantCode("logs of an unknown step", err, client.CodeNotFound)
	// Changes of an archived run are refused as of a finished one.
	r.wantCode("cancel of an archived run", c.Cancel(r.ctx, run, ""), client.CodeConflict)
	_, err = c.Approve(r.ctx, run+"/a")
	r.wantCode("approve in an archived run", err, client.CodeConflict)
	r.wantCode("cancel of an unknown run", c.Cancel(r.ctx, "run-99", ""), client.CodeNotFound)
	w.ws.Close()

	r = r.restart()
	if got := r.showJSON("/runs/" + run); !bytes.Equal(got, afterJSON) {
		t.Fatalf("after restart:\n%s\nbefore:\n%s", got, afterJSON)
	}
	if got := r.showJSON("/runs/" + run + "/logs"); !bytes.Equal(got, logsAll) {
		t.Fatalf("logs after restart:\n%s\nbefore:\n%s", got, logsAll)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// fieldsOf lists the JSON paths of every object field in b (array elements
// share a path), sorted.
func fieldsOf(t *testing.T, b []byte) []string {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	set := map[string]bool{}
	var walk func(string, any)
	walk = func(p string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, c := range v {
				if p == ".run.states" || p == ".steps[].states" {
					k = "*" // steps per state: the keys are data
				}
				set[p+"."+k] = true
				walk(p+"."+k, c)
			}
		case []any:
			for _, c := range v {
				walk(p+"[]", c)
			}
		}
	}
	walk("", v)
	var out []string
	for k := range set {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// listAll pages through GET /api/runs with query q and page size limit.
func (r *archRig) listAll(q string, limit int) []orchestrator.APIRun {
	r.t.Helper()
	var all []orchestrator.APIRun
	cursor := ""
	for pages := 0; ; pages++ {
		if pages > 200 {
			r.t.Fatal("GET /api/runs does not stop paging")
		}
		v, err := url.ParseQuery(strings.TrimPrefix(q, "&"))
		r.ok("query", err)
		page, err := r.client().Runs(r.ctx, client.RunsOptions{Limit: limit, Cursor: cursor, Status: v.Get("status"), Name: v.Get("name"), Since: v.Get("since")})
		r.ok("runs", err)
		if len(page.Runs) > limit {
			r.t.Fatalf("a page of %d runs, limit %d", len(page.Runs), limit)
		}
		all = append(all, page.Runs...)
		if page.NextCursor == "" {
			return all
		}
		cursor = page.NextCursor
	}
}

func ids(runs []orchestrator.APIRun) []string {
	out := []string{}
	for _, r := range runs {
		out = append(out, r.ID)
	}
	return out
}

// TestAPIRunsListing: live and archived runs listed newest first, without
// duplicates or gaps across pages (also when a run is archived between two
// page reads), filtered by status, name and time; bad parameters are
// refused naming the parameter; and a restart loads no archived run.
func TestAPIRunsListing(t *testing.T) {
	r := startArch(t, "")
	const n = 30
	var want []string // newest first
	for i := 1; i <= n; i++ {
		name := "build"
		if i%4 == 0 {
			name = "deploy"
		}
		// No worker: steps stay queued and the run live until cancelled.
		run := r.submit(core.RunSpec{Name: name, Steps: []core.StepSpec{{Name: "a", Command: "true"}}})
		want = append([]string{run}, want...)
	}
	cancel := func(run string) {
		t.Helper()
		r.ok("cancel "+run, r.client().Cancel(r.ctx, run, ""))
	}
	for i := 3; i <= n; i += 3 { // 10 runs archived, cancelled
		cancel(fmt.Sprintf("run-%d", i))
	}
	if got := r.liveRuns(); got != n-10 {
		t.Fatalf("%d live runs, want %d", got, n-10)
	}
	for _, limit := range []int{1, 7, 30, 1000} {
		if got := ids(r.listAll("", limit)); !reflect.DeepEqual(got, want) {
			t.Fatalf("limit %d: %v\nwant %v", limit, got, want)
		}
	}
	def, err := r.client().Runs(r.ctx, client.RunsOptions{})
	r.ok("runs", err)
	if len(def.Runs) != n || def.NextCursor != "" {
		t.Fatalf("default page: %d runs, next %q", len(def.Runs), def.NextCursor)
	}
	// Filters.
	count := func(q string, want int, check func(orchestrator.APIRun) bool) {
		t.Helper()
		got := r.listAll(q, 4)
		if len(got) != want {
			t.Fatalf("%s: %d runs %v, want %d", q, len(got), ids(got), want)
		}
		for _, run := range got {
			if !check(run) {
				t.Fatalf("%s: %+v", q, run)
			}
		}
	}
	count("&status=cancelled", 10, func(a orchestrator.APIRun) bool { return a.Status == "cancelled" && !a.FinishedAt.IsZero() })
	count("&status=running", 20, func(a orchestrator.APIRun) bool { return a.Status == "running" })
	count("&name=deploy", 7, func(a orchestrator.APIRun) bool { return a.Name == "deploy" })
	count("&name=deploy&status=cancelled", 2, func(a orchestrator.APIRun) bool { return a.Name == "deploy" && a.Status == "cancelled" })
	count("&since=1h", n, func(orchestrator.APIRun) bool { return true })
	count("&since="+time.Now().Add(time.Hour).UTC().Format(time.RFC3339), 0, nil)
	for q, param := range map[string]string{
		"limit=0": "limit", "limit=1001": "limit", "limit=x": "limit", "cursor=abc": "cursor", "cursor=0": "cursor",
		"status=done": "status", "since=yesterday": "since", "since=-1h": "since",
	} {
		b := r.expect("GET", "/runs?"+q, nil, http.StatusBadRequest, nil)
		if !strings.Contains(string(b), param) {
			t.Fatalf("?%s: %s does not name %s", q, b, param)
		}
	}

	// A run archived between two page reads is listed once.
	p1, err := r.client().Runs(r.ctx, client.RunsOptions{Limit: 5})
	r.ok("runs", err)
	if ids(p1.Runs)[4] != "run-26" || p1.NextCursor == "" {
		t.Fatalf("first page %v next %q", ids(p1.Runs), p1.NextCursor)
	}
	cancel("run-29") // on page 1, live → archived
	cancel("run-25") // on page 2
	p2, err := r.client().Runs(r.ctx, client.RunsOptions{Limit: 5, Cursor: p1.NextCursor})
	r.ok("runs", err)
	if got, w := ids(p2.Runs), want[5:10]; !reflect.DeepEqual(got, w) {
		t.Fatalf("second page %v, want %v", got, w)
	}
	if p2.Runs[0].Status != "cancelled" {
		t.Fatalf("run-25 on page 2: %+v", p2.Runs[0])
	}

	// A restart loads live runs only; the archived ones are listed as before.
	before := r.listAll("", 9)
	r = r.restart()
	if got := r.liveRuns(); got != n-12 {
		t.Fatalf("after restart the core holds %d runs, want %d", got, n-12)
	}
	if !strings.Contains(r.logs.String(), fmt.Sprintf("live_runs=%d archived_runs=12", n-12)) {
		t.Fatalf("restore log:\n%s", r.logs.String())
	}
	if after := r.listAll("", 9); !reflect.DeepEqual(mustJSON(t, after), mustJSON(t, before)) {
		t.Fatalf("listing after restart differs:\n%v\n%v", ids(after), ids(before))
	}
}

// TestRestoreOldLayoutStore opens a store in the layout before archival:
// one bucket "records" holding every record, finished runs among the live
// ones, log lines beside them. It is built here from a run that finished on
// this orchestrator: its history turned back into the run, step, lease and
// event records the core wrote before archival. Open moves the log lines
// out of "records"; Restore archives the finished run in its first batch;
// the API then shows it exactly as before, and the core holds no run.
func TestRestoreOldLayoutStore(t *testing.T) {
	dir := t.TempDir()
	r := startArch(t, filepath.Join(dir, "new.db"))
	tok, err := r.d.CreateToken(r.ctx, "w1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	w := r.dialRaw()
	w.send(core.Hello{Version: core.ProtocolVersion, Token: tok, Worker: "w1-0001", Name: "w1", Slots: 1, MaxDelay: time.Second})
	next[core.Welcome](w)
	run := r.submit(core.RunSpec{Name: "old", Steps: []core.StepSpec{{Name: "a", Command: "true"}}})
	d := next[core.Dispatch](w)
	w.send(core.Start{Lease: d.Lease, Request: 1})
	next[core.StartAck](w)
	w.send(core.Logs{Lease: d.Lease, Lines: []core.LogLine{{Seq: 1, At: time.Unix(1700000000, 0).UTC(), Text: "old line"}}})
	next[core.LogAck](w)
	w.send(core.Report{Step: d.Step, Lease: d.Lease, Request: 2, Outcome: core.Outcome{Status: core.OutcomeSuccess}})
	w.answer(d.Lease, 2)
	w.ws.Close()
	shown := r.showJSON("/runs/" + run)
	logs := r.showJSON("/runs/" + run + "/logs")
	r.submit(core.RunSpec{Name: "live", Steps: []core.StepSpec{{Name: "x", Command: "true", Target: "nobody"}}})
	if err := r.d.Close(); err != nil {
		t.Fatal(err)
	}

	// The old layout: the live records (no closed-lease table: it came
	// with archival), the finished run's records, and its log lines.
	st, err := store.Open(filepath.Join(dir, "new.db"))
	if err != nil {
		t.Fatal(err)
	}
	recs, err := st.Load()
	if err != nil {
		t.Fatal(err)
	}
	h, err := st.History(core.RunID(run))
	if err != nil {
		t.Fatal(err)
	}
	var lease []core.LeaseID
	for _, l := range h.Leases {
		lease = append(lease, l.ID)
	}
	lines, _, err := st.HistoryLogs(lease, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	old := map[string]any{}
	for _, rec := range recs {
		if !strings.HasPrefix(rec.Key, core.KindClosed+"/") {
			old[rec.Key] = json.RawMessage(rec.Value)
		}
	}
	old["run/"+run] = h.Run
	for _, s := range h.Steps {
		old["step/"+string(s.ID)] = s
	}
	for _, l := range h.Leases {
		old[leaseKey(l.ID)] = l
	}
	for _, ev := range h.Events {
		old[fmt.Sprintf("event/%s/%08d", run, ev.Seq)] = ev
	}
	for _, ln := range lines {
		old[fmt.Sprintf("log/%020d/%010d", ln.Lease, ln.Index)] = ln
	}
	oldPath := filepath.Join(dir, "old.db")
	db, err := bolt.Open(oldPath, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket([]byte("records"))
		if err != nil {
			return err
		}
		for k, v := range old {
			js, err := json.Marshal(v)
			if err != nil {
				return err
			}
			if err := b.Put([]byte(k), js); err != nil {
				return err
			}
		}
		return nil
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}

	r = startArch(t, oldPath)
	if n := r.liveRuns(); n != 1 {
		t.Fatalf("the old store restored %d live runs, want 1 (run-2, unfinished)", n)
	}
	if !strings.Contains(r.logs.String(), "live_runs=1 archived_runs=1") {
		t.Fatalf("restore log:\n%s", r.logs.String())
	}
	if got := r.showJSON("/runs/" + run); !bytes.Equal(got, shown) {
		t.Fatalf("migrated run shows\n%s\nwant\n%s", got, shown)
	}
	if got := r.showJSON("/runs/" + run + "/logs"); !bytes.Equal(got, logs) {
		t.Fatalf("migrated run's logs\n%s\nwant\n%s", got, logs)
	}
	if got := ids(r.listAll("", 1)); !reflect.DeepEqual(got, []string{"run-2", run}) {
		t.Fatalf("listing %v", got)
	}
	if err := r.d.Close(); err != nil {
		t.Fatal(err)
	}
	db, err = bolt.Open(oldPath, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.View(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("records")).ForEach(func(k, _ []byte) error {
			if s := string(k); strings.HasPrefix(s, "log/") || strings.HasPrefix(s, "history/") || strings.HasSuffix(s, "/"+run) || strings.HasPrefix(s, "step/"+run+"/") || strings.HasPrefix(s, "event/"+run+"/") {
				t.Errorf("after migration and restore, records still holds %s", s)
			}
			return nil
		})
	})
}

// TestHistorySizeOf500Steps archives a run of 500 steps, each with a lease,
// a START, a log line and a committed report, and reports its history
// record's size as the core wrote it (JSON) and as the store keeps it
// (flate, BestSpeed).
func TestHistorySizeOf500Steps(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tether.db")
	bst, err := store.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	st := &sizeStore{Store: bst}
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	d, err := orchestrator.Start(orchestrator.Options{Addr: "127.0.0.1:0", Store: st, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	r := &archRig{apiRig: &apiRig{t: t, ctx: ctx, d: d, path: path}}
	tok, err := d.CreateToken(ctx, "w1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	w := r.dialRaw()
	w.send(core.Hello{Version: core.ProtocolVersion, Token: tok, Worker: "w1-0001", Name: "w1", Slots: 500, MaxDelay: time.Second})
	next[core.Welcome](w)
	spec := core.RunSpec{Name: "big"}
	for i := range 500 {
		spec.Steps = append(spec.Steps, core.StepSpec{Name: fmt.Sprintf("step-%03d", i), Command: "make -C build target-" + fmt.Sprint(i)})
	}
	run := r.submit(spec)
	var ds []core.Dispatch
	for len(ds) < 500 {
		ds = append(ds, next[core.Dispatch](w))
	}
	for i, dp := range ds {
		w.send(core.Start{Lease: dp.Lease, Request: uint64(3 * i)})
		w.send(core.Logs{Lease: dp.Lease, Lines: []core.LogLine{{Seq: 1, At: time.Now(), Text: "built " + string(dp.Step)}}})
	}
	for range ds {
		next[core.LogAck](w)
	}
	for i, dp := range ds {
		w.send(core.Report{Step: dp.Step, Lease: dp.Lease, Request: uint64(3*i + 1), Outcome: core.Outcome{Status: core.OutcomeSuccess}})
	}
	for range ds {
		next[core.Answer](w)
	}
	w.ws.Close()
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var stored int
	db.View(func(tx *bolt.Tx) error {
		stored = len(tx.Bucket([]byte("history")).Get([]byte(run)))
		return nil
	})
	if st.json == 0 || stored == 0 {
		t.Fatalf("no history of %s: JSON %d bytes, stored %d", run, st.json, stored)
	}
	t.Logf("500-step run's history: JSON %d bytes, stored %d bytes (%.1f%%, %d bytes per step)", st.json, stored, 100*float64(stored)/float64(st.json), stored/500)
	if stored >= st.json/2 {
		t.Fatalf("stored %d of %d bytes", stored, st.json)
	}
}

// sizeStore notes the size of the history records it applies.
type sizeStore struct {
	*store.Store
	json int
}

func (s *sizeStore) Apply(recs []core.Record) error {
	for _, r := range recs {
		if core.IsHistoryKey(r.Key) {
			s.json += len(r.Value)
		}
	}
	return s.Store.Apply(recs)
}
