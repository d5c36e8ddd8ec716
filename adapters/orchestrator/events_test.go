package orchestrator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/adapters/store"
	"github.com/tether-run/tether/client"
	"github.com/tether-run/tether/core"
)

// sseEvent is one event read from a live stream.
type sseEvent struct{ kind, id, data string }

// sseStream reads a live stream (SPEC §17) on a goroutine of its own.
type sseStream struct {
	t      *testing.T
	ctx    context.Context
	cancel context.CancelFunc
	ch     chan sseEvent // closed at the end of the body
}

// openStream opens GET path (under /api) with the admin token and, if set,
// Last-Event-ID; it fails the test unless the answer is 200.
func openStream(t *testing.T, ctx context.Context, d *orchestrator.Driver, path, lastID string) *sseStream {
	t.Helper()
	code, body, s := tryStream(t, ctx, d, path, lastID)
	if code != http.StatusOK {
		t.Fatalf("GET %s: HTTP %d %s", path, code, body)
	}
	return s
}

// tryStream is openStream that returns a refusal's status and body.
func tryStream(t *testing.T, ctx context.Context, d *orchestrator.Driver, path, lastID string) (int, string, *sseStream) {
	t.Helper()
	return tryStreamWith(t, ctx, http.DefaultClient, d, path, lastID)
}

// tryStreamWith is tryStream with an HTTP client of the caller's (HTTP/2);
// it reads the stream with package client's reader.
func tryStreamWith(t *testing.T, ctx context.Context, hc *http.Client, d *orchestrator.Driver, path, lastID string) (int, string, *sseStream) {
	t.Helper()
	c, err := client.New(d.APIURL(), adminToken, client.WithHTTPClient(hc))
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	var es *client.EventStream
	if path == "/events" {
		es, err = c.Events(sctx, lastID)
	} else {
		es, err = c.RunEvents(sctx, strings.TrimSuffix(strings.TrimPrefix(path, "/runs/"), "/events"), lastID)
	}
	if err != nil {
		cancel()
		var ce *client.Error
		if !errors.As(err, &ce) {
			t.Fatalf("GET %s: %v", path, err)
		}
		return ce.Status, ce.Message, nil
	}
	s := &sseStream{t: t, ctx: ctx, cancel: cancel, ch: make(chan sseEvent, 1<<16)}
	go func() {
		defer close(s.ch)
		defer es.Close()
		for {
			e, err := es.Next()
			if err != nil {
				return
			}
			s.ch <- sseEvent{kind: e.Kind, id: e.ID, data: string(e.Data)}
		}
	}()
	t.Cleanup(cancel)
	return http.StatusOK, "", s
}

// next returns the next event; false at the end of the stream.
func (s *sseStream) next() (sseEvent, bool) {
	s.t.Helper()
	select {
	case e, ok := <-s.ch:
		return e, ok
	case <-s.ctx.Done():
		s.t.Fatalf("waiting for a stream event: %v", s.ctx.Err())
	}
	return sseEvent{}, false
}

// until reads events until one satisfies stop (returned last), failing if
// the stream ends first.
func (s *sseStream) until(what string, stop func(sseEvent) bool) []sseEvent {
	s.t.Helper()
	var got []sseEvent
	for {
		e, ok := s.next()
		if !ok {
			s.t.Fatalf("the stream ended before %s; got %v", what, got)
		}
		got = append(got, e)
		if stop(e) {
			return got
		}
	}
}

// rest reads events until the stream ends.
func (s *sseStream) rest() []sseEvent {
	s.t.Helper()
	var got []sseEvent
	for {
		e, ok := s.next()
		if !ok {
			return got
		}
		got = append(got, e)
	}
}

func decode[T any](t *testing.T, e sseEvent) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(e.data), &v); err != nil {
		t.Fatalf("event %s data %q: %v", e.kind, e.data, err)
	}
	return v
}

// recvMsg returns the next message of type T, skipping log acks.
func recvMsg[T core.Msg](w rawWorker) T {
	w.t.Helper()
	for {
		m := w.recv()
		if v, ok := m.(T); ok {
			return v
		}
		if _, ok := m.(core.LogAck); !ok {
			w.t.Fatalf("want a %T, got %s", *new(T), core.DescribeMsg(m))
		}
	}
}

// rawFleetWorker enrolls a worker that speaks the protocol by hand.
func rawFleetWorker(t *testing.T, ctx context.Context, d *orchestrator.Driver, name string) rawWorker {
	t.Helper()
	tok, err := d.CreateToken(ctx, name, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	ws, _, err := websocket.DefaultDialer.DialContext(ctx, d.URL(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	w := rawWorker{t, ws}
	w.send(core.Hello{Version: core.ProtocolVersion, Token: tok, Worker: core.WorkerID(name), Slots: 1, MaxDelay: time.Second})
	recvMsg[core.Welcome](w)
	return w
}

func lines(from int, texts ...string) []core.LogLine {
	out := make([]core.LogLine, len(texts))
	for i, s := range texts {
		out[i] = core.LogLine{Seq: uint64(from + i), At: time.Now(), Text: s}
	}
	return out
}

// A run's stream: the snapshot first, then its steps' state changes live
// in commit order, its log lines with a gap marker where the worker put
// one, and "end" once the run is archived, after which the stream closes.
// A client that reconnects with Last-Event-ID hears every line and server
// event exactly once over both connections.
func TestRunStream(t *testing.T) {
	r := startAPI(t)
	ctx, d := r.ctx, r.d
	w := rawFleetWorker(t, ctx, d, "raw-1")
	run, err := d.Submit(ctx, core.RunSpec{Name: "live", Steps: []core.StepSpec{
		{Name: "a", Command: "x", Writes: true}, {Name: "b", Command: "x", DependsOn: []string{"a"}, Writes: true}}})
	if err != nil {
		t.Fatal(err)
	}
	s1 := openStream(t, ctx, d, "/runs/"+string(run)+"/events", "")
	// The snapshot: both steps, then the run.
	snap := s1.until("the run's status", func(e sseEvent) bool { return e.kind == "run" })
	if len(snap) != 3 || snap[0].kind != "step" || snap[1].kind != "step" || snap[0].id == "" {
		t.Fatalf("snapshot %v: want two steps then the run, with ids", snap)
	}
	if st := decode[orchestrator.StreamStep](t, snap[1]); st.Step != string(run)+"/b" || st.State != "pending" {
		t.Errorf("snapshot of b: %+v, want pending", st)
	}

	dm := recvMsg[core.Dispatch](w)
	w.send(core.Start{Lease: dm.Lease, Request: 1})
	recvMsg[core.StartAck](w)
	w.send(core.Logs{Lease: dm.Lease, Lines: lines(1, "one", "two")})
	gap := core.LogLine{Seq: 0, At: time.Now(), Text: core.GapMarker(3, 0, 2)}
	w.send(core.Logs{Lease: dm.Lease, Lines: []core.LogLine{gap}})
	w.send(core.Logs{Lease: dm.Lease, Lines: lines(3, "three")})
	got := s1.until("line three", func(e sseEvent) bool { return e.kind == "log" && strings.Contains(e.data, `"three"`) })
	var states []string
	var texts []string
	for _, e := range got {
		switch e.kind {
		case "step":
			if st := decode[orchestrator.StreamStep](t, e); st.Step == string(dm.Step) {
				states = append(states, st.State)
				if st.State == "running" && (st.Lease != uint64(dm.Lease) || st.Worker != "raw-1" || st.StartedAt.IsZero() || st.Attempts != 1) {
					t.Errorf("running step event %+v: want lease %d, worker raw-1, attempts 1, started_at", st, dm.Lease)
				}
			}
		case "log":
			texts = append(texts, decode[orchestrator.StreamLine](t, e).Text)
		case "gap":
			g := decode[orchestrator.StreamLine](t, e)
			if g.Text != gap.Text || g.Lease != uint64(dm.Lease) || g.Step != string(dm.Step) || g.Seq != 0 {
				t.Errorf("gap event %+v: want the marker of lease %d", g, dm.Lease)
			}
			texts = append(texts, "GAP")
		}
	}
	if strings.Join(texts, "|") != "one|two|GAP|three" {
		t.Errorf("lines %q, want one, two, the gap marker, three", texts)
	}
	if strings.Join(states, ",") != "queued,running" && strings.Join(states, ",") != "running" {
		t.Errorf("step a went %v live, want queued then running", states)
	}

	// The client goes away; more happens; it comes back with its last id.
	last := got[len(got)-1].id
	s1.cancel()
	w.send(core.Logs{Lease: dm.Lease, Lines: lines(4, "four", "five")})
	w.send(core.Report{Step: dm.Step, Lease: dm.Lease, Request: 2, Outcome: core.Outcome{Status: core.OutcomeSuccess}})
	recvMsg[core.Answer](w)
	db := recvMsg[core.Dispatch](w)
	w.send(core.Start{Lease: db.Lease, Request: 3})
	recvMsg[core.StartAck](w)
	w.send(core.Logs{Lease: db.Lease, Lines: lines(1, "b-one")})
	s2 := openStream(t, ctx, d, "/runs/"+string(run)+"/events", last)
	got2 := s2.until("b's line", func(e sseEvent) bool { return e.kind == "log" && strings.Contains(e.data, `"b-one"`) })
	w.send(core.Logs{Lease: db.Lease, Lines: lines(2, "b-two")})
	w.send(core.Report{Step: db.Step, Lease: db.Lease, Request: 4, Outcome: core.Outcome{Status: core.OutcomeFailure, ExitCode: 3}})
	recvMsg[core.Answer](w)
	got2 = append(got2, s2.rest()...)
	if len(got2) == 0 || got2[len(got2)-1].kind != "end" {
		t.Fatalf("the resumed stream did not end with end: %v", got2)
	}
	if end := decode[orchestrator.StreamEnd](t, got2[len(got2)-1]); end.Status != "failed" {
		t.Errorf("end %+v, want failed", end)
	}
	var bStates []string
	for _, e := range got2 {
		switch e.kind {
		case "log", "gap":
			texts = append(texts, decode[orchestrator.StreamLine](t, e).Text)
		case "step":
			if st := decode[orchestrator.StreamStep](t, e); st.Step == string(db.Step) {
				bStates = append(bStates, st.State)
				if st.State == "failed" && (st.Exit == nil || *st.Exit != 3 || st.FinishedAt.IsZero()) {
					t.Errorf("failed step event %+v: want exit 3 and finished_at", st)
				}
			}
		}
	}
	if want := "one|two|GAP|three|four|five|b-one|b-two"; strings.Join(texts, "|") != want {
		t.Errorf("lines over both connections %q, want %s: each exactly once, in order", texts, want)
	}
	if n := len(bStates); n == 0 || bStates[n-1] != "failed" {
		t.Errorf("step b's states %v: want it to end failed", bStates)
	}
	// Server events: exactly the run's, once each, over both connections.
	var det orchestrator.APIRunDetail
	r.expect("GET", "/runs/"+string(run), nil, http.StatusOK, &det)
	var seqs []int
	for _, e := range append(append(snap, got...), got2...) {
		if e.kind == "server" {
			seqs = append(seqs, decode[orchestrator.StreamServerEvent](t, e).Seq)
		}
	}
	if len(det.Events) == 0 || len(seqs) != len(det.Events) {
		t.Fatalf("server events seen %v, the run has %d", seqs, len(det.Events))
	}
	for i, ev := range det.Events {
		if seqs[i] != ev.Seq {
			t.Fatalf("server events seen %v, want %d..: each once, in order", seqs, det.Events[0].Seq)
		}
	}

	// The archived run streams from history, then ends; an id from the live
	// stream resumes it too (nothing after it: just the states and end).
	s3 := openStream(t, ctx, d, "/runs/"+string(run)+"/events", "")
	all := s3.rest()
	var n int
	for _, e := range all {
		if e.kind == "log" || e.kind == "gap" {
			n++
		}
	}
	if n != 8 || all[len(all)-1].kind != "end" {
		t.Errorf("archived run streamed %d lines and ended with %q, want 8 and end", n, all[len(all)-1].kind)
	}
	s4 := openStream(t, ctx, d, "/runs/"+string(run)+"/events", got2[len(got2)-1].id)
	for _, e := range s4.rest() {
		if e.kind != "step" && e.kind != "run" && e.kind != "end" {
			t.Errorf("resumed at the end, the archived run sent %s %s again", e.kind, e.data)
		}
	}
}

// The errors: unknown run 404, a bad Last-Event-ID 400, POST 405, no token
// 401, and the cap on streams 503 (the place comes back when one closes).
func TestStreamRefusals(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	d, err := orchestrator.Start(orchestrator.Options{Addr: "127.0.0.1:0", StorePath: filepath.Join(t.TempDir(), "tether.db"),
		Logger: testLogger(t), AdminToken: adminToken, MaxEventStreams: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	r := &apiRig{t: t, ctx: ctx, d: d}
	if code, body := r.do("GET", "/runs/run-404/events", nil, nil); code != http.StatusNotFound || !strings.Contains(string(body), "unknown run") {
		t.Errorf("unknown run: HTTP %d %s", code, body)
	}
	if code, body, _ := tryStream(t, ctx, d, "/events", "nonsense"); code != http.StatusBadRequest || !strings.Contains(body, "Last-Event-ID") {
		t.Errorf("bad Last-Event-ID: HTTP %d %s", code, body)
	}
	if code, body := r.do("POST", "/events", nil, nil); code != http.StatusMethodNotAllowed {
		t.Errorf("POST /events: HTTP %d %s", code, body)
	}
	none := ""
	if code, _ := r.do("GET", "/events", nil, &none); code != http.StatusUnauthorized {
		t.Errorf("no token: HTTP %d", code)
	}
	a := openStream(t, ctx, d, "/events", "")
	openStream(t, ctx, d, "/events", "")
	code, body, _ := tryStream(t, ctx, d, "/events", "")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "too many live event streams") || !strings.Contains(body, "limit is 2") {
		t.Errorf("third stream over a cap of 2: HTTP %d %s", code, body)
	}
	a.cancel()
	for {
		code, _, s := tryStream(t, ctx, d, "/events", "")
		if code == http.StatusOK {
			s.cancel()
			break
		}
		select { // the handler gives the place back once it sees the client go
		case <-ctx.Done():
			t.Fatal("a closed stream's place never came back")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// The server stream: runs' states, server events and workers live; a
// reconnect with Last-Event-ID replays the server events after it, once.
func TestServerStream(t *testing.T) {
	r := startAPI(t)
	ctx, d := r.ctx, r.d
	s1 := openStream(t, ctx, d, "/events", "")
	w := rawFleetWorker(t, ctx, d, "raw-s")
	got := s1.until("the worker", func(e sseEvent) bool { return e.kind == "worker" })
	if v := decode[orchestrator.StreamWorker](t, got[len(got)-1]); v.Worker != "raw-s" || v.State != "connected" || v.Slots != 1 {
		t.Errorf("worker event %+v", v)
	}
	run, err := d.Submit(ctx, core.RunSpec{Name: "srv", Steps: []core.StepSpec{{Name: "a", Command: "x", Writes: true}}})
	if err != nil {
		t.Fatal(err)
	}
	dm := recvMsg[core.Dispatch](w)
	got = s1.until("the worker's lease", func(e sseEvent) bool {
		return e.kind == "worker" && decode[orchestrator.StreamWorker](t, e).Leases == 1
	})
	last := got[len(got)-1].id
	s1.cancel()
	w.send(core.Start{Lease: dm.Lease, Request: 1})
	recvMsg[core.StartAck](w)
	w.send(core.Report{Step: dm.Step, Lease: dm.Lease, Request: 2, Outcome: core.Outcome{Status: core.OutcomeSuccess}})
	recvMsg[core.Answer](w)
	s2 := openStream(t, ctx, d, "/events", last)
	got2 := s2.until("the run's end", func(e sseEvent) bool {
		return e.kind == "run" && decode[orchestrator.StreamRun](t, e).Finished
	})
	if v := decode[orchestrator.StreamRun](t, got2[len(got2)-1]); v.Run != string(run) || v.Status != "success" {
		t.Errorf("final run event %+v", v)
	}
	var det orchestrator.APIRunDetail
	r.expect("GET", "/runs/"+string(run), nil, http.StatusOK, &det)
	var seqs []string
	for _, e := range append(got, got2...) {
		if e.kind == "server" {
			v := decode[orchestrator.StreamServerEvent](t, e)
			seqs = append(seqs, fmt.Sprintf("%s#%d", v.Run, v.Seq))
		}
	}
	var want []string
	for _, ev := range det.Events {
		want = append(want, fmt.Sprintf("%s#%d", run, ev.Seq))
	}
	if strings.Join(seqs, ",") != strings.Join(want, ",") {
		t.Errorf("server events seen %v, want %v: each once, in order", seqs, want)
	}
	// An id of another start cannot be resumed from: the stream says so.
	s3 := openStream(t, ctx, d, "/events", "zzz.5")
	if got := s3.until("lost", func(e sseEvent) bool { return e.kind == "lost" }); len(got) == 0 {
		t.Error("no lost event")
	}
}

// followRun reads a run's stream to its end as a client should: when the
// stream closes before "end" it reconnects with the last id it saw.
func followRun(t *testing.T, ctx context.Context, d *orchestrator.Driver, run core.RunID) (all []sseEvent, reconnects int) {
	t.Helper()
	last := ""
	for {
		s := openStream(t, ctx, d, "/runs/"+string(run)+"/events", last)
		got := s.rest()
		all = append(all, got...)
		if n := len(got); n > 0 {
			last = got[n-1].id
			if got[n-1].kind == "end" {
				return all, reconnects
			}
		}
		reconnects++
	}
}

// A client that stops reading is dropped once its queue is full: its
// stream closes without "end" (it would resume by Last-Event-ID), while the
// loop goes on: another client of the same run hears every line once and
// the end, and another run finishes meanwhile.
func TestStreamSlowClientDropped(t *testing.T) {
	r := startAPI(t)
	ctx, d := r.ctx, r.d
	w := rawFleetWorker(t, ctx, d, "raw-slow")
	run, err := d.Submit(ctx, core.RunSpec{Name: "loud", Steps: []core.StepSpec{{Name: "a", Command: "x", Writes: true}}})
	if err != nil {
		t.Fatal(err)
	}
	dm := recvMsg[core.Dispatch](w)
	w.send(core.Start{Lease: dm.Lease, Request: 1})
	recvMsg[core.StartAck](w)

	// The stalled client: a small receive buffer, and it reads nothing.
	dialer := &net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	stalled := &http.Client{Transport: &http.Transport{DialContext: dialer.DialContext}}
	req, _ := http.NewRequestWithContext(ctx, "GET", d.APIURL()+"/runs/"+string(run)+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := stalled.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("stalled client: %v %v", resp, err)
	}
	defer resp.Body.Close()

	followed := make(chan []sseEvent, 1)
	go func() {
		all, n := followRun(t, ctx, d, run)
		t.Logf("the reading client reconnected %d times", n)
		followed <- all
	}()
	// Far more than the stalled client's socket buffers and queue hold.
	const msgs, per = 10, 800
	pad := strings.Repeat("x", 900)
	for m := range msgs {
		texts := make([]string, per)
		for i := range texts {
			texts[i] = fmt.Sprintf("%05d %s", m*per+i, pad)
		}
		w.send(core.Logs{Lease: dm.Lease, Lines: lines(1+m*per, texts...)})
		recvMsg[core.LogAck](w)
	}
	// Another run is submitted and finishes while the stalled client waits.
	other, err := d.Submit(ctx, core.RunSpec{Name: "other", Steps: []core.StepSpec{{Name: "a", Command: "x", Writes: true}}})
	if err != nil {
		t.Fatal(err)
	}
	w.send(core.Report{Step: dm.Step, Lease: dm.Lease, Request: 2, Outcome: core.Outcome{Status: core.OutcomeSuccess}})
	recvMsg[core.Answer](w)
	do := recvMsg[core.Dispatch](w)
	w.send(core.Start{Lease: do.Lease, Request: 3})
	recvMsg[core.StartAck](w)
	w.send(core.Report{Step: do.Step, Lease: do.Lease, Request: 4, Outcome: core.Outcome{Status: core.OutcomeSuccess}})
	recvMsg[core.Answer](w)
	r.waitRun(string(other), "the other run", func(det orchestrator.APIRunDetail) bool { return det.Status == "success" })

	var all []sseEvent
	select {
	case all = <-followed:
	case <-ctx.Done():
		t.Fatal("the reading client never heard the end")
	}
	next := 0
	for _, e := range all {
		if e.kind != "log" {
			continue
		}
		l := decode[orchestrator.StreamLine](t, e)
		if want := fmt.Sprintf("%05d ", next); !strings.HasPrefix(l.Text, want) {
			t.Fatalf("the reading client's line %d is %.10q: want every line once, in order", next, l.Text)
		}
		next++
	}
	if next != msgs*per {
		t.Fatalf("the reading client heard %d lines, want %d", next, msgs*per)
	}

	// Now the stalled client reads: what was queued, then the stream's end
	// without "end" (it was dropped, not finished).
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the stalled stream: %v", err)
	}
	if strings.Contains(string(b), "event: end\n") {
		t.Fatalf("the stalled client was never dropped: its stream ran to the end (%d bytes)", len(b))
	}
	if !strings.Contains(string(b), "event: log\n") {
		t.Fatalf("the stalled stream holds no line at all: %.200q", b)
	}
}

// What a stream says is durable when the client hears it (SPEC §11): the
// step's state, the log line, the run's history.
func TestStreamWriteAhead(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	st, d := startSlow(t, adminToken)
	defer d.Close()
	w := rawFleetWorker(t, ctx, d, "raw-wa")
	run, err := d.Submit(ctx, core.RunSpec{Name: "wa", Steps: []core.StepSpec{{Name: "a", Command: "x", Writes: true}}})
	if err != nil {
		t.Fatal(err)
	}
	s := openStream(t, ctx, d, "/runs/"+string(run)+"/events", "")
	s.until("the snapshot", func(e sseEvent) bool { return e.kind == "run" })
	dm := recvMsg[core.Dispatch](w)
	// One thing at a time, each checked the moment the stream tells it.
	w.send(core.Start{Lease: dm.Lease, Request: 1})
	s.until("running", func(e sseEvent) bool {
		return e.kind == "step" && decode[orchestrator.StreamStep](t, e).State == "running"
	})
	if rec, _ := st.get(t, "step/"+string(dm.Step)).(*core.StepRecord); rec == nil || rec.State != core.StateRunning {
		t.Fatalf("the stream said %s is running before that was durable", dm.Step)
	}
	w.send(core.Logs{Lease: dm.Lease, Lines: lines(1, "hello")})
	ev := s.until("the line", func(e sseEvent) bool { return e.kind == "log" })
	if v := decode[orchestrator.StreamLine](t, ev[len(ev)-1]); st.get(t, fmt.Sprintf("%s/%020d/%010d", core.KindLog, v.Lease, v.Index)) == nil {
		t.Fatalf("the stream sent line %q before it was durable", v.Text)
	}
	w.send(core.Report{Step: dm.Step, Lease: dm.Lease, Request: 2, Outcome: core.Outcome{Status: core.OutcomeSuccess}})
	s.until("the end", func(e sseEvent) bool { return e.kind == "end" })
	if st.get(t, core.HistoryKey(run)) == nil {
		t.Fatal("the stream ended the run before its history was durable")
	}
}

// A stream over HTTP/2 (h2c) carries events as they happen, and a graceful
// Shutdown ends it rather than waiting for it.
func TestStreamH2AndShutdown(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	d, err := orchestrator.Start(orchestrator.Options{Addr: "127.0.0.1:0", StorePath: filepath.Join(t.TempDir(), "tether.db"),
		Logger: testLogger(t), AdminToken: adminToken})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	code, body, s := tryStreamWith(t, ctx, &http.Client{Transport: tr}, d, "/events", "")
	if code != http.StatusOK {
		t.Fatalf("h2c stream: HTTP %d %s", code, body)
	}
	run, err := d.Submit(ctx, core.RunSpec{Name: "h2", Steps: []core.StepSpec{{Name: "a", Command: "x"}}})
	if err != nil {
		t.Fatal(err)
	}
	got := s.until("the run", func(e sseEvent) bool { return e.kind == "run" })
	if v := decode[orchestrator.StreamRun](t, got[len(got)-1]); v.Run != string(run) || v.Status != "running" {
		t.Errorf("run event %+v", v)
	}
	if err := d.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown with a stream open: %v", err)
	}
	s.rest() // the stream ends
}

// A run stream's id names durable data, so it resumes across a restart of
// the orchestrator: the lines and server events after it, none before.
func TestRunStreamResumesAcrossRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	path := filepath.Join(t.TempDir(), "tether.db")
	start := func() *orchestrator.Driver {
		d, err := orchestrator.Start(orchestrator.Options{Addr: "127.0.0.1:0", StorePath: path, Logger: testLogger(t), AdminToken: adminToken})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	d1 := start()
	defer d1.Close()
	w := rawFleetWorker(t, ctx, d1, "raw-r")
	run, err := d1.Submit(ctx, core.RunSpec{Name: "restart", Steps: []core.StepSpec{{Name: "a", Command: "x", Writes: true}}})
	if err != nil {
		t.Fatal(err)
	}
	dm := recvMsg[core.Dispatch](w)
	w.send(core.Start{Lease: dm.Lease, Request: 1})
	recvMsg[core.StartAck](w)
	s1 := openStream(t, ctx, d1, "/runs/"+string(run)+"/events", "")
	w.send(core.Logs{Lease: dm.Lease, Lines: lines(1, "one")})
	got := s1.until("one", func(e sseEvent) bool { return e.kind == "log" })
	seen := 0
	for _, e := range got {
		if e.kind == "server" {
			seen = max(seen, decode[orchestrator.StreamServerEvent](t, e).Seq)
		}
	}
	w.send(core.Logs{Lease: dm.Lease, Lines: lines(2, "two")})
	for recvMsg[core.LogAck](w).Lines < 2 { // until "two" is durable
	}
	if err := d1.Close(); err != nil {
		t.Fatal(err)
	}
	d2 := start()
	defer d2.Close()
	s2 := openStream(t, ctx, d2, "/runs/"+string(run)+"/events", got[len(got)-1].id)
	got2 := s2.until("a line", func(e sseEvent) bool { return e.kind == "log" })
	if v := decode[orchestrator.StreamLine](t, got2[len(got2)-1]); v.Text != "two" {
		t.Errorf("after the restart the stream resumed with %q, want two", v.Text)
	}
	for _, e := range got2 {
		if e.kind == "server" && decode[orchestrator.StreamServerEvent](t, e).Seq <= seen {
			t.Errorf("after the restart the stream repeated server event %s", e.data)
		}
	}
}

// A client that reads as fast as it can is never dropped for a burst: one
// worker's batch of 3,000 lines (one Logs message; a worker sends up to
// 10,000) is one publish, queued whole, though it is more than StreamQueue
// events. At one P the loop publishes it all before the stream's handler
// runs.
func TestStreamBurstKeepsAFastClient(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	r := startAPI(t)
	ctx, d := r.ctx, r.d
	w := rawFleetWorker(t, ctx, d, "raw-burst")
	run, err := d.Submit(ctx, core.RunSpec{Name: "burst", Steps: []core.StepSpec{{Name: "a", Command: "x", Writes: true}}})
	if err != nil {
		t.Fatal(err)
	}
	dm := recvMsg[core.Dispatch](w)
	w.send(core.Start{Lease: dm.Lease, Request: 1})
	recvMsg[core.StartAck](w)
	s := openStream(t, ctx, d, "/runs/"+string(run)+"/events", "")
	s.until("the run's status", func(e sseEvent) bool { return e.kind == "run" })
	const n = 3 * orchestrator.StreamQueue
	texts := make([]string, n)
	for i := range texts {
		texts[i] = fmt.Sprintf("%05d", i)
	}
	w.send(core.Logs{Lease: dm.Lease, Lines: lines(1, texts...)})
	recvMsg[core.LogAck](w)
	w.send(core.Report{Step: dm.Step, Lease: dm.Lease, Request: 2, Outcome: core.Outcome{Status: core.OutcomeSuccess}})
	recvMsg[core.Answer](w)
	got := 0
	for e := range s.ch {
		switch e.kind {
		case "log":
			got++
		case "end":
			if got != n {
				t.Fatalf("the stream ended after %d lines, want %d", got, n)
			}
			return
		}
	}
	t.Fatalf("the stream closed without its end after %d of %d lines: the client was dropped for one burst", got, n)
}

// An archived run's stream reads its lines from the store a page at a time
// (store.MaxLogPage), lease by lease in id order (here the steps' order),
// and resumes in the middle of them: 12,000 lines of step a (two pages),
// then b's, then end.
func TestArchivedRunStreamPages(t *testing.T) {
	r := startAPI(t)
	ctx, d := r.ctx, r.d
	w := rawFleetWorker(t, ctx, d, "raw-pages")
	run, err := d.Submit(ctx, core.RunSpec{Name: "pages", Steps: []core.StepSpec{
		{Name: "a", Command: "x", Writes: true}, {Name: "b", Command: "x", Writes: true, DependsOn: []string{"a"}}}})
	if err != nil {
		t.Fatal(err)
	}
	const na, nb = 12000, 3
	req := uint64(0)
	for step, n := range []int{na, nb} {
		dm := recvMsg[core.Dispatch](w)
		req++
		w.send(core.Start{Lease: dm.Lease, Request: req})
		recvMsg[core.StartAck](w)
		for from := 0; from < n; from += 6000 {
			texts := make([]string, min(6000, n-from))
			for i := range texts {
				texts[i] = fmt.Sprintf("%c%05d", 'a'+step, from+i)
			}
			w.send(core.Logs{Lease: dm.Lease, Lines: lines(1+from, texts...)})
			recvMsg[core.LogAck](w)
		}
		req++
		w.send(core.Report{Step: dm.Step, Lease: dm.Lease, Request: req, Outcome: core.Outcome{Status: core.OutcomeSuccess}})
		recvMsg[core.Answer](w)
	}
	openStream(t, ctx, d, "/runs/"+string(run)+"/events", "").rest() // until "end": the run is archived
	var want []string
	for i := range na {
		want = append(want, fmt.Sprintf("a%05d", i))
	}
	for i := range nb {
		want = append(want, fmt.Sprintf("b%05d", i))
	}
	check := func(all []sseEvent, from int) {
		t.Helper()
		var got []string
		for _, e := range all {
			if e.kind == "log" {
				got = append(got, decode[orchestrator.StreamLine](t, e).Text)
			}
		}
		if len(got) != len(want)-from || all[len(all)-1].kind != "end" {
			t.Fatalf("from line %d: %d lines, ending with %q; want %d and end", from, len(got), all[len(all)-1].kind, len(want)-from)
		}
		for i, g := range got {
			if g != want[from+i] {
				t.Fatalf("from line %d: line %d is %q, want %q (every line once, in order)", from, i, g, want[from+i])
			}
		}
	}
	all := openStream(t, ctx, d, "/runs/"+string(run)+"/events", "").rest()
	check(all, 0)
	var mid string
	n := 0
	for _, e := range all {
		if e.kind == "log" {
			if n++; n == 11000 {
				mid = e.id
			}
		}
	}
	check(openStream(t, ctx, d, "/runs/"+string(run)+"/events", mid).rest(), 11000)
}

// A run stream's id names only the leases that are not done (a lease is
// done once its log is closed and all of it sent), so it stays as short as
// the run's current leases however many leases the run had (SPEC §17): a
// run of 300 one-line steps, one of them held open throughout, streams
// ids of a few bytes, and a stream resumed from one in the middle, live or
// archived, hears every line after it exactly once.
func TestRunStreamIDStaysShort(t *testing.T) {
	r := startAPI(t)
	ctx, d := r.ctx, r.d
	long := rawFleetWorker(t, ctx, d, "raw-long")
	many := rawFleetWorker(t, ctx, d, "raw-many")
	const n = 300
	steps := []core.StepSpec{{Name: "long", Command: "x", Writes: true, Target: "raw-long"}}
	for i := range n {
		steps = append(steps, core.StepSpec{Name: fmt.Sprintf("s%03d", i), Command: "x", Writes: true, Target: "raw-many"})
	}
	run, err := d.Submit(ctx, core.RunSpec{Name: "many-leases", Steps: steps})
	if err != nil {
		t.Fatal(err)
	}
	path := "/runs/" + string(run) + "/events"
	s := openStream(t, ctx, d, path, "")
	dl := recvMsg[core.Dispatch](long)
	long.send(core.Start{Lease: dl.Lease, Request: 1})
	recvMsg[core.StartAck](long)
	long.send(core.Logs{Lease: dl.Lease, Lines: lines(1, "long-1")})
	recvMsg[core.LogAck](long)
	var want []string
	req := uint64(0)
	var next *core.Dispatch // a dispatch read while waiting for an ack
	for i := range n {
		dm := next
		if dm == nil {
			m := recvMsg[core.Dispatch](many)
			dm = &m
		}
		next = nil
		req++
		many.send(core.Start{Lease: dm.Lease, Request: req})
		recvMsg[core.StartAck](many)
		text := fmt.Sprintf("line of %s", dm.Step)
		many.send(core.Logs{Lease: dm.Lease, Lines: lines(1, text)})
		recvMsg[core.LogAck](many)
		req++
		many.send(core.Report{Step: dm.Step, Lease: dm.Lease, Request: req, Outcome: core.Outcome{Status: core.OutcomeSuccess}})
		recvMsg[core.Answer](many)
		want = append(want, text)
		if i == n/2 { // lines after the commit are refused, acknowledged as discarded
			many.send(core.Logs{Lease: dm.Lease, Lines: lines(2, "late")})
			for {
				switch m := many.recv().(type) {
				case core.Dispatch:
					next = &m
					continue
				case core.LogAck:
					if m.Lease != dm.Lease || m.Lines != 2 {
						t.Fatalf("a line after the commit: ack %+v, want lease %d's discarded (lines 2)", m, dm.Lease)
					}
				default:
					t.Fatalf("want a LogAck, got %s", core.DescribeMsg(m))
				}
				break
			}
		}
	}
	texts := func(evs []sseEvent) []string {
		var out []string
		for _, e := range evs {
			if e.kind == "log" {
				out = append(out, decode[orchestrator.StreamLine](t, e).Text)
			}
		}
		return out
	}
	// While the long step still runs: an id from the middle resumes the live run.
	live := s.until("the last short step's line", func(e sseEvent) bool {
		return e.kind == "log" && strings.Contains(e.data, fmt.Sprintf("s%03d", n-1))
	})
	mid := ""
	for k, e := 0, 0; e < len(live); e++ {
		if live[e].kind == "log" {
			if k++; k == n/2 {
				mid = live[e].id // after long-1 and the lines of s000..s148
			}
		}
	}
	s2 := openStream(t, ctx, d, path, mid)
	long.send(core.Logs{Lease: dl.Lease, Lines: lines(2, "long-2")})
	recvMsg[core.LogAck](long)
	long.send(core.Report{Step: dl.Step, Lease: dl.Lease, Request: 2, Outcome: core.Outcome{Status: core.OutcomeSuccess}})
	recvMsg[core.Answer](long)
	want = append(want, "long-2")
	live = append(live, s.rest()...) // until "end"

	got := texts(live)
	if len(got) != n+2 || got[0] != "long-1" || strings.Join(got[1:], "|") != strings.Join(want, "|") {
		t.Fatalf("live stream: %d lines %q..., want long-1, one line of each step, long-2", len(got), got[:min(len(got), 4)])
	}
	longest := ""
	for _, e := range live {
		if len(e.id) > len(longest) {
			longest = e.id
		}
	}
	// The longest names the held lease and the one whose line it follows.
	if len(longest) > 40 {
		t.Errorf("an event id of %d bytes (%.60s…): want at most 40 for a run with at most two leases open at once", len(longest), longest)
	}
	check := func(from string, evs []sseEvent, want []string) {
		t.Helper()
		got := texts(evs)
		if strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("resumed %s at %s: %d lines (%q…), want the %d after it, each once (%q…)", from, mid, len(got), got[:min(len(got), 3)], len(want), want[:3])
		}
		if evs[len(evs)-1].kind != "end" {
			t.Errorf("resumed %s: ended with %s, want end", from, evs[len(evs)-1].kind)
		}
	}
	check("live", s2.rest(), want[n/2-1:])
	// Archived, the lines come lease by lease: the long step's first.
	check("archived", openStream(t, ctx, d, path, mid).rest(), append([]string{"long-2"}, want[n/2-1:n]...))
	// The archived stream from the start names no lease once each is done.
	all := openStream(t, ctx, d, path, "").rest()
	if g := texts(all); len(g) != n+2 {
		t.Errorf("archived stream: %d lines, want %d", len(g), n+2)
	}
	for _, e := range all {
		if len(e.id) > 40 {
			t.Fatalf("archived stream: an event id of %d bytes (%.60s…), want at most 40", len(e.id), e.id)
		}
	}
}

// A run's stored lines are read off the loop (core.LeaseLogsView), by a
// stream's snapshot and by GET /api/runs/{id}/logs, while the loop goes on
// storing more of the same log: under the race detector, and each read
// is a prefix of the log, every line once, in order.
func TestLogViewsReadWhileTheLogGrows(t *testing.T) {
	r := startAPI(t)
	ctx, d := r.ctx, r.d
	w := rawFleetWorker(t, ctx, d, "raw-view")
	run, err := d.Submit(ctx, core.RunSpec{Name: "views", Steps: []core.StepSpec{{Name: "a", Command: "x", Writes: true}}})
	if err != nil {
		t.Fatal(err)
	}
	dm := recvMsg[core.Dispatch](w)
	w.send(core.Start{Lease: dm.Lease, Request: 1})
	recvMsg[core.StartAck](w)
	text := func(i int) string { return fmt.Sprintf("line %06d", i) }
	const burst = 400
	sent := 0
	for round := range 12 {
		texts := make([]string, burst)
		for i := range texts {
			texts[i] = text(sent + i)
		}
		w.send(core.Logs{Lease: dm.Lease, Lines: lines(sent+1, texts...)}) // its ack is not awaited: the loop stores it while we read
		sent += burst
		var logs orchestrator.APILogs
		r.expect("GET", "/runs/"+string(run)+"/logs", nil, http.StatusOK, &logs)
		for i, l := range logs.Lines {
			if l.Text != text(i) {
				t.Fatalf("round %d: GET logs line %d is %q, want %q (a prefix of the log)", round, i, l.Text, text(i))
			}
		}
		s := openStream(t, ctx, d, "/runs/"+string(run)+"/events", "")
		next := 0
		s.until("the last line sent", func(e sseEvent) bool {
			if e.kind != "log" {
				return false
			}
			l := decode[orchestrator.StreamLine](t, e)
			if l.Index != next || l.Text != text(next) {
				t.Fatalf("round %d: stream line %d is %d %q, want every line once, in order", round, next, l.Index, l.Text)
			}
			next++
			return next == sent
		})
		s.cancel()
	}
}

// failingLogs is a bbolt store whose HistoryLogs fails from its call
// number failFrom on (0: never).
type failingLogs struct {
	*store.Store
	calls, failFrom atomic.Int32
}

func (s *failingLogs) HistoryLogs(leases []core.LeaseID, after string, limit int) ([]core.StepLogLine, string, error) {
	if n := s.calls.Add(1); s.failFrom.Load() > 0 && n >= s.failFrom.Load() {
		return nil, "", errors.New("the disk is on fire")
	}
	return s.Store.HistoryLogs(leases, after, limit)
}

// GET /api/runs/{id}/logs of an archived run streams its answer; a store
// error before any of it went out is an error answer (500, with the
// error), one after cuts the connection (a client never takes a short
// answer for the whole) and is logged.
func TestArchivedLogsStoreError(t *testing.T) {
	bst, err := store.Open(filepath.Join(t.TempDir(), "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	st := &failingLogs{Store: bst}
	var logBuf lockedBuffer
	d, err := orchestrator.Start(orchestrator.Options{Addr: "127.0.0.1:0", Store: st, AdminToken: adminToken,
		Logger: slog.New(slog.NewTextHandler(&logBuf, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	r := &apiRig{t: t, ctx: ctx, d: d}
	w := rawFleetWorker(t, ctx, d, "raw-fail")
	run, err := d.Submit(ctx, core.RunSpec{Name: "fail", Steps: []core.StepSpec{
		{Name: "a", Command: "x", Writes: true}, {Name: "b", Command: "x", Writes: true, DependsOn: []string{"a"}}}})
	if err != nil {
		t.Fatal(err)
	}
	for step, n := range []int{2000, 1} { // a's lines are more than an answer holds before it is sent
		dm := recvMsg[core.Dispatch](w)
		w.send(core.Start{Lease: dm.Lease, Request: uint64(10 * (step + 1))})
		recvMsg[core.StartAck](w)
		texts := make([]string, n)
		for i := range texts {
			texts[i] = fmt.Sprintf("%s line %04d %s", dm.Step, i, strings.Repeat("x", 60))
		}
		w.send(core.Logs{Lease: dm.Lease, Lines: lines(1, texts...)})
		recvMsg[core.LogAck](w)
		w.send(core.Report{Step: dm.Step, Lease: dm.Lease, Request: uint64(10*(step+1) + 1), Outcome: core.Outcome{Status: core.OutcomeSuccess}})
		recvMsg[core.Answer](w)
	}
	openStream(t, ctx, d, "/runs/"+string(run)+"/events", "").rest() // until "end": archived
	var whole orchestrator.APILogs
	r.expect("GET", "/runs/"+string(run)+"/logs", nil, http.StatusOK, &whole)
	if len(whole.Lines) != 2001 {
		t.Fatalf("the archived run's logs: %d lines, want 2001", len(whole.Lines))
	}

	st.calls.Store(0)
	st.failFrom.Store(1) // the first page
	code, body := r.do("GET", "/runs/"+string(run)+"/logs", nil, nil)
	if code != http.StatusInternalServerError || !strings.Contains(string(body), "the disk is on fire") {
		t.Errorf("the first page failing: HTTP %d %s, want 500 with the store's error", code, body)
	}

	st.calls.Store(0)
	st.failFrom.Store(2) // b's page, after a's 2,000 lines went out
	req, _ := http.NewRequestWithContext(ctx, "GET", d.APIURL()+"/runs/"+string(run)+"/logs", nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var cut orchestrator.APILogs
	derr := json.NewDecoder(resp.Body).Decode(&cut)
	if resp.StatusCode != http.StatusOK || derr == nil {
		t.Errorf("a later page failing: HTTP %d, decode %v; want the answer cut (a decode error), not a short one that parses", resp.StatusCode, derr)
	}
	if !strings.Contains(logBuf.String(), "the disk is on fire") {
		t.Errorf("the cut answer's error is in no log line")
	}
}
