package sim

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/tether-run/tether/core"
	"github.com/tether-run/tether/spec"
)

// apiCall is an operator call in flight.
type apiCall struct {
	lost bool // the orchestrator crashed before answering
	on   func(core.APIAnswer)
}

// call sends an operator API call; a down orchestrator refuses it at once.
func (w *world) call(mk func(core.CallID) core.Input, on func(core.APIAnswer)) bool {
	if !w.orch.up || w.orchFrozen() {
		return false
	}
	w.callSeq++
	id := w.callSeq
	w.calls[id] = &apiCall{on: on}
	w.orchInput(mk(id))
	return true
}

func (w *world) answered(a core.APIAnswer) {
	c := w.calls[a.Call]
	if c == nil {
		return
	}
	delete(w.calls, a.Call)
	if c.on != nil {
		c.on(a)
	}
}

// requestToken creates an enrollment token, retrying while the orchestrator
// is down or the answer was lost to a crash.
func (w *world) requestToken(then func(token string)) {
	var try func()
	try = func() {
		var secret [16]byte
		for i := range secret {
			secret[i] = byte(w.r.Uint32())
		}
		name := fmt.Sprintf("tok-%d", w.callSeq+1)
		answered := false
		w.call(func(id core.CallID) core.Input {
			return core.CreateToken{Call: id, Name: name, TTL: 24 * time.Hour, Secret: secret}
		}, func(a core.APIAnswer) {
			answered = true
			if a.Err == "" {
				then(a.Token)
			}
		})
		w.after(30*time.Second, evOperator, -1, nil, "token retry", func() {
			if !answered {
				try()
			}
		})
	}
	try()
}

// hostileNames are names with control characters (SPEC §12).
var hostileNames = []string{"w\x1b[2J", "a\r\nb", "nul\x00", "del\x7f", "evil\u202egnp"}

// submitHostile sends, beside a genuine submit, the same run with one name
// made hostile (the k-th of a rotation over the run's name, a step name, a
// tag, a label and a target), or a token with a hostile name: each must be
// refused as a bad name and create nothing (SPEC §12). It draws nothing
// from the world's randomness, so seeds keep their schedules.
func (w *world) submitHostile(spec core.RunSpec, k int) {
	bad := hostileNames[k%len(hostileNames)]
	expect := func(what string) func(core.APIAnswer) {
		return func(a core.APIAnswer) {
			if !strings.Contains(a.Err, core.ErrBadName.Error()) {
				w.fail("names", fmt.Sprintf("a %s with the name %q was not refused as a bad name: run %q, error %q", what, bad, a.Run, a.Err))
			}
		}
	}
	if k%6 == 5 {
		w.call(func(id core.CallID) core.Input { return core.CreateToken{Call: id, Name: bad, TTL: time.Hour} }, expect("token"))
		return
	}
	s := spec
	s.Steps = append([]core.StepSpec(nil), spec.Steps...)
	first := s.Steps[0]
	switch k % 6 {
	case 0:
		s.Name = bad
	case 1:
		first.Name = bad
	case 2:
		first.Tags = append(append([]string(nil), first.Tags...), bad)
	case 3:
		first.Labels = map[string]string{"zone": bad}
	case 4:
		first.Target = bad
	}
	s.Steps[0] = first
	w.call(func(id core.CallID) core.Input { return core.Submit{Call: id, Spec: s} }, expect("run"))
}

// ---- the operator ----

func (w *world) startOperator() {
	if w.opt.Locks {
		w.after(time.Minute, evOperator, -1, nil, "schedule create", w.startSchedule)
	}
	// Once, a hostile client with a token of its own (SPEC §12). No random
	// draw: the rest of the seed's world is what it was without it.
	w.after(45*time.Second, evOperator, -1, nil, "hostile hellos", w.hostileHellos)
	var submit func()
	submit = func() {
		if w.healed || w.runsSent >= w.opt.Runs {
			return // the workload runs through the fault phase, up to Runs
		}
		if w.runsSent%4 == 3 {
			w.submitOverLimit() // every 4th submit is preceded by one the limits refuse (SPEC §12)
		}
		spec := w.randomRun()
		called := w.now
		w.call(func(id core.CallID) core.Input { return core.Submit{Call: id, Spec: spec} }, func(a core.APIAnswer) {
			if a.Err != "" {
				w.fail("workload", "a generated run was refused: "+a.Err)
				return
			}
			w.hist.runs = append(w.hist.runs, a.Run)
			w.hist.submitted(a.Run, spec)
			w.declared(a.Run, spec)
			// One submit operation per step, for the linearizability check.
			if r, _, ok := w.view().Run(a.Run); ok {
				for _, s := range r.Steps {
					sp, _ := w.view().StepSpecOf(s)
					op := w.hist.begin(called, opClientOperator, spec2input(s, sp))
					w.hist.end(op, w.now, specOutputOK())
				}
			}
		})
		if w.runsSent%4 == 0 {
			w.submitHostile(spec, w.runsSent/4)
		}
		w.runsSent++
		w.after(w.exp(w.opt.SubmitEvery), evOperator, -1, nil, "submit", submit)
	}
	w.after(w.uniform(time.Second, 30*time.Second), evOperator, -1, nil, "submit", submit)

	if w.opt.CancelEvery > 0 {
		var cancel func()
		cancel = func() {
			if w.healed {
				return
			}
			if len(w.hist.runs) > 0 {
				run := w.hist.runs[w.r.IntN(len(w.hist.runs))]
				w.cancelRun(run)
			}
			w.after(w.exp(w.opt.CancelEvery), evOperator, -1, nil, "cancel", cancel)
		}
		w.after(w.exp(w.opt.CancelEvery), evOperator, -1, nil, "cancel", cancel)
	}
	if w.opt.RerunEvery > 0 {
		var rerun func()
		rerun = func() {
			if w.healed {
				return
			}
			if len(w.hist.runs) > 0 {
				w.rerunRun(w.hist.runs[w.r.IntN(len(w.hist.runs))])
			}
			w.after(w.exp(w.opt.RerunEvery), evOperator, -1, nil, "rerun", rerun)
		}
		w.after(w.exp(w.opt.RerunEvery), evOperator, -1, nil, "rerun", rerun)
	}
	if w.opt.RevokeEvery > 0 {
		var revoke func()
		revoke = func() {
			if w.healed {
				return
			}
			var live []*workerNode
			for _, wn := range w.workers {
				if wn.alive && !wn.revoked && !wn.allTags {
					live = append(live, wn)
				}
			}
			if len(live) > 0 {
				w.revoke(live[w.r.IntN(len(live))])
			}
			w.after(w.exp(w.opt.RevokeEvery), evOperator, -1, nil, "revoke", revoke)
		}
		w.after(w.exp(w.opt.RevokeEvery), evOperator, -1, nil, "revoke", revoke)
	}
	if w.opt.ReplayEvery > 0 {
		var replay func()
		replay = func() {
			if w.healed {
				return
			}
			if len(w.workers) > 0 {
				victim := w.workers[w.r.IntN(len(w.workers))]
				w.fault("token-replay")
				wn := w.spawnWorker(victim.m.Config().Token, false, false)
				wn.replay = true
			}
			w.after(w.exp(w.opt.ReplayEvery), evOperator, -1, nil, "token replay", replay)
		}
		w.after(w.exp(w.opt.ReplayEvery), evOperator, -1, nil, "token replay", replay)
	}
	var query func()
	query = func() {
		if w.orch.up {
			w.queryRandomStep()
			if w.chance(0.3) || w.healed {
				w.approveHeld()
			}
		}
		if !w.finished() {
			w.after(w.opt.QueryEvery, evOperator, -1, nil, "query", query)
		}
	}
	w.after(w.opt.QueryEvery, evOperator, -1, nil, "query", query)
}

// revoke revokes a worker's enrollment token (the operator's API call).
func (w *world) revoke(wn *workerNode) {
	name := tokenName(wn.m.Config().Token)
	if w.call(func(id core.CallID) core.Input { return core.RevokeToken{Call: id, Name: name} }, nil) {
		wn.revoked = true
		w.fault("token-revoke")
	}
}

func tokenName(tok string) string {
	for i := 0; i < len(tok); i++ {
		if tok[i] == '.' {
			return tok[:i]
		}
	}
	return tok
}

// cancelRun cancels a run; for the linearizability check it is one cancel
// operation on each of the run's steps.
func (w *world) cancelRun(run core.RunID) {
	if !w.orch.up {
		return
	}
	r, _, ok := w.view().Run(run)
	if !ok {
		return
	}
	ops := make([]int, len(r.Steps))
	for i, s := range r.Steps {
		ops[i] = w.hist.begin(w.now, opClientOperator, spec.StepInput{Kind: spec.OpCancel, Step: s})
	}
	w.call(func(id core.CallID) core.Input { return core.CancelRun{Call: id, Run: run} }, func(a core.APIAnswer) {
		for _, op := range ops {
			w.hist.end(op, w.now, spec.StepOutput{Err: a.Err})
		}
	})
}

// rerunRun reruns a run finished a minute or more ago (its finish durable,
// as the API's snapshot or history read it) with its successes reused
// (run rerun --failed-only, SPEC §2); for the linearizability check each
// reused step is submitted committed with its old outcome.
func (w *world) rerunRun(run core.RunID) {
	if !w.orch.up {
		return
	}
	v := w.view()
	r, _, ok := v.Run(run)
	if !ok || !r.Finished || w.onow().Sub(r.FinishedAt) < time.Minute {
		return
	}
	var steps []core.StepRecord
	for _, id := range r.Steps {
		if st, ok := v.StepByID(id); ok {
			steps = append(steps, st)
		}
	}
	reuse := core.ReusePlan(r, steps)
	rs := r.Spec
	called := w.now
	w.call(func(id core.CallID) core.Input { return core.Submit{Call: id, Spec: rs, RerunOf: run, Reuse: reuse} }, func(a core.APIAnswer) {
		if a.Err != "" {
			w.fail("workload", fmt.Sprintf("a rerun of %s was refused: %s", run, a.Err))
			return
		}
		w.reruns++
		w.hist.runs = append(w.hist.runs, a.Run)
		w.hist.submitted(a.Run, rs)
		reused := map[core.StepID]core.Outcome{}
		for _, u := range reuse {
			reused[core.StepID(string(a.Run)+"/"+u.Step)] = u.Outcome
		}
		if nr, _, ok := w.view().Run(a.Run); ok {
			for _, s := range nr.Steps {
				sp, _ := w.view().StepSpecOf(s)
				in := spec2input(s, sp)
				if o, ok := reused[s]; ok {
					in.Reused = &o
				}
				op := w.hist.begin(called, opClientOperator, in)
				w.hist.end(op, w.now, specOutputOK())
			}
		}
	})
}

// queryRandomStep reads a step as a client would: the answer reflects only
// durable state and is returned once that state is synced.
func (w *world) queryRandomStep() {
	v := w.view() // an archived step is read as a live one (SPEC §7a)
	ids := v.StepIDs()
	if len(ids) == 0 {
		return
	}
	s, _ := v.StepByID(ids[w.r.IntN(len(ids))])
	if sp, _ := v.StepSpecOf(s.ID); sp.Type == "task" || sp.Workflow != nil || s.ReusedFrom != "" {
		return // task, workflow and reused steps commit without a report: not in the model
	}
	op := w.hist.begin(w.now, opClientOperator, spec.StepInput{Kind: spec.OpQuery, Step: s.ID})
	out := spec.StepOutput{State: s.State, Outcome: s.Outcome}
	w.orchRead(func() { w.hist.end(op, w.now, out) })
}

func (w *world) approveHeld() {
	for _, s := range w.orch.o.Steps() {
		if s.State == core.StateHeld {
			id := s.ID
			if w.healed || w.chance(0.5) {
				w.call(func(c core.CallID) core.Input { return core.Approve{Call: c, Step: id} }, nil)
			} else {
				w.call(func(c core.CallID) core.Input { return core.RejectGate{Call: c, Step: id} }, nil)
			}
			return
		}
	}
}

// submitOverLimit submits a run over one of the limits of SPEC §2/§12
// (forEach items, expanded edges, dispatch bytes, in turn); it must be
// refused and create nothing. It draws no randomness, so the rest of the
// workload is the same as without it.
func (w *world) submitOverLimit() {
	items := func(n int) []string { // "0", "1", … as substrings of one string
		var b []byte
		ends := make([]int, n)
		for i := range ends {
			b = strconv.AppendInt(b, int64(i), 10)
			ends[i] = len(b)
		}
		all, out, start := string(b), make([]string, n), 0
		for i, end := range ends {
			out[i], start = all[start:end], end
		}
		return out
	}
	var spec core.RunSpec
	switch w.runsSent / 4 % 3 {
	case 0:
		spec.Steps = []core.StepSpec{{Name: "fan", Command: "work", ForEach: items(core.MaxForEachItems + 1)}}
	case 1: // 71 × 71 = 5,041 edges
		spec.Steps = []core.StepSpec{{Name: "a", Command: "work", ForEach: items(71)}, {Name: "b", Command: "work", ForEach: items(71), DependsOn: []string{"a"}}}
	default:
		spec.Steps = []core.StepSpec{{Name: "env", Command: "work", Env: map[string]string{}}}
		for i := range 5 {
			spec.Steps[0].Env[fmt.Sprintf("V%d", i)] = strings.Repeat("v", core.MaxEnvValueBytes)
		}
	}
	w.call(func(id core.CallID) core.Input { return core.Submit{Call: id, Spec: spec} }, func(a core.APIAnswer) {
		if a.Err == "" || a.Run != "" {
			w.fail("workload", fmt.Sprintf("a run over the limits of SPEC §12 was accepted as %s", a.Run))
		}
	})
}

// randomRun draws a DAG workflow.
// targetFrac is the share of steps that target one worker instance by name.
const targetFrac = 0.04

func (w *world) randomRun() core.RunSpec {
	n := 1 + w.r.IntN(w.opt.StepsMax)
	rs := core.RunSpec{Name: fmt.Sprintf("run%d", w.runsSent+1)}
	if w.chance(0.1) {
		rs.Timeout = w.uniform(5*time.Minute, 60*time.Minute)
	}
	for i := 0; i < n; i++ {
		s := core.StepSpec{Name: fmt.Sprintf("s%d", i), Command: "work", Writes: w.chance(w.opt.WriteFrac)}
		if n := stepSecret(i); n != "" {
			s.Secrets = []string{n} // by its index: draws nothing (sim/secrets.go)
		}
		for j := 0; j < i; j++ {
			if w.chance(0.4) {
				s.DependsOn = append(s.DependsOn, fmt.Sprintf("s%d", j))
			}
		}
		if w.chance(w.opt.TagFrac) {
			// 1–3 required tags (0 for the others): a step requiring
			// several is granted only to a worker holding all of them.
			for _, k := range w.r.Perm(len(workerTags))[:1+w.r.IntN(len(workerTags))] {
				s.Tags = append(s.Tags, workerTags[k])
			}
		}
		if len(w.workers) > 0 && w.chance(targetFrac) {
			// A step for one instance, alive or not: once that instance
			// is out of the pool, nothing else matches it, and the
			// unmatched sweep must fail it (SPEC §5).
			s.Target = string(w.workers[w.r.IntN(len(w.workers))].id)
		}
		if w.chance(w.opt.ForEachFrac) {
			s.ForEach = []string{"a", "b", "c"}
			s.Concurrency = 1 + w.r.IntN(2)
		}
		switch {
		case w.chance(w.opt.HoldFrac):
			s.Hold = true
		case w.chance(w.opt.WaitFrac):
			s.Wait = w.uniform(time.Second, time.Minute)
		}
		if w.chance(w.opt.TimeoutFrac) {
			s.Timeout = w.uniform(w.opt.ExecMin, 2*w.opt.ExecMax)
		}
		if s.Writes && i%2 == 0 {
			// Declared writes (SPEC §14): an id and a prefix. Drawn from
			// nothing, so the workload's stream is the same as without.
			s.Outputs = []string{fmt.Sprintf("s%d.out", i), fmt.Sprintf("s%d-*", i)}
		}
		if w.opt.RetryFrac > 0 && w.chance(w.opt.RetryFrac) {
			w.retryPolicy(&s)
		}
		if w.opt.ChildFrac > 0 && w.chance(w.opt.ChildFrac) {
			s = w.childStep(s)
		}
		rs.Steps = append(rs.Steps, s)
	}
	if w.opt.Locks {
		lockRun(&rs, w.runsSent)
	}
	return rs
}

// flakyCommand is the command of a step with a retry policy: its process
// exits 1 half the time (sim/worker.go), whatever FailProb says.
const flakyCommand = "work-flaky"

// retryPolicy gives s a retry policy (SPEC §1 RETRY): 1–3 retries, a
// backoff up to 30 s, on any non-zero exit, on exit 1 (the simulated
// processes' failure code), on exit 3 (never theirs: never retried) or on
// exit 1 and the timeout. A write-bearing step says idempotent: without
// it the policy is refused at submit (§2).
func (w *world) retryPolicy(s *core.StepSpec) {
	p := &core.RetryPolicy{Attempts: 1 + w.r.IntN(3), Backoff: w.uniform(0, 30*time.Second)}
	switch w.r.IntN(4) {
	case 1:
		p.Codes = []int{1}
	case 2:
		p.Codes = []int{3}
	case 3:
		p.Codes, p.OnTimeout = []int{1}, true
	}
	s.Retry, s.Idempotent, s.Command = p, s.Writes, flakyCommand
}

// lockRun puts some runs and steps in concurrency groups (SPEC §8a),
// without a draw from the world's randomness: every third run in group
// "latest" (max 1, cancel_in_progress: the newest wins), every sixth in
// "pair" (max 2, queued in submit order), and every fourth run's first
// step in step group "db" (max 2, across runs).
func lockRun(rs *core.RunSpec, n int) {
	switch {
	case n%3 == 0:
		rs.Group = core.ConcurrencyGroup{Name: "latest", Max: 1, CancelInProgress: true}
	case n%6 == 1:
		rs.Group = core.ConcurrencyGroup{Name: "pair", Max: 2}
	}
	if n%4 == 2 && rs.Steps[0].Workflow == nil { // a workflow step holds no lease: no step group (SPEC §2)
		rs.Steps[0].Group = core.ConcurrencyGroup{Name: "db", Max: 2}
	}
}

// scheduleName is the schedule the operator keeps during the fault phase.
const scheduleName = "tick"

// startSchedule creates the schedule (SPEC §8a) — a run every 4 minutes,
// with the seed's catch-up policy — retrying while the orchestrator is
// down or the answer was lost; heal deletes it.
func (w *world) startSchedule() {
	spec := core.RunSpec{Name: "scheduled", Steps: []core.StepSpec{
		{Name: "a", Command: "work"}, {Name: "b", Command: "work", DependsOn: []string{"a"}, Group: core.ConcurrencyGroup{Name: "db", Max: 2}}}}
	var try func()
	try = func() {
		done := false
		w.call(func(id core.CallID) core.Input {
			return core.CreateSchedule{Call: id, Name: scheduleName, Cron: "*/4 * * * *", CatchUp: w.opt.CatchUp, Spec: spec}
		}, func(a core.APIAnswer) {
			done = a.Err == "" || a.Code == core.CodeConflict // created, or created by a call whose answer was lost
			if a.Err != "" && a.Code != core.CodeConflict {
				w.fail("workload", "the schedule was refused: "+a.Err)
			}
		})
		w.after(30*time.Second, evOperator, -1, nil, "schedule retry", func() {
			if !done && !w.healed {
				try()
			}
		})
	}
	try()
}

// stopSchedule deletes the schedule once faults stop, so that the runs
// can all finish; retried until it is gone.
func (w *world) stopSchedule() {
	done := false
	w.call(func(id core.CallID) core.Input {
		return core.ChangeSchedule{Call: id, Name: scheduleName, Op: core.ScheduleDelete}
	}, func(a core.APIAnswer) { done = a.Err == "" || a.Code == core.CodeNotFound })
	w.after(30*time.Second, evHeal, -1, nil, "schedule delete retry", func() {
		if !done {
			w.stopSchedule()
		}
	})
}

// persistedSchedules checks ScheduleFiresOnce on a durable batch and
// records the runs a schedule started as submitted, for the
// linearizability check (one submit operation per step, at the moment
// the run became durable).
func (w *world) persistedSchedules(rd core.Ready) {
	if !w.opt.Locks {
		return
	}
	if w.fires == nil {
		w.fires = spec.NewScheduleFires()
	}
	started, v := w.fires.Persisted(rd)
	if v != nil {
		w.fail(v.Invariant, v.Detail)
	}
	for _, r := range started {
		if r.SubmittedAt.Sub(r.FireAt) > core.ScheduleLateness {
			w.locks.CaughtUp++ // fired late: the orchestrator was down at its fire time
		}
		w.hist.submitted(r.ID, r.Spec)
		for _, s := range r.Steps {
			sp, _ := w.view().StepSpecOf(s)
			op := w.hist.begin(w.now, opClientOperator, spec2input(s, sp))
			w.hist.end(op, w.now, specOutputOK())
		}
	}
}

// ---- phases ----

func (w *world) startFaults() {
	if w.opt.PartitionEvery > 0 {
		var p func()
		p = func() {
			if w.healed {
				return
			}
			w.partition()
			w.after(w.exp(w.opt.PartitionEvery), evFault, -1, nil, "partition", p)
		}
		w.after(w.exp(w.opt.PartitionEvery), evFault, -1, nil, "partition", p)
	}
	if w.opt.ClogEvery > 0 {
		var c func()
		c = func() {
			if w.healed {
				return
			}
			w.swizzleClog()
			w.after(w.exp(w.opt.ClogEvery), evFault, -1, nil, "clog", c)
		}
		w.after(w.exp(w.opt.ClogEvery), evFault, -1, nil, "clog", c)
	}
	if w.opt.OrchCrashEvery > 0 {
		var c func()
		c = func() {
			if w.healed {
				return
			}
			w.crashOrch()
			w.after(w.exp(w.opt.OrchCrashEvery), evFault, -1, nil, "orchestrator crash", c)
		}
		w.after(w.exp(w.opt.OrchCrashEvery), evFault, -1, nil, "orchestrator crash", c)
	}
}

// heal ends the fault phase: the network heals, nothing crashes or pauses any
// more, the orchestrator is up, held steps get approved, and a healthy worker
// with every tag joins. Then time runs for a bound derived from the timeouts.
func (w *world) heal() {
	w.healed = true
	for _, wn := range w.workers {
		wn.link = link{scale: wn.link.scale}
		if wn.pausedUntil.After(w.now) {
			wn.pausedUntil = w.now
			w.resume(wn)
		}
	}
	if !w.orch.up && w.ha == nil {
		w.restartOrch() // with the failover fault, a standby takes over
	}
	w.requestToken(func(token string) { w.spawnWorker(token, false, true) })
	if w.opt.Locks {
		w.stopSchedule()
	}
	cfg := core.DefaultConfig()
	per := w.opt.ExecMax + 2*w.opt.MaxDelayWork + cfg.HeartbeatTimeout + 2*cfg.SweepInterval + cfg.ForceCancel
	chain := 3 * w.opt.StepsMax
	if w.opt.ChildFrac > 0 {
		chain *= 1 + childStepsMax // a workflow step waits for its child's chain
	}
	bound := time.Duration(chain+cfg.MaxAttempts)*per + 10*time.Minute
	if w.opt.RetryFrac > 0 {
		bound *= 4 // a step runs up to 4 tries (retryPolicy)
	}
	w.deadline = w.now.Add(bound)
	var check func()
	check = func() {
		if w.finished() {
			w.deadline = w.now
			return
		}
		w.after(30*time.Second, evHeal, -1, nil, "liveness check", check)
	}
	w.after(30*time.Second, evHeal, -1, nil, "liveness check", check)
}

// finished: every submitted run is terminal (as far as the live state says).
func (w *world) finished() bool {
	if !w.orch.up || !w.healed {
		return false
	}
	v := w.view()
	for _, id := range v.RunIDs() {
		if r, _, _ := v.Run(id); !r.Finished {
			return false
		}
	}
	return true
}

func spec2input(s core.StepID, sp core.StepSpec) spec.StepInput {
	in := spec.StepInput{Kind: spec.OpSubmit, Step: s}
	if sp.Retry != nil {
		in.Retries = sp.Retry.Attempts
	}
	return in
}

func specOutputOK() spec.StepOutput { return spec.StepOutput{} }

// hostileConn is the first connection id of the hostile client, far from
// the ids the network gives the workers' connections.
const hostileConn core.ConnID = 1 << 62

// hostileHellos is a client holding a valid enrollment token that sends
// Hellos each beyond one limit of SPEC §12 (the core's checkHello): each
// must be refused, fatally, on its own connection, and change nothing: no
// worker enrolls and the token is still unused. (It never sends a
// well-formed Hello: a worker that enrolls and leaves at once would cost a
// step a dispatch attempt.)
func (w *world) hostileHellos() {
	if w.healed {
		return
	}
	var secret [16]byte
	secret[0] = 0x51 // fixed: no draw from the world's randomness
	w.call(func(id core.CallID) core.Input {
		return core.CreateToken{Call: id, Name: "hostile", TTL: time.Hour, Secret: secret}
	}, func(a core.APIAnswer) {
		if a.Err != "" || !w.orch.up || w.orchFrozen() {
			return
		}
		base := core.Hello{Version: core.ProtocolVersion, Token: a.Token, Worker: "hostile", Name: "hostile", Slots: 1, MaxDelay: time.Minute}
		bad := []core.Hello{base, base, base, base}
		bad[0].Slots = 0
		for i := range core.MaxWorkerTags + 1 {
			bad[1].Tags = append(bad[1].Tags, fmt.Sprintf("t%d", i))
		}
		bad[2].Name = "hostile\x1b[2J"
		bad[3].InFlight = make([]core.LeaseRef, core.MaxInFlightLeases+1)
		for i, h := range bad {
			c := hostileConn + core.ConnID(i)
			rd := w.orchInput(core.Received{Conn: c, Msg: h})
			if !w.orch.up || w.orchFrozen() {
				return
			}
			refused := false
			for _, e := range rd.Messages {
				if rf, ok := e.Msg.(core.Refused); ok && e.Conn == c && rf.Fatal {
					refused = true
				}
			}
			if !refused || hostileEnrolled(w.orch.o) {
				w.fail("hostile-hello", fmt.Sprintf("hostile hello %d was not refused, or it enrolled or used up its token: %v", i, rd.Messages))
				return
			}
		}
	})
}

// hostileEnrolled says whether the hostile client enrolled or its token was
// used up.
func hostileEnrolled(o *core.Orchestrator) bool {
	for _, wv := range o.Workers() {
		if wv.ID == "hostile" {
			return true
		}
	}
	for _, t := range o.Tokens() {
		if t.Name == "hostile" && t.Consumed {
			return true
		}
	}
	return false
}
