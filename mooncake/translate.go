package mooncake

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math"
	"net"
	"slices"
	"strconv"
	"sync"

	"github.com/rdmago/te/segment"
)

// Protocol names of Mooncake's wires in te descriptors. They differ from
// te's own "tcp" and "rdma": the wires are not te's, and only a transport
// that speaks Mooncake's may pick them.
const (
	// TEProtoTCP is Mooncake's TCP data protocol (package mctcp). Its
	// Protocol entry's Endpoint is the data listener (host:tcp_data_port)
	// and its TCP part's Wire the protocol version (1 or 2).
	TEProtoTCP = "mooncake"
	// TEProtoRDMA is Mooncake's RDMA wire (package rdma with
	// Config.Mooncake): a Mooncake RDMA segment's devices and keys are
	// translated into the entry's RDMA part, its Endpoint is the
	// handshake socket where queue pairs are set up (Connection messages),
	// and ServerKey in its Extra names the server part of the segment's
	// NIC paths when it differs from the segment's name.
	TEProtoRDMA = "mooncake-rdma"
)

// ServerKey is the key, in a TEProtoRDMA entry's Extra, of the server name
// in the segment's NIC paths ("server@device"): Mooncake's
// rdma_server_name, or its segment name when that is absent. Its value is
// a JSON string.
const ServerKey = "nic_server"

// NICServer returns the server name of a TEProtoRDMA entry's NIC paths:
// its ServerKey, else name (the segment's name).
func NICServer(p segment.Protocol, name string) string {
	if raw, ok := p.Extra[ServerKey]; ok {
		var s string
		if json.Unmarshal(raw, &s) == nil && s != "" {
			return s
		}
	}
	return name
}

// DefaultTCPVersion is the TCP protocol version te speaks and advertises
// (Mooncake's default).
const DefaultTCPVersion = 2

// ToOptions adjust ToTE.
type ToOptions struct {
	// Name is the te segment name. Default: the descriptor's name.
	Name string
	// DataHost is the host of the TCP data endpoint. Default: the host
	// part of the descriptor's name (host:port, or a bare host), which is
	// where a Mooncake initiator sends its data in P2PHANDSHAKE mode; with
	// a metadata store, the ip_or_host_name of the segment's rpc_meta.
	DataHost string
	// RPCAddr is the segment's handshake socket, host:port. Default: the
	// descriptor's name.
	RPCAddr string
}

// ToTE translates a Mooncake descriptor into te's. The te descriptor's
// Epoch is a hash of what identifies the peer's incarnation (name, data
// port, NICs and their GIDs and LIDs), since Mooncake publishes none: a
// restarted Mooncake process opens new ports and keys, which the engine
// then treats as a new incarnation. Version is left 0; Versions assigns
// one per content change.
func ToTE(md *Descriptor, o ToOptions) (*segment.Descriptor, error) {
	if err := md.Validate(); err != nil {
		return nil, err
	}
	if o.Name == "" {
		o.Name = md.Name
	}
	if o.RPCAddr == "" {
		o.RPCAddr = md.Name
	}
	if o.DataHost == "" {
		o.DataHost = hostOf(md.Name)
	}
	d := &segment.Descriptor{Name: o.Name, Protocols: []segment.Protocol{}}
	if md.Has(ProtoTCP) && md.TCPDataPort != 0 {
		v := min(md.TCPProtoVersion, DefaultTCPVersion) // Mooncake treats 3 and above as 2
		if v == 0 {
			v = 1
		}
		d.Protocols = append(d.Protocols, segment.Protocol{
			Name:     TEProtoTCP,
			Endpoint: net.JoinHostPort(o.DataHost, strconv.Itoa(int(md.TCPDataPort))),
			TCP:      &segment.TCP{Wire: int(v)},
		})
	}
	rdma := md.Has(ProtoRDMA)
	part := &segment.RDMA{}
	for _, dev := range md.Devices {
		gid, err := ParseGID(dev.GID)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: device %s: %v", ErrInvalid, md.Name, dev.Name, err)
		}
		part.Devices = append(part.Devices, segment.Device{Name: dev.Name, GID: gid.String(), LID: dev.LID})
	}
	keyed := false
	for _, b := range md.Buffers {
		tb := segment.Buffer{Addr: b.Addr, Length: b.Length}
		if rdma && b.Protocol != ProtoTCP {
			tb.Location = b.Name // RDMA buffers are named by location
		}
		d.Buffers = append(d.Buffers, tb)
		part.RKeys = append(part.RKeys, slices.Clone(b.RKeys))
		keyed = keyed || len(b.RKeys) > 0
	}
	if !keyed {
		part.RKeys = nil
	}
	if rdma {
		p := segment.Protocol{Name: TEProtoRDMA, Endpoint: o.RPCAddr, RDMA: part}
		if server := md.nicServer(); server != o.Name {
			b, _ := json.Marshal(server) // a string always encodes
			p.Extra = map[string]json.RawMessage{ServerKey: b}
		}
		d.Protocols = append(d.Protocols, p)
	}
	h := fnv.New64a()
	var nb [8]byte
	h.Write([]byte(md.Name))
	binary.LittleEndian.PutUint64(nb[:], uint64(md.TCPDataPort))
	h.Write(nb[:])
	for _, dev := range md.Devices {
		h.Write([]byte{0})
		h.Write([]byte(dev.Name))
		h.Write([]byte(dev.GID))
		binary.LittleEndian.PutUint64(nb[:], uint64(dev.LID))
		h.Write(nb[:])
	}
	d.Epoch = h.Sum64() | 1
	if err := d.Validate(); err != nil {
		return nil, fmt.Errorf("mooncake: %s: translated descriptor: %w", md.Name, err)
	}
	return d, nil
}

// nicServer is the server part of the segment's NIC paths, as Mooncake
// forms them: rdma_server_name, else the segment's name.
func (d *Descriptor) nicServer() string {
	if d.RDMAServerName != "" {
		return d.RDMAServerName
	}
	return d.Name
}

// hostOf returns the host of host:port, or s itself when it has no port.
func hostOf(s string) string {
	if h, _, err := net.SplitHostPort(s); err == nil {
		return h
	}
	return s
}

// FromOptions adjust FromTE.
type FromOptions struct {
	// Name is the Mooncake segment name: ip:port of the handshake socket
	// in P2PHANDSHAKE mode. Default: the te descriptor's name.
	Name string
	// Protocol is ProtoTCP or ProtoRDMA. Default: ProtoTCP when the te
	// descriptor offers TEProtoTCP, else ProtoRDMA when it offers
	// TEProtoRDMA.
	Protocol string
	// Priority is the RDMA priority matrix. Default: every buffer location
	// prefers every device, in devices order (Mooncake derives device
	// indices from its own walk of the matrix, so the lists follow the
	// devices order).
	Priority map[string]Priority
	// Timestamp overrides the encoding time (tests); default Now().
	Timestamp string
}

// ErrNoProtocol: a te descriptor offers none of Mooncake's protocols, so
// there is nothing a Mooncake peer could use (an engine publishes such a
// descriptor before its transports are installed). It comes wrapped with
// ErrInvalid.
var ErrNoProtocol = errors.New("mooncake: no Mooncake protocol offered")

// DefaultLocation names RDMA buffers whose te descriptor has no location.
const DefaultLocation = "cpu:0"

// FromTE translates te's descriptor of local memory into Mooncake's, for
// Mooncake initiators. A TCP descriptor names every buffer after the
// segment, as Mooncake does; an RDMA descriptor names buffers by location
// and carries one rkey per device, and lkeys of 0 (a peer never uses
// them, but Mooncake wants as many lkeys as rkeys).
func FromTE(d *segment.Descriptor, o FromOptions) (*Descriptor, error) {
	if err := d.Validate(); err != nil {
		return nil, fmt.Errorf("mooncake: translate: %w", err)
	}
	if o.Name == "" {
		o.Name = d.Name
	}
	tcp, hasTCP := d.Protocol(TEProtoTCP)
	_, hasRDMA := d.Protocol(TEProtoRDMA)
	if o.Protocol == "" {
		switch {
		case hasTCP:
			o.Protocol = ProtoTCP
		case hasRDMA:
			o.Protocol = ProtoRDMA
		default:
			return nil, fmt.Errorf("%w: %w: %s offers neither %s nor %s; install the Mooncake transport", ErrInvalid, ErrNoProtocol, d.Name, TEProtoTCP, TEProtoRDMA)
		}
	}
	md := &Descriptor{Name: o.Name, Protocols: []string{o.Protocol}, TCPProtoVersion: DefaultTCPVersion, Timestamp: o.Timestamp}
	if hasTCP {
		_, port, err := net.SplitHostPort(tcp.Endpoint)
		p, perr := strconv.ParseUint(port, 10, 16)
		if err != nil || perr != nil || p == 0 {
			return nil, fmt.Errorf("%w: %s: %s endpoint %q has no port", ErrInvalid, d.Name, TEProtoTCP, tcp.Endpoint)
		}
		md.TCPDataPort = uint16(p)
		if tcp.TCP != nil && tcp.TCP.Wire != 0 {
			if tcp.TCP.Wire < 0 || tcp.TCP.Wire > math.MaxInt32 {
				return nil, fmt.Errorf("%w: %s: %s version %d", ErrInvalid, d.Name, TEProtoTCP, tcp.TCP.Wire)
			}
			md.TCPProtoVersion = uint32(tcp.TCP.Wire)
		}
	}
	switch o.Protocol {
	case ProtoTCP:
		if !hasTCP {
			return nil, fmt.Errorf("%w: %s does not offer %s", ErrInvalid, d.Name, TEProtoTCP)
		}
		for _, b := range d.Buffers {
			md.Buffers = append(md.Buffers, Buffer{Name: o.Name, Addr: b.Addr, Length: b.Length})
		}
	case ProtoRDMA:
		part := rdmaPart(d)
		if p, ok := d.Protocol(TEProtoRDMA); ok {
			if s := NICServer(p, o.Name); s != o.Name {
				md.RDMAServerName = s
			}
		}
		for _, dev := range part.Devices {
			gid, err := ParseGID(dev.GID)
			if err != nil {
				return nil, fmt.Errorf("%w: %s: device %s: %v", ErrInvalid, d.Name, dev.Name, err)
			}
			md.Devices = append(md.Devices, Device{Name: dev.Name, LID: dev.LID, GID: FormatGID(gid)})
		}
		locs := map[string]bool{}
		for i, b := range d.Buffers {
			loc := b.Location
			if loc == "" {
				loc = DefaultLocation
			}
			locs[loc] = true
			keys := part.Keys(i)
			if len(keys) != len(part.Devices) {
				return nil, fmt.Errorf("%w: %s: buffer at %#x has %d rkeys for %d devices", ErrInvalid, d.Name, b.Addr, len(keys), len(part.Devices))
			}
			md.Buffers = append(md.Buffers, Buffer{Name: loc, Addr: b.Addr, Length: b.Length,
				RKeys: slices.Clone(keys), LKeys: make([]uint32, len(keys))})
		}
		md.PriorityMatrix = o.Priority
		if md.PriorityMatrix == nil {
			all := make([]string, len(md.Devices))
			for i, dev := range md.Devices {
				all[i] = dev.Name
			}
			md.PriorityMatrix = make(map[string]Priority, len(locs))
			for loc := range locs {
				md.PriorityMatrix[loc] = Priority{Preferred: all, Other: []string{}}
			}
		}
	default:
		return nil, fmt.Errorf("%w: protocol %q: te translates only %s and %s", ErrInvalid, o.Protocol, ProtoTCP, ProtoRDMA)
	}
	if err := md.Validate(); err != nil {
		return nil, err
	}
	return md, nil
}

// Versions gives translated descriptors the Version te's engine expects:
// Mooncake descriptors carry none (their timestamp changes on every
// encoding), so a descriptor's version grows by one whenever its content
// changes, per name and epoch. It is safe for concurrent use.
type Versions struct {
	mu sync.Mutex
	m  map[string]versioned
}

type versioned struct {
	epoch, sum, version uint64
}

// Stamp sets d.Version.
func (v *Versions) Stamp(d *segment.Descriptor) {
	d.Version = 0
	b, _ := json.Marshal(d) // a segment.Descriptor always encodes
	h := fnv.New64a()
	h.Write(b)
	sum := h.Sum64()
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.m == nil {
		v.m = map[string]versioned{}
	}
	e, ok := v.m[d.Name]
	switch {
	case !ok || e.epoch != d.Epoch:
		e = versioned{epoch: d.Epoch, sum: sum, version: 1}
	case e.sum != sum:
		e.sum = sum
		e.version++
	}
	v.m[d.Name] = e
	d.Version = e.version
}

// Forget drops what Versions remembers of a name.
func (v *Versions) Forget(name string) {
	v.mu.Lock()
	delete(v.m, name)
	v.mu.Unlock()
}

// WarnExposed logs, once per listener, that a Mooncake-compatible
// listener is reachable beyond this host: Mooncake's wire has no
// authentication, so anyone who reaches addr may read the descriptor and
// (on the data port) the registered memory. It reports whether it warned.
func WarnExposed(log *slog.Logger, what string, addr net.Addr) bool {
	if log == nil {
		return false
	}
	if ta, ok := addr.(*net.TCPAddr); ok && ta.IP.IsLoopback() {
		return false
	}
	log.Warn("mooncake: "+what+" listens on a non-loopback address; Mooncake's wire has no authentication, so anyone who reaches it may read the segment descriptor and registered memory: listen on a private network only",
		"listen", addr.String())
	return true
}

// rdmaPart returns the rails and keys of d: the RDMA part of its
// TEProtoRDMA entry, else of its te rdma entry (empty when neither has
// one).
func rdmaPart(d *segment.Descriptor) *segment.RDMA {
	for _, name := range []string{TEProtoRDMA, segment.ProtoRDMA} {
		if p, ok := d.Protocol(name); ok && p.RDMA != nil {
			return p.RDMA
		}
	}
	return &segment.RDMA{}
}
