package main

import (
	"context"
	"time"

	"github.com/rdmago/te/engine"
)

// memcpyResult is the ceiling of a same-host copy: one goroutine copying
// the benchmark's blocks from the initiator's buffer to the target's
// (the same memory shm copies between, when the target runs in this
// process).
type memcpyResult struct {
	BlockSize int     `json:"block_size"`
	Seconds   float64 `json:"seconds"`
	Bytes     uint64  `json:"bytes"`
	GBps      float64 `json:"gb_per_s"`
}

// runMemcpy copies footprint bytes in block-sized copies, over and over,
// for d.
func (env *benchEnv) runMemcpy(ctx context.Context, block, footprint int, d time.Duration) (memcpyResult, error) {
	res := memcpyResult{BlockSize: block}
	src := env.init.mem.Bytes()[:footprint]
	var dst []byte
	if env.target != nil {
		tmem := env.target.mem.Bytes()
		off := int(env.remoteBase - engine.AddrOf(tmem))
		dst = tmem[off : off+footprint]
	} else {
		if env.copyDst == nil || env.copyDst.Len() < footprint {
			env.copyDst.Close()
			m, err := engine.AllocShared(footprint)
			if err != nil {
				return res, err
			}
			env.copyDst = m
			// Fault its pages in before timing, as the engine's warm-up
			// batch does for the buffers it uses.
			copy(m.Bytes(), src)
		}
		dst = env.copyDst.Bytes()[:footprint]
	}
	start := time.Now()
	deadline := start.Add(d)
	for {
		for off := 0; off+block <= footprint; off += block {
			copy(dst[off:off+block], src[off:off+block])
		}
		res.Bytes += uint64(footprint / block * block)
		if err := ctx.Err(); err != nil {
			return res, err
		}
		if time.Now().After(deadline) {
			break
		}
	}
	res.Seconds = time.Since(start).Seconds()
	return res, nil
}
