package main

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The CLI prints what the orchestrator answers: names, states, messages.
// Names given at input are printable (SPEC §12), but a store written by an
// older orchestrator may hold anything, and a message may quote a step's
// output. Nothing the CLI prints in a table or a line may hold a character
// that moves the terminal's cursor, recolours it, clears it or forges a
// line, so every such string passes through cell or escapeText. A step's own
// log lines (run logs, data get) are printed as the step wrote them.

// printable reports whether s is valid UTF-8 of printable characters and
// ASCII spaces only (core.CheckName's rule, without the length).
func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r != ' ' && !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// cell renders a name for a table cell or a line: a printable name as it
// is, anything else quoted with Go escapes ("w\x1b[2J"), so the reader sees
// that it was escaped.
func cell(s string) string {
	if printable(s) {
		return s
	}
	return strconv.Quote(s)
}

// escapeText renders a message: printable characters as they are, every
// other character escaped in place (\x1b, \r, \u202e, an invalid byte as
// \xff), without quotes. Newlines are kept when keepNewlines is set (an
// error that lists one problem per line), else escaped too.
func escapeText(s string, keepNewlines bool) string {
	if printable(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			b.WriteString(`\x` + strconv.FormatUint(uint64(s[i])|0x100, 16)[1:])
		case r == ' ' || unicode.IsPrint(r) || (r == '\n' && keepNewlines):
			b.WriteString(s[i : i+n])
		default:
			q := strconv.QuoteRuneToGraphic(r)
			b.WriteString(q[1 : len(q)-1])
		}
		i += n
	}
	return b.String()
}
