package shm

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
)

// TestTargetStopsMidBatch: a target that closes (te serve stopped) while
// an initiator writes to it fails the initiator's tasks with
// engine.ErrPeerReset (or the segment gone), never as memory out of
// range: its closing transport marks the control page before it revokes
// the regions.
func TestTargetStopsMidBatch(t *testing.T) {
	for round := range 5 {
		ini, tgt, _, _, seg := inProcessPair(t, 4<<20, Config{IOTimeout: 2 * time.Second})
		base := engine.AddrOf(tgt.Mem.Bytes())
		reqs := make([]engine.Request, 64)
		for i := range reqs {
			reqs[i] = engine.Request{Op: engine.Write, Local: ini.Mem.Bytes()[i<<16 : (i+1)<<16], Target: seg, TargetAddr: base + uint64(i)<<16}
		}
		errc := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			for {
				if err := ini.Engine.Transfer(ctx, reqs); err != nil {
					errc <- err
					return
				}
			}
		}()
		time.Sleep(20 * time.Millisecond)
		tgt.Engine.Close()
		err := <-errc
		if errors.Is(err, engine.ErrOutOfRange) || !errors.Is(err, engine.ErrPeerReset) && !errors.Is(err, engine.ErrSegmentNotFound) {
			t.Fatalf("round %d: a write to a stopping target failed with %v; want engine.ErrPeerReset", round, err)
		}
	}
}
