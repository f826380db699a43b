package ebpf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func encode(t testing.TB, v any) []byte {
	var b bytes.Buffer
	if err := binary.Write(&b, binary.NativeEndian, v); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestDecodeRows(t *testing.T) {
	r := lanesRow{Cookie: 7, Family: 2, Lport: 80, Rport: 4242, State: 1, BytesAcked: 11, SrttUs: 250, MinRttUs: ^uint32(0),
		NowNs: 5e9, MstampUs: 4e6}
	copy(r.Laddr[:], []byte{10, 0, 0, 1})
	copy(r.Raddr[:], []byte{10, 0, 0, 2})
	buf := append(encode(t, r), encode(t, r)...)
	rows, err := decodeRows(buf)
	if err != nil || len(rows) != 2 || rows[1] != r {
		t.Fatalf("decodeRows: %v %+v", err, rows)
	}
	c := conn(&rows[0])
	if c.Local != netip.MustParseAddrPort("10.0.0.1:80") || c.Remote != netip.MustParseAddrPort("10.0.0.2:4242") ||
		c.State != Established || c.SRTT != 250*time.Microsecond || c.MinRTT != 0 || c.Idle != time.Second {
		t.Fatalf("conn %+v", c)
	}
	if _, err := decodeRows(buf[:len(buf)-1]); err == nil {
		t.Fatal("a cut row decoded")
	}
	if rowSize != 144 {
		t.Fatalf("struct row is %d bytes; lanes.bpf.c writes 144", rowSize)
	}
}

func TestDecodeEvent(t *testing.T) {
	e := lanesEvent{TsNs: 1e9, Cookie: 9, Kind: 1, OldState: 1, NewState: 8, Family: 10, Lport: 1, Rport: 2}
	copy(e.Laddr[:], netip.MustParseAddr("fd00::1").AsSlice())
	copy(e.Raddr[:], netip.MustParseAddr("::ffff:10.0.0.2").AsSlice())
	ev, err := decodeEvent(encode(t, e), 0)
	if err != nil || ev.Kind != StateChange || ev.Old != Established || ev.New != CloseWait || ev.Cookie != 9 ||
		ev.Local != netip.MustParseAddrPort("[fd00::1]:1") || ev.Remote != netip.MustParseAddrPort("10.0.0.2:2") || ev.Time.UnixNano() != 1e9 {
		t.Fatalf("decodeEvent: %v %+v", err, ev)
	}
	e.Kind = 9
	if _, err := decodeEvent(encode(t, e), 0); err == nil {
		t.Fatal("an unknown kind decoded")
	}
	if _, err := decodeEvent(make([]byte, eventSize-1), 0); err == nil {
		t.Fatal("a short event decoded")
	}
}

// FuzzDecode: whatever the kernel hands over, decoding returns an error
// or rows and events, never a panic.
func FuzzDecode(f *testing.F) {
	f.Add(encode(f, lanesRow{Cookie: 1, Family: 10}))
	f.Add(encode(f, lanesEvent{Kind: 2, Family: 2}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		if rows, err := decodeRows(b); err == nil {
			if len(rows)*rowSize != len(b) {
				t.Fatalf("%d rows from %d bytes", len(rows), len(b))
			}
			for i := range rows {
				conn(&rows[i])
			}
		}
		if len(b) >= rowSize {
			keyOf(b[:rowSize])
		}
		if ev, err := decodeEvent(b, 0); err == nil && ev.Kind != StateChange && ev.Kind != Retransmit {
			t.Fatalf("event of kind %v", ev.Kind)
		}
	})
}

func TestRowKey(t *testing.T) {
	r := lanesRow{Cookie: 1<<60 + 1, Inode: 1<<50 + 2, Cgroup: 1<<40 + 3, Lport: 0x1234, Rport: 0x5678, Watched: 1,
		State: 0xff, Family: 0xffff, RetransEvents: ^uint32(0)}
	want := rowKey{cookie: r.Cookie, inode: r.Inode, cgroup: r.Cgroup, lport: r.Lport, rport: r.Rport, watched: true}
	if k := keyOf(encode(t, r)); k != want {
		t.Fatalf("keyOf = %+v, want %+v: the offsets disagree with struct row", k, want)
	}
}

// TestNoBTF: a kernel without BTF gets ErrUnsupported naming it, before
// anything is loaded (root or not).
func TestNoBTF(t *testing.T) {
	defer func(p string) { btfPath = p }(btfPath)
	btfPath = "/nonexistent/vmlinux"
	tr, err := Open(Filter{})
	if err == nil {
		tr.Close()
		t.Fatal("Open without kernel BTF succeeded")
	}
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "CONFIG_DEBUG_INFO_BTF") {
		t.Fatalf("Open without BTF: %v", err)
	}
}
