package client

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
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
