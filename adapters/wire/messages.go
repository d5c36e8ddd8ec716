package wire

import (
	"fmt"
	"time"

	"github.com/tether-run/tether/core"
)

// Wire bodies, one per message kind. Conversions copy slices and maps, and
// turn empty ones into nil: on the wire "absent", null and [] mean the same.

type leaseRef struct {
	Step  core.StepID  `json:"step"`
	Lease core.LeaseID `json:"lease"`
	Held  bool         `json:"held,omitempty"` // held ahead, not started (SPEC §3)
}

type logLine struct {
	Seq  uint64    `json:"seq"`
	At   time.Time `json:"at"`
	Text string    `json:"text"`
}

type outcome struct {
	Status   string `json:"status"`
	ExitCode int    `json:"exit_code"`
	Message  string `json:"message,omitempty"`
}

type hello struct {
	Version    int               `json:"version"`
	Token      string            `json:"token,omitempty"`
	Credential string            `json:"credential,omitempty"`
	Worker     core.WorkerID     `json:"worker"`
	Name       string            `json:"name,omitempty"`
	Tags       []string          `json:"tags,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
	Platform   string            `json:"platform,omitempty"`
	Slots      int               `json:"slots"`
	Ahead      int               `json:"ahead,omitempty"`
	Scaler     bool              `json:"scaler,omitempty"`
	MaxDelay   Duration          `json:"max_delay"`
	InFlight   []leaseRef        `json:"in_flight,omitempty"`
	Buffered   int               `json:"buffered,omitempty"`
	Draining   bool              `json:"draining,omitempty"`
}

type heartbeat struct {
	InFlight []leaseRef `json:"in_flight,omitempty"`
}

type start struct {
	Lease   core.LeaseID `json:"lease"`
	Request uint64       `json:"request"`
}

type held struct {
	Lease core.LeaseID `json:"lease"`
}

type reject struct {
	Lease  core.LeaseID `json:"lease"`
	Reason string       `json:"reason,omitempty"`
}

type report struct {
	Step    core.StepID  `json:"step"`
	Lease   core.LeaseID `json:"lease"`
	Request uint64       `json:"request"`
	Outcome outcome      `json:"outcome"`
}

type logs struct {
	Lease core.LeaseID `json:"lease"`
	Lines []logLine    `json:"lines"`
}

type events struct {
	Lease  core.LeaseID `json:"lease"`
	Events []logLine    `json:"events"`
}

type refresh struct {
	Request uint64 `json:"request"`
}

type drain struct{}

type welcome struct {
	Worker        core.WorkerID `json:"worker"`
	Credential    string        `json:"credential,omitempty"`
	CredentialTTL Duration      `json:"credential_ttl"`
	Heartbeat     Duration      `json:"heartbeat"`
	// HeartbeatPhase: absent from an orchestrator before the heartbeat
	// grid, which the worker then reads as zero (SPEC §10).
	HeartbeatPhase Duration       `json:"heartbeat_phase,omitempty"`
	Cancel         []core.LeaseID `json:"cancel,omitempty"`
}

type refused struct {
	Reason string `json:"reason"`
	Fatal  bool   `json:"fatal,omitempty"`
}

type dispatch struct {
	Lease   core.LeaseID      `json:"lease"`
	Step    core.StepID       `json:"step"`
	Run     core.RunID        `json:"run"`
	Command string            `json:"command"`
	Env     map[string]string `json:"env,omitempty"`
	Writes  bool              `json:"writes,omitempty"`
	Timeout Duration          `json:"timeout"`
	Attempt int               `json:"attempt"`
	// SPEC §14a; the fast codec declines a dispatch that names secrets.
	Secrets   []string `json:"secrets,omitempty"`
	SecretsAs string   `json:"secrets_as,omitempty"`
}

type startAck struct {
	Lease   core.LeaseID `json:"lease"`
	Request uint64       `json:"request"`
	OK      bool         `json:"ok"`
	Reason  string       `json:"reason,omitempty"`
}

type cancel struct {
	Lease  core.LeaseID `json:"lease"`
	Reason string       `json:"reason,omitempty"`
}

type answer struct {
	Lease   core.LeaseID `json:"lease"`
	Request uint64       `json:"request"`
	Verdict string       `json:"verdict"`
	Reason  string       `json:"reason,omitempty"`
}

type refreshed struct {
	Request uint64   `json:"request"`
	TTL     Duration `json:"ttl"`
}

type logAck struct {
	Lease  core.LeaseID `json:"lease"`
	Lines  uint64       `json:"lines"`
	Events uint64       `json:"events"`
}

type closeMsg struct {
	Reason string `json:"reason"`
}

func init() {
	register(func(m core.Hello) hello {
		return hello{Version: m.Version, Token: m.Token, Credential: m.Credential, Worker: m.Worker, Name: m.Name,
			Tags: clone(m.Tags), Labels: cloneMap(m.Labels), Platform: m.Platform, Slots: m.Slots, Ahead: m.Ahead, Scaler: m.Scaler,
			MaxDelay: Duration(m.MaxDelay), InFlight: refsOut(m.InFlight), Buffered: m.Buffered, Draining: m.Draining}
	}, func(w hello) (core.Hello, error) {
		return core.Hello{Version: w.Version, Token: w.Token, Credential: w.Credential, Worker: w.Worker, Name: w.Name,
			Tags: clone(w.Tags), Labels: cloneMap(w.Labels), Platform: w.Platform, Slots: w.Slots, Ahead: w.Ahead, Scaler: w.Scaler,
			MaxDelay: time.Duration(w.MaxDelay), InFlight: refsIn(w.InFlight), Buffered: w.Buffered, Draining: w.Draining}, nil
	})
	register(func(m core.Heartbeat) heartbeat { return heartbeat{InFlight: refsOut(m.InFlight)} },
		func(w heartbeat) (core.Heartbeat, error) { return core.Heartbeat{InFlight: refsIn(w.InFlight)}, nil })
	register(func(m core.Start) start { return start(m) },
		func(w start) (core.Start, error) { return core.Start(w), nil })
	register(func(m core.Held) held { return held(m) },
		func(w held) (core.Held, error) { return core.Held(w), nil })
	register(func(m core.RejectDispatch) reject { return reject(m) },
		func(w reject) (core.RejectDispatch, error) { return core.RejectDispatch(w), nil })
	register(func(m core.Report) report {
		return report{Step: m.Step, Lease: m.Lease, Request: m.Request, Outcome: outcome{
			Status: m.Outcome.Status.String(), ExitCode: m.Outcome.ExitCode, Message: m.Outcome.Message}}
	}, func(w report) (core.Report, error) {
		// An unknown status is not a broken frame but a malformed report:
		// the core answers it REJECTED and the connection stays (SPEC §3).
		st, _ := parseStatus(w.Outcome.Status)
		return core.Report{Step: w.Step, Lease: w.Lease, Request: w.Request, Outcome: core.Outcome{
			Status: st, ExitCode: w.Outcome.ExitCode, Message: w.Outcome.Message}}, nil
	})
	register(func(m core.Logs) logs { return logs{Lease: m.Lease, Lines: linesOut(m.Lines)} },
		func(w logs) (core.Logs, error) { return core.Logs{Lease: w.Lease, Lines: linesIn(w.Lines)}, nil })
	register(func(m core.Events) events { return events{Lease: m.Lease, Events: linesOut(m.Events)} },
		func(w events) (core.Events, error) {
			return core.Events{Lease: w.Lease, Events: linesIn(w.Events)}, nil
		})
	register(func(m core.Refresh) refresh { return refresh(m) },
		func(w refresh) (core.Refresh, error) { return core.Refresh(w), nil })
	register(func(core.Drain) drain { return drain{} },
		func(drain) (core.Drain, error) { return core.Drain{}, nil })
	register(func(m core.Welcome) welcome {
		return welcome{Worker: m.Worker, Credential: m.Credential, CredentialTTL: Duration(m.CredentialTTL),
			Heartbeat: Duration(m.Heartbeat), HeartbeatPhase: Duration(m.HeartbeatPhase), Cancel: clone(m.Cancel)}
	}, func(w welcome) (core.Welcome, error) {
		return core.Welcome{Worker: w.Worker, Credential: w.Credential, CredentialTTL: time.Duration(w.CredentialTTL),
			Heartbeat: time.Duration(w.Heartbeat), HeartbeatPhase: time.Duration(w.HeartbeatPhase), Cancel: clone(w.Cancel)}, nil
	})
	register(func(m core.Refused) refused { return refused{Reason: m.Reason, Fatal: m.Fatal} },
		func(w refused) (core.Refused, error) { return core.Refused{Reason: w.Reason, Fatal: w.Fatal}, nil })
	register(func(m core.Dispatch) dispatch {
		return dispatch{Lease: m.Lease, Step: m.Step, Run: m.Run, Command: m.Command, Env: cloneMap(m.Env),
			Writes: m.Writes, Timeout: Duration(m.Timeout), Attempt: m.Attempt, Secrets: clone(m.Secrets), SecretsAs: m.SecretsAs}
	}, func(w dispatch) (core.Dispatch, error) {
		return core.Dispatch{Lease: w.Lease, Step: w.Step, Run: w.Run, Command: w.Command, Env: cloneMap(w.Env),
			Writes: w.Writes, Timeout: time.Duration(w.Timeout), Attempt: w.Attempt, Secrets: clone(w.Secrets), SecretsAs: w.SecretsAs}, nil
	})
	register(func(m core.StartAck) startAck { return startAck(m) },
		func(w startAck) (core.StartAck, error) { return core.StartAck(w), nil })
	register(func(m core.Cancel) cancel { return cancel(m) },
		func(w cancel) (core.Cancel, error) { return core.Cancel(w), nil })
	register(func(m core.Answer) answer {
		return answer{Lease: m.Lease, Request: m.Request, Verdict: m.Verdict.String(), Reason: m.Reason}
	}, func(w answer) (core.Answer, error) {
		v, err := parseVerdict(w.Verdict)
		if err != nil {
			return core.Answer{}, err
		}
		return core.Answer{Lease: w.Lease, Request: w.Request, Verdict: v, Reason: w.Reason}, nil
	})
	register(func(m core.Refreshed) refreshed { return refreshed{Request: m.Request, TTL: Duration(m.TTL)} },
		func(w refreshed) (core.Refreshed, error) {
			return core.Refreshed{Request: w.Request, TTL: time.Duration(w.TTL)}, nil
		})
	register(func(m core.LogAck) logAck { return logAck(m) },
		func(w logAck) (core.LogAck, error) { return core.LogAck(w), nil })
	// A Close's Code is the transport's close code (SPEC §9), not a field.
	register(func(m core.Close) closeMsg { return closeMsg{Reason: m.Reason} },
		func(w closeMsg) (core.Close, error) { return core.Close{Reason: w.Reason}, nil })
}

func parseStatus(s string) (core.OutcomeStatus, error) {
	for _, st := range []core.OutcomeStatus{core.OutcomeSuccess, core.OutcomeFailure, core.OutcomeCancelled, core.OutcomeCleanupFailed, core.OutcomeWorkerStopped, core.OutcomeTimedOut} {
		if st.String() == s {
			return st, nil
		}
	}
	return 0, fmt.Errorf("unknown outcome status %.32q", s)
}

func parseVerdict(s string) (core.Verdict, error) {
	for _, v := range []core.Verdict{core.Committed, core.Cancelled, core.Rejected} {
		if v.String() == s {
			return v, nil
		}
	}
	return 0, fmt.Errorf("unknown verdict %.32q", s)
}

func refsOut(rs []core.LeaseRef) []leaseRef {
	if rs == nil {
		return nil
	}
	out := make([]leaseRef, len(rs))
	for i, r := range rs {
		out[i] = leaseRef(r)
	}
	return out
}

func refsIn(rs []leaseRef) []core.LeaseRef {
	if len(rs) == 0 {
		return nil
	}
	out := make([]core.LeaseRef, len(rs))
	for i, r := range rs {
		out[i] = core.LeaseRef(r)
	}
	return out
}

func linesOut(ls []core.LogLine) []logLine {
	if ls == nil {
		return nil
	}
	out := make([]logLine, len(ls))
	for i, l := range ls {
		out[i] = logLine(l)
	}
	return out
}

func linesIn(ls []logLine) []core.LogLine {
	if len(ls) == 0 {
		return nil
	}
	out := make([]core.LogLine, len(ls))
	for i, l := range ls {
		out[i] = core.LogLine(l)
	}
	return out
}

func clone[T any](s []T) []T {
	if len(s) == 0 {
		return nil
	}
	return append(make([]T, 0, len(s)), s...)
}

func cloneMap(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}
