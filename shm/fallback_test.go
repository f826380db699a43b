package shm

import (
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/internal/testenv"
	"github.com/rdmago/te/tcp"
)

// TestFallbackToTCP: a same-host target whose shm server refuses this
// initiator (it demands a secret the initiator lacks) is still reached:
// the engine falls back to tcp, which the target also offers, logs it
// once, and reports tcp as the transport that carried the bytes.
func TestFallbackToTCP(t *testing.T) {
	st := enginetest.NewMemStore()
	defer st.Close()
	ctx := ctxT(t, 30*time.Second)
	secret, err := auth.New([]byte("the cluster secret, 32 bytes ok"))
	if err != nil {
		t.Fatal(err)
	}
	tgt := enginetest.NewNode(t, engine.Config{Name: "tgt", Store: st}, 0, tcp.New(tcp.Config{}), New(Config{Secret: secret}))
	tmem, err := engine.AllocShared(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tmem.Close() })
	if err := tgt.Engine.RegisterLocalMemory(tmem.Bytes(), ""); err != nil {
		t.Fatal(err)
	}

	var log testenv.Buffer
	sh := New(Config{})
	ini := enginetest.NewNode(t, engine.Config{Name: "ini", Store: st, Logger: slog.New(slog.NewTextHandler(&log, nil))}, 0, tcp.New(tcp.Config{}), sh)
	mem, err := engine.AllocShared(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	if err := ini.Engine.RegisterLocalMemory(mem.Bytes(), ""); err != nil {
		t.Fatal(err)
	}
	e := ini.Engine
	seg, err := e.OpenSegment(ctx, "tgt", nil)
	if err != nil {
		t.Fatalf("open a target whose shm refuses: %v", err)
	}
	if got, _ := e.SegmentTransports(seg); !slices.Equal(got, []string{"tcp", "shm"}) {
		t.Errorf("SegmentTransports = %v, want [tcp shm]", got)
	}
	copy(mem.Bytes(), "over tcp after shm refused")
	for range 3 {
		b, err := e.AllocateBatch(1)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Submit(b, []engine.Request{{Op: engine.Write, Local: mem.Bytes()[:4096], Target: seg, TargetAddr: engine.AddrOf(tmem.Bytes())}}); err != nil {
			t.Fatal(err)
		}
		if err := e.Wait(ctx, b); err != nil {
			t.Fatal(err)
		}
		bs, _ := e.BatchStatus(b)
		if bs.Transport != "tcp" || bs.Transferred != 4096 {
			t.Errorf("batch: %+v, want 4096 bytes over tcp", bs)
		}
		e.FreeBatch(b)
	}
	if !strings.HasPrefix(string(tmem.Bytes()), "over tcp after shm refused") {
		t.Error("target memory not written")
	}
	if n := strings.Count(log.String(), "falling back"); n != 1 || !strings.Contains(log.String(), "transport=shm next=tcp") {
		t.Errorf("%d fallback lines, want one from shm to tcp:\n%s", n, log.String())
	}
	if sh.Stats().Peers != 0 {
		t.Errorf("shm holds %d peers after its refusal", sh.Stats().Peers)
	}
}
