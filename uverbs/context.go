package uverbs

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/rdmago/te/internal/uapi"
	"github.com/rdmago/te/internal/ucmd"
)

var le = binary.LittleEndian

// Options configure Open. A nil *Options means defaults.
type Options struct {
	// Providers to choose from by driver id; Open fails with ErrNoProvider
	// without one for the device's driver. providers.All (package
	// uverbs/providers) lists every provider te carries.
	Providers []Provider
	// AsyncEventBuffer is the capacity of the Events channel (default 64).
	// Events that arrive while it is full are dropped and counted.
	AsyncEventBuffer int
	// OpenFile opens a device's command file. Nil (the default) opens the
	// uverbs character device at Device.Path; a simulated device
	// (internal/mlx5sim) answers the commands itself.
	OpenFile func(Device) (CommandFile, error)
	// Devices lists the devices Open and Lookup choose from by name. Nil
	// (the default) lists the host's, from sysfs (Devices); a simulated
	// fabric (internal/mlx5sim) lists its own.
	Devices func() ([]Device, error)
}

// List lists the devices: o.Devices where set, else the host's (Devices).
// A nil *Options lists the host's.
func (o *Options) List() ([]Device, error) {
	if o == nil || o.Devices == nil {
		return Devices()
	}
	return o.Devices()
}

// Lookup finds the device named name: among o.Devices where set, else
// the host's (LookupDevice). A nil *Options looks among the host's.
func (o *Options) Lookup(name string) (Device, error) {
	if o == nil || o.Devices == nil {
		return LookupDevice(name)
	}
	ds, err := o.Devices()
	if err != nil {
		return Device{}, err
	}
	for _, d := range ds {
		if d.Name == name {
			return d, nil
		}
	}
	return Device{}, fmt.Errorf("%w: %q", ErrNoDevice, name)
}

// CommandFile is the uverbs command file a Context runs every command
// through: the character device (*ucmd.File), or a simulated kernel. The
// completion-channel and async-event fds it hands out in responses are
// real descriptors the Context reads events from.
type CommandFile interface {
	Kernel
	// WriteEx runs an extended write() command (see ucmd.File.WriteEx).
	WriteEx(cmd uint32, req, drvIn, resp, drvOut []byte) error
	// SetDriverID sets the driver id every ioctl header carries.
	SetDriverID(id uint32)
	// Close closes the file; the kernel destroys what is still open on it.
	Close() error
}

var _ CommandFile = (*ucmd.File)(nil)

// openFile opens d's command file: opts.OpenFile, or the character device.
func openFile(d Device, opts *Options) (CommandFile, error) {
	if opts.OpenFile != nil {
		return opts.OpenFile(d)
	}
	f, err := ucmd.Open(d.Path)
	if err != nil {
		return nil, err // a nil *ucmd.File must not become a non-nil CommandFile
	}
	return f, nil
}

// Context is an open verbs device: the uverbs command file, its async event
// file, and the provider's per-context state. Its methods are safe for
// concurrent use. Close destroys every object still open.
type Context struct {
	dev            Device
	file           CommandFile
	prov           Provider
	drv            DriverContext
	async          *ucmd.EventFile
	events         chan AsyncEvent
	dropped        atomic.Uint64
	numCompVectors int
	limits         DeviceLimits // from QUERY_DEVICE at Open
	ioctls         ioctlProbe   // the ioctl methods this kernel lacks
	stopAsync      context.CancelFunc
	asyncDone      chan struct{}

	mu       sync.Mutex // guards the fields below
	closed   bool
	nextUH   uint64
	pds      map[*PD]struct{}
	cqs      map[uint64]*CQ // by user handle
	qps      map[uint64]*QP // by user handle
	channels map[*CompChannel]struct{}
}

// Open opens the RDMA device named name (e.g. "rxe0").
func Open(name string, opts *Options) (*Context, error) {
	d, err := opts.Lookup(name)
	if err != nil {
		return nil, err
	}
	return d.Open(opts)
}

// Open opens the device: GET_CONTEXT (which also creates the async event
// file, before any CQ or QP exists, so their events are never dropped), then
// the provider's context.
func (d Device) Open(opts *Options) (_ *Context, err error) {
	if opts == nil {
		opts = &Options{}
	}
	prov, err := findProvider(opts.Providers, d.DriverID)
	if err != nil {
		return nil, fmt.Errorf("uverbs: open %s: %w", d.Name, err)
	}
	f, err := openFile(d, opts)
	if err != nil {
		return nil, fmt.Errorf("uverbs: open %s: %w", d.Name, err)
	}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	f.SetDriverID(uint32(d.DriverID))
	drvIn, drvOutLen := prov.ContextRequest()
	req := uapi.GetContext{}
	var resp uapi.GetContextResp
	drvOut := make([]byte, drvOutLen)
	if err := f.Write(uapi.CmdGetContext, ucmd.Bytes(&req), drvIn, ucmd.Bytes(&resp), drvOut); err != nil {
		return nil, opErr("get_context", d.Name, err)
	}
	async, err := ucmd.NewEventFile(int(resp.AsyncFD), d.Name+"-async")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			async.Close()
		}
	}()
	// The device's limits, for creation requests to be checked against
	// them (here and by the provider) before the kernel sees them.
	qreq := uapi.QueryDevice{}
	var qr uapi.QueryDeviceResp
	if err := f.Write(uapi.CmdQueryDevice, ucmd.Bytes(&qreq), nil, ucmd.Bytes(&qr), nil); err != nil {
		return nil, opErr("query_device", d.Name, err)
	}
	limits := DeviceLimits{MaxCQE: qr.MaxCQE}
	drv, err := prov.NewContext(f, drvOut)
	if err != nil {
		return nil, fmt.Errorf("uverbs: open %s: %s provider: %w", d.Name, prov.Name(), err)
	}
	n := opts.AsyncEventBuffer
	if n <= 0 {
		n = 64
	}
	c := &Context{
		dev: d, file: f, prov: prov, drv: drv, async: async,
		events:         make(chan AsyncEvent, n),
		numCompVectors: int(resp.NumCompVectors),
		limits:         limits,
		asyncDone:      make(chan struct{}),
		pds:            map[*PD]struct{}{},
		cqs:            map[uint64]*CQ{},
		qps:            map[uint64]*QP{},
		channels:       map[*CompChannel]struct{}{},
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.stopAsync = cancel
	go c.readAsync(ctx)
	track(c, "Context on "+d.Name)
	return c, nil
}

func opErr(op, dev string, err error) error {
	return fmt.Errorf("uverbs: %s on %s: %w", op, dev, err)
}

// Device returns the device this context was opened on.
func (c *Context) Device() Device { return c.dev }

// Provider returns the provider driving this context.
func (c *Context) Provider() Provider { return c.prov }

// NumCompVectors is the number of completion vectors (CQConfig.CompVector < it).
func (c *Context) NumCompVectors() int { return c.numCompVectors }

func (c *Context) userHandle() uint64 {
	c.nextUH++
	return c.nextUH
}

func (c *Context) checkOpen() error {
	if c == nil || c.closed {
		return ErrClosed
	}
	return nil
}

// Close destroys every object still open on the context (QPs, CQs, AHs,
// MRs, PDs, completion channels, in that order), stops async event delivery, releases
// the provider's context and closes the device file. If objects were still
// open the returned error wraps ErrLeak and names them. Idempotent.
func (c *Context) Close() error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	var qps []*QP
	var cqs []*CQ
	var pds []*PD
	var chs []*CompChannel
	for _, q := range c.qps {
		qps = append(qps, q)
	}
	for _, q := range c.cqs {
		cqs = append(cqs, q)
	}
	for p := range c.pds {
		pds = append(pds, p)
	}
	for ch := range c.channels {
		chs = append(chs, ch)
	}
	c.mu.Unlock()

	var leaked []string
	var errs []error
	for _, q := range qps {
		leaked = append(leaked, fmt.Sprintf("QP %#x", uint32(q.qpn)))
		errs = append(errs, q.Close())
	}
	for _, q := range cqs {
		leaked = append(leaked, fmt.Sprintf("CQ %d", q.handle))
		errs = append(errs, q.Close())
	}
	for _, p := range pds {
		for _, a := range p.ahList() {
			leaked = append(leaked, fmt.Sprintf("AH %d", a.handle))
			errs = append(errs, a.Close())
		}
		for _, m := range p.mrList() {
			leaked = append(leaked, fmt.Sprintf("MR lkey %#x", uint32(m.lkey)))
			errs = append(errs, m.Close())
		}
		leaked = append(leaked, fmt.Sprintf("PD %d", p.handle))
		errs = append(errs, p.Close())
	}
	for _, ch := range chs {
		leaked = append(leaked, "CompChannel")
		errs = append(errs, ch.Close())
	}

	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	errs = append(errs, c.drv.Close())
	c.stopAsync()
	errs = append(errs, c.async.Close())
	<-c.asyncDone
	errs = append(errs, c.file.Close())
	untrack(c)
	if len(leaked) > 0 {
		errs = append(errs, fmt.Errorf("%w on %s: %s", ErrLeak, c.dev.Name, strings.Join(leaked, ", ")))
	}
	return errors.Join(errs...)
}

// ---- queries -------------------------------------------------------------------

// DeviceAttr are a device's capabilities (QUERY_DEVICE).
type DeviceAttr struct {
	FWVer           uint64
	NodeGUID        uint64 // as printed by ibv_devinfo (host order of the big-endian GUID)
	SysImageGUID    uint64
	MaxMRSize       uint64
	PageSizeCap     uint64
	VendorID        uint32
	VendorPartID    uint32
	HWVer           uint32
	MaxQP           uint32
	MaxQPWR         uint32
	DeviceCapFlags  uint32
	MaxSGE          uint32
	MaxSGERd        uint32
	MaxCQ           uint32
	MaxCQE          uint32
	MaxMR           uint32
	MaxPD           uint32
	MaxQPRdAtom     uint32
	MaxQPInitRdAtom uint32
	AtomicCap       uint32 // 0 none, 1 HCA, 2 global
	MaxSRQ          uint32
	MaxSRQWR        uint32
	MaxSRQSGE       uint32
	MaxPKeys        uint16
	LocalCAAckDelay uint8
	PhysPortCnt     uint8
}

// QueryDevice returns the device attributes.
func (c *Context) QueryDevice() (DeviceAttr, error) {
	req := uapi.QueryDevice{}
	var r uapi.QueryDeviceResp
	if err := c.file.Write(uapi.CmdQueryDevice, ucmd.Bytes(&req), nil, ucmd.Bytes(&r), nil); err != nil {
		return DeviceAttr{}, opErr("query_device", c.dev.Name, err)
	}
	return deviceAttr(&r), nil
}

func deviceAttr(r *uapi.QueryDeviceResp) DeviceAttr {
	be := func(v uint64) uint64 {
		var b [8]byte
		le.PutUint64(b[:], v)
		return binary.BigEndian.Uint64(b[:])
	}
	return DeviceAttr{
		FWVer: r.FWVer, NodeGUID: be(r.NodeGUID), SysImageGUID: be(r.SysImageGUID),
		MaxMRSize: r.MaxMRSize, PageSizeCap: r.PageSizeCap, VendorID: r.VendorID,
		VendorPartID: r.VendorPartID, HWVer: r.HWVer, MaxQP: r.MaxQP, MaxQPWR: r.MaxQPWR,
		DeviceCapFlags: r.DeviceCapFlags, MaxSGE: r.MaxSGE, MaxSGERd: r.MaxSGERd,
		MaxCQ: r.MaxCQ, MaxCQE: r.MaxCQE, MaxMR: r.MaxMR, MaxPD: r.MaxPD,
		MaxQPRdAtom: r.MaxQPRdAtom, MaxQPInitRdAtom: r.MaxQPInitRdAtom, AtomicCap: r.AtomicCap,
		MaxSRQ: r.MaxSRQ, MaxSRQWR: r.MaxSRQWR, MaxSRQSGE: r.MaxSRQSGE, MaxPKeys: r.MaxPKeys,
		LocalCAAckDelay: r.LocalCAAckDelay, PhysPortCnt: r.PhysPortCnt,
	}
}

// DeviceAttrEx adds the extended attributes of EX_QUERY_DEVICE.
type DeviceAttrEx struct {
	DeviceAttr
	CapFlagsEx     uint64 // full 64-bit device capability flags
	CoreClockKHz   uint64 // 0 when the device has no timestamp clock
	TimestampMask  uint64
	ODPGeneralCaps uint64
	MaxDMSize      uint64
}

// QueryDeviceEx returns the device attributes through the extended command
// (EX_QUERY_DEVICE, no driver data).
func (c *Context) QueryDeviceEx() (DeviceAttrEx, error) {
	req := uapi.ExQueryDevice{}
	var r uapi.ExQueryDeviceResp
	if err := c.file.WriteEx(uapi.CmdExQueryDevice, ucmd.Bytes(&req), nil, ucmd.Bytes(&r), nil); err != nil {
		return DeviceAttrEx{}, opErr("ex_query_device", c.dev.Name, err)
	}
	return DeviceAttrEx{
		DeviceAttr: deviceAttr(&r.Base), CapFlagsEx: r.DeviceCapFlagsEx, CoreClockKHz: r.HCACoreClock,
		TimestampMask: r.TimestampMask, ODPGeneralCaps: r.ODPGeneralCaps, MaxDMSize: r.MaxDMSize,
	}, nil
}

// LinkLayer of a port.
type LinkLayer uint8

// Link layers.
const (
	LinkLayerUnspecified LinkLayer = 0
	LinkLayerInfiniBand  LinkLayer = 1
	LinkLayerEthernet    LinkLayer = 2
)

// PortAttr are a port's attributes (QUERY_PORT).
type PortAttr struct {
	State        PortState
	MaxMTU       MTU
	ActiveMTU    MTU
	GIDTblLen    uint32
	PortCapFlags uint32
	MaxMsgSize   uint32
	PKeyTblLen   uint16
	LID          uint16
	SMLID        uint16
	LinkLayer    LinkLayer
	ActiveWidth  uint8
	ActiveSpeed  uint8
	PhysState    uint8
}

// QueryPort returns the attributes of port (1-based).
func (c *Context) QueryPort(port uint8) (PortAttr, error) {
	req := uapi.QueryPort{PortNum: port}
	var r uapi.QueryPortResp
	if err := c.file.Write(uapi.CmdQueryPort, ucmd.Bytes(&req), nil, ucmd.Bytes(&r), nil); err != nil {
		return PortAttr{}, opErr(fmt.Sprintf("query_port(%d)", port), c.dev.Name, err)
	}
	return PortAttr{
		State: PortState(r.State), MaxMTU: MTU(r.MaxMTU), ActiveMTU: MTU(r.ActiveMTU),
		GIDTblLen: r.GIDTblLen, PortCapFlags: r.PortCapFlags, MaxMsgSize: r.MaxMsgSz,
		PKeyTblLen: r.PKeyTblLen, LID: r.LID, SMLID: r.SMLID, LinkLayer: LinkLayer(r.LinkLayer),
		ActiveWidth: r.ActiveWidth, ActiveSpeed: r.ActiveSpeed, PhysState: r.PhysState,
	}, nil
}

// maxGIDEntries bounds QueryGIDTable's reply to what the command arena holds.
const maxGIDEntries = 1024

// QueryGIDTable returns every valid GID entry of every port (ioctl
// QUERY_GID_TABLE; holes are skipped by the kernel).
func (c *Context) QueryGIDTable() ([]GIDEntry, error) {
	var out []GIDEntry
	esz := len(ucmd.Bytes(&uapi.GIDEntry{}))
	err := c.ioctls.run(uapi.ObjectDevice, uapi.MethodQueryGIDTable, func() error {
		return c.file.Ioctl(uapi.ObjectDevice, uapi.MethodQueryGIDTable, func(b *ucmd.Builder) {
			b.Const(uapi.AttrQueryGIDTableEntrySize, uint64(esz), uapi.AttrFMandatory)
			b.Out(uapi.AttrQueryGIDTableRespEntries, maxGIDEntries*esz, uapi.AttrFMandatory)
			b.Out(uapi.AttrQueryGIDTableRespNumEntries, 8, uapi.AttrFMandatory)
		}, func(b *ucmd.Builder) {
			ents := b.Output(1)
			n := int(le.Uint64(b.Output(2)))
			for i := 0; i < n && (i+1)*esz <= len(ents); i++ {
				e := ents[i*esz:]
				var g GID
				copy(g[:], e[:16])
				out = append(out, GIDEntry{
					GID: g, Index: int(le.Uint32(e[16:])), Port: int(le.Uint32(e[20:])),
					Type: GIDType(le.Uint32(e[24:])), Ifindex: int(le.Uint32(e[28:])),
				})
			}
		})
	})
	if err != nil {
		return nil, opErr("query_gid_table", c.dev.Name, err)
	}
	for i := range out {
		if out[i].Ifindex != 0 {
			if ifc, err := net.InterfaceByIndex(out[i].Ifindex); err == nil {
				out[i].Netdev = ifc.Name
			}
		}
	}
	return out, nil
}

// FindRoCEv2GID returns the RoCE v2 GID entry of port whose GID is addr
// (IPv4-mapped for IPv4), selected by value via QUERY_GID_TABLE, falling back
// to sysfs when the ioctl is not available.
func (c *Context) FindRoCEv2GID(port int, addr netip.Addr) (GIDEntry, error) {
	ents, err := c.QueryGIDTable()
	if err != nil {
		if ents, err = c.dev.GIDs(port); err != nil {
			return GIDEntry{}, err
		}
	}
	var onPort []GIDEntry
	for _, e := range ents {
		if e.Port == port {
			onPort = append(onPort, e)
		}
	}
	e, err := FindGID(onPort, addr, GIDTypeRoCEv2)
	if err != nil {
		return GIDEntry{}, fmt.Errorf("uverbs: %s port %d: %w", c.dev.Name, port, err)
	}
	return e, nil
}

// ---- async events ----------------------------------------------------------------

// AsyncEventType is an asynchronous event type (IB_EVENT_*).
type AsyncEventType uint32

// Async event types.
const (
	EventCQErr            AsyncEventType = 0  // CQ_ERR
	EventQPFatal          AsyncEventType = 1  // QP_FATAL
	EventQPReqErr         AsyncEventType = 2  // QP_REQ_ERR
	EventQPAccessErr      AsyncEventType = 3  // QP_ACCESS_ERR
	EventCommEst          AsyncEventType = 4  // COMM_EST
	EventSQDrained        AsyncEventType = 5  // SQ_DRAINED
	EventPathMig          AsyncEventType = 6  // PATH_MIG
	EventPathMigErr       AsyncEventType = 7  // PATH_MIG_ERR
	EventDeviceFatal      AsyncEventType = 8  // DEVICE_FATAL
	EventPortActive       AsyncEventType = 9  // PORT_ACTIVE
	EventPortErr          AsyncEventType = 10 // PORT_ERR
	EventLIDChange        AsyncEventType = 11 // LID_CHANGE
	EventPKeyChange       AsyncEventType = 12 // PKEY_CHANGE
	EventSMChange         AsyncEventType = 13 // SM_CHANGE
	EventSRQErr           AsyncEventType = 14 // SRQ_ERR
	EventSRQLimitReached  AsyncEventType = 15 // SRQ_LIMIT_REACHED
	EventQPLastWQEReached AsyncEventType = 16 // QP_LAST_WQE_REACHED
	EventClientReregister AsyncEventType = 17 // CLIENT_REREGISTER
	EventGIDChange        AsyncEventType = 18 // GID_CHANGE
	EventWQFatal          AsyncEventType = 19 // WQ_FATAL
)

// AsyncEvent is an asynchronous event of the device, a port, a QP or a CQ.
type AsyncEvent struct {
	Type AsyncEventType
	Port int // port events
	QP   *QP // QP events (nil if the QP is already closed)
	CQ   *CQ // CQ events
}

func (e AsyncEvent) String() string {
	switch {
	case e.QP != nil:
		return fmt.Sprintf("%s on QP %#x", e.Type, uint32(e.QP.qpn))
	case e.CQ != nil:
		return fmt.Sprintf("%s on CQ %d", e.Type, e.CQ.handle)
	case e.Port != 0:
		return fmt.Sprintf("%s on port %d", e.Type, e.Port)
	}
	return e.Type.String()
}

// Events delivers the context's async events. The channel is closed by
// Close, or when the event file fails (the device was removed). Events
// arriving while it is full are dropped (see DroppedEvents).
func (c *Context) Events() <-chan AsyncEvent { return c.events }

// DroppedEvents counts async events dropped because Events was full.
func (c *Context) DroppedEvents() uint64 { return c.dropped.Load() }

func isQPEvent(t AsyncEventType) bool {
	switch t {
	case EventQPFatal, EventQPReqErr, EventQPAccessErr, EventCommEst, EventSQDrained,
		EventPathMig, EventPathMigErr, EventQPLastWQEReached:
		return true
	}
	return false
}

func (c *Context) readAsync(ctx context.Context) {
	defer close(c.asyncDone)
	defer close(c.events)
	var buf [16]byte
	for {
		n, err := c.async.Read(ctx, buf[:])
		if err != nil {
			return // closed, cancelled, or the device is gone (EIO)
		}
		if n < 16 {
			continue
		}
		elem := le.Uint64(buf[0:])
		ev := AsyncEvent{Type: AsyncEventType(le.Uint32(buf[8:]))}
		c.mu.Lock()
		switch {
		case isQPEvent(ev.Type):
			ev.QP = c.qps[elem]
			if ev.QP != nil && (ev.Type == EventQPFatal || ev.Type == EventQPReqErr || ev.Type == EventQPAccessErr) {
				ev.QP.state.Store(uint32(QPStateErr))
			}
		case ev.Type == EventCQErr:
			ev.CQ = c.cqs[elem]
		case ev.Type == EventDeviceFatal:
		default:
			ev.Port = int(elem)
		}
		c.mu.Unlock()
		select {
		case c.events <- ev:
		default:
			c.dropped.Add(1)
		}
	}
}
