//go:build !linux

package sock

import (
	"errors"
	"net"
	"net/netip"
	"time"
)

// ErrWouldBlock: a raw call found nothing to do now.
var ErrWouldBlock = errors.New("sock: would block")

// Readiness a Poller reports.
const (
	In  = 0x1
	Out = 0x4
	Hup = 0x2018
)

// Poller is epoll's, which only Linux has: NewPoller fails elsewhere and
// its users keep their goroutine per socket.
type Poller struct{}

// NewPoller fails: no epoll.
func NewPoller(int) (*Poller, error) { return nil, errors.ErrUnsupported }

func (*Poller) Add(int, uint64) error                  { return errors.ErrUnsupported }
func (*Poller) AddListener(*RawListener, uint64) error { return errors.ErrUnsupported }
func (*Poller) Wait(time.Duration) (int, bool, error)  { return 0, false, errors.ErrUnsupported }
func (*Poller) Event(int) (uint64, uint32)             { return 0, 0 }
func (*Poller) WatchOut(int, uint64) error             { return errors.ErrUnsupported }
func (*Poller) RemoveListener(*RawListener) error      { return errors.ErrUnsupported }
func (*Poller) Wake() error                            { return nil }
func (*Poller) Close() error                           { return nil }

// RawListener is Linux's only.
type RawListener struct{}

// NewRawListener fails: no raw calls here.
func NewRawListener(ln *net.TCPListener, _ bool) (*RawListener, error) {
	ln.Close()
	return nil, errors.ErrUnsupported
}

func (*RawListener) Addr() net.Addr { return nil }
func (*RawListener) Accept() (int, netip.AddrPort, error) {
	return -1, netip.AddrPort{}, errors.ErrUnsupported
}
func (*RawListener) Close() error { return nil }

// ReadFD is Linux's only.
func ReadFD(int, []byte) (int, error) { return 0, errors.ErrUnsupported }

// Vec is Linux's only.
type Vec struct{}

// NewVec returns a Vec whose writes fail.
func NewVec(int) *Vec { return &Vec{} }

func (*Vec) Write(int, [][]byte) (int, error)     { return 0, errors.ErrUnsupported }
func (*Vec) WriteMore(int, [][]byte) (int, error) { return 0, errors.ErrUnsupported }
func (*Vec) Read(int, [][]byte) (int, error)      { return 0, errors.ErrUnsupported }

// CloseFD is Linux's only.
func CloseFD(int) error { return errors.ErrUnsupported }

// Marks is Linux's only.
type Marks struct{}

// Set does nothing.
func (*Marks) Set(int, int, *int) error { return nil }
