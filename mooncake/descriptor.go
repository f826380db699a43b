// Package mooncake speaks the classic wire of Mooncake's Transfer Engine
// (kvcache-ai/Mooncake, checked against commit 777cc778): its segment
// descriptor JSON and the translation to and from te's segment.Descriptor.
// Subpackages carry the rest: p2p (the P2PHANDSHAKE socket),
// httpmeta (HTTP metadata, client and server) and mctcp (Mooncake's TCP
// data protocol as a te transport).
//
// Mooncake's wire has no authentication and no versioning beyond the TCP
// protocol number, so nothing here is used unless a program asks for it
// (te serve --mooncake, the "mooncake" protocol name). Every decoder takes
// bytes from an untrusted peer: sizes are capped, numbers are decoded as
// uint64 (never float64, which loses addresses above 2^53), and a
// descriptor whose counts disagree is refused with an error that says which.
package mooncake

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Protocol names as Mooncake writes them in a descriptor's "protocol".
const (
	ProtoTCP  = "tcp"
	ProtoRDMA = "rdma"
)

// MaxDescriptorSize bounds an encoded descriptor (Mooncake's handshake
// socket refuses messages above 1 MiB by default; stores may hold more).
const MaxDescriptorSize = 4 << 20

// ErrInvalid is returned (wrapped) for any descriptor that cannot be
// decoded or translated; compare with errors.Is.
var ErrInvalid = errors.New("mooncake: invalid segment descriptor")

// Descriptor is a Mooncake segment descriptor (SegmentDesc in Mooncake's
// transfer_metadata.h) as it travels in JSON.
type Descriptor struct {
	// Name is the segment's name: ip:port of its handshake socket in
	// P2PHANDSHAKE mode, the server name with a metadata store.
	Name string
	// Protocols lists the descriptor's protocols. Mooncake's standard
	// builds write one string; multi-protocol builds write an array.
	Protocols []string
	// ProtocolArray records (and, when encoding, selects) the array form
	// of "protocol". A standard Mooncake build aborts on the array form.
	ProtocolArray bool
	// TCPDataPort is where the TCP transport listens (0: none).
	TCPDataPort uint16
	// TCPProtoVersion is the TCP protocol version; a descriptor without
	// the field means 1 (legacy, no status frames).
	TCPProtoVersion uint32
	// Timestamp is Mooncake's informational encoding time
	// ("YYYY-MM-DD HH:MM:SS.ffffff", local time, no zone).
	Timestamp string
	// RDMAServerName is an optional override of the server name in RDMA
	// NIC paths.
	RDMAServerName string
	// Devices are the RDMA NICs; Buffer.RKeys and LKeys follow their order.
	Devices []Device
	// Buffers is the registered memory.
	Buffers []Buffer
	// PriorityMatrix maps a memory location ("cpu:0") to its preferred and
	// other NIC names. Nil when the descriptor has none (TCP).
	PriorityMatrix map[string]Priority
}

// Device is one RDMA NIC of a Mooncake segment.
type Device struct {
	Name string
	LID  uint16
	// GID is the port's GID as Mooncake writes it: 16 colon-separated
	// hex bytes.
	GID string
}

// Buffer is one registered region.
type Buffer struct {
	// Name is the memory location ("cpu:0") in RDMA descriptors and the
	// segment name in TCP ones.
	Name   string
	Addr   uint64
	Length uint64
	// RKeys and LKeys hold one key per device, in Devices order (RDMA).
	RKeys, LKeys []uint32
	// Protocol is the buffer's protocol in the array form of a
	// multi-protocol descriptor; empty otherwise.
	Protocol string
}

// Priority is one location's NIC preference: Preferred first, then Other.
type Priority struct {
	Preferred, Other []string
}

// Has reports whether d lists protocol p.
func (d *Descriptor) Has(p string) bool { return slices.Contains(d.Protocols, p) }

// TimestampFormat is the layout of Descriptor.Timestamp (Go time syntax).
const TimestampFormat = "2006-01-02 15:04:05.000000"

// Now returns the current local time in Mooncake's timestamp form.
func Now() string { return time.Now().Format(TimestampFormat) }

// Decode parses and checks a Mooncake descriptor. It accepts what a
// Mooncake initiator accepts (unknown keys, any key order, text after the
// JSON value, integral floats such as 1.4e+14) and refuses, with an error
// wrapping ErrInvalid that names the field, what would make Mooncake or te
// misbehave: numbers given as strings or out of range, a missing name or
// protocol, empty or wrapping buffers, key counts that differ from the
// device count, unparsable GIDs, and a priority matrix naming unknown NICs.
func Decode(b []byte) (*Descriptor, error) {
	if len(b) > MaxDescriptorSize {
		return nil, fmt.Errorf("%w: %d bytes, more than %d", ErrInvalid, len(b), MaxDescriptorSize)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var raw map[string]json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("%w: not a JSON object: %v", ErrInvalid, err)
	}
	if raw == nil {
		return nil, fmt.Errorf("%w: null instead of an object", ErrInvalid)
	}
	d := &Descriptor{TCPProtoVersion: 1}
	var err error
	if d.Name, err = str(raw, "name", true); err != nil {
		return nil, err
	}
	if err := d.decodeProtocol(raw["protocol"]); err != nil {
		return nil, err
	}
	if v, ok, err := uintField(raw, "tcp_data_port", math.MaxUint16); err != nil {
		return nil, err
	} else if ok {
		d.TCPDataPort = uint16(v)
	}
	if v, ok, err := uintField(raw, "tcp_proto_version", math.MaxInt32); err != nil {
		return nil, err
	} else if ok {
		d.TCPProtoVersion = uint32(v)
	}
	if d.Timestamp, err = str(raw, "timestamp", false); err != nil {
		return nil, err
	}
	if d.RDMAServerName, err = str(raw, "rdma_server_name", false); err != nil {
		return nil, err
	}
	if err := d.decodeDevices(raw["devices"]); err != nil {
		return nil, err
	}
	if err := d.decodeBuffers(raw["buffers"]); err != nil {
		return nil, err
	}
	if err := d.decodePriority(raw["priority_matrix"]); err != nil {
		return nil, err
	}
	if err := d.Validate(); err != nil {
		return nil, err
	}
	return d, nil
}

// Validate checks what Decode checks after parsing: a name and a
// protocol, buffers that are non-empty, do not wrap and do not overlap,
// one rkey and one lkey per device where keys are given (and on every
// buffer of an RDMA descriptor), and a priority matrix naming only
// listed devices.
func (d *Descriptor) Validate() error {
	if d == nil {
		return fmt.Errorf("%w: nil", ErrInvalid)
	}
	if d.Name == "" {
		return fmt.Errorf("%w: empty name", ErrInvalid)
	}
	if len(d.Protocols) == 0 {
		return fmt.Errorf("%w: %s: no protocol", ErrInvalid, d.Name)
	}
	for _, p := range d.Protocols {
		if p == "" {
			return fmt.Errorf("%w: %s: empty protocol name", ErrInvalid, d.Name)
		}
	}
	names := make(map[string]bool, len(d.Devices))
	for i, dev := range d.Devices {
		if dev.Name == "" {
			return fmt.Errorf("%w: %s: devices[%d] has no name", ErrInvalid, d.Name, i)
		}
		if names[dev.Name] {
			return fmt.Errorf("%w: %s: device %q listed twice", ErrInvalid, d.Name, dev.Name)
		}
		names[dev.Name] = true
		if _, err := ParseGID(dev.GID); err != nil {
			return fmt.Errorf("%w: %s: devices[%d] (%s): %v", ErrInvalid, d.Name, i, dev.Name, err)
		}
	}
	for i, b := range d.Buffers {
		if b.Name == "" {
			return fmt.Errorf("%w: %s: buffers[%d] has no name", ErrInvalid, d.Name, i)
		}
		if b.Addr == 0 || b.Length == 0 {
			return fmt.Errorf("%w: %s: buffers[%d] has address %#x and length %d; both must be non-zero", ErrInvalid, d.Name, i, b.Addr, b.Length)
		}
		if b.Addr+b.Length < b.Addr {
			return fmt.Errorf("%w: %s: buffers[%d] at %#x, %d bytes, wraps the address space", ErrInvalid, d.Name, i, b.Addr, b.Length)
		}
		if len(b.RKeys) != len(b.LKeys) {
			return fmt.Errorf("%w: %s: buffers[%d] has %d rkeys and %d lkeys; they must match", ErrInvalid, d.Name, i, len(b.RKeys), len(b.LKeys))
		}
		if len(b.RKeys) > 0 && len(b.RKeys) != len(d.Devices) {
			return fmt.Errorf("%w: %s: buffers[%d] has %d rkeys for %d devices; publish one key per device, in devices order", ErrInvalid, d.Name, i, len(b.RKeys), len(d.Devices))
		}
	}
	order := make([]int, len(d.Buffers))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(i, j int) bool { return d.Buffers[order[i]].Addr < d.Buffers[order[j]].Addr })
	for k := 1; k < len(order); k++ {
		a, b := d.Buffers[order[k-1]], d.Buffers[order[k]]
		if a.Addr+a.Length > b.Addr {
			return fmt.Errorf("%w: %s: buffers at %#x and %#x overlap", ErrInvalid, d.Name, a.Addr, b.Addr)
		}
	}
	for loc, p := range d.PriorityMatrix {
		for _, n := range slices.Concat(p.Preferred, p.Other) {
			if !names[n] {
				return fmt.Errorf("%w: %s: priority_matrix[%q] names NIC %q, which is not in devices", ErrInvalid, d.Name, loc, n)
			}
		}
	}
	return nil
}

func (d *Descriptor) decodeProtocol(raw json.RawMessage) error {
	raw = bytes.TrimSpace(raw)
	switch {
	case len(raw) == 0:
		return fmt.Errorf("%w: %s: no protocol", ErrInvalid, d.Name)
	case raw[0] == '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return fmt.Errorf("%w: %s: protocol: %v", ErrInvalid, d.Name, err)
		}
		// A multi-protocol build's in-memory form is comma-separated; its
		// string form on the wire is one name, but accept both.
		d.Protocols = strings.Split(s, ",")
	case raw[0] == '[':
		if err := json.Unmarshal(raw, &d.Protocols); err != nil {
			return fmt.Errorf("%w: %s: protocol must be a string or an array of strings: %v", ErrInvalid, d.Name, err)
		}
		d.ProtocolArray = true
	default:
		return fmt.Errorf("%w: %s: protocol must be a string or an array of strings, not %.20s", ErrInvalid, d.Name, raw)
	}
	return nil
}

func (d *Descriptor) decodeDevices(raw json.RawMessage) error {
	objs, err := array(raw, "devices")
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrInvalid, d.Name, err)
	}
	for i, o := range objs {
		var dev Device
		if dev.Name, err = str(o, "name", true); err != nil {
			return fmt.Errorf("%s: devices[%d]: %w", d.Name, i, err)
		}
		if dev.GID, err = str(o, "gid", true); err != nil {
			return fmt.Errorf("%s: devices[%d]: %w", d.Name, i, err)
		}
		v, _, err := uintField(o, "lid", math.MaxUint16)
		if err != nil {
			return fmt.Errorf("%s: devices[%d]: %w", d.Name, i, err)
		}
		dev.LID = uint16(v)
		d.Devices = append(d.Devices, dev)
	}
	return nil
}

func (d *Descriptor) decodeBuffers(raw json.RawMessage) error {
	objs, err := array(raw, "buffers")
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrInvalid, d.Name, err)
	}
	for i, o := range objs {
		var b Buffer
		if b.Name, err = str(o, "name", true); err != nil {
			return fmt.Errorf("%s: buffers[%d]: %w", d.Name, i, err)
		}
		if b.Protocol, err = str(o, "protocol", false); err != nil {
			return fmt.Errorf("%s: buffers[%d]: %w", d.Name, i, err)
		}
		if b.Addr, _, err = uintField(o, "addr", math.MaxUint64); err != nil {
			return fmt.Errorf("%s: buffers[%d]: %w", d.Name, i, err)
		}
		if b.Length, _, err = uintField(o, "length", math.MaxUint64); err != nil {
			return fmt.Errorf("%s: buffers[%d]: %w", d.Name, i, err)
		}
		if b.RKeys, err = keys(o["rkey"]); err != nil {
			return fmt.Errorf("%w: %s: buffers[%d]: rkey: %v", ErrInvalid, d.Name, i, err)
		}
		if b.LKeys, err = keys(o["lkey"]); err != nil {
			return fmt.Errorf("%w: %s: buffers[%d]: lkey: %v", ErrInvalid, d.Name, i, err)
		}
		d.Buffers = append(d.Buffers, b)
	}
	return nil
}

func (d *Descriptor) decodePriority(raw json.RawMessage) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var m map[string][][]string
	if err := json.Unmarshal(raw, &m); err != nil {
		return fmt.Errorf("%w: %s: priority_matrix must map locations to [[preferred NICs],[other NICs]]: %v", ErrInvalid, d.Name, err)
	}
	d.PriorityMatrix = make(map[string]Priority, len(m))
	for loc, lists := range m {
		if len(lists) != 2 {
			return fmt.Errorf("%w: %s: priority_matrix[%q] has %d lists, want 2 ([preferred],[other])", ErrInvalid, d.Name, loc, len(lists))
		}
		d.PriorityMatrix[loc] = Priority{Preferred: lists[0], Other: lists[1]}
	}
	return nil
}

// array splits a JSON array of objects; absent or null is empty.
func array(raw json.RawMessage, field string) ([]map[string]json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var objs []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &objs); err != nil {
		return nil, fmt.Errorf("%s must be an array of objects: %v", field, err)
	}
	for i, o := range objs {
		if o == nil {
			return nil, fmt.Errorf("%s[%d] is null", field, i)
		}
	}
	return objs, nil
}

// str reads a string field.
func str(o map[string]json.RawMessage, field string, required bool) (string, error) {
	raw := bytes.TrimSpace(o[field])
	if len(raw) == 0 || string(raw) == "null" {
		if required {
			return "", fmt.Errorf("%w: %q missing", ErrInvalid, field)
		}
		return "", nil
	}
	var s string
	if raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return "", fmt.Errorf("%w: %q must be a string, not %.20s", ErrInvalid, field, raw)
	}
	if required && s == "" {
		return "", fmt.Errorf("%w: %q is empty", ErrInvalid, field)
	}
	return s, nil
}

// uintField reads an unsigned integer field of at most max; ok is false
// when the field is absent.
func uintField(o map[string]json.RawMessage, field string, max uint64) (v uint64, ok bool, err error) {
	raw := bytes.TrimSpace(o[field])
	if len(raw) == 0 {
		return 0, false, nil
	}
	v, err = parseUint(raw, max)
	if err != nil {
		return 0, false, fmt.Errorf("%w: %q: %v", ErrInvalid, field, err)
	}
	return v, true, nil
}

// parseUint parses a JSON number as an unsigned integer of at most max. An
// integral float (1.4e+14), which jsoncpp writes for doubles, is accepted
// when it is exact.
func parseUint(raw []byte, max uint64) (uint64, error) {
	s := string(raw)
	if s == "" || !(s[0] >= '0' && s[0] <= '9' || s[0] == '-') {
		return 0, fmt.Errorf("%.24s is not a number (numbers must not be quoted)", s)
	}
	if v, err := strconv.ParseUint(s, 10, 64); err == nil {
		if v > max {
			return 0, fmt.Errorf("%d exceeds %d", v, max)
		}
		return v, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f < 0 || f != math.Trunc(f) || f >= 1<<64 || f > float64(max) {
		return 0, fmt.Errorf("%.24s is not an unsigned integer of at most %d", s, max)
	}
	return uint64(f), nil
}

// keys reads an array of 32-bit memory keys.
func keys(raw json.RawMessage) ([]uint32, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var nums []json.RawMessage
	if err := json.Unmarshal(raw, &nums); err != nil {
		return nil, fmt.Errorf("must be an array of numbers: %v", err)
	}
	out := make([]uint32, len(nums))
	for i, n := range nums {
		v, err := parseUint(bytes.TrimSpace(n), math.MaxUint32)
		if err != nil {
			return nil, fmt.Errorf("[%d]: %v", i, err)
		}
		out[i] = uint32(v)
	}
	return out, nil
}

// wire is the encoding's shape. Field order is Mooncake's (jsoncpp sorts
// keys): a peer sees the same bytes a Mooncake target would send.
type wire struct {
	Buffers         []wireBuffer        `json:"buffers"`
	Devices         []wireDevice        `json:"devices,omitempty"`
	Name            string              `json:"name"`
	PriorityMatrix  map[string][]wireNs `json:"priority_matrix,omitempty"`
	Protocol        any                 `json:"protocol"`
	RDMAServerName  string              `json:"rdma_server_name,omitempty"`
	TCPDataPort     uint16              `json:"tcp_data_port"`
	TCPProtoVersion *uint32             `json:"tcp_proto_version,omitempty"`
	Timestamp       string              `json:"timestamp,omitempty"`
}

type wireBuffer struct {
	Addr     uint64   `json:"addr"`
	Length   uint64   `json:"length"`
	LKey     []uint32 `json:"lkey,omitempty"`
	Name     string   `json:"name"`
	Protocol string   `json:"protocol,omitempty"`
	RKey     []uint32 `json:"rkey,omitempty"`
}

type wireDevice struct {
	GID  string `json:"gid"`
	LID  uint16 `json:"lid"`
	Name string `json:"name"`
}

type wireNs []string

// MarshalJSON writes an empty list as [] rather than null.
func (n wireNs) MarshalJSON() ([]byte, error) {
	if n == nil {
		return []byte("[]"), nil
	}
	return json.Marshal([]string(n))
}

// Encode validates d and writes it the way Mooncake does: compact JSON
// with sorted keys and one trailing newline. RDMA buffers always carry
// their (possibly empty) rkey and lkey arrays; a TCP protocol version of 1
// is written by leaving the field out, which is how Mooncake reads v1. An
// empty Timestamp is filled with Now().
func Encode(d *Descriptor) ([]byte, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	w := wire{Name: d.Name, TCPDataPort: d.TCPDataPort, Timestamp: d.Timestamp, RDMAServerName: d.RDMAServerName}
	if w.Timestamp == "" {
		w.Timestamp = Now()
	}
	if d.ProtocolArray {
		w.Protocol = d.Protocols
	} else {
		w.Protocol = strings.Join(d.Protocols, ",")
	}
	if d.TCPProtoVersion != 1 {
		v := d.TCPProtoVersion
		w.TCPProtoVersion = &v
	}
	rdma := d.Has(ProtoRDMA)
	w.Buffers = make([]wireBuffer, len(d.Buffers))
	for i, b := range d.Buffers {
		w.Buffers[i] = wireBuffer{Addr: b.Addr, Length: b.Length, Name: b.Name, Protocol: b.Protocol, RKey: b.RKeys, LKey: b.LKeys}
		if rdma && b.RKeys == nil {
			w.Buffers[i].RKey, w.Buffers[i].LKey = []uint32{}, []uint32{}
		}
	}
	if rdma || len(d.Devices) > 0 {
		w.Devices = make([]wireDevice, len(d.Devices))
		for i, dev := range d.Devices {
			w.Devices[i] = wireDevice{GID: dev.GID, LID: dev.LID, Name: dev.Name}
		}
	}
	if d.PriorityMatrix != nil {
		w.PriorityMatrix = make(map[string][]wireNs, len(d.PriorityMatrix))
		for loc, p := range d.PriorityMatrix {
			w.PriorityMatrix[loc] = []wireNs{p.Preferred, p.Other}
		}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(w); err != nil {
		return nil, fmt.Errorf("mooncake: encode %s: %w", d.Name, err)
	}
	if buf.Len() > MaxDescriptorSize {
		return nil, fmt.Errorf("%w: %s: encoded size %d exceeds %d", ErrInvalid, d.Name, buf.Len(), MaxDescriptorSize)
	}
	return buf.Bytes(), nil
}

// ParseGID parses a GID in Mooncake's form (16 colon-separated hex bytes,
// "00:00:...:ff:ff:c0:a8:00:01") or, as a convenience, textual IPv6.
func ParseGID(s string) (netip.Addr, error) {
	if parts := strings.Split(s, ":"); len(parts) == 16 {
		var b [16]byte
		for i, p := range parts {
			if len(p) != 2 {
				return netip.Addr{}, fmt.Errorf("gid %q: byte %d is not two hex digits", s, i)
			}
			if _, err := hex.Decode(b[i:i+1], []byte(p)); err != nil {
				return netip.Addr{}, fmt.Errorf("gid %q: byte %d is not two hex digits", s, i)
			}
		}
		return netip.AddrFrom16(b), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is6() || a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("gid %q is neither 16 colon-separated hex bytes nor an IPv6 address", s)
	}
	return a, nil
}

// FormatGID writes a GID in Mooncake's form.
func FormatGID(a netip.Addr) string {
	b := a.As16()
	var sb strings.Builder
	sb.Grow(47)
	for i, x := range b {
		if i > 0 {
			sb.WriteByte(':')
		}
		sb.WriteString(hex.EncodeToString([]byte{x}))
	}
	return sb.String()
}
