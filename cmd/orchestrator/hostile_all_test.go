package main

// The hostile clients of the hostile_*_test.go files, all at once against
// one orchestrator (SPEC §12): connections that never say Hello, oversized
// Hellos, unauthenticated PUTs that stall mid-body, submissions over every
// limit, a flood of frames and frames that break the protocol — while a
// genuine worker runs a 1,000-step workflow and an operator reads the API.

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-run/tether/adapters/orchestrator"
)

// Sizes of TestHostileAllAtOnce's attack and workflow.
const (
	allHelloTimeout   = 2 * time.Second
	allUnauthPerAddr  = 16 // per-address cap of connections without a Hello
	allHelloless      = 48 // three times the per-address cap
	allStalledPuts    = 128
	allWriteSteps     = 20  // write-bearing steps of the genuine run
	allNoopSteps      = 980 // with the write steps: 1,000, the per-run limit
	allOperatorCalls  = 40  // operator calls per measurement
	allOperatorPause  = 25 * time.Millisecond
	allLatencyFactorX = 3 // an operator call under attack: at most this × its time without
	allAttackMin      = 20 * time.Second
)

// TestHostileAllAtOnce runs findings 1, 2, 4, 6 and 10 of the hostile-input
// review at once against one `orchestrator serve` (built without -race, so
// that what is measured is the product): attackHelloless (from 127.0.0.3),
// attackStalledPuts (127.0.0.4), attackBigSubmit (127.0.0.5), and
// attackBigHello, attackFlood and attackBadFrames (127.0.0.2), while a genuine worker (127.0.0.1) runs
// a 1,000-step workflow, 20 of its steps write-bearing. It checks:
//   - every attack was refused as its own test requires (the same checks);
//   - the workflow finishes with success, and no write-bearing step ran
//     twice (each appends a line to a file of its own: exactly one line);
//   - an operator call (GET /api/runs) under the attack answers within 3×
//     its time without the attack: the median of 40 calls while the same
//     workflow runs, the attack not yet, against the median of the calls
//     made every 25 ms all through the attack (its first bursts included).
func TestHostileAllAtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binaries")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	// Both binaries without -race: what is measured is the product, and a
	// race-built worker re-executing itself as each step's shim spends
	// about a second of CPU per step on this test's 1,000.
	orchBin, workerBin := buildNoRace(t, ctx, "orchestrator"), buildNoRace(t, ctx, "worker")
	dir := t.TempDir()
	dataDir := filepath.Join(dir, "data")
	r := serveRig(t, ctx, orchBin, workerBin, dataDir, "--log-level", "info",
		"--max-unauth-conns-per-addr", fmt.Sprint(allUnauthPerAddr), "--hello-timeout", allHelloTimeout.String())
	addr := r.addr
	token := r.api.enroll
	bigHelloToken, floodToken, badFramesToken := token("stolen"), token("flooder"), token("bad-frames")

	// The genuine worker carries a tag no attacker has, and every genuine
	// step requires it: the attackers that enroll never get its work.
	r.worker("genuine", "--tags", "genuine", "--slots", "8")
	marks := filepath.Join(dir, "marks")
	if err := os.Mkdir(marks, 0o700); err != nil {
		t.Fatal(err)
	}
	items := func(n int) string {
		s := make([]string, n)
		for i := range s {
			s[i] = fmt.Sprint(i)
		}
		return strings.Join(s, ", ")
	}
	run := r.submit(fmt.Sprintf("name: genuine\nsteps:\n"+
		"  - name: w\n    writes: true\n    tags: [genuine]\n    forEach: [%s]\n    run: echo \"$TETHER_ITEM\" >> %s/w-$TETHER_ITEM\n"+
		"  - name: n\n    tags: [genuine]\n    forEach: [%s]\n    run: sleep 0.05\n",
		items(allWriteSteps), marks, items(allNoopSteps)))

	// operatorMedian calls GET /api/runs at least allOperatorCalls times,
	// and on until until() holds, and returns the median answer time.
	operatorMedian := func(what string, until func() bool) time.Duration {
		var took []time.Duration
		for len(took) < allOperatorCalls || !until() {
			t0 := time.Now()
			r.api.runs()
			took = append(took, time.Since(t0))
			time.Sleep(allOperatorPause)
		}
		sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
		t.Logf("operator GET /api/runs %s: %d calls, median %s, 90th percentile %s, max %s", what, len(took),
			took[len(took)/2], took[len(took)*9/10], took[len(took)-1])
		return took[len(took)/2]
	}
	running := func() bool { return r.api.run(run).Run.FinishedAt.IsZero() }

	baseline := operatorMedian("without the attack", func() bool { return true })
	if !running() {
		t.Fatal("the genuine run finished before the attack began; the test must attack while it runs")
	}

	actx, stopAttack := context.WithCancel(ctx)
	defer stopAttack()
	var (
		wg        sync.WaitGroup
		helloless attackHellolessResult
		bigHello  attackBigHelloResult
		stalled   attackStalledPutsResult
		submits   attackBigSubmitResult
		flood     attackFloodResult
		badFrames attackBadFramesResult
	)
	for _, attack := range []func(){
		func() { helloless = attackHelloless(actx, t, addr, allHelloless) },
		func() { bigHello = attackBigHello(actx, t, addr, bigHelloToken) },
		func() { stalled = attackStalledPuts(actx, t, addr, allStalledPuts, 60<<10, 16<<10) },
		func() { submits = attackBigSubmit(actx, t, addr, r.api.token) },
		func() { flood = attackFlood(actx, t, addr, floodToken) },
		func() { badFrames = attackBadFrames(actx, t, addr, badFramesToken) },
	} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			attack()
		}()
	}
	attackStart := time.Now()
	time.Sleep(100 * time.Millisecond) // every attack is under way
	stillRunning := running()

	// The operator calls all through the attack, which goes on until the
	// workflow is done, and for at least allAttackMin: throttled as they
	// are, each attack goes round all its cases a few times in that.
	var det orchestrator.APIRunDetail
	underAttack := operatorMedian("under the attack", func() bool {
		if det.Run.FinishedAt.IsZero() {
			det = r.api.run(run)
		}
		return !det.Run.FinishedAt.IsZero() && time.Since(attackStart) >= allAttackMin
	})
	stopAttack()
	wg.Wait()
	t.Logf("attack lasted %s; the run ended %s after %s", time.Since(attackStart).Round(time.Millisecond), det.Status,
		det.Run.FinishedAt.Sub(det.Run.SubmittedAt).Round(time.Millisecond))

	if !stillRunning {
		t.Errorf("the genuine run finished before the attack was under way; the test must attack while it runs")
	}
	if det.Status != "success" {
		t.Errorf("the genuine run ended %s, want success", det.Status)
	}
	if len(det.Steps) != allWriteSteps+allNoopSteps {
		t.Errorf("the genuine run has %d steps, want %d", len(det.Steps), allWriteSteps+allNoopSteps)
	}
	for i := range allWriteSteps {
		b, err := os.ReadFile(filepath.Join(marks, fmt.Sprintf("w-%d", i)))
		if n := strings.Count(string(b), "\n"); err != nil || n != 1 {
			t.Errorf("write-bearing step w[%d] ran %d times (%v), want exactly once", i, n, err)
		}
	}
	t.Logf("operator median: %s without the attack, %s under it (bound %d×)", baseline, underAttack, allLatencyFactorX)
	if underAttack > allLatencyFactorX*baseline {
		t.Errorf("an operator call under the attack took %s (median), over %d× its %s without", underAttack, allLatencyFactorX, baseline)
	}

	t.Logf("helloless: %+v", helloless)
	checkHelloless(t, helloless, allHelloTimeout, allUnauthPerAddr)
	t.Logf("big hello: %d rounds", bigHello.Rounds)
	checkBigHello(t, bigHello)
	t.Logf("stalled PUTs: %s", stalled)
	if stalled.Sent < allStalledPuts || stalled.Answered[http.StatusUnauthorized] == 0 || len(stalled.Answered) != 1 || stalled.Failed != 0 {
		t.Errorf("stalled PUTs: %s; want at least %d sent, every answer a 401, none failed without an answer", stalled, allStalledPuts)
	}
	t.Logf("submissions: refusals %v, largest error body %d bytes, slowest answer %s", submits.Refused, submits.MaxBody, submits.MaxAnswer)
	for _, w := range submits.Wrong {
		t.Errorf("a hostile submission answered wrongly: %s", w)
	}
	for _, a := range bigSubmitAttacks() {
		if submits.Refused[a.kind] == 0 {
			t.Errorf("hostile submission %q was never refused", a.kind)
		}
	}
	if submits.MaxBody > maxRefusalBytes {
		t.Errorf("an error body of %d bytes: errors must be bounded (%d)", submits.MaxBody, maxRefusalBytes)
	}
	t.Logf("flood: %+v", flood)
	checkFlood(t, flood)
	t.Logf("bad frames: %d rounds", badFrames.Rounds)
	checkBadFrames(t, badFrames)
}
