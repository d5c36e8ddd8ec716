package orchestrator_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/client"
	"github.com/tether-run/tether/core"
)

// TestRetentionPrunesExactly runs a real orchestrator with a retention of
// 1.5 s (SPEC §7a): a finished run, its log lines and a bundle no live run
// names are pruned once older than that; a live run (held at a gate for the
// whole test) and the bundle its spec names survive, and so does a run that
// finished after the cutoff.
func TestRetentionPrunesExactly(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	logs := &lockedBuffer{}
	d, err := orchestrator.Start(orchestrator.Options{
		Addr: "127.0.0.1:0", StorePath: filepath.Join(t.TempDir(), "tether.db"), AdminToken: adminToken,
		Config: core.Config{Retention: 1500 * time.Millisecond},
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	r := &archRig{apiRig: &apiRig{t: t, ctx: ctx, d: d}, logs: logs}

	upload := func(body string) string {
		_, err := r.client().PutBundle(r.ctx, strings.NewReader(body))
		r.ok("put bundle", err)
		sum := sha256.Sum256([]byte(body))
		return hex.EncodeToString(sum[:])
	}
	named, unnamed := upload("a tool the live run uses"), upload("a tool nobody names")

	tok, err := d.CreateToken(ctx, "w1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	w := r.dialRaw()
	w.send(core.Hello{Version: core.ProtocolVersion, Token: tok, Worker: "w1-0001", Name: "w1", Slots: 2, MaxDelay: time.Second})
	next[core.Welcome](w)
	finish := func(name string) string {
		run := r.submit(core.RunSpec{Name: name, Steps: []core.StepSpec{{Name: "a", Command: "echo " + name}}})
		disp := next[core.Dispatch](w)
		w.send(core.Start{Lease: disp.Lease, Request: 1})
		next[core.StartAck](w)
		w.send(core.Logs{Lease: disp.Lease, Lines: []core.LogLine{{Seq: 1, At: time.Now(), Text: name}}})
		next[core.LogAck](w)
		w.send(core.Report{Step: disp.Step, Lease: disp.Lease, Request: 2, Outcome: core.Outcome{Status: core.OutcomeSuccess}})
		if a := w.answer(disp.Lease, 2); a.Verdict != core.Committed {
			t.Fatalf("%s: %v %s", name, a.Verdict, a.Reason)
		}
		return run
	}
	old := finish("old")
	live := r.submit(core.RunSpec{Name: "live", Env: map[string]string{"TOOL": "/bundle/" + named},
		Steps: []core.StepSpec{{Name: "gate", Command: "true", Hold: true}}})

	// Wait for a pass to prune the old run (the pruner looks every second).
	deadline := time.Now().Add(testTimeout / 2)
	for {
		_, err := r.client().Run(ctx, old)
		if client.ErrorCode(err) == client.CodeNotFound {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s was never pruned (GET answers %v); log:\n%s", old, err, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	recent := finish("recent") // finished after that pass's cutoff: read at once

	c := r.client()
	lg, err := c.Logs(ctx, recent, "")
	r.ok("logs", err)
	if len(lg.Lines) != 1 || lg.Lines[0].Text != "recent" {
		t.Fatalf("the recent run's logs: %+v", lg)
	}
	_, err = c.Logs(ctx, old, "")
	r.wantCode("logs of the pruned run", err, client.CodeNotFound)
	_, err = c.Run(ctx, live)
	r.ok("the live run", err)
	// A pass prunes history first and data after it, so the pass that
	// pruned the old run may still be on its way to the bundles: wait for
	// the unnamed one to go, then the named one must still be there.
	for {
		_, err = c.Bundle(ctx, unnamed)
		if client.ErrorCode(err) == client.CodeNotFound {
			break
		}
		if time.Now().After(deadline) {
			r.wantCode("the bundle nobody names", err, client.CodeNotFound)
		}
		time.Sleep(100 * time.Millisecond)
	}
	_, err = c.Bundle(ctx, named)
	r.ok("the bundle the live run names", err)
	if !strings.Contains(logs.String(), "msg=pruned") {
		t.Fatalf("no pruning was logged:\n%s", logs.String())
	}
}
