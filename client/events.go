package client

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// MaxEventLine bounds one line of a live stream read by EventStream, and
// the data of one event, all its lines together.
const MaxEventLine = 16 << 20

// StreamEvent is one event of a live stream (SPEC §17): its kind ("step",
// "run", "server", "log", "gap", "worker", "end", "lost"), its id (the last
// one resumes the stream), and its data, the JSON of the kind's type
// (StreamStep, StreamRun, StreamServerEvent, StreamLine for log and gap,
// StreamWorker, StreamEnd, StreamLost).
type StreamEvent struct {
	Kind string
	ID   string
	Data json.RawMessage
}

// Decode reads the event's data into v.
func (e StreamEvent) Decode(v any) error {
	if err := json.Unmarshal(e.Data, v); err != nil {
		return fmt.Errorf("undecodable %s event: %w", e.Kind, err)
	}
	return nil
}

// EventStream reads one live stream; Close it when done.
type EventStream struct {
	resp *http.Response
	sc   *bufio.Scanner
}

// RunEvents opens a run's live stream, GET /api/runs/{id}/events; lastID,
// if not "", is the last event id heard, to resume after it.
func (c *Client) RunEvents(ctx context.Context, id, lastID string) (*EventStream, error) {
	return c.events(ctx, "/runs/"+url.PathEscape(id)+"/events", lastID)
}

// Events opens the server's live stream, GET /api/events; lastID as for
// RunEvents.
func (c *Client) Events(ctx context.Context, lastID string) (*EventStream, error) {
	return c.events(ctx, "/events", lastID)
}

func (c *Client) events(ctx context.Context, path, lastID string) (*EventStream, error) {
	h := http.Header{"Accept": {"text/event-stream"}}
	if lastID != "" {
		h.Set("Last-Event-ID", lastID)
	}
	resp, err := c.send(ctx, http.MethodGet, path, nil, h)
	if err != nil {
		return nil, err
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		resp.Body.Close()
		return nil, fmt.Errorf("the orchestrator answered %s with %q, not an event stream", path, ct)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), MaxEventLine)
	return &EventStream{resp: resp, sc: sc}, nil
}

// Next returns the next event. At the stream's end it returns io.EOF: after
// "end" the run is over; before it, the server closed the stream (it stops,
// or this client fell behind) and a client resumes by opening it again
// with the last ID it heard.
func (s *EventStream) Next() (StreamEvent, error) {
	var e StreamEvent
	for s.sc.Scan() {
		line := s.sc.Text() // bufio.ScanLines drops a CR before the LF
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "": // a blank line ends an event; a comment (": ping") is skipped
			if line == "" && e.Kind != "" {
				return e, nil
			}
			if line == "" {
				e = StreamEvent{} // a block without a kind is no event: nothing of it carries over
			}
		case "event":
			e.Kind = value
		case "id":
			e.ID = value
		case "data": // lines of one event's data are joined by newlines
			if len(e.Data)+1+len(value) > MaxEventLine {
				return StreamEvent{}, fmt.Errorf("reading the event stream: an event's data is over %d bytes", MaxEventLine)
			}
			if e.Data != nil {
				e.Data = append(e.Data, '\n')
			}
			e.Data = append(e.Data, value...)
		}
	}
	if err := s.sc.Err(); err != nil {
		return StreamEvent{}, fmt.Errorf("reading the event stream: %w", err)
	}
	return StreamEvent{}, io.EOF
}

// Close ends the stream.
func (s *EventStream) Close() error { return s.resp.Body.Close() }

// Reconnection of FollowRun: the pause before reopening a stream doubles
// from FollowRetryMin to FollowRetryMax; after FollowAttempts failed opens
// in a row FollowRun gives up.
var (
	FollowRetryMin = 250 * time.Millisecond
	FollowRetryMax = 5 * time.Second
	FollowAttempts = 20
)

// FollowRun reads a run's live stream (SPEC §17) from its start to its
// "end" event, calling f with each event. When the stream closes before
// "end" (the orchestrator restarted, or this client fell behind), it
// reopens it with the last id heard, so f sees no log line or server event
// twice and misses none (step and run states come again after a reopen:
// they are idempotent). It returns nil after "end"; f's error, which
// stops it; ctx's error; a refusal (4xx: an unknown run, a bad admin
// token; reopening will not heal it); or the last error after
// FollowAttempts failed opens in a row (unreachable, or 5xx: over the
// stream cap, shutting down; or a stream that broke before a new event id).
func (c *Client) FollowRun(ctx context.Context, id string, f func(StreamEvent) error) error {
	lastID, failed := "", 0
	for {
		s, err := c.RunEvents(ctx, id, lastID)
		if err == nil {
			heard := lastID
			err = follow(s, &lastID, f)
			if lastID != heard {
				failed = 0 // it moved on: a stream that opens and breaks at once counts as a failure
			}
			s.Close()
			if errors.Is(err, errStop) {
				return nil
			}
			var fe fnErr
			if errors.As(err, &fe) {
				return fe.err
			}
		}
		var ae *Error
		if errors.As(err, &ae) && ae.Status/100 == 4 || ctx.Err() != nil {
			return cmp.Or(ctx.Err(), err)
		}
		if failed++; failed >= FollowAttempts {
			return fmt.Errorf("the live stream of run %s: %w (gave up after %d attempts)", id, err, failed)
		}
		pause := min(FollowRetryMin<<min(failed-1, 16), FollowRetryMax)
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

var errStop = errors.New("the run ended")

// fnErr is an error of FollowRun's callback.
type fnErr struct{ err error }

func (e fnErr) Error() string { return e.err.Error() }

// follow reads s until "end" (errStop), its end (io.EOF: reopen) or an
// error, keeping the last id heard.
func follow(s *EventStream, lastID *string, f func(StreamEvent) error) error {
	for {
		ev, err := s.Next()
		if err != nil {
			return err // io.EOF included: the stream closed before "end"
		}
		if ev.ID != "" {
			*lastID = ev.ID
		}
		if err := f(ev); err != nil {
			return fnErr{err}
		}
		if ev.Kind == "end" {
			return errStop
		}
	}
}
