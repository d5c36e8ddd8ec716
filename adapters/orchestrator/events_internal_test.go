package orchestrator

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/tether-run/tether/core"
)

// An idle stream sends ": ping" comment lines, so proxies keep it open;
// the per-write deadline (here far shorter than the pause between pings)
// does not cut a stream that pauses, over HTTP/1.1 or HTTP/2.
func TestStreamHeartbeat(t *testing.T) {
	old := streamHeartbeat
	streamHeartbeat = 200 * time.Millisecond
	defer func() { streamHeartbeat = old }()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	d, err := Start(Options{Addr: "127.0.0.1:0", StorePath: filepath.Join(t.TempDir(), "tether.db"),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), AdminToken: "tok-0123456789", WriteTimeout: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	h2 := &http.Transport{Protocols: new(http.Protocols)}
	h2.Protocols.SetUnencryptedHTTP2(true)
	for name, hc := range map[string]*http.Client{"HTTP/1.1": http.DefaultClient, "h2c": {Transport: h2}} {
		req, _ := http.NewRequestWithContext(ctx, "GET", d.APIURL()+"/events", nil)
		req.Header.Set("Authorization", "Bearer tok-0123456789")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(resp.Body)
		pings := 0
		for pings < 3 {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("%s: after %d pings: %v", name, pings, err)
			}
			if line == ": ping\n" {
				pings++
			}
		}
		resp.Body.Close()
	}
}

// A run stream's cursor (SPEC §17): its text round-trips; an id of an
// earlier release ("<events>:<lease>.<count>,...") reads as below 0; a
// lease is named until it is done, and a done lease's lines are not
// admitted again; below never passes a lease the cursor holds, nor jumps
// for a lease it never learned.
func TestRunCursor(t *testing.T) {
	old, err := parseRunCursor("3:12.40,13.2")
	if err != nil || old.below != 0 || old.count[12] != 40 || old.count[13] != 2 || old.String() != "3:0:12.40,13.2" {
		t.Fatalf("old id: %+v %v, string %q", old, err, old.String())
	}
	c, err := parseRunCursor("")
	if err != nil {
		t.Fatal(err)
	}
	line := func(l core.LeaseID, i int) streamEvent { return streamEvent{kind: "log", lease: l, index: i} }
	for _, l := range []core.LeaseID{4, 7, 9} {
		c.admit(streamEvent{kind: "lease", lease: l})
	}
	if !c.admit(line(7, 0)) || !c.admit(line(9, 0)) || c.admit(line(9, 0)) {
		t.Fatal("lines: each admitted once")
	}
	if got := c.String(); got != "0:0:7.1,9.1" {
		t.Fatalf("after two lines: %q", got)
	}
	c.admit(streamEvent{kind: "closed", lease: 9})
	if got := c.String(); got != "0:10:4.0,7.1" { // 4 is not done though it sent nothing
		t.Fatalf("after 9 closed: %q", got)
	}
	if c.admit(line(9, 1)) {
		t.Fatal("a line of a done lease admitted")
	}
	c.admit(streamEvent{kind: "closed", lease: 20}) // never learned: below stays
	c.admit(streamEvent{kind: "closed", lease: 4})
	c.admit(streamEvent{kind: "closed", lease: 7})
	if got := c.String(); got != "0:10:" {
		t.Fatalf("all done: %q", got)
	}
	r, err := parseRunCursor(c.String())
	if err != nil || !r.done(4) || !r.done(9) || r.done(10) || r.sent(12) != 0 {
		t.Fatalf("parsed %q: %+v %v", c.String(), r, err)
	}
	r.learn(5) // under below and not named: done, so not held
	if !r.done(5) {
		t.Fatal("learning a done lease made it open")
	}
	for _, bad := range []string{"x", "1:2", "1:2:3", "1:a:3.1", "1:2:3.-1", "1:2:3.1,3.2", "1:2:0.1", "-1:0:"} {
		if _, err := parseRunCursor(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// GET /api/runs/{id}/logs writes its answer a line at a time
// (logsAnswer.streamJSON), byte for byte as writeJSON writes the same
// APILogs whole: with no lines, one, and several over two views, with and
// without a step.
func TestLogsAnswerStreamsWhatMarshalWrites(t *testing.T) {
	at := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	ln := func(lease core.LeaseID, i int, text string) core.StepLogLine {
		return core.StepLogLine{Step: "run-1/a", Lease: lease, Index: i, Line: core.LogLine{Seq: uint64(i + 1), At: at, Text: text}}
	}
	gap := core.StepLogLine{Step: "run-1/a", Lease: 3, Index: 1, Line: core.LogLine{At: at, Text: "--- gap ---"}}
	for _, c := range []struct {
		step  string
		views [][]core.StepLogLine
	}{
		{"", nil},
		{"a", [][]core.StepLogLine{{ln(2, 0, "one")}}},
		{"", [][]core.StepLogLine{{ln(2, 0, "one"), ln(2, 1, `"quoted" <tag>`)}, {ln(3, 0, "x"), gap}}},
	} {
		want := APILogs{Run: "run-1", Step: c.step, Lines: []APILogLine{}}
		for _, v := range c.views {
			for _, l := range v {
				want.Lines = append(want.Lines, logLine(l))
			}
		}
		whole := httptest.NewRecorder()
		writeJSON(whole, http.StatusOK, want)
		streamed := httptest.NewRecorder()
		if sent, err := writeStream(streamed, http.StatusOK, &logsAnswer{run: "run-1", step: c.step, views: c.views}); !sent || err != nil {
			t.Fatalf("writeStream: sent %v, %v", sent, err)
		}
		if streamed.Body.String() != whole.Body.String() {
			t.Errorf("streamed:\n%s\nwhole:\n%s", streamed.Body, whole.Body)
		}
		if streamed.Header().Get("Content-Type") != whole.Header().Get("Content-Type") {
			t.Errorf("content type %q, want %q", streamed.Header().Get("Content-Type"), whole.Header().Get("Content-Type"))
		}
	}
}
