package workflow

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/tether-run/tether/core"
)

// twoDocuments refuses a file holding more than one YAML document (SPEC §2:
// a workflow file holds one).
const twoDocuments = "more than one YAML document; a file holds one workflow: remove the `---` and what follows, or submit it as its own file"

// document decodes src, which must hold one YAML document, and returns its
// root node; nil when there is nothing to read (a syntax error, an empty
// file, an alias). Each problem is reported at its line, in p's file: the
// top file and a child file alike.
func (p *parser) document(src []byte) *yaml.Node {
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(src))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			p.errAt(1, 1, "the file holds no workflow (it is empty, or only comments): write a mapping with `steps:`, a list of steps each with a `name` and a `run` command")
			return nil
		}
		line, col, msg := syntaxError(src, err)
		p.errAt(line, col, "%s", msg)
		return nil
	}
	if len(doc.Content) == 0 {
		p.errf(&doc, "empty document: write a mapping with `steps:`")
		return nil
	}
	root := doc.Content[0]
	// A second document is refused whether it parses or not.
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case err == nil:
		p.errf(&extra, "%s", twoDocuments)
	case !errors.Is(err, io.EOF):
		if line := secondDocument(src, root.Line); line > 0 {
			p.errAt(line, 1, "%s", twoDocuments)
		} else {
			line, col, msg := syntaxError(src, err)
			p.errAt(line, col, "%s", msg)
		}
	}
	if !p.noAliases(root) {
		return nil
	}
	return root
}

// secondDocument is the line (1-based) of the first document marker (---
// or ...) below line from, 0 if there is none.
func secondDocument(src []byte, from int) int {
	for i, l := range strings.Split(string(src), "\n") {
		if i+1 <= from {
			continue
		}
		for _, m := range []string{"---", "..."} {
			if rest, ok := strings.CutPrefix(strings.TrimRight(l, "\r"), m); ok && (rest == "" || rest[0] == ' ' || rest[0] == '\t') {
				return i + 1
			}
		}
	}
	return 0
}

// noAliases reports each YAML alias (*a) at its line, and each anchor (&a)
// no alias names at its own, and whether there were none. They are not
// supported: a value is written where it applies, so that an error about it
// names its line.
func (p *parser) noAliases(root *yaml.Node) bool {
	errs := len(p.errs) + p.more
	aliased := map[*yaml.Node]bool{}
	var anchors []*yaml.Node
	var walk func(n *yaml.Node)
	walk = func(n *yaml.Node) {
		if n.Anchor != "" {
			anchors = append(anchors, n)
		}
		if n.Kind == yaml.AliasNode {
			at := ""
			if n.Alias != nil {
				aliased[n.Alias] = true
				at = fmt.Sprintf(" (its anchor is at line %d)", n.Alias.Line)
			}
			p.errf(n, "alias %s: YAML aliases and anchors are not supported: write the value out where it is used%s", core.Quote("*"+n.Value), at)
			return
		}
		for _, c := range n.Content {
			walk(c)
		}
	}
	walk(root)
	for _, a := range anchors {
		if !aliased[a] {
			p.errf(a, "anchor %s: YAML anchors and aliases are not supported: remove it", core.Quote("&"+a.Anchor))
		}
	}
	return len(p.errs)+p.more == errs
}

// yamlErrRE reads the YAML library's syntax errors: "yaml: line N: problem".
var yamlErrRE = regexp.MustCompile(`^yaml: (?:line (\d+): )?(.*)$`)

// syntaxError turns a YAML syntax error into a position (1-based line and
// column; 0 when it is not known, and the message says so) and a message
// that says what to change.
//
// The library reports only a line, and not always the same one: a parser
// error ("did not find expected …") names the line before the construct it
// was parsing (its marks count from 0 there), a scanner error the line of
// the problem, or of the construct a tab breaks. So the line is corrected by
// the kind of problem, and the column found on that line: the tab, the
// second ':', the unclosed quote or bracket, or the first character.
func syntaxError(src []byte, err error) (line, col int, msg string) {
	m := yamlErrRE.FindStringSubmatch(err.Error())
	if m == nil {
		return 0, 0, "YAML syntax: " + err.Error() + noLine
	}
	problem := m[2]
	if m[1] == "" {
		return placeless(src, problem)
	}
	line, _ = strconv.Atoi(m[1])
	lines := strings.Split(string(src), "\n")
	parserErr := strings.HasPrefix(problem, "did not find expected")
	if parserErr {
		line++ // counted from 0 by the library
	}
	line = min(max(line, 1), len(lines))
	at := func(l int) string { return lines[l-1] }
	firstChar := func(l int) int { return len(at(l)) - len(strings.TrimLeft(at(l), " \t")) + 1 }
	col = firstChar(line)
	hint := ""
	switch {
	case strings.Contains(problem, "tab character"):
		// The library names the line before the tab's, or the tab's own.
		for l := line; l <= len(lines); l++ {
			if i := strings.IndexByte(at(l), '\t'); i >= 0 && strings.TrimLeft(at(l)[:i], " ") == "" {
				line, col = l, i+1
				break
			}
		}
		hint = "indent with spaces, not tabs"
	case strings.Contains(problem, "mapping values are not allowed"):
		// "run: echo: hi": the second ": " is the problem.
		if i := strings.Index(at(line), ": "); i >= 0 {
			if j := strings.Index(at(line)[i+2:], ": "); j >= 0 {
				col = i + 2 + j + 1
			}
		}
		hint = "a value that holds \": \" must be quoted (run: \"echo: hi\"), or the line is indented too deep"
	case strings.Contains(problem, "found unexpected end of stream") || strings.Contains(problem, "found unexpected end of line"):
		if i := strings.LastIndexAny(at(line), `"'`); i >= 0 {
			col = i + 1
		}
		hint = "a quoted string is not closed: add the closing quote"
	case strings.Contains(problem, "did not find expected ',' or ']'") || strings.Contains(problem, "did not find expected ',' or '}'") ||
		(problem == "did not find expected node content" && bytes.ContainsAny(src, "[{")):
		open := byte('[')
		if strings.Contains(problem, "'}'") {
			open = '{'
		}
		// The opening bracket: on the line named, or the nearest above.
		for l := line; l >= 1; l-- {
			if i := strings.LastIndexByte(at(l), open); i >= 0 {
				line, col = l, i+1
				break
			}
		}
		hint = "a flow list [ … ] or mapping { … } is not closed, or lacks a ',' between its entries"
	case strings.Contains(problem, "did not find expected '-' indicator") || strings.Contains(problem, "did not find expected key"):
		// The library names the list or mapping; the line to change is the
		// first one below it that is indented less than the construct's
		// entries (or further) but is not one of them.
		if l, c, ok := misindented(lines, line); ok {
			line, col = l, c
		}
		hint = "this line is indented differently from the entries above it: align it with them"
	case strings.Contains(problem, "could not find expected ':'"):
		hint = "a mapping entry needs \"key: value\"; add the ':' or quote the line"
	}
	msg = "YAML syntax: " + problem
	if hint != "" {
		msg += ": " + hint
	}
	return line, col, msg
}

// misindented finds the first line after line `from` (1-based) whose
// indentation differs from the entries of the block opened at `from`.
func misindented(lines []string, from int) (line, col int, ok bool) {
	indent := func(s string) int { return len(s) - len(strings.TrimLeft(s, " ")) }
	blank := func(s string) bool { t := strings.TrimSpace(s); return t == "" || strings.HasPrefix(t, "#") }
	base := lines[from-1]
	entry := indent(base)
	content := entry
	if t := base[entry:]; strings.HasPrefix(t, "- ") {
		content = entry + 2 + indent(t[2:])
	}
	for l := from + 1; l <= len(lines); l++ {
		s := lines[l-1]
		if blank(s) {
			continue
		}
		i := indent(s)
		if i == entry && (content == entry || strings.HasPrefix(s[i:], "-")) || i >= content {
			continue // another entry, or inside one
		}
		return l, i + 1, true
	}
	return 0, 0, false
}

// noLine ends the message of an error whose line is not known.
const noLine = " (the YAML library names no line for it)"

// placeless places a problem the YAML library names no line for: a
// character YAML refuses (found by reading src as the library does), an
// alias of no anchor (its first *name in src). When it cannot, the line is
// 0 and the message says it is not known.
func placeless(src []byte, problem string) (line, col int, msg string) {
	msg = "YAML syntax: " + problem
	off := -1
	switch {
	case strings.Contains(problem, "control characters") || strings.Contains(problem, "UTF-8"):
		var what string
		if off, what = badChar(src); off >= 0 {
			msg += ": " + what
		}
	case strings.HasPrefix(problem, "unknown anchor '"):
		name := strings.TrimSuffix(strings.TrimPrefix(problem, "unknown anchor '"), "' referenced")
		msg = fmt.Sprintf("YAML syntax: alias %s names no anchor: YAML aliases and anchors are not supported: write the value out where it is used", core.Quote("*"+name))
		if loc := regexp.MustCompile(`(?:^|[\s\[{,])(\*` + regexp.QuoteMeta(name) + `)(?:[\s,\]}]|$)`).FindSubmatchIndex(src); loc != nil {
			off = loc[2]
		}
	}
	if off < 0 {
		return 0, 0, msg + noLine
	}
	start := bytes.LastIndexByte(src[:off], '\n') + 1
	return 1 + bytes.Count(src[:off], []byte("\n")), 1 + utf8.RuneCount(src[start:off]), msg
}

// badChar finds the first character the YAML library refuses: a byte that
// is not UTF-8, or a control character (YAML allows tab, LF, CR, U+0085 and
// the printable ranges). It returns its offset and what to do, or -1 (and
// for a UTF-16 file, which the library decodes first, always -1).
func badChar(src []byte) (int, string) {
	if bytes.HasPrefix(src, []byte{0xFE, 0xFF}) || bytes.HasPrefix(src, []byte{0xFF, 0xFE}) {
		return -1, ""
	}
	for i := 0; i < len(src); {
		r, w := utf8.DecodeRune(src[i:])
		switch {
		case r == utf8.RuneError && w <= 1:
			return i, fmt.Sprintf("byte 0x%02X here is not UTF-8: save the file as UTF-8", src[i])
		case r == 0x09 || r == 0x0A || r == 0x0D || r == 0x85,
			r >= 0x20 && r <= 0x7E, r >= 0xA0 && r <= 0xD7FF, r >= 0xE000 && r <= 0xFFFD, r >= 0x10000:
		default:
			return i, fmt.Sprintf("%U here: remove it, or write it as an escape in a double-quoted string (\"\\u%04X\")", r, r)
		}
		i += w
	}
	return -1, ""
}
