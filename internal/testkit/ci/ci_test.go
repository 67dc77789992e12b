package ci

import (
	"runtime"
	"testing"
)

// recorder is a testing.TB that records whether Missing failed or skipped
// it; both end the calling goroutine, so Missing runs on its own.
type recorder struct {
	testing.TB
	failed, skipped bool
}

func (r *recorder) Helper()               {}
func (r *recorder) Fatalf(string, ...any) { r.failed = true; runtime.Goexit() }
func (r *recorder) Skip(...any)           { r.skipped = true; runtime.Goexit() }

func missing(t *testing.T) *recorder {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Missing(r, "frobnicator not installed")
		t.Error("Missing returned")
	}()
	<-done
	return r
}

// In CI a missing prerequisite fails the test; elsewhere it skips it.
func TestMissingFailsInCIAndSkipsElsewhere(t *testing.T) {
	t.Setenv(EnvVar, "")
	t.Setenv("CI", "")
	if r := missing(t); r.failed || !r.skipped {
		t.Errorf("outside CI: failed %v skipped %v; want a skip", r.failed, r.skipped)
	}
	for _, env := range []string{EnvVar, "CI"} {
		t.Setenv(env, "1")
		if !Enabled() {
			t.Errorf("%s=1: Enabled() = false", env)
		}
		if r := missing(t); !r.failed || r.skipped {
			t.Errorf("%s=1: failed %v skipped %v; want a failure", env, r.failed, r.skipped)
		}
		t.Setenv(env, "")
	}
}
