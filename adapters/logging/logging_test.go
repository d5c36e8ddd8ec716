package logging

import (
	"bytes"
	"strings"
	"testing"
	"unicode"
)

// Both binaries print names and messages only through this logger (SPEC §12):
// a worker or step name, a close reason or a refusal that holds control
// characters (a store from before names were checked, a hostile
// peer) comes out escaped in both formats, never raw.
func TestLoggerEscapesControlCharacters(t *testing.T) {
	for _, format := range []string{"text", "json"} {
		var buf bytes.Buffer
		log, err := New(&buf, format, "info")
		if err != nil {
			t.Fatal(err)
		}
		log.Warn("refused: token \x1b[2J\r\n", "name", "w\x1b]0;pwned\x07", "reason", "nul\x00 cr\r")
		out := strings.TrimSuffix(buf.String(), "\n")
		if strings.ContainsFunc(out, func(r rune) bool { return r != ' ' && !unicode.IsPrint(r) }) {
			t.Errorf("%s: a raw control character in %q", format, out)
		}
	}
}
