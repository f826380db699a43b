package shm

import (
	"sync/atomic"

	"github.com/rdmago/te/engine/driver"
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

const ctlMagic uint64 = 0x7465_7368_6374_6c33 // "teshctl3"

// The control memory is the page above followed by the note ring.
var (
	ringOff = dma.RoundPage(64 + 8*maxSlots)
	ringLen = dma.RoundPage(ringSize)
	ctlSize = ringOff + ringLen
)

func viewCtl(b []byte) *ctlPage { return dma.View[ctlPage](b, 0) }

// noteSlots is how many notifications one connection's ring holds: the
// notes an initiator may have handed to its target that the target's
// engine has not queued yet.
const noteSlots = 16

// ringSize is noteRing's size (TestRingLayout checks it).
const ringSize = 128 + noteSlots*noteSlotSize

const noteSlotSize = 32 + driver.MaxNotifyName + driver.MaxNotifyMsg

// noteRing carries an initiator's notifications to its target in the
// control memory (notify.go): the initiator writes a slot and then head,
// the target reads head and then the slot, and frees it by advancing
// tail. sleep and want save both sides a system call per note: the
// initiator wakes the target's reader (a futex wake on sleep, or BELL on
// the socket) only when the reader is about to sleep, and the target
// says ROOM only when the initiator has notes waiting for a slot. The
// initiator writes head, want and the slots, the target tail and sleep
// (the initiator only clears it); each side reads the other's as
// untrusted.
type noteRing struct {
	head atomic.Uint64
	// sleep: how the target's reader sleeps (sleepSocket, sleepFutex),
	// or 0 while it watches the ring. A publisher that clears it wakes
	// the reader that way. It shares head's cache line, which the
	// publisher has just written when it reads sleep and the target's
	// reader reads while it watches the ring.
	sleep atomic.Uint32
	_     [52]byte
	tail  atomic.Uint64
	// want: notes wait at the initiator for a slot; the target that
	// clears it sends ROOM. It shares tail's line, which the target has
	// just written when it reads want.
	want  atomic.Uint32
	_     [52]byte
	slots [noteSlots]noteSlot
}

// noteSlot is one notification in the ring: its note ID, the
// submission's byte count, the name and the message (data holds name
// then message).
type noteSlot struct {
	id, bytes       uint64
	nameLen, msgLen uint32
	_               [8]byte
	data            [driver.MaxNotifyName + driver.MaxNotifyMsg]byte
}

func viewRing(b []byte, off int) *noteRing { return dma.View[noteRing](b, off) }

// The reader's ways of sleeping (noteRing.sleep).
const (
	// sleepSocket: the reader blocks on the socket; a publisher sends
	// BELL.
	sleepSocket = 1
	// sleepFutex: the reader blocks on a futex on sleep itself, for a
	// while after a note; a publisher wakes it with one system call,
	// no message and no goroutine on either side.
	sleepFutex = 2
)

// clearSleep clears the reader's sleep and returns how it slept (0: it
// was awake, or another publisher woke it). The target may write any
// value: one it cannot be waking from gets BELL, which every reader
// answers.
func (r *noteRing) clearSleep() uint32 {
	for range 4 {
		s := r.sleep.Load()
		if s == 0 {
			return 0
		}
		if r.sleep.CompareAndSwap(s, 0) {
			if s != sleepFutex {
				return sleepSocket
			}
			return s
		}
	}
	return sleepSocket
}
