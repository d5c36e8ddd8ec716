package core

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// forbiddenImports may not appear in core's non-test files: they bring I/O,
// concurrency or randomness that a seed does not decide.
var forbiddenImports = map[string]string{
	"os":          "I/O",
	"os/exec":     "I/O",
	"os/signal":   "I/O",
	"io/ioutil":   "I/O",
	"io/fs":       "I/O",
	"net":         "I/O",
	"net/http":    "I/O",
	"syscall":     "I/O",
	"sync":        "shared-memory concurrency",
	"sync/atomic": "shared-memory concurrency",
	"crypto/rand": "unseeded randomness",
	"math/rand":   "global randomness (math/rand/v2 with an explicit seeded source is allowed)",
	"unsafe":      "unsafe",
	"runtime":     "runtime state",
	"log":         "I/O (log lines are outputs)",
	"log/slog":    "I/O (log lines are outputs)",
}

// forbiddenCalls are package-level functions that read a clock, sleep, start
// timers or use the global random source.
var forbiddenCalls = map[string]map[string]bool{
	"time": {"Now": true, "Since": true, "Until": true, "Sleep": true, "After": true,
		"AfterFunc": true, "Tick": true, "NewTimer": true, "NewTicker": true},
	"rand": {"Int": true, "IntN": true, "Int64": true, "Uint64": true, "Float64": true,
		"N": true, "Perm": true, "Shuffle": true, "Uint32": true, "Int32": true, "Int64N": true,
		"Uint64N": true, "Uint32N": true, "Int32N": true, "UintN": true, "Float32": true,
		"ExpFloat64": true, "NormFloat64": true, "Uint": true},
	"fmt": {"Print": true, "Println": true, "Printf": true},
}

// TestCorePurity enforces the core's contract on its own source: no clock
// reads, timers, sleeps, global randomness, I/O, sync or go statements.
func TestCorePurity(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		checked++
		for _, v := range purityViolations(t, f) {
			t.Errorf("%s", v)
		}
	}
	if checked == 0 {
		t.Fatal("no core source files found: the purity check checked nothing")
	}
}

func purityViolations(t *testing.T, path string) []string {
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return checkPurity(t, path, src)
}

func checkPurity(t *testing.T, path string, src []byte) []string {
	fset := token.NewFileSet()
	file, err := parser.ParseFile(fset, path, src, 0)
	if err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
	var bad []string
	names := map[string]string{} // local name → import path
	for _, imp := range file.Imports {
		p := strings.Trim(imp.Path.Value, `"`)
		if why, ok := forbiddenImports[p]; ok {
			bad = append(bad, fset.Position(imp.Pos()).String()+": imports "+p+" ("+why+")")
		}
		name := p[strings.LastIndexByte(p, '/')+1:]
		if p == "math/rand/v2" {
			name = "rand"
		}
		if imp.Name != nil {
			name = imp.Name.Name
		}
		names[name] = p
	}
	ast.Inspect(file, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.GoStmt:
			bad = append(bad, fset.Position(n.Pos()).String()+": go statement")
		case *ast.SelectorExpr:
			id, ok := n.X.(*ast.Ident)
			if !ok {
				return true
			}
			p := names[id.Name]
			pkg := p[strings.LastIndexByte(p, '/')+1:]
			if p == "math/rand/v2" {
				pkg = "rand"
			}
			if forbiddenCalls[pkg][n.Sel.Name] {
				bad = append(bad, fset.Position(n.Pos()).String()+": calls "+p+"."+n.Sel.Name)
			}
		}
		return true
	})
	return bad
}

// TestPurityCheckerCatches proves the checker has teeth: each planted
// violation must be reported.
func TestPurityCheckerCatches(t *testing.T) {
	planted := map[string]string{
		"clock":  "package core\nimport \"time\"\nfunc f() { _ = time.Now() }\n",
		"sleep":  "package core\nimport \"time\"\nfunc f() { time.Sleep(1) }\n",
		"timer":  "package core\nimport \"time\"\nfunc f() { time.NewTimer(1) }\n",
		"go":     "package core\nfunc f() { go f() }\n",
		"os":     "package core\nimport \"os\"\nvar _ = os.Args\n",
		"net":    "package core\nimport \"net\"\nvar _ net.Conn\n",
		"sync":   "package core\nimport \"sync\"\nvar _ sync.Mutex\n",
		"crypto": "package core\nimport \"crypto/rand\"\nvar _ = rand.Reader\n",
		"rand1":  "package core\nimport \"math/rand\"\nvar _ = rand.Intn\n",
		"rand2":  "package core\nimport \"math/rand/v2\"\nfunc f() { _ = rand.IntN(3) }\n",
		"alias":  "package core\nimport tm \"time\"\nfunc f() { _ = tm.Now() }\n",
	}
	for name, src := range planted {
		if len(checkPurity(t, name+".go", []byte(src))) == 0 {
			t.Errorf("planted violation %q was not caught", name)
		}
	}
	clean := "package core\nimport (\"time\"; \"math/rand/v2\")\nfunc f(now time.Time, r *rand.Rand) time.Time { _ = r.IntN(3); return now.Add(time.Second) }\n"
	if v := checkPurity(t, "clean.go", []byte(clean)); len(v) != 0 {
		t.Errorf("clean source reported: %v", v)
	}
}
