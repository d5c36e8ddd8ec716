package workflow

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
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

// files reads the workflow files of one ParseFile, each once (by its
// cleaned path): the bytes read in all, the top file's included, are
// bounded by MaxSize, as one definition is (SPEC §2: at most 1 MiB in all).
type files struct {
	open  func(path string) (fs.File, error)
	bytes int              // read so far
	read  map[string]*file // by cleaned path
	// subs maps each step's `workflow: FILE` value to that file's root
	// node: what Inline puts in its place.
	subs map[*yaml.Node]*yaml.Node
}

// file is one workflow file, as read: its root node, nil when it was
// refused (err, or the errors reported when it was first read).
type file struct {
	root *yaml.Node
	err  error
}

// fileError is a workflow file that cannot be read as one (too large, not
// a regular file), as opposed to the system's error reading it.
type fileError string

func (e fileError) Error() string { return string(e) }

// isPath reports whether a `workflow:` value is a file path rather than a
// name.
func isPath(v string) bool {
	return strings.HasSuffix(v, ".yaml") || strings.HasSuffix(v, ".yml")
}

// child parses a step's `workflow:` value: an inline mapping, or a file.
func (p *parser) child(v *yaml.Node, what string) *core.RunSpec {
	if p.depth+1 >= core.MaxRunDepth {
		// SPEC §12's wording: this run's child would be a run too many.
		p.errf(v, "%s: workflow: child workflows nest %d runs deep, at most %d (%s)", what, p.depth+2, core.MaxRunDepth, p.chainText(""))
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
	sub := &parser{file: posName(path), files: p.files, chain: append(append([]string(nil), p.chain...), path), depth: p.depth + 1}
	root, err := p.files.load(path, sub)
	if err != nil {
		p.errf(v, "%s: workflow %s: %v", what, core.Quote(v.Value), err)
		return nil
	}
	if root == nil {
		p.take(sub) // the file's own errors, at their lines in it
		return nil
	}
	p.files.subs[v] = root
	return p.adopt(sub, root)
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

// take adds sub's errors to p's (each names its own file and line); one
// already reported (a child file named by two steps) is not repeated.
func (p *parser) take(sub *parser) {
	for _, e := range sub.errs {
		if slices.Contains(p.errs, e) {
			continue
		}
		if len(p.errs) >= MaxErrors {
			p.more++
			continue
		}
		p.errs = append(p.errs, e)
	}
	p.more += sub.more
}

// chainText renders the files from the top one down, then next if set,
// each quoted (core.Quote).
func (p *parser) chainText(next string) string {
	parts := append([]string(nil), p.chain...)
	if next != "" {
		parts = append(parts, next)
	}
	for i, f := range parts {
		parts[i] = core.Quote(f)
	}
	return strings.Join(parts, " -> ")
}

// load reads and decodes the workflow file at path (cleaned), once per
// ParseFile: the first time, sub reports the file's own errors (its YAML
// syntax, a second document, an alias) at their lines in it. The error
// returned is the file's reading, for the step naming it to report.
func (f *files) load(path string, sub *parser) (*yaml.Node, error) {
	if e, ok := f.read[path]; ok {
		return e.root, e.err
	}
	e := &file{}
	f.read[path] = e
	var src []byte
	if src, e.err = f.readFile(path); e.err == nil {
		e.root = sub.document(src)
	}
	return e.root, e.err
}

// readFile reads the file at path: a regular file (not a FIFO or a device,
// which could block or never end), of at most the bytes left of MaxSize;
// it reads no more than that and a byte, whatever the file holds.
func (f *files) readFile(path string) ([]byte, error) {
	left := MaxSize - f.bytes
	info, err := os.Stat(path) // before opening: opening a FIFO waits for a writer
	if err != nil {
		return nil, quotePath(err)
	}
	if err := regular(path, info); err != nil {
		return nil, err
	}
	h, err := f.open(path)
	if err != nil {
		return nil, quotePath(err)
	}
	defer h.Close()
	if info, err = h.Stat(); err != nil {
		return nil, quotePath(err)
	}
	if err := regular(path, info); err != nil {
		return nil, err
	}
	if info.Size() > int64(left) {
		return nil, f.tooBig(path, strconv.FormatInt(info.Size(), 10))
	}
	src, err := io.ReadAll(io.LimitReader(h, int64(left)+1))
	if err != nil {
		return nil, quotePath(err)
	}
	if len(src) > left { // it grew since its size was read
		return nil, f.tooBig(path, "more than "+strconv.Itoa(left))
	}
	f.bytes += len(src)
	return src, nil
}

// regular refuses what is not a regular file.
func regular(path string, info fs.FileInfo) error {
	m := info.Mode()
	if m.IsRegular() {
		return nil
	}
	kind := "not a regular file"
	switch {
	case m.IsDir():
		kind = "a directory"
	case m&fs.ModeNamedPipe != 0:
		kind = "a named pipe (FIFO)"
	case m&fs.ModeDevice != 0:
		kind = "a device"
	case m&fs.ModeSocket != 0:
		kind = "a socket"
	}
	return fileError(fmt.Sprintf("%s is %s: name a workflow file", core.Quote(path), kind))
}

// tooBig refuses the file at path, of size bytes, past MaxSize in all.
func (f *files) tooBig(path, size string) error {
	if f.bytes == 0 {
		return fileError(fmt.Sprintf("%s is %s bytes, at most %d: split the workflow, or shorten its commands and lists", core.Quote(path), size, MaxSize))
	}
	return fileError(fmt.Sprintf("%s is %s bytes, and the workflow files read before it %d: a workflow's files are at most %d bytes in all, its child workflows' included: shorten them",
		core.Quote(path), size, f.bytes, MaxSize))
}

// quotePath quotes the path an OS error names (core.Quote), keeping the
// error it wraps.
func quotePath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s %s: %w", pe.Op, core.Quote(pe.Path), pe.Err)
	}
	return err
}

// ParseFile reads the workflow at path and every child workflow file it
// names (SPEC §2), each once, and returns the run with each child embedded,
// and the definition Inline renders of it.
func ParseFile(path string) (core.RunSpec, []byte, error) {
	return parseFiles(path, func(p string) (fs.File, error) { return os.Open(p) })
}

func parseFiles(path string, open func(string) (fs.File, error)) (core.RunSpec, []byte, error) {
	path = filepath.Clean(path)
	f := &files{open: open, read: map[string]*file{}, subs: map[*yaml.Node]*yaml.Node{}}
	src, err := f.readFile(path)
	var fe fileError
	if errors.As(err, &fe) {
		return core.RunSpec{}, nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	} else if err != nil {
		return core.RunSpec{}, nil, err
	}
	spec, root, err := parse(path, src, f)
	if err != nil {
		return core.RunSpec{}, nil, err
	}
	inline(root, f.subs)
	out, err := yaml.Marshal(root)
	if err != nil {
		return core.RunSpec{}, nil, fmt.Errorf("%w: %s: %v", ErrInvalid, posName(path), err)
	}
	if len(out) > MaxSize {
		return core.RunSpec{}, nil, fmt.Errorf("%w: %s: with its child workflows inlined the definition is %d bytes, at most %d", ErrInvalid, posName(path), len(out), MaxSize)
	}
	return spec, out, nil
}

// inline replaces, below n, each step's `workflow: FILE` with that file's
// mapping (subs), itself inlined. The files were parsed and checked already
// (no cycle, bounded depth), and each was read once: nothing is read here.
func inline(n *yaml.Node, subs map[*yaml.Node]*yaml.Node) {
	for i, c := range n.Content {
		if m, ok := subs[c]; ok {
			n.Content[i], c = m, m
		}
		inline(c, subs)
	}
}
