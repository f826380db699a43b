package rxe

import (
	"fmt"

	"github.com/rdmago/te/internal/uapi"
	"github.com/rdmago/te/internal/ucmd"
	"github.com/rdmago/te/uverbs"
)

// ah is an rxe address handle: kernels since 5.11 return an AH number that
// UD send WQEs carry instead of a full address vector.
type ah struct {
	num uint32
}

func (c *rxeContext) NewAH(uverbs.AddressVector) (uverbs.DriverAH, error) { return &ah{}, nil }

func (a *ah) Request() ([]byte, int) { return nil, len(ucmd.Bytes(&uapi.RxeCreateAHResp{})) }

func (a *ah) Created(_ uverbs.Handle, out []byte) error {
	var r uapi.RxeCreateAHResp
	copy(ucmd.Bytes(&r), out)
	if r.AHNum == 0 {
		// Pre-5.11 kernels want the whole AV in every WQE; not supported.
		return fmt.Errorf("rxe: kernel returned no AH number: %w", uverbs.ErrNotSupported)
	}
	a.num = r.AHNum
	return nil
}

func (a *ah) Destroyed() error { return nil }

var _ uverbs.AHCreator = (*rxeContext)(nil)
