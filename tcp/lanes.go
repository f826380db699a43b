package tcp

import (
	"errors"
	"net"
	"net/netip"

	"github.com/rdmago/te/internal/sock"
)

// TCPInfo is the kernel's view of one connection (getsockopt TCP_INFO):
// bytes, retransmits, RTT. Reading it needs no privileges.
type TCPInfo = sock.Info

// Lane describes one live connection of the transport: an initiator lane
// to a remote segment, or a connection accepted from an initiator.
type Lane struct {
	// Peer is the remote segment's name; empty for an accepted
	// connection (the initiator does not name itself on the wire).
	Peer string
	// Index is the lane's index among Config.Lanes; -1 when Accepted.
	Index int
	// Gen counts the connections made to Peer: the lane's connection
	// was the Gen-th (from 1); a redialled lane gets a new one. 0 when
	// Accepted.
	Gen      uint64
	Accepted bool
	Local    netip.AddrPort
	Remote   netip.AddrPort
	// Cookie is the socket's SO_COOKIE: the key an eBPF tracer sees for
	// the same connection; 0 where the kernel does not say.
	Cookie uint64
	// Info is the kernel's TCP_INFO for the connection, read by Lanes.
	Info TCPInfo
}

// Lanes lists the transport's live connections, initiator lanes first.
// It costs two getsockopt calls per connection and takes no lock that the
// data path waits on for longer than a field copy.
func (t *Transport) Lanes() []Lane {
	type conn struct {
		c        *net.TCPConn
		peer     string
		index    int
		gen      uint64
		accepted bool
	}
	var cs []conn
	t.mu.Lock()
	for p := range t.peers {
		for i, l := range p.lanes {
			l.mu.Lock()
			if l.conn != nil {
				cs = append(cs, conn{c: l.conn, peer: p.name, index: i, gen: l.gen})
			}
			l.mu.Unlock()
		}
	}
	t.mu.Unlock()
	for _, c := range t.gate.Conns() {
		cs = append(cs, conn{c: c, index: -1, accepted: true})
	}
	out := make([]Lane, 0, len(cs))
	for _, c := range cs {
		// A connection closed since is left out; one whose kernel (or
		// emulator) refuses the options is listed without them.
		ck, err := sock.Cookie(c.c)
		if errors.Is(err, net.ErrClosed) {
			continue
		}
		info, err := sock.TCPInfo(c.c)
		if errors.Is(err, net.ErrClosed) {
			continue
		}
		out = append(out, Lane{
			Peer: c.peer, Index: c.index, Gen: c.gen, Accepted: c.accepted,
			Local: addrPort(c.c.LocalAddr()), Remote: addrPort(c.c.RemoteAddr()),
			Cookie: ck, Info: info,
		})
	}
	return out
}

func addrPort(a net.Addr) netip.AddrPort {
	if ta, ok := a.(*net.TCPAddr); ok {
		ap := ta.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return netip.AddrPort{}
}
