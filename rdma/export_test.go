package rdma

// TargetQPs is how many QPs the target side holds for initiators.
func (t *Transport) TargetQPs() int {
	t.tgt.mu.Lock()
	defer t.tgt.mu.Unlock()
	return t.tgt.total
}

// ControlAddr is the control listener's address.
func (t *Transport) ControlAddr() string { return t.ln.Addr().String() }

// Endpoints is how many endpoints the initiator side holds, and how many
// it evicted.
func (t *Transport) Endpoints() (held int, evicted uint64) {
	t.store.mu.Lock()
	defer t.store.mu.Unlock()
	return t.store.n, t.store.evict.Load()
}

// SetPostHook installs f to see every work request as it is built (the
// peer incarnation's epoch, rkey, remote address and length); nil removes
// it. Only while no transport posts.
func SetPostHook(f func(epoch uint64, rkey uint32, addr, n uint64)) { postHook = f }
