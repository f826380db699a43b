package rdma

import (
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/uverbs"
	"github.com/rdmago/te/uverbs/providers"
)

// Config tunes the transport. Zero values take the defaults noted.
type Config struct {
	// Devices names the rails' devices (rxe0, mlx5_2). Empty: every device
	// whose Port is active.
	Devices []string
	// Priority maps a memory location (the tag given to
	// RegisterLocalMemory: "cpu:0", "cuda:3") to the devices it should use
	// first, like Mooncake's NIC priority matrix; slices move to the other
	// rails only when none of those is up. Without an entry, "cpu:N"
	// prefers the devices on NUMA node N.
	Priority map[string][]string
	// Port is the port of each device (default 1).
	Port uint8
	// GIDIndex picks each rail's GID table entry (e.g. new(3)); nil
	// chooses: the first RoCE v2 IPv4 GID, or index 0 on InfiniBand.
	GIDIndex *int
	// Listen is the control (handshake) address. Default: the first rail's
	// IPv4 address (from its GID) on an ephemeral port, or 127.0.0.1:0.
	// With Mooncake, an address here opens a handshake socket of the
	// transport's own (package mooncake/p2p), for metadata stores that
	// have none (Mooncake's HTTP metadata publishes it as rpc_meta); with
	// none, the P2PHANDSHAKE store's socket is given the transport's
	// handshakes (p2p.Store.HandleConnections).
	Listen string
	// Advertise is the control address published in the descriptor when it
	// differs from the listener's.
	Advertise string
	// SliceSize is the largest slice (default 64 KiB).
	SliceSize uint64
	// QPsPerPath is how many QPs connect one local rail to one remote rail
	// (default 2).
	QPsPerPath int
	// SendDepth is each QP's send queue depth (default 256, capped by the
	// device).
	SendDepth int
	// CQDepth bounds the work requests in flight per rail (default 4096,
	// capped by the device).
	CQDepth int
	// MaxEndpoints bounds the endpoints (paths to remote rails) held at
	// once; idle ones are evicted (SIEVE) to make room (default 65536).
	MaxEndpoints int
	// MaxInitiatorQPs bounds the QPs one initiator may hold on this target
	// (default 1024); MaxTargetQPs bounds them all (default 16384).
	MaxInitiatorQPs int
	MaxTargetQPs    int
	// MaxSessions bounds concurrent control connections (default 4096);
	// MaxSessionsPerSource those from one IP address (default 1024, at
	// most MaxSessions). At a bound the connection that has waited
	// longest (in its handshake, or holding no QP) makes room; one
	// holding QPs is kept (internal/acceptor.Gate).
	MaxSessions          int
	MaxSessionsPerSource int
	// HandshakeTimeout bounds one handshake (default 5 s).
	HandshakeTimeout time.Duration
	// QPTimeout and RetryCount set the ACK timeout exponent and the retry
	// count of every QP; zero takes the provider's defaults (see
	// uverbs.RCDefaults). A dead peer fails slices after
	// uverbs.RetryBound(QPTimeout, RetryCount).
	QPTimeout, RetryCount uint8
	// SliceTimeout bounds a slice's time on the wire: a work request not
	// completed this long after it was posted fails its slice with an
	// error wrapping ErrSliceTimeout (retried by the engine on a fresh
	// endpoint, like any transient failure), and its endpoint is rebuilt.
	// Default: 4 × uverbs.RetryBound of the QPs' ACK timeout and retry
	// count (the provider's defaults where QPTimeout or RetryCount is
	// zero; ~30 s on rxe, ~1.9 s on hardware defaults), so only a work
	// request that the device never completes, not a slow one, hits it.
	SliceTimeout time.Duration
	// NotifyDepth is how many notification receives a target posts on
	// each responder QP: the notifications an initiator may have in
	// flight per QP before the target hands them over (default 8).
	NotifyDepth int
	// NotifyMarkers sends a notification as a marker behind its data on
	// every QP the data went over, the target delivering it once all
	// markers are in, instead of one SEND after the data has completed.
	NotifyMarkers bool
	// NotifyBuffers bounds the registered notification buffers of each
	// rail (default 4096, ~18 MiB): receives on a target, SEND sources on
	// an initiator. QPs created when they run short get fewer receives.
	NotifyBuffers int
	// RailPostBytes bounds the bytes of slices a rail keeps posted when
	// the transport has more than one rail (default 1 MiB; at least one
	// slice is posted). What Submit routed to the rail beyond it waits in
	// the rail, where another rail that has room and nothing of its own
	// left takes it (the newest first), so rails that run at different
	// speeds finish a batch together instead of one idling while the
	// other works through its share. Negative: no bound.
	RailPostBytes int64
	// SpinPolls is how many empty CQ polls a rail owner spends, while work
	// is in flight, before it sleeps on the completion channel (default 64).
	SpinPolls int
	// Options opens the devices. Its Providers default to
	// providers.All() (package uverbs/providers: rxe and mlx5).
	Options *uverbs.Options
	// Mooncake speaks Mooncake's RDMA wire instead of te's (see
	// mooncake.go): the descriptor entry is mooncake.TEProtoRDMA,
	// endpoints are set up by Mooncake's endpoint handshake on the peer's
	// handshake socket (package mooncake/p2p), whose Connection messages
	// this transport answers once given to p2p.Store.HandleConnections,
	// and QPs are connected as Mooncake connects its own. No control
	// listener is opened; notifications go as Notify messages to the
	// peer's handshake socket once their data has landed, as Mooncake
	// sends them (NotifyMarkers is off). The wire has no
	// authentication: Auth must be nil. The segment's name is the server
	// part of its NIC paths.
	Mooncake bool
	// Auth is the cluster secret: with it, the control connection proves
	// both sides hold it (package auth) before any QP is created for the
	// peer. nil: authentication off (peers with a secret refuse us).
	Auth *auth.Secret
}

func (c *Config) defaults() {
	if c.Options == nil || len(c.Options.Providers) == 0 {
		o := uverbs.Options{}
		if c.Options != nil {
			o = *c.Options
		}
		o.Providers = providers.All()
		c.Options = &o
	}
	if c.Port == 0 {
		c.Port = 1
	}
	if c.SliceSize == 0 {
		c.SliceSize = 64 << 10
	}
	if c.QPsPerPath <= 0 {
		c.QPsPerPath = 2
	}
	if c.SendDepth <= 0 {
		c.SendDepth = 256
	}
	if c.CQDepth <= 0 {
		c.CQDepth = 4096
	}
	if c.RailPostBytes == 0 {
		c.RailPostBytes = 1 << 20
	}
	if c.MaxEndpoints <= 0 {
		c.MaxEndpoints = 65536
	}
	if c.MaxInitiatorQPs <= 0 {
		c.MaxInitiatorQPs = 1024
	}
	if c.MaxTargetQPs <= 0 {
		c.MaxTargetQPs = 16384
	}
	if c.MaxSessions <= 0 {
		c.MaxSessions = 4096
	}
	if c.MaxSessionsPerSource <= 0 {
		c.MaxSessionsPerSource = 1024
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = 5 * time.Second
	}
	if c.NotifyDepth <= 0 {
		c.NotifyDepth = 8
	}
	if c.NotifyBuffers <= 0 {
		c.NotifyBuffers = 4096
	}
	if c.Mooncake {
		// Notifications travel on Mooncake's handshake socket, after the
		// data: no markers on the QPs.
		c.NotifyMarkers = false
	}
	if c.SpinPolls <= 0 {
		c.SpinPolls = 64
	}
}
