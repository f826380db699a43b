package segment

import (
	"context"
	"sync"
)

// WatchReport sends the reports of one Store.Watch, the same way for every
// backend: the first state it is given (a descriptor, or nil for absent),
// then only a descriptor whose Epoch or Version differs from the last
// report, or nil once after a descriptor.
type WatchReport struct {
	ch       chan<- *Descriptor
	last     *Descriptor
	reported bool
}

// NewWatchReport returns a WatchReport that sends on ch.
func NewWatchReport(ch chan<- *Descriptor) WatchReport {
	return WatchReport{ch: ch}
}

// Changed says whether d (nil: the segment is absent) would be reported:
// nothing has been reported yet, or d is not the last report's
// incarnation and version.
func (w *WatchReport) Changed(d *Descriptor) bool {
	switch {
	case !w.reported:
		return true
	case d == nil || w.last == nil:
		return (d == nil) != (w.last == nil)
	}
	return d.Epoch != w.last.Epoch || d.Version != w.last.Version
}

// Reported says whether anything has been reported.
func (w *WatchReport) Reported() bool { return w.reported }

// Send reports d if Changed(d). It returns false only when ctx ended
// before the receiver took the report.
func (w *WatchReport) Send(ctx context.Context, d *Descriptor) bool {
	if !w.Changed(d) {
		return true
	}
	select {
	case w.ch <- d:
		w.last, w.reported = d, true
		return true
	case <-ctx.Done():
		return false
	}
}

// GoWatch starts run, the body of one Store.Watch, on its own goroutine and
// returns the channel it reports on through rep. The goroutine is counted
// in wg (a store's Close waits on it); run's ctx also ends when life (the
// store's lifetime) ends; the channel is closed when run returns. Call it
// with the store's lock held, after checking the store is open, so Close
// cannot miss it.
func GoWatch(ctx, life context.Context, wg *sync.WaitGroup, run func(ctx context.Context, rep *WatchReport)) <-chan *Descriptor {
	ch := make(chan *Descriptor, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(ch)
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(life, cancel)()
		rep := NewWatchReport(ch)
		run(ctx, &rep)
	}()
	return ch
}
