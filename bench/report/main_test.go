package main

import (
	"strings"
	"testing"
)

const bboltOut = `goos: linux
BenchmarkEndToEnd/steps=20000/workers=4/slots=16-2   1   0 ns/op   21000 steps/s   3.1 loop-max-ms
BenchmarkEndToEnd/steps=20000/workers=4/slots=16-2   1   0 ns/op   19000 steps/s   6.0 loop-max-ms
BenchmarkEndToEnd/steps=20000/workers=4/slots=16-2   1   0 ns/op   20500 steps/s   4.0 loop-max-ms
BenchmarkEndToEnd/steps=20000/workers=4/slots=1-2    1   0 ns/op   3000 steps/s
BenchmarkEndToEnd/steps=20000/workers=4/slots=1/ahead=2-2    1   0 ns/op   6500 steps/s
BenchmarkEndToEnd/latency/idle-2   1   0 ns/op   0.70 start-p50-ms   3.50 start-p99-ms
BenchmarkEndToEnd/peer=asynq-nofsync/jobs=20000/workers=64-2   1   0 ns/op   15000 jobs/s
BenchmarkEndToEnd/peer=asynq-nofsync/jobs=20000/workers=4-2    1   0 ns/op   5000 jobs/s
BenchmarkIdleWorkers/workers=10000-2   1   0 ns/op   40.5 rss-KiB/worker   0.5 %cpu-of-one-core
BenchmarkIdleWorkers/workers=10000/pings=5s-2   1   0 ns/op   41.5 rss-KiB/worker   3.5 %cpu-of-one-core
BenchmarkSimSeeds-1   1   0 ns/op   60 seeds/s   80000 events/s
PASS
`

const pgOut = `BenchmarkEndToEnd/steps=20000/workers=4/slots=16-2   1   0 ns/op   12000 steps/s   4.0 loop-max-ms
BenchmarkEndToEnd/steps=20000/workers=4/slots=1-2   1   0 ns/op   3000 steps/s
BenchmarkEndToEnd/peer=river/jobs=20000/workers=64-2   1   0 ns/op   14000 jobs/s
BenchmarkEndToEnd/peer=river/jobs=20000/workers=4-2   1   0 ns/op   2000 jobs/s
BenchmarkEndToEnd/peer=river-insert/jobs=20000/workers=64-2   1   0 ns/op   2000 jobs/s
BenchmarkEndToEnd/peer=river-insert/jobs=20000/workers=4-2   1   0 ns/op   500 jobs/s
`

func must(rows map[string]row, _ []string, _ string) map[string]row { return rows }

func summarize(t *testing.T, ins ...input) (map[string]row, []string, string) {
	t.Helper()
	res, err := parse(ins)
	if err != nil {
		t.Fatal(err)
	}
	rows, ratios := summary(res)
	byFigure := map[string]row{}
	for _, r := range rows {
		byFigure[r.figure] = r
	}
	var b strings.Builder
	write(&b, res)
	return byFigure, ratios, b.String()
}

// TestSummary: each figure is the median of its runs, judged against its
// target in the right direction; a figure not run says so; the ratios
// name the best peer at the shape's concurrency, and on PostgreSQL every
// peer on the same cluster (River in both its submission shapes), the 5×
// point judged at 64 slots against River's one-Insert shape alone.
func TestSummary(t *testing.T) {
	rows, ratios, out := summarize(t, input{"bbolt", strings.NewReader(bboltOut)}, input{"postgres", strings.NewReader(pgOut)})
	for _, c := range []struct{ figure, measured, verdict string }{
		{"64 slots (4 × 16), steps/s", "20,500 steps/s (median of 3: 19,000–21,000)", "met"},
		{"4 slots (4 × 1), steps/s", "3,000 steps/s", "—"}, // judged with lease-ahead only
		{"4 slots (4 × 1, ahead=2), steps/s", "6,500 steps/s", "met"},
		{"loop's longest batch at 64 slots (4 × 16)", "4.00 loop-max-ms (median of 3: 3.10–6.00)", "met"},
		{"submit → start p50, idle", "0.70 start-p50-ms", "met"},
		{"submit → start p99, idle", "3.50 start-p99-ms", "MISSED"},
		{"idle workers (workers=10000): RSS each", "40.50 rss-KiB/worker", "met"},
		{"idle workers (workers=10000): CPU", "0.50 %cpu-of-one-core", "met"},
		{"idle workers (workers=10000, pings=5s): CPU", "3.50 %cpu-of-one-core", "MISSED"},
		{"simulator seeds/s, GOMAXPROCS=1", "60.00 seeds/s", "met"},
		{"explorer states/s", "not run (no BenchmarkExplore)", "—"},
		{"64 slots (4 × 16) on postgres, steps/s", "12,000 steps/s", "met"}, // 5 × River's one-Insert shape is 10,000 (its InsertMany 70,000)
		{"4 slots (4 × 1) on postgres, steps/s", "3,000 steps/s", "—"},      // issue 16's point is at 64 slots
		{"submit → start p50, idle on postgres", "not run", "—"},
	} {
		r, ok := rows[c.figure]
		if !ok {
			t.Errorf("no row %q in\n%s", c.figure, out)
			continue
		}
		if r.measured != c.measured || r.verdict != c.verdict {
			t.Errorf("%s: %q %q, want %q %q", c.figure, r.measured, r.verdict, c.measured, c.verdict)
		}
	}
	want := []string{
		"64 slots (4 × 16): Tether 20,500 steps/s / best peer asynq-nofsync (bbolt) 15,000 jobs/s = 1.37×",
		"4 slots (4 × 1): Tether 3,000 steps/s / best peer asynq-nofsync (bbolt) 5,000 jobs/s = 0.60×",
		"4 slots (4 × 1, ahead=2): Tether 6,500 steps/s / best peer asynq-nofsync (bbolt) 5,000 jobs/s = 1.30×",
		"64 slots (4 × 16) on postgres: Tether 12,000 steps/s / river (postgres, InsertMany of 200) 14,000 jobs/s = 0.86×",
		"64 slots (4 × 16) on postgres: Tether 12,000 steps/s / river-insert (postgres, one Insert per job, 200 at once) 2,000 jobs/s = 6.00×",
		"4 slots (4 × 1) on postgres: Tether 3,000 steps/s / river (postgres, InsertMany of 200) 2,000 jobs/s = 1.50×",
		"4 slots (4 × 1) on postgres: Tether 3,000 steps/s / river-insert (postgres, one Insert per job, 200 at once) 500 jobs/s = 6.00×",
	}
	if r := rows["4 slots (4 × 1, ahead=2), steps/s"]; r.target != "≥ 6,000 and ahead of asynq-nofsync (5,000)" {
		t.Errorf("the 4-slot target: %q", r.target)
	}
	// Ahead of 6,000 but behind asynq without fsync: missed.
	faster := strings.Replace(bboltOut, "workers=4-2    1   0 ns/op   5000 jobs/s", "workers=4-2    1   0 ns/op   7000 jobs/s", 1)
	if faster == bboltOut {
		t.Fatal("the asynq line to replace is not in bboltOut")
	}
	if r := must(summarize(t, input{"bbolt", strings.NewReader(faster)}))["4 slots (4 × 1, ahead=2), steps/s"]; r.verdict != "MISSED" || r.target != "≥ 6,000 and ahead of asynq-nofsync (7,000)" {
		t.Errorf("6,500 steps/s behind asynq's 7,000: %q %q, want MISSED", r.target, r.verdict)
	}
	if r := rows["64 slots (4 × 16) on postgres, steps/s"]; r.target != "≥ 5 × River, one Insert per job, 200 at once (issue 16's shape) = 10,000" {
		t.Errorf("the 5× point's target: %q", r.target)
	}
	if strings.Join(ratios, "\n") != strings.Join(want, "\n") {
		t.Errorf("ratios:\n%s\nwant:\n%s", strings.Join(ratios, "\n"), strings.Join(want, "\n"))
	}
	if res, _ := parse([]input{{"bbolt", strings.NewReader(bboltOut)}}); res.failed {
		t.Error("a passing run is taken as failed")
	}
	if res, _ := parse([]input{{"bbolt", strings.NewReader(bboltOut + "--- FAIL: BenchmarkIdleWorkers\nFAIL\n")}}); !res.failed {
		t.Error("a failed benchmark is not noticed")
	}
}
