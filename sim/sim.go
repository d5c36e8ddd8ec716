package sim

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/anishathalye/porcupine"

	"github.com/tether-run/tether/core"
	"github.com/tether-run/tether/spec"
)

// Simulate runs one seed: a fault phase with the seed's swarm options, then a
// liveness phase after healing; safety invariants after every event, then
// liveness, log continuity and linearizability at the end. It is a pure
// function of (seed, opt, cfg).
func Simulate(seed uint64, opt Options, cfg Config) Result {
	w := newWorld(seed, opt, cfg)
	w.orchCfg.CredentialTTL = opt.CredentialTTL // 0: the core's default
	// The world never fingerprints nor clones the core, as the real driver
	// does not: the core keeps no second copy of its state's records
	// (core.Config.NoStateCache; decisions and batches do not depend on it).
	w.orchCfg.NoStateCache = true
	w.orch = &orchNode{o: core.NewOrchestrator(w.coreConfig()), up: true, disk: newSimDisk()}
	if opt.Failover > 0 {
		w.newCluster()
	}
	for i := 0; i < opt.Workers; i++ {
		allTags := i == 0
		w.requestToken(func(tok string) { w.spawnWorker(tok, false, allTags) })
	}
	for i := 0; i < opt.Scalers; i++ {
		w.requestToken(func(tok string) { w.spawnWorker(tok, true, false) })
	}
	w.startOperator()
	w.startFaults()
	w.startFailoverFaults()
	w.at(w.faultEnd, evHeal, -1, nil, "heal: faults stop", w.heal)
	w.run()
	res := Result{Seed: seed, Events: w.events, SimTime: w.now.Sub(t0), Faults: w.faults, Buggified: w.buggified, Retries: w.retries, Reruns: w.reruns,
		Checks: w.chk.Checks(), TraceHash: w.trace, Options: opt, WorkerLogs: w.wlogs}
	if w.failure == nil && !cfg.traceOnly {
		w.finalChecks()
	}
	res.PorcOps = w.hist.steps.Len()
	res.LargestStep = w.hist.largestStep()
	res.Inconclusive = w.inconclusive
	res.Failure = w.failure
	res.Output = w.out
	res.Data = w.dataStats()
	res.Archive = w.arch.stats
	res.ChildRuns = w.childRuns
	res.Locks = w.locks
	res.Ahead = w.ahead
	if w.ha != nil {
		res.Failover = w.ha.stats
	}
	if w.orch.up {
		v := w.view()
		for _, id := range v.RunIDs() {
			r, _, _ := v.Run(id)
			if r.Finished {
				res.RunsDone++
			}
			res.StepsTotal += len(r.Steps)
		}
	}
	return res
}

func (w *world) finalChecks() {
	if !w.orch.up {
		w.fail("liveness", "the orchestrator is down at the end of the liveness phase")
		return
	}
	if !w.finished() {
		var open []string
		v := w.view()
		for _, id := range v.RunIDs() {
			if r, st, _ := v.Run(id); !r.Finished {
				open = append(open, fmt.Sprintf("%s (%s)", id, st))
			}
		}
		w.fail("8 every-run-terminates", fmt.Sprintf("runs not finished %s after healing: %v", w.now.Sub(w.faultEnd), open))
		return
	}
	if v := w.chk.CheckLiveness(w.view()); v != nil {
		w.fail(v.Invariant, v.Detail)
		return
	}
	if w.checkStoredWrites(); w.failure != nil {
		return
	}
	msg, markers, ok := w.hist.checkLogs(w.view(), w.storedLogs)
	w.out.DropMarkers = markers
	if !ok {
		w.fail("log-continuity", msg)
		return
	}
	ops := w.hist.finish()
	bound := w.cfg.MaxStepOps
	if bound <= 0 {
		bound = spec.MaxStepOps
	}
	// No wall-clock timeout: the verdict is a function of the seed, never of
	// the machine's speed; a step's history over the bound is not checked,
	// and the check is inconclusive, never a violation nor a pass.
	c := spec.CheckSteps(ops, bound)
	switch c.Verdict {
	case spec.NotLinearizable:
		w.fail("linearizability", fmt.Sprintf("the client-visible history (%d operations) is not linearizable", len(ops)))
		if w.cfg.VizDir != "" {
			path, err := writeViz(w.cfg.VizDir, w.seed, c.Info, w.hist.notes)
			if err != nil {
				w.failure.Detail += "; writing the visualization failed: " + err.Error()
			}
			w.failure.VizPath = path
		}
	case spec.Inconclusive:
		w.inconclusive = "the linearizability check is inconclusive: " + c.Why()
	}
}

// writeViz writes porcupine's HTML visualization of a history, with the
// faults as annotations, and returns its path.
func writeViz(dir string, seed uint64, info porcupine.LinearizationInfo, notes []porcupine.Annotation) (string, error) {
	info.AddAnnotations(notes)
	path := filepath.Join(dir, fmt.Sprintf("tether-sim-%#x.html", seed))
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	if err := porcupine.Visualize(spec.StepModel, info, f); err != nil {
		f.Close()
		return "", err
	}
	return path, f.Close()
}

// GCPercent is the garbage collector's target (debug.SetGCPercent) while
// seeds run: TestSim, BenchmarkSimSeeds and cmd/simulate set it. A seed's
// heap is small and most of it short-lived: collecting a sixteenth as
// often as by default saves about a quarter of the time, for several times
// the peak memory (BenchmarkSimSeeds: 47 MiB at 100, 87 at 400, 136 at
// 800, 302 at 1,600 over seeds 1-30; TestSim over 300 seeds, two at once,
// 349 MiB at 1,600: a process stays under about 400 MiB on two cores).
const GCPercent = 1600

// MemoryLimit is the soft limit on the Go heap (debug.SetMemoryLimit) set
// with GCPercent: a long seed whose live heap is several times the usual
// would otherwise take its sixteen-fold growth (seeds 1-1,000 peaked at
// 562 MiB at GCPercent 1,600 without it); at the limit the collector runs
// as often as it must. Seeds 1-100 stay below it (at most 294 MiB).
const MemoryLimit = 384 << 20
