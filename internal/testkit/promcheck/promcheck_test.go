package promcheck

import (
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/pinned-go/pinned/internal/testkit/ci"
)

// Promtool separates the tolerated "no help text" from real lint problems
// (here a non-base unit) and reports parse errors as errors.
func TestPromtool(t *testing.T) {
	if _, err := exec.LookPath("promtool"); err != nil {
		ci.Missing(t, "promtool not installed (apt-get install prometheus)")
	}
	problems, err := Promtool([]byte("pinned_ok_total 1\n"))
	if err != nil || len(problems) != 0 {
		t.Errorf("clean input: %v, %v; want no problem", problems, err)
	}
	problems, err = Promtool([]byte("foo_milliseconds 1\nbar_total 2\n"))
	if err != nil || len(problems) != 1 || !strings.Contains(problems[0], `use base unit "seconds"`) {
		t.Errorf("a millisecond metric: %v, %v; want one unit problem", problems, err)
	}
	if _, err := Promtool([]byte("x{a=\"b\" 1\n")); err == nil {
		t.Error("a parse error passed")
	} else if errors.Is(err, exec.ErrNotFound) {
		t.Errorf("parse error reported as promtool missing: %v", err)
	}
}

func TestParse(t *testing.T) {
	fams := Parse(t, "sample", []byte("a_total{x=\"1\"} 1\na_total{x=\"2\"} 2\nb 3\n"))
	if len(fams) != 2 || fams["a_total"].Series != 2 || fams["b"].Series != 1 {
		t.Errorf("Parse = %+v", fams)
	}
}
