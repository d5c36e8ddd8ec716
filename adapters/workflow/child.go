package workflow

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/tether-run/tether/core"
)

// Child workflows (SPEC §2). A step's `workflow:` is either a mapping, the
// child workflow inline, or a file path ending in .yaml or .yml, relative to
// the directory of the file that names it. Only the client has the files:
// ParseFile resolves every path, recursively, and Inline renders the result
// as one self-contained definition (each path replaced by the file's
// mapping), which is what the client submits; the API's Parse refuses a path.
// Anything else is a stored workflow's name, which Tether has no registry
// for (SPEC §14), and is refused.

// files reads the workflow files of one ParseFile: the bytes read in all
// are bounded by MaxSize, as one definition is.
type files struct {
	read  func(path string) ([]byte, error)
	bytes int
}

// isPath reports whether a `workflow:` value is a file path rather than a
// name.
func isPath(v string) bool {
	return strings.HasSuffix(v, ".yaml") || strings.HasSuffix(v, ".yml")
}

// child parses a step's `workflow:` value: an inline mapping, or a file.
func (p *parser) child(v *yaml.Node, what string) *core.RunSpec {
	if p.depth+1 >= core.MaxRunDepth {
		p.errf(v, "%s: workflow: child workflows nest more than %d runs deep (%s)", what, core.MaxRunDepth, p.chainText(""))
		return nil
	}
	switch {
	case v.Kind == yaml.MappingNode:
		sub := &parser{file: p.file, files: p.files, chain: p.chain, depth: p.depth + 1}
		return p.adopt(sub, v)
	case v.Kind != yaml.ScalarNode || v.Value == "":
		p.errf(v, "%s: workflow must be a file path (ending .yaml or .yml) or a mapping holding the child workflow", what)
		return nil
	case !isPath(v.Value):
		p.errf(v, "%s: workflow %s is not a file path (ending .yaml or .yml): running a stored workflow by name is not supported, there is no registry of workflows (SPEC §14); give the file's path, relative to this file", what, core.Quote(v.Value))
		return nil
	case p.files == nil:
		p.errf(v, "%s: workflow %s is a file, which only the client can read: `orchestrator run submit` inlines it; through the API, give the child workflow as a mapping", what, core.Quote(v.Value))
		return nil
	}
	path := v.Value
	if !filepath.IsAbs(path) {
		path = filepath.Join(filepath.Dir(p.chain[len(p.chain)-1]), path)
	}
	path = filepath.Clean(path)
	for _, f := range p.chain {
		if f == path {
			p.errf(v, "%s: workflow %s starts a cycle of files: %s", what, core.Quote(v.Value), p.chainText(path))
			return nil
		}
	}
	doc, err := p.files.load(path)
	if err != nil {
		p.errf(v, "%s: workflow %s: %v", what, core.Quote(v.Value), err)
		return nil
	}
	if doc == nil {
		return nil
	}
	sub := &parser{file: path, files: p.files, chain: append(append([]string(nil), p.chain...), path), depth: p.depth + 1}
	if len(doc.Content) == 0 {
		sub.errf(doc, "empty document: write a mapping with `steps:`")
		p.take(sub)
		return nil
	}
	return p.adopt(sub, doc.Content[0])
}

// adopt parses the child workflow at n with sub, and takes its errors.
func (p *parser) adopt(sub *parser, n *yaml.Node) *core.RunSpec {
	spec, lines := sub.run(n)
	if len(sub.errs) == 0 {
		sub.deps(spec, lines)
	}
	p.take(sub)
	if len(sub.errs) > 0 || sub.more > 0 {
		return nil
	}
	return &spec
}

// take adds sub's errors to p's (each names its own file and line).
func (p *parser) take(sub *parser) {
	for _, e := range sub.errs {
		if len(p.errs) >= MaxErrors {
			p.more++
			continue
		}
		p.errs = append(p.errs, e)
	}
	p.more += sub.more
}

// chainText renders the files from the top one down, then next if set.
func (p *parser) chainText(next string) string {
	parts := append([]string(nil), p.chain...)
	if next != "" {
		parts = append(parts, next)
	}
	return strings.Join(parts, " -> ")
}

// load reads and decodes one workflow file.
func (f *files) load(path string) (*yaml.Node, error) {
	src, err := f.read(path)
	if err != nil {
		return nil, err
	}
	f.bytes += len(src)
	if f.bytes > MaxSize {
		return nil, fmt.Errorf("the workflow and its child workflows' files are more than %d bytes", MaxSize)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(src, &doc); err != nil {
		return nil, fmt.Errorf("not a workflow: %v", err)
	}
	if doc.Kind == 0 {
		return nil, errors.New("the file holds no workflow (it is empty, or only comments)")
	}
	return &doc, nil
}

// ParseFile reads the workflow at path and every child workflow file it
// names (SPEC §2), and returns the run with each child embedded, and the
// definition Inline renders of it.
func ParseFile(path string) (core.RunSpec, []byte, error) {
	return parseFiles(path, os.ReadFile)
}

func parseFiles(path string, read func(string) ([]byte, error)) (core.RunSpec, []byte, error) {
	f := &files{read: func(p string) ([]byte, error) {
		b, err := read(p)
		if err == nil && len(b) > MaxSize {
			err = fmt.Errorf("the file is %d bytes, at most %d", len(b), MaxSize)
		}
		return b, err
	}}
	src, err := f.read(path)
	if err != nil {
		return core.RunSpec{}, nil, err
	}
	spec, err := parse(filepath.Clean(path), src, f)
	if err != nil {
		return core.RunSpec{}, nil, err
	}
	out, err := inline(filepath.Clean(path), src, f, 0)
	if err != nil {
		return core.RunSpec{}, nil, fmt.Errorf("%w: %s: %v", ErrInvalid, path, err)
	}
	if len(out) > MaxSize {
		return core.RunSpec{}, nil, fmt.Errorf("%w: %s: with its child workflows inlined the definition is %d bytes, at most %d", ErrInvalid, path, len(out), MaxSize)
	}
	return spec, out, nil
}

// inline renders the workflow in src (read from path) with each step's
// `workflow: FILE` replaced by that file's mapping, itself inlined. The
// files were parsed and checked already (no cycle, bounded depth).
func inline(path string, src []byte, f *files, depth int) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(src, &doc); err != nil {
		return nil, err
	}
	if err := inlineNode(filepath.Dir(path), doc.Content[0], f, depth); err != nil {
		return nil, err
	}
	return yaml.Marshal(&doc)
}

func inlineNode(dir string, run *yaml.Node, f *files, depth int) error {
	if depth >= core.MaxRunDepth {
		return fmt.Errorf("child workflows nest more than %d runs deep", core.MaxRunDepth)
	}
	steps := field(run, "steps")
	if steps == nil {
		return nil
	}
	for _, st := range steps.Content {
		for i := 0; i+1 < len(st.Content); i += 2 {
			if st.Content[i].Value != "workflow" {
				continue
			}
			v := st.Content[i+1]
			if v.Kind == yaml.MappingNode {
				if err := inlineNode(dir, v, f, depth+1); err != nil {
					return err
				}
				continue
			}
			path := v.Value
			if !filepath.IsAbs(path) {
				path = filepath.Join(dir, path)
			}
			src, err := f.read(filepath.Clean(path))
			if err != nil {
				return err
			}
			var doc yaml.Node
			if err := yaml.Unmarshal(src, &doc); err != nil {
				return err
			}
			m := doc.Content[0]
			if err := inlineNode(filepath.Dir(path), m, f, depth+1); err != nil {
				return err
			}
			st.Content[i+1] = m
		}
	}
	return nil
}

// field is the value of key in mapping n, or nil.
func field(n *yaml.Node, key string) *yaml.Node {
	if n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}
