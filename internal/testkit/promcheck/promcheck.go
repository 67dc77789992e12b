// Package promcheck validates Prometheus text exposition in tests: with
// `promtool check metrics` when promtool is installed (Debian package
// prometheus; .ci/run installs it), and always with the Prometheus
// ecosystem's own parser (github.com/prometheus/common/expfmt), so a test
// asserts something even on a machine without promtool. In CI
// (internal/testkit/ci) a missing promtool fails the test instead.
//
// Invariant: Strict fails the test on any parse error and on every promtool
// lint problem; Check tolerates "no help text", for output written without
// metadata (VictoriaMetrics/metrics writes no HELP lines unless its
// process-wide metrics.ExposeMetadata is switched on, and then empty ones;
// metricshttp.Config.Metadata writes them from the catalogue).
package promcheck

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/pinned-go/pinned/internal/testkit/ci"
)

// Family is one metric family of a parsed exposition.
type Family struct {
	Name string
	// Type is what the parser made of it ("COUNTER", "GAUGE", "UNTYPED",
	// "HISTOGRAM", ...); without TYPE lines everything is UNTYPED.
	Type string
	// Series is the number of samples (label sets) in the family.
	Series int
}

// Check validates body and returns its families by name. It fails tb on a
// parse error or a promtool problem; it logs (once per call) when promtool
// is absent and only the parser ran, except in CI (internal/testkit/ci),
// where a missing promtool fails tb.
func Check(tb testing.TB, what string, body []byte) map[string]Family {
	tb.Helper()
	return check(tb, what, body, true)
}

// Strict is Check without tolerance: every family needs its HELP text.
func Strict(tb testing.TB, what string, body []byte) map[string]Family {
	tb.Helper()
	return check(tb, what, body, false)
}

func check(tb testing.TB, what string, body []byte, tolerateHelp bool) map[string]Family {
	tb.Helper()
	fams := Parse(tb, what, body)
	if len(fams) == 0 {
		tb.Fatalf("%s: no metric family in the output", what)
	}
	problems, err := promtool(body, tolerateHelp)
	switch {
	case errors.Is(err, exec.ErrNotFound) && ci.Enabled():
		tb.Fatalf("%s: promtool not installed, and CI installs it (apt-get install prometheus)", what)
	case errors.Is(err, exec.ErrNotFound):
		tb.Logf("%s: promtool not installed (apt-get install prometheus); checked with expfmt only", what)
	case err != nil:
		tb.Fatalf("%s: promtool check metrics: %v\n%s", what, err, problems)
	case len(problems) > 0:
		tb.Fatalf("%s: promtool check metrics reports:\n%s", what, strings.Join(problems, "\n"))
	}
	return fams
}

// Parse parses body with expfmt's text parser and fails tb on an error.
func Parse(tb testing.TB, what string, body []byte) map[string]Family {
	tb.Helper()
	p := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		tb.Fatalf("%s: expfmt cannot parse the exposition: %v", what, err)
	}
	out := make(map[string]Family, len(mfs))
	for name, mf := range mfs {
		out[name] = Family{Name: name, Type: mf.GetType().String(), Series: len(mf.GetMetric())}
	}
	return out
}

// Promtool runs `promtool check metrics` on body. It returns the lint
// problems other than "no help text", and an error wrapping
// exec.ErrNotFound when promtool is not installed, or describing a parse
// failure (with promtool's output as problems).
func Promtool(body []byte) (problems []string, err error) { return promtool(body, true) }

func promtool(body []byte, tolerateHelp bool) (problems []string, err error) {
	path, err := exec.LookPath("promtool")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, "check", "metrics")
	cmd.Stdin = bytes.NewReader(body)
	out, runErr := cmd.CombinedOutput()
	var lint []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if l == "" || (tolerateHelp && strings.HasSuffix(l, " no help text")) {
			continue
		}
		lint = append(lint, l)
	}
	sort.Strings(lint)
	var ee *exec.ExitError
	switch {
	case runErr == nil:
		return lint, nil
	case errors.As(runErr, &ee) && ee.ExitCode() == 3: // lint problems only
		return lint, nil
	default:
		return lint, runErr
	}
}
