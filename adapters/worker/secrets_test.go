package worker

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tether-run/tether/core"
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

// A step's secrets directory is made under /dev/shm (SPEC §14a: never on a
// disk); when that cannot be done, the step still gets its secrets, in a
// directory of the system's temp dir, and the worker says so with a
// warning naming that directory and the error. (Planted: the fallback was
// silent.)
func TestSecretsDirFallbackIsLogged(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "value-of-"+strings.TrimPrefix(r.URL.Path, "/secret/"))
	}))
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	defer srv.Close()
	dc, err := NewDataClient(srv.URL, nil, func() string { return "cred" })
	if err != nil {
		t.Fatal(err)
	}
	defer func(old string) { shmDir = old }(shmDir)
	c := core.ExecCommand{Lease: 7, Step: "s", Secrets: []string{"API_KEY"}}

	// A usable shm: the directory is under it, nothing is logged.
	shmDir = t.TempDir()
	rec := &levelRecorder{}
	sec, err := fetchSecrets(t.Context(), dc, c, slog.New(rec))
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(sec.dir) != shmDir || len(rec.records) != 0 {
		t.Errorf("a writable shm: directory %s, %d log records; want one under %s, none", sec.dir, len(rec.records), shmDir)
	}
	sec.remove()

	// An shm no directory can be made in: the step gets its secrets
	// elsewhere, and a warning says where and why.
	shmDir = t.TempDir()
	os.Chmod(shmDir, 0o500)
	if os.Geteuid() == 0 { // root writes there anyway; procfs refuses anyone a new directory
		shmDir = "/proc"
		if fi, err := os.Stat(shmDir); err != nil || !fi.IsDir() {
			t.Skip("running as root without /proc: no directory refuses a new one")
		}
	}
	rec = &levelRecorder{}
	sec, err = fetchSecrets(t.Context(), dc, c, slog.New(rec))
	if err != nil {
		t.Fatalf("an unusable shm failed the step: %v", err)
	}
	defer sec.remove()
	if v, err := os.ReadFile(filepath.Join(sec.dir, "API_KEY")); err != nil || string(v) != "value-of-API_KEY" {
		t.Errorf("the secret's file: %q, %v", v, err)
	}
	r, ok := rec.find("on disk")
	if !ok || r.Level != slog.LevelWarn {
		t.Fatalf("no warning that the secrets directory is on disk: %v", rec.records)
	}
	attrs := map[string]string{}
	r.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.String(); return true })
	if attrs["dir"] != sec.dir || attrs["err"] == "" || !strings.Contains(r.Message, shmDir) {
		t.Errorf("the warning %q %v does not name the directory %s, %s and the error", r.Message, attrs, sec.dir, shmDir)
	}
}
