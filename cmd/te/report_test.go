package main

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/rdmago/te/internal/cli"
)

// decodeReport checks that b is te's one JSON envelope for command cmd and
// decodes its results as []T, refusing fields T does not have.
func decodeReport[T any](t *testing.T, cmd string, b []byte) []T {
	t.Helper()
	r, err := cli.ParseReport(b)
	if err != nil {
		t.Fatalf("te %s --json: not the envelope: %v\n%s", cmd, err, b)
	}
	if r.Command != cmd {
		t.Fatalf("te %s --json: command %q", cmd, r.Command)
	}
	out := make([]T, 0, len(r.Results))
	for i, raw := range r.Results {
		var v T
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("te %s --json: result %d: %v\n%s", cmd, i, err, raw)
		}
		out = append(out, v)
	}
	return out
}
