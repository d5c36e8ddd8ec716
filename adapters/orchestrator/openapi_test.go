package orchestrator_test

import (
	"encoding/json"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/client"
)

// notDocumented are the server's routes outside the operator API's
// document, each with its reason. Any other route must be documented.
var notDocumented = map[string]string{
	"/control": "the workers' WebSocket (SPEC §5)",
	"/data/":   "the workers' data plane, with session credentials (SPEC §14)",
	"/bundle/": "the workers' data plane, with session credentials (SPEC §14)",
	"/data":    "the workers' data plane, with session credentials (SPEC §14)",
	"/step/":   "the workers' data plane, with session credentials (SPEC §14)",
	"/pool":    "the workers' data plane, with session credentials (SPEC §14)",
	"/secret/": "the workers' data plane, with session credentials (SPEC §14a)",
	"/token":   "the workers' data plane, with session credentials (SPEC §14a)",
	"/api/":    "the catch-all answering 401/404/405 for what no route serves",
	"/livez":   "a Kubernetes probe, plain text (SPEC §16)",
	"/readyz":  "a Kubernetes probe, plain text (SPEC §16)",
	"/metrics": "Prometheus' text format, with its own optional token (SPEC §16)",
	"/":        "the web status page, HTML (SPEC §18)",
}

// TestOpenAPIMatchesRoutes holds GET /api/openapi.json (fetched without a
// token: it is public) against the real server's mux: every route
// registered on it is documented, and every documented method and path is
// served by the route of that very pattern (not the catch-all). Every
// schema reference resolves.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	r := startAPI(t)
	anon, err := client.New(r.d.DataURL(), "")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := anon.OpenAPI(r.ctx)
	if err != nil {
		t.Fatalf("GET /api/openapi.json without a token: %v", err)
	}
	var doc struct {
		OpenAPI    string                                `json:"openapi"`
		Paths      map[string]map[string]json.RawMessage `json:"paths"`
		Components struct {
			Schemas map[string]json.RawMessage `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("the document is not JSON: %v", err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Fatalf("openapi %q, want 3.x", doc.OpenAPI)
	}
	documented := map[string]bool{} // "GET /api/runs"
	for path, ops := range doc.Paths {
		for m := range ops {
			documented[strings.ToUpper(m)+" "+path] = true
		}
	}

	patterns, mux := orchestrator.Routes(r.d)
	served := map[string]bool{}
	for _, p := range patterns {
		served[p] = true
		if _, ok := notDocumented[p]; ok {
			continue
		}
		method, path, ok := strings.Cut(p, " ")
		if !ok { // a pattern without a method serves every method
			found := false
			for d := range documented {
				found = found || strings.HasSuffix(d, " "+p)
			}
			if !found {
				t.Errorf("route %q is served but not in the OpenAPI document", p)
			}
			continue
		}
		if !documented[method+" "+path] {
			t.Errorf("route %q is served but not in the OpenAPI document", p)
		}
	}
	for reason := range notDocumented {
		if !served[reason] {
			t.Errorf("%q is listed as served outside the document, but the mux has no such route", reason)
		}
	}
	param := regexp.MustCompile(`\{[a-z]+\}`)
	for d := range documented {
		method, path, _ := strings.Cut(d, " ")
		req := httptest.NewRequest(method, param.ReplaceAllString(path, "sample"), nil)
		if _, pat := mux.Handler(req); pat != d {
			t.Errorf("documented %q: the server routes %s %s to %q", d, method, req.URL.Path, pat)
		}
	}
	if len(documented) < 15 {
		t.Errorf("the document has %d operations; the API has more", len(documented))
	}
	for _, ref := range regexp.MustCompile(`"\$ref": "#/components/schemas/([A-Za-z]+)"`).FindAllStringSubmatch(string(raw), -1) {
		if _, ok := doc.Components.Schemas[ref[1]]; !ok {
			t.Errorf("$ref to schema %s, which the document lacks", ref[1])
		}
	}
	// The schema of an answer names its fields as the server encodes them.
	var run struct {
		Properties map[string]any `json:"properties"`
		Required   []string       `json:"required"`
	}
	if err := json.Unmarshal(doc.Components.Schemas["RunDetail"], &run); err != nil || run.Properties["steps"] == nil || len(run.Required) != 4 {
		t.Errorf("schema RunDetail: %s (%v)", doc.Components.Schemas["RunDetail"], err)
	}
}
