package segment

import (
	"context"
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
