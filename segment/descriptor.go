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
	// Devices lists the RDMA rails of the owner, when it speaks RDMA.
	// Buffer.RKeys is indexed like Devices.
	Devices []Device `json:"devices,omitempty"`
	// Buffers lists the registered memory the segment exposes.
	Buffers []Buffer `json:"buffers"`
}

// Protocol is one way of reaching a segment: the protocol's own part of
// the descriptor, which only its transport interprets.
type Protocol struct {
	Name string `json:"name"`
	// Endpoint is the protocol's address (for tcp the data listener,
	// host:port).
	Endpoint string `json:"endpoint,omitempty"`
	// Attrs holds protocol-specific settings (wire version, lanes, ...).
	Attrs map[string]string `json:"attrs,omitempty"`
	// Version is the entry's own format version, chosen by the transport
	// that writes it (0: the first); a reader reads what its version
	// knows and keeps the rest (Extra).
	Version int `json:"version,omitempty"`
	// Extra holds the entry's fields this build does not know, as a newer
	// peer wrote them (compact JSON). Decoding and encoding keep them, so
	// a store or a relay passes an entry on whole.
	Extra map[string]json.RawMessage `json:"-"`
}

// Equal reports whether p and q are the same entry, Extra included.
func (p Protocol) Equal(q Protocol) bool {
	return p.Name == q.Name && p.Endpoint == q.Endpoint && p.Version == q.Version &&
		maps.Equal(p.Attrs, q.Attrs) && maps.EqualFunc(p.Extra, q.Extra, func(a, b json.RawMessage) bool { return bytes.Equal(a, b) })
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
	// RKeys holds one remote key per entry of Descriptor.Devices.
	RKeys []uint32 `json:"rkeys,omitempty"`
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
// buffers that do not overlap or wrap, and one rkey per device where keys are
// given.
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
		if len(b.RKeys) != 0 && len(b.RKeys) != len(d.Devices) {
			return fmt.Errorf("%w: %s: buffer at %#x has %d rkeys for %d devices", ErrInvalid, d.Name, b.Addr, len(b.RKeys), len(d.Devices))
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
		c.Protocols[i] = p
		if p.Attrs != nil {
			c.Protocols[i].Attrs = make(map[string]string, len(p.Attrs))
			for k, v := range p.Attrs {
				c.Protocols[i].Attrs[k] = v
			}
		}
		if p.Extra != nil {
			c.Protocols[i].Extra = make(map[string]json.RawMessage, len(p.Extra))
			for k, v := range p.Extra {
				c.Protocols[i].Extra[k] = bytes.Clone(v)
			}
		}
	}
	c.Devices = slices.Clone(d.Devices)
	c.Buffers = make([]Buffer, len(d.Buffers))
	for i, b := range d.Buffers {
		c.Buffers[i] = b
		c.Buffers[i].RKeys = slices.Clone(b.RKeys)
	}
	return &c
}

// SameIncarnation reports whether a and b describe the same process
// lifetime of a segment (same name and epoch). Endpoints and keys cached for
// one incarnation must be dropped when it changes.
func SameIncarnation(a, b *Descriptor) bool {
	return a != nil && b != nil && a.Name == b.Name && a.Epoch == b.Epoch
}
