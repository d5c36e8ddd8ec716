package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"

	flag "github.com/spf13/pflag"

	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/client"
)

// scheduleCommands are the cron schedules' commands (SPEC §8a).
func scheduleCommands() []*command {
	return []*command{
		{
			path: "schedule create", args: "NAME FILE", nargs: 2,
			short: "start runs of a workflow on a cron schedule",
			long: `Create schedule NAME: the orchestrator starts a run of the workflow FILE
(YAML; "-" reads stdin) at every fire time of --cron, a five-field cron
expression (minute hour day-of-month month day-of-week; *, a-b, */n, lists,
jan-dec, sun-sat) or a macro (@hourly, @daily, @weekly, @monthly, @yearly).
Fire times are computed in UTC, or in --tz: a zone name (Europe/Paris; a
wall time skipped by a DST shift does not fire that day, one repeated
fires twice) or a fixed offset (+05:30). The workflow is checked now and
kept with the schedule: later edits to FILE change nothing.

After the orchestrator was down, --catch-up decides about the fire times
it missed: one (the default) starts one run for all of them, all one run
per missed fire time (at most 10), none skips them. A restart never starts
one fire time twice.` + clientHelp,
			example: `  orchestrator schedule create nightly --cron "0 3 * * *" --tz Europe/Paris nightly.yaml
  orchestrator schedule create poll --cron "*/5 * * * *" --catch-up none poll.yaml`,
			flags: clientFlags(func(fs *flag.FlagSet, o *options) {
				fs.StringVar(&o.sched.cron, "cron", "", "the cron `expression` (required)")
				fs.StringVar(&o.sched.tz, "tz", "", "time `zone` of the expression: a name (Europe/Paris) or an offset (+05:30); default UTC")
				fs.StringVar(&o.sched.catchUp, "catch-up", "one", "missed fire times after downtime: `none`, one or all")
			}),
			run: scheduleCreate,
		},
		{
			path: "schedule list", nargs: 0,
			short:   "list cron schedules",
			long:    `List every schedule: its cron expression and zone, catch-up policy, whether it is paused, its last and next fire times and the runs it started.` + clientHelp,
			example: "  orchestrator schedule list",
			flags:   clientFlags(nil),
			run:     scheduleList,
		},
		{
			path: "schedule show", args: "NAME", nargs: 1,
			short:   "show a schedule and its next five fire times",
			long:    `Show one schedule and its next five fire times.` + clientHelp,
			example: "  orchestrator schedule show nightly",
			flags:   clientFlags(nil),
			run:     scheduleShow,
		},
		{
			path: "schedule pause", args: "NAME", nargs: 1,
			short:   "pause a schedule",
			long:    `Pause a schedule: it starts no run until resumed. Fire times that fall in the pause are not caught up.` + clientHelp,
			example: "  orchestrator schedule pause nightly",
			flags:   clientFlags(nil),
			run:     func(ctx context.Context, e *env, args []string) error { return scheduleOp(ctx, e, args[0], "pause") },
		},
		{
			path: "schedule resume", args: "NAME", nargs: 1,
			short:   "resume a paused schedule",
			long:    `Resume a paused schedule from its next fire time after now.` + clientHelp,
			example: "  orchestrator schedule resume nightly",
			flags:   clientFlags(nil),
			run:     func(ctx context.Context, e *env, args []string) error { return scheduleOp(ctx, e, args[0], "resume") },
		},
		{
			path: "schedule rm", args: "NAME", nargs: 1,
			short:   "delete a schedule (its runs are left alone)",
			long:    `Delete a schedule. Runs it started are not touched.` + clientHelp,
			example: "  orchestrator schedule rm nightly",
			flags:   clientFlags(nil),
			run:     scheduleRm,
		},
	}
}

func scheduleCreate(ctx context.Context, e *env, args []string) error {
	f := e.opts.sched
	if f.cron == "" {
		return usageErrorf("--cron is required: a cron expression such as \"0 3 * * *\" or @daily")
	}
	name, file := args[0], args[1]
	var src []byte
	var err error
	if file == "-" {
		src, err = io.ReadAll(io.LimitReader(os.Stdin, orchestrator.MaxAPIBody+1))
		file = "stdin"
	} else {
		src, err = os.ReadFile(file)
	}
	if err != nil {
		return fmt.Errorf("read workflow: %w", err)
	}
	return withClient(ctx, e, func(ctx context.Context, c *client.Client) error {
		sc, err := c.CreateSchedule(ctx, client.ScheduleRequest{Name: name, Cron: f.cron, TZ: f.tz,
			CatchUp: f.catchUp, File: filepath.Base(file), Workflow: string(src)})
		if err != nil {
			return err
		}
		if ok, err := e.printStructured(sc); ok {
			return err
		}
		fmt.Fprintf(e.stdout, "schedule %s created; next fire %s\n", cell(sc.Name), fmtTime(sc.NextFire))
		return nil
	})
}

func scheduleList(ctx context.Context, e *env, _ []string) error {
	return withClient(ctx, e, func(ctx context.Context, c *client.Client) error {
		out, err := c.Schedules(ctx)
		if err != nil {
			return err
		}
		if ok, err := e.printStructured(out); ok {
			return err
		}
		tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tCRON\tTZ\tCATCH-UP\tSTATE\tLAST FIRE\tNEXT FIRE\tRUNS\tLAST RUN")
		for _, s := range out.Schedules {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", cell(s.Name), cell(s.Cron), cell(s.TZ), s.CatchUp, schedState(s),
				fmtTime(s.LastFire), fmtTime(s.NextFire), s.Runs, dash(s.LastRun))
		}
		return tw.Flush()
	})
}

func schedState(s client.Schedule) string {
	if s.Paused {
		return "paused"
	}
	return "active"
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return cell(s)
}

func printSchedule(e *env, s *client.Schedule) error {
	if ok, err := e.printStructured(s); ok {
		return err
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	for _, kv := range [][2]string{
		{"name", cell(s.Name)}, {"cron", cell(s.Cron)}, {"tz", cell(s.TZ)}, {"catch-up", s.CatchUp}, {"state", schedState(*s)},
		{"workflow", fmt.Sprintf("%s (%d step%s)", cell(s.Workflow), s.Steps, plural(s.Steps))},
		{"created", fmtTime(s.CreatedAt) + " by " + cell(s.CreatedBy)}, {"last fire", fmtTime(s.LastFire)},
		{"next fire", fmtTime(s.NextFire)}, {"runs", fmt.Sprintf("%d (last %s), %d fire times skipped", s.Runs, dash(s.LastRun), s.Skipped)},
	} {
		fmt.Fprintf(tw, "%s:\t%s\n", kv[0], kv[1])
	}
	for i, t := range s.Upcoming {
		fmt.Fprintf(tw, "upcoming %d:\t%s\n", i+1, fmtTime(t))
	}
	return tw.Flush()
}

func scheduleShow(ctx context.Context, e *env, args []string) error {
	return withClient(ctx, e, func(ctx context.Context, c *client.Client) error {
		s, err := c.Schedule(ctx, args[0])
		if err != nil {
			return err
		}
		return printSchedule(e, s)
	})
}

func scheduleOp(ctx context.Context, e *env, name, op string) error {
	return withClient(ctx, e, func(ctx context.Context, c *client.Client) error {
		var s *client.Schedule
		var err error
		if op == "pause" {
			s, err = c.PauseSchedule(ctx, name)
		} else {
			s, err = c.ResumeSchedule(ctx, name)
		}
		if err != nil {
			return err
		}
		return printSchedule(e, s)
	})
}

func scheduleRm(ctx context.Context, e *env, args []string) error {
	return withClient(ctx, e, func(ctx context.Context, c *client.Client) error {
		if err := c.DeleteSchedule(ctx, args[0]); err != nil {
			return err
		}
		if ok, err := e.printStructured(client.DeletedSchedule{Deleted: args[0]}); ok {
			return err
		}
		fmt.Fprintf(e.stdout, "schedule %s deleted\n", cell(args[0]))
		return nil
	})
}
