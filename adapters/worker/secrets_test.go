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
	dc, err := NewDataClient(secretsServer(t), nil, func() string { return "cred" })
	if err != nil {
		t.Fatal(err)
	}
	defer func(old string) { shmDir = old }(shmDir)
	c := core.ExecCommand{Lease: 7, Step: "s", Secrets: []string{"API_KEY"}}

	// A usable shm: the directory is under it, nothing is logged.
	shmDir = t.TempDir()
	rec := &levelRecorder{}
	sec, err := fetchSecrets(t.Context(), dc, c, "tether-secrets-", slog.New(rec))
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
	sec, err = fetchSecrets(t.Context(), dc, c, "tether-secrets-", slog.New(rec))
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

// secretsServer answers GET /secret/NAME with "value-of-NAME".
func secretsServer(t *testing.T) string {
	return h2cServer(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "value-of-"+strings.TrimPrefix(r.URL.Path, "/secret/"))
	})
}

// h2cServer serves h as the data plane does (HTTP/1.1 and cleartext
// HTTP/2) until the test ends, and returns its URL.
func h2cServer(t *testing.T, h http.HandlerFunc) string {
	srv := httptest.NewUnstartedServer(h)
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL
}

// A secret handed over as an environment variable never replaces one the
// worker sets: a name on the denylist a step's env: gets (SPEC §8: PATH,
// TETHER_*, …) is left out, with a warning. (Planted: secrets_as: env was
// laid over last, so a secret named PATH or TETHER_OUTPUT_DIR won.)
func TestSecretsAsEnvDenylist(t *testing.T) {
	dc, err := NewDataClient(secretsServer(t), nil, func() string { return "cred" })
	if err != nil {
		t.Fatal(err)
	}
	rec := &levelRecorder{}
	c := core.ExecCommand{Lease: 7, Step: "s", SecretsAs: core.SecretsAsEnv, Secrets: []string{"PATH", "TETHER_OUTPUT_DIR", "API_KEY"}}
	sec, err := fetchSecrets(t.Context(), dc, c, "tether-secrets-", slog.New(rec))
	if err != nil {
		t.Fatal(err)
	}
	env := overlay([]string{"PATH=/bin"}, map[string]string{EnvOutputDir: "/out"}, sec.environ())
	if want := []string{"API_KEY=value-of-API_KEY", "PATH=/bin", "TETHER_OUTPUT_DIR=/out"}; !slices.Equal(env, want) {
		t.Errorf("environment %q, want %q", env, want)
	}
	if r, ok := rec.find("not set in the step's environment"); !ok || r.Level != slog.LevelWarn {
		t.Errorf("no warning for the secrets left out: %v", rec.records)
	}
	if got := sec.redactLines([]string{"value-of-PATH"}); got[0] != Redacted {
		t.Errorf("a secret left out of the environment is not redacted: %q", got)
	}
}

// A worker started again removes the secrets directories a process of it
// killed with SIGKILL left under /dev/shm (it could not remove them), and
// no other worker's: the directories are named after the work directory.
// (Planted: they were left for ever.)
func TestSecretsDirsSweptAtStart(t *testing.T) {
	defer func(old string) { shmDir = old }(shmDir)
	shmDir = t.TempDir()
	work, otherWork := t.TempDir(), t.TempDir()
	d, err := New(Options{URL: "ws://unused", DataURL: secretsServer(t), WorkDir: work})
	if err != nil {
		t.Fatal(err)
	}
	cred := "w.cred"
	d.cred.Store(&cred)
	if err := d.openWorkDir(); err != nil { // as Run does first
		t.Fatal(err)
	}
	// A process of this worker fetches a step's secrets, then is killed.
	if d.secretsReady(core.ExecCommand{Lease: 1, Step: "s", Secrets: []string{"API_KEY"}}) {
		t.Fatal("no fetch started")
	}
	in := (<-d.inputs).(secretsFetched)
	close(d.done)
	d.wg.Wait()
	if in.err != nil {
		t.Fatal(in.err)
	}
	left := in.sec.dir
	if filepath.Dir(left) != shmDir {
		t.Fatalf("secrets directory %s, want one under %s", left, shmDir)
	}
	os.Chmod(left, 0o500) // a step may do as much
	others := []string{
		filepath.Join(shmDir, secretsDirPrefix(otherWork)+"1"), // another worker's
		filepath.Join(shmDir, "tether-secrets-2"),              // named otherwise
	}
	for _, o := range others {
		if err := os.Mkdir(o, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	link := filepath.Join(shmDir, secretsDirPrefix(work)+"link") // not a directory of its own
	if err := os.Symlink(others[0], link); err != nil {
		t.Fatal(err)
	}

	d2, err := New(Options{URL: "ws://unused", WorkDir: work})
	if err != nil {
		t.Fatal(err)
	}
	if err := d2.openWorkDir(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(left); !os.IsNotExist(err) {
		t.Errorf("the secrets directory a killed process left is still there: %v", err)
	}
	for _, o := range append(others, link) {
		if _, err := os.Lstat(o); err != nil {
			t.Errorf("%s was removed: %v", o, err)
		}
	}
}
