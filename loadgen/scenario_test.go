package loadgen

import (
	"errors"
	"math"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/pinned-go/pinned/clock"
)

func TestParseScenarioFile(t *testing.T) {
	got, err := ParseScenarioFile([]byte(`{"scenarios": [
		{"name": "read", "weight": 90, "kind": "get"},
		{"weight": 9, "kind": "post", "path": "/counter/{id}/incr", "headers": {"X-A": "b"}},
		{"name": "blob", "kind": "download", "path": "/files/{id}"},
		{"name": "up", "kind": "upload", "method": "PUT", "bodySize": 1048576},
		{"kind": "ws", "path": "/counter/{id}/ws", "bodySize": 64}
	]}`), "/c/{id}/")
	if err != nil {
		t.Fatal(err)
	}
	want := []Scenario{
		{Name: "read", Weight: 90, Kind: KindGet, Method: "GET", Path: "/c/{id}/"},
		{Name: "post", Weight: 9, Kind: KindPost, Method: "POST", Path: "/counter/{id}/incr", BodySize: DefaultPostBodySize, Headers: map[string]string{"X-A": "b"}},
		{Name: "blob", Weight: 1, Kind: KindDownload, Method: "GET", Path: "/files/{id}"},
		{Name: "up", Weight: 1, Kind: KindUpload, Method: "PUT", Path: "/c/{id}/", BodySize: 1 << 20},
		{Name: "ws", Weight: 1, Kind: KindWS, Method: "GET", Path: "/counter/{id}/ws", BodySize: 64},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ParseScenarioFile =\n%+v\nwant\n%+v", got, want)
	}
}

func TestParseScenarioFileErrors(t *testing.T) {
	f := func(name, data, wantInErr string) {
		t.Run(name, func(t *testing.T) {
			_, err := ParseScenarioFile([]byte(data), "")
			if err == nil || !errors.Is(err, ErrScenarioFile) || !strings.Contains(err.Error(), wantInErr) {
				t.Errorf("ParseScenarioFile(%q) error = %v; want ErrScenarioFile mentioning %q", data, err, wantInErr)
			}
		})
	}
	f("empty", ``, "EOF")
	f("not JSON", `scenarios: []`, "invalid JSON at byte 1")
	f("no scenarios", `{"scenarios": []}`, "no scenarios")
	f("missing key", `{}`, "no scenarios")
	f("unknown field", `{"scenarios": [{"kind": "get", "wieght": 2}]}`, `unknown field "wieght"`)
	f("unknown top-level field", `{"scenario": []}`, `unknown field "scenario"`)
	f("wrong type", `{"scenarios": [{"weight": "high"}]}`, "field scenarios.weight")
	f("trailing data", `{"scenarios": [{"kind": "get"}]} {}`, "trailing data")
	f("bad kind", `{"scenarios": [{"kind": "gett"}]}`, `scenarios[0]: kind "gett": want get, post, download, upload or ws`)
	f("negative weight", `{"scenarios": [{"kind": "get"}, {"kind": "post", "weight": -1}]}`, "scenarios[1]: post: weight -1")
	f("duplicate names", `{"scenarios": [{"kind": "get"}, {"kind": "get"}]}`, `scenarios[1]: duplicate name "get"`)
	f("relative path", `{"scenarios": [{"path": "counter/{id}"}]}`, "must start with '/'")
	f("bad placeholder", `{"scenarios": [{"path": "/c/{ID}"}]}`, "'{' must start the placeholder {id}")
	f("space in path", `{"scenarios": [{"path": "/c /{id}"}]}`, "not allowed in a request path")
	f("body on get", `{"scenarios": [{"kind": "get", "bodySize": 10}]}`, "bodySize is only for post, upload and ws")
	f("negative body", `{"scenarios": [{"kind": "upload", "bodySize": -5}]}`, "bodySize -5")
	f("huge post", `{"scenarios": [{"kind": "post", "bodySize": 1000000000}]}`, "want 0..67108864")
	f("tiny ws", `{"scenarios": [{"kind": "ws", "bodySize": 8}]}`, "at least 24 bytes")
	f("bad method", `{"scenarios": [{"method": "GE T"}]}`, "not an HTTP token")
	f("bad header", `{"scenarios": [{"headers": {"X-A": "a\r\nb"}}]}`, "CR, LF or NUL")
	f("too many", `{"scenarios": [`+strings.Repeat(`{"kind": "get"},`, MaxScenarios)+`{"kind": "get"}]}`, "at most 64")
}

func TestLoadScenarioFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "mix.json")
	if err := os.WriteFile(p, []byte(`{"scenarios": [{"kind": "post", "weight": 2}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	scs, err := LoadScenarioFile(p, "/x/{id}")
	if err != nil || len(scs) != 1 || scs[0].Path != "/x/{id}" || scs[0].Weight != 2 {
		t.Fatalf("LoadScenarioFile = %+v, %v", scs, err)
	}
	if _, err := LoadScenarioFile(filepath.Join(dir, "missing.json"), ""); err == nil || !strings.Contains(err.Error(), "cannot read scenario file") {
		t.Errorf("missing file: err = %v", err)
	}
	bad := filepath.Join(dir, "bad.json")
	_ = os.WriteFile(bad, []byte(`{"scenarios": [{"kind": "nope"}]}`), 0o600)
	if _, err := LoadScenarioFile(bad, ""); err == nil || !strings.Contains(err.Error(), bad) {
		t.Errorf("bad file: err = %v; want the path in it", err)
	}
}

// The fuzzer checks that the parser never panics and that whatever it
// accepts is a valid workload for New.
func FuzzParseScenarioFile(f *testing.F) {
	f.Add([]byte(`{"scenarios": [{"name": "read", "weight": 90, "kind": "get"}, {"kind": "ws", "path": "/c/{id}/ws"}]}`))
	f.Add([]byte(`{"scenarios": [{"kind": "upload", "bodySize": 1048576, "headers": {"X-A": "b"}}]}`))
	f.Add([]byte(`{"scenarios": [{"kind": "post", "weight": 1e308}, {"kind": "get", "weight": 1e308}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		scs, err := ParseScenarioFile(data, "")
		if err != nil {
			if !errors.Is(err, ErrScenarioFile) {
				t.Fatalf("error %v does not wrap ErrScenarioFile", err)
			}
			return
		}
		sum := 0.0
		for _, s := range scs {
			sum += s.Weight
		}
		if !(sum > 0) || math.IsInf(sum, 0) {
			t.Fatalf("accepted weights sum to %v", sum)
		}
		if _, err := New(Config{URL: "http://127.0.0.1:1", Scenarios: scs}); err != nil {
			t.Fatalf("accepted scenarios %+v rejected by New: %v", scs, err)
		}
	})
}

func TestConfigValidation(t *testing.T) {
	ok := Config{URL: "http://127.0.0.1:8080"}
	f := func(name string, mutate func(*Config), wantInErr string) {
		t.Run(name, func(t *testing.T) {
			c := ok
			mutate(&c)
			_, err := New(c)
			switch {
			case wantInErr == "" && err != nil:
				t.Errorf("New: %v; want ok", err)
			case wantInErr != "" && (err == nil || !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), wantInErr)):
				t.Errorf("New error = %v; want ErrConfig mentioning %q", err, wantInErr)
			}
		})
	}
	f("defaults", func(*Config) {}, "")
	f("no url", func(c *Config) { c.URL = "" }, "URL is required")
	f("https", func(c *Config) { c.URL = "https://127.0.0.1" }, "")
	f("ftp", func(c *Config) { c.URL = "ftp://127.0.0.1" }, "scheme must be http or https")
	f("stages", func(c *Config) { c.Stages = []Stage{{Duration: time.Second, Rate: 10, EndRate: 100}, {Rate: 100}} }, "")
	f("stages and rate", func(c *Config) { c.Rate, c.Stages = 5, []Stage{{Rate: 10}} }, "Stages replace Rate")
	f("stage without rate", func(c *Config) { c.Stages = []Stage{{Duration: time.Second}} }, "Stages[0]: rates")
	f("open stage not last", func(c *Config) { c.Stages = []Stage{{Rate: 1}, {Rate: 2, Duration: time.Second}} }, "only the last stage may be open-ended")
	f("loop engine over https", func(c *Config) { c.URL, c.Engine = "https://127.0.0.1", EngineLoop }, "speaks plain http only")
	f("loop engine with ws", func(c *Config) { c.Engine, c.Scenarios = EngineLoop, []Scenario{{Kind: KindWS}} }, "no websocket client")
	f("bad engine", func(c *Config) { c.Engine = "turbo" }, `Engine = "turbo"`)
	f("negative loops", func(c *Config) { c.Loops = -1 }, "Loops = -1")
	f("body template", func(c *Config) { c.Scenarios = []Scenario{{Kind: KindPost, Body: `{"id":"{id}"}`, Method: "PUT"}} }, "")
	f("body on get", func(c *Config) { c.Scenarios = []Scenario{{Body: "x"}} }, "body is only for kind post")
	f("body and size", func(c *Config) { c.Scenarios = []Scenario{{Kind: KindPost, Body: "x", BodySize: 3}} }, "both set")
	f("method template", func(c *Config) { c.Scenarios = []Scenario{{Method: "M{id}"}} }, "")
	f("bad method", func(c *Config) { c.Scenarios = []Scenario{{Method: "G T"}} }, "not an HTTP token")
	f("url with path", func(c *Config) { c.URL = "http://127.0.0.1/x" }, "no path")
	f("port beyond 65535", func(c *Config) { c.URL = "http://127.0.0.1:99999" }, "port 99999 is out of range; want 1 to 65535")
	f("port 0", func(c *Config) { c.URL = "http://127.0.0.1:0" }, "port 0 is out of range")
	f("port 65535", func(c *Config) { c.URL = "http://127.0.0.1:65535" }, "")
	f("both unbounded", func(c *Config) { c.Duration, c.Requests = Unbounded, Unbounded }, "both unbounded")
	f("duration unbounded ok", func(c *Config) { c.Duration = Unbounded }, "")
	f("negative rate", func(c *Config) { c.Rate = -1 }, "Rate = -1")
	f("too many connections", func(c *Config) { c.Connections = MaxConnections + 1 }, "Connections")
	f("negative warmup", func(c *Config) { c.Warmup = -time.Second }, "Warmup")
	f("negative timeout", func(c *Config) { c.Timeout = -time.Second }, "Timeout = -1s")
	f("tiny max latency", func(c *Config) { c.MaxLatency = time.Microsecond }, "MaxLatency")
	f("bad dist", func(c *Config) { c.IDs.Dist = "pareto" }, `IDs.Dist = "pareto"`)
	f("bad zipf", func(c *Config) { c.IDs.ZipfS = -1 }, "IDs.ZipfS")
	f("bad prefix", func(c *Config) { c.IDs.Prefix = "a/b" }, "IDs.Prefix")
	f("bad header", func(c *Config) { c.Headers = []Header{{"Bad Name", "x"}} }, "not an HTTP token")
	f("bad path", func(c *Config) { c.Path = "nope" }, "Path")
	f("duplicate scenario", func(c *Config) { c.Scenarios = []Scenario{{Name: "a"}, {Name: "a"}} }, "duplicate name")
}

// TestEngineChoice: the auto engine is the event loops whenever they can run
// the workload, fasthttp otherwise.
func TestEngineChoice(t *testing.T) {
	f := func(name string, c Config, want Engine) {
		t.Helper()
		r, err := New(c)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if r.Engine() != want {
			t.Errorf("%s: engine %q; want %q", name, r.Engine(), want)
		}
	}
	f("plain http", Config{URL: "http://127.0.0.1:1"}, EngineLoop)
	f("https", Config{URL: "https://127.0.0.1:1"}, EngineFastHTTP)
	f("ws in the mix", Config{URL: "http://127.0.0.1:1", Scenarios: []Scenario{{Name: "a"}, {Name: "w", Kind: KindWS}}}, EngineFastHTTP)
	f("custom dial", Config{URL: "http://127.0.0.1:1", Dial: func(string) (net.Conn, error) { return nil, nil }}, EngineFastHTTP)
	f("fake clock", Config{URL: "http://127.0.0.1:1", Clock: clock.NewFake(time.Unix(0, 0))}, EngineFastHTTP)
	f("forced fasthttp", Config{URL: "http://127.0.0.1:1", Engine: EngineFastHTTP}, EngineFastHTTP)
}
