//go:build unix

package workflow

import (
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestChildFIFO: a named pipe is refused as not a workflow file, without
// opening it (opening one waits for a writer).
func TestChildFIFO(t *testing.T) {
	dir := writeFiles(t, map[string]string{"top.yaml": "steps:\n  - name: a\n    workflow: pipe.yaml\n"})
	if err := syscall.Mkfifo(filepath.Join(dir, "pipe.yaml"), 0o644); err != nil {
		t.Skip(err)
	}
	want := strconv.Quote(filepath.Join(dir, "pipe.yaml")) + " is a named pipe (FIFO): name a workflow file"
	if err := parseWithin(t, filepath.Join(dir, "top.yaml")); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("got %v\nwant an error containing %q", err, want)
	}
}
