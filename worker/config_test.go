package worker

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func validConfig() Config {
	return Config{PinboardURL: "http://127.0.0.1:1", AdvertiseURL: "http://127.0.0.1:2", Token: "t"}
}

func TestNewValidates(t *testing.T) {
	f := func(name string, mutate func(*Config), want string) {
		t.Helper()
		c := validConfig()
		mutate(&c)
		_, err := New(c)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("New(%s) = %v; want an error containing %q", name, err, want)
		}
	}
	f("no pinboard", func(c *Config) { c.PinboardURL = "" }, "PinboardURL: empty")
	f("pinboard scheme", func(c *Config) { c.PinboardURL = "ftp://x" }, "PinboardURL: scheme")
	f("pinboard without host", func(c *Config) { c.PinboardURL = "http://" }, "has no host")
	f("pinboard query", func(c *Config) { c.PinboardURL = "http://x/?a=b" }, "query")
	f("no advertise", func(c *Config) { c.AdvertiseURL = "" }, "AdvertiseURL: empty")
	f("advertise path", func(c *Config) { c.AdvertiseURL = "http://10.0.0.1:8000/app" }, "must not carry a path")
	f("advertise userinfo", func(c *Config) { c.AdvertiseURL = "http://u:p@10.0.0.1" }, "userinfo")
	f("no token", func(c *Config) { c.Token = "" }, "Token is empty")
	f("negative heartbeat", func(c *Config) { c.HeartbeatInterval = -1 }, "HeartbeatInterval is negative")
	f("backoff max below base", func(c *Config) { c.BackoffBase, c.BackoffMax = time.Second, time.Millisecond }, "raise BackoffMax")
	f("buffer ≥ default lease", func(c *Config) { c.LeaseBuffer = 10 * time.Second }, "lower LeaseBuffer")
	f("too few attempts", func(c *Config) { c.HeartbeatInterval = 4 * time.Second }, "need at least 3")

	c := validConfig()
	c.LeaseBuffer = 11 * time.Second
	if _, err := New(c); !errors.Is(err, ErrBadTiming) {
		t.Errorf("New(buffer 11s) = %v; want ErrBadTiming", err)
	}
	c = validConfig()
	c.Token = ""
	if _, err := New(c); !errors.Is(err, ErrConfig) {
		t.Errorf("New(no token) = %v; want ErrConfig", err)
	}
}

func TestNewDefaults(t *testing.T) {
	c := validConfig()
	c.PinboardURL = "https://pinboard.internal/prefix/"
	c.AdvertiseURL = "http://10.0.3.7:8000/"
	w, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	got := w.cfg
	if got.HeartbeatInterval != DefaultHeartbeatInterval || got.LeaseBuffer != DefaultLeaseBuffer ||
		got.RetryInterval != DefaultRetryInterval || got.RequestTimeout != DefaultRequestTimeout ||
		got.BackoffBase != DefaultBackoffBase || got.BackoffMax != DefaultBackoffMax ||
		got.ReleaseAttempts != DefaultReleaseAttempts || got.ReleaseBackoff != DefaultReleaseBackoff ||
		got.ShutdownPollInterval != DefaultShutdownPollInterval || got.MaxConns != DefaultMaxConns ||
		got.Logger == nil || got.Metrics == nil || got.Clock == nil {
		t.Fatalf("defaults not applied: %+v", got)
	}
	if w.AdvertiseURL() != "http://10.0.3.7:8000" || w.pinboard.base != "https://pinboard.internal/prefix" || w.pinboard.hc.Addr != "pinboard.internal:443" {
		t.Fatalf("URLs: advertise %q, pinboard %q at %q", w.AdvertiseURL(), w.pinboard.base, w.pinboard.hc.Addr)
	}
	w2, err := New(validConfig())
	if err != nil {
		t.Fatal(err)
	}
	if len(w.ClientID()) < 26 || len(w.secret) < 26 || w.ClientID() == w2.ClientID() || string(w.secret) == string(w2.secret) {
		t.Fatalf("clientId %q / secret: want fresh ≥128-bit values per worker", w.ClientID())
	}
	if w.Ready() || w.Session() != "" || !w.ExpiresAt().IsZero() || w.Remaining() != 0 || w.Draining() {
		t.Fatal("a new worker must hold no lease and not drain")
	}
}

func TestCheckTiming(t *testing.T) {
	s := time.Second
	f := func(lease, buffer, hb, retry time.Duration, want string) {
		t.Helper()
		err := CheckTiming(lease, buffer, hb, retry)
		switch {
		case want == "" && err != nil:
			t.Errorf("CheckTiming(%v, %v, %v, %v) = %v; want nil", lease, buffer, hb, retry, err)
		case want != "" && (err == nil || !errors.Is(err, ErrBadTiming) || !strings.Contains(err.Error(), want)):
			t.Errorf("CheckTiming(%v, %v, %v, %v) = %v; want ErrBadTiming containing %q", lease, buffer, hb, retry, err, want)
		}
	}
	f(10*s, 5*s, 3*s, s/2, "") // the defaults: attempts at 3, 3.5, 4, 4.5
	f(10*s, 4*s, 3*s, s, "")   // attempts at 3, 4, 5
	f(15*s, 5*s, 2*s, 2*s, "") // k8s-like: 2, 4, 6, 8
	f(10*s, 10*s, 3*s, s/2, "lower LeaseBuffer or raise")
	f(10*s, 12*s, 3*s, s/2, "lower LeaseBuffer or raise")
	f(10*s, 5*s, 3*s, s, "only 2 heartbeat attempts")   // 3, 4
	f(10*s, 5*s, 5*s, s/2, "only 0 heartbeat attempts") // heartbeat at the deadline
	f(10*s, 5*s, 4*s, s/2, "only 2 heartbeat attempts") // 4, 4.5
	f(0, 5*s, 3*s, s/2, "not positive")
	f(10*s, 0, 3*s, s/2, "must be positive")
}
