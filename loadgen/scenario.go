package loadgen

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// MaxScenarioFileSize bounds a scenario file.
const MaxScenarioFileSize = 1 << 20

// MaxScenarios bounds the scenarios in a mix.
const MaxScenarios = 64

// ErrScenarioFile wraps every error ParseScenarioFile returns.
var ErrScenarioFile = errors.New("bad scenario file")

// scenarioFile is the scenario file's top level.
type scenarioFile struct {
	Scenarios []Scenario `json:"scenarios"`
}

// ParseScenarioFile parses a mixed-workload file: a JSON object
//
//	{"scenarios": [
//	  {"name": "read",  "weight": 90, "kind": "get",  "path": "/counter/{id}/"},
//	  {"name": "incr",  "weight": 9,  "kind": "post", "path": "/counter/{id}/incr", "bodySize": 16},
//	  {"name": "watch", "weight": 1,  "kind": "ws",   "path": "/counter/{id}/ws"}
//	]}
//
// with the fields of Scenario. Unknown fields, trailing data, missing or
// invalid values are errors that name the scenario and the field. Paths may
// be omitted when defaultPath (Config.Path) is given; defaults are applied
// as New would apply them.
func ParseScenarioFile(data []byte, defaultPath string) ([]Scenario, error) {
	fail := func(format string, args ...any) ([]Scenario, error) {
		return nil, fmt.Errorf("%w: %s", ErrScenarioFile, fmt.Sprintf(format, args...))
	}
	if len(data) > MaxScenarioFileSize {
		return fail("larger than %d bytes", MaxScenarioFileSize)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var f scenarioFile
	if err := dec.Decode(&f); err != nil {
		var se *json.SyntaxError
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &se):
			return fail("invalid JSON at byte %d: %v", se.Offset, err)
		case errors.As(err, &te):
			return fail("field %s: got JSON %s, want %v", te.Field, te.Value, te.Type)
		}
		return fail("%v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fail("trailing data after the JSON object")
	}
	if len(f.Scenarios) == 0 {
		return fail(`no scenarios: want {"scenarios": [{"kind": "get", "path": "/counter/{id}/"}, ...]}`)
	}
	if len(f.Scenarios) > MaxScenarios {
		return fail("%d scenarios; at most %d", len(f.Scenarios), MaxScenarios)
	}
	if defaultPath == "" {
		defaultPath = DefaultPath
	}
	seen := make(map[string]bool, len(f.Scenarios))
	for i := range f.Scenarios {
		s := &f.Scenarios[i]
		if err := s.normalize(defaultPath); err != nil {
			return fail("scenarios[%d]: %v", i, err)
		}
		if seen[s.Name] {
			return fail("scenarios[%d]: duplicate name %q (names label the report rows)", i, s.Name)
		}
		seen[s.Name] = true
	}
	return f.Scenarios, nil
}

// LoadScenarioFile reads and parses a scenario file (see ParseScenarioFile).
func LoadScenarioFile(path, defaultPath string) ([]Scenario, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read scenario file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxScenarioFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("cannot read scenario file %s: %w", path, err)
	}
	scs, err := ParseScenarioFile(data, defaultPath)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return scs, nil
}
