package core

import (
	"fmt"
	"strings"
	"time"
)

// Cron schedules (SPEC §8a). A schedule is a core record holding its
// workflow; the core computes its next fire time and a timer fires it. A
// fire starts its run(s) and records the schedule's new LastFire and
// NextFire in the same batch, so a restart never starts a fire twice.

// KindSchedule is the record kind of a schedule.
const KindSchedule = "schedule"

func scheduleKey(name string) string { return KindSchedule + "/" + name }

// Limits (SPEC §12).
const (
	// MaxSchedules bounds the schedules kept.
	MaxSchedules = 256
	// MaxCatchUpRuns bounds the runs one fire starts under catch-up all;
	// older missed fire times beyond it are skipped.
	MaxCatchUpRuns = 10
	// MaxFireScan bounds the missed fire times one fire counts; beyond
	// it they are all skipped, uncounted, and the latest counted stands
	// for them under catch-up one.
	MaxFireScan = 1000
	// ScheduleLateness is how late a fire may be handled and still count
	// as on time: under catch-up none, an older fire time was missed.
	ScheduleLateness = time.Minute
)

// Catch-up policies: what a fire does about fire times missed while the
// orchestrator was down.
const (
	CatchUpNone = "none" // missed fire times are skipped
	CatchUpOne  = "one"  // one run stands for every missed fire time (the default)
	CatchUpAll  = "all"  // one run per missed fire time, at most MaxCatchUpRuns
)

// ScheduleRecord is a schedule.
type ScheduleRecord struct {
	Name      string
	Cron      string
	Zone      string     `json:",omitempty"` // the zone's name, as given (display); "" is UTC
	Spans     []ZoneSpan `json:",omitempty"` // the zone's offsets, resolved by the adapter
	CatchUp   string
	Spec      RunSpec
	Paused    bool `json:",omitempty"`
	CreatedAt time.Time
	CreatedBy string
	// LastFire: every fire time at or before it has been handled (a run
	// started or the time skipped). NextFire is the next one; zero while
	// paused or if the expression never fires again.
	LastFire time.Time `json:",omitzero"`
	NextFire time.Time `json:",omitzero"`
	LastRun  RunID     `json:",omitempty"`
	Runs     int       `json:",omitempty"` // runs started
	Skipped  int       `json:",omitempty"` // fire times skipped
}

// Inputs.
type (
	// CreateSchedule creates a schedule. Spans are the zone's offsets the
	// adapter resolved (none: UTC).
	CreateSchedule struct {
		Call    CallID
		Actor   string
		Name    string
		Cron    string
		Zone    string
		Spans   []ZoneSpan
		CatchUp string
		Spec    RunSpec
	}
	// ChangeSchedule pauses, resumes or deletes a schedule (Op is one of
	// the Schedule* ops).
	ChangeSchedule struct {
		Call  CallID
		Actor string
		Name  string
		Op    string
	}
)

func (CreateSchedule) isInput() {}
func (ChangeSchedule) isInput() {}

// Schedule operations and their audited actions (SPEC §15a).
const (
	SchedulePause  = "pause"
	ScheduleResume = "resume"
	ScheduleDelete = "delete"

	ActionScheduleCreate = "schedule.create"
	ActionSchedulePause  = "schedule.pause"
	ActionScheduleResume = "schedule.resume"
	ActionScheduleDelete = "schedule.delete"
)

func (o *Orchestrator) markSchedule(sc *ScheduleRecord) { o.dirty[scheduleKey(sc.Name)] = true }

// cronOf returns a schedule's parsed expression (checked when created).
func (o *Orchestrator) cronOf(sc *ScheduleRecord) Cron {
	c, ok := o.crons[sc.Name]
	if !ok {
		c, _ = ParseCron(sc.Cron)
		o.crons[sc.Name] = c
	}
	return c
}

func (o *Orchestrator) createSchedule(in CreateSchedule) {
	deny := func(code, msg string) { o.deny(in.Call, in.Actor, ActionScheduleCreate, in.Name, code, msg) }
	if err := CheckName("schedule name", in.Name); err != nil {
		deny(CodeInvalid, err.Error())
		return
	}
	if strings.ContainsAny(in.Name, "/ \t\n") {
		deny(CodeInvalid, fmt.Sprintf("schedule name %s may not contain '/' or spaces", Quote(in.Name)))
		return
	}
	if in.Zone != "" {
		if err := CheckName("time zone", in.Zone); err != nil {
			deny(CodeInvalid, err.Error())
			return
		}
	}
	c, err := ParseCron(in.Cron)
	if err != nil {
		deny(CodeInvalid, err.Error())
		return
	}
	if err := CheckZoneSpans(in.Spans); err != nil {
		deny(CodeInvalid, err.Error())
		return
	}
	catchUp := in.CatchUp
	switch catchUp {
	case "":
		catchUp = CatchUpOne
	case CatchUpNone, CatchUpOne, CatchUpAll:
	default:
		deny(CodeInvalid, fmt.Sprintf("catch-up %s is not none, one or all", Quote(catchUp)))
		return
	}
	if err := in.Spec.Validate(); err != nil {
		deny(CodeInvalid, err.Error())
		return
	}
	if err := in.Spec.CheckDispatchSizes(o.cfg.Env); err != nil {
		deny(CodeInvalid, err.Error())
		return
	}
	if o.schedules[in.Name] != nil {
		deny(CodeConflict, fmt.Sprintf("schedule %s already exists", Quote(in.Name)))
		return
	}
	if len(o.schedules) >= MaxSchedules {
		deny(CodeConflict, fmt.Sprintf("at most %d schedules: remove one first", MaxSchedules))
		return
	}
	sc := &ScheduleRecord{Name: in.Name, Cron: in.Cron, Zone: in.Zone, Spans: in.Spans, CatchUp: catchUp, Spec: in.Spec,
		CreatedAt: o.now, CreatedBy: actorOr(in.Actor), LastFire: o.now}
	o.schedules[sc.Name] = sc
	o.crons[sc.Name] = c
	o.setNextFire(sc)
	o.accept(in.Actor, ActionScheduleCreate, sc.Name)
	o.logf(LevelInfo, "schedule created", "schedule", sc.Name, "cron", sc.Cron, "next_fire", fmtFire(sc.NextFire))
	o.answer(APIAnswer{Call: in.Call})
}

// setNextFire computes a schedule's next fire time after LastFire, arms
// its timer and marks it.
func (o *Orchestrator) setNextFire(sc *ScheduleRecord) {
	sc.NextFire = time.Time{}
	if !sc.Paused {
		sc.NextFire = o.cronOf(sc).Next(sc.LastFire, sc.Spans)
		o.arm(sc.NextFire, tSchedule, sc.Name)
	}
	o.markSchedule(sc)
}

func fmtFire(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.UTC().Format(time.RFC3339)
}

func (o *Orchestrator) changeSchedule(in ChangeSchedule) {
	action := map[string]string{SchedulePause: ActionSchedulePause, ScheduleResume: ActionScheduleResume, ScheduleDelete: ActionScheduleDelete}[in.Op]
	if action == "" {
		panic("core: unknown schedule op " + in.Op)
	}
	sc := o.schedules[in.Name]
	if sc == nil {
		o.deny(in.Call, in.Actor, action, in.Name, CodeNotFound, fmt.Sprintf("unknown schedule %s", Quote(in.Name)))
		return
	}
	switch in.Op {
	case SchedulePause:
		if !sc.Paused {
			sc.Paused = true
			o.setNextFire(sc)
		}
	case ScheduleResume:
		if sc.Paused {
			// Fire times that fell in the pause are not missed: they
			// were refused. The next one is after now.
			sc.Paused, sc.LastFire = false, o.now
			o.setNextFire(sc)
		}
	case ScheduleDelete:
		delete(o.schedules, sc.Name)
		delete(o.crons, sc.Name)
		o.dirty[scheduleKey(sc.Name)] = true
	}
	o.accept(in.Actor, action, sc.Name)
	o.answer(APIAnswer{Call: in.Call})
}

// fireSchedule handles a schedule whose NextFire is due: the fire times
// from NextFire up to now are due (more than one after downtime), and the
// catch-up policy decides which start a run. Runs and the schedule's new
// LastFire are in this one batch.
func (o *Orchestrator) fireSchedule(sc *ScheduleRecord) {
	c := o.cronOf(sc)
	var due []time.Time
	for t := sc.NextFire; !t.IsZero() && !t.After(o.now) && len(due) < MaxFireScan; t = c.Next(t, sc.Spans) {
		due = append(due, t)
	}
	capped := len(due) == MaxFireScan // and perhaps more not counted
	var start []time.Time
	switch sc.CatchUp {
	case CatchUpNone:
		for _, t := range due {
			if o.now.Sub(t) <= ScheduleLateness {
				start = append(start, t)
			}
		}
	case CatchUpAll:
		start = due[:min(len(due), MaxCatchUpRuns)] // the oldest
	default:
		start = due[len(due)-1:] // the latest counted stands for all
	}
	skipped := len(due) - len(start)
	note := ""
	if sc.CatchUp == CatchUpOne && len(due) > 1 {
		note = fmt.Sprintf(" (and %d missed fire time%s before it: catch-up one)", len(due)-1, plural(len(due)-1))
	}
	for _, t := range start {
		// The run is submitted as the operator's would be, by the server
		// (audited so); nobody waits for the answer.
		answers := len(o.rd.Answers)
		spec := sc.Spec
		spec.Steps = append([]StepSpec(nil), sc.Spec.Steps...) // each run its own steps (the core points into them)
		o.submit(Submit{Actor: ActorServer, Spec: spec})
		// The submit's own answer names the run: the run counter alone
		// does not, as workflow steps may start child runs in the same
		// submit (SPEC §2).
		var id RunID
		for _, a := range o.rd.Answers[answers:] {
			if a.Run != "" && a.Err == "" {
				id = a.Run
			}
		}
		o.rd.Answers = o.rd.Answers[:answers]
		if id == "" {
			// Refused (its audit entry says why): the orchestrator's
			// environment grew past the dispatch bound since (SPEC §12).
			o.logf(LevelError, "schedule fire refused: see the audit log's run.submit by "+ActorServer, "schedule", sc.Name)
			skipped++
			continue
		}
		r := o.runs[id]
		r.Schedule, r.FireAt = sc.Name, t
		o.markRun(r)
		o.event(r.ID, "", "run-scheduled", fmt.Sprintf("started by schedule %s for its fire time %s%s", sc.Name, fmtFire(t), note))
		sc.LastRun = r.ID
		sc.Runs++
	}
	if skipped > 0 {
		more := ""
		if capped {
			more = " or more"
		}
		sc.Skipped += skipped
		o.logf(LevelWarn, fmt.Sprintf("schedule skipped %d%s missed fire time%s (catch-up %s)", skipped, more, plural(skipped), sc.CatchUp),
			"schedule", sc.Name)
	}
	sc.LastFire = o.now
	o.setNextFire(sc)
}

// Schedules returns every schedule, sorted by name.
func (o *Orchestrator) Schedules() []ScheduleRecord {
	out := make([]ScheduleRecord, 0, len(o.schedules))
	for _, n := range sortedKeys(o.schedules) {
		out = append(out, *o.schedules[n])
	}
	return out
}

// Schedule returns one schedule.
func (o *Orchestrator) Schedule(name string) (ScheduleRecord, bool) {
	sc := o.schedules[name]
	if sc == nil {
		return ScheduleRecord{}, false
	}
	return *sc, true
}
