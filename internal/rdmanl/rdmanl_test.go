package rdmanl

import (
	"testing"
)

func TestEncodeParseRoundTrip(t *testing.T) {
	var a []byte
	a = attr(a, attrDevIndex, u32(3))
	a = attr(a, attrChardevTyp, cstr("uverbs"))
	req := request(msgType(cmdGetChardev), 5, 9, a)
	if le.Uint32(req) != uint32(len(req)) || le.Uint16(req[4:]) != 5<<10|15 || len(req)%4 != 0 {
		t.Fatalf("request % x", req)
	}
	// A reply as the kernel sends it: uverbs1, ABI 2, dev 231:193, driver 14.
	var r []byte
	r = attr(r, attrChardevNam, cstr("uverbs1"))
	r = attr(r, attrChardevABI, le.AppendUint64(nil, 2))
	r = attr(r, attrChardev, le.AppendUint64(nil, 231<<8|193))
	r = attr(r, attrDriverID, u32(14))
	ms, err := parse(append(append(request(msgType(cmdGetChardev), 0, 2, r), request(nlmsgError, 0, 2, make([]byte, 4))...),
		request(nlmsgDone, 2, 2, make([]byte, 4))...)) // NLMSG_DONE carries a 4-byte int, not attributes
	if err != nil || len(ms) != 3 || ms[1].typ != nlmsgError || ms[1].errno != 0 || ms[2].typ != nlmsgDone {
		t.Fatalf("parse: %v %+v", err, ms)
	}
	c, err := chardevFrom(ms[0])
	if err != nil || c != (Chardev{Name: "uverbs1", ABI: 2, Major: 231, Minor: 193, DriverID: 14}) {
		t.Fatalf("chardev %+v %v", c, err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add(request(msgType(cmdGet), 0, 1, attr(nil, attrDevName, cstr("rxe0"))))
	f.Add([]byte{16, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		ms, _ := parse(b)
		for _, m := range ms {
			chardevFrom(m)
			str(m.attrs[attrDevName])
		}
	})
}
