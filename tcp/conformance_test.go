package tcp

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rdmago/te/auth"
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

// TestConformanceAuth runs it across processes with a cluster secret on
// both sides, so every connection, the ones after a restart included,
// opens with the authenticated handshake; an initiator without the secret
// is refused by the same target.
func TestConformanceAuth(t *testing.T) {
	// Fixed: the target child process builds the same one.
	secret, err := auth.New([]byte("transporttest conformance key, for tests only"))
	if err != nil {
		t.Fatal(err)
	}
	f := func(testing.TB) engine.Transport { return New(Config{IOTimeout: 2 * time.Second, Auth: secret}) }
	t.Run("Suite", func(t *testing.T) { transporttest.RunRemote(t, f, conformanceOptions) })
	t.Run("NoSecret", func(t *testing.T) {
		const size = 1 << 20
		tg := transporttest.StartTarget(t, f, transporttest.TargetConfig{Size: size})
		ini := transporttest.Initiator(t, transporttest.Options{}, nil, size, conformanceFactory)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		seg, err := ini.Engine.OpenSegment(ctx, tg.Name(), nil)
		if err == nil {
			err = ini.Engine.Transfer(ctx, []engine.Request{{Op: engine.Write, Local: ini.Mem.Bytes()[:4096], Target: seg, TargetAddr: tg.Base()}})
		}
		if !errors.Is(err, auth.ErrDenied) {
			t.Fatalf("an initiator without the secret: %v, want auth.ErrDenied", err)
		}
		t.Log(err)
	})
}
