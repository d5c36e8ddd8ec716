package orchestrator

import (
	"fmt"
	"os"
	"path"
	"strings"
)

// ShipEnv returns the variables of this process's environment whose names
// match one of patterns (path.Match globs): the part of the orchestrator's
// own environment every dispatch ships (Config.Env, SPEC §8), by default
// (no pattern) none — a server's own variables (cloud credentials, database
// URLs) reach a step only when the operator names them (serve --ship-env).
// The dispatch still drops the denylist (core.DispatchEnv).
func ShipEnv(patterns []string) map[string]string {
	env := map[string]string{}
	for _, kv := range os.Environ() {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			continue
		}
		for _, p := range patterns {
			if m, _ := path.Match(p, k); m {
				env[k] = v
				break
			}
		}
	}
	return env
}

// CheckShipEnvPattern says whether p is a usable --ship-env pattern.
func CheckShipEnvPattern(p string) error {
	if p == "" {
		return fmt.Errorf("an empty pattern")
	}
	if _, err := path.Match(p, ""); err != nil {
		return fmt.Errorf("pattern %q: %v", p, err)
	}
	return nil
}
