package ebpf

import (
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// Errors from Open; compare with errors.Is.
var (
	// ErrPermission: the process may not load BPF programs (needs root,
	// or CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN).
	ErrPermission = errors.New("ebpf: tracing needs root (CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN)")
	// ErrUnsupported: the kernel lacks something the tracer needs; the
	// error names it.
	ErrUnsupported = errors.New("ebpf: the kernel lacks a feature the tracer needs")
	// ErrClosed: the Tracer was closed.
	ErrClosed = errors.New("ebpf: tracer closed")
)

// Filter selects the connections to trace. A connection is traced when it
// matches any field that is set; the zero Filter traces every TCP
// connection in the tracer's network namespace.
type Filter struct {
	// PID selects the connections the process holds open (by its socket
	// file descriptors). Events of a connection it dials are seen from
	// its connect(); of one it accepts, from the first Snapshot after.
	PID int
	// Cgroup is a cgroup v2 directory (e.g. /sys/fs/cgroup/unified/te):
	// connections created by processes in exactly that cgroup. Accepted
	// connections belong to the listener's cgroup.
	Cgroup string
	// Ports selects connections with one of these local or remote ports.
	Ports []uint16
	// Cookies selects these sockets (tcp.Lane.Cookie).
	Cookies []uint64
}

func (f Filter) all() bool {
	return f.PID == 0 && f.Cgroup == "" && len(f.Ports) == 0 && len(f.Cookies) == 0
}

//go:generate go tool stringer -linecomment -type State,EventKind -output state_string.go

// State is a TCP state (include/net/tcp_states.h).
type State uint8

// TCP states.
const (
	Established State = iota + 1 // ESTABLISHED
	SynSent                      // SYN_SENT
	SynRecv                      // SYN_RECV
	FinWait1                     // FIN_WAIT1
	FinWait2                     // FIN_WAIT2
	TimeWait                     // TIME_WAIT
	Close                        // CLOSE
	CloseWait                    // CLOSE_WAIT
	LastAck                      // LAST_ACK
	Listen                       // LISTEN
	Closing                      // CLOSING
	NewSynRecv                   // NEW_SYN_RECV
)

// Conn is one traced connection as of a Snapshot.
type Conn struct {
	Cookie        uint64 // SO_COOKIE
	Local, Remote netip.AddrPort
	State         State
	BytesSent     uint64 // including retransmitted bytes
	BytesAcked    uint64 // acknowledged by the peer; +1 for a SYN sent, +1 for a FIN
	BytesReceived uint64 // +1 for a FIN received
	BytesRetrans  uint64
	// Retransmits counts retransmitted segments (the kernel's
	// total_retrans); RetransmitEvents the tcp_retransmit_skb events seen
	// while traced (one may cover several segments).
	Retransmits      uint32
	RetransmitEvents uint32
	StateChanges     uint32 // seen while traced
	SRTT             time.Duration
	RTTVar           time.Duration
	MinRTT           time.Duration
	Cwnd             uint32 // segments
	// Idle is the time since the connection last sent or received
	// (tcp_mstamp), when the snapshot was taken.
	Idle   time.Duration
	Inode  uint64 // the socket's inode (/proc/PID/fd: socket:[Inode]); 0 once orphaned
	Cgroup uint64 // cgroup v2 id it was created in
	UID    uint32
	// Closed: the connection is gone since the previous Snapshot (it is
	// reported once); counters are from then, State from the last event.
	Closed bool
}

// EventKind says what an Event reports.
type EventKind uint8

// Event kinds.
const (
	StateChange EventKind = iota + 1 // state
	Retransmit                       // retransmit
)

// Event is a state change or a retransmission of a traced connection.
type Event struct {
	Time          time.Time
	Kind          EventKind
	Cookie        uint64
	Local, Remote netip.AddrPort
	// Old and New are the states (both the current state for Retransmit).
	Old, New      State
	SRTT          time.Duration
	Retransmits   uint32 // the connection's total so far
	BytesAcked    uint64
	BytesReceived uint64
}

func (e Event) String() string {
	s := fmt.Sprintf("%s %s->%s cookie %d", e.Kind, e.Local, e.Remote, e.Cookie)
	if e.Kind == StateChange {
		return s + fmt.Sprintf(" %s -> %s", e.Old, e.New)
	}
	return s + fmt.Sprintf(" %s retransmits %d srtt %s", e.New, e.Retransmits, e.SRTT)
}
