package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/tether-run/tether/client"
)

// TestDataQueryCommand: data query asks GET /api/data with its flags
// (SPEC §14: queryData), prints a table or the API's JSON, and refuses
// bad flags with a usage error before asking anything.
func TestDataQueryCommand(t *testing.T) {
	w := newCLIWorld(t, false)
	var q client.DataQueryAnswer
	js := w.must(exitOK, "data", "query", "--prefix", "build.", "--attr", "kind=log", "--since", "2026-01-01T00:00:00Z", "-o", "json")
	if err := json.Unmarshal([]byte(js), &q); err != nil || q.Items == nil || len(q.Items) != 0 || q.Next != "" {
		t.Fatalf("data query -o json on an empty store: %s (%v)", js, err)
	}
	if out := w.must(exitOK, "data", "query"); !strings.HasPrefix(out, "ID") {
		t.Fatalf("data query table: %q", out)
	}
	for _, args := range [][]string{{"--limit", "0"}, {"--limit", "1001"}, {"--attr", "novalue"}, {"--since", "yesterday"}} {
		w.must(exitUsage, append([]string{"data", "query"}, args...)...)
	}
	if _, errOut, code := w.cli("data", "query", "--prefix", "bad/prefix"); code == exitOK || !strings.Contains(errOut, "prefix") {
		t.Fatalf("a bad prefix: exit %d, %q", code, errOut)
	}
}
