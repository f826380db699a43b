package p2p

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/rdmago/te/mooncake"
	"github.com/rdmago/te/segment"
)

// echoHandler answers as Mooncake's passive side does: its own half of the
// endpoint, the NIC paths swapped, QP numbers of its own; it refuses a
// record without QP numbers.
type echoHandler struct {
	mu   sync.Mutex
	from netip.Addr
	reqs []mooncake.Handshake
}

func (h *echoHandler) HandleConnection(_ context.Context, from netip.Addr, req *mooncake.Handshake) *mooncake.Handshake {
	h.mu.Lock()
	h.from = from
	h.reqs = append(h.reqs, *req)
	h.mu.Unlock()
	rep := &mooncake.Handshake{LocalNICPath: req.PeerNICPath, PeerNICPath: req.LocalNICPath,
		LocalGID: netip.MustParseAddr("::ffff:10.0.1.2"), QPNums: []uint32{0x21, 0x22}, ReadyAckSupported: true}
	if len(req.QPNums) == 0 {
		rep.ReplyMsg = "no QPs"
		rep.QPNums = nil
	}
	return rep
}

// TestConnectionHandler: a Connection message, written byte for byte as a
// Mooncake initiator writes it, reaches the handler with its fields and
// the sender's address, and the reply is the handler's record in
// Mooncake's form; SendConnection speaks the same exchange as the active
// side, ready-ack included, and returns a refusal as a record.
func TestConnectionHandler(t *testing.T) {
	s := newStore(t, Options{})
	var h echoHandler
	s.HandleConnections(&h)
	addr := s.ListenAddr().String()
	active := []byte(`{"local_gid":"00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:01:01","local_lid":0,"local_nic_path":"10.0.1.1:15001@rxe0","payload":"","peer_nic_path":"10.0.1.2:16002@rxe1","qp_num":[17,18],"ready_ack":false,"reply_msg":""}` + "\n")
	out := rawExchange(t, addr, AppendMessage(nil, Connection, active), false)
	want := `{"local_gid":"00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:01:02","local_lid":0,"local_nic_path":"10.0.1.2:16002@rxe1","payload":"","peer_nic_path":"10.0.1.1:15001@rxe0","qp_num":[33,34],"ready_ack":false,"reply_msg":""}` + "\n"
	if !bytes.Equal(out, AppendMessage(nil, Connection, []byte(want))) {
		t.Fatalf("reply %q\nwant   %q", out, want)
	}
	h.mu.Lock()
	got := h.reqs[0]
	from := h.from
	h.mu.Unlock()
	if from != netip.MustParseAddr("127.0.0.1") || got.LocalNICPath != "10.0.1.1:15001@rxe0" || got.PeerNICPath != "10.0.1.2:16002@rxe1" ||
		got.LocalGID != netip.MustParseAddr("::ffff:10.0.1.1") || len(got.QPNums) != 2 || got.QPNums[1] != 18 || !got.ReadyAckSupported || got.ReadyAck {
		t.Fatalf("handler saw %+v from %v", got, from)
	}

	ctx := context.Background()
	req := &mooncake.Handshake{LocalNICPath: "a:1@d0", PeerNICPath: "b:2@d1", LocalGID: netip.MustParseAddr("fe80::1"), QPNums: []uint32{5, 6}, ReadyAckSupported: true}
	rep, err := SendConnection(ctx, addr, req, time.Second)
	if err != nil || rep.ReplyMsg != "" || rep.LocalNICPath != "b:2@d1" || rep.PeerNICPath != "a:1@d0" || len(rep.QPNums) != 2 || !rep.ReadyAckSupported {
		t.Fatalf("SendConnection: %+v %v", rep, err)
	}
	req.ReadyAck = true
	if rep, err := SendConnection(ctx, addr, req, time.Second); err != nil || rep.ReplyMsg != "" {
		t.Fatalf("ready ack: %+v %v", rep, err)
	}
	h.mu.Lock()
	if n := len(h.reqs); n != 3 || !h.reqs[2].ReadyAck {
		t.Fatalf("handler saw %d records, last %+v", n, h.reqs[n-1])
	}
	h.mu.Unlock()
	if rep, err := SendConnection(ctx, addr, &mooncake.Handshake{LocalNICPath: "a:1@d0", PeerNICPath: "b:2@d1"}, time.Second); err != nil || rep.ReplyMsg != "no QPs" {
		t.Fatalf("refusal: %+v %v", rep, err)
	}

	// Without a handler again: refused, as before.
	s.HandleConnections(nil)
	if rep, err := SendConnection(ctx, addr, req, time.Second); err != nil || rep.ReplyMsg == "" {
		t.Fatalf("without a handler: %+v %v", rep, err)
	}
}

// TestSendConnectionBadReplies: a peer that answers with another type,
// with a record Mooncake would not write, or not at all fails cleanly
// within the bound.
func TestSendConnectionBadReplies(t *testing.T) {
	req := &mooncake.Handshake{LocalNICPath: "a:1@d0", PeerNICPath: "b:2@d1", QPNums: []uint32{1, 2}}
	for name, c := range map[string]struct {
		reply []byte
		want  error
	}{
		"metadata type": {AppendMessage(nil, Metadata, []byte("{}")), segment.ErrUnavailable},
		"bad record":    {AppendMessage(nil, Connection, []byte(`{"qp_num":[16777216]}`)), mooncake.ErrHandshake},
		"not json":      {AppendMessage(nil, Connection, []byte(`x`)), mooncake.ErrHandshake},
		"silent":        {nil, segment.ErrUnavailable},
	} {
		t.Run(name, func(t *testing.T) {
			addr := fakeTarget(t, c.reply)
			start := time.Now()
			_, err := SendConnection(context.Background(), addr, req, 300*time.Millisecond)
			if !errors.Is(err, c.want) {
				t.Fatalf("err %v, want %v", err, c.want)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("took %v", d)
			}
		})
	}
	if _, err := SendConnection(context.Background(), "nohost", req, time.Second); !errors.Is(err, segment.ErrNotFound) {
		t.Fatalf("bad address: %v", err)
	}
}
