package shm

import (
	"bytes"
	"context"
	"net"
	"os"
	"testing"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/internal/control"
	"github.com/rdmago/te/internal/uds"
)

// FuzzMessages: every decoder of control packets rejects or accepts any
// bytes without panicking, and what it accepts encodes back to the same
// packet.
func FuzzMessages(f *testing.F) {
	f.Add(welcome{maps: 2, slots: maxSlots, ctlSize: 1 << 15}.append(nil))
	f.Add(mapMsg{slot: 1, gen: 2, addr: 0x7f0000000000, n: 4096, off: 8192}.append(nil))
	f.Add(appendUnmap(nil, 3, 4))
	f.Add(appendRange(nil, msgMapReq, 0x1000, 64))
	f.Add(appendRefused(nil, "no"))
	f.Add(appendNoteLost(nil, 7, noteStale))
	f.Add(proto.Append(nil, msgNoteBell, 0, nil))
	f.Add(proto.Append(nil, msgHello, 0, auth.AppendHello(nil, auth.Hello{Proto: "shm"})))
	f.Fuzz(func(t *testing.T, pkt []byte) {
		h, p, err := control.ParsePacket(&proto, pkt)
		if err != nil {
			return
		}
		typ := h.Type
		var back []byte
		switch typ {
		case msgWelcome:
			if w, err := parseWelcome(p); err == nil {
				back = w.append(nil)
			}
		case msgMap:
			if m, err := parseMap(p); err == nil {
				back = m.append(nil)
			}
		case msgUnmap:
			if s, g, err := parseUnmap(p); err == nil {
				back = appendUnmap(nil, s, g)
			}
		case msgMapReq, msgNoMap:
			if a, n, err := parseRange(p); err == nil {
				back = appendRange(nil, typ, a, n)
			}
		case msgRefused:
			if r, err := parseRefused(p); err == nil {
				back = appendRefused(nil, r)
			}
		case msgNoteLost:
			if id, st, err := parseNoteLost(p); err == nil {
				back = appendNoteLost(nil, id, st)
			}
		case handshake.Hello:
			auth.ParseHello(p)
		}
		if back != nil && !bytes.Equal(back, pkt) {
			t.Fatalf("%x decoded and encoded to %x", pkt, back)
		}
	})
}

// TestHostilePackets: malformed or out-of-order packets, and packets with
// descriptors attached, get a connection closed, never a crash or a
// leaked descriptor, and the target keeps serving.
func TestHostilePackets(t *testing.T) {
	ini, tgt, _, ttr, seg := inProcessPair(t, 1<<20, Config{IOTimeout: time.Second})
	base := engine.AddrOf(tgt.Mem.Bytes())
	d := tgt.Engine.LocalDescriptor()
	goodHello := proto.Append(nil, msgHello, 0, auth.AppendHello(nil, auth.Hello{Proto: "shm",
		Initiator: auth.Party{Name: "x"}, Target: auth.Party{Name: d.Name, Epoch: d.Epoch}}))
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	fds0 := openFDs(t)
	for name, pkts := range map[string][][]byte{
		"garbage":           {[]byte("GET / HTTP/1.0\r\n\r\n")},
		"bad magic":         {append([]byte("XXXX"), goodHello[4:]...)},
		"short":             {goodHello[:10]},
		"length mismatch":   {append(bytes.Clone(goodHello), 0)},
		"map request first": {appendRange(nil, msgMapReq, base, 64)},
		"wrong target": {proto.Append(nil, msgHello, 0, auth.AppendHello(nil, auth.Hello{Proto: "shm",
			Target: auth.Party{Name: "someone-else"}}))},
		"stale epoch": {proto.Append(nil, msgHello, 0, auth.AppendHello(nil, auth.Hello{Proto: "shm",
			Target: auth.Party{Name: d.Name, Epoch: d.Epoch + 2}}))},
		"hello twice":        {goodHello, goodHello},
		"map from initiator": {goodHello, mapMsg{slot: 1, gen: 1, addr: 1, n: 1}.append(nil)},
	} {
		c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: ttr.Endpoint(), Net: "unixpacket"})
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		for _, p := range pkts {
			// Attach a descriptor: the target must close it.
			uds.Send(c, p, []int{int(null.Fd())})
		}
		// Read until the target closes (answers like CHALLENGE or
		// REFUSED may come first).
		buf := make([]byte, maxPacket)
		for {
			n, fds, err := uds.Recv(c, buf, 4)
			uds.Close(fds)
			if err != nil || n == 0 {
				if err != nil && os.IsTimeout(err) {
					t.Errorf("%s: the target kept the connection open", name)
				}
				break
			}
		}
		c.Close()
	}
	eventually(t, 5*time.Second, "hostile connections dropped", func() bool { return ttr.Stats().Served == 1 })
	eventually(t, 5*time.Second, "descriptors back to where they were", func() bool { return openFDs(t) <= fds0 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ini.Engine.Transfer(ctx, []engine.Request{{Op: engine.Write, Local: ini.Mem.Bytes()[:64], Target: seg, TargetAddr: base}}); err != nil {
		t.Fatal("after hostile peers:", err)
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}
