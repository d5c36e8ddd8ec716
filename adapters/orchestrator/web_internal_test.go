package orchestrator

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The run page shows a log's gap marker as one (class "gap"), and the DAG
// puts each step one column right of its deepest dependency.
func TestWebRunPageGapsAndLayers(t *testing.T) {
	w := newWeb(&Driver{}, "token", nil)
	steps := []APIStep{
		{ID: "run-1/a", Name: "a", State: "success"},
		{ID: "run-1/b", Name: "b", State: "success", Deps: []string{"run-1/a"}},
		{ID: "run-1/c", Name: "c", State: "running", Deps: []string{"run-1/a", "run-1/b"}},
		{ID: "run-1/d", Name: "d", State: "queued"},
	}
	names := map[string]string{}
	for _, s := range steps {
		names[s.ID] = s.Name
	}
	ls := layers(steps, names)
	var got []string
	for _, l := range ls {
		var col []string
		for _, s := range l {
			col = append(col, s.Name+"<"+strings.Join(s.After, ",")+">")
		}
		got = append(got, strings.Join(col, " "))
	}
	if want := "[a<> d<> | b<a> | c<a,b>]"; "["+strings.Join(got, " | ")+"]" != want {
		t.Errorf("layers %v, want %s", got, want)
	}
	data := runData{
		Detail: APIRunDetail{Run: APIRun{ID: "run-1", Name: "gaps"}, Status: "running", Steps: steps},
		Layers: ls, Names: names,
		Logs: []webLine{
			{APILogLine: APILogLine{Step: "run-1/a", Lease: 1, Seq: 1, Text: "before"}, Key: "1.0"},
			{APILogLine: APILogLine{Step: "run-1/a", Lease: 1, Text: "[12 lines lost: the worker's buffer overflowed]", Gap: true}, Key: "1.1"},
		},
	}
	rec := httptest.NewRecorder()
	w.render(rec, httptest.NewRequest("GET", "/runs/run-1", nil), 200, "run", &webSession{csrf: "c"}, data)
	body := rec.Body.String()
	for _, want := range []string{
		`<div class="line gap" data-key="1.1"><span class="step">a</span> <span class="text">[12 lines lost: the worker&#39;s buffer overflowed]</span>`,
		`<div class="line" data-key="1.0">`,
		`data-step="run-1/c" data-state="running"`,
		`after a, b`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the run page lacks %s", want)
		}
	}
	if t.Failed() {
		t.Log(body)
	}
}

// safeNext keeps the page a login returns to on this site (SPEC §18), as
// a browser reads the target: it drops tabs and newlines and reads '\' as
// '/', so each of these is "//evil.example", another site.
func TestSafeNextAsABrowserReadsIt(t *testing.T) {
	for _, next := range []string{
		"//evil.example/x", "/\\evil.example", "/\t/evil.example/phish", "/\t\\evil.example",
		"/\n/evil.example", "/\r/evil.example", "/%09/x\x7f", "\\\\evil.example", "https://evil.example/",
		"evil.example", "", "javascript:alert(1)", "/x\\y",
	} {
		if got := safeNext(next); got != "/" {
			t.Errorf("safeNext(%q) = %q, want /", next, got)
		}
	}
	for _, next := range []string{"/", "/runs/run-1", "/runs?state=failed&page=2", "/events#x", "/runs/run-1%2F"} {
		if got := safeNext(next); got != next {
			t.Errorf("safeNext(%q) = %q, want it kept", next, got)
		}
	}
}

// The status page's in-process API call (serveIn) turns an answer the
// handler cut (http.ErrAbortHandler) into false, serves any other whole,
// and lets any other panic through.
func TestServeInCutAnswer(t *testing.T) {
	req := httptest.NewRequest("GET", "/api/x", nil)
	rec := &memResponse{h: http.Header{}, code: http.StatusOK}
	if serveIn(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("{}")) }), rec, req) != true || rec.body.String() != "{}" {
		t.Fatal("a whole answer: not served")
	}
	cut := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("{")); panic(http.ErrAbortHandler) })
	if serveIn(cut, &memResponse{h: http.Header{}}, req) {
		t.Fatal("a cut answer: reported whole")
	}
	defer func() {
		if v := recover(); v != "boom" {
			t.Fatalf("another panic: recovered %v, want it through", v)
		}
	}()
	serveIn(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { panic("boom") }), &memResponse{h: http.Header{}}, req)
}
