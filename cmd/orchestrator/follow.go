package main

// Following a run over its live stream (SPEC §17): run logs --follow, run
// watch, run submit --wait.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/tether-run/tether/client"
)

// followRun reads the run's stream to its end (client.FollowRun reopens
// it with the last id heard), calling f with each event; -o json or yaml
// print each event instead ({"kind","id","data"}: one JSON object a line,
// or one YAML document each). It returns the run's outcome (outcome).
func followRun(ctx context.Context, e *env, w io.Writer, run string, f func(client.StreamEvent) error) error {
	c, err := newClient(e, -1)
	if err != nil {
		return err
	}
	format, err := e.format()
	if err != nil {
		return err
	}
	structured := format != "table"
	var end client.StreamEnd
	err = c.FollowRun(ctx, run, func(ev client.StreamEvent) error {
		if ev.Kind == "end" {
			if err := ev.Decode(&end); err != nil {
				return err
			}
		}
		if structured {
			return printEvent(e, w, ev)
		}
		return f(ev)
	})
	if err != nil {
		return answerErr(err)
	}
	return outcome(run, end.Status)
}

// printEvent prints one event as -o json or yaml asks.
func printEvent(e *env, w io.Writer, ev client.StreamEvent) error {
	v := struct {
		Kind string          `json:"kind"`
		ID   string          `json:"id,omitempty"`
		Data json.RawMessage `json:"data"`
	}{ev.Kind, ev.ID, ev.Data}
	if format, _ := e.format(); format == "yaml" {
		fmt.Fprintln(w, "---")
		return printYAML(w, v)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// followLogs is run logs --follow: the lines stored so far, then each line
// as it is stored, gap markers included, until the run ends; the exit code
// is the run's outcome.
func followLogs(ctx context.Context, e *env, run string) error {
	want := e.opts.step
	matched, seen := want == "", false
	return followRun(ctx, e, e.stdout, run, func(ev client.StreamEvent) error {
		switch ev.Kind {
		case "step":
			var s client.StreamStep
			if err := ev.Decode(&s); err != nil {
				return err
			}
			matched = matched || stepMatches(run, s.Step, want)
		case "run":
			// The snapshot names every step before the run's status.
			if !seen && !matched {
				return refusedErrorf("run %s has no step %q", cell(run), want)
			}
			seen = true
		case "log", "gap":
			var l client.StreamLine
			if err := ev.Decode(&l); err != nil {
				return err
			}
			if !stepMatches(run, l.Step, want) {
				return nil
			}
			text := l.Text
			if l.Event {
				text = "(event) " + text
			}
			printLogLine(e.stdout, l.At, l.Step, text)
		}
		return nil
	})
}

// stepMatches says whether the step id is the --step NAME (every forEach
// instance of it), NAME[i] or the whole id; "" matches every step, as GET
// /api/runs/{id}/logs?step= does.
func stepMatches(run, id, want string) bool {
	if want == "" || id == want || id == run+"/"+want {
		return true
	}
	name, _ := strings.CutPrefix(id, run+"/")
	if i := strings.LastIndexByte(name, '['); i > 0 && strings.HasSuffix(name, "]") {
		name = name[:i]
	}
	return name == want
}

// watch prints each step's state as it changes, one line each (a state
// the snapshot of a reopened stream repeats is not printed again), then
// the run's outcome; the exit code is the outcome (which it has printed).
func watch(ctx context.Context, e *env, w io.Writer, run string) error {
	last := map[string]string{}
	err := followRun(ctx, e, w, run, func(ev client.StreamEvent) error {
		switch ev.Kind {
		case "step":
			var s client.StreamStep
			if err := ev.Decode(&s); err != nil {
				return err
			}
			if last[s.Step] == s.State {
				return nil
			}
			last[s.Step] = s.State
			var more []string
			if s.Attempts > 0 {
				more = append(more, fmt.Sprintf("attempt %d", s.Attempts))
			}
			if s.Worker != "" {
				more = append(more, "worker "+cell(s.Worker))
			}
			if s.Exit != nil {
				more = append(more, fmt.Sprintf("exit %d", *s.Exit))
			}
			line := fmt.Sprintf("%-32s %-10s", cell(s.Step), cell(s.State))
			if len(more) > 0 {
				line += " " + strings.Join(more, ", ")
			}
			fmt.Fprintln(w, strings.TrimRight(line, " "))
		case "end":
			var end client.StreamEnd
			if err := ev.Decode(&end); err != nil {
				return err
			}
			fmt.Fprintf(w, "run %s %s\n", cell(run), cell(end.Status))
		}
		return nil
	})
	if c := exitCode(err); c == exitRunFailed || c == exitRunCancelled {
		return &exitErr{code: c, err: errors.New("")} // said above
	}
	return err
}
