package uverbs_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/rdmago/te/rxe"
	"github.com/rdmago/te/test/softroce/srenv"
	"github.com/rdmago/te/uverbs"
)

// cleanLog records, per CQ, the QPs the core asked to clean out of it.
type cleanLog struct {
	mu    sync.Mutex
	calls []string
	names map[uverbs.DriverQP]string
}

func (l *cleanLog) add(s string) {
	l.mu.Lock()
	l.calls = append(l.calls, s)
	l.mu.Unlock()
}

// cleaningProvider wraps rxe so that its CQs implement uverbs.CQCleaner and
// log the calls; everything else is rxe's, on the real kernel.
type cleaningProvider struct {
	uverbs.Provider
	log *cleanLog
}

func (p cleaningProvider) NewContext(k uverbs.Kernel, out []byte) (uverbs.DriverContext, error) {
	c, err := p.Provider.NewContext(k, out)
	if err != nil {
		return nil, err
	}
	return cleaningContext{c, p.log}, nil
}

type cleaningContext struct {
	uverbs.DriverContext
	log *cleanLog
}

type cleaningCQ struct {
	uverbs.DriverCQ
	name string
	log  *cleanLog
}

func (q *cleaningCQ) Clean(qp uverbs.DriverQP) {
	q.log.mu.Lock()
	name := q.log.names[qp]
	q.log.mu.Unlock()
	q.log.add("clean " + q.name + " of " + name)
}

func (c cleaningContext) NewCQ(cfg uverbs.DriverCQConfig) (uverbs.DriverCQ, error) {
	d, err := c.DriverContext.NewCQ(cfg)
	if err != nil {
		return nil, err
	}
	return &cleaningCQ{DriverCQ: d, name: fmt.Sprintf("cq%d", cfg.Entries), log: c.log}, nil
}

func (c cleaningContext) NewQP(cfg uverbs.DriverQPConfig) (uverbs.DriverQP, error) {
	cfg.SendCQ = cfg.SendCQ.(*cleaningCQ).DriverCQ
	cfg.RecvCQ = cfg.RecvCQ.(*cleaningCQ).DriverCQ
	d, err := c.DriverContext.NewQP(cfg)
	if err == nil {
		c.log.mu.Lock()
		c.log.names[d] = "qp"
		c.log.mu.Unlock()
	}
	return d, err
}

// TestCQCleanHookOnKernel: on a real kernel, a move to RESET and a destroy
// each clean the QP's two CQs once; other transitions clean nothing.
func TestCQCleanHookOnKernel(t *testing.T) {
	topo := srenv.Require(t)
	log := &cleanLog{names: map[uverbs.DriverQP]string{}}
	c, err := uverbs.Open(topo.Devs[0].Name, &uverbs.Options{Providers: []uverbs.Provider{cleaningProvider{rxe.Provider(), log}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pd, err := c.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	defer pd.Close()
	scq, err := c.CreateCQ(uverbs.CQConfig{Entries: 11})
	if err != nil {
		t.Fatal(err)
	}
	defer scq.Close()
	rcq, err := c.CreateCQ(uverbs.CQConfig{Entries: 12})
	if err != nil {
		t.Fatal(err)
	}
	defer rcq.Close()
	qp, err := pd.CreateQP(uverbs.QPConfig{SendCQ: scq, RecvCQ: rcq, Caps: uverbs.QPCaps{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := qp.ToInit(1, uverbs.AccessRemoteWrite); err != nil {
		t.Fatal(err)
	}
	if len(log.calls) != 0 {
		t.Fatalf("RESET->INIT cleaned: %q", log.calls)
	}
	if err := qp.ToReset(); err != nil {
		t.Fatal(err)
	}
	if want := []string{"clean cq11 of qp", "clean cq12 of qp"}; !slices.Equal(log.calls, want) {
		t.Fatalf("after RESET: %q, want %q", log.calls, want)
	}
	log.calls = nil
	if err := qp.Close(); err != nil {
		t.Fatal(err)
	}
	if err := qp.Close(); err != nil {
		t.Fatal(err)
	}
	if want := []string{"clean cq11 of qp", "clean cq12 of qp"}; !slices.Equal(log.calls, want) {
		t.Fatalf("after destroy (and a second Close): %q, want %q", log.calls, want)
	}
}

// TestCQOverDeviceLimitOnKernel: the core refuses a CQ one entry over the
// device's max_cqe with EINVAL before the kernel sees it, and creates one
// of exactly max_cqe entries.
func TestCQOverDeviceLimitOnKernel(t *testing.T) {
	topo := srenv.Require(t)
	c := open(t, topo.Devs[0].Name)
	attr, err := c.QueryDevice()
	if err != nil {
		t.Fatal(err)
	}
	if attr.MaxCQE == 0 {
		t.Fatal("device reports max_cqe 0")
	}
	if _, err := c.CreateCQ(uverbs.CQConfig{Entries: int(attr.MaxCQE) + 1}); !errors.Is(err, syscall.EINVAL) ||
		!strings.Contains(err.Error(), "limit of") {
		t.Fatalf("CQ of max_cqe+1 = %d entries: %v", attr.MaxCQE+1, err)
	}
	cq, err := c.CreateCQ(uverbs.CQConfig{Entries: int(attr.MaxCQE)})
	if err != nil {
		t.Fatalf("CQ of max_cqe = %d entries: %v", attr.MaxCQE, err)
	}
	if err := cq.Close(); err != nil {
		t.Fatal(err)
	}
}
