package ucmd

import (
	"encoding/hex"
	"errors"
	"testing"

	"github.com/rdmago/te/internal/uapi"
)

const base = 0x7f0000001000

func TestEncodeWriteCreateCQ(t *testing.T) {
	buf := make([]byte, 4096)
	req := uapi.CreateCQ{UserHandle: 0x1122334455667788, CQE: 100, CompVector: 0, CompChannel: -1}
	n, err := EncodeWrite(buf, base, uapi.CmdCreateCQ, Bytes(&req), nil, 8, 16)
	if err != nil {
		t.Fatal(err)
	}
	// cmd 18, in_words (8+32)/4 = 10, out_words (8+16)/4 = 6; response pointer = base+2048.
	want := "12000000" + "0a00" + "0600" +
		"00180000007f0000" + "8877665544332211" + "64000000" + "00000000" + "ffffffff" + "00000000"
	if got := hex.EncodeToString(buf[:n]); got != want {
		t.Fatalf("encoded\n got %s\nwant %s", got, want)
	}
}

func TestEncodeWriteNoResponse(t *testing.T) {
	buf := make([]byte, 4096)
	req := uapi.ReqNotifyCQ{CQHandle: 7, SolicitedOnly: 1}
	n, err := EncodeWrite(buf, base, uapi.CmdReqNotifyCQ, Bytes(&req), nil, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := hex.EncodeToString(buf[:n]), "17000000"+"0400"+"0000"+"07000000"+"01000000"; got != want {
		t.Fatalf("got %s want %s", got, want)
	}
	// The response pointer must exist when a response is wanted.
	if _, err := EncodeWrite(buf, base, uapi.CmdReqNotifyCQ, Bytes(&req)[:4], nil, 4, 0); err == nil {
		t.Fatal("response without response field accepted")
	}
	// Driver data directly follows the core request; lengths are 4-byte words.
	if _, err := EncodeWrite(buf, base, 1, make([]byte, 8), []byte{1, 2, 3}, 0, 0); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("unaligned length: %v", err)
	}
}

func TestEncodeWriteDriverData(t *testing.T) {
	buf := make([]byte, 4096)
	for i := range buf {
		buf[i] = 0xee // stale bytes must be cleared
	}
	req := uapi.GetContext{}
	drv := make([]byte, 32)
	drv[0] = 16
	n, err := EncodeWrite(buf, base, uapi.CmdGetContext, Bytes(&req), drv, 8, 72)
	if err != nil {
		t.Fatal(err)
	}
	if n != 48 || le.Uint16(buf[4:]) != 12 || le.Uint16(buf[6:]) != 20 || buf[16] != 16 || le.Uint64(buf[8:]) != base+2048 {
		t.Fatalf("mlx5-style GET_CONTEXT: n %d in %d out %d drv %d", n, le.Uint16(buf[4:]), le.Uint16(buf[6:]), buf[16])
	}
	for i, b := range Response(buf, 80) {
		if b != 0 {
			t.Fatalf("response byte %d not cleared", i)
		}
	}
}

func TestEncodeWriteEx(t *testing.T) {
	buf := make([]byte, 4096)
	req := make([]byte, 8) // ib_uverbs_ex_query_device{comp_mask 0, reserved 0}
	n, err := EncodeWriteEx(buf, base, uapi.CmdExQueryDevice, req, nil, 304, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := "01000080" + "0100" + "2600" + // in_words 1 (8-byte words), out_words 304/8 = 38
		"00180000007f0000" + "0000" + "0000" + "00000000" + // ex hdr: response, provider words, reserved
		"0000000000000000"
	if got := hex.EncodeToString(buf[:n]); got != want || n != 32 {
		t.Fatalf("got %s (%d)\nwant %s", got, n, want)
	}
	if _, err := EncodeWriteEx(buf, base, uapi.CmdQueryDevice, req, nil, 8, 0); err == nil {
		t.Fatal("non-extended command accepted")
	}
	if _, err := EncodeWriteEx(buf, base, uapi.CmdExCreateQP, make([]byte, 12), nil, 8, 0); err == nil {
		t.Fatal("request not a multiple of 8 accepted")
	}
	n, err = EncodeWriteEx(buf, base, uapi.CmdExCreateCQ, make([]byte, 32), make([]byte, 16), 16, 8)
	if err != nil || le.Uint16(buf[16:]) != 2 || le.Uint16(buf[18:]) != 1 || n != 24+48 {
		t.Fatalf("provider words: %v n %d in %d out %d", err, n, le.Uint16(buf[16:]), le.Uint16(buf[18:]))
	}
}

func TestIoctlBuilder(t *testing.T) {
	buf := make([]byte, 8192)
	b := NewBuilder(buf, base, uapi.DriverRXE, uapi.ObjectCQ, uapi.MethodCQCreate)
	iH := b.NewIDR(uapi.AttrCreateCQHandle, uapi.AttrFMandatory)
	b.InU32(uapi.AttrCreateCQCQE, 100, uapi.AttrFMandatory)
	b.InU64(uapi.AttrCreateCQUserHandle, 0xabcdef, uapi.AttrFMandatory)
	b.FD(uapi.AttrCreateCQCompChannel, 9, uapi.AttrFMandatory)
	iOut := b.Out(uapi.AttrCreateCQRespCQE, 4, uapi.AttrFMandatory)
	iBig := b.In(uapi.AttrUHWIn, make([]byte, 24), 0)
	if b.UHWOut(0) != -1 || b.UHWIn(nil) != -1 {
		t.Fatal("empty UHW attributes must be omitted")
	}
	iUOut := b.UHWOut(16)
	n, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	if n != 24+16*7 || le.Uint16(buf[0:]) != uint16(n) || le.Uint16(buf[2:]) != uapi.ObjectCQ ||
		le.Uint16(buf[4:]) != uapi.MethodCQCreate || le.Uint16(buf[6:]) != 7 || le.Uint32(buf[16:]) != 14 {
		t.Fatalf("header %x", buf[:24])
	}
	attr := func(i int) []byte { return buf[24+16*i : 40+16*i] }
	wantAttrs := []string{
		"0000" + "0000" + "0100" + "0000" + "0000000000000000", // IDR NEW: len 0, data 0
		"0100" + "0400" + "0100" + "0000" + "6400000000000000", // u32 inline
		"0200" + "0800" + "0100" + "0000" + "efcdab0000000000", // u64 inline
		"0300" + "0000" + "0100" + "0000" + "0900000000000000", // fd
		"0600" + "0400" + "0100" + "0000" + "00120000007f0000", // PTR_OUT: always by address (base+512)
		"0010" + "1800" + "0000" + "0000" + "08120000007f0000", // PTR_IN > 8 bytes: by address
		"0110" + "1000" + "0000" + "0000" + "20120000007f0000", // UHW_OUT
	}
	for i, w := range wantAttrs {
		if got := hex.EncodeToString(attr(i)); got != w {
			t.Errorf("attr %d\n got %s\nwant %s", i, got, w)
		}
	}
	// Simulate the kernel writing back a handle and an output.
	le.PutUint64(attr(iH)[8:], 5)
	le.PutUint16(attr(iOut)[4:], uapi.AttrFMandatory|uapi.AttrFValidOutput)
	le.PutUint32(buf[512:], 127)
	if b.Data(iH) != 5 || le.Uint32(b.Output(iOut)) != 127 || b.Flags(iOut)&uapi.AttrFValidOutput == 0 {
		t.Fatal("reading outputs back failed")
	}
	if len(b.Output(iUOut)) != 16 || len(b.Output(iBig)) != 24 || b.Output(-1) != nil {
		t.Fatal("output slicing")
	}
}

func TestIoctlBuilderLimits(t *testing.T) {
	buf := make([]byte, 1024)
	b := NewBuilder(buf, base, 1, 0, 0)
	for i := 0; i < MaxAttrs+1; i++ {
		b.Const(uint16(i), 1, 0)
	}
	if _, err := b.Finish(); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("too many attrs: %v", err)
	}
	b.Reset(buf, base, 1, 0, 0)
	b.Out(1, 1000, 0)
	if _, err := b.Finish(); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("payload overflow: %v", err)
	}
}

func FuzzBuilderOutput(f *testing.F) {
	f.Add(uint16(4), uint64(base+512), uint16(3))
	f.Fuzz(func(t *testing.T, n uint16, data uint64, count uint16) {
		buf := make([]byte, 2048)
		b := NewBuilder(buf, base, 1, 0, 0)
		b.Out(1, 8, 0)
		// A kernel (or corruption) rewriting the attribute must never make
		// Output slice outside the buffer.
		le.PutUint16(buf[24+2:], n)
		le.PutUint64(buf[24+8:], data)
		out := b.Output(0)
		if out != nil && (len(out) != int(n)) {
			t.Fatalf("output of %d bytes for len %d", len(out), n)
		}
		_ = count
	})
}
