package shm

import (
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/transporttest"
)

// TestNotify runs the notification cases over shm: notes follow the
// copies, failures are not notified, the target's bounds hold, a
// restarted sender's notes are dropped.
func TestNotify(t *testing.T) {
	transporttest.RunNotify(t, func(testing.TB) engine.Transport {
		return New(Config{IOTimeout: time.Second})
	}, transporttest.Options{Shared: true})
}
