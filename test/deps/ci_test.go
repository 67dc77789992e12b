package deps

import (
	"go/ast"
	"go/build/constraint"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// raceFreeVar is the line of .ci/run that sets the -run pattern of its
// step without -race.
var raceFreeVar = regexp.MustCompile(`(?m)^race_free_tests='([^'/]+)'$`)

// raceFreeStep is how .ci/run must use it: every package, no -race.
const raceFreeStep = `go test -run "$race_free_tests" ./...`

// CI runs `go test -race -timeout 30m ./...`, in which the zero-allocation tests do not
// run (their files are built !race) or skip themselves (the race detector
// allocates). .ci/run therefore has a step without -race whose -run pattern
// must select every such test, or the allocation-free paths the docs
// promise would never be checked.
func TestRaceFreeTestsRunInCI(t *testing.T) {
	root := moduleRoot(t)
	script, err := os.ReadFile(filepath.Join(root, ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	m := raceFreeVar.FindSubmatch(script)
	if m == nil || !strings.Contains(string(script), raceFreeStep) {
		t.Fatalf(".ci/run has no line race_free_tests='<pattern>' (no '/') used by %s", raceFreeStep)
	}
	re, err := regexp.Compile(string(m[1]))
	if err != nil {
		t.Fatalf(".ci/run's race_free_tests: %v", err)
	}
	var found, missed []string
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(p) // read: go test's cache reruns this test when it changes
		if err != nil {
			return err
		}
		names, err := raceFreeTests(p, src)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		for _, n := range names {
			found = append(found, rel+": "+n)
			if !re.MatchString(n) {
				missed = append(missed, rel+": "+n)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	touchSources(t, root) // a new test file reruns it too
	if len(found) == 0 {
		t.Fatal("found no test that runs only without -race: the detection is broken")
	}
	t.Logf("%d tests run only without -race, all selected by %q:\n%s", len(found), m[1], strings.Join(found, "\n"))
	if len(missed) > 0 {
		t.Errorf(".ci/run's race_free_tests pattern %q does not select these tests, which run only without -race (built !race, or skipping under the race detector): rename them or widen the pattern\n%s",
			m[1], strings.Join(missed, "\n"))
	}
}

// raceFreeTests returns the tests of one _test.go file that run (or
// assert) only without the race detector: every test of a file whose build
// constraint holds without the race tag and not with it, and every test
// that calls Skip inside an if whose condition reads raceEnabled or
// race.Enabled.
func raceFreeTests(name string, src []byte) ([]string, error) {
	f, err := parser.ParseFile(token.NewFileSet(), name, src, parser.ParseComments)
	if err != nil {
		return nil, err
	}
	fileRaceFree := false
	for _, g := range f.Comments {
		if g.Pos() > f.Package {
			break
		}
		for _, c := range g.List {
			if !constraint.IsGoBuild(c.Text) {
				continue
			}
			expr, err := constraint.Parse(c.Text)
			if err != nil {
				return nil, err
			}
			fileRaceFree = builds(expr, false) && !builds(expr, true)
		}
	}
	var out []string
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Recv != nil || !strings.HasPrefix(fn.Name.Name, "Test") || fn.Name.Name == "TestMain" {
			continue
		}
		if fileRaceFree || skipsUnderRace(fn.Body) {
			out = append(out, fn.Name.Name)
		}
	}
	return out, nil
}

// builds evaluates a build constraint on this machine's OS and
// architecture, with or without the race tag; other tags are off.
func builds(expr constraint.Expr, race bool) bool {
	return expr.Eval(func(tag string) bool {
		switch tag {
		case "race":
			return race
		case runtime.GOOS, runtime.GOARCH, "unix", "cgo", "gc":
			return true
		}
		return strings.HasPrefix(tag, "go1.")
	})
}

// skipsUnderRace reports whether body skips its test in an if on the race
// detector (an if that only widens a bound under race does not count).
func skipsUnderRace(body *ast.BlockStmt) bool {
	found := false
	ast.Inspect(body, func(n ast.Node) bool {
		ifs, ok := n.(*ast.IfStmt)
		if !ok || found || !readsRace(ifs.Cond) {
			return !found
		}
		ast.Inspect(ifs.Body, func(n ast.Node) bool {
			if call, ok := n.(*ast.CallExpr); ok {
				if sel, ok := call.Fun.(*ast.SelectorExpr); ok && slices.Contains([]string{"Skip", "Skipf", "SkipNow"}, sel.Sel.Name) {
					found = true
				}
			}
			return !found
		})
		return !found
	})
	return found
}

// readsRace reports whether e mentions raceEnabled or race.Enabled.
func readsRace(e ast.Expr) bool {
	found := false
	ast.Inspect(e, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.Ident:
			found = found || x.Name == "raceEnabled"
		case *ast.SelectorExpr:
			if id, ok := x.X.(*ast.Ident); ok && id.Name == "race" && x.Sel.Name == "Enabled" {
				found = true
			}
		}
		return !found
	})
	return found
}

// The detection finds a !race file's tests and a test that skips under
// race, and leaves alone a race-only file, an untagged file, a test that
// only widens a bound under race, and TestMain.
func TestRaceFreeTestsCatches(t *testing.T) {
	for _, tc := range []struct {
		src  string
		want []string
	}{
		{"//go:build !race\n\npackage p\nfunc TestA(t *testing.T) {}\nfunc TestMain(m *testing.M) {}\nfunc helper() {}\n", []string{"TestA"}},
		{"//go:build linux && !race\n\npackage p\nfunc TestB(t *testing.T) {}\n", []string{"TestB"}},
		{"//go:build race\n\npackage p\nfunc TestC(t *testing.T) {}\n", nil},
		{"//go:build pinned_faults\n\npackage p\nfunc TestD(t *testing.T) {}\n", nil},
		{"package p\nfunc TestE(t *testing.T) {\n\tif raceEnabled {\n\t\tt.Skip(\"allocates\")\n\t}\n}\n", []string{"TestE"}},
		{"package p\nfunc TestF(t *testing.T) {\n\tif x := 1; race.Enabled && x > 0 {\n\t\tt.Skipf(\"%d\", x)\n\t}\n}\n", []string{"TestF"}},
		{"package p\nfunc TestG(t *testing.T) {\n\tbound := 1\n\tif raceEnabled {\n\t\tbound = 2\n\t}\n\tif bound > 3 {\n\t\tt.Skip()\n\t}\n}\n", nil},
		{"package p\nfunc TestH(t *testing.T) {}\n", nil},
	} {
		got, err := raceFreeTests("x_test.go", []byte(tc.src))
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("raceFreeTests(%q) = %v, %v; want %v", tc.src, got, err, tc.want)
		}
	}
}

// readmeTestCommand is the README quick start's test line: `go test ...`
// followed by its comment.
var readmeTestCommand = regexp.MustCompile(`(?m)^(go test [^#\n]*?)\s+# the test suite`)

// CI must run the README's test command as written: a flag the README
// gives newcomers (the -timeout test/chaos needs) that CI dropped, or the
// other way round, would let one of them fail where the other passes.
func TestCIRunsTheREADMETestCommand(t *testing.T) {
	root := moduleRoot(t)
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	script, err := os.ReadFile(filepath.Join(root, ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	m := readmeTestCommand.FindSubmatch(readme)
	if m == nil {
		t.Fatal("README.md has no line `go test ...  # the test suite`")
	}
	cmd := string(m[1])
	if !slices.Contains(strings.Split(string(script), "\n"), cmd) {
		t.Fatalf(".ci/run has no line %q (the README's test command)", cmd)
	}
	if !strings.Contains(cmd, "-timeout") {
		t.Errorf("the README's test command %q sets no -timeout: test/chaos outlasts go test's default 10 minutes", cmd)
	}
}
