package mlx5

import "sync/atomic"

// With CQE version 1 every CQE names its QP by the 24-bit user index given
// at creation. The table is two-level so a lookup is two atomic loads and
// never allocates; indexes are never reused within a context, so a late
// CQE of a destroyed QP finds the retired marker instead of a new QP.
const (
	maxUIdx    = 1<<24 - 1 // 0xffffff is "no user index" to the kernel
	uidxLeaf   = 4096
	uidxLeaves = (maxUIdx + uidxLeaf) / uidxLeaf
)

type uidxTable struct {
	top [uidxLeaves]atomic.Pointer[[uidxLeaf]atomic.Pointer[qpRings]]
}

func (t *uidxTable) lookup(u uint32) *qpRings {
	if u >= maxUIdx {
		return nil
	}
	leaf := t.top[u/uidxLeaf].Load()
	if leaf == nil {
		return nil
	}
	return leaf[u%uidxLeaf].Load()
}

// set stores q for u; callers serialize set (context mutex).
func (t *uidxTable) set(u uint32, q *qpRings) {
	leaf := t.top[u/uidxLeaf].Load()
	if leaf == nil {
		leaf = new([uidxLeaf]atomic.Pointer[qpRings])
		t.top[u/uidxLeaf].Store(leaf)
	}
	leaf[u%uidxLeaf].Store(q)
}
