package segment

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
)

// SchemaVersion is the version of the encoded descriptor format. Decoders
// refuse versions they do not know (ErrSchema), so two differently built
// peers never silently disagree about the metadata.
//
// Encoding (schema 2): a JSON object {"schema":2,"segment":<Descriptor>}
// with the field names of the Descriptor's json tags. Unknown fields are
// rejected, except inside a protocol entry and its typed part: each
// protocol versions its own entry (Protocol.Version), and fields a build
// does not know are kept (the Extra maps) and written back.
//
// Schema 1 (te builds before typed protocol entries) carried the RDMA
// rails and keys at the top level (devices, buffers[].rkeys) and the other
// protocols' settings as strings (attrs). It is refused with an error
// saying to upgrade the te that published it: those builds refuse
// schema 2 as well, so a cluster runs one schema.
const SchemaVersion = 2

// MaxEncodedSize bounds a descriptor on the wire and in stores.
const MaxEncodedSize = 4 << 20

// ErrSchema: a descriptor was written in a schema this build does not
// read. It wraps ErrInvalid.
var ErrSchema = fmt.Errorf("%w: schema not supported", ErrInvalid)

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
	var env struct {
		Schema  int             `json:"schema"`
		Segment json.RawMessage `json:"segment"`
	}
	if err := strictDecode(b, &env); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if env.Schema != SchemaVersion {
		var named struct {
			Name string `json:"name"`
		}
		_ = json.Unmarshal(env.Segment, &named)
		who := "the peer that published it"
		if named.Name != "" {
			who = fmt.Sprintf("%q", named.Name)
		}
		if env.Schema < SchemaVersion {
			return nil, fmt.Errorf("%w: schema %d, this build reads %d: %s runs an older te; upgrade it", ErrSchema, env.Schema, SchemaVersion, who)
		}
		return nil, fmt.Errorf("%w: schema %d, this build reads %d: %s runs a newer te; upgrade this one", ErrSchema, env.Schema, SchemaVersion, who)
	}
	var d *Descriptor
	if err := strictDecode(env.Segment, &d); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if err := d.Validate(); err != nil {
		return nil, err
	}
	return d, nil
}

// strictDecode decodes one JSON value into v, refusing unknown fields and
// trailing data.
func strictDecode(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data")
	}
	return nil
}

// The method-less copies of the types that keep unknown fields, decoded
// strictly once the unknown fields are set aside.
type (
	protocolFields Protocol
	tcpFields      TCP
	rdmaFields     RDMA
	shmFields      SHM
)

// UnmarshalJSON decodes the known fields strictly and keeps the others in
// Extra, compacted (and HTML-escaped, as encoding/json writes them), so
// that encoding again reproduces them byte for byte.
func (p *Protocol) UnmarshalJSON(b []byte) error {
	var f protocolFields
	extra, err := decodeKeeping(b, &f)
	if err != nil {
		return err
	}
	*p = Protocol(f)
	p.Extra = extra
	return nil
}

// MarshalJSON writes the known fields and Extra, in key order. A key of
// Extra that names a known field is not written (the field is).
func (p Protocol) MarshalJSON() ([]byte, error) { return encodeKeeping(protocolFields(p), p.Extra) }

// UnmarshalJSON decodes the part, keeping unknown fields in Extra.
func (t *TCP) UnmarshalJSON(b []byte) error {
	var f tcpFields
	extra, err := decodeKeeping(b, &f)
	*t = TCP(f)
	t.Extra = extra
	return err
}

// MarshalJSON writes the part and its Extra.
func (t TCP) MarshalJSON() ([]byte, error) { return encodeKeeping(tcpFields(t), t.Extra) }

// UnmarshalJSON decodes the part, keeping unknown fields in Extra.
func (r *RDMA) UnmarshalJSON(b []byte) error {
	var f rdmaFields
	extra, err := decodeKeeping(b, &f)
	*r = RDMA(f)
	r.Extra = extra
	return err
}

// MarshalJSON writes the part and its Extra.
func (r RDMA) MarshalJSON() ([]byte, error) { return encodeKeeping(rdmaFields(r), r.Extra) }

// UnmarshalJSON decodes the part, keeping unknown fields in Extra.
func (s *SHM) UnmarshalJSON(b []byte) error {
	var f shmFields
	extra, err := decodeKeeping(b, &f)
	*s = SHM(f)
	s.Extra = extra
	return err
}

// MarshalJSON writes the part and its Extra.
func (s SHM) MarshalJSON() ([]byte, error) { return encodeKeeping(shmFields(s), s.Extra) }

// decodeKeeping decodes the JSON object b into *v (a struct), strictly for
// v's json fields, and returns b's other fields.
func decodeKeeping(b []byte, v any) (map[string]json.RawMessage, error) {
	var all map[string]json.RawMessage
	if err := json.Unmarshal(b, &all); err != nil {
		return nil, err
	}
	if all == nil {
		return nil, errors.New("entry is null")
	}
	known := jsonKeys(reflect.TypeOf(v).Elem())
	var extra map[string]json.RawMessage
	for k, raw := range all {
		if known[k] {
			continue
		}
		var c, e bytes.Buffer
		if err := json.Compact(&c, raw); err != nil {
			return nil, err
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
		return nil, err
	}
	return extra, strictDecode(rest, v)
}

// encodeKeeping encodes v (a struct) with extra's fields added, in key
// order; a key of extra that v knows is not written.
func encodeKeeping(v any, extra map[string]json.RawMessage) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil || len(extra) == 0 {
		return b, err
	}
	var all map[string]json.RawMessage
	if err := json.Unmarshal(b, &all); err != nil {
		return nil, err
	}
	known := jsonKeys(reflect.TypeOf(v))
	for k, raw := range extra {
		if !known[k] {
			all[k] = raw
		}
	}
	return json.Marshal(all)
}

// jsonKeys returns the JSON names of struct type t's encoded fields.
func jsonKeys(t reflect.Type) map[string]bool {
	keys := make(map[string]bool, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		keys[name] = true
	}
	return keys
}
