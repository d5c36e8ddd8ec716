package workflow

import (
	"bytes"
	"regexp"
	"strconv"
	"strings"
)

// yamlErrRE reads the YAML library's syntax errors: "yaml: line N: problem".
var yamlErrRE = regexp.MustCompile(`^yaml: (?:line (\d+): )?(.*)$`)

// syntaxError turns a YAML syntax error into a position (1-based line and
// column) and a message that says what to change.
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
		return 1, 1, "YAML syntax: " + err.Error()
	}
	problem := m[2]
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
