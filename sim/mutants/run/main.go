// Command run is the mutation harness: it applies each planted bug in
// sim/mutants/*.patch to a fresh copy of the repository and runs every
// checker against it — the seeded simulator, the explorer (the default
// scope, then the faults, identity, slow, multiset, timers, tags, chain,
// scaler, archive and locks scopes for what the default one does not reach), the rapid suites
// and the fuzz corpora — and prints, per
// mutant, which of them caught it and with which invariant.
//
//	go run ./sim/mutants/run [-seeds 500] [-first 1] [-only name,...] [-checkers sim,explorer,rapid,fuzz] [-v]
//
// A patch that does not apply, a mutant that does not build, or a mutant the
// simulator does not catch within the seed budget fails the run. The other
// columns are reported: the explorer, rapid and fuzz reach only part of the
// mutant set by design (see each mutant's note in the README).
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
)

var (
	flagSeeds = flag.Int("seeds", 500, "seeds per mutant (passed as -sim.seeds)")
	flagFirst = flag.Uint64("first", 1, "first seed (passed as -sim.first)")
	flagOnly  = flag.String("only", "", "comma-separated mutant names (file names without .patch, or their prefixes) to run; default all")
	flagV     = flag.Bool("v", false, "print each mutant's full go test output")
	flagCheck = flag.String("checkers", "sim,explorer,rapid,fuzz", "comma-separated checkers to run against each mutant")
)

// verdict is what one checker made of one mutant.
type verdict struct {
	ran    bool
	caught bool
	by     string // the invariant, test or scope that caught it
	err    error  // the checker could not judge (it did not build, or failed oddly)
}

func (v verdict) cell() string {
	switch {
	case !v.ran:
		return "-"
	case v.err != nil:
		return "ERROR"
	case v.caught:
		return v.by
	}
	return "no"
}

func checkerOn(name string) bool {
	for _, c := range strings.Split(*flagCheck, ",") {
		if strings.TrimSpace(c) == name {
			return true
		}
	}
	return false
}

// result is one mutant's row.
type result struct {
	name      string
	caught    bool
	seed      uint64 // the smallest failing seed, if caught
	invariant string
	elapsed   time.Duration
	err       error // the harness could not judge the mutant (patch or build failed)

	explorer, rapid, fuzz verdict
}

// failRe matches the simulator's failure line:
// "seed 0x2a violated NoStaleCommit at +1m2s: …".
var failRe = regexp.MustCompile(`seed (0x[0-9a-fA-F]+|\d+) violated (.+?) at \+`)

func main() {
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	code, err := run(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mutants:", err)
		if code == 0 {
			code = 2
		}
	}
	os.Exit(code)
}

func run(ctx context.Context) (int, error) {
	root, err := gitOut(ctx, "", "rev-parse", "--show-toplevel")
	if err != nil {
		return 2, fmt.Errorf("not in a git repository: %v", err)
	}
	root = strings.TrimSpace(root)
	patches, err := filepath.Glob(filepath.Join(root, "sim", "mutants", "*.patch"))
	if err != nil {
		return 2, err
	}
	sort.Strings(patches)
	patches = selectPatches(patches, *flagOnly)
	if len(patches) == 0 {
		return 2, errors.New("no patches in sim/mutants (or none matches -only)")
	}
	files, err := trackedFiles(ctx, root)
	if err != nil {
		return 2, err
	}
	fmt.Printf("mutants: %d patches, %d seeds each from seed %d\n", len(patches), *flagSeeds, *flagFirst)
	start := time.Now()
	var results []result
	for _, p := range patches {
		if ctx.Err() != nil {
			return 130, ctx.Err()
		}
		r := runMutant(ctx, root, files, p)
		results = append(results, r)
		status := "caught"
		switch {
		case r.err != nil:
			status = "ERROR: " + r.err.Error()
		case !checkerOn("sim"):
			status = "sim not run"
		case !r.caught:
			status = "NOT CAUGHT"
		default:
			status = fmt.Sprintf("caught at seed %d by %s", r.seed, r.invariant)
		}
		fmt.Printf("  %-32s %s; explorer %s, rapid %s, fuzz %s (%s)\n", r.name, status,
			r.explorer.cell(), r.rapid.cell(), r.fuzz.cell(), r.elapsed.Round(100*time.Millisecond))
	}
	if ctx.Err() != nil {
		return 130, ctx.Err()
	}
	fmt.Println()
	printTable(os.Stdout, results)
	fmt.Printf("\nwall time %s\n", time.Since(start).Round(time.Second))
	code := 0
	for _, r := range results {
		switch {
		case r.err != nil:
			fmt.Printf("FAIL: mutant %s could not be judged: %v\n", r.name, r.err)
			code = 1
		case !checkerOn("sim"):
		case !r.caught:
			fmt.Printf("FAIL: mutant %s survived %d seeds\n", r.name, *flagSeeds)
			code = 1
		}
	}
	fmt.Println(caughtLine(results))
	if code == 0 && checkerOn("sim") {
		fmt.Printf("all %d mutants caught\n", len(results))
	}
	return code, nil
}

// caughtLine is the run's tally, caught/total per checker that ran: the
// simulator must catch every mutant; the others are reported.
func caughtLine(results []result) string {
	var parts []string
	if checkerOn("sim") {
		n := 0
		for _, r := range results {
			if r.caught {
				n++
			}
		}
		parts = append(parts, fmt.Sprintf("simulator %d/%d", n, len(results)))
	}
	for _, c := range []struct {
		name string
		of   func(result) verdict
	}{
		{"explorer", func(r result) verdict { return r.explorer }},
		{"rapid", func(r result) verdict { return r.rapid }},
		{"fuzz", func(r result) verdict { return r.fuzz }},
	} {
		if !checkerOn(c.name) {
			continue
		}
		n := 0
		for _, r := range results {
			if v := c.of(r); v.ran && v.caught {
				n++
			}
		}
		parts = append(parts, fmt.Sprintf("%s %d/%d", c.name, n, len(results)))
	}
	return "caught: " + strings.Join(parts, ", ")
}

func selectPatches(patches []string, only string) []string {
	if only == "" {
		return patches
	}
	var out []string
	for _, p := range patches {
		name := strings.TrimSuffix(filepath.Base(p), ".patch")
		for _, want := range strings.Split(only, ",") {
			if want = strings.TrimSpace(want); want != "" && (name == want || strings.HasPrefix(name, want) || strings.TrimLeft(name, "0123456789-") == want) {
				out = append(out, p)
				break
			}
		}
	}
	return out
}

// runMutant copies the repository, applies one patch, and runs the simulator.
func runMutant(ctx context.Context, root string, files []string, patch string) (r result) {
	r.name = strings.TrimSuffix(filepath.Base(patch), ".patch")
	t0 := time.Now()
	defer func() { r.elapsed = time.Since(t0) }()
	dir, err := os.MkdirTemp("", "tether-mutant-")
	if err != nil {
		r.err = err
		return r
	}
	defer os.RemoveAll(dir)
	if err := copyFiles(root, dir, files); err != nil {
		r.err = fmt.Errorf("copying the repository: %v", err)
		return r
	}
	// The copy is not a git repository: git apply patches relative to it.
	// The ceiling keeps git from finding a repository above the temp dir.
	apply := exec.CommandContext(ctx, "git", "apply", "--whitespace=nowarn", patch)
	apply.Dir = dir
	apply.Env = append(os.Environ(), "GIT_CEILING_DIRECTORIES="+filepath.Dir(dir))
	if out, err := apply.CombinedOutput(); err != nil {
		r.err = fmt.Errorf("patch does not apply: %v: %s", err, strings.TrimSpace(string(out)))
		return r
	}
	if checkerOn("explorer") {
		r.explorer = runExplorer(ctx, dir)
	}
	if checkerOn("rapid") {
		r.rapid = runTests(ctx, dir, "./spec", "^TestRapid")
	}
	if checkerOn("fuzz") {
		r.fuzz = runTests(ctx, dir, "./fuzz", ".")
	}
	if !checkerOn("sim") {
		return r
	}
	args := []string{"test", "./sim", "-run", "TestSim$", "-count=1", "-timeout=60m", "-v",
		"-sim.seeds=" + strconv.Itoa(*flagSeeds), "-sim.first=" + strconv.FormatUint(*flagFirst, 10), "-sim.stopfirst", "-sim.traces=false"}
	out, runErr := goTest(ctx, dir, args...)
	if ctx.Err() != nil {
		r.err = ctx.Err()
		return r
	}
	if m := failRe.FindStringSubmatch(out); m != nil {
		seed, err := strconv.ParseUint(m[1], 0, 64)
		if err != nil {
			r.err = fmt.Errorf("unparsable seed %q", m[1])
			return r
		}
		r.caught, r.seed, r.invariant = true, seed, strings.TrimSpace(m[2])
		return r
	}
	var exit *exec.ExitError
	switch {
	case runErr == nil:
		// Every seed passed: the bug survived.
	case errors.As(runErr, &exit):
		r.err = fmt.Errorf("go test failed without a seed failure (does the mutant build?):\n%s", tail(out, 30))
	default:
		r.err = runErr
	}
	return r
}

// goTest runs the go command in dir (a whole process group, so that an
// interrupt also ends the test binary it runs) and returns its output.
func goTest(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var out bytes.Buffer
	if *flagV {
		cmd.Stdout = io.MultiWriter(&out, os.Stdout)
	} else {
		cmd.Stdout = &out
	}
	cmd.Stderr = cmd.Stdout
	err := cmd.Run()
	return out.String(), err
}

// exploreRe matches the explorer's violation line; exploreSummaryRe its
// summary line, printed whether or not it found one.
var (
	exploreRe        = regexp.MustCompile(`invariant (\S+) violated:`)
	exploreSummaryRe = regexp.MustCompile(`explore \S+: \d+ states`)
)

// runExplorer explores the default scope of the mutant; what the default
// scope does not reach is tried in the faults scope (enrollment, worker
// crashes, log lines, revocation, token replay), the identity scope (a
// worker restarted keeping its identity), the slow scope (a message
// in flight while a timer fires), the multiset network, the timers scope
// (short sweep, heartbeat, unmatched and credential timers), the tags
// scope (required tags), the chain scope (a → b → c), the scaler scope
// (a scaler-managed worker) and the archive scope (late reports after
// archival, SPEC §7a).
func runExplorer(ctx context.Context, dir string) verdict {
	for _, scope := range []string{"default", "faults", "identity", "slow", "multiset", "timers", "tags", "chain", "scaler", "archive", "locks"} {
		out, err := goTest(ctx, dir, "test", "./spec", "-run", "^TestExplore$", "-explore.scope="+scope, "-count=1", "-timeout=30m", "-v")
		if ctx.Err() != nil {
			return verdict{ran: true, err: ctx.Err()}
		}
		if m := exploreRe.FindStringSubmatch(out); m != nil {
			return verdict{ran: true, caught: true, by: m[1] + " (" + scope + ")"}
		}
		if !exploreSummaryRe.MatchString(out) {
			return verdict{ran: true, err: fmt.Errorf("the explorer did not run (does the mutant build?): %v\n%s", err, tail(out, 20))}
		}
	}
	return verdict{ran: true}
}

// failedTestRe matches go test's line for a failed test.
var failedTestRe = regexp.MustCompile(`(?m)^\s*--- FAIL: (\S+)`)

// runTests runs pkg's tests matching run; a failed test is a catch.
func runTests(ctx context.Context, dir, pkg, run string) verdict {
	out, err := goTest(ctx, dir, "test", pkg, "-run", run, "-count=1", "-timeout=30m", "-v")
	if ctx.Err() != nil {
		return verdict{ran: true, err: ctx.Err()}
	}
	if m := failedTestRe.FindStringSubmatch(out); m != nil {
		name, _, _ := strings.Cut(m[1], "/")
		return verdict{ran: true, caught: true, by: name}
	}
	if err != nil {
		return verdict{ran: true, err: fmt.Errorf("%s failed without a failed test (does the mutant build?): %v\n%s", pkg, err, tail(out, 20))}
	}
	return verdict{ran: true}
}

func printTable(w io.Writer, results []result) {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprintln(tw, "mutant\t| sim\t| seeds to first failure\t| sim invariant\t| explorer (scope)\t| rapid\t| fuzz corpora")
	fmt.Fprintln(tw, "------\t| ---\t| ----------------------\t| -------------\t| ----------------\t| -----\t| ------------")
	for _, r := range results {
		rest := fmt.Sprintf("%s\t| %s\t| %s", r.explorer.cell(), r.rapid.cell(), r.fuzz.cell())
		switch {
		case r.err != nil:
			fmt.Fprintf(tw, "%s\t| ERROR\t| -\t| %s\t| %s\n", r.name, firstLine(r.err.Error()), rest)
		case !checkerOn("sim"):
			fmt.Fprintf(tw, "%s\t| -\t| -\t| -\t| %s\n", r.name, rest)
		case !r.caught:
			fmt.Fprintf(tw, "%s\t| NO\t| > %d\t| -\t| %s\n", r.name, *flagSeeds, rest)
		default:
			fmt.Fprintf(tw, "%s\t| yes\t| %d\t| %s\t| %s\n", r.name, r.seed-*flagFirst+1, r.invariant, rest)
		}
	}
	tw.Flush()
	for _, r := range results {
		for _, v := range []struct {
			name string
			v    verdict
		}{{"explorer", r.explorer}, {"rapid", r.rapid}, {"fuzz", r.fuzz}} {
			if v.v.err != nil {
				fmt.Fprintf(w, "%s: %s could not judge it: %s\n", r.name, v.name, firstLine(v.v.err.Error()))
			}
		}
	}
}

// trackedFiles lists the repository's tracked files that exist in the work
// tree (a tracked file deleted there is left out, as the work tree has it).
func trackedFiles(ctx context.Context, root string) ([]string, error) {
	out, err := gitOut(ctx, root, "ls-files", "-z")
	if err != nil {
		return nil, err
	}
	var files []string
	for _, f := range strings.Split(out, "\x00") {
		if f == "" {
			continue
		}
		if _, err := os.Lstat(filepath.Join(root, f)); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		files = append(files, f)
	}
	return files, nil
}

// copyFiles copies the work tree's version of each file (uncommitted edits
// included) from root into dir, keeping modes and symlinks.
func copyFiles(root, dir string, files []string) error {
	for _, f := range files {
		src, dst := filepath.Join(root, f), filepath.Join(dir, f)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		fi, err := os.Lstat(src)
		if err != nil {
			return err
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(src)
			if err != nil {
				return err
			}
			if err := os.Symlink(target, dst); err != nil {
				return err
			}
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(src)
			if err != nil {
				return err
			}
			if err := os.WriteFile(dst, b, fi.Mode().Perm()); err != nil {
				return err
			}
		}
	}
	return nil
}

func gitOut(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
