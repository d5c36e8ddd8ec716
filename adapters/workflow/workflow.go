// Package workflow parses workflow definitions (YAML) into core.RunSpec.
//
// Every error names the file and line it comes from: unknown fields (with the
// fields that are known), wrong types, bad durations, unknown or cyclic
// dependencies, steps without a command. The core validates the result again
// on submit; this package exists so that a person gets a line number.
package workflow

import (
	"bytes"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tether-run/tether/core"
)

// ErrInvalid is returned (wrapped, with file, line and reason) when a
// definition cannot be turned into a valid run.
var ErrInvalid = errors.New("invalid workflow")

// MaxSize bounds a definition's size.
const MaxSize = 1 << 20

var runFields = []string{"name", "timeout", "env", "steps"}
var stepFields = []string{"name", "run", "depends_on", "writes", "type", "runner", "tags", "labels",
	"target", "platform", "timeout", "env", "forEach", "concurrency", "hold", "hold_expiry", "wait"}

type parser struct {
	file string
	errs []string
}

func (p *parser) errf(n *yaml.Node, format string, args ...any) {
	line := 0
	if n != nil {
		line = n.Line
	}
	p.errs = append(p.errs, fmt.Sprintf("%s:%d: %s", p.file, line, fmt.Sprintf(format, args...)))
}

// Parse reads one workflow definition. file names it in errors.
func Parse(file string, src []byte) (core.RunSpec, error) {
	p := &parser{file: file}
	if len(src) > MaxSize {
		return core.RunSpec{}, fmt.Errorf("%w: %s: %d bytes, at most %d", ErrInvalid, file, len(src), MaxSize)
	}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(src))
	if err := dec.Decode(&doc); err != nil {
		return core.RunSpec{}, fmt.Errorf("%w: %s: %v", ErrInvalid, file, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		p.errf(&extra, "more than one YAML document; a file holds one workflow")
	}
	if len(doc.Content) == 0 {
		return core.RunSpec{}, fmt.Errorf("%w: %s: empty document", ErrInvalid, file)
	}
	spec, lines := p.run(doc.Content[0])
	if len(p.errs) == 0 {
		p.deps(spec, lines)
	}
	if len(p.errs) == 0 {
		if err := spec.Validate(); err != nil {
			p.errs = append(p.errs, fmt.Sprintf("%s: %v", file, strings.TrimPrefix(err.Error(), core.ErrInvalidRun.Error()+": ")))
		}
	}
	if len(p.errs) > 0 {
		return core.RunSpec{}, fmt.Errorf("%w:\n  %s", ErrInvalid, strings.Join(p.errs, "\n  "))
	}
	return spec, nil
}

// fields walks a mapping node, reporting unknown and duplicate keys.
func (p *parser) fields(n *yaml.Node, what string, known []string, f func(key string, k, v *yaml.Node)) {
	if n.Kind != yaml.MappingNode {
		p.errf(n, "%s must be a mapping", what)
		return
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if seen[k.Value] {
			p.errf(k, "%s: field %q appears twice", what, k.Value)
			continue
		}
		seen[k.Value] = true
		ok := false
		for _, kn := range known {
			if kn == k.Value {
				ok = true
			}
		}
		if !ok {
			p.errf(k, "%s: unknown field %q (known: %s)", what, k.Value, strings.Join(known, ", "))
			continue
		}
		f(k.Value, k, v)
	}
}

func (p *parser) str(n *yaml.Node, what string) string {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		p.errf(n, "%s must be a string", what)
		return ""
	}
	return n.Value
}

func (p *parser) boolean(n *yaml.Node, what string) bool {
	var b bool
	if n.Kind != yaml.ScalarNode || n.Decode(&b) != nil {
		p.errf(n, "%s must be true or false, not %q", what, n.Value)
	}
	return b
}

func (p *parser) integer(n *yaml.Node, what string) int {
	var i int
	if n.Kind != yaml.ScalarNode || n.Decode(&i) != nil {
		p.errf(n, "%s must be a whole number, not %q", what, n.Value)
	}
	return i
}

func (p *parser) duration(n *yaml.Node, what string) time.Duration {
	s := p.str(n, what)
	if s == "" {
		return 0
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		p.errf(n, "%s: %q is not a duration like 90s, 5m or 1h", what, s)
	}
	return d
}

func (p *parser) list(n *yaml.Node, what string) []string {
	if n.Kind != yaml.SequenceNode {
		p.errf(n, "%s must be a list", what)
		return nil
	}
	out := make([]string, 0, len(n.Content))
	for _, c := range n.Content {
		out = append(out, p.str(c, what+" entries"))
	}
	return out
}

func (p *parser) strmap(n *yaml.Node, what string) map[string]string {
	if n.Kind != yaml.MappingNode {
		p.errf(n, "%s must be a mapping of names to strings", what)
		return nil
	}
	m := map[string]string{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		m[p.str(n.Content[i], what+" keys")] = p.str(n.Content[i+1], what+" values")
	}
	return m
}

// checkNames refuses, at its line, a name that core.CheckName refuses (SPEC
// §12: printable UTF-8, 1-128 bytes): a scalar, every entry of a list, or
// every key and value of a mapping (label keys and values). Wrong kinds and
// empty values are the type checks' to report.
func (p *parser) checkNames(n *yaml.Node, kind string) {
	check := func(n *yaml.Node, kind string) {
		if n.Kind != yaml.ScalarNode || n.Value == "" {
			return
		}
		if err := core.CheckName(kind, n.Value); err != nil {
			p.errf(n, "%s", strings.TrimPrefix(err.Error(), core.ErrBadName.Error()+": "))
		}
	}
	switch n.Kind {
	case yaml.ScalarNode:
		check(n, kind)
	case yaml.SequenceNode:
		for _, c := range n.Content {
			check(c, kind)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			check(n.Content[i], kind+" key")
			check(n.Content[i+1], kind+" value")
		}
	}
}

func (p *parser) run(n *yaml.Node) (core.RunSpec, map[string]*yaml.Node) {
	var spec core.RunSpec
	lines := map[string]*yaml.Node{}
	var stepsNode *yaml.Node
	p.fields(n, "workflow", runFields, func(key string, k, v *yaml.Node) {
		switch key {
		case "name":
			spec.Name = p.str(v, "name")
			p.checkNames(v, "run name")
		case "timeout":
			spec.Timeout = p.duration(v, "timeout")
		case "env":
			spec.Env = p.strmap(v, "env")
		case "steps":
			stepsNode = v
		}
	})
	if stepsNode == nil {
		if len(p.errs) == 0 {
			p.errf(n, "workflow has no steps")
		}
		return spec, lines
	}
	if stepsNode.Kind != yaml.SequenceNode {
		p.errf(stepsNode, "steps must be a list")
		return spec, lines
	}
	for i, sn := range stepsNode.Content {
		s := p.step(sn, i)
		if s.Name != "" {
			if _, dup := lines[s.Name]; dup {
				p.errf(sn, "step %q is declared twice (first at line %d)", s.Name, lines[s.Name].Line)
			}
			lines[s.Name] = sn
		}
		spec.Steps = append(spec.Steps, s)
	}
	return spec, lines
}

func (p *parser) step(n *yaml.Node, i int) core.StepSpec {
	var s core.StepSpec
	what := fmt.Sprintf("step %d", i+1)
	for j := 0; j+1 < len(n.Content); j += 2 {
		if n.Content[j].Value == "name" {
			what = fmt.Sprintf("step %q", n.Content[j+1].Value)
		}
	}
	p.fields(n, what, stepFields, func(key string, k, v *yaml.Node) {
		switch key {
		case "name":
			s.Name = p.str(v, what+": name")
			p.checkNames(v, "step name")
		case "run":
			s.Command = p.str(v, what+": run")
		case "depends_on":
			if v.Kind == yaml.ScalarNode {
				s.DependsOn = []string{v.Value}
			} else {
				s.DependsOn = p.list(v, what+": depends_on")
			}
		case "writes":
			s.Writes = p.boolean(v, what+": writes")
		case "type":
			s.Type = p.str(v, what+": type")
		case "runner":
			s.Runner = p.str(v, what+": runner")
		case "tags":
			s.Tags = p.list(v, what+": tags")
			p.checkNames(v, "tag")
		case "labels":
			s.Labels = p.strmap(v, what+": labels")
			p.checkNames(v, "label")
		case "target":
			s.Target = p.str(v, what+": target")
			p.checkNames(v, "target")
		case "platform":
			s.Platform = p.str(v, what+": platform")
			p.checkNames(v, "platform")
		case "timeout":
			s.Timeout = p.duration(v, what+": timeout")
		case "env":
			s.Env = p.strmap(v, what+": env")
		case "forEach":
			s.ForEach = p.list(v, what+": forEach")
		case "concurrency":
			s.Concurrency = p.integer(v, what+": concurrency")
		case "hold":
			s.Hold = p.boolean(v, what+": hold")
		case "hold_expiry":
			s.HoldExpiry = p.duration(v, what+": hold_expiry")
		case "wait":
			s.Wait = p.duration(v, what+": wait")
		}
	})
	if n.Kind == yaml.MappingNode {
		if s.Name == "" {
			p.errf(n, "%s has no name", what)
		}
		if s.Type != "task" && strings.TrimSpace(s.Command) == "" {
			p.errf(n, "%s has no run command", what)
		}
	}
	return s
}

// deps reports unknown dependencies and cycles with the line of the step.
func (p *parser) deps(spec core.RunSpec, lines map[string]*yaml.Node) {
	for _, s := range spec.Steps {
		for _, d := range s.DependsOn {
			if _, ok := lines[d]; !ok {
				known := make([]string, 0, len(lines))
				for k := range lines {
					known = append(known, k)
				}
				sort.Strings(known)
				p.errf(lines[s.Name], "step %q depends on unknown step %q (steps: %s)", s.Name, d, strings.Join(known, ", "))
			}
		}
	}
}
