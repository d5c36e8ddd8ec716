package core

import (
	"errors"
	"fmt"
	"strconv"
	"unicode"
	"unicode/utf8"
)

// ErrBadName is returned (wrapped, with the name's kind and the reason) when
// a name given at input — a worker, token, step, tag or label — is empty,
// longer than MaxNameLength bytes, not UTF-8, or holds a character that is
// not printable (SPEC §12). Names are printed by the CLI and written to logs;
// refusing control characters at input means no stored name can move a
// terminal's cursor or forge a log line.
var ErrBadName = errors.New("bad name")

// CheckName checks one name of the given kind ("worker name", "token name",
// …). It allows printable characters and the ASCII space; callers that also
// forbid spaces or separators check those themselves.
func CheckName(kind, s string) error {
	switch {
	case s == "":
		return fmt.Errorf("%w: %s is empty", ErrBadName, kind)
	case len(s) > MaxNameLength:
		return fmt.Errorf("%w: %s is %d bytes, at most %d", ErrBadName, kind, len(s), MaxNameLength)
	case !utf8.ValidString(s):
		return fmt.Errorf("%w: %s %s is not valid UTF-8", ErrBadName, kind, Quote(s))
	}
	for i, r := range s {
		if r != ' ' && !unicode.IsPrint(r) {
			return fmt.Errorf("%w: %s %s has a non-printable character %U at byte %d", ErrBadName, kind, Quote(s), r, i)
		}
	}
	return nil
}

// Quote renders s for a message: quoted, printable characters as they are,
// everything else escaped (strconv.Quote: what unicode.IsPrint refuses,
// such as U+00A0, is escaped too), and at most
// MaxNameLength bytes of it.
func Quote(s string) string {
	if len(s) > MaxNameLength {
		s = s[:MaxNameLength] + "…"
	}
	return strconv.Quote(s)
}
