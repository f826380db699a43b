package driver

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/rdmago/te/segment"
)

// Notifications: a submission may carry a notification (a name and an
// opaque message) that the target's engine receives only after every
// slice of that submission has landed in its memory. A transport carries
// them by implementing Notifier (initiator side) and handing what arrives
// to Host.Inbox (target side). The engine detects Notifier at Install; a
// submission with a notification over a transport without it fails before
// anything moves (engine.ErrNotifyUnsupported), it is never dropped.

// Bounds of one notification, checked by the engine before a transport
// sees it; a transport may size its frames by them and refuse more.
const (
	MaxNotifyName = 256
	MaxNotifyMsg  = 4096
)

// Notifier is implemented by a transport that carries notifications in
// order after the data of their submission.
//
// SubmitNotify starts ss exactly as Submit does, followed by n. All of ss
// go to n.Peer; ss may be empty (a notification alone, or a resend, see
// below). The transport must hand n to the target's Inbox only after
// every slice of ss has been applied to the target's memory, and never
// when one of them failed there or was not sent (Slice.Canceled). It
// calls n.Done exactly once, after every slice of ss was Done (their
// retries aside): nil once the target has custody of n (its Inbox
// accepted n, or the target's transport holds n and hands it to the
// Inbox as soon as there is room, dropping it only when n's sender
// incarnation has been replaced or the target closes); an error wrapping
// ErrTransient when it cannot tell whether the target got it (a
// connection broke); any other error when the target did not take it
// (ErrNotifyFull, ErrPeerReset, ErrCanceled, a slice failed at the
// target). A transport whose target holds notes bounds how many per
// sender connection; a note beyond waits at the initiator and, past the
// transport's bound, fails with ErrNotifyFull without being sent.
//
// After a transient n.Done, the engine waits until every slice of ss has
// finished: if all succeeded (on retries) it calls SubmitNotify(nil, n)
// again with n.Attempt() > 0, which the transport delivers at once: the
// data is known to be in place. The target's Inbox drops a second copy
// of a note it already accepted (same sender incarnation and Note.ID),
// so a transport may deliver on both paths. If a slice failed or was
// cancelled, n is not sent again and no notification is delivered.
//
// SubmitNotify follows Submit's rules on re-entry: it may be called from
// inside Slice.Done or Note.Done and must then only enqueue.
type Notifier interface {
	SubmitNotify(ss []*Slice, n *Note)
}

// Note is a notification on its way to a target: the initiator's side of
// it, handed to Notifier.SubmitNotify. Transports read its fields and call
// Done exactly once; they must not keep the pointer after Done.
type Note struct {
	// ID is unique per initiator incarnation (engine epoch); the target
	// drops a note whose ID from the same sender incarnation it has
	// already accepted.
	ID uint64
	// Name and Msg are the user's; Msg belongs to the engine and stays
	// unchanged until Done. len(Name) <= MaxNotifyName, len(Msg) <=
	// MaxNotifyMsg.
	Name string
	Msg  []byte
	// Bytes is the submission's byte count: the sum of its slices'
	// lengths (0 for a notification alone).
	Bytes uint64
	// Remote is the target's descriptor; Peer what Connect returned for
	// it. Read-only.
	Remote *segment.Descriptor
	Peer   Peer

	c       NoteCompleter
	attempt int
}

// NoteCompleter is the engine's side of a Note. Transports do not
// implement it.
type NoteCompleter interface {
	CompleteNote(err error)
}

// Bind readies n for a submission whose outcome goes to c. Only the engine
// calls it.
func (n *Note) Bind(c NoteCompleter, attempt int) {
	n.c = c
	n.attempt = attempt
}

// Attempt is 0 for the note sent behind its data and counts resends (sent
// alone, once the data has completed).
func (n *Note) Attempt() int { return n.attempt }

// Canceled reports whether the note's submission was cancelled
// (engine.Cancel): a transport that has not sent the note yet completes it
// with ErrCanceled instead.
func (n *Note) Canceled() bool {
	c, ok := n.c.(canceler)
	return ok && c.Canceled()
}

// Done completes the note. Calling it twice for one submission panics.
func (n *Note) Done(err error) {
	c := n.c
	if c == nil {
		panic("engine: Note.Done called twice")
	}
	n.c = nil
	c.CompleteNote(err)
}

// DoneAllNote is DoneAll(ss) followed by n.Done(nil), for a transport
// that has delivered n after every slice of its submission moved in full
// (ss, the last of them or all of them, with n's slices of no other
// batch in between): the engine counts the slices and the note together,
// one atomic operation fewer per notified submission than the two calls.
// The rules of DoneAll and Done apply (either completed already panics).
func DoneAllNote(ss []*Slice, n *Note) {
	c := n.c
	if c == nil {
		panic("engine: Note.Done called twice")
	}
	if nc, ok := c.(noteAllCompleter); ok && len(ss) > 0 {
		if _, ok := ss[0].c.(batchCompleter); ok {
			n.c = nil
			nc.CompleteAllNote(ss)
			return
		}
	}
	DoneAll(ss)
	n.Done(nil)
}

// noteAllCompleter is implemented by the engine's notes: it completes the
// slices bound to its completers (as batchCompleter's CompleteAll) and
// the note's sending as a success, counted in one step.
type noteAllCompleter interface {
	CompleteAllNote(ss []*Slice)
}

// canceler is implemented by the engine's completers.
type canceler interface{ Canceled() bool }

// Canceled reports whether the slice's submission was cancelled
// (engine.Cancel). A transport that has not started the slice yet may
// complete it with an error wrapping ErrCanceled instead of moving it;
// one already on the wire finishes. It reads the flag BindCanceled gave
// (a slice bound without one is never cancelled), and is small enough to
// inline into a transport's per-slice loop.
func (s *Slice) Canceled() bool {
	f := s.canceled
	return f != nil && f.Load() && s.c != nil
}

// Sender is a notification's sender as the transport's handshake
// established it: the initiator's segment name and epoch (proved with the
// cluster secret when authentication is on; a transport must not deliver
// notifications from a connection whose handshake did not succeed).
type Sender struct {
	Name  string
	Epoch uint64
	// Seq orders the connections this process's targets handshook
	// (NextSeq, taken when the handshake succeeded; 0: unknown). Epochs
	// are random, so it is Seq that tells a restarted sender's new
	// connection from its old one, whose notes the target may still be
	// delivering after the new one's first.
	Seq uint64
}

var seq atomic.Uint64

// NextSeq numbers a successful handshake for Sender.Seq: a connection
// handshaken later gets a larger number.
func NextSeq() uint64 { return seq.Add(1) }

// Delivery is a notification arrived at the target, as a transport hands
// it to Inbox.Deliver.
type Delivery struct {
	From  Sender
	ID    uint64 // Note.ID
	Name  []byte
	Msg   []byte
	Bytes uint64
}

// Inbox is the target's engine as a Notifier's target side sees it
// (Host.Inbox).
type Inbox interface {
	// Deliver queues d for the application. It copies what it keeps, so
	// the transport may reuse d's buffers when it returns. It waits for
	// room while the sender's queue (or the total) is full, until ctx
	// ends: then it fails with ErrNotifyFull, and the transport reports
	// that to the initiator (back-pressure: the sender's lane stalls
	// meanwhile, nothing grows). It returns nil, without queueing again,
	// for a note it already accepted (same sender incarnation and ID);
	// it drops a note from a sender incarnation that has been replaced by
	// a newer one and fails with ErrPeerReset. It does not block on
	// anything but room in the queue. With a ctx already done it does
	// not wait at all: a transport may try so first, and wait (having
	// flushed whatever it holds for the sender) only when that fails.
	Deliver(ctx context.Context, d *Delivery) error
}

// QuietInbox is implemented by an Inbox that can queue a notification
// without waking the application's receiver yet. Waking a goroutine that
// waits for notifications makes the runtime start a thread for it when a
// processor is idle; a transport that answers the initiator after
// delivering delays the answer by that wake-up. Such a transport delivers
// quietly, answers, and then calls Wake, before it waits for anything
// else (so a note's wake-up waits at most for the answer's write).
// DrainNotifications sees quietly queued notes at once.
type QuietInbox interface {
	Inbox
	// DeliverQuiet is Deliver, except that the notification, once
	// queued, is not announced to a receiver waiting on the channel
	// until Wake.
	DeliverQuiet(ctx context.Context, d *Delivery) error
	// Wake announces what DeliverQuiet queued; it never blocks.
	Wake()
}

// NotifyReceiver is implemented by a metadata store whose socket also
// carries notifications (Mooncake's handshake socket has a Notify
// message): the engine hands it its Inbox when it starts. After the
// engine closes, Deliver fails; the store answers its peers accordingly.
type NotifyReceiver interface {
	ReceiveNotifications(Inbox)
}

// NoWait is a context that is already done: Inbox.Deliver with it
// queues only if there is room at once.
var NoWait context.Context = doneCtx{}

type doneCtx struct{ context.Context }

var doneCh = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (doneCtx) Deadline() (time.Time, bool) { return time.Time{}, false }
func (doneCtx) Done() <-chan struct{}       { return doneCh }
func (doneCtx) Err() error                  { return context.Canceled }
func (doneCtx) Value(any) any               { return nil }

// Errors of notifications; compare with errors.Is.
var (
	// ErrNotifyFull: the target's notification queue for this sender
	// (or in total) stayed full: its application does not drain it.
	ErrNotifyFull = errors.New("engine: target's notification queue full (the target does not drain its notifications)")
	// ErrCanceled: the submission was cancelled before the slice (or
	// note) was started.
	ErrCanceled = errors.New("engine: canceled")
)
