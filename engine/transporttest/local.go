package transporttest

import (
	"crypto/sha256"
	"fmt"
	"sync"
	"testing"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
)

// localTarget is the target engine in this process (Run). Each
// incarnation publishes through its own view of the test's store, as a
// process would.
type localTarget struct {
	t     testing.TB
	f     Factory
	alloc func(int) (*engine.Memory, error)
	name  string

	mu    sync.Mutex
	st    *enginetest.MemStore
	e     *engine.Engine
	mems  []*engine.Memory // every region of every incarnation
	info  TargetInfo
	olds  []*enginetest.MemStore
	dying []*engine.Engine
}

func newLocalTarget(t testing.TB, st *enginetest.MemStore, f Factory, alloc func(int) (*engine.Memory, error), name string, size int) *localTarget {
	t.Helper()
	lt := &localTarget{t: t, f: f, alloc: alloc, name: name, st: st}
	if err := lt.start(size); err != nil {
		lt.close()
		t.Fatal(err)
	}
	return lt
}

// start makes a new incarnation. Called with lt.mu held or before lt is
// shared.
func (lt *localTarget) start(size int) error {
	e, err := engine.New(engine.Config{Name: lt.name, Store: lt.st})
	if err != nil {
		return err
	}
	lt.e = e
	if err := e.Install(lt.f(lt.t)); err != nil {
		return err
	}
	addr, err := lt.register(size)
	if err != nil {
		return err
	}
	lt.info = TargetInfo{Name: lt.name, Epoch: e.Epoch(), Addr: addr, Size: size}
	return nil
}

func (lt *localTarget) register(size int) (uint64, error) {
	m, err := lt.alloc(size)
	if err != nil {
		return 0, err
	}
	lt.mems = append(lt.mems, m)
	if err := lt.e.RegisterLocalMemory(m.Bytes(), "cpu:0"); err != nil {
		return 0, err
	}
	return engine.AddrOf(m.Bytes()), nil
}

// close closes every incarnation, then unmaps their memory.
func (lt *localTarget) close() {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	for _, e := range append(lt.dying, lt.e) {
		if err := e.Close(); err != nil {
			lt.t.Errorf("close target: %v", err)
		}
	}
	for _, st := range append(lt.olds, lt.st) {
		st.Close()
	}
	for _, m := range lt.mems {
		m.Close()
	}
	lt.mems = nil
}

func (lt *localTarget) Info() TargetInfo {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	return lt.info
}

func (lt *localTarget) mem(addr uint64, n int) ([]byte, error) {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	for _, m := range lt.mems {
		b := m.Bytes()
		base := engine.AddrOf(b)
		if addr >= base && n >= 0 && addr-base+uint64(n) <= uint64(len(b)) {
			return b[addr-base : addr-base+uint64(n)], nil
		}
	}
	return nil, fmt.Errorf("[%#x, +%d) is in no region of the target", addr, n)
}

func (lt *localTarget) Fill(addr uint64, n int, seed, pos uint64) error {
	b, err := lt.mem(addr, n)
	if err == nil {
		Pattern(b, seed, pos)
	}
	return err
}

func (lt *localTarget) Check(addr uint64, n int, seed, pos uint64) error {
	b, err := lt.mem(addr, n)
	if err == nil {
		err = CheckPattern(b, seed, pos)
	}
	return err
}

func (lt *localTarget) Hash(addr uint64, n int) ([32]byte, error) {
	b, err := lt.mem(addr, n)
	if err != nil {
		return [32]byte{}, err
	}
	return sha256.Sum256(b), nil
}

func (lt *localTarget) Register(size int) (uint64, error) {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	return lt.register(size)
}

func (lt *localTarget) Unregister(addr uint64) error {
	lt.mu.Lock()
	e := lt.e
	lt.mu.Unlock()
	return e.UnregisterLocalAddr(uintptr(addr))
}

func (lt *localTarget) CloseEngine() error {
	lt.mu.Lock()
	e := lt.e
	lt.mu.Unlock()
	return e.Close()
}

// Kill closes the target engine: in one process there is no harder death.
func (lt *localTarget) Kill() error { return lt.CloseEngine() }

// Restart closes the incarnation and starts a new one under the same
// name, with a fresh store view, transport and buffer. The old buffer
// stays mapped until the test ends, so its address is not reused.
func (lt *localTarget) Restart(size int) error {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	if err := lt.e.Close(); err != nil {
		return err
	}
	lt.dying = append(lt.dying, lt.e)
	lt.olds = append(lt.olds, lt.st)
	lt.st = lt.st.Process()
	return lt.start(size)
}
