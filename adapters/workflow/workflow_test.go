package workflow

import (
	"errors"
	"fmt"
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
	if g := spec.Group; g.Name != "release" || g.Max != 1 || !g.CancelInProgress {
		t.Fatalf("run concurrency wrong: %+v", g)
	}
	if g := spec.Steps[2].Group; g.Name != "registry" || g.Max != 2 {
		t.Fatalf("publish step group wrong: %+v", g)
	}
	if spec.Steps[3].Wait != 30*time.Second {
		t.Fatalf("lint wait wrong: %v", spec.Steps[3].Wait)
	}
}

// TestParseErrors: every bad definition gets one error naming
// file:line:column and what to change; the messages are golden (SPEC §2).
func TestParseErrors(t *testing.T) {
	const known = "(known: name, run, depends_on, writes, type, runner, tags, labels, target, platform, timeout, env, forEach, concurrency, hold, hold_expiry, wait, outputs, retry, idempotent, secrets, secrets_as, put_secrets, workflow, with)"
	cases := []struct{ name, src, want string }{
		{"unknown field", "steps:\n  - name: a\n    run: x\n    retries: 3\n", `x.yaml:4:5: step "a": unknown field "retries" ` + known},
		{"unknown run field", "name: r\nstpes: []\n", `x.yaml:2:1: workflow: unknown field "stpes" (known: name, timeout, env, steps, concurrency)`},
		{"no steps", "name: r\n", "x.yaml:1:1: workflow has no steps"},
		{"missing command", "steps:\n  - name: a\n", `x.yaml:2:5: step "a" has no run command`},
		{"missing name", "steps:\n  - run: x\n", "x.yaml:2:5: step 1 has no name"},
		{"unknown dependency", "steps:\n  - name: a\n    run: x\n    depends_on: [b]\n", `x.yaml:2:5: step "a" depends on unknown step "b": fix the name or remove it from depends_on (steps: "a")`},
		{"cycle", "steps:\n  - name: a\n    run: x\n    depends_on: [c]\n  - name: b\n    run: y\n    depends_on: [a]\n  - name: c\n    run: z\n    depends_on: [b]\n",
			`x.yaml:2:5: dependency cycle: "a" (line 2) -> "c" (line 8) -> "b" (line 5) -> "a" (line 2), each depending on the next: remove one of these depends_on entries`},
		{"bad duration", "steps:\n  - name: a\n    run: x\n    timeout: soon\n", `x.yaml:4:14: step "a": timeout: "soon" is not a duration like 90s, 5m or 1h`},
		{"bad bool", "steps:\n  - name: a\n    run: x\n    writes: maybe\n", `x.yaml:4:13: step "a": writes must be true or false, not "maybe"`},
		{"duplicate step", "steps:\n  - name: a\n    run: x\n  - name: a\n    run: y\n", `x.yaml:4:5: step "a" is declared twice (first at line 2): rename one`},
		{"steps not a list", "steps: a\n", "x.yaml:1:8: steps must be a list"},
		{"two documents", "steps:\n  - name: a\n    run: x\n---\nsteps: []\n", "x.yaml:4:1: more than one YAML document; a file holds one workflow: remove the `---` and what follows, or submit it as its own file"},
		{"bad concurrency", "steps:\n  - name: a\n    run: x\n    forEach: [1]\n    concurrency: lots\n", `x.yaml:5:18: step "a": concurrency must be an integer (the forEach cap) or a mapping {group: NAME, max: N} (a step group, SPEC §8a)`},
		{"run concurrency not a mapping", "concurrency: 2\nsteps:\n  - name: a\n    run: x\n", `x.yaml:1:14: concurrency on a workflow must be a mapping {group: NAME, max: N, cancel_in_progress: BOOL} (SPEC §8a)`},
		{"group without name", "concurrency: {max: 2}\nsteps:\n  - name: a\n    run: x\n", `x.yaml:1:14: concurrency: a concurrency mapping needs group: NAME`},
		{"group unknown field", "concurrency: {group: g, limit: 2}\nsteps:\n  - name: a\n    run: x\n", `x.yaml:1:25: concurrency: unknown field "limit" (known: group, max, cancel_in_progress)`},
		{"step cancel_in_progress", "steps:\n  - name: a\n    run: x\n    concurrency: {group: g, cancel_in_progress: true}\n", `x.yaml:4:29: step "a": concurrency: cancel_in_progress applies only to the workflow's concurrency (a step group queues)`},
		{"group max", "concurrency: {group: g, max: -1}\nsteps:\n  - name: a\n    run: x\n", `x.yaml:1:30: concurrency: max -1 is not in 0..10000 (0 means 1)`},
		{"retry on writes", "steps:\n  - name: w\n    run: x\n    writes: true\n    retry: {attempts: 2}\n",
			`x.yaml:5:5: step "w": retry on a write-bearing step needs idempotent: true (every write it makes may be made again); without it a started write-bearing step never runs twice: add ` + "`idempotent: true`" + ` if running the step again is safe, or remove ` + "`retry:`"},
		{"retry attempts", "steps:\n  - name: a\n    run: x\n    retry:\n      attempts: 21\n", `x.yaml:4:5: step "a": retry attempts 21 out of range 1..20`},
		{"retry without attempts", "steps:\n  - name: a\n    run: x\n    retry: {backoff: 5s}\n", `x.yaml:4:12: step "a": retry has no attempts: say how many times to run the step again, e.g. attempts: 3`},
		{"retry on", "steps:\n  - name: a\n    run: x\n    retry: {attempts: 1, on: [3, never]}\n", `x.yaml:4:34: step "a": retry: on: "never" is neither an exit code (1-255) nor timeout`},
		{"retry exit code", "steps:\n  - name: a\n    run: x\n    retry: {attempts: 1, on: 256}\n", `x.yaml:4:5: step "a": retry on exit code 256: want 1..255`},
		{"empty file", "", "x.yaml:1:1: the file holds no workflow (it is empty, or only comments): write a mapping with `steps:`, a list of steps each with a `name` and a `run` command"},
		{"only comments", "  \n# nothing\n", "x.yaml:1:1: the file holds no workflow (it is empty, or only comments): write a mapping with `steps:`, a list of steps each with a `name` and a `run` command"},
		{"core limit", "steps:\n  - name: a\n    run: x\n    forEach: [" + strings.Repeat("i,", 1000) + "i]\n",
			`x.yaml:2:5: step "a": forEach has 1001 items, at most 1000`},
		// The core's error names a step: at that step's line, not the first's.
		{"core limit of another step", "steps:\n  - name: a\n    run: x\n  - name: b\n    run: y\n    forEach: [" + strings.Repeat("i,", 1000) + "i]\n",
			`x.yaml:4:5: step "b": forEach has 1001 items, at most 1000`},
		{"core error of another step", "steps:\n  - name: a\n    run: x\n  - name: b\n    run: y\n    hold: true\n    wait: 5s\n",
			`x.yaml:4:5: step "b": hold and wait cannot both gate one step`},
		// Duplicate keys of env, labels and with, as of the built-in fields.
		{"duplicate run env", "env: {A: x, A: y}\nsteps:\n  - name: a\n    run: x\n", `x.yaml:1:13: env: key "A" appears twice (first at line 1): keep one`},
		{"duplicate step env", "steps:\n  - name: a\n    run: x\n    env:\n      A: 1\n      B: 2\n      A: 3\n", `x.yaml:7:7: step "a": env: key "A" appears twice (first at line 5): keep one`},
		{"duplicate label", "steps:\n  - name: a\n    run: x\n    labels:\n      zone: eu\n      zone: us\n", `x.yaml:6:7: step "a": labels: key "zone" appears twice (first at line 5): keep one`},
		{"duplicate with", "steps:\n  - name: a\n    with: {K: v, \"K\": w}\n    workflow:\n      steps: [{name: b, run: x}]\n", `x.yaml:3:18: step "a": with: key "K" appears twice (first at line 3): keep one`},
		// Integers are YAML integers, booleans YAML booleans, strings
		// scalars not tagged otherwise: nothing is converted loosely.
		{"fractional attempts", "steps:\n  - name: a\n    run: x\n    retry: {attempts: 2.9}\n", `x.yaml:4:23: step "a": retry: attempts must be a whole number, not "2.9"`},
		{"fractional exit code", "steps:\n  - name: a\n    run: x\n    retry: {attempts: 2, on: [1.7]}\n", `x.yaml:4:31: step "a": retry: on: "1.7" is neither an exit code (1-255) nor timeout`},
		{"quoted exit code", "steps:\n  - name: a\n    run: x\n    retry: {attempts: 2, on: ['3']}\n", `x.yaml:4:31: step "a": retry: on: the quoted string "3" is neither an exit code (1-255) nor timeout`},
		{"fractional group max", "concurrency: {group: g, max: 3.99}\nsteps:\n  - name: a\n    run: x\n", `x.yaml:1:30: concurrency: max must be a whole number, not "3.99"`},
		{"quoted attempts", "steps:\n  - name: a\n    run: x\n    retry: {attempts: \"3\"}\n", `x.yaml:4:23: step "a": retry: attempts must be a whole number, not the quoted string "3"`},
		{"quoted bool", "steps:\n  - name: a\n    run: x\n    hold: \"on\"\n", `x.yaml:4:11: step "a": hold must be true or false, not the quoted string "on"`},
		{"yes for a bool", "steps:\n  - name: a\n    run: x\n    idempotent: yes\n", `x.yaml:4:17: step "a": idempotent must be true or false, not "yes"`},
		{"null bool", "steps:\n  - name: a\n    run: x\n    writes: ~\n", `x.yaml:4:13: step "a": writes must be true or false, not null (nothing)`},
		{"empty bool", "concurrency: {group: g, cancel_in_progress: }\nsteps:\n  - name: a\n    run: x\n", `x.yaml:1:45: concurrency: cancel_in_progress must be true or false, not null (nothing)`},
		{"tagged string", "steps:\n  - name: a\n    run: !!int hello\n", `x.yaml:3:10: step "a": run must be a string, not "hello" tagged "!!int"`},
		{"tagged item", "steps:\n  - name: a\n    run: x\n    tags: [!!float 1]\n", `x.yaml:4:12: step "a": tags entries must be a string, not "1" tagged "!!float"`},
		{"null dependency", "steps:\n  - name: a\n    run: x\n    depends_on:\n", `x.yaml:4:16: step "a": depends_on must be a string, not null (nothing)`},
		{"list for a string", "steps:\n  - name: a\n    run: [x]\n", `x.yaml:3:10: step "a": run must be a string, not a list`},
		// A second document is refused even when it does not parse.
		{"broken second document", "steps:\n  - name: a\n    run: x\n---\nsteps: [\n", "x.yaml:4:1: more than one YAML document; a file holds one workflow: remove the `---` and what follows, or submit it as its own file"},
		{"after the end marker", "steps:\n  - name: a\n    run: x\n...\nfoo: bar\n", "x.yaml:4:1: more than one YAML document; a file holds one workflow: remove the `---` and what follows, or submit it as its own file"},
		{"empty second document", "steps:\n  - name: a\n    run: x\n---\n", "x.yaml:4:1: more than one YAML document; a file holds one workflow: remove the `---` and what follows, or submit it as its own file"},
		// Anchors and aliases are not supported, at the alias's line.
		{"alias for a mapping", "env: &e {A: b}\nsteps:\n  - name: a\n    run: x\n    env: *e\n", `x.yaml:5:10: alias "*e": YAML aliases and anchors are not supported: write the value out where it is used (its anchor is at line 1)`},
		{"alias for a step", "steps:\n  - &s {name: a, run: x}\n  - *s\n", `x.yaml:3:5: alias "*s": YAML aliases and anchors are not supported: write the value out where it is used (its anchor is at line 2)`},
		{"merge key", "steps:\n  - &s {name: a, run: x}\n  - <<: *s\n    name: b\n", `x.yaml:3:9: alias "*s": YAML aliases and anchors are not supported: write the value out where it is used (its anchor is at line 2)`},
		{"anchor", "name: &n r\nsteps:\n  - name: a\n    run: x\n", `x.yaml:1:7: anchor "&n": YAML anchors and aliases are not supported: remove it`},
		{"undefined alias", "steps:\n  - name: a\n    run: *cmd\n", `x.yaml:3:10: YAML syntax: alias "*cmd" names no anchor: YAML aliases and anchors are not supported: write the value out where it is used`},
		// The YAML library names no line for these: found here.
		{"NUL byte", "steps:\n  - name: a\n    run: \"x\x00\"\n", `x.yaml:3:12: YAML syntax: control characters are not allowed: U+0000 here: remove it, or write it as an escape in a double-quoted string ("\u0000")`},
		{"invalid UTF-8", "steps:\n  - name: é\xff\n    run: x\n", `x.yaml:2:12: YAML syntax: invalid leading UTF-8 octet: byte 0xFF here is not UTF-8: save the file as UTF-8`},
		// Syntax errors: the line (corrected for the YAML library's
		// counting), the column of the culprit, and a hint.
		{"unclosed flow list", "steps: [\n", "x.yaml:1:8: YAML syntax: did not find expected node content: a flow list [ … ] or mapping { … } is not closed, or lacks a ',' between its entries"},
		{"unclosed flow mapping", "steps:\n  - name: a\n    run: x\n  - {name: b, run: y\n", "x.yaml:4:5: YAML syntax: did not find expected ',' or '}': a flow list [ … ] or mapping { … } is not closed, or lacks a ',' between its entries"},
		{"tab", "steps:\n  - name: a\n    run: x\n\tdepends_on: b\n", "x.yaml:4:1: YAML syntax: found a tab character that violates indentation: indent with spaces, not tabs"},
		{"colon in value", "steps:\n  - name: a\n    run: echo: hi\n", `x.yaml:3:14: YAML syntax: mapping values are not allowed in this context: a value that holds ": " must be quoted (run: "echo: hi"), or the line is indented too deep`},
		{"misindented", "steps:\n  - name: a\n   run: x\n", "x.yaml:3:4: YAML syntax: did not find expected '-' indicator: this line is indented differently from the entries above it: align it with them"},
		{"dedented", "steps:\n  - name: a\n    run: x\n  run: y\n", "x.yaml:4:3: YAML syntax: did not find expected '-' indicator: this line is indented differently from the entries above it: align it with them"},
		{"unclosed quote", "steps:\n  - name: \"a\n    run: x\n", "x.yaml:2:11: YAML syntax: found unexpected end of stream: a quoted string is not closed: add the closing quote"},
		{"missing colon", "name: b\nc\n", `x.yaml:2:1: YAML syntax: could not find expected ':': a mapping entry needs "key: value"; add the ':' or quote the line`},
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
		if want := "invalid workflow:\n  " + c.want; err.Error() != want {
			t.Errorf("%s:\n got %q\nwant %q", c.name, err, want)
		}
	}
}

// TestParseErrorsBounded: an error's size does not grow with the input
// (SPEC §12): 2,000 unknown dependencies are at most MaxErrors errors, each
// listing at most core.ErrorListMax known steps; a long name is truncated.
func TestParseErrorsBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString("steps:\n")
	for i := range 2000 {
		fmt.Fprintf(&b, "  - name: s%d\n    run: x\n    depends_on: [missing-%d-%s]\n", i, i, strings.Repeat("m", 400))
	}
	_, err := Parse("x.yaml", []byte(b.String()))
	if err == nil {
		t.Fatal("accepted")
	}
	msg := err.Error()
	if n := strings.Count(msg, "depends on unknown step"); n != MaxErrors {
		t.Errorf("%d errors spelled out, want %d", n, MaxErrors)
	}
	if !strings.Contains(msg, "… and 1,980 more errors") || !strings.Contains(msg, "… and 1,990 more)") {
		t.Errorf("the rest are not counted: %.2000s", msg)
	}
	if len(msg) > 16<<10 {
		t.Errorf("error of %d bytes for %d bytes of input", len(msg), b.Len())
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
			`x.yaml:1:7: run name "nightly\x1b]0;x\a" has a non-printable character U+001B at byte 7`},
		{"step name", "steps:\n  - name: ok\n    run: x\n  - name: \"b\\ec\"\n    run: y\n",
			`x.yaml:4:11: step name "b\x1bc" has a non-printable character U+001B at byte 1`},
		{"step name NUL", "steps:\n  - name: \"b\\0\"\n    run: y\n", `x.yaml:2:11: step name "b\x00" has a non-printable character U+0000`},
		{"tag", "steps:\n  - name: a\n    run: x\n    tags: [script, \"gpu\\r\"]\n", `x.yaml:4:20: tag "gpu\r" has a non-printable character U+000D at byte 3`},
		{"label key", "steps:\n  - name: a\n    run: x\n    labels:\n      \"z\\none\": eu\n", `x.yaml:5:7: label key "z\none" has a non-printable character U+000A`},
		{"label value", "steps:\n  - name: a\n    run: x\n    labels:\n      zone: \"eu\\e[31m\"\n", `x.yaml:5:13: label value "eu\x1b[31m" has a non-printable character U+001B`},
		{"target", "steps:\n  - name: a\n    run: x\n    target: \"w\\x01\"\n", `x.yaml:4:13: target "w\x01" has a non-printable character U+0001`},
		{"platform", "steps:\n  - name: a\n    run: x\n    platform: \"linux\\x7f\"\n", `x.yaml:4:15: platform "linux\x7f" has a non-printable character U+007F`},
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

// TestParseOutputs: outputs: makes the step write-bearing (SPEC §14,
// declared writes); a writes: false beside it, or an output that is not a
// data id or a prefix ending in '*', is refused at its line.
func TestParseOutputs(t *testing.T) {
	spec, err := Parse("x.yaml", []byte("steps:\n  - name: a\n    run: true\n    outputs: [report.txt, 'logs-*']\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s := spec.Steps[0]; !s.Writes || len(s.Outputs) != 2 || s.Outputs[1] != "logs-*" {
		t.Fatalf("outputs did not imply writes, or were lost: %+v", s)
	}
	for src, want := range map[string]string{
		"steps:\n  - name: a\n    run: true\n    writes: false\n    outputs: [r]\n": "writes: false, but it declares outputs",
		"steps:\n  - name: a\n    run: true\n    outputs: ['a/b']\n":                `output "a/b": want a data id`,
		"steps:\n  - name: a\n    run: true\n    outputs: ['*x']\n":                 `output "*x"`,
	} {
		_, err := Parse("x.yaml", []byte(src))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want an error containing %q", src, err, want)
		}
	}
}

// TestParseRetry: retry: and idempotent: reach the StepSpec (SPEC §1 RETRY).
func TestParseRetry(t *testing.T) {
	src := "steps:\n  - name: a\n    run: x\n    retry: {attempts: 3, backoff: 5s, on: [2, 75, timeout]}\n" +
		"  - name: w\n    run: y\n    writes: true\n    idempotent: true\n    retry:\n      attempts: 1\n      on: timeout\n" +
		"  - name: n\n    run: z\n    retry: {attempts: 2}\n"
	spec, err := Parse("r.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	a, w, n := spec.Steps[0].Retry, spec.Steps[1], spec.Steps[2].Retry
	if a == nil || a.Attempts != 3 || a.Backoff != 5*time.Second || fmt.Sprint(a.Codes) != "[2 75]" || !a.OnTimeout {
		t.Fatalf("a's retry wrong: %+v", a)
	}
	if !w.Idempotent || w.Retry == nil || w.Retry.Attempts != 1 || !w.Retry.OnTimeout || w.Retry.Codes != nil {
		t.Fatalf("w wrong: %+v %+v", w, w.Retry)
	}
	if n == nil || n.Attempts != 2 || n.Codes != nil || n.OnTimeout || !n.RetriesExit(1) || n.RetriesExit(0) {
		t.Fatalf("n's retry wrong: %+v", n)
	}
}

// TestSyntaxNoLine: a YAML error the library names no line for, and that
// cannot be found in the file, says so rather than pointing at 1:1.
func TestSyntaxNoLine(t *testing.T) {
	for _, c := range []struct{ src, err, want string }{
		{"a: b\n", "yaml: something else", "YAML syntax: something else (the YAML library names no line for it)"},
		{"a: b\n", "not the library's", "YAML syntax: not the library's (the YAML library names no line for it)"},
		{"a: b\n", "yaml: unknown anchor 'zz' referenced", `YAML syntax: alias "*zz" names no anchor: YAML aliases and anchors are not supported: write the value out where it is used (the YAML library names no line for it)`},
		{"a: b\n", "yaml: control characters are not allowed", "YAML syntax: control characters are not allowed (the YAML library names no line for it)"},
	} {
		line, _, msg := syntaxError([]byte(c.src), errors.New(c.err))
		if line != 0 || msg != c.want {
			t.Errorf("%s: line %d, %q; want line 0, %q", c.err, line, msg, c.want)
		}
	}
	p := &parser{file: "x.yaml"}
	p.errAt(0, 0, "YAML syntax: odd")
	if err := p.err(); err.Error() != "invalid workflow:\n  x.yaml: YAML syntax: odd" {
		t.Errorf("no line: %q", err)
	}
}
