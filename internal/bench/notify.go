package bench

import (
	"encoding/binary"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmago/te/engine"
)

// noteRing is how many of a thread's recent submissions the notification
// collector can match: a thread has one batch in flight at a time, so
// its note arrives long before the ring wraps.
const noteRing = 256

// NoteName names te bench's notifications, EchoName a target's echo of
// one (Echo).
const (
	NoteName = "te-bench"
	EchoName = "te-bench-echo"
)

// A note's message: protocol index, thread, sequence number, submit time
// (Unix ns, the initiator's clock), little-endian; an echo appends the
// time the target's application received it (Unix ns, the target's
// clock).
const (
	noteLen = 32
	echoLen = noteLen + 8
)

// Echo returns the echo of a te bench notification that arrived at the
// target's application at t, for the target to send back to its sender
// (engine.Notify with EchoName): te serve does, and te bench then
// measures the time from submit to the arrival with a target in another
// process. ok is false for anything else.
func Echo(n *engine.Notification, t time.Time) (msg []byte, ok bool) {
	if n.Name != NoteName || len(n.Msg) != noteLen {
		return nil, false
	}
	return binary.LittleEndian.AppendUint64(append(make([]byte, 0, echoLen), n.Msg...), uint64(t.UnixNano())), true
}

// submitNotify submits the loop's requests with a notification saying
// which protocol, thread and batch it follows.
func (l *Loop) submitNotify(b engine.BatchID, start time.Time) error {
	l.seq++
	l.sent[l.seq%noteRing].Store(start.UnixNano())
	binary.LittleEndian.PutUint64(l.msg[0:], uint64(l.pi))
	binary.LittleEndian.PutUint64(l.msg[8:], uint64(l.tid))
	binary.LittleEndian.PutUint64(l.msg[16:], l.seq)
	binary.LittleEndian.PutUint64(l.msg[24:], uint64(start.UnixNano()))
	return l.e.SubmitNotify(b, l.reqs, engine.Notify{Name: NoteName, Msg: l.msg[:]})
}

// noteCollector is the in-process target's application: it receives the
// notifications and records, per protocol, the time from submit. With a
// target elsewhere that echoes them (Env.Echoes) it receives the echoes
// on the initiator's engine and records the time from submit to the
// arrival there, by the two processes' clocks.
type noteCollector struct {
	measuring atomic.Bool
	hists     []histogram // per protocol; the collector's until stop
	done      chan struct{}
	wg        sync.WaitGroup
	once      sync.Once
}

func startNotes(target *engine.Engine, loops [][]*Loop, echoes bool) *noteCollector {
	nc := &noteCollector{hists: make([]histogram, len(loops)), done: make(chan struct{})}
	ch := target.Notifications()
	nc.wg.Go(func() {
		for {
			var n engine.Notification
			var ok bool
			select {
			case n, ok = <-ch:
			case <-nc.done:
				return
			}
			if !ok {
				return
			}
			now := time.Now().UnixNano()
			if !nc.measuring.Load() {
				continue
			}
			pi := binary.LittleEndian.Uint64(n.Msg[0:min(8, len(n.Msg))])
			switch {
			case pi >= uint64(len(loops)):
			case echoes && n.Name == EchoName && len(n.Msg) == echoLen:
				sent, at := binary.LittleEndian.Uint64(n.Msg[24:]), binary.LittleEndian.Uint64(n.Msg[32:])
				nc.hists[pi].record(time.Duration(int64(at - sent)))
			case !echoes && n.Name == NoteName && len(n.Msg) == noteLen:
				tid := binary.LittleEndian.Uint64(n.Msg[8:])
				seq := binary.LittleEndian.Uint64(n.Msg[16:])
				if tid >= uint64(len(loops[pi])) {
					continue
				}
				if start := loops[pi][tid].sent[seq%noteRing].Load(); start > 0 {
					nc.hists[pi].record(time.Duration(now - start))
				}
			}
		}
	})
	return nc
}

// stop ends the collector; its histograms are final after it.
func (nc *noteCollector) stop() {
	nc.once.Do(func() {
		close(nc.done)
		nc.wg.Wait()
	})
}
