package wire

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// docs/protocol.md names every string constant of this package (paths,
// headers, reasons, nacks, messages, key prefixes, session fields) and has
// a history entry for the current Version, so the document cannot fall
// behind the code.
func TestProtocolDocument(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, spec := range g.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, name := range vs.Names {
					if !name.IsExported() || i >= len(vs.Values) {
						continue
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						continue
					}
					v, err := strconv.Unquote(lit.Value)
					if err != nil {
						t.Fatal(err)
					}
					checked++
					if !strings.Contains(string(doc), v) {
						t.Errorf("docs/protocol.md does not mention %s (%q)", name.Name, v)
					}
				}
			}
		}
	}
	if checked < 40 {
		t.Fatalf("only %d string constants checked; the parse missed some", checked)
	}
	if entry := "- **" + strconv.Itoa(Version) + "**"; !strings.Contains(string(doc), entry) {
		t.Errorf("docs/protocol.md has no history entry %q for wire.Version", entry)
	}
}
