package mooncake

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// FuzzDecode: no input panics; whatever decodes encodes, decodes to the
// same descriptor, and translates to a valid te descriptor.
func FuzzDecode(f *testing.F) {
	files, _ := filepath.Glob("testdata/*.json")
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"name":"h","protocol":["tcp"],"buffers":[{"name":"h","addr":1.4e+14,"length":1}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := Decode(b)
		if err != nil {
			return
		}
		enc, err := Encode(d)
		if err != nil {
			t.Fatalf("decoded but cannot encode: %v", err)
		}
		d2, err := Decode(enc)
		if err != nil {
			t.Fatalf("own encoding refused: %v\n%s", err, enc)
		}
		if d.Timestamp == "" {
			d.Timestamp = d2.Timestamp
		}
		if diff := cmp.Diff(d, d2, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("round trip (-first +second):\n%s", diff)
		}
		if _, err := ToTE(d, ToOptions{}); err != nil {
			t.Fatalf("valid descriptor does not translate: %v", err)
		}
	})
}
