package mlx5

import (
	"errors"
	"sync"

	"github.com/rdmago/te/internal/dma"
)

// Doorbell records are 8-byte words the HCA reads (QP producer counters,
// CQ consumer index) and the kernel pins by page. Each gets its own
// 64-byte cache line of a shared page, so records of different queues are
// never written through the same line.
const dbSlot = 64

// dbPool hands out doorbell-record slots from mmap'd pages.
type dbPool struct {
	mu    sync.Mutex
	pages []*dma.Region
	free  [][]byte
}

// get returns a zeroed 8-byte slot.
func (p *dbPool) get() ([]byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.free) == 0 {
		r, err := dma.Alloc(dma.PageSize)
		if err != nil {
			return nil, err
		}
		p.pages = append(p.pages, r)
		b := r.Bytes()
		for off := len(b) - dbSlot; off >= 0; off -= dbSlot {
			p.free = append(p.free, b[off:off+8:off+8])
		}
	}
	s := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	clear(s)
	return s, nil
}

func (p *dbPool) put(s []byte) {
	if s == nil {
		return
	}
	p.mu.Lock()
	p.free = append(p.free, s)
	p.mu.Unlock()
}

func (p *dbPool) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, r := range p.pages {
		errs = append(errs, r.Unmap())
	}
	p.pages, p.free = nil, nil
	return errors.Join(errs...)
}
