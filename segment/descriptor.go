// Package segment describes who exposes which memory, over which
// protocols, on which rails, with which keys, at which version — and where
// those descriptions are kept (a Store).
//
// A Descriptor is published by the process that owns the memory and read by
// initiators. Its Epoch changes every time the owning process starts, and its
// Version grows with every change inside one epoch, so a reader can tell a
// restarted peer (all cached endpoints and keys are stale) from an updated
// one (new buffers). Protocol specifics live in per-protocol entries and
// per-rail key lists, never in build-dependent fields: every peer speaks the
// same schema.
package segment

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
)

// Well-known protocol names.
const (
	ProtoTCP  = "tcp"
	ProtoRDMA = "rdma"
	// ProtoSHM is the same-host transport: shared memory handed over a
	// unix socket.
	ProtoSHM = "shm"
)

// Descriptor is one segment's published metadata.
type Descriptor struct {
	// Name identifies the segment cluster-wide. With the embedded store it
	// is the owner's handshake address, host:port.
	Name string `json:"name"`
	// Epoch is chosen afresh (randomly) each time the owning process starts.
	Epoch uint64 `json:"epoch"`
	// Version grows by one with every published change within an epoch.
	Version uint64 `json:"version"`
	// Protocols lists how the segment can be reached, in preference order.
	Protocols []Protocol `json:"protocols"`
	// Buffers lists the registered memory the segment exposes.
	Buffers []Buffer `json:"buffers"`
}

// Protocol is one way of reaching a segment: the protocol's own part of
// the descriptor, which only its transport interprets. Its settings live
// in a typed part (TCP, RDMA, SHM), at most one of which is set; on the
// wire each part is an object of its own inside the entry
// ({"name":"rdma","endpoint":...,"rdma":{"devices":...,"rkeys":...}}).
type Protocol struct {
	Name string `json:"name"`
	// Endpoint is the protocol's address (for tcp the data listener,
	// host:port).
	Endpoint string `json:"endpoint,omitempty"`
	// Version is the entry's own format version, chosen by the transport
	// that writes it (0: the first); a reader reads what its version
	// knows and keeps the rest (Extra, and each part's Extra).
	Version int `json:"version,omitempty"`
	// TCP is the part of a stream-socket protocol (tcp, Mooncake's tcp).
	TCP *TCP `json:"tcp,omitempty"`
	// RDMA is the part of an RDMA protocol: its rails and keys.
	RDMA *RDMA `json:"rdma,omitempty"`
	// SHM is the part of the same-host protocol.
	SHM *SHM `json:"shm,omitempty"`
	// Extra holds the entry's fields this build does not know, as a newer
	// peer wrote them (compact JSON). Decoding and encoding keep them, so
	// a store or a relay passes an entry on whole.
	Extra map[string]json.RawMessage `json:"-"`
}

// TCP is a stream-socket protocol's part of its entry.
type TCP struct {
	// Wire is the version of the protocol's framing the owner speaks
	// (0: unstated).
	Wire int `json:"wire,omitempty"`
	// Notify: the owner accepts completion notifications over the
	// protocol.
	Notify bool `json:"notify,omitempty"`
	// Extra holds fields this build does not know (see Protocol.Extra).
	Extra map[string]json.RawMessage `json:"-"`
}

// RDMA is an RDMA protocol's part of its entry: the owner's rails and the
// remote keys of its buffers on them.
type RDMA struct {
	// Devices lists the owner's rails.
	Devices []Device `json:"devices,omitempty"`
	// RKeys holds, for each entry of Descriptor.Buffers (same index), one
	// remote key per entry of Devices, or none for a buffer not exposed
	// over RDMA. Empty when no buffer is.
	RKeys [][]uint32 `json:"rkeys,omitempty"`
	// Extra holds fields this build does not know (see Protocol.Extra).
	Extra map[string]json.RawMessage `json:"-"`
}

// Keys returns buffer i's remote keys, one per device (nil when the part
// holds none for it). It does not allocate.
func (r *RDMA) Keys(i int) []uint32 {
	if r == nil || i < 0 || i >= len(r.RKeys) {
		return nil
	}
	return r.RKeys[i]
}

// SHM is the same-host protocol's part of its entry: who may map the
// owner's memory.
type SHM struct {
	// Host identifies the owner's host (and network namespace).
	Host string `json:"host"`
	// UID is the owner's user id: memory is mapped between processes of
	// one user.
	UID uint32 `json:"uid"`
	// Wire is the version of the shm protocol the owner speaks.
	Wire int `json:"wire"`
	// Partial counts registered regions that are not shared memory; when
	// it is not 0, initiators do not reach the segment over shm.
	Partial int `json:"partial,omitempty"`
	// Notify: the owner accepts completion notifications over the
	// protocol.
	Notify bool `json:"notify,omitempty"`
	// Extra holds fields this build does not know (see Protocol.Extra).
	Extra map[string]json.RawMessage `json:"-"`
}

// Equal reports whether p and q are the same entry, parts and Extra
// included.
func (p Protocol) Equal(q Protocol) bool {
	return p.Name == q.Name && p.Endpoint == q.Endpoint && p.Version == q.Version &&
		equalPart(p.TCP, q.TCP, func(a, b *TCP) bool { return a.Wire == b.Wire && a.Notify == b.Notify && equalExtra(a.Extra, b.Extra) }) &&
		equalPart(p.RDMA, q.RDMA, func(a, b *RDMA) bool {
			return slices.Equal(a.Devices, b.Devices) && slices.EqualFunc(a.RKeys, b.RKeys, slices.Equal) && equalExtra(a.Extra, b.Extra)
		}) &&
		equalPart(p.SHM, q.SHM, func(a, b *SHM) bool {
			return a.Host == b.Host && a.UID == b.UID && a.Wire == b.Wire && a.Partial == b.Partial && a.Notify == b.Notify && equalExtra(a.Extra, b.Extra)
		}) &&
		equalExtra(p.Extra, q.Extra)
}

func equalPart[T any](a, b *T, eq func(a, b *T) bool) bool {
	if a == nil || b == nil {
		return a == b
	}
	return eq(a, b)
}

func equalExtra(a, b map[string]json.RawMessage) bool {
	return maps.EqualFunc(a, b, func(x, y json.RawMessage) bool { return bytes.Equal(x, y) })
}

// Device is one RDMA rail of a segment's owner.
type Device struct {
	Name string `json:"name"` // e.g. rxe0, mlx5_2
	Port uint8  `json:"port"`
	GID  string `json:"gid"` // textual IPv6 form
	LID  uint16 `json:"lid,omitempty"`
	MTU  uint32 `json:"mtu,omitempty"`
}

// Buffer is one exposed memory region, addressed by the owner's virtual
// addresses.
type Buffer struct {
	Addr     uint64 `json:"addr"`
	Length   uint64 `json:"length"`
	Location string `json:"location,omitempty"` // e.g. cpu:0, cuda:3
}

// End returns the first address past the buffer.
func (b Buffer) End() uint64 { return b.Addr + b.Length }

// Contains reports whether [addr, addr+length) lies inside b, without
// overflowing.
func (b Buffer) Contains(addr, length uint64) bool {
	if addr < b.Addr || length > b.Length {
		return false
	}
	return addr-b.Addr <= b.Length-length
}

// Errors returned by descriptors and stores; compare with errors.Is.
var (
	ErrInvalid     = errors.New("segment: invalid descriptor")
	ErrNotFound    = errors.New("segment: not found")
	ErrConflict    = errors.New("segment: concurrent update conflict")
	ErrUnavailable = errors.New("segment: store unavailable")
	ErrOutOfRange  = errors.New("segment: range outside exposed buffers")
	ErrNoProtocol  = errors.New("segment: protocol not offered")
	ErrClosed      = errors.New("segment: store closed")
	// ErrUnknownScheme: no store is known for a metadata URI's scheme.
	ErrUnknownScheme = errors.New("segment: unknown metadata scheme")
)

// Validate checks the descriptor's internal consistency: a name, sane
// buffers that do not overlap or wrap, named protocols listed once, and in
// an RDMA part one key list per buffer, each with one key per device.
func (d *Descriptor) Validate() error {
	if d == nil {
		return fmt.Errorf("%w: nil", ErrInvalid)
	}
	if d.Name == "" {
		return fmt.Errorf("%w: empty name", ErrInvalid)
	}
	seen := map[string]bool{}
	for _, p := range d.Protocols {
		if p.Name == "" {
			return fmt.Errorf("%w: %s: protocol without a name", ErrInvalid, d.Name)
		}
		if seen[p.Name] {
			return fmt.Errorf("%w: %s: protocol %q listed twice", ErrInvalid, d.Name, p.Name)
		}
		seen[p.Name] = true
		if err := p.validate(len(d.Buffers)); err != nil {
			return fmt.Errorf("%w: %s: protocol %q: %v", ErrInvalid, d.Name, p.Name, err)
		}
	}
	bufs := slices.Clone(d.Buffers)
	slices.SortFunc(bufs, func(a, b Buffer) int { return cmp.Compare(a.Addr, b.Addr) })
	for i, b := range bufs {
		if b.Length == 0 {
			return fmt.Errorf("%w: %s: empty buffer at %#x", ErrInvalid, d.Name, b.Addr)
		}
		if b.Addr+b.Length < b.Addr {
			return fmt.Errorf("%w: %s: buffer at %#x wraps the address space", ErrInvalid, d.Name, b.Addr)
		}
		if i > 0 && bufs[i-1].End() > b.Addr {
			return fmt.Errorf("%w: %s: buffers at %#x and %#x overlap", ErrInvalid, d.Name, bufs[i-1].Addr, b.Addr)
		}
	}
	return nil
}

func (p *Protocol) validate(nbuf int) error {
	parts := 0
	for _, set := range []bool{p.TCP != nil, p.RDMA != nil, p.SHM != nil} {
		if set {
			parts++
		}
	}
	if parts > 1 {
		return fmt.Errorf("%d typed parts; an entry has at most one", parts)
	}
	if r := p.RDMA; r != nil {
		if len(r.RKeys) != 0 && len(r.RKeys) != nbuf {
			return fmt.Errorf("%d rkey lists for %d buffers; publish one per buffer, in buffers order", len(r.RKeys), nbuf)
		}
		for i, k := range r.RKeys {
			if len(k) != 0 && len(k) != len(r.Devices) {
				return fmt.Errorf("buffer %d has %d rkeys for %d devices; publish one per device, in devices order", i, len(k), len(r.Devices))
			}
		}
	}
	return nil
}

// Find returns the index of the buffer that holds all of [addr, addr+length),
// or ErrOutOfRange. It does not allocate.
func (d *Descriptor) Find(addr, length uint64) (int, error) {
	for i := range d.Buffers {
		if d.Buffers[i].Contains(addr, length) {
			return i, nil
		}
	}
	return -1, ErrOutOfRange
}

// Protocol returns the entry for the named protocol.
func (d *Descriptor) Protocol(name string) (Protocol, bool) {
	for _, p := range d.Protocols {
		if p.Name == name {
			return p, true
		}
	}
	return Protocol{}, false
}

// Clone returns a deep copy, so a cached descriptor can be handed out without
// sharing slices with the store.
func (d *Descriptor) Clone() *Descriptor {
	if d == nil {
		return nil
	}
	c := *d
	c.Protocols = make([]Protocol, len(d.Protocols))
	for i, p := range d.Protocols {
		c.Protocols[i] = p.Clone()
	}
	c.Buffers = slices.Clone(d.Buffers)
	return &c
}

// SameIncarnation reports whether a and b describe the same process
// lifetime of a segment (same name and epoch). Endpoints and keys cached for
// one incarnation must be dropped when it changes.
func SameIncarnation(a, b *Descriptor) bool {
	return a != nil && b != nil && a.Name == b.Name && a.Epoch == b.Epoch
}

// Clone returns a deep copy of the entry.
func (p Protocol) Clone() Protocol {
	p.Extra = cloneExtra(p.Extra)
	if p.TCP != nil {
		t := *p.TCP
		t.Extra = cloneExtra(t.Extra)
		p.TCP = &t
	}
	if p.RDMA != nil {
		r := *p.RDMA
		r.Devices = slices.Clone(r.Devices)
		if r.RKeys != nil {
			r.RKeys = make([][]uint32, len(p.RDMA.RKeys))
			for i, k := range p.RDMA.RKeys {
				r.RKeys[i] = slices.Clone(k)
			}
		}
		r.Extra = cloneExtra(r.Extra)
		p.RDMA = &r
	}
	if p.SHM != nil {
		s := *p.SHM
		s.Extra = cloneExtra(s.Extra)
		p.SHM = &s
	}
	return p
}

func cloneExtra(m map[string]json.RawMessage) map[string]json.RawMessage {
	if m == nil {
		return nil
	}
	c := make(map[string]json.RawMessage, len(m))
	for k, v := range m {
		c[k] = bytes.Clone(v)
	}
	return c
}
