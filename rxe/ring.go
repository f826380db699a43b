package rxe

import (
	"fmt"

	"github.com/rdmago/te/internal/dma"
	"github.com/rdmago/te/internal/uapi"
)

// Offsets in struct rxe_queue_buf.
const (
	offLog2Elem = 0
	offMask     = 4
	offProducer = 128
	offConsumer = 256
	offData     = uapi.RxeQueueHeaderSize
)

// ring is a view of one mapped rxe queue. The kernel fixes its geometry at
// creation; we read it from the header and never compute it ourselves.
// Indices are stored masked; empty: prod == cons; full: prod+1 == cons (mod
// slots), so capacity is slots-1.
type ring struct {
	b     []byte
	mask  uint32
	shift uint32
	elem  int
}

func newRing(b []byte) (ring, error) {
	if len(b) < offData {
		return ring{}, fmt.Errorf("rxe: queue mapping of %d bytes is smaller than its header", len(b))
	}
	shift := dma.LoadAcquire32(b, offLog2Elem)
	mask := dma.LoadAcquire32(b, offMask)
	slots := uint64(mask) + 1
	if shift < 5 || shift > 20 || slots&(slots-1) != 0 || uint64(offData)+slots<<shift > uint64(len(b)) {
		return ring{}, fmt.Errorf("rxe: bad queue header: log2_elem_size %d index_mask %#x for %d mapped bytes", shift, mask, len(b))
	}
	return ring{b: b, mask: mask, shift: shift, elem: 1 << shift}, nil
}

func (r *ring) slot(i uint32) int { return offData + int(i&r.mask)<<r.shift }

func (r *ring) producer() uint32 { return dma.LoadAcquire32(r.b, offProducer) & r.mask }
func (r *ring) consumer() uint32 { return dma.LoadAcquire32(r.b, offConsumer) & r.mask }

func (r *ring) publishProducer(v uint32) { dma.StoreRelease32(r.b, offProducer, v&r.mask) }
func (r *ring) publishConsumer(v uint32) { dma.StoreRelease32(r.b, offConsumer, v&r.mask) }
