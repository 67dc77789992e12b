package main

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/pinned-go/pinned/internal/testkit/proctest"
)

// builder builds the command for TestCommandLine.
var builder proctest.Builder

func TestMain(m *testing.M) {
	code := m.Run()
	builder.Cleanup()
	os.Exit(code)
}

// TestFlags: bad flags and unknown suites exit 2 before anything is
// measured; -h lists every flag on stdout.
func TestFlags(t *testing.T) {
	var out, errs strings.Builder
	for _, c := range []struct {
		args []string
		want string // on stderr
	}{
		{[]string{"-nope"}, "-nope"},
		{[]string{"extra"}, "extra"},
		{[]string{"-suite", "nope"}, `bench: -suite: unknown suite "nope"`},
		{[]string{"-suite", "proxy,nope"}, `bench: -suite: unknown suite "nope"`},
		{[]string{"-suite", "scale", "-scale-rows", "S1,S9"}, `bench: -scale-rows, -scale-max: unknown scale row "S9"`},
		{[]string{"-suite", "scale", "-scale-max", "50"}, "bench: -scale-rows, -scale-max: scale max 50; want 1, 10, 100 or 1000"},
		{[]string{"-failover-ids", "100,ten"}, `bench: -failover-ids: "ten" is not a positive number of ids`},
		{[]string{"-failover-ids", "0"}, `bench: -failover-ids: "0" is not a positive number of ids`},
		{[]string{"-failover-rate", "-5"}, "bench: failover rate -5: want a positive number (0: the default)"},
	} {
		out.Reset()
		errs.Reset()
		if code := run(context.Background(), c.args, &out, &errs); code != 2 || out.Len() != 0 || !strings.Contains(errs.String(), c.want) {
			t.Errorf("bench %q: exit %d, stdout %q, stderr %q; want 2, nothing on stdout, %q", c.args, code, out.String(), errs.String(), c.want)
		}
	}
	out.Reset()
	errs.Reset()
	if code := run(context.Background(), []string{"-h"}, &out, &errs); code != 0 || errs.Len() != 0 {
		t.Errorf("-h: exit %d, stderr %q; want 0 and the usage on stdout", code, errs.String())
	}
	for _, want := range []string{
		"-suite list (no variable, default all)",
		"-duration duration (no variable, default 0s)",
		"-max-busy float (no variable, default 0)",
		"-smoke bool (no variable, default false)",
		`-pinboard-b path (no variable, default "")`,
		`-failover-ids list (no variable, default "")`,
		`-scale-rows list (no variable, default "")`,
		"-scale-max int (no variable, default 0)",
		"-version bool (no variable, default false)",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("-h lacks %q:\n%s", want, out.String())
		}
	}
}

// TestCommandLine runs the built command: exit status 2 and the message
// for bad flags and an unknown suite, -h and -version on stdout.
func TestCommandLine(t *testing.T) {
	proctest.CheckCommandLine(t, builder.Build(t, "github.com/pinned-go/pinned/cmd/bench"), "bench", []proctest.Case{
		{Args: []string{"-suite", "nope"}, Code: 2, Stderr: `bench: -suite: unknown suite "nope"; want one of [`},
		{Args: []string{"-rounds", "x"}, Code: 2, Stderr: `bench: -rounds="x": want an integer`},
	})
}
