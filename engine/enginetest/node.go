package enginetest

import (
	"testing"

	"github.com/rdmago/te/engine"
)

// Node is an engine with its transports installed and, optionally, one
// registered buffer of mmap'd memory: the building block of engine and
// transport tests.
type Node struct {
	Engine *engine.Engine
	// Mem is the registered buffer; nil when none was asked for.
	Mem *engine.Memory
}

// NewNode starts an engine with cfg, installs trs in order and registers
// memSize bytes of fresh memory (none when memSize is 0). When the test ends the
// engine is closed (an error from Close fails the test), then the memory
// is unmapped.
func NewNode(t testing.TB, cfg engine.Config, memSize int, trs ...engine.Transport) *Node {
	t.Helper()
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	n := &Node{Engine: e}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("close %s: %v", cfg.Name, err)
		}
		n.Mem.Close()
	})
	for _, tr := range trs {
		if err := e.Install(tr); err != nil {
			t.Fatal(err)
		}
	}
	if memSize > 0 {
		if n.Mem, err = engine.Alloc(memSize); err != nil {
			t.Fatal(err)
		}
		if err := e.RegisterLocalMemory(n.Mem.Bytes(), "cpu:0"); err != nil {
			t.Fatal(err)
		}
	}
	return n
}
