// Package workflow parses workflow definitions (YAML) into core.RunSpec.
//
// Every error names the file, line and column it comes from (file:line:col)
// and says what to change: YAML syntax errors, an empty file, a second YAML
// document, YAML anchors and aliases (not supported), unknown or repeated
// fields and keys (with the fields that are known), wrong types (no loose
// conversion: an integer is a YAML integer, a boolean true or false), bad
// durations, unknown or cyclic dependencies (a cycle is walked in order,
// each step with its line), steps without a command, and the core's limits,
// at the step they name (SPEC §2, §12). Lists in an
// error are capped (core.ListForError) and quoted input is truncated
// (core.Quote), so an error is bounded whatever the input. The core
// validates the result again on submit; this package exists so that a
// person gets a line number.
package workflow

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/tether-run/tether/core"
)

// ErrInvalid is returned (wrapped, with file, line and reason) when a
// definition cannot be turned into a valid run.
var ErrInvalid = errors.New("invalid workflow")

// MaxSize bounds a definition's size, in bytes (SPEC §12; the API's
// submit limit, Options.MaxSubmitBody, may be lower).
const MaxSize = 1 << 20

// MaxErrors bounds the errors one Parse reports; the rest are counted.
const MaxErrors = 20

var runFields = []string{"name", "timeout", "env", "steps", "concurrency"}
var stepFields = []string{"name", "run", "depends_on", "writes", "type", "runner", "tags", "labels",
	"target", "platform", "timeout", "env", "forEach", "concurrency", "hold", "hold_expiry", "wait",
	"outputs", "retry", "idempotent", "secrets", "secrets_as", "put_secrets",
	"workflow", "with"}
var retryFields = []string{"attempts", "backoff", "on"}

type parser struct {
	file   string
	errs   []string
	more   int // errors past MaxErrors, counted only
	steps  *yaml.Node
	byName map[string]int
	// files resolves `workflow: FILE` (nil: refused, the API's Parse);
	// chain is the files from the top one down to this one (SPEC §2).
	files *files
	chain []string
	depth int // runs above this one
}

func (p *parser) errf(n *yaml.Node, format string, args ...any) {
	line, col := 1, 1
	if n != nil && n.Line > 0 {
		line, col = n.Line, max(n.Column, 1)
	}
	p.errAt(line, col, format, args...)
}

// errAt reports an error at line and column; a line of 0 is not known (the
// message says so) and the error names the file alone.
func (p *parser) errAt(line, col int, format string, args ...any) {
	if len(p.errs) >= MaxErrors {
		p.more++
		return
	}
	if line <= 0 {
		p.errs = append(p.errs, fmt.Sprintf("%s: %s", p.file, fmt.Sprintf(format, args...)))
		return
	}
	p.errs = append(p.errs, fmt.Sprintf("%s:%d:%d: %s", p.file, line, col, fmt.Sprintf(format, args...)))
}

// posName renders a file's path where an error gives a position in it
// (FILE:LINE:COL): as it is when it is printable, else quoted (core.Quote);
// at most core.MaxNameLength bytes of it either way (SPEC §2, §12).
func posName(path string) string {
	s := path
	if len(s) > core.MaxNameLength {
		n := core.MaxNameLength
		for n > 0 && !utf8.RuneStart(s[n]) {
			n--
		}
		s = s[:n] + "…"
	}
	if s == "" || !utf8.ValidString(s) {
		return core.Quote(path)
	}
	for _, r := range s {
		if r != ' ' && !unicode.IsPrint(r) {
			return core.Quote(path)
		}
	}
	return s
}

func (p *parser) err() error {
	msg := strings.Join(p.errs, "\n  ")
	if p.more > 0 {
		msg += fmt.Sprintf("\n  … and %s more errors", core.Thousands(p.more))
	}
	return fmt.Errorf("%w:\n  %s", ErrInvalid, msg)
}

// Parse reads one workflow definition. file names it in errors.
// A step's `workflow:` may hold its child workflow inline; a file path
// there is refused (ParseFile resolves them).
func Parse(file string, src []byte) (core.RunSpec, error) {
	spec, _, err := parse(file, src, nil)
	return spec, err
}

// parse is Parse, resolving `workflow: FILE` through f when it is set; it
// returns the document's root node too (ParseFile inlines the files into it).
func parse(file string, src []byte, f *files) (core.RunSpec, *yaml.Node, error) {
	p := &parser{file: posName(file), files: f, chain: []string{file}}
	if len(src) > MaxSize {
		return core.RunSpec{}, nil, fmt.Errorf("%w: %s:1:1: the file is %d bytes, at most %d: split the workflow, or shorten its commands and lists", ErrInvalid, p.file, len(src), MaxSize)
	}
	root := p.document(src)
	if root == nil {
		return core.RunSpec{}, nil, p.err()
	}
	spec, lines := p.run(root)
	if len(p.errs) == 0 {
		p.deps(spec, lines)
	}
	if len(p.errs) == 0 {
		if err := spec.Validate(); err != nil {
			// The core's limits are about the whole run: point at the step
			// the error names, else at the steps.
			msg := strings.TrimPrefix(err.Error(), core.ErrInvalidRun.Error()+": ")
			p.errf(p.stepNode(msg, lines, root), "%s", msg)
		}
	}
	if len(p.errs) > 0 {
		return core.RunSpec{}, nil, p.err()
	}
	return spec, root, nil
}

// coreStepRE reads the step a core error names: `step "b": …` or `step 3 …`.
var coreStepRE = regexp.MustCompile(`^step ("(?:[^"\\]|\\.)*"|[0-9]+)`)

// stepNode is the node of the step msg (the core's error) names, else the
// steps list, else root.
func (p *parser) stepNode(msg string, lines map[string]*yaml.Node, root *yaml.Node) *yaml.Node {
	if m := coreStepRE.FindStringSubmatch(msg); m != nil {
		if name, err := strconv.Unquote(m[1]); err == nil {
			if n := lines[name]; n != nil {
				return n
			}
		} else if i, err := strconv.Atoi(m[1]); err == nil && p.steps != nil && i >= 1 && i <= len(p.steps.Content) {
			return p.steps.Content[i-1]
		}
	}
	if p.steps != nil {
		return p.steps
	}
	return root
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
			p.errf(k, "%s: field %s appears twice", what, core.Quote(k.Value))
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
			p.errf(k, "%s: unknown field %s (known: %s)", what, core.Quote(k.Value), strings.Join(known, ", "))
			continue
		}
		f(k.Value, k, v)
	}
}

// str reads a string: any scalar but null, written as it is (`run: true`
// runs the command true, `forEach: [1, 2]` are items "1" and "2"), unless a
// tag other than !!str says it is something else (`run: !!int x`).
func (p *parser) str(n *yaml.Node, what string) string {
	if n.Kind != yaml.ScalarNode || n.ShortTag() == "!!null" || n.Style&yaml.TaggedStyle != 0 && n.ShortTag() != "!!str" {
		p.errf(n, "%s must be a string, not %s", what, found(n))
		return ""
	}
	return n.Value
}

// boolean reads a YAML boolean (tag !!bool): true or false, not a quoted
// "true", YAML 1.1's yes/on/no/off, or null.
func (p *parser) boolean(n *yaml.Node, what string) bool {
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!bool" {
		switch n.Value {
		case "true", "True", "TRUE":
			return true
		case "false", "False", "FALSE":
			return false
		}
	}
	p.errf(n, "%s must be true or false, not %s", what, found(n))
	return false
}

// integer reads a YAML integer (tag !!int): not 2.9 (cut to 2), "3", or null.
func (p *parser) integer(n *yaml.Node, what string) int {
	var i int
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" || n.Decode(&i) != nil {
		p.errf(n, "%s must be a whole number, not %s", what, found(n))
		return 0
	}
	return i
}

// found describes what n holds, for an error saying what was expected
// instead: its text, quoted, and what the text alone does not show (that it
// is quoted, tagged, or null).
func found(n *yaml.Node) string {
	switch {
	case n.Kind == yaml.MappingNode:
		return "a mapping"
	case n.Kind == yaml.SequenceNode:
		return "a list"
	case n.Kind != yaml.ScalarNode:
		return "an alias"
	case n.Style&yaml.TaggedStyle != 0:
		return fmt.Sprintf("%s tagged %s", core.Quote(n.Value), core.Quote(n.Tag))
	case n.ShortTag() == "!!null":
		return "null (nothing)"
	case n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) != 0:
		return "the quoted string " + core.Quote(n.Value)
	}
	return core.Quote(n.Value)
}

func (p *parser) duration(n *yaml.Node, what string) time.Duration {
	s := p.str(n, what)
	if s == "" {
		return 0
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		p.errf(n, "%s: %s is not a duration like 90s, 5m or 1h", what, core.Quote(s))
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
	first := map[string]int{} // key → its line
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, errs := n.Content[i], len(p.errs)+p.more
		key := p.str(k, what+" keys")
		if len(p.errs)+p.more == errs {
			if line, dup := first[key]; dup {
				p.errf(k, "%s: key %s appears twice (first at line %d): keep one", what, core.Quote(key), line)
				continue
			}
			first[key] = k.Line
		}
		m[key] = p.str(n.Content[i+1], what+" values")
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
		case "concurrency":
			if v.Kind != yaml.MappingNode {
				p.errf(v, "concurrency on a workflow must be a mapping {group: NAME, max: N, cancel_in_progress: BOOL} (SPEC §8a)")
				return
			}
			spec.Group = p.group(v, "concurrency", true)
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
	p.steps = stepsNode
	for i, sn := range stepsNode.Content {
		s := p.step(sn, i)
		if s.Name != "" {
			if _, dup := lines[s.Name]; dup {
				p.errf(sn, "step %s is declared twice (first at line %d): rename one", core.Quote(s.Name), lines[s.Name].Line)
			}
			lines[s.Name] = sn
		}
		spec.Steps = append(spec.Steps, s)
	}
	return spec, lines
}

func (p *parser) step(n *yaml.Node, i int) core.StepSpec {
	var s core.StepSpec
	var retryNode *yaml.Node
	child, badRun := false, false
	what := fmt.Sprintf("step %d", i+1)
	for j := 0; j+1 < len(n.Content); j += 2 {
		if n.Content[j].Value == "name" {
			what = "step " + core.Quote(n.Content[j+1].Value)
		}
	}
	p.fields(n, what, stepFields, func(key string, k, v *yaml.Node) {
		switch key {
		case "name":
			s.Name = p.str(v, what+": name")
			p.checkNames(v, "step name")
		case "run":
			errs := len(p.errs) + p.more
			s.Command = p.str(v, what+": run")
			badRun = len(p.errs)+p.more > errs // reported: not "no run command" besides
		case "depends_on":
			if v.Kind == yaml.ScalarNode {
				s.DependsOn = []string{p.str(v, what+": depends_on")}
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
			// An integer caps a forEach's instances in flight; a mapping
			// names a step group (SPEC §8a).
			if v.Kind == yaml.MappingNode {
				s.Group = p.group(v, what+": concurrency", false)
			} else if v.Kind == yaml.ScalarNode && v.Tag == "!!int" {
				s.Concurrency = p.integer(v, what+": concurrency")
			} else {
				p.errf(v, "%s: concurrency must be an integer (the forEach cap) or a mapping {group: NAME, max: N} (a step group, SPEC §8a)", what)
			}
		case "hold":
			s.Hold = p.boolean(v, what+": hold")
		case "hold_expiry":
			s.HoldExpiry = p.duration(v, what+": hold_expiry")
		case "wait":
			s.Wait = p.duration(v, what+": wait")
		case "outputs":
			s.Outputs = p.list(v, what+": outputs")
		case "retry":
			errs := len(p.errs) + p.more
			s.Retry = p.retry(v, what+": retry")
			if len(p.errs)+p.more == errs {
				retryNode = k // read cleanly: the core's check below
			}
		case "idempotent":
			s.Idempotent = p.boolean(v, what+": idempotent")
		case "secrets": // SPEC §14a
			s.Secrets = p.list(v, what+": secrets")
		case "secrets_as":
			s.SecretsAs = p.str(v, what+": secrets_as")
		case "put_secrets":
			s.PutSecrets = p.list(v, what+": put_secrets")
		case "workflow":
			child = true // refused or not: no "no run command" besides
			s.Workflow = p.child(v, what)
		case "with":
			s.With = p.strmap(v, what+": with")
		}
	})
	if len(s.Outputs) > 0 { // SPEC §14: a declared output makes the step write-bearing
		if w := fieldNode(n, "writes"); w != nil && !s.Writes {
			p.errf(w, "%s: writes: false, but it declares outputs (a step that declares outputs writes): remove writes: false", what)
		}
		s.Writes = true
	}
	if retryNode != nil && s.Retry != nil {
		// The core's check, at the policy's line (SPEC §2, §12).
		if err := core.CheckRetry(s); err != nil {
			msg := strings.TrimPrefix(err.Error(), core.ErrInvalidRun.Error()+": ")
			if s.Writes && !s.Idempotent {
				msg += ": add `idempotent: true` if running the step again is safe, or remove `retry:`"
			}
			p.errf(retryNode, "%s", msg)
		}
	}
	if n.Kind == yaml.MappingNode {
		if s.Name == "" {
			p.errf(n, "%s has no name", what)
		}
		if !child && !badRun && s.Type != "task" && strings.TrimSpace(s.Command) == "" {
			p.errf(n, "%s has no run command", what)
		}
	}
	return s
}

// fieldNode returns the value node of a mapping's key, nil if absent.
func fieldNode(n *yaml.Node, key string) *yaml.Node {
	if n.Kind != yaml.MappingNode {
		return nil
	}
	for j := 0; j+1 < len(n.Content); j += 2 {
		if n.Content[j].Value == key {
			return n.Content[j+1]
		}
	}
	return nil
}

// retry reads a step's `retry: {attempts: N, backoff: DURATION, on: [exit
// codes and/or timeout]}` (SPEC §1 RETRY); `on` may be one item.
func (p *parser) retry(n *yaml.Node, what string) *core.RetryPolicy {
	r := &core.RetryPolicy{}
	attempts := false
	p.fields(n, what, retryFields, func(key string, k, v *yaml.Node) {
		switch key {
		case "attempts":
			r.Attempts, attempts = p.integer(v, what+": attempts"), true
		case "backoff":
			r.Backoff = p.duration(v, what+": backoff")
		case "on":
			items := []*yaml.Node{v}
			if v.Kind == yaml.SequenceNode {
				items = v.Content
			}
			for _, c := range items {
				var code int
				switch {
				case c.Kind == yaml.ScalarNode && c.ShortTag() == "!!str" && c.Value == "timeout":
					r.OnTimeout = true
				case c.Kind == yaml.ScalarNode && c.ShortTag() == "!!int" && c.Decode(&code) == nil:
					r.Codes = append(r.Codes, code) // a YAML integer: not 1.7, cut to 1
				default:
					p.errf(c, "%s: on: %s is neither an exit code (1-255) nor timeout", what, found(c))
				}
			}
		}
	})
	if n.Kind == yaml.MappingNode && !attempts {
		p.errf(n, "%s has no attempts: say how many times to run the step again, e.g. attempts: 3", what)
	}
	return r
}

// deps reports unknown dependencies and cycles with the line of the step.
func (p *parser) deps(spec core.RunSpec, lines map[string]*yaml.Node) {
	var known []string // sorted names, built once
	for _, s := range spec.Steps {
		for _, d := range s.DependsOn {
			if _, ok := lines[d]; !ok {
				if known == nil {
					for k := range lines {
						known = append(known, k)
					}
					sort.Strings(known)
				}
				p.errf(lines[s.Name], "step %s depends on unknown step %s: fix the name or remove it from depends_on (steps: %s)",
					core.Quote(s.Name), core.Quote(d), core.ListForError(known))
			}
		}
	}
	if len(p.errs) > 0 {
		return
	}
	if cyc := core.FindCycle(spec.Steps); cyc != nil {
		parts := make([]string, len(cyc))
		for i, name := range cyc {
			parts[i] = fmt.Sprintf("%s (line %d)", core.Quote(name), lines[name].Line)
		}
		if len(parts) > 2*core.ErrorListMax {
			parts = append(parts[:core.ErrorListMax], fmt.Sprintf("… %s more …", core.Thousands(len(parts)-core.ErrorListMax-1)), parts[len(parts)-1])
		}
		p.errf(lines[cyc[0]], "dependency cycle: %s, each depending on the next: remove one of these depends_on entries", strings.Join(parts, " -> "))
	}
}
