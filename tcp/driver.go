package tcp

import (
	"context"

	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/segment"
)

// Driver returns the transport as the engine drives it: its
// implementation of the transport contract (package engine/driver).
// engine.Install calls it; programs have no need to. The contract's
// methods (Install, Connect, Submit, RegisterMemory, Close...) live on
// that value, not on Transport, so Transport's own methods are the ones a
// program uses: New and inspection.
func (t *Transport) Driver() driver.Transport { return drv{t} }

// drv is a Transport behind the driver contract. Holding one pointer, it
// fits in an interface without allocating.
type drv struct{ t *Transport }

var (
	_ driver.Transport = drv{}
	_ driver.Notifier  = drv{}
	_ driver.Helper    = drv{}
)

func (d drv) Name() string                         { return segment.ProtoTCP }
func (d drv) Install(h driver.Host) error          { return d.t.install(h) }
func (d drv) Describe(s *segment.Descriptor) error { return d.t.describe(s) }
func (d drv) RegisterMemory(r driver.Region) (any, error) {
	return d.t.registerMemory(r)
}
func (d drv) UnregisterMemory(r driver.Region, key any) error {
	return d.t.unregisterMemory(r, key)
}
func (d drv) Connect(ctx context.Context, remote *segment.Descriptor) (driver.Peer, error) {
	return d.t.connect(ctx, remote)
}
func (d drv) SliceSize() uint64         { return d.t.sliceSize() }
func (d drv) Submit(ss []*driver.Slice) { d.t.submitSlices(ss) }
func (d drv) SubmitNotify(ss []*driver.Slice, n *driver.Note) {
	d.t.submitNotify(ss, n)
}
func (d drv) Close() error { return d.t.shutdown() }

// Help reads the replies of idle lanes for a caller of Wait (driver.Helper).
func (d drv) Help(ctx context.Context, done func() bool) { d.t.help(ctx, done) }

// Inspect describes the lanes (driver.Inspector).
func (d drv) Inspect() driver.TransportState { return d.t.inspect() }
