package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/core"
)

// TestRunListArchived: `run list` pages through the API's next_cursor when
// --limit asks for more than a page, newest first, with --status, --name
// and --since; `run show` and `run logs` of an archived run work as of a
// live one; bad flags are refused.
func TestRunListArchived(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	const token = "cli-test-admin-token-0123456789abcdef"
	d, err := orchestrator.Start(orchestrator.Options{
		Addr: "127.0.0.1:0", StorePath: filepath.Join(t.TempDir(), "tether.db"), AdminToken: token,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	// More runs than one page of the API; no worker is named "nobody", so
	// they stay live until cancelled.
	const n = orchestrator.MaxRunsLimit + 20
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < n; i += 8 {
				name := "build"
				if i%2 == 1 {
					name = "deploy"
				}
				if _, err := d.Submit(ctx, core.RunSpec{Name: name, Steps: []core.StepSpec{{Name: "a", Command: "true", Target: "nobody"}}}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for i := 1; i <= 5; i++ { // archived: cancelled while queued
		if err := d.CancelRun(ctx, core.RunID(fmt.Sprintf("run-%d", i)), "enough"); err != nil {
			t.Fatal(err)
		}
	}
	cli := func(want int, args ...string) string {
		t.Helper()
		var out, errb bytes.Buffer
		args = append(args, "--url", d.DataURL(), "--admin-token", token)
		if code := run(ctx, args, &out, &errb, func(string) string { return "" }); code != want {
			t.Fatalf("%v: exit %d, want %d\nstdout: %s\nstderr: %s", args, code, want, out.String(), errb.String())
		}
		return out.String() + errb.String()
	}
	list := func(args ...string) orchestrator.APIRunList {
		t.Helper()
		var l orchestrator.APIRunList
		out := cli(exitOK, append([]string{"run", "list", "--json"}, args...)...)
		if err := json.Unmarshal([]byte(out), &l); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		return l
	}
	l := list("--limit", fmt.Sprint(n-3))
	if len(l.Runs) != n-3 || l.NextCursor == "" {
		t.Fatalf("--limit %d: %d runs, next_cursor %q", n-3, len(l.Runs), l.NextCursor)
	}
	for i, r := range l.Runs {
		if want := fmt.Sprintf("run-%d", n-i); r.ID != want {
			t.Fatalf("run %d of the listing is %s, want %s (newest first, no gap or duplicate)", i, r.ID, want)
		}
	}
	if l := list("--limit", fmt.Sprint(2*n)); len(l.Runs) != n || l.NextCursor != "" {
		t.Fatalf("--limit %d: %d runs, next_cursor %q; want all %d", 2*n, len(l.Runs), l.NextCursor, n)
	}
	if l := list(); len(l.Runs) != orchestrator.DefaultRunsLimit {
		t.Fatalf("default --limit: %d runs", len(l.Runs))
	}
	l = list("--status", "cancelled", "--limit", "3")
	if len(l.Runs) != 3 || l.Runs[0].ID != "run-5" || l.Runs[2].ID != "run-3" || l.NextCursor == "" {
		t.Fatalf("--status cancelled --limit 3: %+v", l)
	}
	var builds []string // submitted concurrently: names are not in run order
	for _, r := range list("--status", "cancelled").Runs {
		if r.Name == "build" {
			builds = append(builds, r.ID)
		}
	}
	var got []string
	for _, r := range list("--status", "cancelled", "--name", "build", "--since", "1h").Runs {
		got = append(got, r.ID)
	}
	if fmt.Sprint(got) != fmt.Sprint(builds) {
		t.Fatalf("cancelled build runs: %v, want %v", got, builds)
	}
	if l := list("--since", time.Now().Add(time.Minute).UTC().Format(time.RFC3339)); len(l.Runs) != 0 {
		t.Fatalf("--since the future: %d runs", len(l.Runs))
	}
	table := cli(exitOK, "run", "list", "--status", "cancelled")
	if lines := strings.Split(strings.TrimSpace(table), "\n"); len(lines) != 6 || !strings.HasPrefix(lines[1], "run-5 ") {
		t.Fatalf("table:\n%s", table)
	}
	if out := cli(exitOK, "run", "show", "run-2"); !strings.Contains(out, "cancelled") || !strings.Contains(out, "run-2/a") {
		t.Fatalf("run show of an archived run:\n%s", out)
	}
	cli(exitOK, "run", "logs", "run-2")
	if out := cli(exitRefused, "run", "cancel", "run-2"); !strings.Contains(out, "archived") {
		t.Fatalf("cancel of an archived run:\n%s", out)
	}
	cli(exitUsage, "run", "list", "--limit", "0")
	if out := cli(exitRefused, "run", "list", "--status", "done"); !strings.Contains(out, "status") {
		t.Fatalf("--status done:\n%s", out)
	}
	if out := cli(exitRefused, "run", "list", "--since", "yesterday"); !strings.Contains(out, "since") {
		t.Fatalf("--since yesterday:\n%s", out)
	}
}
