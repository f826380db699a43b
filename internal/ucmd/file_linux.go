package ucmd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/rdmago/te/internal/dma"
	"github.com/rdmago/te/internal/uapi"
	"github.com/rdmago/te/internal/unix"
)

// RDMAVerbsIoctl is the ioctl request number of the verbs ioctl channel.
const RDMAVerbsIoctl = uapi.RDMAVerbsIoctl

// arenaSize holds the largest command we build: a QUERY_GID_TABLE reply of
// 1024 entries (32 KiB) plus headers.
const arenaSize = 64 << 10

// ErrClosed is returned by commands on a closed File.
var ErrClosed = os.ErrClosed

// File is an open /dev/infiniband/uverbsN. Commands are serialized; all of
// their memory lives in the File's mmap'd arena.
type File struct {
	mu       sync.Mutex // guards everything below and the arena contents
	fd       int
	arena    *dma.Region
	buf      []byte
	base     uint64
	driverID uint32
	ib       Builder
	// cleanup closes fd if the File becomes unreachable without Close (a
	// leaked device context), so the kernel still destroys its objects.
	// The arena is left mapped: nothing outside the File touches it, and
	// unmapping memory from a cleanup is not worth the risk.
	cleanup runtime.Cleanup
}

// Open opens a uverbs character device read-write and close-on-exec.
func Open(path string) (*File, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	arena, err := dma.Alloc(arenaSize)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	b := arena.Bytes()
	f := &File{fd: fd, arena: arena, buf: b, base: dma.Addr(b)}
	f.cleanup = runtime.AddCleanup(f, closeFD, fd)
	return f, nil
}

// closeFD is a cleanup: it closes a descriptor its owner leaked.
func closeFD(fd int) { unix.Close(fd) }

// FD returns the command fd (for mmap of kernel queues and UARs), or -1 when closed.
func (f *File) FD() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.buf == nil {
		return -1
	}
	return f.fd
}

// SetDriverID sets the driver id every ioctl header must carry.
func (f *File) SetDriverID(id uint32) {
	f.mu.Lock()
	f.driverID = id
	f.mu.Unlock()
}

// DriverID returns the driver id used for ioctls.
func (f *File) DriverID() uint32 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.driverID
}

// Close closes the fd and frees the arena. The kernel then destroys every
// object still open on this file (after all its mmaps are gone). Idempotent.
func (f *File) Close() error {
	if f == nil {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.buf == nil {
		return nil
	}
	f.buf = nil
	f.cleanup.Stop() // before the number can be reused
	err := unix.Close(f.fd)
	f.fd = -1
	if e := f.arena.Unmap(); err == nil {
		err = e
	}
	if err != nil {
		return fmt.Errorf("ucmd: close: %w", err)
	}
	return nil
}

// Write runs a legacy write() command: req is the core request without the
// 8-byte header (first field the response pointer when resp/drvOut are
// non-empty), drvIn the driver request; the kernel's response is copied to
// resp and the driver response to drvOut.
func (f *File) Write(cmd uint32, req, drvIn, resp, drvOut []byte) error {
	return f.run(EncodeWrite, cmd, req, drvIn, resp, drvOut)
}

// WriteEx runs an extended write() command (cmd with bit 31 set).
func (f *File) WriteEx(cmd uint32, req, drvIn, resp, drvOut []byte) error {
	return f.run(EncodeWriteEx, cmd, req, drvIn, resp, drvOut)
}

// run encodes a write() command with encode (EncodeWrite or
// EncodeWriteEx) into the file's command buffer, issues it and copies the
// kernel's response out.
func (f *File) run(encode func(buf []byte, base uint64, cmd uint32, req, drvIn []byte, respLen, drvOutLen int) (int, error),
	cmd uint32, req, drvIn, resp, drvOut []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.buf == nil {
		return ErrClosed
	}
	n, err := encode(f.buf, f.base, cmd, req, drvIn, len(resp), len(drvOut))
	if err != nil {
		return err
	}
	if err := f.write(n); err != nil {
		return err
	}
	r := Response(f.buf, len(resp)+len(drvOut))
	copy(resp, r)
	copy(drvOut, r[len(resp):])
	return nil
}

func (f *File) write(n int) error {
	for {
		m, err := unix.Write(f.fd, f.buf[:n])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if m != n {
			return fmt.Errorf("ucmd: short command write %d of %d", m, n)
		}
		return nil
	}
}

// Ioctl runs one RDMA_VERBS_IOCTL: build adds attributes, then the call is
// made, then (on success) read inspects outputs. Both run with the File
// locked and must not keep references to the Builder or its buffers.
func (f *File) Ioctl(object, method uint16, build func(*Builder), read func(*Builder)) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.buf == nil {
		return ErrClosed
	}
	b := &f.ib
	b.Reset(f.buf, f.base, f.driverID, object, method)
	build(b)
	if _, err := b.Finish(); err != nil {
		return err
	}
	for {
		err := ioctl(f.fd, f.buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		break
	}
	if read != nil {
		read(b)
	}
	return nil
}

// RawWrite writes a command the caller built in its own stable (mmap'd)
// memory. It exists for allocation-free data-path commands such as the rxe
// send kick; it does not take the File lock.
func RawWrite(fd int, cmd []byte) error {
	return writeAll(fd, cmd, func(fd int, b []byte) (int, error) { return unix.Write(fd, b) })
}

// QuickWrite is RawWrite for commands that do a short, bounded amount of
// kernel work and never sleep waiting for anything (a small rxe send kick):
// the write is issued without telling the scheduler a syscall is under way
// (see rawWrite), so the goroutine keeps its P. Announcing such a call let
// sysmon hand the P away mid-command, and taking it back afterwards put
// tens of microseconds on Soft-RoCE round trips.
func QuickWrite(fd int, cmd []byte) error { return writeAll(fd, cmd, rawWrite) }

func writeAll(fd int, cmd []byte, write func(int, []byte) (int, error)) error {
	for {
		n, err := write(fd, cmd)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n != len(cmd) {
			return errShortWrite
		}
		return nil
	}
}

var errShortWrite = errors.New("ucmd: short command write")

// ---- event files -------------------------------------------------------------

// EventFile is an async-event fd or a completion channel fd, switched to
// non-blocking mode and registered with the Go netpoller, so a goroutine
// waiting for an event parks without holding an OS thread.
type EventFile struct {
	f  *os.File
	fd int // kept so we never call f.Fd(), which may switch the file to blocking mode
	rc syscall.RawConn

	// try is the non-blocking read behind TryRead and Read's fast path.
	// RawConn.Read holds the fd against a concurrent Close; the callback
	// and its scratch are made once here so a read allocates nothing.
	tryMu  sync.Mutex
	tryFn  func(fd uintptr) bool
	tryBuf []byte
	tryN   int
	tryErr error
}

// NewEventFile takes ownership of fd.
func NewEventFile(fd int, name string) (*EventFile, error) {
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ucmd: set %s non-blocking: %w", name, err)
	}
	e := &EventFile{f: os.NewFile(uintptr(fd), name), fd: fd}
	rc, err := e.f.SyscallConn()
	if err != nil {
		e.f.Close()
		return nil, fmt.Errorf("ucmd: %s: %w", name, err)
	}
	e.rc = rc
	e.tryFn = func(fd uintptr) bool {
		for {
			e.tryN, e.tryErr = unix.Read(int(fd), e.tryBuf)
			if e.tryErr != unix.EINTR {
				return true // one attempt: EAGAIN is an answer, not a wait
			}
		}
	}
	return e, nil
}

// try reads one queued record without waiting. ok is false when none is
// queued; err is set when the file is closed or the read failed.
func (e *EventFile) try(buf []byte) (n int, ok bool, err error) {
	e.tryMu.Lock()
	e.tryBuf = buf
	err = e.rc.Read(e.tryFn)
	n, rerr := e.tryN, e.tryErr
	e.tryBuf, e.tryErr = nil, nil
	e.tryMu.Unlock()
	switch {
	case err != nil:
		return 0, false, err
	case rerr == unix.EAGAIN:
		return 0, false, nil
	case rerr != nil:
		return 0, false, rerr
	}
	return n, true, nil
}

// Fd returns the fd number (for attaching a channel at CQ creation). It is
// valid until Close.
func (e *EventFile) Fd() int { return e.fd }

// Read waits for one event record (the kernel returns exactly one per read)
// until ctx is done. It returns ctx.Err() on cancellation and os.ErrClosed
// after Close.
func (e *EventFile) Read(ctx context.Context, buf []byte) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	// Fast path: a record already queued is read without parking and
	// without watching ctx (context.AfterFunc allocates), so a busy
	// completion loop allocates nothing. Errors fall through to the
	// blocking read, which reports them (os.ErrClosed after Close).
	if n, ok, err := e.try(buf); ok && err == nil {
		return n, nil
	}
	// The file deadline is only ever set by ctx firing, so a deadline error
	// always means ctx is done and ctx.Err() is the answer. A context that
	// can never be done needs no watcher.
	_ = e.f.SetReadDeadline(time.Time{})
	stop := func() bool { return false }
	if ctx.Done() != nil {
		stop = context.AfterFunc(ctx, func() { _ = e.f.SetReadDeadline(time.Unix(1, 0)) })
	}
	n, err := e.f.Read(buf)
	stop()
	if err == nil {
		return n, nil // an event that raced with cancellation is still delivered
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		if cerr := ctx.Err(); cerr != nil {
			return 0, cerr
		}
	}
	return n, err
}

// TryRead reads one event if one is queued; ok is false when none is.
func (e *EventFile) TryRead(buf []byte) (n int, ok bool, err error) {
	return e.try(buf)
}

// Close closes the fd, waking a blocked Read with os.ErrClosed. Idempotent.
func (e *EventFile) Close() error {
	if e == nil {
		return nil
	}
	if err := e.f.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
		return err
	}
	return nil
}
