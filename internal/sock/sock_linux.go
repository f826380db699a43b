package sock

import (
	"fmt"
	"net"
	"os"
	"runtime"
	"syscall"
	"time"

	"github.com/rdmago/te/internal/unix"
)

// Cookie returns the socket's cookie: a number the kernel gives each socket
// once per boot, never reused, equal to bpf_get_socket_cookie() in BPF
// programs.
func Cookie(c syscall.Conn) (uint64, error) {
	var v uint64
	err := control(c, func(fd int) (err error) {
		v, err = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_COOKIE)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("sock: SO_COOKIE: %w", err)
	}
	return v, nil
}

// Info is the part of the kernel's struct tcp_info the tracer reports.
type Info struct {
	State         uint8 // TCP_ESTABLISHED = 1 ... (include/net/tcp_states.h)
	BytesSent     uint64
	BytesAcked    uint64
	BytesReceived uint64
	BytesRetrans  uint64
	TotalRetrans  uint32 // segments retransmitted over the connection's life
	RTT           time.Duration
	RTTVar        time.Duration
	MinRTT        time.Duration
	LastDataSent  time.Duration // since the last data was sent
	LastDataRecv  time.Duration // since the last data was received
}

// TCPInfo reads TCP_INFO of a TCP connection.
func TCPInfo(c syscall.Conn) (Info, error) {
	var ti *unix.TCPInfo
	err := control(c, func(fd int) (err error) {
		ti, err = unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
		return err
	})
	if err != nil {
		return Info{}, fmt.Errorf("sock: TCP_INFO: %w", err)
	}
	us := func(v uint32) time.Duration { return time.Duration(v) * time.Microsecond }
	ms := func(v uint32) time.Duration { return time.Duration(v) * time.Millisecond }
	return Info{
		State:         ti.State,
		BytesSent:     ti.Bytes_sent,
		BytesAcked:    ti.Bytes_acked,
		BytesReceived: ti.Bytes_received,
		BytesRetrans:  ti.Bytes_retrans,
		TotalRetrans:  ti.Total_retrans,
		RTT:           us(ti.Rtt),
		RTTVar:        us(ti.Rttvar),
		MinRTT:        us(ti.Min_rtt),
		LastDataSent:  ms(ti.Last_data_sent),
		LastDataRecv:  ms(ti.Last_data_recv),
	}, nil
}

func control(c syscall.Conn, f func(fd int) error) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = f(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// ListenIn opens a TCP listener inside the network namespace at nsPath
// (e.g. /var/run/netns/NAME). Connections it accepts live in that
// namespace; the calling goroutine's thread returns to its own namespace
// before ListenIn returns. Needs CAP_SYS_ADMIN.
func ListenIn(nsPath, addr string) (net.Listener, error) {
	ns, err := os.Open(nsPath)
	if err != nil {
		return nil, fmt.Errorf("sock: netns: %w", err)
	}
	defer ns.Close()
	runtime.LockOSThread()
	self, err := os.Open(fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid()))
	if err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("sock: netns: %w", err)
	}
	defer self.Close()
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("sock: setns %s: %w", nsPath, err)
	}
	ln, lerr := net.Listen("tcp", addr)
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
		// The thread is stuck in the other namespace: keep it locked, so
		// it exits with this goroutine instead of serving others.
		if ln != nil {
			ln.Close()
		}
		return nil, fmt.Errorf("sock: setns back: %w", err)
	}
	runtime.UnlockOSThread()
	if lerr != nil {
		return nil, fmt.Errorf("sock: listen in %s: %w", nsPath, lerr)
	}
	return ln, nil
}

// Monotonic reads CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns and of
// the kernel's TCP timestamps.
func Monotonic() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic("sock: CLOCK_MONOTONIC: " + err.Error()) // cannot fail on Linux
	}
	return time.Duration(ts.Nano())
}

// Inode returns the inode number of path; a cgroup v2 directory's is its
// cgroup id (what bpf_get_current_cgroup_id and the socket's cgroup
// report).
func Inode(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("sock: stat %s: %w", path, err)
	}
	return st.Ino, nil
}
