package orchestrator

import (
	"log/slog"
	"testing"

	"github.com/tether-run/tether/core"
)

// TestCoreLogLevels: the driver logs the core's lines at the core's level
// (core.LogEntry.Level).
func TestCoreLogLevels(t *testing.T) {
	for in, want := range map[string]slog.Level{
		core.LevelInfo: slog.LevelInfo, core.LevelWarn: slog.LevelWarn, core.LevelError: slog.LevelError,
	} {
		if got := level(in); got != want {
			t.Errorf("level(%q) = %v, want %v", in, got, want)
		}
	}
}
