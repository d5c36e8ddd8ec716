package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tether-run/tether/client"
)

// TestScheduleCommands: schedule create, list, show, pause, resume and rm
// against a real orchestrator, with their exit codes: a missing --cron is
// a usage error (2), a bad cron or an unknown schedule a refusal (3).
func TestScheduleCommands(t *testing.T) {
	w := newCLIWorld(t, false)
	wf := w.workflow("nightly", "  - name: a\n    run: echo x\n")
	out := w.must(exitOK, "schedule", "create", "nightly", "--cron", "30 4 * * mon-fri", "--tz", "+01:00", wf)
	if !strings.Contains(out, "schedule nightly created; next fire") {
		t.Errorf("create printed %q", out)
	}
	w.must(exitUsage, "schedule", "create", "x", wf)
	w.must(exitRefused, "schedule", "create", "x", "--cron", "* * *", wf)
	w.must(exitRefused, "schedule", "create", "x", "--cron", "@daily", "--catch-up", "some", wf)
	w.must(exitRefused, "schedule", "create", "nightly", "--cron", "@daily", wf)
	if table := w.must(exitOK, "schedule", "list"); !strings.Contains(table, "30 4 * * mon-fri") || !strings.Contains(table, "active") {
		t.Errorf("schedule list:\n%s", table)
	}
	var s client.Schedule
	if err := json.Unmarshal([]byte(w.must(exitOK, "schedule", "show", "nightly", "-o", "json")), &s); err != nil {
		t.Fatal(err)
	}
	if len(s.Upcoming) != 5 || s.Upcoming[0].UTC().Hour() != 3 || s.Upcoming[0].UTC().Minute() != 30 || s.CatchUp != "one" {
		t.Errorf("show: %+v (want five fire times at 03:30 UTC)", s)
	}
	for _, u := range s.Upcoming {
		if d := u.UTC().Weekday(); d == 0 || d == 6 {
			t.Errorf("fire time %s falls on a weekend", u)
		}
	}
	if out := w.must(exitOK, "schedule", "pause", "nightly"); !strings.Contains(out, "paused") {
		t.Errorf("pause printed:\n%s", out)
	}
	if out := w.must(exitOK, "schedule", "resume", "nightly"); !strings.Contains(out, "active") {
		t.Errorf("resume printed:\n%s", out)
	}
	w.must(exitOK, "schedule", "rm", "nightly")
	w.must(exitRefused, "schedule", "show", "nightly")
	w.must(exitRefused, "schedule", "rm", "nightly")
}

// TestRunShowGroup: run show names a run's concurrency group (SPEC §8a),
// and a second member of a full group shows as waiting.
func TestRunShowGroup(t *testing.T) {
	w := newCLIWorld(t, false)
	p := filepath.Join(t.TempDir(), "grouped.yaml")
	if err := os.WriteFile(p, []byte("name: grouped\nconcurrency: {group: deploy, max: 1}\nsteps:\n  - name: a\n    run: sleep 600\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	first := strings.TrimSpace(w.must(exitOK, "run", "submit", p))
	second := strings.TrimSpace(w.must(exitOK, "run", "submit", p))
	if out := w.must(exitOK, "run", "show", first); !strings.Contains(out, "Concurrency group deploy") {
		t.Errorf("run show %s names no group:\n%s", first, out)
	}
	if out := w.must(exitOK, "run", "show", second); !strings.Contains(out, ": waiting") {
		t.Errorf("run show %s: the second member of a full group is not waiting:\n%s", second, out)
	}
}
