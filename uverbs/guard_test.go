package uverbs

import (
	"errors"
	"testing"
)

// blockingCQ is a DriverCQ whose Poll blocks until released.
type blockingCQ struct {
	UnimplementedDriverCQ
	entered, release chan struct{}
}

func (c *blockingCQ) Poll(wc []WC) (int, error) {
	c.entered <- struct{}{}
	<-c.release
	return 0, nil
}

// TestSingleOwnerGuards: a second concurrent Poll/PostSend returns
// ErrConcurrent instead of corrupting a ring; a dead object returns ErrClosed.
func TestSingleOwnerGuards(t *testing.T) {
	d := &blockingCQ{entered: make(chan struct{}), release: make(chan struct{})}
	cq := &CQ{drv: d}
	done := make(chan error)
	go func() {
		_, err := cq.Poll(make([]WC, 1))
		done <- err
	}()
	<-d.entered
	if _, err := cq.Poll(make([]WC, 1)); !errors.Is(err, ErrConcurrent) {
		t.Errorf("concurrent poll: %v", err)
	}
	close(d.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	cq.dead.Store(true)
	if _, err := cq.Poll(make([]WC, 1)); !errors.Is(err, ErrClosed) {
		t.Errorf("poll on a dead CQ: %v", err)
	}

	qp := &QP{}
	qp.state.Store(uint32(QPStateRTS))
	qp.sendBusy.Store(true) // another goroutine is posting
	if _, err := qp.PostSend(nil); !errors.Is(err, ErrConcurrent) {
		t.Errorf("concurrent post: %v", err)
	}
	qp.recvBusy.Store(true)
	if _, err := qp.PostRecv(nil); !errors.Is(err, ErrConcurrent) {
		t.Errorf("concurrent post_recv: %v", err)
	}
	qp.dead.Store(true)
	if _, err := qp.PostSend(nil); !errors.Is(err, ErrClosed) {
		t.Errorf("post on a dead QP: %v", err)
	}
}

// TestPostStateRules: sends need RTS/SQD/SQE/ERR, receives anything but RESET.
func TestPostStateRules(t *testing.T) {
	for s := QPStateReset; s <= QPStateErr; s++ {
		qp := &QP{drv: nopQP{}}
		qp.state.Store(uint32(s))
		_, err := qp.PostSend(nil)
		wantOK := s == QPStateRTS || s == QPStateSQD || s == QPStateSQE || s == QPStateErr
		if wantOK != (err == nil) || (!wantOK && !errors.Is(err, ErrQPState)) {
			t.Errorf("PostSend in %s: %v", s, err)
		}
		_, err = qp.PostRecv(nil)
		if (s == QPStateReset) != errors.Is(err, ErrQPState) {
			t.Errorf("PostRecv in %s: %v", s, err)
		}
	}
}

type nopQP struct{ UnimplementedDriverQP }

func (nopQP) PostSend(w []SendWR) (int, error) { return len(w), nil }
func (nopQP) PostRecv(w []RecvWR) (int, error) { return len(w), nil }
