package uverbs

import (
	"fmt"
	"strings"

	"github.com/rdmago/te/internal/ucmd"
)

// A Provider is the driver-specific half of the verbs stack (rxe, mlx5). The
// core (this package) runs every kernel command; a provider supplies the
// driver data (UHW) those commands carry and owns the data path on the memory
// it maps or allocates: posting WQEs, ringing doorbells, polling CQEs and
// arming CQs.
//
// Creation of a CQ or QP is two-phase: the core asks the provider for a
// DriverCQ/DriverQP, takes its Request (driver input bytes and the size of the
// driver output), runs the kernel command, then hands the kernel's answer to
// Created. Destroyed is called after the kernel object is gone (or the create
// failed) to release mappings and buffers.
//
// Providers are passed explicitly in Options.Providers; package
// uverbs/providers lists every provider te carries.
type Provider interface {
	// Name is a short lower-case name ("rxe", "mlx5").
	Name() string
	// DriverID is the kernel driver this provider drives; ioctl headers carry it.
	DriverID() DriverID
	// ContextRequest returns the driver input of GET_CONTEXT and the size of
	// its driver output.
	ContextRequest() (in []byte, outLen int)
	// NewContext is called after GET_CONTEXT succeeded with its driver output.
	// k stays valid until DriverContext.Close returns.
	NewContext(k Kernel, out []byte) (DriverContext, error)
}

// Kernel is a context's uverbs command file as a provider sees it. Providers
// mmap queues and UARs on FD and may issue driver-specific commands; the core
// keeps the file open until every object is destroyed and the provider
// context is closed.
type Kernel interface {
	// FD is the uverbs command fd (for mmap).
	FD() int
	// Write runs a legacy write() command (see ucmd.File.Write).
	Write(cmd uint32, req, drvIn, resp, drvOut []byte) error
	// Ioctl runs one RDMA_VERBS_IOCTL (driver objects such as mlx5 UARs).
	Ioctl(object, method uint16, build func(*ucmd.Builder), read func(*ucmd.Builder)) error
}

// DriverContext is a provider's per-context state.
type DriverContext interface {
	// NewCQ prepares a CQ of at least cfg.Entries entries.
	NewCQ(cfg DriverCQConfig) (DriverCQ, error)
	// NewQP prepares a QP. cfg.SendCQ and cfg.RecvCQ are DriverCQs this
	// DriverContext created (providers may type-assert them).
	NewQP(cfg DriverQPConfig) (DriverQP, error)
	// Close releases context-wide resources (UARs, ...). Called once, after
	// all CQs and QPs were destroyed, before the command fd is closed.
	Close() error
}

// DriverCQConfig describes a CQ to create.
type DriverCQConfig struct {
	Entries int // minimum number of CQEs; the core checked it is <= Limits.MaxCQE
	// Limits are the device's; a provider that rounds Entries up checks the
	// rounded size against them.
	Limits DeviceLimits
}

// DeviceLimits are the device limits the core passes to providers with
// each creation request (from QUERY_DEVICE at Open).
type DeviceLimits struct {
	MaxCQE uint32 // most entries a CQ may have (0: unknown, not checked)
}

// DriverCQ is a provider's completion queue.
//
// Poll and Arm are called by one goroutine at a time (the CQ's owner).
type DriverCQ interface {
	// Request returns the cqe value for the core command, the driver input
	// and the driver output size.
	Request() (cqe uint32, in []byte, outLen int)
	// Created receives the kernel handle, the cqe value the kernel reports
	// and the driver output.
	Created(h Handle, cqe uint32, out []byte) error
	// Poll fills wc with up to len(wc) completions and returns how many.
	// It must not allocate. An error (a pre-allocated sentinel such as
	// ErrStrayCompletion, returned unwrapped) stops the poll; the n
	// completions before it are valid.
	Poll(wc []WC) (n int, err error)
	// Arm requests a completion event for the next (solicited-only: next
	// solicited) completion.
	Arm(solicitedOnly bool) error
	// EventConsumed is called once per completion event read for this CQ
	// (mlx5 advances its arm sequence number), by the goroutine reading
	// the channel, which need not be the owner: it may run concurrently
	// with Poll and Arm.
	EventConsumed()
	// Destroyed releases the provider's resources. h is 0 when creation failed.
	Destroyed() error
}

// CQCleaner is implemented by a DriverCQ that keeps completions in user
// memory where a stale one could be matched to later work (mlx5 names the
// QP of a CQE by user index and its work request by a queue counter that
// restarts at RESET). The core calls Clean(qp) with the CQ's owner guard
// held, so no Poll runs meanwhile: after the kernel moved qp to RESET
// (before qp's StateChanged) and after it destroyed qp (before qp's
// Destroyed), once per distinct CQ of qp. Clean discards qp's completions
// that were not yet polled and keeps the others in order. It must not
// block. Providers whose completions carry the work request ID itself
// (rxe) need not implement it.
type CQCleaner interface {
	Clean(qp DriverQP)
}

// DriverQPConfig describes a QP to create.
type DriverQPConfig struct {
	Type           QPType
	Caps           QPCaps
	SendCQ, RecvCQ DriverCQ
	SignalAll      bool
}

// QPCreated is the kernel's answer to CREATE_QP.
type QPCreated struct {
	Handle Handle
	QPN    QPN
	Caps   QPCaps // as granted by the kernel
}

// DriverQP is a provider's queue pair. PostSend and PostRecv are each called by
// one goroutine at a time and must not allocate. The core checks the QP state
// before calling them.
type DriverQP interface {
	// Request returns the core caps to ask the kernel for (a provider may
	// round them), the driver input and the driver output size.
	Request() (caps QPCaps, in []byte, outLen int)
	// Created receives the kernel's answer and the driver output.
	Created(c QPCreated, out []byte) error
	// PostSend posts wrs in order and returns how many were posted; on
	// error, wrs[n] is the first one not posted.
	PostSend(wrs []SendWR) (n int, err error)
	// PostRecv posts receive requests, same contract as PostSend.
	PostRecv(wrs []RecvWR) (n int, err error)
	// StateChanged is called after a successful modify to state s.
	StateChanged(s QPState)
	// Destroyed releases the provider's resources. Called after the kernel
	// destroyed the QP, or after a failed create.
	Destroyed() error
}

func findProvider(list []Provider, id DriverID) (Provider, error) {
	for _, p := range list {
		if p.DriverID() == id {
			return p, nil
		}
	}
	if len(list) == 0 {
		return nil, fmt.Errorf("%w %s: no providers given (pass Options.Providers, e.g. providers.All() of package github.com/rdmago/te/uverbs/providers)", ErrNoProvider, id)
	}
	names := make([]string, len(list))
	for i, p := range list {
		names[i] = p.Name()
	}
	return nil, fmt.Errorf("%w %s (given: %s)", ErrNoProvider, id, strings.Join(names, ", "))
}

// UnimplementedProvider can be embedded by providers (and test fakes) so
// that they keep compiling when Provider gains methods; its methods fail with
// ErrNotSupported.
type UnimplementedProvider struct{}

// Name implements Provider.
func (UnimplementedProvider) Name() string { return "unimplemented" }

// DriverID implements Provider.
func (UnimplementedProvider) DriverID() DriverID { return DriverUnknown }

// ContextRequest implements Provider.
func (UnimplementedProvider) ContextRequest() ([]byte, int) { return nil, 0 }

// NewContext implements Provider.
func (UnimplementedProvider) NewContext(Kernel, []byte) (DriverContext, error) {
	return nil, ErrNotSupported
}

// UnimplementedDriverCQ can be embedded by DriverCQ implementations and fakes.
type UnimplementedDriverCQ struct{}

// Request implements DriverCQ.
func (UnimplementedDriverCQ) Request() (uint32, []byte, int) { return 0, nil, 0 }

// Created implements DriverCQ.
func (UnimplementedDriverCQ) Created(Handle, uint32, []byte) error { return ErrNotSupported }

// Poll implements DriverCQ.
func (UnimplementedDriverCQ) Poll([]WC) (int, error) { return 0, nil }

// Arm implements DriverCQ.
func (UnimplementedDriverCQ) Arm(bool) error { return ErrNotSupported }

// EventConsumed implements DriverCQ.
func (UnimplementedDriverCQ) EventConsumed() {}

// Destroyed implements DriverCQ.
func (UnimplementedDriverCQ) Destroyed() error { return nil }

// UnimplementedDriverQP can be embedded by DriverQP implementations and fakes.
type UnimplementedDriverQP struct{}

// Request implements DriverQP.
func (UnimplementedDriverQP) Request() (QPCaps, []byte, int) { return QPCaps{}, nil, 0 }

// Created implements DriverQP.
func (UnimplementedDriverQP) Created(QPCreated, []byte) error { return ErrNotSupported }

// PostSend implements DriverQP.
func (UnimplementedDriverQP) PostSend([]SendWR) (int, error) { return 0, ErrNotSupported }

// PostRecv implements DriverQP.
func (UnimplementedDriverQP) PostRecv([]RecvWR) (int, error) { return 0, ErrNotSupported }

// StateChanged implements DriverQP.
func (UnimplementedDriverQP) StateChanged(QPState) {}

// Destroyed implements DriverQP.
func (UnimplementedDriverQP) Destroyed() error { return nil }
