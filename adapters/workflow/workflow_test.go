package workflow

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

func TestParseGood(t *testing.T) {
	src, err := os.ReadFile("testdata/good.yaml")
	if err != nil {
		t.Fatal(err)
	}
	spec, err := Parse("good.yaml", src)
	if err != nil {
		t.Fatal(err)
	}
	if spec.Name != "release" || spec.Timeout != time.Hour || spec.Env["CHANNEL"] != "stable" || len(spec.Steps) != 4 {
		t.Fatalf("run fields wrong: %+v", spec)
	}
	b := spec.Steps[1]
	if b.Concurrency != 2 || len(b.ForEach) != 3 || b.Timeout != 10*time.Minute || b.DependsOn[0] != "fetch" || b.Tags[0] != "docker" {
		t.Fatalf("build step wrong: %+v", b)
	}
	p := spec.Steps[2]
	if !p.Writes || !p.Hold || p.HoldExpiry != 2*time.Hour || p.DependsOn[0] != "build" {
		t.Fatalf("publish step wrong: %+v", p)
	}
	if spec.Steps[3].Wait != 30*time.Second {
		t.Fatalf("lint wait wrong: %v", spec.Steps[3].Wait)
	}
}

// TestParseErrors: every bad definition gets an error naming the line.
func TestParseErrors(t *testing.T) {
	cases := []struct{ name, src, want string }{
		{"unknown field", "steps:\n  - name: a\n    run: x\n    retries: 3\n", `x.yaml:4: step "a": unknown field "retries"`},
		{"unknown run field", "name: r\nstpes: []\n", `x.yaml:2: workflow: unknown field "stpes"`},
		{"no steps", "name: r\n", "workflow has no steps"},
		{"missing command", "steps:\n  - name: a\n", `x.yaml:2: step "a" has no run command`},
		{"missing name", "steps:\n  - run: x\n", "x.yaml:2: step 1 has no name"},
		{"unknown dependency", "steps:\n  - name: a\n    run: x\n    depends_on: [b]\n", `x.yaml:2: step "a" depends on unknown step "b"`},
		{"cycle", "steps:\n  - name: a\n    run: x\n    depends_on: [b]\n  - name: b\n    run: y\n    depends_on: [a]\n", "dependency cycle: a -> b -> a"},
		{"bad duration", "steps:\n  - name: a\n    run: x\n    timeout: soon\n", `x.yaml:4: step "a": timeout: "soon" is not a duration`},
		{"bad bool", "steps:\n  - name: a\n    run: x\n    writes: maybe\n", `x.yaml:4: step "a": writes must be true or false`},
		{"duplicate step", "steps:\n  - name: a\n    run: x\n  - name: a\n    run: y\n", `x.yaml:4: step "a" is declared twice (first at line 2)`},
		{"syntax", "steps: [\n", "x.yaml: yaml:"},
		{"steps not a list", "steps: a\n", "x.yaml:1: steps must be a list"},
		{"two documents", "steps:\n  - name: a\n    run: x\n---\nsteps: []\n", "more than one YAML document"},
		{"bad concurrency", "steps:\n  - name: a\n    run: x\n    forEach: [1]\n    concurrency: lots\n", "concurrency must be a whole number"},
	}
	for _, c := range cases {
		_, err := Parse("x.yaml", []byte(c.src))
		if err == nil {
			t.Errorf("%s: accepted", c.name)
			continue
		}
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: error is not ErrInvalid: %v", c.name, err)
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %q lacks %q", c.name, err, c.want)
		}
	}
}

func TestParseOversize(t *testing.T) {
	if _, err := Parse("big.yaml", make([]byte, MaxSize+1)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("oversize definition: %v", err)
	}
}

// TestParseNames: a name with a control character (YAML escapes in double
// quotes) is refused at its line, naming the field, the character escaped
// (SPEC §12).
func TestParseNames(t *testing.T) {
	cases := []struct{ name, src, want string }{
		{"run name", "name: \"nightly\\e]0;x\\a\"\nsteps:\n  - name: a\n    run: x\n",
			`x.yaml:1: run name "nightly\x1b]0;x\a" has a non-printable character U+001B at byte 7`},
		{"step name", "steps:\n  - name: ok\n    run: x\n  - name: \"b\\ec\"\n    run: y\n",
			`x.yaml:4: step name "b\x1bc" has a non-printable character U+001B at byte 1`},
		{"step name NUL", "steps:\n  - name: \"b\\0\"\n    run: y\n", `x.yaml:2: step name "b\x00" has a non-printable character U+0000`},
		{"tag", "steps:\n  - name: a\n    run: x\n    tags: [script, \"gpu\\r\"]\n", `x.yaml:4: tag "gpu\r" has a non-printable character U+000D at byte 3`},
		{"label key", "steps:\n  - name: a\n    run: x\n    labels:\n      \"z\\none\": eu\n", `x.yaml:5: label key "z\none" has a non-printable character U+000A`},
		{"label value", "steps:\n  - name: a\n    run: x\n    labels:\n      zone: \"eu\\e[31m\"\n", `x.yaml:5: label value "eu\x1b[31m" has a non-printable character U+001B`},
		{"target", "steps:\n  - name: a\n    run: x\n    target: \"w\\x01\"\n", `x.yaml:4: target "w\x01" has a non-printable character U+0001`},
		{"platform", "steps:\n  - name: a\n    run: x\n    platform: \"linux\\x7f\"\n", `x.yaml:4: platform "linux\x7f" has a non-printable character U+007F`},
	}
	for _, c := range cases {
		_, err := Parse("x.yaml", []byte(c.src))
		if err == nil {
			t.Errorf("%s: accepted", c.name)
			continue
		}
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %q lacks %q", c.name, err, c.want)
		}
	}
	// Printable names in any script, spaces in a run name, are fine.
	if _, err := Parse("x.yaml", []byte("name: nächtlicher Lauf\nsteps:\n  - name: bau\n    run: x\n    tags: [gpu]\n    labels: {zone: eu}\n")); err != nil {
		t.Errorf("printable names refused: %v", err)
	}
}
