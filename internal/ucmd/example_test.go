package ucmd_test

import (
	"fmt"

	"github.com/rdmago/te/internal/uapi"
	"github.com/rdmago/te/internal/ucmd"
)

// ExampleBuilder encodes a CQ destroy ioctl: an IDR handle (length 0, handle
// in data) and a PTR_OUT response buffer (always passed by address).
func ExampleBuilder() {
	buf := make([]byte, 4096)
	const base = 0x10000 // the buffer's address as the kernel would see it
	b := ucmd.NewBuilder(buf, base, uapi.DriverRXE, uapi.ObjectCQ, uapi.MethodCQDestroy)
	b.IDR(uapi.AttrDestroyCQHandle, 7, uapi.AttrFMandatory)
	out := b.Out(uapi.AttrDestroyCQResp, 8, uapi.AttrFMandatory)
	n, err := b.Finish()
	fmt.Println(n, err)
	fmt.Printf("hdr   % x\n", buf[:24])
	fmt.Printf("attr0 % x\n", buf[24:40])
	fmt.Printf("attr1 % x\n", buf[40:56])
	fmt.Println(len(b.Output(out)))
	// Output:
	// 56 <nil>
	// hdr   38 00 03 00 01 00 02 00 00 00 00 00 00 00 00 00 0e 00 00 00 00 00 00 00
	// attr0 00 00 00 00 01 00 00 00 07 00 00 00 00 00 00 00
	// attr1 01 00 08 00 01 00 00 00 00 02 01 00 00 00 00 00
	// 8
}
