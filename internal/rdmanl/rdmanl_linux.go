package rdmanl

import (
	"fmt"

	"github.com/rdmago/te/internal/unix"
)

func roundTrip(req []byte, seq uint32) ([]message, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_RDMA)
	if err != nil {
		return nil, fmt.Errorf("rdmanl: socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("rdmanl: send: %w", err)
	}
	var out []message
	buf := make([]byte, 1<<16)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return nil, fmt.Errorf("rdmanl: receive: %w", err)
		}
		// Parsed attributes alias the datagram, and buf is reused by the next
		// receive: parse a copy.
		ms, err := parse(append([]byte(nil), buf[:n]...))
		if err != nil {
			return nil, err
		}
		for _, m := range ms {
			switch m.typ {
			case nlmsgDone:
				return out, nil
			case nlmsgError:
				if m.errno != 0 {
					return nil, unix.Errno(m.errno)
				}
				return out, nil // ACK
			default:
				out = append(out, m)
			}
		}
	}
}

// Indexes returns the kernel index of every RDMA device, by name.
func Indexes() (map[string]uint32, error) {
	ms, err := roundTrip(request(msgType(cmdGet), unix.NLM_F_REQUEST|unix.NLM_F_DUMP, 1, nil), 1)
	if err != nil {
		return nil, err
	}
	out := map[string]uint32{}
	for _, m := range ms {
		if idx, ok := getU32(m, attrDevIndex); ok {
			out[str(m.attrs[attrDevName])] = idx
		}
	}
	return out, nil
}

// DeviceIndex returns the kernel index of the RDMA device called name.
func DeviceIndex(name string) (uint32, error) {
	idx, err := Indexes()
	if err != nil {
		return 0, err
	}
	i, ok := idx[name]
	if !ok {
		return 0, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	return i, nil
}

// UverbsChardev asks the kernel for the uverbs char device of the RDMA
// device called name, including its driver id.
func UverbsChardev(name string) (Chardev, error) {
	idx, err := DeviceIndex(name)
	if err != nil {
		return Chardev{}, err
	}
	return UverbsChardevByIndex(idx)
}

// UverbsChardevByIndex is UverbsChardev for a device index from Indexes.
func UverbsChardevByIndex(idx uint32) (Chardev, error) {
	var a []byte
	a = attr(a, attrDevIndex, u32(idx))
	a = attr(a, attrChardevTyp, cstr("uverbs"))
	ms, err := roundTrip(request(msgType(cmdGetChardev), unix.NLM_F_REQUEST|unix.NLM_F_ACK, 2, a), 2)
	if err != nil {
		return Chardev{}, fmt.Errorf("rdmanl: GET_CHARDEV of device %d: %w", idx, err)
	}
	for _, m := range ms {
		if m.typ == msgType(cmdGetChardev) {
			return chardevFrom(m)
		}
	}
	return Chardev{}, fmt.Errorf("rdmanl: GET_CHARDEV of device %d: no reply", idx)
}

// NewLink creates a Soft-RoCE device ibdev on netdev (what
// `rdma link add IBDEV type rxe netdev NETDEV` does). Needs CAP_NET_ADMIN.
func NewLink(ibdev, netdev, linkType string) error {
	var a []byte
	a = attr(a, attrDevName, cstr(ibdev))
	a = attr(a, attrLinkType, cstr(linkType))
	a = attr(a, attrNdevName, cstr(netdev))
	if _, err := roundTrip(request(msgType(cmdNewLink), unix.NLM_F_REQUEST|unix.NLM_F_ACK, 3, a), 3); err != nil {
		return fmt.Errorf("rdmanl: link add %s type %s netdev %s: %w", ibdev, linkType, netdev, err)
	}
	return nil
}

// DelLink removes an RDMA link created by NewLink. The kernel waits until
// every user context of the device is closed.
func DelLink(ibdev string) error {
	idx, err := DeviceIndex(ibdev)
	if err != nil {
		return err
	}
	if _, err := roundTrip(request(msgType(cmdDelLink), unix.NLM_F_REQUEST|unix.NLM_F_ACK, 4, attr(nil, attrDevIndex, u32(idx))), 4); err != nil {
		return fmt.Errorf("rdmanl: link delete %s: %w", ibdev, err)
	}
	return nil
}
