package shm

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/transporttest"
)

// TestNotify runs the notification cases over shm: notes follow the
// copies, failures are not notified, the target's bounds hold, a
// restarted sender's notes are dropped.
func TestNotify(t *testing.T) {
	transporttest.RunNotify(t, func(testing.TB) engine.Transport {
		return New(Config{IOTimeout: time.Second})
	}, transporttest.Options{Shared: true})
}

// BenchmarkNotify: as tcp's.
func BenchmarkNotify(b *testing.B) {
	for _, c := range []struct{ tasks, size int }{{1, 4096}, {128, 4096}, {128, 64 << 10}, {64, 1 << 20}} {
		b.Run(fmt.Sprintf("%dx%d", c.tasks, c.size), func(b *testing.B) {
			transporttest.BenchNotify(b, func(testing.TB) engine.Transport { return New(Config{}) }, transporttest.Options{Shared: true}, c.tasks, c.size)
		})
	}
}

// TestNotifyCancel: a batch cancelled while its copies run: the copies
// not begun are skipped (their tasks end CANCELED) and its notification is
// never delivered; a batch whose copies all ran completes and is notified.
func TestNotifyCancel(t *testing.T) {
	ini, tgt, _, _, seg := inProcessPair(t, 64<<20, Config{Copiers: 1})
	base := engine.AddrOf(tgt.Mem.Bytes())
	reqs := make([]engine.Request, 1024)
	for i := range reqs {
		reqs[i] = engine.Request{Op: engine.Write, Local: ini.Mem.Bytes()[i<<16 : (i+1)<<16], Target: seg, TargetAddr: base + uint64(i<<16)}
	}
	ctx := ctxT(t, 30*time.Second)
	cancelled := 0
	for round := 0; round < 40 && cancelled == 0; round++ {
		b, _ := ini.Engine.AllocateBatch(len(reqs))
		// Cancel lands at some point of the copies (64 MiB of them).
		tm := time.AfterFunc(time.Duration(round%8)*200*time.Microsecond, func() { ini.Engine.Cancel(b) })
		err := ini.Engine.SubmitNotify(b, reqs, engine.Notify{Name: fmt.Sprint(round)})
		if errors.Is(err, engine.ErrCanceled) {
			// Cancelled before it was submitted: nothing to see.
			tm.Stop()
			ini.Engine.FreeBatch(b)
			continue
		}
		if err == nil {
			err = ini.Engine.Wait(ctx, b)
		}
		tm.Stop()
		got := tgt.Engine.DrainNotifications(nil)
		switch {
		case err == nil:
			if len(got) != 1 || got[0].Name != fmt.Sprint(round) {
				t.Fatalf("round %d completed, notifications %+v", round, got)
			}
		case errors.Is(err, engine.ErrCanceled):
			cancelled++
			if len(got) != 0 {
				t.Fatalf("round %d cancelled, yet notified: %+v", round, got)
			}
			n := 0
			for i := range reqs {
				if s, _ := ini.Engine.Status(b, i); s.State == engine.StateCanceled {
					n++
				} else if s.State != engine.StateCompleted {
					t.Fatalf("task %d: %+v", i, s)
				}
			}
			if n == 0 {
				t.Fatal("a cancelled batch without a cancelled task")
			}
		default:
			t.Fatalf("round %d: %v", round, err)
		}
		ini.Engine.FreeBatch(b)
	}
	if cancelled == 0 {
		t.Fatal("no round was cancelled in time: the test proved nothing")
	}
}
