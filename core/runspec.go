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
	Timeout time.Duration     `json:",omitzero"` // run timeout; 0 = none
	Env     map[string]string `json:",omitzero"`
	// Group puts the run in a concurrency group (SPEC §8a).
	Group ConcurrencyGroup `json:",omitzero"`
	Steps []StepSpec
}

// StepSpec declares one step.
type StepSpec struct {
	Name      string
	Command   string
	DependsOn []string `json:",omitzero"`
	// Writes declares the step write-bearing: it is never re-dispatched once
	// started, and its process starts only after START is durably recorded.
	Writes   bool              `json:",omitzero"`
	Type     string            `json:",omitzero"` // "", script, docker, pod, task
	Runner   string            `json:",omitzero"` // with type script: local, docker, pod
	Tags     []string          `json:",omitzero"`
	Labels   map[string]string `json:",omitzero"` // selector: the worker must carry every pair
	Target   string            `json:",omitzero"` // a worker name
	Platform string            `json:",omitzero"`
	Timeout  time.Duration     `json:",omitzero"` // step timeout; 0 = none
	Env      map[string]string `json:",omitzero"`
	// ForEach fans the step out into one instance per item ("name[i]"), with
	// TETHER_ITEM set to the item; Concurrency caps the instances in flight.
	ForEach     []string `json:",omitzero"`
	Concurrency int      `json:",omitzero"`
	// Group bounds the steps holding a lease across every run that names
	// the same step group (SPEC §8a).
	Group ConcurrencyGroup `json:",omitzero"`
	// Gates: Hold requires an operator approval (expiring after HoldExpiry if
	// set); Wait delays the step by a timer once its dependencies succeeded.
	Hold       bool          `json:",omitzero"`
	HoldExpiry time.Duration `json:",omitzero"`
	Wait       time.Duration `json:",omitzero"`
	// Outputs declares the data ids the step may write (SPEC §14,
	// declared writes): each an id, or a prefix ending in '*'. A write
	// under its lease to any other id is refused; declaring any needs
	// Writes (the workflow parser sets it). None: it may write any id.
	Outputs []string `json:",omitzero"`
	// Retry runs the step again after a failure its policy names (SPEC §1
	// RETRY, §3); Idempotent says every write the step makes may be made
	// again, which a write-bearing step must say to be retried.
	Retry      *RetryPolicy `json:",omitzero"`
	Idempotent bool         `json:",omitzero"`
	// Secrets names the secrets the step may read, given to it as files
	// (SecretsAs "files", the default) or env vars ("env"); PutSecrets
	// the ones it may write (SPEC §14a).
	Secrets    []string `json:",omitzero"`
	SecretsAs  string   `json:",omitzero"`
	PutSecrets []string `json:",omitzero"`
	// Workflow makes the step a child run (SPEC §2): never dispatched; when
	// queued it starts and creates a run of this spec, whose outcome it
	// takes. With is that run's inputs: they become its env, over the
	// child's own (ChildSpec).
	Workflow *RunSpec          `json:",omitzero"`
	With     map[string]string `json:",omitzero"`
}

// RetryPolicy is a step's `retry:` (SPEC §1, §3): up to Attempts more tries
// after the first, the n-th retry after Backoff × 2^(n-1), at most
// MaxRetryBackoff. A try's failure retries when its exit code is in Codes,
// or it timed out and OnTimeout is set; with neither given, any non-zero
// exit retries.
type RetryPolicy struct {
	Attempts  int
	Backoff   time.Duration `json:",omitzero"`
	Codes     []int         `json:",omitzero"`
	OnTimeout bool          `json:",omitzero"`
}

// Retry limits (SPEC §12).
const (
	MaxRetryAttempts = 20
	MaxRetryCodes    = 32
	MaxRetryBackoff  = time.Hour
)

// RetryDelay is the backoff before retry n (1-based): Backoff doubled n-1
// times, capped at MaxRetryBackoff.
func (p *RetryPolicy) RetryDelay(n int) time.Duration {
	d := p.Backoff
	for i := 1; i < n && d < MaxRetryBackoff; i++ {
		d *= 2
	}
	return min(d, MaxRetryBackoff)
}

// RetriesExit says whether a failed try that exited with code retries.
func (p *RetryPolicy) RetriesExit(code int) bool {
	if len(p.Codes) == 0 && !p.OnTimeout {
		return code != 0
	}
	for _, c := range p.Codes {
		if c == code {
			return true
		}
	}
	return false
}

// CheckRetry checks a step's retry policy, if it has one (SPEC §2, §12);
// the workflow parser calls it too, to name the policy's line.
func CheckRetry(s StepSpec) error {
	p := s.Retry
	if p == nil {
		return nil
	}
	switch {
	case p.Attempts < 1 || p.Attempts > MaxRetryAttempts:
		return invalid("step %q: retry attempts %d out of range 1..%d", s.Name, p.Attempts, MaxRetryAttempts)
	case p.Backoff < 0 || p.Backoff > MaxRetryBackoff:
		return invalid("step %q: retry backoff %s out of range 0..%s", s.Name, p.Backoff, MaxRetryBackoff)
	case len(p.Codes) > MaxRetryCodes:
		return invalid("step %q: retry on lists %d exit codes, at most %d", s.Name, len(p.Codes), MaxRetryCodes)
	case s.Writes && !s.Idempotent:
		return invalid("step %q: retry on a write-bearing step needs idempotent: true (every write it makes may be made again); without it a started write-bearing step never runs twice", s.Name)
	}
	for _, c := range p.Codes {
		if c <= 0 || c > 255 {
			return invalid("step %q: retry on exit code %d: want 1..255", s.Name, c)
		}
	}
	return nil
}

// Limits on a submitted run (SPEC §2, §12). Validate checks every one
// before anything is created; they are what bounds the work one submission
// gives the orchestrator's loop (its records, its dependency index, its
// dispatches), so that no submission holds the loop for long (SPEC §12
// quotes the measurement).
const (
	MaxStepsPerRun   = 1000 // expanded: every forEach instance is one step
	MaxForEachItems  = 1000
	MaxNameLength    = 128
	MaxCommandLength = 64 << 10
	// MaxEdgesPerRun bounds the expanded dependency edges: a dependency of
	// a step with m instances on a step with n instances is m×n edges,
	// each stored in the dependent's record.
	MaxEdgesPerRun = 5000
	// MaxExpandedBytes bounds the bytes of the expanded step names
	// ("name[i]") plus, for every edge, the name it depends on: what the
	// run's step records hold beyond their fixed fields, so long names do
	// not multiply the work the step and edge counts allow.
	MaxExpandedBytes = 64 << 10
	// MaxEnvVars bounds one env mapping (the run's, or one step's).
	MaxEnvVars       = 256
	MaxEnvKeyBytes   = 256
	MaxEnvValueBytes = 32 << 10
	// MaxRunSpecBytes bounds the run's declaration: the bytes of every
	// string in it (names, commands, dependencies, tags, labels, env, items).
	MaxRunSpecBytes = 512 << 10
	// MaxDispatchBytes bounds what one dispatch of a step carries: its
	// command plus the keys and values of the environment it is shipped
	// with, each variable counted as "K=V" (the orchestrator's snapshot,
	// the run's and the step's env after the denylist, and TETHER_ITEM).
	// Encoding a byte takes at most 6 bytes (a \u escape), and a variable's
	// quotes, colon and comma at most 6 times its "=", so a dispatch within
	// this bound always fits in one wire frame (1 MiB; SPEC §12).
	MaxDispatchBytes = 128 << 10
	// MaxRunDepth bounds how deep a tree of runs goes: a run, its child,
	// the child's child… at most 4 runs from the root down (SPEC §2, §12).
	MaxRunDepth = 4
	// MaxChildRuns bounds the runs one submission's tree holds below its
	// root (every workflow step, at every depth, is one), and the live
	// child runs the API may give one run.
	MaxChildRuns = 64
)

// ErrorListMax bounds how many entries of a list an error message spells
// out; the rest are counted ("… and 1,990 more").
const ErrorListMax = 10

// ListForError joins at most ErrorListMax items of list, each rendered
// with Quote, and says how many more there are.
func ListForError(list []string) string {
	n := min(len(list), ErrorListMax)
	parts := make([]string, 0, n+1)
	for _, s := range list[:n] {
		parts = append(parts, Quote(s))
	}
	if more := len(list) - n; more > 0 {
		parts = append(parts, fmt.Sprintf("… and %s more", Thousands(more)))
	}
	return strings.Join(parts, ", ")
}

// Thousands renders n with comma separators (1990 → "1,990").
func Thousands(n int) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return "-" + Thousands(-n)
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// ErrInvalidRun is returned (wrapped, with the reason) when a RunSpec is not a
// valid DAG of steps.
var ErrInvalidRun = errors.New("invalid run")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidRun, fmt.Sprintf(format, args...))
}

// Validate checks a RunSpec: unique non-empty step names, known dependencies,
// no cycles, a command on every non-task step, sane gates and fan-outs.
func (r RunSpec) Validate() error {
	if _, err := r.validate(); err != nil {
		return err
	}
	if d := r.TreeDepth(); d > MaxRunDepth {
		return invalid("child workflows nest %d runs deep, at most %d", d, MaxRunDepth)
	}
	if n := r.ChildRuns(); n > MaxChildRuns {
		return invalid("the run starts %d child runs (every workflow step at every depth), at most %d", n, MaxChildRuns)
	}
	return nil
}

// ChildSpec is the spec of the run a workflow step starts: its workflow,
// with the step's With over the workflow's own env (an input overrides the
// child's default). The parent's env is not inherited.
func ChildSpec(sp *StepSpec) RunSpec {
	c := *sp.Workflow
	if len(sp.With) > 0 {
		env := make(map[string]string, len(c.Env)+len(sp.With))
		for k, v := range c.Env {
			env[k] = v
		}
		for k, v := range sp.With {
			env[k] = v
		}
		c.Env = env
	}
	return c
}

// TreeDepth is how many runs deep r's tree of child workflows goes (1: no
// workflow step).
func (r RunSpec) TreeDepth() int {
	d := 1
	for i := range r.Steps {
		if w := r.Steps[i].Workflow; w != nil {
			d = max(d, 1+w.TreeDepth())
		}
	}
	return d
}

// ChildRuns is how many runs r's tree holds below r.
func (r RunSpec) ChildRuns() int {
	n := 0
	for i := range r.Steps {
		if w := r.Steps[i].Workflow; w != nil {
			n += 1 + w.ChildRuns()
		}
	}
	return n
}

// treeSizes are the expanded steps, dependency edges and expanded bytes
// of a run and of every child run below it: the tree's runs are created as
// their workflow steps are queued, all of them in one batch at worst, so
// they count together against one run's limits (SPEC §12).
type treeSizes struct{ steps, edges, expanded int }

// validate is Validate of r without the tree's depth and count, and of
// every child workflow (each as ChildSpec makes it); it returns the sizes
// of r's tree.
func (r RunSpec) validate() (treeSizes, error) {
	var below treeSizes // of the child runs
	if len(r.Steps) == 0 {
		return treeSizes{}, invalid("run has no steps")
	}
	if r.Timeout < 0 {
		return treeSizes{}, invalid("run timeout %s is negative", r.Timeout)
	}
	if r.Name != "" {
		if err := CheckName("run name", r.Name); err != nil {
			return treeSizes{}, fmt.Errorf("%w: %w", ErrInvalidRun, err)
		}
	}
	if err := r.Group.check(true); err != nil {
		return treeSizes{}, invalid("%v", err)
	}
	byName := map[string]int{}
	total := 0
	for i, s := range r.Steps {
		nameErr := CheckName("step name", s.Name) // SPEC §12: printable names
		switch {
		case s.Name == "":
			return treeSizes{}, invalid("step %d has no name", i+1)
		case len(s.Name) > MaxNameLength:
			return treeSizes{}, invalid("step name %.20q… is longer than %d bytes", s.Name, MaxNameLength)
		case nameErr != nil:
			return treeSizes{}, fmt.Errorf("%w: step %d: %w", ErrInvalidRun, i+1, nameErr)
		case strings.ContainsAny(s.Name, "/[] \t\n"):
			return treeSizes{}, invalid("step name %q may not contain '/', '[', ']' or spaces", s.Name)
		}
		if _, dup := byName[s.Name]; dup {
			return treeSizes{}, invalid("step %q is declared twice", s.Name)
		}
		byName[s.Name] = i
		if s.Workflow == nil && s.Type != "task" && strings.TrimSpace(s.Command) == "" {
			return treeSizes{}, invalid("step %q has no command", s.Name)
		}
		if len(s.Command) > MaxCommandLength {
			return treeSizes{}, invalid("step %q: command is longer than %d bytes", s.Name, MaxCommandLength)
		}
		if strings.Contains(s.Command, "\x00") { // no process can be given it (SPEC §12)
			return treeSizes{}, invalid("step %q: its command holds a NUL byte", s.Name)
		}
		if _, err := RequiredTags(s); err != nil {
			return treeSizes{}, invalid("step %q: %v", s.Name, err)
		}
		if err := checkStepNames(s); err != nil {
			return treeSizes{}, fmt.Errorf("%w: step %q: %w", ErrInvalidRun, s.Name, err)
		}
		if s.Workflow != nil || s.With != nil {
			if err := checkChildStep(s); err != nil {
				return treeSizes{}, err
			}
			if d := 1 + s.Workflow.TreeDepth(); d > MaxRunDepth { // before recursing: bounded
				return treeSizes{}, invalid("step %q: child workflows nest %d runs deep, at most %d", s.Name, d, MaxRunDepth)
			}
			cs, err := ChildSpec(&s).validate()
			if err != nil {
				return treeSizes{}, invalid("step %q: child workflow: %s", s.Name, strings.TrimPrefix(err.Error(), ErrInvalidRun.Error()+": "))
			}
			below.steps, below.edges, below.expanded = below.steps+cs.steps, below.edges+cs.edges, below.expanded+cs.expanded
		}
		if s.Timeout < 0 || s.Wait < 0 || s.HoldExpiry < 0 {
			return treeSizes{}, invalid("step %q: negative duration", s.Name)
		}
		if s.Hold && s.Wait > 0 {
			return treeSizes{}, invalid("step %q: hold and wait cannot both gate one step", s.Name)
		}
		if s.HoldExpiry > 0 && !s.Hold {
			return treeSizes{}, invalid("step %q: hold_expiry without hold", s.Name)
		}
		if err := s.Group.check(false); err != nil {
			return treeSizes{}, invalid("step %q: %v", s.Name, err)
		}
		if s.Concurrency < 0 {
			return treeSizes{}, invalid("step %q: concurrency %d is negative", s.Name, s.Concurrency)
		}
		if s.Concurrency > 0 && len(s.ForEach) == 0 {
			return treeSizes{}, invalid("step %q: concurrency without forEach", s.Name)
		}
		if err := checkOutputs(s); err != nil {
			return treeSizes{}, fmt.Errorf("%w: step %q: %w", ErrInvalidRun, s.Name, err)
		}
		if err := CheckRetry(s); err != nil {
			return treeSizes{}, err
		}
		if len(s.ForEach) > MaxForEachItems {
			return treeSizes{}, invalid("step %q: forEach has %d items, at most %d", s.Name, len(s.ForEach), MaxForEachItems)
		}
		for i, it := range s.ForEach {
			if strings.Contains(it, "\x00") { // an item is the process's $TETHER_ITEM (SPEC §12: no NUL in a value)
				return treeSizes{}, invalid("step %q: forEach item %d holds a NUL byte", s.Name, i)
			}
		}
		if len(s.ForEach) > 0 {
			total += len(s.ForEach)
		} else {
			total++
		}
	}
	total += below.steps
	with := ""
	if below.steps > 0 {
		with = " (its child runs' included)"
	}
	if total > MaxStepsPerRun {
		return treeSizes{}, invalid("run expands to %d steps%s, at most %d", total, with, MaxStepsPerRun)
	}
	if err := r.checkSizes(); err != nil { // the bytes of the tree below r too
		return treeSizes{}, err
	}
	edges, expanded := below.edges, below.expanded
	for _, s := range r.Steps {
		expanded += expandedBytes(s)
		seen := map[string]bool{}
		for _, d := range s.DependsOn {
			if _, ok := byName[d]; !ok {
				return treeSizes{}, invalid("step %q depends on unknown step %s", s.Name, Quote(d))
			}
			if d == s.Name {
				return treeSizes{}, invalid("step %q depends on itself", s.Name)
			}
			if seen[d] {
				return treeSizes{}, invalid("step %q lists dependency %s twice", s.Name, Quote(d))
			}
			seen[d] = true
			edges += instances(s) * instances(r.Steps[byName[d]])
			expanded += instances(s) * expandedBytes(r.Steps[byName[d]])
		}
	}
	if edges > MaxEdgesPerRun {
		return treeSizes{}, invalid("run has %d dependency edges once forEach is expanded (a step with m instances depending on one with n is m×n edges), at most %d: depend on fewer instances, or put a task step between two fan-outs", edges, MaxEdgesPerRun)
	}
	if expanded > MaxExpandedBytes {
		return treeSizes{}, invalid("run expands to %d bytes of step names and dependency names (name[i] for every instance, and again for every edge), at most %d: use shorter step names, or fewer instances or edges", expanded, MaxExpandedBytes)
	}
	if cyc := findCycle(r.Steps, byName); cyc != nil {
		if len(cyc) > 10 { // an error lists at most 10 items (SPEC §2)
			return treeSizes{}, invalid("dependency cycle of %d steps: %s -> …", len(cyc)-1, strings.Join(cyc[:10], " -> "))
		}
		return treeSizes{}, invalid("dependency cycle: %s", strings.Join(cyc, " -> "))
	}
	return treeSizes{steps: total, edges: edges, expanded: expanded}, nil
}

// checkChildStep checks a workflow step (SPEC §2): it runs nothing itself,
// so it declares no command, type, writes, placement, timeout, outputs,
// retry or secrets (the child workflow's steps do), and fans out to no
// instances.
func checkChildStep(s StepSpec) error {
	bad := ""
	switch {
	case s.Workflow == nil:
		return invalid("step %q: with without workflow", s.Name)
	case s.Command != "":
		bad = "command"
	case s.Type != "":
		bad = "type"
	case s.Runner != "":
		bad = "runner"
	case s.Writes:
		bad = "writes"
	case len(s.Tags) > 0 || len(s.Labels) > 0 || s.Target != "" || s.Platform != "":
		bad = "tags, labels, target or platform"
	case len(s.ForEach) > 0:
		bad = "forEach"
	case s.Timeout != 0:
		bad = "timeout (give the child workflow a timeout)"
	case len(s.Env) > 0:
		bad = "env (pass inputs with with)"
	case len(s.Outputs) > 0:
		bad = "outputs (the child workflow's steps declare theirs)"
	case s.Retry != nil || s.Idempotent:
		bad = "retry (put it on the child workflow's steps, or rerun the child)"
	case len(s.Secrets) > 0 || len(s.PutSecrets) > 0 || s.SecretsAs != "":
		bad = "secrets (the child workflow's steps name theirs)"
	case s.Group.Name != "":
		bad = "a concurrency group (it holds no lease; give the child workflow one)"
	}
	if bad != "" {
		return invalid("step %q: a workflow step runs no process of its own: %s is not allowed", s.Name, bad)
	}
	if err := checkEnv(fmt.Sprintf("step %q: with", s.Name), s.With); err != nil {
		return err
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

// instances is how many steps s expands to.
func instances(s StepSpec) int { return max(len(s.ForEach), 1) }

// expandedBytes is the bytes of s's instance names, "name" or "name[i]".
func expandedBytes(s StepSpec) int {
	n := len(s.ForEach)
	if n == 0 {
		return len(s.Name)
	}
	total := n * (len(s.Name) + 2) // the name and "[]" of each
	for lo, width, hi := 0, 1, 10; lo < n; lo, width, hi = hi, width+1, hi*10 {
		total += (min(hi, n) - lo) * width // the digits of indices lo..hi-1
	}
	return total
}

// checkSizes checks the byte and count limits of the declaration and of its
// env mappings (SPEC §12).
func (r RunSpec) checkSizes() error {
	if err := checkEnv("run", r.Env); err != nil {
		return err
	}
	size := len(r.Name) + envBytes(r.Env)
	for _, s := range r.Steps {
		if len(s.Env) > 0 { // the place is formatted only when there is something to check
			if err := checkEnv(fmt.Sprintf("step %q", s.Name), s.Env); err != nil {
				return err
			}
		}
		if err := checkStepSecrets(s); err != nil {
			return err
		}
		size += stepBytes(&s)
	}
	size += r.childBytes()
	size += groupBytes(r) // concurrency group names (SPEC §8a)
	if size > MaxRunSpecBytes {
		return invalid("the run's declaration holds %d bytes of names, commands, lists and env, at most %d", size, MaxRunSpecBytes)
	}
	return nil
}

// stepBytes is the bytes of one step's declaration that checkSizes counts:
// its strings, env and labels, and every string of its lists.
func stepBytes(s *StepSpec) int {
	n := len(s.Name) + len(s.Command) + len(s.Type) + len(s.Runner) + len(s.Target) + len(s.Platform) + len(s.SecretsAs) + envBytes(s.Env) + envBytes(s.Labels)
	for _, l := range [][]string{s.DependsOn, s.Tags, s.ForEach, s.Outputs, s.Secrets, s.PutSecrets} {
		for _, x := range l {
			n += len(x)
		}
	}
	return n
}

// childBytes is the bytes of r's child workflows, at every depth, counted
// as checkSizes counts r's own steps (group names too), plus each workflow
// step's With: the whole tree is held to one declaration's limit (SPEC §2).
func (r RunSpec) childBytes() int {
	n := 0
	for i := range r.Steps {
		sp := &r.Steps[i]
		if sp.Workflow == nil {
			continue
		}
		c := sp.Workflow
		n += envBytes(sp.With) + len(c.Name) + envBytes(c.Env) + groupBytes(*c) + c.childBytes()
		for j := range c.Steps {
			n += stepBytes(&c.Steps[j])
		}
	}
	return n
}

func envBytes(env map[string]string) int {
	n := 0
	for k, v := range env {
		n += len(k) + len(v)
	}
	return n
}

// checkEnv checks one env mapping: at most MaxEnvVars variables, each name
// non-empty, at most MaxEnvKeyBytes, without '=' or NUL, each value at most
// MaxEnvValueBytes without NUL (a process environment cannot hold them).
func checkEnv(where string, env map[string]string) error {
	if len(env) > MaxEnvVars {
		return invalid("%s: env has %d variables, at most %d", where, len(env), MaxEnvVars)
	}
	for _, k := range sortedKeys(env) { // sorted: the first bad name is always the same one
		v := env[k]
		switch {
		case k == "":
			return invalid("%s: env has a variable with an empty name", where)
		case len(k) > MaxEnvKeyBytes:
			return invalid("%s: env variable name %s is %d bytes, at most %d", where, Quote(k), len(k), MaxEnvKeyBytes)
		case strings.ContainsAny(k, "=\x00"):
			return invalid("%s: env variable name %s may not contain '=' or NUL", where, Quote(k))
		case len(v) > MaxEnvValueBytes:
			return invalid("%s: env variable %s has a value of %d bytes, at most %d", where, Quote(k), len(v), MaxEnvValueBytes)
		case strings.Contains(v, "\x00"):
			return invalid("%s: env variable %s has a NUL byte in its value", where, Quote(k))
		}
	}
	return nil
}

// DispatchEnv is the environment a dispatch of step sp of run carries
// (SPEC §8): the orchestrator's snapshot, then the run's and the step's env,
// all minus the denylist, plus TETHER_ITEM for a forEach instance (index ≥ 0).
func DispatchEnv(snapshot map[string]string, run RunSpec, sp StepSpec, index int, item string) map[string]string {
	env := map[string]string{}
	for _, src := range []map[string]string{snapshot, run.Env, sp.Env} {
		for k, v := range src {
			if !Denied(k) {
				env[k] = v
			}
		}
	}
	if index >= 0 {
		env["TETHER_ITEM"] = item
	}
	if len(env) == 0 {
		return nil
	}
	return env
}

// CheckDispatchSizes refuses a run one of whose dispatches would carry more
// than MaxDispatchBytes (command, env names and values) with the
// orchestrator's environment snapshot (Config.Env). The largest forEach
// item stands for every instance.
func (r RunSpec) CheckDispatchSizes(snapshot map[string]string) error {
	for _, sp := range r.Steps {
		if sp.Workflow != nil {
			if err := ChildSpec(&sp).CheckDispatchSizes(snapshot); err != nil {
				return invalid("step %q: child workflow: %s", sp.Name, strings.TrimPrefix(err.Error(), ErrInvalidRun.Error()+": "))
			}
			continue
		}
		if sp.Type == "task" {
			continue // never dispatched (SPEC §2)
		}
		index, item := -1, ""
		for i, it := range sp.ForEach {
			if index < 0 || len(it) > len(item) {
				index, item = i, it
			}
		}
		env := DispatchEnv(snapshot, r, sp, index, item)
		n := len(sp.Command) + envBytes(env) + len(env) // each variable as "K=V"
		if n > MaxDispatchBytes {
			return invalid("step %q: its dispatch would carry %d bytes of command and environment (the orchestrator's, the run's and the step's), at most %d", sp.Name, n, MaxDispatchBytes)
		}
	}
	return nil
}

// FindCycle returns one dependency cycle as the path of its step names, in
// dependency order and back to the first, or nil. Steps are visited in
// declaration order, so the same run always names the same cycle (the
// workflow parser reports it with each step's line).
func FindCycle(steps []StepSpec) []string {
	byName := make(map[string]int, len(steps))
	for i, s := range steps {
		byName[s.Name] = i
	}
	return findCycle(steps, byName)
}

// findCycle is FindCycle with the steps' index by name.
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
			return nil, fmt.Errorf("unknown runner %s for type script (want local, docker or pod)", Quote(s.Runner))
		}
	case "docker":
		tags = []string{"docker"}
	case "pod":
		tags = []string{"kubernetes"}
	default:
		return nil, fmt.Errorf("unknown step type %s (want script, docker, pod or task)", Quote(s.Type))
	}
	if s.Runner != "" && s.Type != "script" {
		return nil, fmt.Errorf("runner %s is only meaningful with type script", Quote(s.Runner))
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
