// Package rdmanl speaks RDMA netlink (NETLINK_RDMA, the NLDEV client) for
// what sysfs does not say: the uverbs driver id of a device
// (RDMA_NLDEV_CMD_GET_CHARDEV), the value every RDMA_VERBS_IOCTL header
// must carry.
package rdmanl

import (
	"encoding/binary"
	"errors"
	"fmt"
)

var le = binary.LittleEndian

// Message types and attributes (rdma_netlink.h).
const (
	nlNLDev        = 5
	cmdGet         = 1
	cmdGetChardev  = 15
	cmdNewLink     = 3
	cmdDelLink     = 4
	attrNdevName   = 51
	attrLinkType   = 65
	attrDevIndex   = 1
	attrDevName    = 2
	attrChardevTyp = 69
	attrChardevNam = 70
	attrChardevABI = 71
	attrChardev    = 72
	attrDriverID   = 73

	nlmsgHdrLen = 16
	nlmsgError  = 2
	nlmsgDone   = 3
)

func msgType(op uint16) uint16 { return nlNLDev<<10 | op }

// ErrNotFound means no RDMA device has that name.
var ErrNotFound = errors.New("rdmanl: no such RDMA device")

// Chardev describes the uverbs character device of an RDMA device.
type Chardev struct {
	Name     string // "uverbs0"
	ABI      uint64 // driver ABI version
	Major    uint32
	Minor    uint32
	DriverID uint32 // enum rdma_driver_id
}

// attr appends a netlink attribute (4-byte aligned).
func attr(b []byte, typ uint16, v []byte) []byte {
	l := 4 + len(v)
	b = le.AppendUint16(b, uint16(l))
	b = le.AppendUint16(b, typ)
	b = append(b, v...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func u32(v uint32) []byte  { return le.AppendUint32(nil, v) }
func cstr(s string) []byte { return append([]byte(s), 0) }

// request builds an nlmsghdr + attributes.
func request(typ, flags uint16, seq uint32, attrs []byte) []byte {
	b := make([]byte, nlmsgHdrLen, nlmsgHdrLen+len(attrs))
	le.PutUint32(b[0:], uint32(nlmsgHdrLen+len(attrs)))
	le.PutUint16(b[4:], typ)
	le.PutUint16(b[6:], flags)
	le.PutUint32(b[8:], seq)
	return append(b, attrs...)
}

// message is one parsed netlink message.
type message struct {
	typ   uint16
	attrs map[uint16][]byte
	errno int32 // for NLMSG_ERROR
}

// parse splits a datagram into messages. It validates every length before
// slicing, so arbitrary input never panics.
func parse(b []byte) ([]message, error) {
	var out []message
	for len(b) >= nlmsgHdrLen {
		l := int(le.Uint32(b[0:]))
		if l < nlmsgHdrLen || l > len(b) {
			return out, fmt.Errorf("rdmanl: bad message length %d of %d", l, len(b))
		}
		m := message{typ: le.Uint16(b[4:]), attrs: map[uint16][]byte{}}
		body := b[nlmsgHdrLen:l]
		if m.typ == nlmsgError {
			if len(body) < 4 {
				return out, errors.New("rdmanl: short error message")
			}
			m.errno = -int32(le.Uint32(body[0:]))
		} else if m.typ >= 16 { // control messages (NOOP, DONE, OVERRUN) carry no attributes
			for len(body) >= 4 {
				al := int(le.Uint16(body[0:]))
				if al < 4 || al > len(body) {
					return out, fmt.Errorf("rdmanl: bad attribute length %d", al)
				}
				m.attrs[le.Uint16(body[2:])&0x3fff] = body[4:al]
				adv := (al + 3) &^ 3
				if adv > len(body) {
					adv = len(body)
				}
				body = body[adv:]
			}
		}
		out = append(out, m)
		adv := (l + 3) &^ 3
		if adv > len(b) {
			adv = len(b)
		}
		b = b[adv:]
	}
	return out, nil
}

func str(v []byte) string {
	for i, c := range v {
		if c == 0 {
			return string(v[:i])
		}
	}
	return string(v)
}

func getU32(m message, a uint16) (uint32, bool) {
	v, ok := m.attrs[a]
	if !ok || len(v) < 4 {
		return 0, false
	}
	return le.Uint32(v), true
}

func getU64(m message, a uint16) (uint64, bool) {
	v, ok := m.attrs[a]
	if !ok || len(v) < 8 {
		return 0, false
	}
	return le.Uint64(v), true
}

// chardevFrom decodes a GET_CHARDEV reply.
func chardevFrom(m message) (Chardev, error) {
	var c Chardev
	c.Name = str(m.attrs[attrChardevNam])
	c.ABI, _ = getU64(m, attrChardevABI)
	dev, ok := getU64(m, attrChardev)
	if !ok {
		return c, errors.New("rdmanl: GET_CHARDEV reply without a device number")
	}
	// huge_encode_dev: major in bits 8..19, minor in bits 0..7 and 20..31.
	c.Major = uint32((dev & 0xfff00) >> 8)
	c.Minor = uint32((dev & 0xff) | ((dev >> 12) & 0xfff00))
	if v, ok := m.attrs[attrDriverID]; ok && len(v) >= 4 {
		c.DriverID = le.Uint32(v) // u32 on 6.1 (u64 in the header comment)
	}
	return c, nil
}
