package engine

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rdmago/te/engine/driver"
)

// Notification is a notification as its target receives it: sent by a
// remote segment with SubmitNotify (after the data of that submission) or
// Notify (alone).
type Notification struct {
	// From and FromEpoch name the sender's incarnation, as its
	// transport's handshake established it (authenticated when the
	// transports have a cluster secret).
	From      string
	FromEpoch uint64
	// Name and Msg are what the sender passed.
	Name string
	Msg  []byte
	// Bytes is the byte count of the sender's submission: every one of
	// them had landed in this segment's memory (for WRITEs) before the
	// notification was queued. 0 for a notification sent alone.
	Bytes uint64
}

// Queue bounds, Config.NotifyQueue and Config.NotifyQueuePerSender.
const (
	DefaultNotifyQueue          = 4096
	DefaultNotifyQueuePerSender = 1024
)

// Per sender, the inbox remembers accepted IDs (to drop a resent copy)
// in a table of recentIDs slots indexed by the ID, and this many replaced
// epochs (to drop a restarted sender's late notes). A sender's IDs grow,
// so an ID is forgotten only once one at least recentIDs later has been
// accepted from it: a lookup and a store per note, not a map's insert and
// delete.
const (
	recentIDs    = 2048
	retiredEpoch = 4
	maxSenders   = 1024
)

// NotifyStats counts what the inbox did with arrived notifications.
type NotifyStats struct {
	// Queued is how many wait to be received now.
	Queued int
	// Accepted counts notifications queued since New.
	Accepted uint64
	// Duplicates counts second copies dropped (a note resent after a
	// connection broke, which had arrived after all).
	Duplicates uint64
	// Stale counts notes dropped because their sender had restarted.
	Stale uint64
	// Full counts notes refused because the queue stayed full.
	Full uint64
}

// inbox is the target's queue of notifications: a ring bounded in total
// and per sender, fed by transports (driver.Inbox) and drained by the
// application (Notifications, DrainNotifications).
type inbox struct {
	mu      sync.Mutex
	ring    []Notification
	head, n int
	per     int
	senders map[string]*sender
	// room is closed (and cleared) when an entry leaves the ring while
	// a Deliver waits for room.
	room chan struct{}
	// avail wakes the pump.
	avail  chan struct{}
	closed bool
	done   <-chan struct{} // engine closed

	pumpOnce sync.Once
	ch       chan Notification // Notifications' channel, once made
	// out is ch while the pump runs (under mu).
	out chan Notification
	// held: the pump has taken a notification from the ring and not yet
	// handed it to the channel; Deliver hands one straight to a waiting
	// receiver only while the ring is empty and nothing is held, so
	// order is kept.
	held bool
	// last caches the sender of the last Deliver (most come from one).
	last *sender
	// quiet: DeliverQuiet queued a notification that Wake has not yet
	// announced to the pump or a waiting receiver.
	quiet bool

	accepted, dups, stale, full atomic.Uint64
}

type sender struct {
	name    string
	epoch   uint64
	seq     uint64 // the latest connection of this epoch (driver.Sender.Seq)
	retired [retiredEpoch]uint64
	queued  int
	seen    []uint64 // accepted IDs, at ID % recentIDs (0: none)
	// note is the name of its last notification: a sender that reuses
	// one costs no allocation for it.
	note string
}

func (ib *inbox) init(total, per int, done <-chan struct{}) {
	ib.ring = make([]Notification, total)
	ib.per = per
	ib.senders = map[string]*sender{}
	ib.avail = make(chan struct{}, 1)
	ib.done = done
}

// Deliver implements driver.Inbox.
func (ib *inbox) Deliver(ctx context.Context, d *driver.Delivery) error {
	return ib.deliver(ctx, d, false)
}

// DeliverQuiet implements driver.QuietInbox: Deliver that queues d
// without waking a receiver (Wake does).
func (ib *inbox) DeliverQuiet(ctx context.Context, d *driver.Delivery) error {
	return ib.deliver(ctx, d, true)
}

// Wake implements driver.QuietInbox: a receiver waiting on the channel
// gets the oldest queued notification, the pump the rest.
func (ib *inbox) Wake() {
	ib.mu.Lock()
	if !ib.quiet {
		ib.mu.Unlock()
		return
	}
	ib.quiet = false
	if ib.n > 0 && !ib.held && ib.out != nil {
		// As Deliver's hand-over: nothing is ahead of the head.
		select {
		case ib.out <- ib.ring[ib.head]:
			ib.takeLocked()
		default:
		}
	}
	n := ib.n
	ib.mu.Unlock()
	if n > 0 {
		select {
		case ib.avail <- struct{}{}:
		default:
		}
	}
}

func (ib *inbox) deliver(ctx context.Context, d *driver.Delivery, quiet bool) error {
	if len(d.Name) > driver.MaxNotifyName || len(d.Msg) > driver.MaxNotifyMsg {
		return fmt.Errorf("%w: notification of %d+%d bytes exceeds %d+%d", ErrInvalidRequest, len(d.Name), len(d.Msg), driver.MaxNotifyName, driver.MaxNotifyMsg)
	}
	ib.mu.Lock()
	for {
		if ib.closed {
			ib.mu.Unlock()
			return ErrClosed
		}
		s := ib.senderLocked(d.From)
		if s == nil {
			ib.mu.Unlock()
			ib.stale.Add(1)
			return fmt.Errorf("%w: notification from %s epoch %#x, which has restarted since", ErrPeerReset, d.From.Name, d.From.Epoch)
		}
		slot := &s.seen[d.ID%recentIDs]
		if *slot == d.ID {
			ib.mu.Unlock()
			ib.dups.Add(1)
			return nil
		}
		if s.queued < ib.per && ib.n < len(ib.ring) {
			if string(d.Name) != s.note {
				s.note = string(d.Name)
			}
			m := Notification{
				From: s.name, FromEpoch: d.From.Epoch,
				Name: s.note, Msg: append([]byte(nil), d.Msg...), Bytes: d.Bytes,
			}
			*slot = d.ID
			if quiet {
				ib.ring[(ib.head+ib.n)%len(ib.ring)] = m
				ib.n++
				s.queued++
				ib.quiet = true
				ib.mu.Unlock()
				ib.accepted.Add(1)
				return nil
			}
			if ib.n == 0 && !ib.held && ib.out != nil {
				// The application waits on the channel: hand it
				// over here, not through the pump (a goroutine's
				// wake-up and hand-off less per notification).
				select {
				case ib.out <- m:
					ib.mu.Unlock()
					ib.accepted.Add(1)
					return nil
				default:
				}
			}
			ib.ring[(ib.head+ib.n)%len(ib.ring)] = m
			ib.n++
			s.queued++
			ib.quiet = false // announced with this one
			ib.mu.Unlock()
			ib.accepted.Add(1)
			select {
			case ib.avail <- struct{}{}:
			default:
			}
			return nil
		}
		qs, qn := s.queued, ib.n
		if ctx.Err() != nil {
			// A context done from the start asks not to wait.
			ib.mu.Unlock()
			return fmt.Errorf("%w: %d queued from %s (bound %d), %d in total (bound %d)", driver.ErrNotifyFull, qs, d.From.Name, ib.per, qn, len(ib.ring))
		}
		if ib.room == nil {
			ib.room = make(chan struct{})
		}
		room := ib.room
		announce := ib.quiet // room comes only as the application receives
		ib.quiet = false
		ib.mu.Unlock()
		if announce {
			select {
			case ib.avail <- struct{}{}:
			default:
			}
		}
		select {
		case <-room:
		case <-ib.done:
		case <-ctx.Done():
			ib.full.Add(1)
			return fmt.Errorf("%w: %d queued from %s (bound %d), %d in total (bound %d)", driver.ErrNotifyFull, qs, d.From.Name, ib.per, qn, len(ib.ring))
		}
		ib.mu.Lock()
	}
}

// senderLocked returns the state of from's incarnation, or nil when from
// is a replaced incarnation. A new incarnation replaces the old one: the
// old one's queued notes are dropped (its process is gone) and its late
// ones are refused.
func (ib *inbox) senderLocked(from driver.Sender) *sender {
	if s := ib.last; s != nil && s.epoch == from.Epoch && s.name == from.Name {
		s.seq = max(s.seq, from.Seq)
		return s
	}
	s := ib.senders[from.Name]
	if s == nil {
		if len(ib.senders) >= maxSenders {
			for name, o := range ib.senders {
				if o.queued == 0 {
					delete(ib.senders, name)
					if o == ib.last {
						ib.last = nil
					}
					break
				}
			}
		}
		s = &sender{name: from.Name, epoch: from.Epoch, seq: from.Seq, seen: make([]uint64, recentIDs)}
		ib.senders[from.Name] = s
		ib.last = s
		return s
	}
	if s.epoch == from.Epoch {
		s.seq = max(s.seq, from.Seq)
		ib.last = s
		return s
	}
	for _, r := range s.retired {
		if r == from.Epoch && r != 0 {
			return nil
		}
	}
	if from.Seq != 0 && from.Seq < s.seq {
		// A connection older than the current incarnation's: the old
		// incarnation's late note (the target delivered the new one's
		// first), not a newer restart.
		copy(s.retired[1:], s.retired[:])
		s.retired[0] = from.Epoch
		return nil
	}
	copy(s.retired[1:], s.retired[:])
	s.retired[0] = s.epoch
	s.epoch, s.seq = from.Epoch, from.Seq
	clear(s.seen)
	if s.queued > 0 {
		ib.purgeLocked(from.Name, s.retired[0])
		s.queued = 0
	}
	return s
}

// purgeLocked drops the queued notes of one sender incarnation.
func (ib *inbox) purgeLocked(name string, epoch uint64) {
	k := 0
	for i := 0; i < ib.n; i++ {
		m := ib.ring[(ib.head+i)%len(ib.ring)]
		if m.From == name && m.FromEpoch == epoch {
			ib.stale.Add(1)
			continue
		}
		ib.ring[(ib.head+k)%len(ib.ring)] = m
		k++
	}
	for i := k; i < ib.n; i++ {
		ib.ring[(ib.head+i)%len(ib.ring)] = Notification{}
	}
	ib.n = k
	ib.wakeLocked()
}

func (ib *inbox) wakeLocked() {
	if ib.room != nil {
		close(ib.room)
		ib.room = nil
	}
}

// takeLocked removes the oldest notification; ok is false when none.
func (ib *inbox) takeLocked() (Notification, bool) {
	if ib.n == 0 {
		return Notification{}, false
	}
	m := ib.ring[ib.head]
	ib.ring[ib.head] = Notification{}
	ib.head = (ib.head + 1) % len(ib.ring)
	ib.n--
	if s := ib.senders[m.From]; s != nil && s.epoch == m.FromEpoch && s.queued > 0 {
		s.queued--
	}
	ib.wakeLocked()
	return m, true
}

func (ib *inbox) drain(dst []Notification) []Notification {
	ib.mu.Lock()
	defer ib.mu.Unlock()
	return ib.drainLocked(dst)
}

// drainLocked appends every queued notification to dst.
func (ib *inbox) drainLocked(dst []Notification) []Notification {
	for {
		m, ok := ib.takeLocked()
		if !ok {
			return dst
		}
		dst = append(dst, m)
	}
}

// receive waits until a notification is queued, then appends every
// queued one to dst. Queued notifications are received after the engine
// closes; then it returns ErrClosed.
func (ib *inbox) receive(ctx context.Context, dst []Notification) ([]Notification, error) {
	ended := false
	for {
		k := len(dst)
		ib.mu.Lock()
		dst = ib.drainLocked(dst)
		ended = ended || ib.closed
		ib.mu.Unlock()
		switch {
		case len(dst) > k:
			return dst, nil
		case ended:
			return dst, ErrClosed
		}
		select {
		case <-ib.avail:
		case <-ib.done:
			ended = true // take what is queued, once more
		case <-ctx.Done():
			return dst, ctx.Err()
		}
	}
}

// channel starts the pump (once) and returns its channel.
func (ib *inbox) channel() <-chan Notification {
	ib.pumpOnce.Do(func() {
		out := make(chan Notification)
		ib.mu.Lock()
		ib.out = out
		ib.mu.Unlock()
		ib.ch = out
		go ib.pump(out)
	})
	return ib.ch
}

// pump moves notifications from the ring to the channel, one at a time,
// until the engine closes; then it closes the channel.
func (ib *inbox) pump(out chan Notification) {
	defer func() {
		ib.mu.Lock()
		ib.out = nil // Deliver no longer hands over
		ib.mu.Unlock()
		close(out)
	}()
	for {
		ib.mu.Lock()
		m, ok := ib.takeLocked()
		ib.held = ok
		ib.mu.Unlock()
		if !ok {
			select {
			case <-ib.avail:
				continue
			case <-ib.done:
				return
			}
		}
		select {
		case out <- m:
		case <-ib.done:
			return
		}
	}
}

func (ib *inbox) close() {
	ib.mu.Lock()
	ib.closed = true
	ib.wakeLocked()
	ib.mu.Unlock()
}

func (ib *inbox) stats() NotifyStats {
	ib.mu.Lock()
	q := ib.n
	ib.mu.Unlock()
	return NotifyStats{Queued: q, Accepted: ib.accepted.Load(), Duplicates: ib.dups.Load(), Stale: ib.stale.Load(), Full: ib.full.Load()}
}

// Notifications returns the channel on which this segment's notifications
// arrive, in the order they were queued; it is closed when the engine
// closes. Every call returns the same channel. Notifications wait in a
// queue bounded per sender (Config.NotifyQueuePerSender) and in total
// (Config.NotifyQueue) until received here or by DrainNotifications (use
// one or the other); while a sender's queue is full its further
// notifications wait on its connection (back-pressure: its transfers to
// this segment stall) and, past the transport's I/O timeout, fail at the
// sender with ErrNotifyFull. Notifications from a sender that has
// restarted (a new epoch under its name) replace its old ones: those still
// queued are dropped, and late ones refused.
func (e *Engine) Notifications() <-chan Notification { return e.inbox.channel() }

// DrainNotifications appends every queued notification to dst, oldest
// first, without waiting, and returns it.
func (e *Engine) DrainNotifications(dst []Notification) []Notification {
	return e.inbox.drain(dst)
}

// ReceiveNotifications waits until at least one notification is queued,
// then appends every queued one to dst, oldest first, and returns it: a
// receiver that cannot keep up with its senders takes each run of
// notifications in one wake-up, where Notifications' channel takes them
// one at a time. It returns ctx's error when ctx is done first, and
// ErrClosed once the engine has closed and nothing is left queued. Use
// it, DrainNotifications or Notifications, not several at once: each
// notification goes to one of them, whichever takes it first.
func (e *Engine) ReceiveNotifications(ctx context.Context, dst []Notification) ([]Notification, error) {
	return e.inbox.receive(ctx, dst)
}

// NotifyStats returns counts of what arrived notifications met.
func (e *Engine) NotifyStats() NotifyStats { return e.inbox.stats() }
