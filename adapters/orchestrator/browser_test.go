package orchestrator_test

// The status page in a real headless browser (SPEC §18): Debian's chromium
// (make deps installs it; TETHER_CHROMIUM names another), driven with
// chromedp against a real Driver and a real worker on loopback. It logs in,
// watches a run's steps turn green live without a reload, cancels a run and
// approves a held step from the page, and checks that hostile names show
// as text. A PNG of each page is saved under $TETHER_SCREENSHOTS (or the
// test's temporary directory), and the test says where.
//
// It is skipped only when TETHER_SKIP_BROWSER=1 says so; without a browser
// it fails, naming make deps.

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tether-run/tether/adapters/orchestrator"
)

// browserPath returns the browser to drive, or skips the test when
// TETHER_SKIP_BROWSER=1, or fails when there is none.
func browserPath(t *testing.T) string {
	t.Helper()
	if os.Getenv("TETHER_SKIP_BROWSER") == "1" {
		t.Skip("TETHER_SKIP_BROWSER=1: the browser test is skipped")
	}
	p := os.Getenv("TETHER_CHROMIUM")
	if p == "" {
		p = "/usr/bin/chromium"
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("no browser at %s (%v): run `make deps` (it installs Debian's chromium), or set TETHER_CHROMIUM to a Chromium binary, or TETHER_SKIP_BROWSER=1 to skip this test", p, err)
	}
	return p
}

// newBrowser starts a headless browser with a fresh profile.
func newBrowser(t *testing.T, ctx context.Context, path string) context.Context {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("no-default-browser-check", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	}
	actx, cancel := chromedp.NewExecAllocator(ctx, opts...)
	t.Cleanup(cancel)
	bctx, cancel2 := chromedp.NewContext(actx, chromedp.WithErrorf(t.Logf))
	t.Cleanup(cancel2)
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("starting %s: %v", path, err)
	}
	return bctx
}

func TestWebBrowser(t *testing.T) {
	path := browserPath(t)
	r := startAPI(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	shots := os.Getenv("TETHER_SCREENSHOTS")
	if shots == "" {
		shots = t.TempDir()
	} else if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshots of each page: %s", shots)

	// Three runs before any worker: their steps wait in the queue.
	submit := func(src string) string {
		var sub orchestrator.APISubmitted
		r.expect("POST", "/runs", []byte(src), http.StatusCreated, &sub)
		return sub.Run
	}
	live := submit("name: diamond\nsteps:\n  - name: fetch\n    run: echo fetched\n" +
		"  - name: build\n    depends_on: [fetch]\n    run: echo built\n" +
		"  - name: test\n    depends_on: [fetch]\n    run: echo tested\n" +
		"  - name: ship\n    depends_on: [build, test]\n    run: echo shipped\n")
	doomed := submit("name: to-cancel\nsteps:\n  - name: wait\n    hold: true\n    run: echo never\n")
	runName := `<script>window.pwned=1</script> "dq" 'sq' <img src=x onerror=window.pwned=2>`
	stepName := `<script>window.pwned=3;"it's"&amp;`
	hostile := submit(fmt.Sprintf("name: '%s'\nsteps:\n  - name: '%s'\n    hold: true\n    run: echo approved\n  - name: after\n    depends_on: ['%s']\n    run: echo after\n",
		strings.ReplaceAll(runName, "'", "''"), strings.ReplaceAll(stepName, "'", "''"), strings.ReplaceAll(stepName, "'", "''")))

	b := newBrowser(t, ctx, path)
	base := r.d.DataURL()
	shoot := func(name string) {
		t.Helper()
		png, err := chromedp.Run(b, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		if err := os.WriteFile(filepath.Join(shots, name+".png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	failed := func(what string, err error) {
		t.Helper()
		loc, _ := chromedp.Run(b, chromedp.Location())
		body, _ := chromedp.Run(b, chromedp.Text(chromedp.CSS("body")))
		t.Fatalf("%s: %v (at %s: %.600s)", what, err, loc, body)
	}
	run := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(b, actions...); err != nil {
			failed(what, err)
		}
	}
	// poll waits, bounded by ctx, until expr is true on the page; the
	// page may be navigating meanwhile (a form's answer is a redirect).
	poll := func(what, expr string) {
		t.Helper()
		for {
			ok, err := chromedp.Run(b, chromedp.Evaluate[bool](expr))
			if err == nil && ok {
				return
			}
			select {
			case <-ctx.Done():
				if err == nil {
					err = ctx.Err()
				}
				failed(what, err)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	evalString := func(expr string) string {
		t.Helper()
		v, err := chromedp.Run(b, chromedp.Evaluate[string](expr))
		if err != nil {
			failed("evaluate "+expr, err)
		}
		return v
	}
	evalBool := func(expr string) bool {
		t.Helper()
		v, err := chromedp.Run(b, chromedp.Evaluate[bool](expr))
		if err != nil {
			failed("evaluate "+expr, err)
		}
		return v
	}

	// A page without a session goes to the login form; the token is typed
	// into it, never put in a URL.
	run("open the run page", chromedp.Navigate(base+"/runs/"+live), chromedp.WaitVisible(chromedp.ID("token")))
	shoot("login")
	run("log in", chromedp.SendKeys(chromedp.ID("token"), adminToken), chromedp.Click(chromedp.ID("login-submit")), chromedp.WaitVisible(chromedp.ID("steps")))
	loc, err := chromedp.Run(b, chromedp.Location())
	if err != nil {
		t.Fatal(err)
	}
	if loc != base+"/runs/"+live || strings.Contains(loc, adminToken) {
		t.Fatalf("after the login the page is %s, want %s", loc, base+"/runs/"+live)
	}

	// The steps turn green live: a mark set on this document must survive.
	if evalBool(`window.tetherMark = "no reload"; document.querySelectorAll('#steps tr[data-state="success"]').length !== 0`) {
		t.Fatalf("steps succeeded before any worker")
	}
	poll("the live stream connects", `document.getElementById("live").classList.contains("on")`)
	f := startWorkers(t, ctx, r.d, "browser-worker")
	defer f.stop(t)
	poll("every step green, live", `document.querySelectorAll('#steps tr[data-state="success"]').length === 4 && document.querySelectorAll('#dag .node.s-success').length === 4`)
	poll("the run's status, live", `document.getElementById("run-status").textContent === "success"`)
	if mark := evalString(`window.tetherMark || ""`); mark != "no reload" {
		t.Fatalf("the page was reloaded (mark %q): the steps did not change live", mark)
	}
	shoot("run")

	// Cancel a run from its page.
	run("open the run to cancel", chromedp.Navigate(base+"/runs/"+doomed), chromedp.WaitVisible(chromedp.ID("cancel-run")))
	run("cancel it", chromedp.SendKeys(chromedp.CSS(`#cancel-form input[name="reason"]`), "cancelled from the page"), chromedp.Click(chromedp.ID("cancel-run")))
	poll("the run cancelled", `document.getElementById("run-status") !== null && document.getElementById("run-status").textContent === "cancelled"`)
	r.waitRun(doomed, "cancelled", func(d orchestrator.APIRunDetail) bool {
		return d.Status == "cancelled" && d.Run.CancelReason == "cancelled from the page"
	})

	// The hostile names show literally, and none of their scripts ran.
	run("open the hostile run", chromedp.Navigate(base+"/runs/"+hostile), chromedp.WaitVisible(chromedp.ID("steps")))
	shownRun := evalString(`document.querySelector("h1 .name").textContent`)
	shownStep := evalString(`document.querySelector("#steps .step-name").textContent`)
	pwned := evalBool(`window.pwned !== undefined`)
	if shownRun != runName || shownStep != stepName || pwned {
		t.Fatalf("hostile names: run shown as %q (want %q), step as %q (want %q), a script ran: %v", shownRun, runName, shownStep, stepName, pwned)
	}
	shoot("run-held")
	// Approve its held step from the page; the run then finishes live.
	run("approve the held step", chromedp.Click(chromedp.CSS(`#steps .gate:not([hidden]) button.approve`)))
	poll("the approved run succeeds", `document.getElementById("run-status") !== null && document.getElementById("run-status").textContent === "success"`)
	if evalBool(`window.pwned !== undefined`) {
		t.Fatal("a hostile name's script ran")
	}
	shoot("run-hostile")

	for _, p := range []struct{ name, path, ready string }{
		{"runs", "/", "#runs"}, {"events", "/events", "#server-events"}, {"workers", "/workers", "#workers"}, {"tokens", "/tokens", "#tokens"},
	} {
		run("open "+p.path, chromedp.Navigate(base+p.path), chromedp.WaitVisible(chromedp.CSS(p.ready)))
		if evalBool(`window.pwned !== undefined`) {
			t.Fatalf("a hostile name's script ran on %s", p.path)
		}
		shoot(p.name)
	}
	run("the runs page", chromedp.Navigate(base+"/"))
	html, err := chromedp.Run(b, chromedp.OuterHTML(chromedp.CSS("html")))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{live, doomed, hostile} {
		if !strings.Contains(html, `href="/runs/`+id+`"`) {
			t.Errorf("the runs page does not list %s", id)
		}
	}
}
