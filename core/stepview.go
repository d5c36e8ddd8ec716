package core

import (
	"errors"
	"fmt"
	"strings"
)

// What a step may read of the orchestrator (SPEC §14: readDefinition,
// readOutput, the pool as data). The data plane asks these on behalf of a
// lease: a lease that ended still reads while its run is live (its
// records are in the core); once the run finished they are archived
// (§7a) and the lease names nothing.

// ErrNoSuchStep is returned (wrapped) when a lease or a step name names
// no live step.
var ErrNoSuchStep = errors.New("no such step")

// StepDefinition is a step's readDefinition: its run, the run's workflow
// and its own declaration (forEach instances share it; Item is theirs).
type StepDefinition struct {
	Run        RunID
	Step       StepID
	Workflow   RunSpec
	Definition StepSpec
	Item       string
}

// StepOutput is readOutput of a step of the lease's run: its state, exit
// code once it reported one, and declared outputs.
type StepOutput struct {
	Step    StepID
	State   State
	Exit    *int
	Outputs []string
}

// PoolWorker is one worker as a step sees the pool: no token, no
// credential.
type PoolWorker struct {
	ID     WorkerID
	Name   string
	State  string // connected, disconnected, draining, inactive, revoked
	Labels map[string]string
	Tags   []string
	Slots  int
	Busy   int // its current leases
}

// leaseStep finds worker w's lease l and its live step.
func (o *Orchestrator) leaseStep(w WorkerID, l LeaseID) (*StepRecord, error) {
	lr := o.leases[l]
	if lr == nil || lr.Worker != w {
		if o.closedFind(w, l) != nil {
			return nil, fmt.Errorf("%w: lease %d: its run finished", ErrNoSuchStep, l)
		}
		return nil, fmt.Errorf("%w: lease %d is not worker %s's", ErrUnknownLease, l, w)
	}
	s := o.steps[lr.Step]
	if s == nil {
		return nil, fmt.Errorf("%w: lease %d: step %s", ErrNoSuchStep, l, lr.Step)
	}
	return s, nil
}

// Definition answers readDefinition for worker w's lease l.
func (o *Orchestrator) Definition(w WorkerID, l LeaseID) (StepDefinition, error) {
	s, err := o.leaseStep(w, l)
	if err != nil {
		return StepDefinition{}, err
	}
	r, sp := o.runs[s.Run], o.specOf[s.ID]
	if r == nil || sp == nil {
		return StepDefinition{}, fmt.Errorf("%w: step %s has no declaration", ErrNoSuchStep, s.ID)
	}
	return StepDefinition{Run: s.Run, Step: s.ID, Workflow: r.Spec, Definition: *sp, Item: s.Item}, nil
}

// Output answers readOutput for worker w's lease l: the step named name
// ("build", or a forEach instance "build[2]") of the lease's run.
func (o *Orchestrator) Output(w WorkerID, l LeaseID, name string) (StepOutput, error) {
	s, err := o.leaseStep(w, l)
	if err != nil {
		return StepOutput{}, err
	}
	if name == "" || strings.Contains(name, "/") {
		return StepOutput{}, fmt.Errorf("%w: %s: want a step name of the run", ErrNoSuchStep, Quote(name))
	}
	id := StepID(string(s.Run) + "/" + name)
	t := o.steps[id]
	if t == nil {
		return StepOutput{}, fmt.Errorf("%w: run %s has no step %s", ErrNoSuchStep, s.Run, Quote(name))
	}
	out := StepOutput{Step: id, State: t.State}
	if sp := o.specOf[id]; sp != nil {
		out.Outputs = append([]string{}, sp.Outputs...)
	}
	if t.Outcome != nil && (t.Outcome.Status == OutcomeSuccess || t.Outcome.Status == OutcomeFailure) {
		exit := t.Outcome.ExitCode
		out.Exit = &exit
	}
	return out, nil
}

// Pool lists the workers, sorted by id, as a step sees them.
func (o *Orchestrator) Pool() []PoolWorker {
	out := make([]PoolWorker, 0, len(o.workers))
	for _, id := range sortedKeys(o.workers) {
		w := o.workers[id]
		p := PoolWorker{ID: w.ID, Name: w.Name, Labels: copyMap(w.Labels), Tags: append([]string{}, w.Tags...), Slots: w.Slots, Busy: len(o.workerLeases[id])}
		switch {
		case w.Revoked:
			p.State = "revoked"
		case !w.Active:
			p.State = "inactive"
		case w.Draining:
			p.State = "draining"
		case o.connected(id):
			p.State = "connected"
		default:
			p.State = "disconnected"
		}
		out = append(out, p)
	}
	return out
}
