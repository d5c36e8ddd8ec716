package orchestrator_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/adapters/store"
	"github.com/tether-run/tether/client"
	"github.com/tether-run/tether/core"
)

// TestScheduleAPI: a schedule is created, listed, shown with its next fire
// times, paused, resumed and deleted through the one Go client, each
// change audited with its actor; refusals carry the SPEC §15 code (a bad
// cron 400, a duplicate 409, an unknown schedule 404, a bad zone 400),
// and a schedule survives a restart of the orchestrator.
func TestScheduleAPI(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	path := filepath.Join(t.TempDir(), "tether.db")
	open := func() *orchestrator.Driver {
		st, err := store.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		d, err := orchestrator.Start(orchestrator.Options{Addr: "127.0.0.1:0", Store: st, AdminToken: adminToken, Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	d := open()
	c := clientFor(t, d, adminToken)
	const wf = "name: nightly\nsteps:\n  - name: a\n    run: \"true\"\n"
	sc, err := c.CreateSchedule(ctx, client.ScheduleRequest{Name: "nightly", Cron: "0 3 * * *", TZ: "+02:00", Workflow: wf})
	if err != nil {
		t.Fatal(err)
	}
	if sc.CatchUp != "one" || sc.TZ != "+02:00" || sc.Workflow != "nightly" || sc.NextFire.UTC().Hour() != 1 || sc.NextFire.Minute() != 0 {
		t.Fatalf("created: %+v (want catch-up one, 03:00 at +02:00 = 01:00 UTC)", sc)
	}
	code := func(err error) client.Code {
		var ce *client.Error
		if !errors.As(err, &ce) {
			t.Fatalf("want an API error, got %v", err)
		}
		return ce.Code
	}
	for _, tc := range []struct {
		req  client.ScheduleRequest
		want client.Code
		msg  string
	}{
		{client.ScheduleRequest{Name: "x", Cron: "61 * * * *", Workflow: wf}, client.CodeInvalid, "minute field"},
		{client.ScheduleRequest{Name: "nightly", Cron: "@daily", Workflow: wf}, client.CodeConflict, "already exists"},
		{client.ScheduleRequest{Name: "y", Cron: "@daily", TZ: "Mars/Olympus", Workflow: wf}, client.CodeInvalid, "unknown time zone"},
		{client.ScheduleRequest{Name: "z", Cron: "@daily", Workflow: "steps: 3\n"}, client.CodeInvalid, "steps must be a list"},
		{client.ScheduleRequest{Name: "w", Cron: "@daily", CatchUp: "most", Workflow: wf}, client.CodeInvalid, "catch-up"},
	} {
		_, err := c.CreateSchedule(ctx, tc.req)
		if err == nil || code(err) != tc.want || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("create %+v: %v, want %s with %q", tc.req, err, tc.want, tc.msg)
		}
	}
	if _, err := c.PauseSchedule(ctx, "nosuch"); err == nil || code(err) != client.CodeNotFound {
		t.Errorf("pause nosuch: %v, want not_found", err)
	}
	got, err := c.Schedule(ctx, "nightly")
	if err != nil || len(got.Upcoming) != 5 || got.Upcoming[1].Sub(got.Upcoming[0]) != 24*time.Hour {
		t.Fatalf("show: %+v %v (want five daily fire times)", got, err)
	}
	if p, err := c.PauseSchedule(ctx, "nightly"); err != nil || !p.Paused || !p.NextFire.IsZero() {
		t.Fatalf("pause: %+v %v", p, err)
	}
	// A restart keeps the schedule, paused.
	d.Close()
	d = open()
	c = clientFor(t, d, adminToken)
	if p, err := c.ResumeSchedule(ctx, "nightly"); err != nil || p.Paused || p.NextFire.IsZero() {
		t.Fatalf("resume after restart: %+v %v", p, err)
	}
	l, err := c.Schedules(ctx)
	if err != nil || len(l.Schedules) != 1 || l.Schedules[0].Name != "nightly" {
		t.Fatalf("list: %+v %v", l, err)
	}
	// store check knows the schedule's record: no finding about it.
	d.Close()
	rep, err := store.Check(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range rep.Findings {
		if strings.Contains(f.Where+f.What, "schedule") {
			t.Errorf("store check: %+v", f)
		}
	}
	d = open()
	c = clientFor(t, d, adminToken)
	if err := c.DeleteSchedule(ctx, "nightly"); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSchedule(ctx, "nightly"); err == nil || code(err) != client.CodeNotFound {
		t.Errorf("second delete: %v, want not_found", err)
	}
	audit, err := c.Audit(ctx, client.AuditOptions{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, e := range audit.Entries {
		if strings.HasPrefix(e.Action, "schedule.") {
			seen[e.Action+" "+e.Outcome]++
		}
	}
	want := map[string]int{
		core.ActionScheduleCreate + " accepted": 1, core.ActionScheduleCreate + " refused": 5,
		core.ActionSchedulePause + " accepted": 1, core.ActionSchedulePause + " refused": 1,
		core.ActionScheduleResume + " accepted": 1,
		core.ActionScheduleDelete + " accepted": 1, core.ActionScheduleDelete + " refused": 1,
	}
	for k, n := range want {
		if seen[k] != n {
			t.Errorf("audit %s: %d entries, want %d (all: %v)", k, seen[k], n, seen)
		}
	}
	d.Close()
}

// TestResolveZone: a named zone becomes one span per offset change (DST
// twice a year), a fixed offset one span, UTC none; a bad name is refused.
func TestResolveZone(t *testing.T) {
	now := time.Date(2026, 1, 10, 12, 0, 0, 0, time.UTC)
	spans, err := orchestrator.ResolveZone("Europe/Paris", now)
	if err != nil {
		t.Fatal(err)
	}
	if len(spans) < 30 || spans[0].Offset != 3600 || spans[1].Offset != 7200 ||
		!spans[1].From.Equal(time.Date(2026, 3, 29, 1, 0, 0, 0, time.UTC)) {
		t.Fatalf("Europe/Paris: %d spans, first %v", len(spans), spans[:min(3, len(spans))])
	}
	if err := core.CheckZoneSpans(spans); err != nil {
		t.Fatal(err)
	}
	// 02:30 daily in Paris: on the spring-forward day 02:30 does not
	// exist, so it does not fire; the next day it fires at 00:30 UTC.
	c, _ := core.ParseCron("30 2 * * *")
	next := c.Next(time.Date(2026, 3, 28, 12, 0, 0, 0, time.UTC), spans)
	if want := time.Date(2026, 3, 30, 0, 30, 0, 0, time.UTC); !next.Equal(want) {
		t.Errorf("02:30 Paris after 28 March: %s, want %s (the 29th has no 02:30)", next, want)
	}
	// 02:30 on the fall-back day (25 October 2026) occurs twice: both fire.
	first := c.Next(time.Date(2026, 10, 24, 12, 0, 0, 0, time.UTC), spans)
	second := c.Next(first, spans)
	if !first.Equal(time.Date(2026, 10, 25, 0, 30, 0, 0, time.UTC)) || !second.Equal(time.Date(2026, 10, 25, 1, 30, 0, 0, time.UTC)) {
		t.Errorf("02:30 Paris on the fall-back day: %s then %s", first, second)
	}
	for tz, off := range map[string]int{"+05:30": 19800, "-0800": -28800, "UTC+2": 7200} {
		spans, err := orchestrator.ResolveZone(tz, now)
		if err != nil || len(spans) != 1 || spans[0].Offset != off {
			t.Errorf("%s: %v %v", tz, spans, err)
		}
	}
	if spans, err := orchestrator.ResolveZone("UTC", now); err != nil || spans != nil {
		t.Errorf("UTC: %v %v", spans, err)
	}
	for _, bad := range []string{"Nowhere/Else", "+19:00", "Local"} {
		if _, err := orchestrator.ResolveZone(bad, now); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}
