package main

import (
	"context"
	"strings"
	"testing"
)

func TestFlags(t *testing.T) {
	var out strings.Builder
	if code := run(context.Background(), []string{"-nope"}, &out); code != 2 {
		t.Errorf("bad flag: exit %d; want 2", code)
	}
	out.Reset()
	if code := run(context.Background(), []string{"extra"}, &out); code != 2 {
		t.Errorf("stray argument: exit %d; want 2", code)
	}
	out.Reset()
	if code := run(context.Background(), []string{"-suite", "nope"}, &out); code != 1 || !strings.Contains(out.String(), `unknown suite "nope"`) {
		t.Errorf("unknown suite: exit %d, %q; want 1 naming the suite", code, out.String())
	}
	out.Reset()
	if code := run(context.Background(), []string{"-h"}, &out); code != 0 {
		t.Errorf("-h: exit %d; want 0", code)
	}
	for _, want := range []string{
		"-suite list (no variable, default all)",
		"-duration duration (no variable, default 0s)",
		"-max-busy float (no variable, default 0)",
		"-smoke bool (no variable, default false)",
		`-pinboard-b path (no variable, default "")`,
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("-h lacks %q:\n%s", want, out.String())
		}
	}
}
