package mlx5

import (
	"encoding/binary"
	"fmt"

	abi "github.com/rdmago/te/internal/mlx5"
	"github.com/rdmago/te/internal/uapi"
	"github.com/rdmago/te/internal/ucmd"
)

// dynUAR is a UAR page allocated with MLX5_IB_METHOD_UAR_OBJ_ALLOC: a
// kernel object (handle), the page index CQ/QP creation refers to, and its
// mapping.
type dynUAR struct {
	handle uint32
	pageID uint32
	bf     bool // BlueFlame (write-combining) page
	page   []byte
}

// allocUAR allocates and maps one dynamic UAR page of the given type.
func (c *Context) allocUAR(typ uint64) (*dynUAR, error) {
	var (
		u                            = &dynUAR{bf: typ == abi.UARAllocTypeBF}
		off                          uint64
		length                       uint32
		iHandle, iOff, iLen, iPageID int
	)
	err := c.k.Ioctl(abi.ObjectUAR, abi.MethodUARObjAlloc, func(b *ucmd.Builder) {
		iHandle = b.NewIDR(abi.AttrUARAllocHandle, uapi.AttrFMandatory)
		b.Const(abi.AttrUARAllocType, typ, uapi.AttrFMandatory)
		iOff = b.Out(abi.AttrUARAllocMmapOff, 8, uapi.AttrFMandatory)
		iLen = b.Out(abi.AttrUARAllocMmapLen, 4, uapi.AttrFMandatory)
		iPageID = b.Out(abi.AttrUARAllocPageID, 4, uapi.AttrFMandatory)
	}, func(b *ucmd.Builder) {
		u.handle = uint32(b.Data(iHandle))
		off = binary.LittleEndian.Uint64(b.Output(iOff))
		length = binary.LittleEndian.Uint32(b.Output(iLen))
		u.pageID = binary.LittleEndian.Uint32(b.Output(iPageID))
	})
	if err != nil {
		return nil, fmt.Errorf("mlx5: allocate a dynamic UAR (type %d): %w", typ, err)
	}
	if int(length) != abi.PageSize {
		c.destroyUAR(u.handle)
		return nil, fmt.Errorf("mlx5: dynamic UAR of %d bytes, want one page: %w", length, ErrNotSupported)
	}
	if u.page, err = abi.MapUAR(c.fd, int64(off), abi.PageSize); err != nil {
		c.destroyUAR(u.handle)
		return nil, err
	}
	return u, nil
}

func (c *Context) destroyUAR(h uint32) error {
	err := c.k.Ioctl(abi.ObjectUAR, abi.MethodUARObjDestroy, func(b *ucmd.Builder) {
		b.IDR(abi.AttrUARDestroyHandle, h, uapi.AttrFMandatory)
	}, nil)
	if err != nil {
		return fmt.Errorf("mlx5: destroy dynamic UAR %d: %w", h, err)
	}
	return nil
}

// freeUAR unmaps the page and destroys the kernel object, once nothing
// that rings through it exists any more.
func (c *Context) freeUAR(u *dynUAR) error {
	err := abi.Unmap(u.page)
	u.page = nil
	if e := c.destroyUAR(u.handle); err == nil {
		err = e
	}
	return err
}

// bfreg returns the page's first doorbell register, dedicated to one QP:
// no lock; BlueFlame halves on a BlueFlame page.
func (u *dynUAR) bfreg(bfRegSize uint32) *bfreg {
	r := &bfreg{index: u.pageID}
	r.reg[0] = word64(u.page, bfOffset)
	r.reg[1] = r.reg[0]
	if u.bf && bfRegSize > 0 {
		r.bfHalf = bfRegSize / 2
		r.reg[1] = word64(u.page, bfOffset+int(r.bfHalf))
	}
	return r
}
