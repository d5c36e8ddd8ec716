package fuzz

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tether-run/tether/adapters/workflow"
	"github.com/tether-run/tether/core"
	"github.com/tether-run/tether/spec"
)

// FuzzRunSpec decodes arbitrary bytes as a workflow definition — JSON, the
// codec of core.RunSpec for now — and holds the orchestrator to SPEC §2:
// Validate never panics and is deterministic; a spec that validates is
// accepted by a fresh orchestrator with a run id and the steps it expands
// to, and is then driven (a matching worker enrolls, gates are approved,
// dispatches are started and reported, time passes) without a panic or an
// invariant violation; a spec that does not validate is answered with that
// error and creates nothing.
func FuzzRunSpec(f *testing.F) {
	for _, rs := range sampleSpecs() {
		b, err := json.Marshal(rs)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"Steps":[{"Name":"a","Command":"x","DependsOn":["a"]}]}`))
	f.Add([]byte(`{"Steps":[{"Name":"a b","Command":"x"},{"Name":"","Type":"task"}]}`))
	f.Add([]byte(`{"Steps":[{"Name":"t","Type":"task"},{"Name":"u","Type":"pod","Runner":"docker","Command":"y"}]}`))
	f.Add([]byte(`{"Timeout":-1,"Steps":[{"Name":"a","Command":" ","ForEach":[],"Concurrency":3}]}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var rs core.RunSpec
		if err := json.Unmarshal(b, &rs); err != nil {
			return
		}
		verr := rs.Validate()
		if again := rs.Validate(); (again == nil) != (verr == nil) || (verr != nil && again.Error() != verr.Error()) {
			t.Fatalf("Validate is not deterministic: %v, then %v", verr, again)
		}
		// A JSON round trip (what a store or an API hop does) keeps the verdict.
		if b2, err := json.Marshal(rs); err == nil {
			var rs2 core.RunSpec
			if err := json.Unmarshal(b2, &rs2); err != nil {
				t.Fatalf("a RunSpec's own encoding %s does not decode: %v", b2, err)
			}
			if (rs2.Validate() == nil) != (verr == nil) {
				t.Fatalf("a JSON round trip changed Validate from %v to %v", verr, rs2.Validate())
			}
		}
		submitAndDrive(t, rs, verr)
	})
}

// FuzzWorkflow feeds arbitrary bytes to the YAML workflow parser
// (adapters/workflow): it never panics, refuses with ErrInvalid (naming the
// file), and what it accepts validates and is accepted by the orchestrator,
// exactly as FuzzRunSpec requires of a valid spec.
func FuzzWorkflow(f *testing.F) {
	if files, _ := filepath.Glob("../adapters/workflow/testdata/*.yaml"); len(files) > 0 {
		for _, name := range files {
			if b, err := os.ReadFile(name); err == nil {
				f.Add(b)
			}
		}
	}
	f.Add([]byte("name: r\nsteps:\n  - name: a\n    run: echo a\n  - name: b\n    run: echo b\n    depends_on: [a]\n    writes: true\n"))
	f.Add([]byte("steps:\n  - name: a\n    run: x\n    forEach: [1, 2]\n    concurrency: 1\n    hold: true\n    hold_expiry: 1m\n"))
	f.Add([]byte("steps:\n  - name: a\n    run: x\n    depends_on: b\n  - name: b\n    run: y\n    depends_on: a\n"))
	f.Add([]byte("steps: [{name: a, run: x, wait: 5s, timeout: 1h, tags: [gpu], labels: {zone: a}, env: {A: b}}]\n---\nx: 1\n"))
	f.Add([]byte("&a [*a]"))
	f.Fuzz(func(t *testing.T, b []byte) {
		rs, err := workflow.Parse("fuzz.yaml", b)
		if err != nil {
			if !errors.Is(err, workflow.ErrInvalid) {
				t.Fatalf("Parse error is not ErrInvalid: %v", err)
			}
			if !strings.Contains(err.Error(), "fuzz.yaml") {
				t.Fatalf("Parse error does not name the file: %v", err)
			}
			return
		}
		verr := rs.Validate()
		if verr != nil {
			t.Fatalf("Parse accepted a definition the core refuses: %v", verr)
		}
		submitAndDrive(t, rs, nil)
	})
}

// maxDrivenSteps bounds the runs that are driven after the submit (larger
// ones are only submitted), so that every execution stays fast.
const maxDrivenSteps = 64

// expanded is the number of steps a valid spec expands to (SPEC §2).
func expanded(rs core.RunSpec) int {
	n := 0
	for _, s := range rs.Steps {
		n += max(1, len(s.ForEach))
	}
	return n
}

// submitAndDrive submits rs to a fresh orchestrator (verr is what Validate
// said) and, when it is accepted and small, drives it for a while.
func submitAndDrive(t *testing.T, rs core.RunSpec, verr error) {
	t0 := time.Date(2026, 7, 1, 0, 0, 0, 0, time.UTC)
	d := &driver{t: t, o: core.NewOrchestrator(core.Config{}), chk: spec.NewChecker(), now: t0}
	rd := d.step(core.Submit{Call: 1, Spec: rs})
	if len(rd.Answers) != 1 || rd.Answers[0].Call != 1 {
		t.Fatalf("Submit got answers %+v, want exactly one for call 1", rd.Answers)
	}
	a := rd.Answers[0]
	if verr != nil {
		if a.Err != verr.Error() || a.Run != "" {
			t.Fatalf("an invalid run (%v) was answered %+v", verr, a)
		}
		if len(d.o.RunIDs()) != 0 || len(d.o.Steps()) != 0 {
			t.Fatalf("an invalid run created %d runs and %d steps", len(d.o.RunIDs()), len(d.o.Steps()))
		}
		// Nothing but the meta record and the refusal's audit entry (SPEC §15a).
		for _, r := range rd.Records {
			if r.Key == core.KindMeta {
				continue
			}
			if v, err := core.DecodeRecord(r); err == nil && core.IsAuditKey(r.Key) {
				if e := v.(*core.AuditEntry); e.Action == core.ActionSubmit && e.Outcome == core.OutcomeRefused && e.Code == core.CodeInvalid {
					continue
				}
			}
			t.Fatalf("an invalid run wrote record %s", r.Key)
		}
		return
	}
	if a.Err != "" || a.Run != "run-1" {
		t.Fatalf("a valid run was answered %+v, want run-1", a)
	}
	r, _, ok := d.o.Run("run-1")
	if !ok || len(r.Steps) != expanded(rs) || len(d.o.Steps()) != expanded(rs) {
		t.Fatalf("run-1 has %d steps (%d in all), the spec expands to %d", len(r.Steps), len(d.o.Steps()), expanded(rs))
	}
	if expanded(rs) > maxDrivenSteps {
		return
	}
	d.enrollMatching(rs)
	for round := 0; round < 12; round++ {
		d.work()
		d.now = d.now.Add(time.Duration(1+round*round) * 10 * time.Second)
		d.step(core.Tick{})
	}
}

// driver is a minimal, well-behaved driver around one orchestrator with a
// spec.Checker: records are durable before messages leave, and one worker
// answers every dispatch.
type driver struct {
	t    *testing.T
	o    *core.Orchestrator
	chk  *spec.Checker
	now  time.Time
	call core.CallID
	req  uint64
	held []core.Dispatch
}

const driverConn core.ConnID = 1

func (d *driver) step(in core.Input) core.Ready {
	d.t.Helper()
	d.chk.Input(d.now, in)
	rd := d.o.Step(d.now, in)
	d.chk.Batch(d.now, d.o, rd)
	d.chk.Persisted(d.now, rd)
	for _, e := range rd.Messages {
		if e.Conn != driverConn {
			continue
		}
		d.chk.Delivered(d.now, "fw", e.Msg)
		switch m := e.Msg.(type) {
		case core.Dispatch:
			d.held = append(d.held, m)
			if !m.Writes {
				d.chk.ProcessStarted(d.now, "fw", m.Lease, m.Step, false)
			}
		case core.StartAck:
			if m.OK {
				for _, h := range d.held {
					if h.Lease == m.Lease && h.Writes {
						d.chk.ProcessStarted(d.now, "fw", m.Lease, h.Step, true)
					}
				}
			}
		}
	}
	if v := d.chk.Check(); v != nil {
		d.t.Fatalf("%v", v)
	}
	return rd
}

// enrollMatching enrolls one worker that matches as many steps as it can:
// every required tag, every label, the first platform and target named.
func (d *driver) enrollMatching(rs core.RunSpec) {
	tags := map[string]bool{}
	labels := map[string]string{}
	var platform, name string
	for _, s := range rs.Steps {
		req, _ := core.RequiredTags(s)
		for _, tg := range req {
			tags[tg] = true
		}
		for k, v := range s.Labels {
			labels[k] = v
		}
		if platform == "" {
			platform = s.Platform
		}
		if name == "" {
			name = s.Target
		}
	}
	if name == "" || len(name) > core.MaxNameLength {
		name = "fuzz-worker"
	}
	rd := d.step(core.CreateToken{Call: 2, Name: "fuzz", TTL: time.Hour, Secret: [16]byte{7}})
	tok := rd.Answers[0].Token
	d.step(core.Received{Conn: driverConn, Msg: core.Hello{Version: core.ProtocolVersion, Token: tok, Worker: "fw",
		Name: name, Tags: slices.Sorted(maps.Keys(tags)), Labels: labels, Platform: platform, Slots: 8,
		MaxDelay: time.Minute}, Entropy: [16]byte{9}})
}

// work approves held gates and starts and completes what was dispatched.
func (d *driver) work() {
	for _, s := range d.o.Steps() {
		if s.State == core.StateHeld {
			d.call++
			d.step(core.Approve{Call: 100 + d.call, Step: s.ID})
		}
	}
	held := d.held
	d.held = nil
	for i, m := range held {
		d.req++
		d.step(core.Received{Conn: driverConn, Msg: core.Start{Lease: m.Lease, Request: d.req}})
		d.req++
		oc := core.Outcome{Status: core.OutcomeSuccess}
		if i%4 == 3 {
			oc = core.Outcome{Status: core.OutcomeFailure, ExitCode: 3, Message: fmt.Sprintf("step %s failed", m.Step)}
		}
		d.step(core.Received{Conn: driverConn, Msg: core.Report{Step: m.Step, Lease: m.Lease, Request: d.req, Outcome: oc}})
		d.chk.ProcessStopped(d.now, "fw", m.Lease)
	}
	d.step(core.Received{Conn: driverConn, Msg: core.Heartbeat{}})
}

// sampleSpecs are valid and invalid workflow definitions for the seeds.
func sampleSpecs() []core.RunSpec {
	return []core.RunSpec{
		{Name: "one", Steps: []core.StepSpec{{Name: "a", Command: "true"}}},
		{Name: "dag", Timeout: time.Hour, Env: map[string]string{"A": "1", "PATH": "/x"}, Steps: []core.StepSpec{
			{Name: "fetch", Command: "git fetch"},
			{Name: "build", Command: "make", DependsOn: []string{"fetch"}, ForEach: []string{"amd64", "arm64"}, Concurrency: 1, Tags: []string{"docker"}},
			{Name: "publish", Command: "./publish", DependsOn: []string{"build"}, Writes: true, Hold: true, HoldExpiry: 2 * time.Hour},
			{Name: "lint", Command: "make lint", Wait: 30 * time.Second, Type: "script", Runner: "docker"},
			{Name: "note", Type: "task", DependsOn: []string{"lint"}},
			{Name: "pin", Command: "x", Target: "builder-1", Labels: map[string]string{"zone": "a"}, Platform: "linux/arm64", Timeout: time.Minute},
		}},
		{Name: "cycle", Steps: []core.StepSpec{{Name: "a", Command: "x", DependsOn: []string{"b"}}, {Name: "b", Command: "y", DependsOn: []string{"a"}}}},
		{Name: "dup", Steps: []core.StepSpec{{Name: "a", Command: "x"}, {Name: "a", Command: "y"}}},
		{Name: "gates", Steps: []core.StepSpec{{Name: "a", Command: "x", Hold: true, Wait: time.Second}}},
		{Name: "empty"},
	}
}
