package diagnose_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/internal/diagnose"
	"github.com/rdmago/te/segment"
)

// A segment that offers only rdma, seen from a host whose rdma transport
// could not be installed: the transport layer says why and what to do.
func TestNoCommonTransport(t *testing.T) {
	st := enginetest.NewMemStore()
	defer st.Close()
	owner := st.Process()
	defer owner.Close()
	d := &segment.Descriptor{Name: "rdma-only", Epoch: 7, Version: 1,
		Protocols: []segment.Protocol{{Name: segment.ProtoRDMA, Endpoint: "10.0.0.2:4000", RDMA: &segment.RDMA{
			Devices: []segment.Device{{Name: "mlx5_0", Port: 1, GID: "::ffff:10.0.0.2", MTU: 4096}},
			RKeys:   [][]uint32{{0x11}}}}},
		Buffers: []segment.Buffer{{Addr: 1 << 30, Length: 1 << 20}}}
	if err := owner.Publish(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	ini := initiator(t, st)
	noDev := errors.New("no RDMA devices found")
	rep := run(t, diagnose.Config{Engine: ini.Engine, Store: st, Segment: "rdma-only", Local: ini.Mem.Bytes(),
		Missing: map[string]error{segment.ProtoRDMA: noDev}})
	c := failedAt(t, rep, diagnose.LayerTransport, engine.ErrNoTransport, "the segment offers rdma, this side has tcp", "rdma (no RDMA devices found)")
	if !errors.Is(c.Err, noDev) || !strings.Contains(c.Fix, "te devices") {
		t.Errorf("transport: err %v, fix %q", c.Err, c.Fix)
	}
	rep = run(t, diagnose.Config{Engine: ini.Engine, Store: st, Segment: "rdma-only", Local: ini.Mem.Bytes(), Protocol: segment.ProtoRDMA,
		Missing: map[string]error{segment.ProtoRDMA: noDev}})
	failedAt(t, rep, diagnose.LayerTransport, engine.ErrNoTransport, "rdma is not installed here (no RDMA devices found)")
}
