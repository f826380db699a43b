package shm

import (
	"sync/atomic"

	"github.com/rdmago/te/internal/dma"
)

// maxSlots bounds the regions one target shares at once.
const maxSlots = 4096

// ctlPage is the per-connection control page, shared by target and
// initiator. The target writes gen, the initiator busy.
type ctlPage struct {
	magic uint64
	// closing is set by the target before it fences a closing
	// transport's connections: a copy that finds its generation gone
	// then fails as the target going away, not as revoked memory.
	closing atomic.Uint32
	_       [52]byte
	// gen[s] is the generation of the region in slot s while it is live,
	// 0 once it is unregistered.
	gen [maxSlots]atomic.Uint32
	// busy[s] counts the initiator's copies in progress on slot s.
	busy [maxSlots]atomic.Int32
}

const ctlMagic uint64 = 0x7465_7368_6374_6c31 // "teshctl1"

var ctlSize = dma.RoundPage(64 + 8*maxSlots)

func viewCtl(b []byte) *ctlPage { return dma.View[ctlPage](b, 0) }
