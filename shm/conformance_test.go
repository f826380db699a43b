package shm

import (
	"os"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/transporttest"
)

func TestMain(m *testing.M) {
	runChildIfAsked()
	transporttest.ServeTargetIfChild(func() engine.Transport { return New(Config{IOTimeout: 2 * time.Second}) })
	os.Exit(m.Run())
}

func factory(testing.TB) engine.Transport { return New(Config{IOTimeout: 2 * time.Second}) }

// TestConformance runs the suite with the target in a child process: the
// way shm is used, two processes on one host.
func TestConformance(t *testing.T) {
	transporttest.RunWith(t, factory, transporttest.Options{Shared: true, Remote: true})
}

// TestConformanceInProcess runs it with both engines in this process.
func TestConformanceInProcess(t *testing.T) {
	transporttest.RunWith(t, factory, transporttest.Options{Shared: true})
}
