package bench

import (
	"math/bits"
	"time"
)

// histogram records durations in log-linear buckets: 32 per power of two,
// so a reported quantile is within about 3% of the true value. Recording
// does not allocate.
type histogram struct {
	counts [64 * histSub]uint64
	n      uint64
	max    time.Duration
	sum    time.Duration
}

const (
	histSubBits = 5
	histSub     = 1 << histSubBits
)

func histIndex(ns uint64) int {
	if ns < histSub {
		return int(ns)
	}
	e := bits.Len64(ns) - 1 // ns in [2^e, 2^(e+1))
	sub := (ns >> (e - histSubBits)) & (histSub - 1)
	return (e-histSubBits+1)*histSub + int(sub)
}

// histLow returns the smallest value that falls in bucket i.
func histLow(i int) uint64 {
	if i < histSub {
		return uint64(i)
	}
	e := i/histSub + histSubBits - 1
	sub := uint64(i % histSub)
	return 1<<e | sub<<(e-histSubBits)
}

func (h *histogram) record(d time.Duration) {
	if d < 0 {
		d = 0
	}
	h.counts[histIndex(uint64(d))]++
	h.n++
	h.sum += d
	if d > h.max {
		h.max = d
	}
}

func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sum += o.sum
	h.max = max(h.max, o.max)
}

// quantile returns the value below which a fraction q of the samples lie,
// as the midpoint of its bucket (0 without samples).
func (h *histogram) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q*float64(h.n) + 0.5)
	rank = max(1, min(rank, h.n))
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			lo, hi := histLow(i), histLow(i+1)
			return min(time.Duration(lo+(hi-lo)/2), h.max)
		}
	}
	return h.max
}
