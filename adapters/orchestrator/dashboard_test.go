package orchestrator_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/tether-run/tether/adapters/orchestrator"
)

// TestGrafanaDashboard: every metric the dashboard in deploy/grafana
// queries is one a real driver's /metrics exports, and every tether_*
// family it exports has a panel.
func TestGrafanaDashboard(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "grafana", "tether.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	d, err := orchestrator.Start(orchestrator.Options{Addr: "127.0.0.1:0", StorePath: filepath.Join(t.TempDir(), "tether.db"), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	_, text := get(t, ctx, d.DataURL()+"/metrics", "")
	exported := map[string]string{} // family → type
	for _, line := range strings.Split(text, "\n") {
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			exported[f[2]] = f[3]
		}
	}
	// A series name of a family: the family's own, or a histogram's or
	// summary's _bucket, _sum and _count.
	family := func(name string) (string, bool) {
		if _, ok := exported[name]; ok {
			return name, true
		}
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suffix); ok {
				if kind := exported[base]; kind == "histogram" || (kind == "summary" && suffix != "_bucket") {
					return base, true
				}
			}
		}
		return "", false
	}
	name := regexp.MustCompile(`\b(?:tether|go|process)_[a-zA-Z0-9_]+`)
	shown := map[string]bool{}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			names := name.FindAllString(tg.Expr, -1)
			if len(names) == 0 {
				t.Errorf("panel %q: expression %q names no metric", p.Title, tg.Expr)
			}
			for _, n := range names {
				f, ok := family(n)
				if !ok {
					t.Errorf("panel %q: %s is not a metric the orchestrator exports", p.Title, n)
				}
				shown[f] = true
			}
		}
	}
	for f := range exported {
		if strings.HasPrefix(f, "tether_") && !shown[f] {
			t.Errorf("the dashboard has no panel for %s", f)
		}
	}
}
