// Package blockcopy copies the blocks of the same-host data paths (shm's
// copies into a mapped segment, the engine's copies within the local
// segment) faster than the built-in copy for the sizes that dominate
// small transfers.
//
// Go's copy (runtime.memmove) moves 4 KiB to 512 KiB with 32-byte vector
// loads and stores. On CPUs with fast string moves (ERMS) a single
// REP MOVSB of a page-aligned block is faster: 17-20% less time at
// 4 KiB to 64 KiB on an AMD EPYC (Zen 5, family 26) with the blocks in
// the L2 cache, about even at 2 KiB and 256 KiB, slower below 2 KiB, and
// about even at 4-16 KiB when the destination is not 64-byte aligned
// (BenchmarkCopy; docs/cost.md). Copy
// takes the string move only where it was measured to win: a block of
// [minRep, maxRep) bytes whose destination starts a cache line, on a CPU
// that reports ERMS, and ranges that do not overlap. From 1 MiB
// runtime.memmove switches to non-temporal stores, which keep a copy too
// large for the cache from evicting it; Copy leaves those to it.
package blockcopy

// Bounds of the sizes copied with a string move.
const (
	minRep = 4 << 10
	maxRep = 1 << 20
)

// Copy copies min(len(dst), len(src)) bytes from src to dst, as the
// built-in copy does (overlapping ranges included), and returns the count.
func Copy(dst, src []byte) int {
	n := min(len(dst), len(src))
	if n >= minRep && n < maxRep && useRep && aligned(dst) && !overlap(dst[:n], src[:n]) {
		repMove(dst[:n], src[:n])
		return n
	}
	return copy(dst, src)
}
