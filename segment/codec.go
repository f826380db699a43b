package segment

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
)

// SchemaVersion is the version of the encoded descriptor format. Decoders
// refuse versions they do not know, so two differently built peers never
// silently disagree about the metadata.
//
// Encoding (schema 1): a JSON object {"schema":1,"segment":<Descriptor>}
// with the field names of the Descriptor's json tags. Unknown fields are
// rejected, except inside a protocol entry: each protocol versions its own
// entry (Protocol.Version), and fields a build does not know are kept
// (Protocol.Extra) and written back. Builds before Protocol.Version
// rejected those as well.
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

// protocolFields is Protocol's known part on the wire.
type protocolFields struct {
	Name     string            `json:"name"`
	Endpoint string            `json:"endpoint,omitempty"`
	Attrs    map[string]string `json:"attrs,omitempty"`
	Version  int               `json:"version,omitempty"`
}

var protocolKeys = []string{"name", "endpoint", "attrs", "version"}

// UnmarshalJSON decodes the known fields strictly and keeps the others in
// Extra, compacted (and HTML-escaped, as encoding/json writes them), so
// that encoding again reproduces them byte for byte.
func (p *Protocol) UnmarshalJSON(b []byte) error {
	var all map[string]json.RawMessage
	if err := json.Unmarshal(b, &all); err != nil {
		return err
	}
	if all == nil {
		return fmt.Errorf("protocol entry is null")
	}
	var known protocolFields
	var extra map[string]json.RawMessage
	for k, v := range all {
		if slices.Contains(protocolKeys, k) {
			continue
		}
		var c, e bytes.Buffer
		if err := json.Compact(&c, v); err != nil {
			return err
		}
		json.HTMLEscape(&e, c.Bytes())
		if extra == nil {
			extra = map[string]json.RawMessage{}
		}
		extra[k] = e.Bytes()
		delete(all, k)
	}
	rest, err := json.Marshal(all)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(rest))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&known); err != nil {
		return err
	}
	*p = Protocol{Name: known.Name, Endpoint: known.Endpoint, Attrs: known.Attrs, Version: known.Version, Extra: extra}
	return nil
}

// MarshalJSON writes the known fields and Extra, in key order. A key of
// Extra that names a known field is not written (the field is).
func (p Protocol) MarshalJSON() ([]byte, error) {
	known, err := json.Marshal(protocolFields{Name: p.Name, Endpoint: p.Endpoint, Attrs: p.Attrs, Version: p.Version})
	if err != nil || len(p.Extra) == 0 {
		return known, err
	}
	var all map[string]json.RawMessage
	if err := json.Unmarshal(known, &all); err != nil {
		return nil, err
	}
	for k, v := range p.Extra {
		if _, ok := all[k]; !ok && !slices.Contains(protocolKeys, k) {
			all[k] = v
		}
	}
	return json.Marshal(all)
}
