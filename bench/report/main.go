// Command report reads the output of `go test -bench` (make bench's) and
// prints the summary: each figure of the performance targets with its
// target, what was measured and whether it is met, then the ratios to the
// peers measured in the same run.
//
//	go run ./bench/report [LABEL=]FILE...   # no FILE: standard input
//
// A file's LABEL names the store its end-to-end figures ran on ("bbolt",
// the default, or "postgres"). A figure measured several times (-count)
// is given as the median, with the range beside it; a figure whose
// benchmark is not in the input is "not run". It exits 1 when a file
// holds a failed benchmark ("--- FAIL" or "FAIL"), 0 otherwise: a missed
// target is a finding, not an error.
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

func main() {
	var ins []input
	if len(os.Args) == 1 {
		ins = append(ins, input{label: "bbolt", r: os.Stdin})
	}
	for _, a := range os.Args[1:] {
		label, path, ok := strings.Cut(a, "=")
		if !ok {
			label, path = "bbolt", a
		}
		f, err := os.Open(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, "report:", err)
			os.Exit(2)
		}
		defer f.Close()
		ins = append(ins, input{label: label, r: f})
	}
	res, err := parse(ins)
	if err != nil {
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(2)
	}
	write(os.Stdout, res)
	if res.failed {
		os.Exit(1)
	}
}

type input struct {
	label string
	r     io.Reader
}

// result is one benchmark line: its store label, name (without the
// GOMAXPROCS suffix), GOMAXPROCS and metrics by unit.
type result struct {
	label, name string
	procs       int
	metrics     map[string]float64
}

// results are the input's benchmark lines, in the order read.
type results struct {
	lines  []result
	failed bool
}

var benchLine = regexp.MustCompile(`^(Benchmark\S+?)(?:-(\d+))?\s+(\d+)\s+(.*)$`)

func parse(ins []input) (results, error) {
	var res results
	for _, in := range ins {
		sc := bufio.NewScanner(in.r)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "--- FAIL") || line == "FAIL" || strings.HasPrefix(line, "FAIL\t") {
				res.failed = true
			}
			m := benchLine.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			r := result{label: in.label, name: m[1], procs: 1, metrics: map[string]float64{}}
			if m[2] != "" {
				r.procs, _ = strconv.Atoi(m[2])
			}
			f := strings.Fields(m[4])
			for i := 0; i+1 < len(f); i += 2 {
				v, err := strconv.ParseFloat(f[i], 64)
				if err != nil {
					return res, fmt.Errorf("%q: %v", line, err)
				}
				r.metrics[f[i+1]] = v
			}
			res.lines = append(res.lines, r)
		}
		if err := sc.Err(); err != nil {
			return res, err
		}
	}
	return res, nil
}

// values are a metric's values over the lines that match.
func (rs results) values(match func(result) bool, unit string) []float64 {
	var vs []float64
	for _, r := range rs.lines {
		if v, ok := r.metrics[unit]; ok && match(r) {
			vs = append(vs, v)
		}
	}
	return vs
}

func median(vs []float64) float64 {
	s := slices.Clone(vs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// row is one line of the summary.
type row struct {
	figure, target, measured, verdict string
}

// target is a bound on a figure: at least (more is better) or at most.
type target struct {
	atLeast bool
	bound   float64
}

func (t *target) String() string {
	if t == nil {
		return "—"
	}
	if t.atLeast {
		return "≥ " + num(t.bound)
	}
	return "≤ " + num(t.bound)
}

func (t *target) met(v float64) bool {
	if t.atLeast {
		return v >= t.bound
	}
	return v <= t.bound
}

// figure makes the row of a metric over the matching lines.
func figure(rs results, name string, match func(result) bool, unit string, t *target) row {
	vs := rs.values(match, unit)
	r := row{figure: name, target: t.String()}
	if len(vs) == 0 {
		r.measured, r.verdict = "not run", "—"
		return r
	}
	m := median(vs)
	r.measured = num(m) + " " + unit
	if len(vs) > 1 {
		r.measured += fmt.Sprintf(" (median of %d: %s–%s)", len(vs), num(slices.Min(vs)), num(slices.Max(vs)))
	}
	switch {
	case t == nil:
		r.verdict = "—"
	case t.met(m):
		r.verdict = "met"
	default:
		r.verdict = "MISSED"
	}
	return r
}

// num prints a figure with thousands separators above 100, else with two
// significant decimals.
func num(v float64) string {
	if v >= 100 || v <= -100 {
		s := strconv.FormatInt(int64(v+0.5), 10)
		var b strings.Builder
		for i, c := range s {
			if i > 0 && (len(s)-i)%3 == 0 {
				b.WriteByte(',')
			}
			b.WriteRune(c)
		}
		return b.String()
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

// An end-to-end throughput shape: BenchmarkEndToEnd/steps=N/workers=W/slots=S[/more].
var shapeName = regexp.MustCompile(`^BenchmarkEndToEnd/steps=\d+/workers=(\d+)/slots=(\d+)(/.*)?$`)

// A peer: BenchmarkEndToEnd/peer=NAME/jobs=N/workers=W.
var peerName = regexp.MustCompile(`^BenchmarkEndToEnd/peer=([\w-]+)/jobs=\d+/workers=(\d+)$`)

type shape struct {
	name           string
	workers, slots int
	extra          string // what follows the slots in the name (e.g. a lease-ahead)
}

func (s shape) concurrency() int { return s.workers * s.slots }

func (s shape) String() string {
	out := fmt.Sprintf("%d slots (%d × %d", s.concurrency(), s.workers, s.slots)
	if s.extra != "" {
		out += ", " + strings.ReplaceAll(strings.TrimPrefix(s.extra, "/"), "/", ", ")
	}
	return out + ")"
}

// shapes are the end-to-end throughput shapes of a store, in order.
func (rs results) shapes(label string) []shape {
	var out []shape
	for _, r := range rs.lines {
		m := shapeName.FindStringSubmatch(r.name)
		if r.label != label || m == nil || slices.ContainsFunc(out, func(s shape) bool { return s.name == r.name }) {
			continue
		}
		w, _ := strconv.Atoi(m[1])
		s, _ := strconv.Atoi(m[2])
		out = append(out, shape{name: r.name, workers: w, slots: s, extra: m[3]})
	}
	return out
}

// throughputTarget is the steps/s target of a shape on bbolt, and what
// the row says of it. Issue 17's 4-slot target names lease-ahead as its
// lever ("the next step is already there when a slot frees", SPEC §3), so
// it judges the lease-ahead shape: ≥ 6,000 steps/s and ahead of asynq
// without fsync at 4 workers when that peer ran beside it. The 4-slot
// shape without lease-ahead is printed for reference, with no target: a
// worker with one slot and nothing ahead idles for two fsync'd commits and
// a round trip a step, which no figure of this machine brings to 6,000.
func throughputTarget(s shape, peers []peer) (*target, string) {
	switch s.concurrency() {
	case 64:
		t := &target{atLeast: true, bound: 20000}
		return t, t.String()
	case 4:
		if !strings.Contains(s.extra, "ahead=") {
			return nil, "— (reference: the target is judged with lease-ahead)"
		}
		t := &target{atLeast: true, bound: 6000}
		what := t.String()
		for _, p := range peers {
			if p.label == "bbolt" && p.name == "asynq-nofsync" && p.workers == 4 {
				t.bound = max(t.bound, p.jobs)
				what += " and ahead of asynq-nofsync (" + num(p.jobs) + ")"
			}
		}
		return t, what
	}
	return nil, "—"
}

// judgedRiver is the River shape issue 16's point is judged against: the
// one that issue measured River in.
const judgedRiver = "river-insert"

// peerShapes say how each peer's jobs go in (bench/peers; the benchmark's
// benchPeerList).
var peerShapes = map[string]string{
	"river":         "InsertMany of 200",
	"river-insert":  "one Insert per job, 200 at once",
	"asynq-nofsync": "200 enqueuers, no fsync",
	"asynq-fsync":   "200 enqueuers, appendfsync always",
}

// peer is one peer's figure at one concurrency.
type peer struct {
	label, name string
	workers     int
	jobs        float64 // median jobs/s
}

func (rs results) peers() []peer {
	var out []peer
	for _, r := range rs.lines {
		m := peerName.FindStringSubmatch(r.name)
		if m == nil {
			continue
		}
		w, _ := strconv.Atoi(m[2])
		if slices.ContainsFunc(out, func(p peer) bool { return p.label == r.label && p.name == m[1] && p.workers == w }) {
			continue
		}
		vs := rs.values(func(x result) bool { return x.label == r.label && x.name == r.name }, "jobs/s")
		if len(vs) > 0 {
			out = append(out, peer{label: r.label, name: m[1], workers: w, jobs: median(vs)})
		}
	}
	return out
}

func named(label, name string) func(result) bool {
	return func(r result) bool { return r.label == label && r.name == name }
}

// summary is the rows and the ratio lines.
func summary(rs results) ([]row, []string) {
	var rows []row
	var ratios []string
	labels := []string{"bbolt"}
	for _, r := range rs.lines {
		if !slices.Contains(labels, r.label) {
			labels = append(labels, r.label)
		}
	}
	peers := rs.peers()
	for _, label := range labels {
		shapes := rs.shapes(label)
		if label != "bbolt" && len(shapes) == 0 {
			continue
		}
		store := ""
		if label != "bbolt" {
			store = " on " + label
		}
		for _, s := range shapes {
			t, what := throughputTarget(s, peers)
			if label != "bbolt" {
				t = nil
				// On PostgreSQL, issue 16's point: at 64 slots, five times
				// River on the same cluster in the shape that issue
				// measured it in, one Insert per job (river-insert).
				for _, p := range peers {
					if p.label == label && p.name == judgedRiver && p.workers == s.concurrency() && s.concurrency() == 64 && s.extra == "" {
						t = &target{atLeast: true, bound: 5 * p.jobs}
					}
				}
			}
			r := figure(rs, s.String()+store+", steps/s", named(label, s.name), "steps/s", t)
			switch {
			case label != "bbolt" && t != nil:
				r.target = "≥ 5 × River, " + peerShapes[judgedRiver] + " (issue 16's shape) = " + num(t.bound)
			case label == "bbolt":
				r.target = what
			}
			rows = append(rows, r)
		}
		for _, s := range shapes {
			if s.concurrency() == 64 && s.extra == "" {
				rows = append(rows, figure(rs, "loop's longest batch at "+s.String()+store, named(label, s.name), "loop-max-ms",
					&target{bound: 5}))
			}
		}
		lat := named(label, "BenchmarkEndToEnd/latency/idle")
		rows = append(rows,
			figure(rs, "submit → start p50, idle"+store, lat, "start-p50-ms", &target{bound: 0.8}),
			figure(rs, "submit → start p99, idle"+store, lat, "start-p99-ms", &target{bound: 3}))
		// The ratios to the peers, shape by shape: the best peer at the
		// shape's concurrency; on PostgreSQL, each peer on the same
		// cluster (River in each of its submission shapes).
		for _, s := range shapes {
			vs := rs.values(named(label, s.name), "steps/s")
			if len(vs) == 0 {
				continue
			}
			if label != "bbolt" {
				for _, p := range peers {
					if p.label == label && p.workers == s.concurrency() {
						ratios = append(ratios, fmt.Sprintf("%s%s: Tether %s steps/s / %s (%s, %s) %s jobs/s = %.2f×",
							s, store, num(median(vs)), p.name, p.label, peerShapes[p.name], num(p.jobs), median(vs)/p.jobs))
					}
				}
				continue
			}
			var best *peer
			for i, p := range peers {
				if p.workers == s.concurrency() && (label == "bbolt" || p.label == label) && (best == nil || p.jobs > best.jobs) {
					best = &peers[i]
				}
			}
			if best == nil {
				continue
			}
			tv := median(vs)
			ratios = append(ratios, fmt.Sprintf("%s%s: Tether %s steps/s / best peer %s (%s) %s jobs/s = %.2f×",
				s, store, num(tv), best.name, best.label, num(best.jobs), tv/best.jobs))
		}
	}
	// Idle workers: each sub-benchmark (the swarm's clients heartbeating,
	// and also pinging as a worker process does).
	var idles []string
	for _, r := range rs.lines {
		if strings.HasPrefix(r.name, "BenchmarkIdleWorkers/") && !slices.Contains(idles, r.name) {
			idles = append(idles, r.name)
		}
	}
	if len(idles) == 0 {
		idles = append(idles, "BenchmarkIdleWorkers/")
	}
	for _, name := range idles {
		what := "idle workers (" + strings.ReplaceAll(strings.TrimPrefix(name, "BenchmarkIdleWorkers/"), "/", ", ") + ")"
		rows = append(rows,
			figure(rs, what+": RSS each", named("bbolt", name), "rss-KiB/worker", &target{bound: 50}),
			figure(rs, what+": CPU", named("bbolt", name), "%cpu-of-one-core", &target{bound: 1}))
	}
	// The simulator (per core: run at GOMAXPROCS=1) and the explorer, at
	// each GOMAXPROCS they ran with. The simulator's target is four times
	// e746263's figure on this benchmark, seeds judged as TestSim judges
	// them (plain, shifted and drift runs): 2.34–2.84 seeds/s at load 4–5
	// (`go test ./sim -run '^$' -bench SimSeeds -benchtime 1x -cpu 1`,
	// PERFORMANCE.md "The simulator and the explorer"), so 4 × 2.84.
	for _, b := range []struct {
		bench, what, unit string
		t                 *target
	}{
		{"BenchmarkSimSeeds", "simulator", "seeds/s", &target{atLeast: true, bound: 4 * 2.84}},
		{"BenchmarkSimSeeds", "simulator", "events/s", nil},
		{"BenchmarkExplore", "explorer", "states/s", nil},
	} {
		var procs []int
		for _, r := range rs.lines {
			if strings.HasPrefix(r.name, b.bench) && !slices.Contains(procs, r.procs) {
				procs = append(procs, r.procs)
			}
		}
		if len(procs) == 0 {
			rows = append(rows, row{figure: b.what + " " + b.unit, target: b.t.String(), measured: "not run (no " + b.bench + ")", verdict: "—"})
		}
		for _, n := range procs {
			t := b.t
			if n != 1 {
				t = nil // the target is per core
			}
			rows = append(rows, figure(rs, fmt.Sprintf("%s %s, GOMAXPROCS=%d", b.what, b.unit, n),
				func(r result) bool { return strings.HasPrefix(r.name, b.bench) && r.procs == n }, b.unit, t))
		}
	}
	return rows, ratios
}

func write(w io.Writer, rs results) {
	rows, ratios := summary(rs)
	all := append([]row{{"figure", "target", "measured", "met"}}, rows...)
	var wid [4]int
	for _, r := range all {
		for i, c := range []string{r.figure, r.target, r.measured, r.verdict} {
			wid[i] = max(wid[i], len([]rune(c)))
		}
	}
	pad := func(s string, n int) string { return s + strings.Repeat(" ", n-len([]rune(s))) }
	fmt.Fprintln(w, "\nSummary")
	for i, r := range all {
		fmt.Fprintf(w, "  %s  %s  %s  %s\n", pad(r.figure, wid[0]), pad(r.target, wid[1]), pad(r.measured, wid[2]), r.verdict)
		if i == 0 {
			fmt.Fprintf(w, "  %s\n", strings.Repeat("-", wid[0]+wid[1]+wid[2]+wid[3]+6))
		}
	}
	if len(ratios) > 0 {
		fmt.Fprintln(w, "\nBeside the peers (same run)")
		for _, r := range ratios {
			fmt.Fprintln(w, "  "+r)
		}
	}
	if rs.failed {
		fmt.Fprintln(w, "\nA benchmark FAILED: see its output above.")
	}
}
