package transporttest_test

import (
	"bytes"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/engine/transporttest"
	"github.com/rdmago/te/tcp"
)

func TestPattern(t *testing.T) {
	const n = 1000
	whole := make([]byte, n)
	transporttest.Pattern(whole, 42, 7)
	for _, c := range [][2]int{{0, n}, {1, 9}, {3, 500}, {8, 16}, {999, 1000}} {
		part := make([]byte, c[1]-c[0])
		transporttest.Pattern(part, 42, 7+uint64(c[0]))
		if !bytes.Equal(part, whole[c[0]:c[1]]) {
			t.Fatalf("positions [%d, %d) differ from the same positions of a longer range", c[0], c[1])
		}
		if err := transporttest.CheckPattern(whole[c[0]:c[1]], 42, 7+uint64(c[0])); err != nil {
			t.Fatal(err)
		}
	}
	other := make([]byte, n)
	transporttest.Pattern(other, 43, 7)
	same := 0
	for i := range other {
		if other[i] == whole[i] {
			same++
		}
	}
	if same > n/64 {
		t.Fatalf("seeds 42 and 43 agree on %d of %d bytes", same, n)
	}
	whole[600] ^= 1
	if err := transporttest.CheckPattern(whole, 42, 7); err == nil {
		t.Fatal("a flipped bit passed the check")
	} else {
		t.Log(err)
	}
}

// railed stands in for a multi-rail transport to check the suite's rail
// cases themselves: a tcp transport whose slices are spread over two
// counted "rails", rail 0 skipped while its link is down.
type railed struct {
	driver.Transport
	down  *atomic.Bool
	next  atomic.Uint64
	mu    sync.Mutex
	bytes [2]uint64
}

func (r *railed) Driver() driver.Transport { return r }

func (r *railed) Submit(ss []*driver.Slice) {
	r.mu.Lock()
	for _, s := range ss {
		rail := r.next.Add(1) % 2
		if r.down.Load() {
			rail = 1
		}
		r.bytes[rail] += uint64(len(s.Local))
	}
	r.mu.Unlock()
	r.Transport.Submit(ss)
}

func TestRailHooks(t *testing.T) {
	var down atomic.Bool
	f := func(testing.TB) engine.Transport {
		return &railed{Transport: tcp.New(tcp.Config{IOTimeout: 2 * time.Second, SliceSize: 64 << 10}).Driver(), down: &down}
	}
	transporttest.Run(t, f, transporttest.Options{
		MaxSize:  4 << 20,
		DeadPeer: 10 * time.Second,
		Rails: &transporttest.Rails{
			Count: 2,
			Bytes: func(tr engine.Transport) []uint64 {
				r := tr.(*railed)
				r.mu.Lock()
				defer r.mu.Unlock()
				return slices.Clone(r.bytes[:])
			},
			SetLink: func(rail int, up bool) error {
				if rail != 0 {
					t.Errorf("SetLink(%d): the suite takes rail 0 down", rail)
				}
				down.Store(!up)
				return nil
			},
		},
	})
	if down.Load() {
		t.Error("rail 0 left down")
	}
}
