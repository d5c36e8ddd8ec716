package core

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
)

// RunSpec is a submitted workflow: a DAG of steps. It is what the workflow
// parser produces; the core validates it again on submit.
type RunSpec struct {
	Name    string
	Timeout time.Duration // run timeout; 0 = none
	Env     map[string]string
	Steps   []StepSpec
}

// StepSpec declares one step.
type StepSpec struct {
	Name      string
	Command   string
	DependsOn []string
	// Writes declares the step write-bearing: it is never re-dispatched once
	// started, and its process starts only after START is durably recorded.
	Writes   bool
	Type     string // "", script, docker, pod, task
	Runner   string // with type script: local, docker, pod
	Tags     []string
	Labels   map[string]string // selector: the worker must carry every pair
	Target   string            // a worker name
	Platform string
	Timeout  time.Duration // step timeout; 0 = none
	Env      map[string]string
	// ForEach fans the step out into one instance per item ("name[i]"), with
	// TETHER_ITEM set to the item; Concurrency caps the instances in flight.
	ForEach     []string
	Concurrency int
	// Gates: Hold requires an operator approval (expiring after HoldExpiry if
	// set); Wait delays the step by a timer once its dependencies succeeded.
	Hold       bool
	HoldExpiry time.Duration
	Wait       time.Duration
}

// Limits on a submitted run.
const (
	MaxStepsPerRun   = 10000
	MaxForEachItems  = 10000
	MaxNameLength    = 128
	MaxCommandLength = 64 << 10
)

// ErrInvalidRun is returned (wrapped, with the reason) when a RunSpec is not a
// valid DAG of steps.
var ErrInvalidRun = errors.New("invalid run")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidRun, fmt.Sprintf(format, args...))
}

// Validate checks a RunSpec: unique non-empty step names, known dependencies,
// no cycles, a command on every non-task step, sane gates and fan-outs.
func (r RunSpec) Validate() error {
	if len(r.Steps) == 0 {
		return invalid("run has no steps")
	}
	if r.Timeout < 0 {
		return invalid("run timeout %s is negative", r.Timeout)
	}
	if r.Name != "" {
		if err := CheckName("run name", r.Name); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidRun, err)
		}
	}
	byName := map[string]int{}
	total := 0
	for i, s := range r.Steps {
		nameErr := CheckName("step name", s.Name) // SPEC §12: printable names
		switch {
		case s.Name == "":
			return invalid("step %d has no name", i+1)
		case len(s.Name) > MaxNameLength:
			return invalid("step name %.20q… is longer than %d bytes", s.Name, MaxNameLength)
		case nameErr != nil:
			return fmt.Errorf("%w: step %d: %w", ErrInvalidRun, i+1, nameErr)
		case strings.ContainsAny(s.Name, "/[] \t\n"):
			return invalid("step name %q may not contain '/', '[', ']' or spaces", s.Name)
		}
		if _, dup := byName[s.Name]; dup {
			return invalid("step %q is declared twice", s.Name)
		}
		byName[s.Name] = i
		if s.Type != "task" && strings.TrimSpace(s.Command) == "" {
			return invalid("step %q has no command", s.Name)
		}
		if len(s.Command) > MaxCommandLength {
			return invalid("step %q: command is longer than %d bytes", s.Name, MaxCommandLength)
		}
		if _, err := RequiredTags(s); err != nil {
			return invalid("step %q: %v", s.Name, err)
		}
		if err := checkStepNames(s); err != nil {
			return fmt.Errorf("%w: step %q: %w", ErrInvalidRun, s.Name, err)
		}
		if s.Timeout < 0 || s.Wait < 0 || s.HoldExpiry < 0 {
			return invalid("step %q: negative duration", s.Name)
		}
		if s.Hold && s.Wait > 0 {
			return invalid("step %q: hold and wait cannot both gate one step", s.Name)
		}
		if s.HoldExpiry > 0 && !s.Hold {
			return invalid("step %q: hold_expiry without hold", s.Name)
		}
		if s.Concurrency < 0 {
			return invalid("step %q: concurrency %d is negative", s.Name, s.Concurrency)
		}
		if s.Concurrency > 0 && len(s.ForEach) == 0 {
			return invalid("step %q: concurrency without forEach", s.Name)
		}
		if len(s.ForEach) > MaxForEachItems {
			return invalid("step %q: forEach has %d items, at most %d", s.Name, len(s.ForEach), MaxForEachItems)
		}
		if len(s.ForEach) > 0 {
			total += len(s.ForEach)
		} else {
			total++
		}
	}
	if total > MaxStepsPerRun {
		return invalid("run expands to %d steps, at most %d", total, MaxStepsPerRun)
	}
	for _, s := range r.Steps {
		seen := map[string]bool{}
		for _, d := range s.DependsOn {
			if _, ok := byName[d]; !ok {
				return invalid("step %q depends on unknown step %q", s.Name, d)
			}
			if d == s.Name {
				return invalid("step %q depends on itself", s.Name)
			}
			if seen[d] {
				return invalid("step %q lists dependency %q twice", s.Name, d)
			}
			seen[d] = true
		}
	}
	if cyc := findCycle(r.Steps, byName); cyc != nil {
		return invalid("dependency cycle: %s", strings.Join(cyc, " -> "))
	}
	return nil
}

// checkStepNames checks the names a step selects workers by — its tags,
// label keys and values, target worker and platform — with CheckName (SPEC
// §12), labels in key order so that the first refusal is always the same.
func checkStepNames(s StepSpec) error {
	for _, t := range s.Tags {
		if err := CheckName("tag", t); err != nil {
			return err
		}
	}
	keys := make([]string, 0, len(s.Labels))
	for k := range s.Labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if err := CheckName("label key", k); err != nil {
			return err
		}
		if err := CheckName("label value", s.Labels[k]); err != nil {
			return fmt.Errorf("label %s: %w", Quote(k), err)
		}
	}
	if s.Target != "" {
		if err := CheckName("target", s.Target); err != nil {
			return err
		}
	}
	if s.Platform != "" {
		if err := CheckName("platform", s.Platform); err != nil {
			return err
		}
	}
	return nil
}

// findCycle returns one dependency cycle as a path of names, or nil.
func findCycle(steps []StepSpec, byName map[string]int) []string {
	const (
		white = iota
		grey
		black
	)
	color := make([]int, len(steps))
	var stack []string
	var visit func(i int) []string
	visit = func(i int) []string {
		color[i] = grey
		stack = append(stack, steps[i].Name)
		for _, d := range steps[i].DependsOn {
			j := byName[d]
			switch color[j] {
			case grey:
				for k, n := range stack {
					if n == d {
						return append(append([]string(nil), stack[k:]...), d)
					}
				}
			case white:
				if c := visit(j); c != nil {
					return c
				}
			}
		}
		stack = stack[:len(stack)-1]
		color[i] = black
		return nil
	}
	for i := range steps {
		if color[i] == white {
			if c := visit(i); c != nil {
				return c
			}
		}
	}
	return nil
}

// RequiredTags derives the worker tags a step needs from its type and runner
// (SPEC §8) plus its explicit tags, sorted and deduplicated. Task steps run
// on the orchestrator and need none.
func RequiredTags(s StepSpec) ([]string, error) {
	var tags []string
	switch s.Type {
	case "":
	case "task":
		return nil, nil
	case "script":
		switch s.Runner {
		case "", "local":
			tags = []string{"script"}
		case "docker":
			tags = []string{"script", "docker"}
		case "pod":
			tags = []string{"script", "kubernetes"}
		default:
			return nil, fmt.Errorf("unknown runner %q for type script (want local, docker or pod)", s.Runner)
		}
	case "docker":
		tags = []string{"docker"}
	case "pod":
		tags = []string{"kubernetes"}
	default:
		return nil, fmt.Errorf("unknown step type %q (want script, docker, pod or task)", s.Type)
	}
	if s.Runner != "" && s.Type != "script" {
		return nil, fmt.Errorf("runner %q is only meaningful with type script", s.Runner)
	}
	tags = append(tags, s.Tags...)
	sort.Strings(tags)
	out := tags[:0]
	for i, t := range tags {
		if i == 0 || t != tags[i-1] {
			out = append(out, t)
		}
	}
	return out, nil
}

// EnvDenylist names the variables never shipped to a step: they describe the
// host the process runs on, which remote execution changes. Any variable with
// the EnvDenyPrefix is denied too.
var EnvDenylist = []string{"HOME", "HOSTNAME", "PATH", "PWD", "SHELL", "TMPDIR", "USER"}

// EnvDenyPrefix is the project's own prefix.
const EnvDenyPrefix = "TETHER_"

// Denied reports whether an environment variable is on the pinned denylist.
func Denied(name string) bool {
	if strings.HasPrefix(name, EnvDenyPrefix) {
		return true
	}
	for _, d := range EnvDenylist {
		if d == name {
			return true
		}
	}
	return false
}
