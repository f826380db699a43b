// Package p2p speaks Mooncake's P2PHANDSHAKE socket: the small TCP
// listener through which a Mooncake process hands out its segment
// descriptor (Metadata), answers liveness probes (Probe), receives
// notifications (Notify) and sets up RDMA queue pairs (Connection). In
// P2PHANDSHAKE mode there is no metadata store: a segment's name is ip:port
// of this listener.
//
// Store is a segment.Store in both roles: it answers Mooncake initiators
// with a Mooncake-format descriptor of what the te engine published, and
// fetches Mooncake targets' descriptors, translated to te's, for the
// engine. Fetch, Probe and the message functions are the same exchanges
// without a store.
//
// Wire (Mooncake 777cc778, common.h writeString/readString): a u64 length
// in little-endian byte order that counts the type byte, one type byte, a
// JSON body; one request and one reply per connection. te bounds the
// length (DefaultMaxMessage, as Mooncake), every wait (Options.Timeout or
// the caller's context) and the connections served at once.
package p2p

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Type is a handshake message's type byte.
type Type uint8

// Message types.
const (
	Connection Type = 0 // RDMA endpoint handshake
	Metadata   Type = 1 // segment descriptor exchange
	Notify     Type = 2 // notification
	Probe      Type = 3 // liveness
	// Untyped marks the legacy framing: no type byte, the body is a
	// Connection message (a first body byte above 3).
	Untyped Type = 0xff
)

func (t Type) String() string {
	switch t {
	case Connection:
		return "Connection"
	case Metadata:
		return "Metadata"
	case Notify:
		return "Notify"
	case Probe:
		return "Probe"
	case Untyped:
		return "Untyped"
	}
	return fmt.Sprintf("Type(%d)", uint8(t))
}

// DefaultMaxMessage is the largest message accepted by default: Mooncake
// refuses bodies above 1 MiB unless MC_HANDSHAKE_MAX_LENGTH raises it.
const DefaultMaxMessage = 1 << 20

// Errors; compare with errors.Is.
var (
	// ErrMalformed: the peer's message breaks the framing or its body is
	// not JSON.
	ErrMalformed = errors.New("mooncake/p2p: malformed message")
	// ErrTooLarge: a message's length is 0 or above the bound.
	ErrTooLarge = errors.New("mooncake/p2p: message length out of bounds")
	// ErrRefused: the receiver answered a Notify with an empty
	// notify_msg: it did not take the notification.
	ErrRefused = errors.New("mooncake/p2p: notification refused")
)

// AppendMessage appends one framed message to dst. Untyped writes the
// legacy form (no type byte).
func AppendMessage(dst []byte, t Type, body []byte) []byte {
	n := uint64(len(body))
	if t != Untyped {
		n++
	}
	dst = binary.LittleEndian.AppendUint64(dst, n)
	if t != Untyped {
		dst = append(dst, byte(t))
	}
	return append(dst, body...)
}

// ReadMessage reads one framed message of at most max bytes (length
// included the type byte). The body's memory grows as bytes arrive, so a
// peer that announces a large message and sends nothing costs nothing.
// A first byte above 3 is the legacy untyped framing: the type is Untyped
// and the body is the whole payload.
func ReadMessage(r io.Reader, max int) (Type, []byte, error) {
	var lb [8]byte
	if _, err := io.ReadFull(r, lb[:]); err != nil {
		return 0, nil, err
	}
	n := binary.LittleEndian.Uint64(lb[:])
	if n == 0 || n > uint64(max) {
		return 0, nil, fmt.Errorf("%w: %d bytes (bound %d)", ErrTooLarge, n, max)
	}
	var buf bytes.Buffer
	if _, err := io.CopyN(&buf, r, int64(n)); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, fmt.Errorf("%w: %d of %d bytes, then: %w", ErrMalformed, buf.Len(), n, err)
	}
	b := buf.Bytes()
	if b[0] > byte(Probe) {
		return Untyped, b, nil
	}
	return Type(b[0]), b[1:], nil
}

// checkJSON reports whether body starts with one JSON value (text after it
// is ignored, as Mooncake's reader does).
func checkJSON(body []byte) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	var v json.RawMessage
	if err := dec.Decode(&v); err != nil {
		return fmt.Errorf("%w: body is not JSON: %v", ErrMalformed, err)
	}
	return nil
}

// NotifyRecord is a Notify message's body (Mooncake's NotifyDesc).
type NotifyRecord struct {
	Name      string `json:"name"`
	NotifyMsg string `json:"notify_msg"`
}

// Bounds of a Notify message's fields: te's notification bounds
// (driver.MaxNotifyName, driver.MaxNotifyMsg).
const (
	MaxNotifyName = 256
	MaxNotifyMsg  = 4096
)

// DecodeNotify decodes a Notify message's body. Both fields are strings
// (missing means empty, as Mooncake reads them) within MaxNotifyName and
// MaxNotifyMsg bytes; anything else is an error wrapping ErrMalformed.
func DecodeNotify(body []byte) (NotifyRecord, error) {
	var o map[string]json.RawMessage
	if err := json.NewDecoder(bytes.NewReader(body)).Decode(&o); err != nil || o == nil {
		return NotifyRecord{}, fmt.Errorf("%w: Notify body is not a JSON object", ErrMalformed)
	}
	var r NotifyRecord
	for _, f := range []struct {
		key string
		dst *string
		max int
	}{{"name", &r.Name, MaxNotifyName}, {"notify_msg", &r.NotifyMsg, MaxNotifyMsg}} {
		raw, ok := o[f.key]
		if !ok || string(bytes.TrimSpace(raw)) == "null" {
			continue
		}
		if err := json.Unmarshal(raw, f.dst); err != nil {
			return NotifyRecord{}, fmt.Errorf("%w: Notify %s must be a string", ErrMalformed, f.key)
		}
		if len(*f.dst) > f.max {
			return NotifyRecord{}, fmt.Errorf("%w: Notify %s has %d bytes, more than %d", ErrMalformed, f.key, len(*f.dst), f.max)
		}
	}
	return r, nil
}

// EncodeNotify writes a Notify body as Mooncake does (keys sorted, one
// trailing newline).
func EncodeNotify(r NotifyRecord) ([]byte, error) {
	if len(r.Name) > MaxNotifyName || len(r.NotifyMsg) > MaxNotifyMsg {
		return nil, fmt.Errorf("%w: Notify of %d+%d bytes exceeds %d+%d", ErrMalformed, len(r.Name), len(r.NotifyMsg), MaxNotifyName, MaxNotifyMsg)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(r); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return buf.Bytes(), nil
}

// ProbeReply is what a live Mooncake process answers a Probe with.
type ProbeReply struct {
	Status string `json:"status"`
}
