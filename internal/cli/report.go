package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// Schema names the version of the JSON every te command prints with
// --json (docs/cli.md). A change that renames, removes or retypes a field
// takes a new version; new fields do not.
const Schema = "te/v1"

// Report is the one JSON shape of --json: the same top-level object for
// every command, whatever it measured or listed, with its results always
// an array (one element or many).
type Report[T any] struct {
	Schema    string         `json:"schema"`
	TEVersion string         `json:"te_version"`
	Time      time.Time      `json:"time"` // when the command started
	Host      string         `json:"host"`
	Command   string         `json:"command"` // "bench", "segments", ...
	Flags     map[string]any `json:"flags"`   // every flag's value, names with _ for -
	Results   []T            `json:"results"`
}

// NewReport starts a report for the command fs parsed; call it right after
// Parse, so Time is when the work began.
func NewReport[T any](fs *FlagSet) *Report[T] {
	host, _ := os.Hostname()
	return &Report[T]{
		Schema:    Schema,
		TEVersion: ReadBuild().Short(),
		Time:      time.Now().UTC(),
		Host:      host,
		Command:   strings.TrimPrefix(fs.Cmd(), "te "),
		Flags:     FlagValues(fs),
	}
}

// FlagValues maps every flag (not the aliases) to its value: numbers as
// numbers (sizes in bytes, durations in seconds), booleans, lists as
// arrays, the rest as strings.
func FlagValues(fs *FlagSet) map[string]any {
	m := map[string]any{}
	fs.VisitAll(func(f *flag.Flag) {
		k := strings.ReplaceAll(f.Name, "-", "_")
		if g, ok := f.Value.(flag.Getter); ok {
			v := g.Get()
			if d, ok := v.(time.Duration); ok {
				v = d.Seconds()
			}
			m[k] = v
			return
		}
		m[k] = f.Value.String()
	})
	return m
}

// Write writes the report, indented, with a newline.
func (r *Report[T]) Write(w io.Writer) error {
	if r.Results == nil {
		r.Results = []T{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// ParseReport reads a report and checks the envelope: every field present
// with its type, the schema this package writes, no other top-level field.
// The results stay raw for the caller to decode.
func ParseReport(b []byte) (*Report[json.RawMessage], error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	want := []string{"schema", "te_version", "time", "host", "command", "flags", "results"}
	var errs []error
	for _, k := range want {
		if _, ok := raw[k]; !ok {
			errs = append(errs, fmt.Errorf("no %q", k))
		}
	}
	for k := range raw {
		found := false
		for _, w := range want {
			found = found || w == k
		}
		if !found {
			errs = append(errs, fmt.Errorf("unknown field %q", k))
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	var r Report[json.RawMessage]
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return nil, err
	}
	switch {
	case r.Schema != Schema:
		return nil, fmt.Errorf("schema %q, want %q", r.Schema, Schema)
	case r.TEVersion == "" || r.Host == "" || r.Command == "":
		return nil, fmt.Errorf("empty te_version, host or command")
	case r.Time.IsZero():
		return nil, fmt.Errorf("no time")
	case r.Flags == nil:
		return nil, fmt.Errorf("flags is not an object")
	case r.Results == nil:
		return nil, fmt.Errorf("results is not an array")
	}
	return &r, nil
}
