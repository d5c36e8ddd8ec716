package orchestrator_test

// The status page's sessions, CSRF and origin checks, redirects and
// escaping, over HTTP without a browser (SPEC §18). The browser test is
// browser_test.go.

import (
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/tether-run/tether/adapters/orchestrator"
)

// webClient is a browser-like client of the status page: a cookie jar,
// redirects not followed.
type webClient struct {
	t    *testing.T
	base string
	c    *http.Client
}

func newWebClient(t *testing.T, r *apiRig) *webClient {
	jar, _ := cookiejar.New(nil)
	return &webClient{t: t, base: r.d.DataURL(), c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

type webAnswer struct {
	code int
	body string
	h    http.Header
}

func (wc *webClient) do(method, path string, form url.Values, hdr map[string]string) webAnswer {
	wc.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, wc.base+path, body)
	if err != nil {
		wc.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := wc.c.Do(req)
	if err != nil {
		wc.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return webAnswer{code: resp.StatusCode, body: string(b), h: resp.Header}
}

func (wc *webClient) login(token string) webAnswer {
	wc.t.Helper()
	return wc.do("POST", "/login", url.Values{"token": {token}}, nil)
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf reads the CSRF token from a page.
func (wc *webClient) csrf(path string) string {
	wc.t.Helper()
	a := wc.do("GET", path, nil, nil)
	m := csrfField.FindStringSubmatch(a.body)
	if a.code != http.StatusOK || m == nil {
		wc.t.Fatalf("GET %s: HTTP %d, no CSRF field: %.300s", path, a.code, a.body)
	}
	return m[1]
}

func TestWebLoginRedirectsAndCookie(t *testing.T) {
	r := startAPI(t)
	wc := newWebClient(t, r)
	for _, p := range []string{"/", "/runs/run-1", "/events", "/workers", "/tokens"} {
		a := wc.do("GET", p, nil, nil)
		if a.code != http.StatusSeeOther || !strings.HasPrefix(a.h.Get("Location"), "/login?next=") {
			t.Errorf("GET %s without a session: HTTP %d Location %q, want 303 to /login", p, a.code, a.h.Get("Location"))
		}
	}
	if a := wc.do("GET", "/login", nil, nil); a.code != http.StatusOK || !strings.Contains(a.body, `type="password"`) {
		t.Fatalf("GET /login: HTTP %d: %.300s", a.code, a.body)
	}
	// A wrong token: no session.
	if a := wc.login("wrong"); a.code != http.StatusUnauthorized || a.h.Get("Set-Cookie") != "" {
		t.Errorf("wrong token: HTTP %d, Set-Cookie %q; want 401 and no cookie", a.code, a.h.Get("Set-Cookie"))
	}
	// A login posted from another site is refused even with the right token.
	for _, h := range []map[string]string{{"Origin": "https://evil.example"}, {"Sec-Fetch-Site": "cross-site"}} {
		if a := wc.do("POST", "/login", url.Values{"token": {adminToken}}, h); a.code != http.StatusForbidden || a.h.Get("Set-Cookie") != "" {
			t.Errorf("login with %v: HTTP %d, Set-Cookie %q; want 403 and no cookie", h, a.code, a.h.Get("Set-Cookie"))
		}
	}
	if n := r.d.WebSessions(); n != 0 {
		t.Fatalf("%d sessions after refused logins", n)
	}
	// The next page must stay on this site.
	a := wc.do("POST", "/login", url.Values{"token": {adminToken}, "next": {"//evil.example/x"}}, nil)
	if a.code != http.StatusSeeOther || a.h.Get("Location") != "/" {
		t.Errorf("login with next=//evil.example: HTTP %d Location %q, want 303 to /", a.code, a.h.Get("Location"))
	}
	cookies := (&http.Response{Header: a.h}).Cookies()
	if len(cookies) != 1 {
		t.Fatalf("login set %d cookies, want 1: %v", len(cookies), a.h["Set-Cookie"])
	}
	c := cookies[0]
	if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Secure || c.MaxAge <= 0 || c.Path != "/" || len(c.Value) < 40 {
		t.Errorf("session cookie %+v: want HttpOnly, SameSite=Strict, not Secure without TLS, a Max-Age, Path=/, a long random id", c)
	}
	if strings.Contains(c.Value, adminToken) {
		t.Errorf("the session cookie holds the admin token")
	}
	for _, p := range []string{"/", "/events", "/workers", "/tokens"} {
		a := wc.do("GET", p, nil, nil)
		if a.code != http.StatusOK || !strings.Contains(a.h.Get("Content-Type"), "text/html") {
			t.Errorf("GET %s with a session: HTTP %d %q", p, a.code, a.h.Get("Content-Type"))
		}
		if strings.Contains(a.body, adminToken) {
			t.Errorf("GET %s shows the admin token", p)
		}
		if a.h.Get("Content-Security-Policy") == "" || a.h.Get("X-Frame-Options") != "DENY" {
			t.Errorf("GET %s: no CSP or frame refusal: %v", p, a.h)
		}
	}
	if a := wc.do("GET", "/runs/run-404", nil, nil); a.code != http.StatusNotFound || !strings.Contains(a.body, "unknown run") {
		t.Errorf("GET /runs/run-404: HTTP %d: %.300s", a.code, a.body)
	}
	// Logging out ends the session server-side: its cookie no longer works.
	tok := wc.csrf("/")
	if a := wc.do("POST", "/logout", url.Values{"csrf": {tok}}, nil); a.code != http.StatusSeeOther {
		t.Fatalf("logout: HTTP %d: %.300s", a.code, a.body)
	}
	if n := r.d.WebSessions(); n != 0 {
		t.Errorf("%d sessions after the logout", n)
	}
	replay := &http.Request{Header: http.Header{}}
	replay.AddCookie(c)
	wc2 := newWebClient(t, r)
	if a := wc2.do("GET", "/", nil, map[string]string{"Cookie": replay.Header.Get("Cookie")}); a.code != http.StatusSeeOther {
		t.Errorf("the logged-out cookie still opens the page: HTTP %d", a.code)
	}
}

func TestWebActionsNeedCSRF(t *testing.T) {
	r := startAPI(t)
	var sub orchestrator.APISubmitted
	r.expect("POST", "/runs", []byte("name: slow\nsteps:\n  - name: a\n    hold: true\n    run: echo a\n  - name: b\n    depends_on: [a]\n    run: echo b\n"), http.StatusCreated, &sub)
	wc := newWebClient(t, r)
	if a := wc.login(adminToken); a.code != http.StatusSeeOther {
		t.Fatalf("login: HTTP %d", a.code)
	}
	tok := wc.csrf("/runs/" + sub.Run)
	status := func() string {
		var det orchestrator.APIRunDetail
		r.expect("GET", "/runs/"+sub.Run, nil, http.StatusOK, &det)
		return det.Status
	}
	refused := []struct {
		what string
		form url.Values
		hdr  map[string]string
	}{
		{"no CSRF token", url.Values{"reason": {"x"}}, nil},
		{"a wrong CSRF token", url.Values{"csrf": {tok + "x"}}, nil},
		{"an empty CSRF token", url.Values{"csrf": {""}}, nil},
		{"another site's Origin", url.Values{"csrf": {tok}}, map[string]string{"Origin": "http://evil.example"}},
		{"Sec-Fetch-Site: cross-site", url.Values{"csrf": {tok}}, map[string]string{"Sec-Fetch-Site": "cross-site"}},
	}
	for _, c := range refused {
		for _, p := range []string{"/runs/" + sub.Run + "/cancel", "/steps/approve", "/steps/reject"} {
			form := url.Values{"step": {sub.Run + "/a"}}
			for k, v := range c.form {
				form[k] = v
			}
			if a := wc.do("POST", p, form, c.hdr); a.code != http.StatusForbidden {
				t.Errorf("POST %s with %s: HTTP %d, want 403", p, c.what, a.code)
			}
		}
	}
	// Without a session, the right token of another session does nothing.
	anon := newWebClient(t, r)
	if a := anon.do("POST", "/runs/"+sub.Run+"/cancel", url.Values{"csrf": {tok}}, nil); a.code != http.StatusUnauthorized {
		t.Errorf("cancel without a session: HTTP %d, want 401", a.code)
	}
	if st := status(); st != "running" {
		t.Fatalf("refused forms changed the run: %s", st)
	}
	// A same-origin form with the token: the held step is approved, then
	// the run cancelled; a second cancel is the API's refusal, shown.
	if a := wc.do("POST", "/steps/approve", url.Values{"csrf": {tok}, "step": {sub.Run + "/a"}}, map[string]string{"Origin": wc.base, "Sec-Fetch-Site": "same-origin"}); a.code != http.StatusSeeOther || a.h.Get("Location") != "/runs/"+sub.Run {
		t.Fatalf("approve: HTTP %d Location %q: %.300s", a.code, a.h.Get("Location"), a.body)
	}
	r.waitRun(sub.Run, "a approved", func(d orchestrator.APIRunDetail) bool { return d.Steps[0].State != "held" })
	if a := wc.do("POST", "/runs/"+sub.Run+"/cancel", url.Values{"csrf": {tok}, "reason": {"from the page"}}, nil); a.code != http.StatusSeeOther {
		t.Fatalf("cancel: HTTP %d: %.300s", a.code, a.body)
	}
	det := r.waitRun(sub.Run, "cancelled", func(d orchestrator.APIRunDetail) bool { return d.Status == "cancelled" })
	if det.Run.CancelReason != "from the page" {
		t.Errorf("cancel reason %q", det.Run.CancelReason)
	}
	if a := wc.do("POST", "/runs/"+sub.Run+"/cancel", url.Values{"csrf": {tok}}, nil); a.code != http.StatusConflict {
		t.Errorf("second cancel: HTTP %d, want the API's 409: %.300s", a.code, a.body)
	}
	// Reject, from a form, a held step of another run: it ends the run.
	var sub2 orchestrator.APISubmitted
	r.expect("POST", "/runs", []byte("name: gate\nsteps:\n  - name: g\n    hold: true\n    run: echo g\n"), http.StatusCreated, &sub2)
	if a := wc.do("POST", "/steps/reject", url.Values{"csrf": {tok}, "step": {sub2.Run + "/g"}}, nil); a.code != http.StatusSeeOther || a.h.Get("Location") != "/runs/"+sub2.Run {
		t.Fatalf("reject: HTTP %d Location %q: %.300s", a.code, a.h.Get("Location"), a.body)
	}
	r.waitRun(sub2.Run, "the rejected run ended", func(d orchestrator.APIRunDetail) bool {
		return d.Status == "cancelled" && d.Steps[0].State == "cancelled"
	})
	if a := wc.do("POST", "/steps/approve", url.Values{"csrf": {tok}, "step": {"nonsense"}}, nil); a.code != http.StatusBadRequest {
		t.Errorf("approve of a malformed step id: HTTP %d, want 400", a.code)
	}
	// A form body is bounded.
	if a := wc.do("POST", "/runs/"+sub.Run+"/cancel", url.Values{"csrf": {tok}, "reason": {strings.Repeat("x", 100<<10)}}, nil); a.code != http.StatusBadRequest {
		t.Errorf("a 100 KiB form: HTTP %d, want 400", a.code)
	}
	if a := wc.do("POST", "/logout", url.Values{"csrf": {tok}, "pad": {strings.Repeat("x", 100<<10)}}, nil); a.code != http.StatusBadRequest {
		t.Errorf("a 100 KiB logout form: HTTP %d, want 400", a.code)
	}
}

func TestWebSessionsBounded(t *testing.T) {
	r := startAPI(t)
	first := newWebClient(t, r)
	first.login(adminToken)
	var last *webClient
	for range orchestrator.MaxWebSessions + 5 {
		last = newWebClient(t, r)
		if a := last.login(adminToken); a.code != http.StatusSeeOther {
			t.Fatalf("login: HTTP %d", a.code)
		}
	}
	if n := r.d.WebSessions(); n != orchestrator.MaxWebSessions {
		t.Errorf("%d sessions held, want the cap %d", n, orchestrator.MaxWebSessions)
	}
	if a := first.do("GET", "/", nil, nil); a.code != http.StatusSeeOther {
		t.Errorf("the oldest session survived the cap: HTTP %d", a.code)
	}
	if a := last.do("GET", "/", nil, nil); a.code != http.StatusOK {
		t.Errorf("the newest session: HTTP %d", a.code)
	}
}

// Hostile names are shown as text: escaped in HTML, attributes and links.
func TestWebEscapesNames(t *testing.T) {
	r := startAPI(t)
	runName := `<script>window.pwned=1</script> "dq" 'sq' & <img src=x onerror=alert(1)>`
	stepName := `<script>"it's"&amp;`
	src := fmt.Sprintf("name: '%s'\nsteps:\n  - name: '%s'\n    hold: true\n    run: echo x\n", strings.ReplaceAll(runName, "'", "''"), strings.ReplaceAll(stepName, "'", "''"))
	var sub orchestrator.APISubmitted
	r.expect("POST", "/runs", []byte(src), http.StatusCreated, &sub)
	wc := newWebClient(t, r)
	wc.login(adminToken)
	for _, p := range []string{"/", "/runs/" + sub.Run, "/events"} {
		a := wc.do("GET", p, nil, nil)
		if a.code != http.StatusOK {
			t.Fatalf("GET %s: HTTP %d", p, a.code)
		}
		for _, raw := range []string{"<script>window", "<img src", `<script>"it`, `value="` + sub.Run + `/<`} {
			if strings.Contains(a.body, raw) {
				t.Errorf("GET %s holds %q unescaped", p, raw)
			}
		}
	}
	a := wc.do("GET", "/runs/"+sub.Run, nil, nil)
	for _, esc := range []string{"&lt;script&gt;window.pwned=1&lt;/script&gt; &#34;dq&#34; &#39;sq&#39; &amp; &lt;img", "&lt;script&gt;&#34;it&#39;s&#34;&amp;amp;"} {
		if !strings.Contains(a.body, esc) {
			t.Errorf("GET /runs/%s does not show %q", sub.Run, esc)
		}
	}
}

// The stream routes' check takes the admin token or a session's cookie.
func TestOperatorAuthorized(t *testing.T) {
	r := startAPI(t)
	wc := newWebClient(t, r)
	wc.login(adminToken)
	u, _ := url.Parse(wc.base)
	cookies := wc.c.Jar.Cookies(u)
	check := func(what string, set func(*http.Request), want bool) {
		req, _ := http.NewRequest("GET", wc.base+"/api/events", nil)
		set(req)
		if got := r.d.OperatorAuthorized(req); got != want {
			t.Errorf("%s: authorized %v, want %v", what, got, want)
		}
	}
	check("nothing", func(*http.Request) {}, false)
	check("the admin token", func(q *http.Request) { q.Header.Set("Authorization", "Bearer "+adminToken) }, true)
	check("a wrong token", func(q *http.Request) { q.Header.Set("Authorization", "Bearer x") }, false)
	check("the session cookie", func(q *http.Request) { q.AddCookie(cookies[0]) }, true)
	check("a forged cookie", func(q *http.Request) { q.AddCookie(&http.Cookie{Name: "tether_session", Value: "forged"}) }, false)
	check("a wrong token beside the cookie", func(q *http.Request) {
		q.AddCookie(cookies[0])
		q.Header.Set("Authorization", "Bearer x")
	}, false)
	// Over HTTP: the cookie opens the streams, and no other API route.
	for _, c := range []struct {
		method, path string
		want         int
	}{
		{"GET", "/api/events", http.StatusOK}, {"GET", "/api/runs/run-1/events", http.StatusNotFound},
		{"GET", "/api/runs", http.StatusUnauthorized}, {"POST", "/api/runs", http.StatusUnauthorized},
		{"POST", "/api/tokens", http.StatusUnauthorized}, {"POST", "/api/events", http.StatusUnauthorized},
	} {
		req, _ := http.NewRequestWithContext(r.ctx, c.method, wc.base+c.path, strings.NewReader(`{"name": "x"}`))
		resp, err := wc.c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		ct := resp.Header.Get("Content-Type")
		resp.Body.Close()
		if resp.StatusCode != c.want || (c.want == http.StatusOK && !strings.HasPrefix(ct, "text/event-stream")) {
			t.Errorf("%s %s with the session cookie: HTTP %d %q, want %d", c.method, c.path, resp.StatusCode, ct, c.want)
		}
	}
	anon := newWebClient(t, r)
	if a := anon.do("GET", "/api/events", nil, nil); a.code != http.StatusUnauthorized {
		t.Errorf("GET /api/events without a session: HTTP %d, want 401", a.code)
	}
}

// Over TLS the session cookie is Secure.
func TestWebCookieSecureUnderTLS(t *testing.T) {
	cert, roots := testCert(t)
	d, err := orchestrator.Start(orchestrator.Options{Addr: "127.0.0.1:0", StorePath: filepath.Join(t.TempDir(), "t.db"),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), AdminToken: adminToken,
		TLS: &tls.Config{Certificates: []tls.Certificate{cert}}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	hc := &http.Client{
		Transport:     &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	resp, err := hc.PostForm(d.DataURL()+"/login", url.Values{"token": {adminToken}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	cs := resp.Cookies()
	if resp.StatusCode != http.StatusSeeOther || len(cs) != 1 || !cs[0].Secure || !cs[0].HttpOnly || cs[0].SameSite != http.SameSiteStrictMode {
		t.Fatalf("login over TLS: HTTP %d, cookies %+v; want one Secure, HttpOnly, SameSite=Strict cookie", resp.StatusCode, cs)
	}
}

// The runs page pages and filters through GET /api/runs, and shows its
// refusals.
func TestWebRunsPaged(t *testing.T) {
	r := startAPI(t)
	for i := range 3 {
		r.expect("POST", "/runs", []byte(fmt.Sprintf("name: r%d\nsteps:\n  - name: a\n    run: echo a\n", i)), http.StatusCreated, nil)
	}
	wc := newWebClient(t, r)
	wc.login(adminToken)
	rows := regexp.MustCompile(`<tr data-run="(run-[0-9]+)">`)
	list := func(path string) ([]string, string) {
		t.Helper()
		a := wc.do("GET", path, nil, nil)
		if a.code != http.StatusOK {
			t.Fatalf("GET %s: HTTP %d: %.300s", path, a.code, a.body)
		}
		var ids []string
		for _, m := range rows.FindAllStringSubmatch(a.body, -1) {
			ids = append(ids, m[1])
		}
		next := ""
		if m := regexp.MustCompile(`href="([^"]+)" id="next-page"`).FindStringSubmatch(a.body); m != nil {
			next = strings.ReplaceAll(m[1], "&amp;", "&")
		}
		return ids, next
	}
	first, next := list("/?limit=2")
	if fmt.Sprint(first) != "[run-3 run-2]" || next == "" {
		t.Fatalf("first page %v, next %q; want [run-3 run-2] and a next page", first, next)
	}
	second, next2 := list(next)
	if fmt.Sprint(second) != "[run-1]" || next2 != "" {
		t.Fatalf("second page (%s) %v, next %q; want [run-1] and no next page", next, second, next2)
	}
	if named, _ := list("/?name=r1"); fmt.Sprint(named) != "[run-2]" {
		t.Errorf("?name=r1: %v, want [run-2]", named)
	}
	if a := wc.do("GET", "/?status=bogus", nil, nil); a.code != http.StatusBadRequest || !strings.Contains(a.body, "is not a run status") {
		t.Errorf("?status=bogus: HTTP %d: %.300s; want the API's 400", a.code, a.body)
	}
}
