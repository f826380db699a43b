// Package unix is the module's one door to golang.org/x/sys/unix: every
// system call, constant and kernel type the other internal packages need is
// named here (internal/importrules_test.go enforces it), so the surface te
// uses of the raw kernel interface is one list that review and tests can
// see. It adds nothing: each name is x/sys/unix's.
package unix

import sys "golang.org/x/sys/unix"

// Types.
type (
	EpollEvent      = sys.EpollEvent
	Errno           = sys.Errno
	Iovec           = sys.Iovec
	Msghdr          = sys.Msghdr
	RawSockaddrAny  = sys.RawSockaddrAny
	SockaddrNetlink = sys.SockaddrNetlink
	Stat_t          = sys.Stat_t
	Sysinfo_t       = sys.Sysinfo_t
	TCPInfo         = sys.TCPInfo
	Timespec        = sys.Timespec
	Ucred           = sys.Ucred
	Utsname         = sys.Utsname
)

// Constants.
const (
	AF_NETLINK         = sys.AF_NETLINK
	BPF_STATS_RUN_TIME = sys.BPF_STATS_RUN_TIME
	CLOCK_MONOTONIC    = sys.CLOCK_MONOTONIC
	CLONE_NEWNET       = sys.CLONE_NEWNET
	EAGAIN             = sys.EAGAIN
	EBADF              = sys.EBADF
	EEXIST             = sys.EEXIST
	EINTR              = sys.EINTR
	EINVAL             = sys.EINVAL
	EIO                = sys.EIO
	ENOMEM             = sys.ENOMEM
	EOPNOTSUPP         = sys.EOPNOTSUPP
	EPOLLERR           = sys.EPOLLERR
	EPOLLET            = sys.EPOLLET
	EPOLLHUP           = sys.EPOLLHUP
	EPOLLIN            = sys.EPOLLIN
	EPOLLOUT           = sys.EPOLLOUT
	EPOLLRDHUP         = sys.EPOLLRDHUP
	EPOLL_CLOEXEC      = sys.EPOLL_CLOEXEC
	EPOLL_CTL_ADD      = sys.EPOLL_CTL_ADD
	EPOLL_CTL_DEL      = sys.EPOLL_CTL_DEL
	EPOLL_CTL_MOD      = sys.EPOLL_CTL_MOD
	EFD_CLOEXEC        = sys.EFD_CLOEXEC
	EFD_NONBLOCK       = sys.EFD_NONBLOCK
	EPERM              = sys.EPERM
	FD_CLOEXEC         = sys.FD_CLOEXEC
	F_ADD_SEALS        = sys.F_ADD_SEALS
	F_DUPFD_CLOEXEC    = sys.F_DUPFD_CLOEXEC
	F_GETFD            = sys.F_GETFD
	F_GET_SEALS        = sys.F_GET_SEALS
	F_SEAL_GROW        = sys.F_SEAL_GROW
	F_SEAL_SEAL        = sys.F_SEAL_SEAL
	F_SEAL_SHRINK      = sys.F_SEAL_SHRINK
	IPPROTO_TCP        = sys.IPPROTO_TCP
	MADV_DONTFORK      = sys.MADV_DONTFORK
	MADV_HUGEPAGE      = sys.MADV_HUGEPAGE
	MAP_ANONYMOUS      = sys.MAP_ANONYMOUS
	MAP_FIXED          = sys.MAP_FIXED
	MAP_NORESERVE      = sys.MAP_NORESERVE
	MAP_PRIVATE        = sys.MAP_PRIVATE
	MAP_SHARED         = sys.MAP_SHARED
	MFD_ALLOW_SEALING  = sys.MFD_ALLOW_SEALING
	MFD_CLOEXEC        = sys.MFD_CLOEXEC
	MSG_CTRUNC         = sys.MSG_CTRUNC
	MSG_CMSG_CLOEXEC   = sys.MSG_CMSG_CLOEXEC
	MSG_MORE           = sys.MSG_MORE
	SYS_RECVMSG        = sys.SYS_RECVMSG
	NETLINK_RDMA       = sys.NETLINK_RDMA
	NLM_F_ACK          = sys.NLM_F_ACK
	NLM_F_DUMP         = sys.NLM_F_DUMP
	NLM_F_REQUEST      = sys.NLM_F_REQUEST
	O_CLOEXEC          = sys.O_CLOEXEC
	O_RDONLY           = sys.O_RDONLY
	O_RDWR             = sys.O_RDWR
	PROT_NONE          = sys.PROT_NONE
	PROT_READ          = sys.PROT_READ
	PROT_WRITE         = sys.PROT_WRITE
	SOCK_CLOEXEC       = sys.SOCK_CLOEXEC
	SOCK_RAW           = sys.SOCK_RAW
	SOL_SOCKET         = sys.SOL_SOCKET
	SO_COOKIE          = sys.SO_COOKIE
	SO_PEERCRED        = sys.SO_PEERCRED
	SYS_IOCTL          = sys.SYS_IOCTL
	SYS_WRITE          = sys.SYS_WRITE
	S_IFMT             = sys.S_IFMT
	S_IFREG            = sys.S_IFREG
	TCP_INFO           = sys.TCP_INFO
	TCP_NODELAY        = sys.TCP_NODELAY
)

// System calls and helpers.
var (
	ByteSliceToString         = sys.ByteSliceToString
	ClockGettime              = sys.ClockGettime
	Close                     = sys.Close
	CmsgSpace                 = sys.CmsgSpace
	Dup                       = sys.Dup
	EpollCreate1              = sys.EpollCreate1
	EpollWait                 = sys.EpollWait
	Eventfd                   = sys.Eventfd
	FcntlInt                  = sys.FcntlInt
	FinitModule               = sys.FinitModule
	Fstat                     = sys.Fstat
	Ftruncate                 = sys.Ftruncate
	Geteuid                   = sys.Geteuid
	GetsockoptInt             = sys.GetsockoptInt
	GetsockoptTCPInfo         = sys.GetsockoptTCPInfo
	GetsockoptUcred           = sys.GetsockoptUcred
	GetsockoptUint64          = sys.GetsockoptUint64
	Gettid                    = sys.Gettid
	Madvise                   = sys.Madvise
	MemfdCreate               = sys.MemfdCreate
	Mmap                      = sys.Mmap
	MmapPtr                   = sys.MmapPtr
	Munmap                    = sys.Munmap
	MunmapPtr                 = sys.MunmapPtr
	Open                      = sys.Open
	ParseSocketControlMessage = sys.ParseSocketControlMessage
	ParseUnixRights           = sys.ParseUnixRights
	Pipe2                     = sys.Pipe2
	Recvfrom                  = sys.Recvfrom
	Sendto                    = sys.Sendto
	SetNonblock               = sys.SetNonblock
	Setns                     = sys.Setns
	Socket                    = sys.Socket
	Stat                      = sys.Stat
	Sysinfo                   = sys.Sysinfo
	Uname                     = sys.Uname
	UnixRights                = sys.UnixRights
)

// The calls of the data path are functions, not variables, so the compiler
// can inline them.

// Syscall is sys.Syscall: a system call the scheduler is told about.
func Syscall(trap, a1, a2, a3 uintptr) (r1, r2 uintptr, err Errno) {
	return sys.Syscall(trap, a1, a2, a3)
}

// RawSyscall is sys.RawSyscall: a short system call the scheduler is not
// told about.
func RawSyscall(trap, a1, a2, a3 uintptr) (r1, r2 uintptr, err Errno) {
	return sys.RawSyscall(trap, a1, a2, a3)
}

// Read is sys.Read.
func Read(fd int, p []byte) (n int, err error) { return sys.Read(fd, p) }

// Write is sys.Write.
func Write(fd int, p []byte) (n int, err error) { return sys.Write(fd, p) }
