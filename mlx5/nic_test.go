package mlx5

// A simulated HCA: it consumes the send and receive queues the way the
// device does (doorbell records, WQE formats) and writes CQE64 entries with
// the right owner bit into the mmap'd CQ buffer.

// fakeCQE describes one completion as the HCA would write it.
type fakeCQE struct {
	opcode     uint8 // CQE opcode (op_own >> 4)
	se         bool
	owner      uint8
	wqeCounter uint16
	sop        uint8 // requester: the send WQE opcode
	qpn        uint32
	uidx       uint32
	byteCnt    uint32
	imm        uint32
	flagsRQPN  uint32
	slid       uint16
	mlPath     uint8
	timestamp  uint64
	syndrome   uint8 // error CQEs
	vendorErr  uint8
}

// put writes the CQE into b[0:64]; op_own goes last, as the HCA makes the
// entry valid only once the rest is in place.
func (c *fakeCQE) put(b []byte) {
	_ = b[63]
	clear(b[:63])
	b[cqeMLPath] = c.mlPath
	be.PutUint16(b[cqeSLID:], c.slid)
	be.PutUint32(b[cqeFlagsRQPN:], c.flagsRQPN)
	be.PutUint32(b[cqeSRQNUIdx:], c.uidx)
	be.PutUint32(b[cqeImmInvalPKey:], c.imm)
	be.PutUint32(b[cqeByteCnt:], c.byteCnt)
	if c.opcode == cqeReqErr || c.opcode == cqeRespErr {
		b[cqeVendorErrSynd] = c.vendorErr
		b[cqeSyndrome] = c.syndrome
	} else {
		be.PutUint64(b[cqeTimestamp:], c.timestamp)
	}
	be.PutUint32(b[cqeSopDropQPN:], uint32(c.sop)<<24|c.qpn&0xffffff)
	be.PutUint16(b[cqeWQECounter:], c.wqeCounter)
	op := c.opcode<<4 | c.owner&1
	if c.se {
		op |= 2
	}
	b[cqeOpOwn] = op
}
