package tcp

import (
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/transporttest"
)

func conformanceFactory(testing.TB) engine.Transport {
	return New(Config{IOTimeout: 2 * time.Second})
}

// conformanceOptions states the tcp transport's bound for a dead peer: a
// killed process's sockets are reset by its kernel at once, a closed
// engine closes them, so only a silent peer waits for IOTimeout (2 s here).
var conformanceOptions = transporttest.Options{DeadPeer: 10 * time.Second}

// TestConformance runs the suite with both engines in this process.
func TestConformance(t *testing.T) {
	transporttest.Run(t, conformanceFactory, conformanceOptions)
}

// TestConformanceRemote runs it with the target in a child process,
// reached through the embedded p2p store.
func TestConformanceRemote(t *testing.T) {
	transporttest.RunRemote(t, conformanceFactory, conformanceOptions)
}
