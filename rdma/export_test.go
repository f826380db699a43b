package rdma

// TargetQPs is how many QPs the target side holds for initiators.
func (t *Transport) TargetQPs() int {
	t.tgt.mu.Lock()
	defer t.tgt.mu.Unlock()
	return t.tgt.total
}

// ControlAddr is the control listener's address.
func (t *Transport) ControlAddr() string { return t.ln.Addr().String() }
