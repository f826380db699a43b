package mlx5

import "sync"

// bfreg is one send doorbell register ("BlueFlame register") of a UAR page.
// It has two halves used alternately; BlueFlame writes a whole WQE into a
// half, a regular doorbell writes 8 bytes. A register shared by several
// QPs is rung under mu (rdma-core's bfreg lock): the alternation and the
// write-combining flush must not interleave between QPs.
type bfreg struct {
	mu     sync.Mutex
	shared bool
	reg    [2]*uint64 // the two halves; equal when there is no alternation
	half   int
	bfHalf uint32 // bytes per half usable for BlueFlame; 0: doorbells only
	index  uint32 // library bfreg number
}
