package segment

import (
	"context"
	"sync"
	"testing"
)

func TestWatchReport(t *testing.T) {
	ch := make(chan *Descriptor, 16)
	w := NewWatchReport(ch)
	ctx := context.Background()
	d := func(epoch, version uint64) *Descriptor { return &Descriptor{Name: "s", Epoch: epoch, Version: version} }
	steps := []struct {
		d    *Descriptor
		want bool
	}{
		{nil, true},      // the first state, even absent
		{nil, false},     // still absent
		{d(1, 1), true},  // appeared
		{d(1, 1), false}, // same incarnation and version
		{d(1, 2), true},  // new version
		{d(2, 2), true},  // restarted: new epoch, same version
		{nil, true},      // gone
		{nil, false},     // still gone
		{d(2, 2), true},  // back, even as the last descriptor seen
	}
	for i, s := range steps {
		if got := w.Changed(s.d); got != s.want {
			t.Fatalf("step %d: Changed(%v) = %v, want %v", i, s.d, got, s.want)
		}
		if !w.Send(ctx, s.d) {
			t.Fatalf("step %d: Send failed", i)
		}
		select {
		case got := <-ch:
			if !s.want {
				t.Fatalf("step %d: reported %v again", i, got)
			}
			if got != s.d {
				t.Fatalf("step %d: reported %v, want %v", i, got, s.d)
			}
		default:
			if s.want {
				t.Fatalf("step %d: %v not reported", i, s.d)
			}
		}
		if !w.Reported() {
			t.Fatalf("step %d: Reported false", i)
		}
	}
}

func TestWatchReportCancelled(t *testing.T) {
	w := NewWatchReport(make(chan *Descriptor)) // nobody receives
	if w.Reported() {
		t.Fatal("Reported before any report")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if w.Send(ctx, nil) {
		t.Fatal("Send reported success with nobody receiving and ctx done")
	}
	if w.Reported() || !w.Changed(nil) {
		t.Fatal("a report that was never taken counts as reported")
	}
}

// GoWatch: reports flow through rep, the body's context ends with the
// caller's or with the store's life, the channel closes after the body
// returns, and the WaitGroup counts the goroutine until then.
func TestGoWatch(t *testing.T) {
	for _, end := range []string{"caller", "store"} {
		t.Run(end, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			life, kill := context.WithCancel(context.Background())
			defer kill()
			var wg sync.WaitGroup
			returned := make(chan struct{})
			ch := GoWatch(ctx, life, &wg, func(ctx context.Context, rep *WatchReport) {
				defer close(returned)
				rep.Send(ctx, nil)
				<-ctx.Done()
			})
			if d, ok := <-ch; !ok || d != nil {
				t.Fatalf("first report %v, %v; want nil, open", d, ok)
			}
			if end == "caller" {
				cancel()
			} else {
				kill()
			}
			<-returned
			if _, ok := <-ch; ok {
				t.Fatal("channel still open after the body returned")
			}
			wg.Wait()
		})
	}
}
