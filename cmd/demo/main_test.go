package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
)

// TestDemo runs `make demo` as the README's first screen gives it: the run
// succeeds, and every one of its seven steps is printed once with its
// worker and first line of output — the last ones read from the history the
// finished run left the core for (SPEC §7a).
func TestDemo(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), demoTimeout)
	defer cancel()
	var out bytes.Buffer
	if err := demo(ctx, &out, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	text := out.String()
	if !strings.Contains(text, "run run-1 finished: success") {
		t.Fatalf("the demo's run did not succeed:\n%s", text)
	}
	for _, step := range []string{"fetch", "lint", "build[0]", "build[1]", "build[2]", "build[3]", "publish"} {
		if n := strings.Count(text, "run-1/"+step+" "); n != 1 {
			t.Errorf("step %s printed %d times:\n%s", step, n, text)
		}
	}
	if !strings.Contains(text, `"published v1.4.2 (4 artifacts)"`) {
		t.Errorf("the last step's output is missing:\n%s", text)
	}
}
