package uverbs

import (
	"errors"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// cleaningCQ records the Clean calls the core makes and whether the CQ's
// owner guard was held during each.
type cleaningCQ struct {
	UnimplementedDriverCQ
	cq      *CQ
	log     *[]string
	name    string
	guarded []bool
	entered chan struct{} // non-nil: Poll blocks until release
	release chan struct{}
}

func (c *cleaningCQ) Clean(qp DriverQP) {
	*c.log = append(*c.log, "clean "+c.name+" of "+qp.(*loggingQP).name)
	c.guarded = append(c.guarded, c.cq.busy.Load())
}

func (c *cleaningCQ) Poll([]WC) (int, error) {
	if c.entered != nil {
		c.entered <- struct{}{}
		<-c.release
	}
	*c.log = append(*c.log, "poll "+c.name)
	return 0, nil
}

type loggingQP struct {
	UnimplementedDriverQP
	name string
	log  *[]string
}

func (q *loggingQP) StateChanged(s QPState) { *q.log = append(*q.log, "state "+s.String()) }

func newCleaningCQ(name string, log *[]string) *CQ {
	d := &cleaningCQ{name: name, log: log}
	cq := &CQ{drv: d}
	d.cq = cq
	return cq
}

// TestCleanOnReset: a move to RESET cleans each distinct CQ of the QP under
// its owner guard, before the provider hears of the new state; other
// transitions clean nothing.
func TestCleanOnReset(t *testing.T) {
	var log []string
	scq, rcq := newCleaningCQ("scq", &log), newCleaningCQ("rcq", &log)
	qp := &QP{drv: &loggingQP{name: "qp", log: &log}, sendCQ: scq, recvCQ: rcq}
	qp.stateChanged(QPStateRTS)
	qp.stateChanged(QPStateReset)
	want := []string{"state RTS", "clean scq of qp", "clean rcq of qp", "state RESET"}
	if !slices.Equal(log, want) {
		t.Fatalf("calls %q, want %q", log, want)
	}
	for _, cq := range []*CQ{scq, rcq} {
		d := cq.drv.(*cleaningCQ)
		if !slices.Equal(d.guarded, []bool{true}) {
			t.Errorf("%s: owner guard held during Clean: %v", d.name, d.guarded)
		}
		if cq.busy.Load() {
			t.Errorf("%s: owner guard left held", d.name)
		}
	}
	if qp.State() != QPStateReset {
		t.Errorf("state %s", qp.State())
	}

	// One CQ for both queues is cleaned once.
	log = nil
	shared := newCleaningCQ("cq", &log)
	qp = &QP{drv: &loggingQP{name: "qp2", log: &log}, sendCQ: shared, recvCQ: shared}
	qp.stateChanged(QPStateReset)
	if want := []string{"clean cq of qp2", "state RESET"}; !slices.Equal(log, want) {
		t.Fatalf("shared CQ: calls %q, want %q", log, want)
	}

	// A provider without CQCleaner (rxe) is left alone.
	log = nil
	plain := &CQ{drv: UnimplementedDriverCQ{}}
	qp = &QP{drv: &loggingQP{name: "qp3", log: &log}, sendCQ: plain, recvCQ: plain}
	qp.stateChanged(QPStateReset)
	if want := []string{"state RESET"}; !slices.Equal(log, want) {
		t.Fatalf("no cleaner: calls %q, want %q", log, want)
	}
}

// TestCleanWaitsForPoll: Clean never runs beside a Poll on the owner
// goroutine; it waits for the Poll to return.
func TestCleanWaitsForPoll(t *testing.T) {
	var log []string
	cq := newCleaningCQ("cq", &log)
	d := cq.drv.(*cleaningCQ)
	d.entered, d.release = make(chan struct{}), make(chan struct{})
	qp := &QP{drv: &loggingQP{name: "qp", log: new([]string)}, sendCQ: cq, recvCQ: cq}
	polled := make(chan error)
	go func() {
		_, err := cq.Poll(make([]WC, 1))
		polled <- err
	}()
	<-d.entered
	cleaned := make(chan struct{})
	go func() {
		qp.cleanCQs()
		close(cleaned)
	}()
	select {
	case <-cleaned:
		t.Fatal("Clean ran while Poll held the CQ")
	case <-time.After(20 * time.Millisecond):
	}
	close(d.release)
	if err := <-polled; err != nil {
		t.Fatal(err)
	}
	<-cleaned
	if want := []string{"poll cq", "clean cq of qp"}; !slices.Equal(log, want) {
		t.Fatalf("calls %q, want %q", log, want)
	}
	d.entered = nil
	if _, err := cq.Poll(make([]WC, 0)); err != nil {
		t.Fatalf("poll after clean: %v", err)
	}
}

// TestCreateCQOverDeviceLimit: a CQ larger than the device's max_cqe is
// refused with EINVAL naming the limit, before the provider or the kernel
// sees it.
func TestCreateCQOverDeviceLimit(t *testing.T) {
	c := &Context{dev: Device{Name: "fake0"}, limits: DeviceLimits{MaxCQE: 63}}
	for _, n := range []int{64, 1 << 40} {
		_, err := c.CreateCQ(CQConfig{Entries: n})
		if !errors.Is(err, syscall.EINVAL) || !strings.Contains(err.Error(), "limit of 63") {
			t.Errorf("CQ of %d entries: %v", n, err)
		}
	}
}

type strayCQ struct{ UnimplementedDriverCQ }

func (strayCQ) Poll(wc []WC) (int, error) {
	wc[0] = WC{ID: 5}
	return 1, ErrStrayCompletion
}

// TestPollPassesProviderErrors: CQ.Poll returns the provider's completions
// and its error together, unwrapped, and releases the owner guard.
func TestPollPassesProviderErrors(t *testing.T) {
	cq := &CQ{drv: strayCQ{}}
	wc := make([]WC, 2)
	n, err := cq.Poll(wc)
	if n != 1 || err != ErrStrayCompletion || wc[0].ID != 5 {
		t.Fatalf("poll: %d %v %+v", n, err, wc[0])
	}
	if cq.busy.Load() {
		t.Fatal("owner guard left held")
	}
}
