package main

import (
	"bytes"
	"context"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestSoakSmall keeps the harness from rotting under `make test`: the whole
// of it at a tiny size (the binaries built, with -race under -race, 2,000
// steps, the restart, the retention phase for two seconds or its skip). It asserts that every run
// succeeded and each line was printed — never a figure or a threshold: the
// verdict's PASS or FAIL is `make soak`'s to give, at full size.
func TestSoakSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the orchestrator and worker binaries")
	}
	cfg := defaultConfig()
	cfg.steps, cfg.every, cfg.workers, cfg.slots = 2000, 1000, 2, 4
	cfg.retainFor, cfg.retainEvery = 2*time.Second, time.Second
	cfg.race = raceBuild
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if _, err := soak(ctx, cfg, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Logf("\n%s", out.String())
	for _, want := range []string{
		`(?m)^steps=1000 rss_mib=[0-9.]+ peak_rss_mib=[0-9.]+ anon_mib=[0-9.]+ file_mib=[0-9.]+ store_mib=[0-9.]+ steps_per_s=[0-9]+ `,
		`(?m)^steps=2000 rss_mib=`,
		`(?m)^load: [0-9]+ steps in [0-9]+ runs \(the last [0-9]+ after the last line\), every run succeeded`,
		`(?m)^drained: rss_mib=[0-9.]+ `,
		`(?m)^restart: ready_ms=[0-9]+ hello_ms=[0-9]+ api_ms=[0-9]+ rss_mib=[0-9.]+ peak_rss_mib=`,
		`(?m)^restart: the last run, run-[0-9]+, reads back success with 500 steps$`,
		`(?m)^retain: (skipped: |t=[0-9]+s steps=[0-9]+ store_mib=)`,
		`(?m)^verdict: runs +PASS `,
		`(?m)^verdict: (rss|rss_flat|restart|restart_rss|retain) +(PASS|FAIL|SKIP) `,
		`(?m)^soak: (PASS|FAIL)$`,
	} {
		if !regexp.MustCompile(want).MatchString(out.String()) {
			t.Errorf("no line matches %s", want)
		}
	}
	// The runs that keep the window full past the load print no line.
	for _, m := range regexp.MustCompile(`(?m)^steps=([0-9]+) `).FindAllStringSubmatch(out.String(), -1) {
		if m[1] != "1000" && m[1] != "2000" {
			t.Errorf("a line at steps=%s, past the load's 2000", m[1])
		}
	}
}

// TestSoakFlags: flags that cannot make a soak are refused.
func TestSoakFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-steps", "1200", "-runsize", "500"}, // not a multiple
		{"-steps", "0"},
		{"-slots", "1025"},
		{"-workers", "0"},
		{"-retain", "a minute"},
		{"-retainfor", "0s"},
		{"extra"},
	} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("%s: accepted", strings.Join(args, " "))
		}
	}
	if cfg, err := parseFlags([]string{"-steps", "2000", "-retain", ""}, io.Discard); err != nil || cfg.steps != 2000 || cfg.retain != "" {
		t.Errorf("-steps 2000 -retain '': %+v, %v", cfg, err)
	}
}

// TestCheckRun: a run is done only when it succeeded with every step; one
// that failed, or finished short of its steps, is an error.
func TestCheckRun(t *testing.T) {
	detail := func(status string, success, steps int, finished bool) runDetail {
		var d runDetail
		d.Run.ID, d.Run.Status, d.Run.Steps = "run-1", status, steps
		d.Run.States = map[string]int{"success": success, "failed": steps - success}
		if finished {
			d.Run.FinishedAt = time.Unix(1, 0)
		}
		return d
	}
	for _, c := range []struct {
		name      string
		d         runDetail
		done, bad bool
	}{
		{"running", detail("running", 3, 5, false), false, false},
		{"succeeded", detail("success", 5, 5, true), true, false},
		{"failing", detail("failing", 3, 5, false), false, true},
		{"failed", detail("failed", 4, 5, true), false, true},
		{"cancelled", detail("cancelled", 0, 5, true), false, true},
		{"success short of its steps", detail("success", 4, 4, true), false, true},
		{"an unknown final status", detail("archived", 5, 5, true), false, true},
	} {
		done, err := checkRun(c.d, 5)
		if done != c.done || (err != nil) != c.bad {
			t.Errorf("%s: done %v, err %v; want done %v, an error %v", c.name, done, err, c.done, c.bad)
		}
	}
}
