package main

import (
	"github.com/rdmago/te/internal/bench"
	mcp2p "github.com/rdmago/te/mooncake/p2p"
	"github.com/rdmago/te/rdma"
	"github.com/rdmago/te/segment/p2p"
)

// metadataAddr is the node's metadata store as others reach it: the p2p
// store's real listening address (not the :0 it was asked for), else the
// URI it was opened with.
func (n *node) metadataAddr() string {
	switch s := n.store.(type) {
	case *p2p.Store:
		return "p2p://" + s.ListenAddr().String()
	case *mcp2p.Store:
		return "p2phandshake://" + s.ListenAddr().String()
	}
	return n.uri
}

// railStatser is a transport with RDMA rails.
type railStatser interface{ Stats() []rdma.RailStats }

// railStats is what the node's RDMA rails carried so far (nil without
// rails).
func (n *node) railStats() []bench.Rail {
	for _, tr := range n.trs {
		if rs, ok := tr.(railStatser); ok {
			var out []bench.Rail
			for _, s := range rs.Stats() {
				out = append(out, bench.Rail{Device: s.Device, Up: s.Up, Bytes: s.Bytes, Slices: s.Slices, Errors: s.Errors})
			}
			return out
		}
	}
	return nil
}
