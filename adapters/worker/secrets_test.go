package worker

import (
	"slices"
	"testing"
)

// TestRedaction: every value of at least MinRedact bytes, and every such
// line of a multi-line value, becomes *** wherever it appears in a line; a
// value containing another is replaced whole; shorter values are left.
func TestRedaction(t *testing.T) {
	s := &stepSecrets{redact: redactions([][]byte{
		[]byte("abcd"),     // inside the next one: replaced whole there
		[]byte("abcdefgh"), //
		[]byte("xyz"),      // under MinRedact: left
		[]byte("-----BEGIN KEY-----\nMIIEpAIBAAKCAQEA\r\n-----END KEY-----\n"),
	})}
	got := s.redactLines([]string{
		"token=abcdefgh and abcd",
		"xyz stays",
		"MIIEpAIBAAKCAQEA",
		"-----BEGIN KEY-----",
		"nothing here",
	})
	want := []string{"token=*** and ***", "xyz stays", "***", "***", "nothing here"}
	if !slices.Equal(got, want) {
		t.Fatalf("redacted:\n%q\nwant:\n%q", got, want)
	}
	var none *stepSecrets
	if got := none.redactLines([]string{"abcd"}); got[0] != "abcd" {
		t.Fatalf("no secrets changed a line: %q", got)
	}
	if env := (&stepSecrets{dir: "/d", env: []string{"A=x=y"}}).environ(); env[EnvSecretsDir] != "/d" || env["A"] != "x=y" {
		t.Fatalf("environ: %v", env)
	}
}
