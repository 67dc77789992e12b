package host

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/pinned-go/pinned/internal/testkit/promcheck"
)

func TestConfigValidation(t *testing.T) {
	f := func(name string, cfg Config, want string) {
		t.Helper()
		_, err := New(cfg, newEnv().typ())
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: New error = %v; want it to mention %q", name, err, want)
		}
	}
	f("no namespace", Config{}, "Namespace")
	f("namespace without slash", Config{Namespace: "counter"}, "Namespace")
	f("namespace with two segments", Config{Namespace: "/a/b"}, "Namespace")
	f("negative MaxInstances", Config{Namespace: "/p", MaxInstances: -1}, "MaxInstances")
	f("tiny SweepInterval", Config{Namespace: "/p", SweepInterval: time.Microsecond}, "SweepInterval")
	f("negative RetryAfter", Config{Namespace: "/p", RetryAfter: -time.Second}, "RetryAfter")
	f("MaxIDLen too big", Config{Namespace: "/p", MaxIDLen: 257}, "MaxIDLen")
	f("Shards not a power of two", Config{Namespace: "/p", Shards: 3}, "Shards")
	f("negative ReleaseTimeout", Config{Namespace: "/p", ReleaseTimeout: -1}, "ReleaseTimeout")
	f("negative WebSocketWriteTimeout", Config{Namespace: "/p", WebSocketWriteTimeout: -1}, "WebSocketWriteTimeout")

	if _, err := New(Config{Namespace: "/p"}, Type[*probe]{Routes: newEnv().typ().Routes}); err == nil || !strings.Contains(err.Error(), "Type.New") {
		t.Errorf("New without Type.New: error = %v; want it to mention Type.New", err)
	}

	c, err := Config{Namespace: "/p"}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxInstances != DefaultMaxInstances || c.IdleTimeout != DefaultIdleTimeout ||
		c.SweepInterval != DefaultSweepInterval || c.RetryAfter != DefaultRetryAfter ||
		c.MaxIDLen != 256 || c.Shards != DefaultShards || c.CloseWait != DefaultCloseWait {
		t.Errorf("defaults = %+v", c)
	}
	c, _ = Config{Namespace: "/p", IdleTimeout: 2 * time.Second}.withDefaults()
	if c.SweepInterval != 500*time.Millisecond {
		t.Errorf("SweepInterval for IdleTimeout 2s = %v; want 500ms", c.SweepInterval)
	}
}

func TestRetryAfterRoundsUp(t *testing.T) {
	f := func(d time.Duration, want string) {
		t.Helper()
		h, err := New(Config{Namespace: "/p", RetryAfter: d}, newEnv().typ())
		if err != nil {
			t.Fatal(err)
		}
		if h.retryAfter != want {
			t.Errorf("RetryAfter %v → header %q; want %q", d, h.retryAfter, want)
		}
	}
	f(time.Millisecond, "1")
	f(time.Second, "1")
	f(1500*time.Millisecond, "2")
	f(time.Minute, "60")
}

func TestMetricsExposition(t *testing.T) {
	set := metrics.NewSet()
	e := newEnv()
	ts := newTestHost(t, Config{Metrics: set, MaxInstances: 1}, e)
	ts.expect(200, "GET", "/p/a/")
	ts.expect(503, "GET", "/p/b/")
	ts.expect(400, "GET", "/p/.x/")
	ts.expect(200, "GET", "/p/a/abort")
	e.waitTorn(t, "a")
	waitFor(t, "a to leave", func() bool { return ts.h.Len() == 0 })
	if ts.h.Metrics() != set {
		t.Error("Metrics() is not the configured set")
	}
	var b bytes.Buffer
	set.WritePrometheus(&b)
	out := b.String()
	for _, want := range []string{
		`pinned_instances{namespace="/p"} 0`,
		`pinned_activations_total{namespace="/p"} 1`,
		`pinned_evictions_total{namespace="/p",reason="abort"} 1`,
		`pinned_aborts_total{namespace="/p"} 1`,
		`pinned_rejections_total{namespace="/p",reason="capacity"} 1`,
		`pinned_rejections_total{namespace="/p",reason="invalid_id"} 1`,
		`pinned_request_duration_seconds_count{namespace="/p"} 2`,
		`pinned_request_duration_seconds_bucket{namespace="/p",le="+Inf"} 2`,
		`pinned_open_streams{namespace="/p"} 0`,
		`pinned_open_websockets{namespace="/p"} 0`,
		`pinned_tasks{namespace="/p"} 0`,
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("metrics lack %q; got:\n%s", want, out)
		}
	}
}

func TestEscapeLabelValue(t *testing.T) {
	f := func(in, want string) {
		t.Helper()
		if got := escapeLabelValue(in); got != want {
			t.Errorf("escapeLabelValue(%q) = %q; want %q", in, got, want)
		}
	}
	f("/counter", "/counter")
	f(`a"b`, `a\"b`)
	f(`a\b`, `a\\b`)
	f("a\nb", `a\nb`)
	// The result must be accepted by the metrics library.
	metrics.NewSet().NewCounter(`x_total{namespace="` + escapeLabelValue("a\"\\\n") + `"}`)
}

// No namespace can panic the metrics library: New refuses those outside
// the grammar with an error, every byte the grammar allows works, and the
// label escaping holds even for names New would refuse (newHostMetrics
// called directly); the exposition always parses.
func TestHostileNamespaces(t *testing.T) {
	hostile := []string{`/a"b`, `/a\b`, "/a\nb", "/a}b", `/a",x="y`, "/\xff\xfe", "/é", "/" + strings.Repeat("n", 300), "", "/", "x", "/a b", "/a{b}"}
	for _, ns := range hostile {
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Errorf("New with namespace %q panicked: %v", ns, p)
				}
			}()
			if _, err := New(Config{Namespace: ns, Logger: quietLogger()}, newEnv().typ()); err == nil {
				t.Errorf("New accepted namespace %q", ns)
			}
		}()
	}
	set := metrics.NewSet()
	for _, ns := range append(hostile, "/A-z0_9.~@:+=-") {
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Errorf("newHostMetrics(%q) panicked: %v", ns, p)
				}
			}()
			m := newHostMetrics(set, ns)
			m.activations.Inc()
			m.duration.Update(0.001)
		}()
	}
	if _, err := New(Config{Namespace: "/A-z0_9.~@:+=-", Metrics: set, Logger: quietLogger()}, newEnv().typ()); err != nil {
		t.Fatalf("New with every byte class of the grammar: %v", err)
	}
	var b bytes.Buffer
	set.WritePrometheus(&b)
	fams := promcheck.Parse(t, "host metrics with hostile namespaces", b.Bytes())
	if got := fams["pinned_activations_total"].Series; got != len(hostile)+1 {
		t.Errorf("pinned_activations_total has %d series; want %d (one per namespace)", got, len(hostile)+1)
	}
}
