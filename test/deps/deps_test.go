package deps

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// module is the module path every rule below is relative to.
const module = "github.com/pinned-go/pinned"

// testSupport reports whether pkg (relative to the module) is test support:
// code that only tests, benchmarks and the chaos harness build on. Only
// test support may import internal/testkit.
func testSupport(pkg string) bool {
	return under(pkg, "internal/testkit") || under(pkg, "test") || pkg == "bench" || pkg == "cmd/bench"
}

// under reports whether pkg is dir or a package below it.
func under(pkg, dir string) bool { return pkg == dir || strings.HasPrefix(pkg, dir+"/") }

// rule forbids packages matching from to depend (transitively) on packages
// matching to, except those allowed.
type rule struct {
	from []string // package paths or dirs (with their subpackages), relative to the module
	to   []string
	// onlyOurs, when set, turns the rule around: from may depend on no
	// package of the module except those in to.
	onlyOurs bool
	why      string
}

var rules = []rule{
	{
		from: []string{"host", "worker"},
		to:   []string{"proxy", "internal/placement", "internal/registry", "placecache", "internal/pinboard"},
		why:  "an application process links host and worker; the pinboard's parts stay out of it",
	},
	{
		from: []string{"proxy"},
		to:   []string{"host", "worker", "internal/registry", "internal/placement", "internal/pinboard"},
		why:  "the data plane knows workers only through its Resolver and the wire protocol",
	},
	{
		from:     []string{"internal/wire", "clock"},
		to:       nil,
		onlyOurs: true,
		why:      "the protocol's definition and the clock are the bottom layer: everything may import them, they import nothing of ours",
	},
	{
		from:     []string{"loadgen"},
		to:       []string{"internal/wire", "clock"},
		onlyOurs: true,
		why:      "the load generator measures the product from outside; it shares only the bottom layer (wire names, the clock)",
	},
}

// listing is one package of `go list`: its path relative to the module and
// its module-internal dependencies (transitive, non-test build).
type listing struct {
	pkg  string
	deps []string
}

func list(t *testing.T, tags string) []listing {
	t.Helper()
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	touchSources(t, strings.TrimSpace(string(root)))
	cmd := exec.Command("go", "list", "-tags="+tags, "-f", `{{.ImportPath}}{{range .Deps}} {{.}}{{end}}`, "./...")
	cmd.Dir = strings.TrimSpace(string(root))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list ./...: %v\n%s", err, stderr.Bytes())
	}
	var pkgs []listing
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		l := listing{pkg: ours(f[0])}
		for _, d := range f[1:] {
			if d != module && !strings.HasPrefix(d, module+"/") {
				continue
			}
			l.deps = append(l.deps, ours(d))
		}
		pkgs = append(pkgs, l)
	}
	return pkgs
}

// touchSources stats every directory and .go file of the module, so that go
// test's result cache (which records the files a test opens or stats, not
// what a subprocess reads) reruns this test whenever any source changed.
func touchSources(t *testing.T, root string) {
	t.Helper()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || strings.HasSuffix(p, ".go") {
			_, err = os.Stat(p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// ours strips the module path.
func ours(importPath string) string {
	return strings.TrimPrefix(strings.TrimPrefix(importPath, module), "/")
}

func matches(pkg string, dirs []string) bool {
	return slices.ContainsFunc(dirs, func(d string) bool { return under(pkg, d) })
}

// violations checks pkgs against the rules and the testkit rule.
func violations(pkgs []listing) []string {
	var bad []string
	for _, p := range pkgs {
		for _, r := range rules {
			if !matches(p.pkg, r.from) {
				continue
			}
			for _, d := range p.deps {
				if matches(d, r.to) != r.onlyOurs {
					bad = append(bad, p.pkg+" depends on "+d+": "+r.why)
				}
			}
		}
		if testSupport(p.pkg) {
			continue
		}
		for _, d := range p.deps {
			if under(d, "internal/testkit") {
				bad = append(bad, p.pkg+" depends on "+d+": only test support (internal/testkit, test/, bench, cmd/bench, _test.go files) may import internal/testkit")
			}
		}
	}
	return bad
}

func TestLayers(t *testing.T) {
	for _, tags := range []string{"", "pinned_faults"} {
		pkgs := list(t, tags)
		for _, b := range violations(pkgs) {
			t.Errorf("tags %q: %s", tags, b)
		}
		// Every package a rule names must exist, or the rule checks nothing.
		names := []string{"internal/testkit"}
		for _, r := range rules {
			names = append(names, r.from...)
			names = append(names, r.to...)
		}
		for _, n := range names {
			if !slices.ContainsFunc(pkgs, func(l listing) bool { return under(l.pkg, n) }) {
				t.Errorf("a rule names %s, which is no package of the module any more: update the rule", n)
			}
		}
	}
}

// The checker itself catches what it must: a forbidden dependency, one
// outside an allowed set, and testkit in a shipped package; and it accepts
// test support's and the pinboard's own dependencies.
func TestViolationsCatches(t *testing.T) {
	bad := violations([]listing{
		{pkg: "worker", deps: []string{"host", "internal/wire", "internal/placement"}},
		{pkg: "host", deps: []string{"clock", "internal/registry"}},
		{pkg: "proxy", deps: []string{"internal/wire", "host"}},
		{pkg: "internal/wire", deps: []string{"clock"}},
		{pkg: "loadgen", deps: []string{"internal/wire", "metricshttp"}},
		{pkg: "internal/pinboard", deps: []string{"internal/testkit/logtest"}},
		{pkg: "cmd/pinboard", deps: []string{"internal/testkit/procrun"}},
		// Allowed:
		{pkg: "test/e2e", deps: []string{"internal/testkit/proctest", "host", "proxy"}},
		{pkg: "cmd/bench", deps: []string{"internal/testkit/procrun"}},
		{pkg: "internal/placement", deps: []string{"proxy", "internal/store"}},
	})
	want := []string{"worker → internal/placement", "host → internal/registry", "proxy → host", "internal/wire → clock", "loadgen → metricshttp", "internal/pinboard → internal/testkit/logtest", "cmd/pinboard → internal/testkit/procrun"}
	if len(bad) != len(want) {
		t.Fatalf("%d violations; want %d (%v):\n%s", len(bad), len(want), want, strings.Join(bad, "\n"))
	}
	for i, w := range want {
		from, to, _ := strings.Cut(w, " → ")
		if !strings.HasPrefix(bad[i], from+" depends on "+to+":") {
			t.Errorf("violation %d = %q; want %s", i, bad[i], w)
		}
	}
}
