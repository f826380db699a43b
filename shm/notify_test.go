package shm

import (
	"fmt"
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

// BenchmarkNotify: as tcp's.
func BenchmarkNotify(b *testing.B) {
	for _, c := range []struct{ tasks, size int }{{1, 4096}, {128, 4096}, {128, 64 << 10}, {64, 1 << 20}} {
		b.Run(fmt.Sprintf("%dx%d", c.tasks, c.size), func(b *testing.B) {
			transporttest.BenchNotify(b, func(testing.TB) engine.Transport { return New(Config{}) }, transporttest.Options{Shared: true}, c.tasks, c.size)
		})
	}
}
