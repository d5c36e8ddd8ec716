package client

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// MaxEventLine bounds one line of a live stream read by EventStream.
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
		case "event":
			e.Kind = value
		case "id":
			e.ID = value
		case "data": // lines of one event's data are joined by newlines
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
