package acceptor

import (
	"sync"
	"testing"
	"time"
)

// admitted is a test connection: evicted records the gate closing it.
type admitted struct {
	slot    *Slot[string, int]
	evicted bool
}

func admit(t *testing.T, g *Gate[string, int], src string) *admitted {
	t.Helper()
	a := &admitted{}
	s, ok := g.Admit(src, 0, func() { a.evicted = true })
	if !ok {
		return nil
	}
	a.slot = s
	time.Sleep(time.Millisecond) // distinct waiting times
	return a
}

// TestGate: the bounds, whom each evicts, and refusal when every
// candidate works.
func TestGate(t *testing.T) {
	t.Run("per source evicts its own longest-waiting", func(t *testing.T) {
		g := NewGate[string, int](10, 2)
		a1, a2 := admit(t, g, "a"), admit(t, g, "a")
		b := admit(t, g, "b")
		a3 := admit(t, g, "a")
		if a3 == nil || !a1.evicted || a2.evicted || b.evicted || g.Count("a") != 2 || g.Len() != 3 {
			t.Fatalf("a1 %v a2 %v b %v, count %d len %d", a1.evicted, a2.evicted, b.evicted, g.Count("a"), g.Len())
		}
	})
	t.Run("total evicts from the source holding most", func(t *testing.T) {
		g := NewGate[string, int](4, 4)
		b := admit(t, g, "b") // waited longest, but its source holds one
		m := []*admitted{admit(t, g, "m"), admit(t, g, "m"), admit(t, g, "m")}
		c := admit(t, g, "c")
		if c == nil || b.evicted || !m[0].evicted || m[1].evicted || m[2].evicted {
			t.Fatalf("b %v m %v %v %v", b.evicted, m[0].evicted, m[1].evicted, m[2].evicted)
		}
	})
	t.Run("connections at work are kept", func(t *testing.T) {
		g := NewGate[string, int](2, 2)
		a, b := admit(t, g, "a"), admit(t, g, "a")
		a.slot.Work()
		c := admit(t, g, "a")
		if c == nil || a.evicted || !b.evicted {
			t.Fatalf("a %v b %v", a.evicted, b.evicted)
		}
		c.slot.Work()
		if admit(t, g, "a") != nil || admit(t, g, "z") != nil {
			t.Fatal("admitted with every slot at work")
		}
		c.slot.Wait()
		if admit(t, g, "z") == nil || !c.evicted {
			t.Fatal("a waiting slot did not make room")
		}
	})
	t.Run("leave and close", func(t *testing.T) {
		g := NewGate[string, int](2, 2)
		a := admit(t, g, "a")
		g.Leave(a.slot)
		g.Leave(a.slot)
		b := admit(t, g, "b")
		if g.Len() != 1 || g.Count("a") != 0 {
			t.Fatalf("len %d", g.Len())
		}
		g.Close()
		g.Close()
		if !b.evicted || admit(t, g, "c") != nil {
			t.Fatal("close: not evicted, or admitted after")
		}
	})
}

// TestGateConcurrent: admissions, leaves and evictions from many
// goroutines keep the counts within the bounds (run with -race).
func TestGateConcurrent(t *testing.T) {
	g := NewGate[int, int](16, 4)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 500 {
				s, ok := g.Admit(w%3, i, func() {})
				if ok {
					if i%2 == 0 {
						s.Work()
					}
					if n := g.Len(); n > 16 {
						t.Errorf("%d admitted", n)
					}
					g.Leave(s)
				}
			}
		})
	}
	wg.Wait()
	if g.Len() != 0 {
		t.Fatalf("%d left", g.Len())
	}
}
