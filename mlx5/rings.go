package mlx5

// qpRings is the user-space state of one RC QP: both work queues in one
// buffer (receive queue first, then send queue, as the HCA expects), the
// doorbell record and the send doorbell register.
type qpRings struct {
	sq      sendQueue
	rq      recvQueue
	sendRec *uint32 // doorbell record word MLX5_SND_DBR
	recvRec *uint32 // doorbell record word MLX5_RCV_DBR
	db      *bfreg
	uidx    uint32
}

// postSend builds every request, then rings once. It returns the number
// of requests posted; on error the failing request and those after it were
// not posted.
func (q *qpRings) postSend(wrs []SendWR) (int, error) {
	n := 0
	var err error
	for i := range wrs {
		if err = q.sq.build(&wrs[i]); err != nil {
			break
		}
		n++
	}
	if n > 0 {
		q.sq.pub.Store(q.sq.head) // release the wrid entries to the poller
		q.sq.ring(q.sendRec, q.db, n)
	}
	return n, err
}

// postRecv fills receive slots, then publishes the producer counter.
func (q *qpRings) postRecv(wrs []RecvWR) (int, error) {
	n := 0
	var err error
	for i := range wrs {
		if err = q.rq.build(&wrs[i]); err != nil {
			break
		}
		n++
	}
	if n > 0 {
		q.rq.ring(q.recvRec)
	}
	return n, err
}
