package segment

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// SchemaVersion is the version of the encoded descriptor format. Decoders
// refuse versions they do not know, so two differently built peers never
// silently disagree about the metadata.
//
// Encoding (schema 1): a JSON object {"schema":1,"segment":<Descriptor>}
// with the field names of the Descriptor's json tags. Unknown fields are
// rejected.
const SchemaVersion = 1

// MaxEncodedSize bounds a descriptor on the wire and in stores.
const MaxEncodedSize = 4 << 20

type envelope struct {
	Schema  int         `json:"schema"`
	Segment *Descriptor `json:"segment"`
}

// Marshal validates d and encodes it.
func Marshal(d *Descriptor) ([]byte, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	b, err := json.Marshal(envelope{Schema: SchemaVersion, Segment: d})
	if err != nil {
		return nil, fmt.Errorf("segment: encode %s: %w", d.Name, err)
	}
	if len(b) > MaxEncodedSize {
		return nil, fmt.Errorf("%w: %s: encoded size %d exceeds %d", ErrInvalid, d.Name, len(b), MaxEncodedSize)
	}
	return b, nil
}

// Unmarshal decodes and validates a descriptor produced by Marshal,
// possibly by another process. It never trusts the input.
func Unmarshal(b []byte) (*Descriptor, error) {
	if len(b) > MaxEncodedSize {
		return nil, fmt.Errorf("%w: encoded size %d exceeds %d", ErrInvalid, len(b), MaxEncodedSize)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var env envelope
	if err := dec.Decode(&env); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: trailing data", ErrInvalid)
	}
	if env.Schema != SchemaVersion {
		return nil, fmt.Errorf("%w: schema %d, want %d", ErrInvalid, env.Schema, SchemaVersion)
	}
	if err := env.Segment.Validate(); err != nil {
		return nil, err
	}
	return env.Segment, nil
}
