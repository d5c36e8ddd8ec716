package spec

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestRuleTable keeps SPEC.md's rule → scenario table true: every file a row
// names exists, and every scenario story is named by some row.
func TestRuleTable(t *testing.T) {
	src, err := os.ReadFile("SPEC.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(src)
	i := strings.Index(text, "## Rule → scenario")
	if i < 0 {
		t.Fatal("SPEC.md has no \"## Rule → scenario\" section")
	}
	path := regexp.MustCompile("`([a-z]+/[^`]+\\.(?:txt|go))`")
	named := map[string]bool{}
	rows := 0
	for _, line := range strings.Split(text[i:], "\n") {
		if !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| rule") {
			continue
		}
		rows++
		cells := strings.Split(line, "|")
		last := cells[len(cells)-2]
		ms := path.FindAllStringSubmatch(last, -1)
		if len(ms) == 0 {
			t.Errorf("row names no file: %s", line)
		}
		for _, m := range ms {
			named[m[1]] = true
			if _, err := os.Stat(filepath.Join("..", m[1])); err != nil {
				t.Errorf("row names %s, which does not exist", m[1])
			}
		}
	}
	if rows < 20 {
		t.Errorf("the table has %d rows; every rule of SPEC.md needs one", rows)
	}
	stories, err := filepath.Glob("../core/testdata/*.txt")
	if err != nil {
		t.Fatal(err)
	}
	if len(stories) == 0 {
		t.Fatal("no scenario stories found")
	}
	for _, s := range stories {
		rel := strings.TrimPrefix(s, "../")
		if !named[rel] {
			t.Errorf("scenario %s is in no row of the rule table", rel)
		}
	}
}
