package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/rdmago/te/engine"
)

// Ceiling is what a copy with nothing else in the way moves, measured
// taking turns with the engine: the bound a transport can hope for.
type Ceiling struct {
	Seconds float64 `json:"seconds"`
	Bytes   uint64  `json:"bytes"`
	GBps    float64 `json:"gb_per_s"`
}

func (c *Ceiling) add(o Ceiling) {
	c.Seconds += o.Seconds
	c.Bytes += o.Bytes
	if c.Seconds > 0 {
		c.GBps = float64(c.Bytes) / c.Seconds / 1e9
	}
}

// Baseline is the ceiling of loopback TCP: it streams block-sized writes
// over one connection for d; the receiver reads each block into a
// rotating window of a footprint-sized buffer, as a target copies into
// registered memory.
func Baseline(ctx context.Context, block, footprint int, d time.Duration) (Ceiling, error) {
	var res Ceiling
	footprint = max(footprint/block, 1) * block
	src, err := engine.Alloc(footprint)
	if err != nil {
		return res, err
	}
	defer src.Close()
	dst, err := engine.Alloc(footprint)
	if err != nil {
		return res, err
	}
	defer dst.Close()
	Fill(src.Bytes(), 1)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return res, fmt.Errorf("baseline: %w", err)
	}
	defer ln.Close()

	var (
		wg       sync.WaitGroup
		received uint64
		recvErr  error
		done     = make(chan struct{})
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			recvErr = err
			return
		}
		defer c.Close()
		buf := dst.Bytes()
		for off := 0; ; off = (off + block) % len(buf) {
			n, err := io.ReadFull(c, buf[off:off+block])
			received += uint64(n)
			if err != nil {
				if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
					recvErr = err
				}
				return
			}
		}
	}()

	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		ln.Close()
		wg.Wait()
		return res, fmt.Errorf("baseline: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	buf := src.Bytes()
	start := time.Now()
	end := start.Add(d)
	var sendErr error
	for off := 0; time.Now().Before(end); off = (off + block) % len(buf) {
		if _, err := c.Write(buf[off : off+block]); err != nil {
			sendErr = err
			break
		}
	}
	c.(*net.TCPConn).CloseWrite()
	<-done // the receiver has read everything sent
	elapsed := time.Since(start)
	c.Close()
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return res, err
	}
	if sendErr != nil {
		return res, fmt.Errorf("baseline: send: %w", sendErr)
	}
	if recvErr != nil {
		return res, fmt.Errorf("baseline: receive: %w", recvErr)
	}
	res.add(Ceiling{Seconds: elapsed.Seconds(), Bytes: received})
	return res, nil
}

// Memcpy is the ceiling of a same-host copy: one goroutine copying
// footprint bytes of src to dst in block-sized copies, over and over, for
// d.
func Memcpy(ctx context.Context, dst, src []byte, block int, d time.Duration) (Ceiling, error) {
	var res Ceiling
	footprint := min(len(dst), len(src))
	if block <= 0 || footprint < block {
		return res, fmt.Errorf("memcpy: %d bytes cannot hold a block of %d", footprint, block)
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
	res.add(Ceiling{Seconds: time.Since(start).Seconds()})
	return res, nil
}

// Fill writes a pattern that depends on each byte's offset and a seed, so
// misplaced or stale blocks are told apart from correct ones.
func Fill(b []byte, seed uint64) {
	for i := 0; i+8 <= len(b); i += 8 {
		v := uint64(i)*0x9e3779b97f4a7c15 ^ seed
		b[i], b[i+1], b[i+2], b[i+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
		b[i+4], b[i+5], b[i+6], b[i+7] = byte(v>>32), byte(v>>40), byte(v>>48), byte(v>>56)
	}
}
