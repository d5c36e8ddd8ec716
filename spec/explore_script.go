package spec

// A counterexample as a script: the explorer's initial world and its path as
// plain values, for the simulator to re-execute in its own world
// (sim.RunScript: its network, its driver pipeline, its worker and process
// code) rather than in the explorer's.

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/tether-run/tether/core"
)

// ScriptKind names what one script step does, in the explorer's vocabulary.
type ScriptKind string

// The script step kinds: one per explorer action.
const (
	ScriptDeliverToOrch   ScriptKind = "deliver-to-orch"   // the next message on Conn reaches the orchestrator
	ScriptDeliverToWorker ScriptKind = "deliver-to-worker" // the next message on Conn reaches Worker
	ScriptDupToOrch       ScriptKind = "dup-to-orch"       // a copy of the next message on Conn reaches the orchestrator; the original stays in flight
	ScriptDupToWorker     ScriptKind = "dup-to-worker"     // the same towards the worker
	ScriptDropToOrch      ScriptKind = "drop-to-orch"      // a lone loss without a reset (multiset network only)
	ScriptDropToWorker    ScriptKind = "drop-to-worker"    // the same towards the worker
	ScriptReset           ScriptKind = "reset"             // Conn is reset: what is in flight either way is lost
	ScriptOrchNotices     ScriptKind = "orch-notices"      // the orchestrator notices Conn closed (Disconnected)
	ScriptWorkerNotices   ScriptKind = "worker-notices"    // Worker notices Conn closed (WDisconnected)
	ScriptConnect         ScriptKind = "connect"           // Worker's outstanding dial connects; the connection is Conn
	ScriptDialFail        ScriptKind = "dial-fail"         // Worker's outstanding dial fails (the orchestrator is down)
	ScriptTickOrch        ScriptKind = "tick-orch"         // the orchestrator's deadline fires
	ScriptTickWorker      ScriptKind = "tick-worker"       // Worker's deadline fires
	ScriptExit            ScriptKind = "process-exit"      // the process of Lease on Worker exits with Code (143: on SIGTERM)
	ScriptOutput          ScriptKind = "process-output"    // the process of Lease on Worker prints Text
	ScriptCrashOrch       ScriptKind = "crash-orch"        // the orchestrator process dies
	ScriptRestartOrch     ScriptKind = "restart-orch"      // it restarts from its durable store
	ScriptCrashWorker     ScriptKind = "crash-worker"      // Worker's process dies, with its step processes
	ScriptRestartWorker   ScriptKind = "restart-worker"    // a fresh instance Worker boots with token Token and seed Seed
	ScriptCancel          ScriptKind = "cancel"            // the operator cancels the run
	ScriptRevoke          ScriptKind = "revoke"            // the operator revokes token Token (Worker's)

	// ScriptRestartSameWorker: Worker's process dies with its step
	// processes and boots again at once with its saved identity (SPEC §9):
	// the same id, token and seed, and its session credential.
	ScriptRestartSameWorker ScriptKind = "restart-same-worker"
)

// ScriptStep is one explorer action as a plain value. Connections are the
// explorer's ids: a replayer maps each to its own connection at the Connect
// step that opened it. Messages are matched by their core.DescribeMsg
// rendering, which names tokens but shows no secret or credential.
type ScriptStep struct {
	At     time.Duration `json:"at"` // abstract time since the start (the explorer's clock)
	Kind   ScriptKind    `json:"kind"`
	Worker core.WorkerID `json:"worker,omitempty"`
	Conn   core.ConnID   `json:"conn,omitempty"`
	Msg    string        `json:"msg,omitempty"` // the message delivered, duplicated or dropped
	Step   core.StepID   `json:"step,omitempty"`
	Lease  core.LeaseID  `json:"lease,omitempty"`
	Code   int           `json:"code,omitempty"`
	Text   string        `json:"text,omitempty"`
	Token  string        `json:"token,omitempty"` // a token's name
	Seed   uint64        `json:"seed,omitempty"`
	Label  string        `json:"label"` // the explorer's label for the action
}

// ScriptToken is one enrollment token created at the start, in order.
type ScriptToken struct {
	Name   string        `json:"name"`
	TTL    time.Duration `json:"ttl"`
	Secret [16]byte      `json:"secret"`
}

// ScriptWorker is one worker booted at the start, in order, after the run
// was submitted: the template with this ID (and Name), token and seed.
type ScriptWorker struct {
	ID    core.WorkerID `json:"id"`
	Token string        `json:"token"` // the token's name
	Seed  uint64        `json:"seed"`
	// Tags and Scaler are what the worker (and every later instance in its
	// slot) declares in its Hello.
	Tags   []string `json:"tags,omitempty"`
	Scaler bool     `json:"scaler,omitempty"`
}

// Script is a counterexample as a plain, serialisable value: the initial
// world (the orchestrator's and the workers' configurations, the tokens, the
// run, the workers) and every action since, the initial state's own
// enrollment first. Every step happens at its At; between steps nothing
// happens (no timer fires, no message arrives) but what the next step says.
type Script struct {
	Scope     string            `json:"scope"`
	Planted   string            `json:"planted,omitempty"` // the PlantedBugs entry the scope's Mutate was, if any
	Invariant string            `json:"invariant"`         // what the explorer saw broken at the last step
	Detail    string            `json:"detail,omitempty"`
	Config    core.Config       `json:"config"`
	Worker    core.WorkerConfig `json:"worker"` // the template: ID, Name, Token, Slots and Seed are per worker
	Slots     int               `json:"slots"`
	Run       core.RunSpec      `json:"run"`
	Tokens    []ScriptToken     `json:"tokens"`
	Workers   []ScriptWorker    `json:"workers"`
	Setup     int               `json:"setup"` // Steps[:Setup] are the initial state's own (enrollment); the path follows
	Steps     []ScriptStep      `json:"steps"`
}

// WorkerConfig is the configuration of worker id booted with token (the
// token string the orchestrator issued) and seed.
func (s *Script) WorkerConfig(id core.WorkerID, token string, seed uint64) core.WorkerConfig {
	cfg := s.Worker
	cfg.ID, cfg.Name, cfg.Token, cfg.Slots, cfg.Seed = id, string(id), token, s.Slots, seed
	for _, sw := range s.Workers {
		// A later instance in a slot is named after the first: w1-1, w1-2, …
		if sw.ID == id || strings.HasPrefix(string(id), string(sw.ID)+"-") {
			cfg.Tags, cfg.Scaler = slices.Clone(sw.Tags), sw.Scaler
			break
		}
	}
	return cfg
}

// WriteFile saves the script as JSON.
func (s *Script) WriteFile(path string) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// ReadScript loads a script saved by WriteFile.
func ReadScript(path string) (*Script, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var s Script
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if s.Setup < 0 || s.Setup > len(s.Steps) {
		return nil, fmt.Errorf("%s: setup of %d steps, but %d steps", path, s.Setup, len(s.Steps))
	}
	return &s, nil
}

// ScriptReplayCommand is the one line that replays a saved script in the
// simulator.
func ScriptReplayCommand(file string) string {
	return fmt.Sprintf("go test ./sim -run 'TestReplayScript$' -sim.script=%s -v", file)
}

// script renders the initial world and a path's steps as a Script.
func (x *explorer) script(steps []ScriptStep, inv, detail string) *Script {
	s := &Script{
		Scope: x.sc.Name, Planted: x.sc.Planted, Invariant: inv, Detail: detail,
		Config: x.cfg, Worker: x.sc.Worker, Slots: x.sc.Slots,
		Run:   x.runSpec(),
		Setup: len(x.setupSteps),
	}
	for _, name := range x.tokNames {
		s.Tokens = append(s.Tokens, ScriptToken{Name: name, TTL: exploreTokenTTL, Secret: secretFor(name)})
	}
	for i := range x.sc.Workers {
		sw := ScriptWorker{ID: workerIDFor(i, 0), Token: x.tokNames[i], Seed: workerSeedFor(i, 0), Scaler: x.sc.ScalerWorker == i+1}
		if i < len(x.sc.WorkerTags) {
			sw.Tags = slices.Clone(x.sc.WorkerTags[i])
		}
		s.Workers = append(s.Workers, sw)
	}
	s.Steps = append(append(s.Steps, x.setupSteps...), steps...)
	return s
}

// Walk takes up to n actions from the initial state of sc, each chosen by
// pick among the enabled ones (given as script steps; pick returns an index
// into next, or a negative number to stop), and returns the path as a
// Script, with the violation it reached, if any (the walk stops there). A
// walk samples the explorer's behaviours, for checking that another world
// (the simulator) can take the same paths.
func Walk(sc Scope, n int, pick func(next []ScriptStep) int) (*Script, *Violation, error) {
	x := newExplorer(sc)
	s, err := x.initial()
	if err != nil {
		return nil, nil, err
	}
	var steps []ScriptStep
	var viol *Violation
	for range n {
		var succ []*xsucc
		var next []ScriptStep
		for _, a := range x.actions(s) {
			sc := x.apply(s, a, true)
			succ, next = append(succ, sc), append(next, sc.step)
		}
		k := -1
		if len(next) > 0 {
			k = pick(next)
		}
		if k < 0 || k >= len(next) {
			break
		}
		steps = append(steps, next[k])
		if v := succ[k].viol; v != nil {
			viol = v
			break
		}
		s = succ[k].s
	}
	sp := x.script(steps, "", "")
	if viol != nil {
		sp.Invariant, sp.Detail = viol.Invariant, viol.Detail
	}
	return sp, viol, nil
}
