package main

import (
	_ "embed"
	"strings"
)

//go:embed examples/dag.yaml
var dagYAML string

// exampleWorkflow is examples/dag.yaml without its leading comment,
// indented, for run submit's help: a definition to copy from wherever the
// binary runs.
var exampleWorkflow = func() string {
	var b strings.Builder
	body := false
	for line := range strings.Lines(dagYAML) {
		if body = body || !strings.HasPrefix(line, "#"); body {
			b.WriteString("    " + line)
		}
	}
	return strings.TrimRight(strings.ReplaceAll(b.String(), "    \n", "\n"), "\n") + "\n"
}()
