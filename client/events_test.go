package client

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The stream reader follows the Server-Sent Events framing: comments
// skipped, CRLF lines, data lines joined by newlines, the id and kind of
// each event, io.EOF at the end; Last-Event-ID is sent; a refusal is an
// *Error with its code.
func TestEventStreamFraming(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/api/runs/run-9/events" {
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, `{"code":"not_found","message":"unknown run \"run-9\"","error":"unknown run \"run-9\""}`)
			return
		}
		if got := r.Header.Get("Last-Event-ID"); got != "3:7.2" {
			t.Errorf("Last-Event-ID %q, want 3:7.2", got)
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "retry: 2000\n\n: ping\n\nevent: log\r\nid: 3:7.3\r\ndata: {\"text\":\r\ndata: \"x\"}\r\n\r\n: ping\n\nevent: end\nid: 3:7.3\ndata: {}\n\n")
	}))
	defer srv.Close()
	c, err := New(srv.URL, "tok")
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.RunEvents(context.Background(), "run-1", "3:7.2")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	e, err := s.Next()
	if err != nil || e.Kind != "log" || e.ID != "3:7.3" || string(e.Data) != "{\"text\":\n\"x\"}" {
		t.Fatalf("first event %+v %q, %v", e, e.Data, err)
	}
	var v struct{ Text string }
	if err := e.Decode(&v); err != nil || v.Text != "x" {
		t.Fatalf("decode: %+v %v", v, err)
	}
	if e, err := s.Next(); err != nil || e.Kind != "end" {
		t.Fatalf("second event %+v, %v", e, err)
	}
	if _, err := s.Next(); err != io.EOF {
		t.Fatalf("after the last event: %v, want io.EOF", err)
	}
	_, err = c.RunEvents(context.Background(), "run-9", "")
	var ce *Error
	if !errors.As(err, &ce) || ce.Code != "not_found" || ce.Status != 404 {
		t.Fatalf("unknown run: %v", err)
	}
}

// FollowRun reopens a stream that closed before "end" with the last id it
// heard, through a refusal of 503 (over the stream cap), so its callback
// sees each line once and in order; it stops after "end", and a refusal
// of 4xx ends it at once.
func TestFollowRunResumes(t *testing.T) {
	defer func(d time.Duration) { FollowRetryMin = d }(FollowRetryMin)
	FollowRetryMin = time.Millisecond
	var mu sync.Mutex
	var heard []string // the Last-Event-ID of each connection
	unknown := 0       // requests for the unknown run
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/api/runs/run-9/events" {
			mu.Lock()
			unknown++
			mu.Unlock()
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, `{"code":"not_found","message":"unknown run"}`)
			return
		}
		mu.Lock()
		n := len(heard)
		heard = append(heard, r.Header.Get("Last-Event-ID"))
		mu.Unlock()
		switch n {
		case 0: // two lines, then the stream closes without "end"
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "event: log\nid: 0:1.1\ndata: {\"text\":\"a\"}\n\nevent: log\nid: 0:1.2\ndata: {\"text\":\"b\"}\n\n")
		case 1: // over the cap: try again
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"code":"unavailable","message":"too many live event streams"}`)
		default: // resumed after the last line heard
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "event: log\nid: 0:1.3\ndata: {\"text\":\"c\"}\n\nevent: end\nid: 0:1.3\ndata: {\"run\":\"run-1\",\"status\":\"success\"}\n\n")
		}
	}))
	defer srv.Close()
	c, _ := New(srv.URL, "tok")
	var got []string
	err := c.FollowRun(context.Background(), "run-1", func(e StreamEvent) error {
		var l StreamLine
		if e.Kind == "log" {
			if err := e.Decode(&l); err != nil {
				return err
			}
			got = append(got, l.Text)
		} else {
			got = append(got, e.Kind)
		}
		return nil
	})
	if err != nil || !slices.Equal(got, []string{"a", "b", "c", "end"}) {
		t.Fatalf("FollowRun: %q, %v; want a, b, c, end", got, err)
	}
	if !slices.Equal(heard, []string{"", "0:1.2", "0:1.2"}) {
		t.Errorf("Last-Event-ID of each connection %q, want none, then 0:1.2 twice", heard)
	}
	err = c.FollowRun(context.Background(), "run-9", func(StreamEvent) error { return nil })
	if ErrorCode(err) != CodeNotFound || unknown != 1 {
		t.Errorf("unknown run: %v after %d requests, want not_found at once", err, unknown)
	}
	stop := errors.New("stop")
	err = c.FollowRun(context.Background(), "run-1", func(StreamEvent) error { return stop })
	if err != stop {
		t.Errorf("the callback's error: %v, want it back", err)
	}
}

// A block without an event kind is no event and leaves nothing behind for
// the next one; an event's data is bounded as a line is (MaxEventLine).
func TestEventStreamBlocksAndBounds(t *testing.T) {
	big := strings.Repeat("x", 1<<20)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		if r.URL.Path == "/api/runs/run-big/events" {
			io.WriteString(w, "event: log\nid: 1\n")
			for range MaxEventLine>>20 + 1 {
				io.WriteString(w, "data: "+big+"\n")
			}
			io.WriteString(w, "\n")
			return
		}
		io.WriteString(w, "id: 9:\ndata: {\"a\":1}\n\nevent: run\nid: 9:1\ndata: {\"run\":\"run-1\"}\n\n")
	}))
	defer srv.Close()
	c, _ := New(srv.URL, "tok")
	s, err := c.RunEvents(context.Background(), "run-1", "")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if e, err := s.Next(); err != nil || e.Kind != "run" || e.ID != "9:1" || string(e.Data) != `{"run":"run-1"}` {
		t.Fatalf("the event after a block without a kind: %+v %q, %v; want the run event alone", e, e.Data, err)
	}
	s2, err := c.RunEvents(context.Background(), "run-big", "")
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if e, err := s2.Next(); err == nil || !strings.Contains(err.Error(), "data is over") {
		t.Fatalf("an event of %d data lines of 1 MiB: %d bytes, %v; want refused", MaxEventLine>>20+1, len(e.Data), err)
	}
}

// FollowRun counts a stream that opens and breaks before any new event as
// a failed attempt: it backs off and gives up after FollowAttempts, where
// it used to reopen every FollowRetryMin for ever.
func TestFollowRunGivesUpWithoutProgress(t *testing.T) {
	defer func(d time.Duration, n int) { FollowRetryMin, FollowAttempts = d, n }(FollowRetryMin, FollowAttempts)
	FollowRetryMin, FollowAttempts = time.Millisecond, 5
	var opens atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		opens.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "retry: 2000\n\n") // and closes
	}))
	defer srv.Close()
	c, _ := New(srv.URL, "tok")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := c.FollowRun(ctx, "run-1", func(StreamEvent) error { return nil })
	if err == nil || ctx.Err() != nil || !strings.Contains(err.Error(), "gave up after 5 attempts") || opens.Load() != 5 {
		t.Fatalf("FollowRun on a stream that always breaks at once: %v after %d opens, want it to give up after 5", err, opens.Load())
	}
}
