package orchestrator

// Cron schedules on the operator API (SPEC §8a): the routes' handlers and
// the driver's calls. The core decides; this file resolves a time zone
// into the offset spans the core computes fire times with, and renders
// schedules.

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"time"

	"github.com/tether-run/tether/adapters/workflow"
	"github.com/tether-run/tether/client"
	"github.com/tether-run/tether/core"
)

// zoneHorizon is how far ahead a named zone's offset changes are resolved.
const zoneHorizon = 20 * 365 * 24 * time.Hour

var fixedOffset = regexp.MustCompile(`^(?:UTC)?([+-])(\d{1,2})(?::?(\d{2}))?$`)

// ResolveZone turns a --tz value into the core's offset spans (SPEC §8a):
// "" or "UTC" is none; "+05:30", "-0800", "UTC+2" one fixed span; a zone
// name (Europe/Paris) its offsets from now on, one span per change for 20
// years, at most core.MaxZoneSpans.
func ResolveZone(tz string, now time.Time) ([]core.ZoneSpan, error) {
	if tz == "" || tz == "UTC" {
		return nil, nil
	}
	if m := fixedOffset.FindStringSubmatch(tz); m != nil {
		h, _ := strconv.Atoi(m[2])
		mins, _ := strconv.Atoi(m[3])
		if h > 18 || mins > 59 {
			return nil, fmt.Errorf("time zone offset %s is out of range (at most ±18:00)", core.Quote(tz))
		}
		off := h*3600 + mins*60
		if m[1] == "-" {
			off = -off
		}
		return []core.ZoneSpan{{From: now.UTC().Truncate(time.Second), Offset: off}}, nil
	}
	loc, err := time.LoadLocation(tz)
	if err != nil || tz == "Local" {
		return nil, fmt.Errorf("unknown time zone %s: give a zone name such as Europe/Paris or an offset such as +05:30", core.Quote(tz))
	}
	t := now.UTC().Truncate(time.Second)
	_, off := t.In(loc).Zone()
	spans := []core.ZoneSpan{{From: t, Offset: off}}
	for i := 0; i < 4*core.MaxZoneSpans && len(spans) < core.MaxZoneSpans; i++ {
		_, end := t.In(loc).ZoneBounds()
		if !end.After(t) {
			end = t.Add(time.Hour) // inside a rule the bounds may not move on: step past
		}
		if end.Sub(now) > zoneHorizon {
			break
		}
		t = end.UTC()
		if _, off := t.In(loc).Zone(); off != spans[len(spans)-1].Offset {
			spans = append(spans, core.ZoneSpan{From: t, Offset: off})
		}
	}
	return spans, nil
}

// CreateSchedule creates a schedule; a refusal is a *Refusal (ErrRefused,
// with the core's reason and code).
func (d *Driver) CreateSchedule(ctx context.Context, in core.CreateSchedule) error {
	_, err := d.do(ctx, func(id core.CallID) core.Input {
		in.Call, in.Actor = id, actorOf(ctx)
		return in
	})
	if err != nil {
		return fmt.Errorf("create schedule %s: %w", core.Quote(in.Name), err)
	}
	return nil
}

// ChangeSchedule pauses, resumes or deletes a schedule (op is one of
// core.SchedulePause, ScheduleResume, ScheduleDelete).
func (d *Driver) ChangeSchedule(ctx context.Context, name, op string) error {
	_, err := d.do(ctx, func(id core.CallID) core.Input {
		return core.ChangeSchedule{Call: id, Actor: actorOf(ctx), Name: name, Op: op}
	})
	if err != nil {
		return fmt.Errorf("%s schedule %s: %w", op, core.Quote(name), err)
	}
	return nil
}

// scheduleView renders a schedule; upcoming > 0 adds that many next fire
// times.
func scheduleView(sc core.ScheduleRecord, upcoming int) client.Schedule {
	v := client.Schedule{Name: sc.Name, Cron: sc.Cron, TZ: sc.Zone, CatchUp: sc.CatchUp, Workflow: sc.Spec.Name,
		Steps: len(sc.Spec.Steps), Paused: sc.Paused, CreatedAt: sc.CreatedAt, CreatedBy: sc.CreatedBy,
		LastFire: sc.LastFire, NextFire: sc.NextFire, LastRun: string(sc.LastRun), Runs: sc.Runs, Skipped: sc.Skipped}
	if v.TZ == "" {
		v.TZ = "UTC"
	}
	if c, err := core.ParseCron(sc.Cron); err == nil && !sc.NextFire.IsZero() {
		for t := sc.NextFire; len(v.Upcoming) < upcoming && !t.IsZero(); t = c.Next(t, sc.Spans) {
			v.Upcoming = append(v.Upcoming, t)
		}
	}
	return v
}

func (a *api) schedule(ctx context.Context, name string, upcoming int) (client.Schedule, bool, error) {
	var sc core.ScheduleRecord
	var ok bool
	err := a.d.Snapshot(ctx, func(o *core.Orchestrator) { sc, ok = o.Schedule(name) })
	if err != nil || !ok {
		return client.Schedule{}, ok, err
	}
	return scheduleView(sc, upcoming), true, nil
}

func (a *api) createSchedule(r *http.Request) (int, any, error) {
	var req client.ScheduleRequest
	if err := decodeJSON(r, &req); err != nil {
		return 0, nil, err
	}
	if req.Name == "" || req.Cron == "" || req.Workflow == "" {
		return 0, nil, errorf(http.StatusBadRequest, `a schedule needs a name, a cron expression and a workflow: {"name": "nightly", "cron": "0 3 * * *", "workflow": "<YAML>"}`)
	}
	file := req.File
	if file == "" {
		file = "workflow"
	}
	if err := core.CheckName("workflow file name", file); err != nil {
		return 0, nil, errorf(http.StatusBadRequest, "%v", err)
	}
	if len(req.Workflow) > workflow.MaxSize {
		return 0, nil, errorf(http.StatusRequestEntityTooLarge, "workflow is %d bytes, at most %d", len(req.Workflow), workflow.MaxSize)
	}
	spec, err := workflow.Parse(file, []byte(req.Workflow))
	if err != nil {
		return 0, nil, errorf(http.StatusBadRequest, "%v", err)
	}
	spans, err := ResolveZone(req.TZ, time.Now())
	if err != nil {
		return 0, nil, errorf(http.StatusBadRequest, "%v", err)
	}
	err = a.d.CreateSchedule(r.Context(), core.CreateSchedule{Name: req.Name, Cron: req.Cron, Zone: req.TZ, Spans: spans,
		CatchUp: req.CatchUp, Spec: spec})
	if err != nil {
		return 0, nil, err // a refusal's status is its code's (classify)
	}
	v, _, err := a.schedule(r.Context(), req.Name, 0)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, v, nil
}

func (a *api) listSchedules(ctx context.Context) (int, any, error) {
	out := client.ScheduleList{Schedules: []client.Schedule{}}
	err := a.d.Snapshot(ctx, func(o *core.Orchestrator) {
		for _, sc := range o.Schedules() {
			out.Schedules = append(out.Schedules, scheduleView(sc, 0))
		}
	})
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, out, nil
}

func (a *api) showSchedule(r *http.Request) (int, any, error) {
	name := r.PathValue("name")
	v, ok, err := a.schedule(r.Context(), name, 5)
	if err != nil {
		return 0, nil, err
	}
	if !ok {
		return 0, nil, errorf(http.StatusNotFound, "unknown schedule %s", core.Quote(name))
	}
	return http.StatusOK, v, nil
}

func (a *api) changeSchedule(r *http.Request, op string) (int, any, error) {
	name := r.PathValue("name")
	if err := a.d.ChangeSchedule(r.Context(), name, op); err != nil {
		return 0, nil, err // a refusal's status is its code's (classify)
	}
	if op == core.ScheduleDelete {
		return http.StatusOK, client.DeletedSchedule{Deleted: name}, nil
	}
	v, _, err := a.schedule(r.Context(), name, 5)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, v, nil
}
