package bench

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/rdmago/te/engine"
)

// Verify writes a fresh pattern over c's footprint of the target with one
// batch, reads it back into the next footprint of env.Local and compares
// (and, with the target in this process, compares its memory too). It
// needs twice the footprint of local memory.
func Verify(ctx context.Context, env *Env, c Config, proto string) (bool, error) {
	n := int64(c.Batch) * int64(c.Threads)
	fp := c.Block * n
	if int64(len(env.Local)) < 2*fp {
		return false, fmt.Errorf("verify: %d bytes of local memory, want twice the footprint of %d", len(env.Local), fp)
	}
	src, dst := env.Local[:fp], env.Local[fp:2*fp]
	Fill(src, uint64(time.Now().UnixNano()))
	clear(dst)
	e := env.Engine
	reqs := make([]engine.Request, n)
	for _, op := range []engine.Op{engine.Write, engine.Read} {
		for i := range reqs {
			off := c.Block * int64(i)
			local := src
			if op == engine.Read {
				local = dst
			}
			reqs[i] = engine.Request{Op: op, Local: local[off : off+c.Block], Target: env.Segment, TargetAddr: env.Remote + uint64(off), Transport: proto}
		}
		if err := e.Transfer(ctx, reqs); err != nil {
			return false, err
		}
	}
	if !bytes.Equal(src, dst) {
		return false, nil
	}
	if env.TargetMem != nil {
		return bytes.Equal(src, env.TargetMem[:fp]), nil
	}
	return true, nil
}
