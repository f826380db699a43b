package rdma_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/rdma"
	"github.com/rdmago/te/segment"
)

// TestCloseAfterFailedInstall: a host without the named device fails
// Install with the cause; Close afterwards (twice) returns without a
// panic, and Install after Close fails with ErrClosed. This needs no
// device, so it runs on every host.
func TestCloseAfterFailedInstall(t *testing.T) {
	e, err := engine.New(engine.Config{Name: "lifecycle", Store: enginetest.NewMemStore()})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	tr := rdma.New(rdma.Config{Devices: []string{"no-such-rdma-device0"}})
	err = e.Install(tr)
	if err == nil {
		t.Fatal("Install on a missing device succeeded")
	}
	t.Logf("Install: %v", err)
	for i := 0; i < 2; i++ {
		if err := tr.Driver().Close(); err != nil {
			t.Fatalf("Close #%d after a failed Install: %v", i+1, err)
		}
	}
	if err := e.Install(tr); !errors.Is(err, engine.ErrClosed) {
		t.Fatalf("Install after Close: %v, want ErrClosed", err)
	}
}

// TestCloseWithoutInstall: Close of a transport never installed is a no-op.
func TestCloseWithoutInstall(t *testing.T) {
	tr := rdma.New(rdma.Config{})
	if err := tr.Driver().Close(); err != nil {
		t.Fatal(err)
	}
	if err := tr.Driver().Close(); err != nil {
		t.Fatal(err)
	}
}

// TestConnectBeforeInstall: Connect on a transport never installed (or
// whose Install failed) fails with an error instead of building a peer on
// rails it does not have.
func TestConnectBeforeInstall(t *testing.T) {
	d := &segment.Descriptor{Name: "peer", Epoch: 1, Version: 1,
		Buffers: []segment.Buffer{{Addr: 1 << 20, Length: 4096}},
		Protocols: []segment.Protocol{{Name: segment.ProtoRDMA, Endpoint: "127.0.0.1:1",
			RDMA: &segment.RDMA{Devices: []segment.Device{{Name: "rxe0"}}, RKeys: [][]uint32{{7}}}}}}
	failed := rdma.New(rdma.Config{Devices: []string{"no-such-rdma-device0"}})
	e, err := engine.New(engine.Config{Name: "lifecycle", Store: enginetest.NewMemStore()})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := e.Install(failed); err == nil {
		t.Fatal("Install on a missing device succeeded")
	}
	for _, tr := range []*rdma.Transport{rdma.New(rdma.Config{}), failed} {
		p, err := tr.Driver().Connect(context.Background(), d)
		if err == nil || !strings.Contains(err.Error(), "not installed") {
			t.Errorf("Connect before Install: %v, %v; want an error saying it is not installed", p, err)
		}
		if err := tr.Driver().Close(); err != nil {
			t.Fatal(err)
		}
	}
}
