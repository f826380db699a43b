//go:build !linux

package sock

import (
	"errors"
	"net"
	"syscall"
	"time"
)

var errOS = errors.New("sock: socket cookies and TCP_INFO need Linux")

// Info is the part of the kernel's struct tcp_info the tracer reports.
type Info struct {
	State                                              uint8
	BytesSent, BytesAcked, BytesReceived, BytesRetrans uint64
	TotalRetrans                                       uint32
	RTT, RTTVar, MinRTT, LastDataSent, LastDataRecv    time.Duration
}

// Cookie needs Linux.
func Cookie(syscall.Conn) (uint64, error) { return 0, errOS }

// TCPInfo needs Linux.
func TCPInfo(syscall.Conn) (Info, error) { return Info{}, errOS }

// ListenIn needs Linux.
func ListenIn(string, string) (net.Listener, error) { return nil, errOS }

// Monotonic needs Linux.
func Monotonic() time.Duration { return 0 }

// Inode needs Linux.
func Inode(string) (uint64, error) { return 0, errOS }
