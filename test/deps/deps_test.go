package deps

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
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

// The layers, bottom first; each rule keeps one layer from depending on
// what stands above it (ARCHITECTURE.md, "Layers"). An entry of to or from
// is a package path or folder with its subpackages; "=path" is that
// package alone.
var rules = []rule{
	{
		from:     []string{"internal/base", "clock"},
		to:       []string{"internal/base", "clock"},
		onlyOurs: true,
		why:      "the bottom layer (the protocol's definitions, the clock, the event loop, the fencing rules, the commands' plumbing) imports nothing above it: everything may stand on it",
	},
	{
		from:     []string{"internal/store"},
		to:       []string{"internal/base", "clock", "internal/store"},
		onlyOurs: true,
		why:      "the directory keeps sessions and placements and knows nothing of who reads them",
	},
	{
		from:     []string{"proxy", "placecache"},
		to:       []string{"internal/base", "clock", "proxy", "placecache"},
		onlyOurs: true,
		why:      "the data plane forwards and caches; it knows workers only through its Resolver and the protocol, never the directory or the pinboard's parts",
	},
	{
		from:     []string{"host", "worker", "fence", "metricshttp"},
		to:       []string{"internal/base", "clock", "host", "worker", "fence", "metricshttp"},
		onlyOurs: true,
		why:      "an application process links host and worker and nothing of the pinboard: no data plane, directory or registry",
	},
	{
		from: []string{"registry", "internal/pinboard"},
		to:   []string{"host", "worker", "fence", "loadgen", "bench", "examples", "cmd"},
		why:  "the pinboard (its parts and their assembly) stands on the directory and the data plane; it never links the application side or the tools",
	},
	{
		from: []string{"registry", "internal/pinboard/placement", "internal/pinboard/alarm", "internal/pinboard/hotids"},
		to:   []string{"=internal/pinboard"},
		why:  "the pinboard's parts never import their assembly: internal/pinboard wires them with plain calls",
	},
	{
		from: []string{"internal/pinboard/placement"},
		to:   []string{"registry", "internal/pinboard/alarm"},
		why:  "placement answers where a name lives from the directory and the proxy's types; the registry and the alarms are other parts",
	},
	{
		from: []string{"examples"},
		to:   []string{"test", "internal/testkit"},
		why:  "an example is what a user copies: it links no test support (the test fixture, test/app/counter, adds the test-only parts around the demo's process)",
	},
	{
		from:     []string{"loadgen"},
		to:       []string{"internal/base/wire", "clock", "loadgen"},
		onlyOurs: true,
		why:      "the load generator measures the product from outside; it shares only the protocol's names and the clock",
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
	root := moduleRoot(t)
	touchSources(t, root)
	out := goList(t, root, "-tags="+tags, "-f", `{{.ImportPath}}{{range .Deps}} {{.}}{{end}}`, "./...")
	var pkgs []listing
	for line := range strings.Lines(out) {
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
	return slices.ContainsFunc(dirs, func(d string) bool {
		if exact, ok := strings.CutPrefix(d, "="); ok {
			return pkg == exact
		}
		return under(pkg, d)
	})
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
			n = strings.TrimPrefix(n, "=")
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
		{pkg: "worker", deps: []string{"host", "internal/base/wire", "internal/pinboard/placement"}},
		{pkg: "host", deps: []string{"clock", "registry"}},
		{pkg: "proxy", deps: []string{"internal/base/wire", "host"}},
		{pkg: "internal/base/wire", deps: []string{"clock", "internal/store"}},
		{pkg: "internal/store/memstore", deps: []string{"internal/store", "proxy"}},
		{pkg: "internal/pinboard/placement", deps: []string{"proxy", "internal/store", "internal/pinboard"}},
		{pkg: "registry", deps: []string{"internal/store", "worker"}},
		{pkg: "loadgen", deps: []string{"internal/base/wire", "metricshttp"}},
		{pkg: "internal/pinboard", deps: []string{"internal/testkit/logtest"}},
		{pkg: "cmd/pinboard", deps: []string{"internal/testkit/procrun"}},
		{pkg: "examples/counter/countercmd", deps: []string{"examples/counter/counterapp", "host", "test/sim"}},
		// Allowed:
		{pkg: "test/e2e", deps: []string{"internal/testkit/proctest", "host", "proxy"}},
		{pkg: "cmd/bench", deps: []string{"internal/testkit/procrun"}},
		{pkg: "internal/pinboard", deps: []string{"internal/pinboard/placement", "registry", "proxy", "metricshttp"}},
		{pkg: "internal/base/activation", deps: []string{"clock", "internal/base/faults"}},
		{pkg: "test/app/counter", deps: []string{"examples/counter/countercmd", "internal/testkit/history"}},
	})
	want := []string{"worker → internal/pinboard/placement", "host → registry", "proxy → host", "internal/base/wire → internal/store",
		"internal/store/memstore → proxy", "internal/pinboard/placement → internal/pinboard", "registry → worker", "loadgen → metricshttp",
		"internal/pinboard → internal/testkit/logtest", "cmd/pinboard → internal/testkit/procrun", "examples/counter/countercmd → test/sim"}
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

// TestPublicAPI: no exported name of a public package (one an application
// imports: not internal/, not test support, not examples/, not a command)
// exposes a type of an internal package in its signature, fields or
// methods, so an application can use every part of it.
func TestPublicAPI(t *testing.T) {
	root := moduleRoot(t)
	touchSources(t, root)
	out := goList(t, root, "-f", `{{if and (ne .Name "main") (not .Standard)}}{{.ImportPath}}{{end}}`, "./...")
	var public []string
	for line := range strings.Lines(out) {
		pkg := ours(strings.TrimSpace(line))
		if pkg == "" || under(pkg, "internal") || under(pkg, "examples") || testSupport(pkg) || pkg == "registry" {
			// registry sits at the root as the design lays the module out,
			// beside proxy and placecache, but it is the pinboard's own: its
			// Config takes the pinboard's directory (internal/store), so only
			// this module can build one, and its API is not an application's.
			continue
		}
		public = append(public, module+"/"+pkg)
	}
	if len(public) < 5 {
		t.Fatalf("only %d public packages found: %v", len(public), public)
	}
	exports := map[string]string{}
	for line := range strings.Lines(goList(t, root, append([]string{"-deps", "-export", "-f", "{{.ImportPath}}\t{{.Export}}"}, public...)...)) {
		if path, file, ok := strings.Cut(strings.TrimSpace(line), "\t"); ok && file != "" {
			exports[path] = file
		}
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		f, ok := exports[path]
		if !ok {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(f)
	})
	for _, path := range public {
		pkg, err := imp.Import(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, leak := range internalLeaks(pkg) {
			t.Errorf("%s: %s", ours(path), leak)
		}
	}
}

// internalLeaks lists the exported names of pkg whose API mentions a type
// declared in an internal package.
func internalLeaks(pkg *types.Package) []string {
	var leaks []string
	check := func(where string, typ types.Type) {
		if n := internalType(typ, map[types.Type]bool{}); n != "" {
			leaks = append(leaks, where+" exposes "+n)
		}
	}
	scope := pkg.Scope()
	for _, name := range scope.Names() {
		obj := scope.Lookup(name)
		if !obj.Exported() {
			continue
		}
		switch o := obj.(type) {
		case *types.TypeName:
			named, ok := o.Type().(*types.Named)
			if !ok {
				check(name, o.Type())
				continue
			}
			check(name, named.Underlying())
			for m := range named.Methods() {
				if m.Exported() {
					check(name+"."+m.Name(), m.Type())
				}
			}
		default:
			check(name, obj.Type())
		}
	}
	return leaks
}

// internalType returns the name of a type declared in an internal package
// that t mentions through its exported parts, or "".
func internalType(t types.Type, seen map[types.Type]bool) string {
	if seen[t] {
		return ""
	}
	seen[t] = true
	switch t := t.(type) {
	case *types.Named:
		if p := t.Obj().Pkg(); p != nil && (strings.Contains(p.Path(), "/internal/") || strings.HasSuffix(p.Path(), "/internal")) {
			return p.Path() + "." + t.Obj().Name()
		}
		if args := t.TypeArgs(); args != nil {
			for a := range args.Types() {
				if n := internalType(a, seen); n != "" {
					return n
				}
			}
		}
		return "" // a public type of another package: checked as that package's API
	case *types.Alias:
		return internalType(types.Unalias(t), seen)
	case *types.Pointer:
		return internalType(t.Elem(), seen)
	case *types.Slice:
		return internalType(t.Elem(), seen)
	case *types.Array:
		return internalType(t.Elem(), seen)
	case *types.Chan:
		return internalType(t.Elem(), seen)
	case *types.Map:
		if n := internalType(t.Key(), seen); n != "" {
			return n
		}
		return internalType(t.Elem(), seen)
	case *types.Signature:
		for _, tuple := range []*types.Tuple{t.Params(), t.Results()} {
			for v := range tuple.Variables() {
				if n := internalType(v.Type(), seen); n != "" {
					return n
				}
			}
		}
	case *types.Struct:
		for f := range t.Fields() {
			if f.Exported() {
				if n := internalType(f.Type(), seen); n != "" {
					return n
				}
			}
		}
	case *types.Interface:
		for m := range t.Methods() {
			if m.Exported() {
				if n := internalType(m.Type(), seen); n != "" {
					return n
				}
			}
		}
	}
	return ""
}

func moduleRoot(t *testing.T) string {
	t.Helper()
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	return strings.TrimSpace(string(root))
}

func goList(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %v: %v\n%s", args, err, stderr.Bytes())
	}
	return string(out)
}

// The leak check finds an internal type in an exported field, a function's
// signature, an exported method and an alias, and ignores unexported
// fields and methods.
func TestInternalLeaksCatches(t *testing.T) {
	internal := types.NewPackage("example.com/m/internal/x", "x")
	secret := types.NewNamed(types.NewTypeName(token.NoPos, internal, "Secret", nil), types.Typ[types.Int], nil)
	internal.Scope().Insert(secret.Obj())
	internal.MarkComplete()
	src := `package pub
import "example.com/m/internal/x"
type Config struct { Clock x.Secret; hidden x.Secret; OK int }
func New(map[string]x.Secret) {}
type T struct{}
func (T) M() []x.Secret { return nil }
func (T) m() x.Secret { return 0 }
type A = x.Secret
type Fine struct{ N int }
func Good(Fine) error { return nil }
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "pub.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	conf := types.Config{Importer: importerFunc(func(path string) (*types.Package, error) {
		if path == internal.Path() {
			return internal, nil
		}
		return nil, fmt.Errorf("no package %s", path)
	})}
	pkg, err := conf.Check("example.com/m/pub", fset, []*ast.File{f}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := internalLeaks(pkg)
	want := []string{"A exposes", "Config exposes", "New exposes", "T.M exposes"}
	if len(got) != len(want) {
		t.Fatalf("leaks %q; want %d: %v", got, len(want), want)
	}
	for i, w := range want {
		if !strings.HasPrefix(got[i], w) || !strings.HasSuffix(got[i], "internal/x.Secret") {
			t.Errorf("leak %d = %q; want %q ... internal/x.Secret", i, got[i], w)
		}
	}
}

type importerFunc func(path string) (*types.Package, error)

func (f importerFunc) Import(path string) (*types.Package, error) { return f(path) }
