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

// noteName names te bench's notifications.
const noteName = "te-bench"

// submitNotify submits the loop's requests with a notification saying
// which protocol, thread and batch it follows.
func (l *Loop) submitNotify(b engine.BatchID, start time.Time) error {
	l.seq++
	l.sent[l.seq%noteRing].Store(start.UnixNano())
	binary.LittleEndian.PutUint64(l.msg[0:], uint64(l.pi))
	binary.LittleEndian.PutUint64(l.msg[8:], uint64(l.tid))
	binary.LittleEndian.PutUint64(l.msg[16:], l.seq)
	return l.e.SubmitNotify(b, l.reqs, engine.Notify{Name: noteName, Msg: l.msg[:]})
}

// noteCollector is the in-process target's application: it receives the
// notifications and records, per protocol, the time from submit.
type noteCollector struct {
	measuring atomic.Bool
	hists     []histogram // per protocol; the collector's until stop
	done      chan struct{}
	wg        sync.WaitGroup
	once      sync.Once
}

func startNotes(target *engine.Engine, loops [][]*Loop) *noteCollector {
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
			if n.Name != noteName || len(n.Msg) != 24 || !nc.measuring.Load() {
				continue
			}
			pi := binary.LittleEndian.Uint64(n.Msg[0:])
			tid := binary.LittleEndian.Uint64(n.Msg[8:])
			seq := binary.LittleEndian.Uint64(n.Msg[16:])
			if pi >= uint64(len(loops)) || tid >= uint64(len(loops[pi])) {
				continue
			}
			if start := loops[pi][tid].sent[seq%noteRing].Load(); start > 0 {
				nc.hists[pi].record(time.Duration(now - start))
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
