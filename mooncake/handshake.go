package mooncake

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// ErrHandshake is returned (wrapped) for an RDMA endpoint handshake
// record that cannot be decoded; compare with errors.Is.
var ErrHandshake = errors.New("mooncake: invalid endpoint handshake")

// MaxHandshakeQPs bounds the QP numbers one handshake record may carry.
// Mooncake uses MC_NUM_QP_PER_EP QPs per endpoint (default 2).
const MaxHandshakeQPs = 64

// maxHandshakeSize bounds an encoded record: a few names, a GID and the
// QP numbers, with room for a rejection's text.
const maxHandshakeSize = 64 << 10

// Handshake is Mooncake's RDMA endpoint handshake record (HandShakeDesc),
// the body of a Connection message on the handshake socket. The active
// side sends its half; the passive side answers with its own, the NIC
// paths swapped, or with ReplyMsg set to refuse.
type Handshake struct {
	// LocalNICPath and PeerNICPath are "server_name@device" of the
	// sender's NIC and of the NIC it addresses.
	LocalNICPath, PeerNICPath string
	// LocalLID is the sender's port LID (InfiniBand; 0 on RoCE).
	LocalLID uint16
	// LocalGID is the sender's GID; invalid (zero) when the record has
	// none (Mooncake then looks the NIC up in the segment's devices).
	LocalGID netip.Addr
	// QPNums are the sender's QP numbers, one per QP of the endpoint, in
	// pairing order.
	QPNums []uint32
	// ReplyMsg, in a reply, refuses the endpoint: empty means accepted.
	ReplyMsg string
	// Payload is carried along and unused by the RDMA transport.
	Payload string
	// ReadyAckSupported: the record carries the ready_ack key. A passive
	// side that sees it waits, before posting, for the active side's
	// second record, ReadyAck true, sent once its QPs are ready.
	ReadyAckSupported, ReadyAck bool
}

// DecodeHandshake decodes a Connection message's body. Mooncake's reader
// takes a missing field as empty; so does this one, but a field of the
// wrong type, a LID or QP number out of range, a malformed GID or NIC path
// or more than MaxHandshakeQPs QP numbers is an error wrapping
// ErrHandshake that names the field.
func DecodeHandshake(b []byte) (*Handshake, error) {
	if len(b) > maxHandshakeSize {
		return nil, fmt.Errorf("%w: %d bytes, more than %d", ErrHandshake, len(b), maxHandshakeSize)
	}
	var o map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&o); err != nil {
		return nil, fmt.Errorf("%w: not a JSON object: %v", ErrHandshake, err)
	}
	if o == nil {
		return nil, fmt.Errorf("%w: null instead of an object", ErrHandshake)
	}
	h := &Handshake{}
	var err error
	field := func(name string, dst *string) {
		if err == nil {
			if *dst, err = str(o, name, false); err != nil {
				err = fmt.Errorf("%w: %w", ErrHandshake, err)
			}
		}
	}
	field("local_nic_path", &h.LocalNICPath)
	field("peer_nic_path", &h.PeerNICPath)
	field("reply_msg", &h.ReplyMsg)
	field("payload", &h.Payload)
	var gid string
	field("local_gid", &gid)
	if err != nil {
		return nil, err
	}
	for _, p := range []struct{ name, v string }{{"local_nic_path", h.LocalNICPath}, {"peer_nic_path", h.PeerNICPath}} {
		if p.v == "" {
			continue
		}
		if _, _, perr := SplitNICPath(p.v); perr != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrHandshake, p.name, perr)
		}
	}
	if gid != "" {
		if h.LocalGID, err = ParseGID(gid); err != nil {
			return nil, fmt.Errorf("%w: local_gid: %v", ErrHandshake, err)
		}
	}
	lid, _, err := uintField(o, "local_lid", 0xffff)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrHandshake, err)
	}
	h.LocalLID = uint16(lid)
	if raw := bytes.TrimSpace(o["qp_num"]); len(raw) > 0 && string(raw) != "null" {
		var nums []json.RawMessage
		if err := json.Unmarshal(raw, &nums); err != nil {
			return nil, fmt.Errorf("%w: qp_num must be an array of numbers: %v", ErrHandshake, err)
		}
		if len(nums) > MaxHandshakeQPs {
			return nil, fmt.Errorf("%w: qp_num has %d entries, more than %d", ErrHandshake, len(nums), MaxHandshakeQPs)
		}
		for i, n := range nums {
			v, err := parseUint(bytes.TrimSpace(n), 0xffffff)
			if err != nil {
				return nil, fmt.Errorf("%w: qp_num[%d]: %v (QP numbers are 24 bits)", ErrHandshake, i, err)
			}
			h.QPNums = append(h.QPNums, uint32(v))
		}
	}
	if raw, ok := o["ready_ack"]; ok {
		h.ReadyAckSupported = true
		switch string(bytes.TrimSpace(raw)) {
		case "true":
			h.ReadyAck = true
		case "false":
		default:
			return nil, fmt.Errorf("%w: ready_ack must be true or false, not %.20s", ErrHandshake, raw)
		}
	}
	return h, nil
}

// Encode writes the record as Mooncake does: compact JSON, keys sorted,
// one trailing newline; ready_ack only when ReadyAckSupported or ReadyAck.
func (h *Handshake) Encode() ([]byte, error) {
	gid := ""
	if h.LocalGID.IsValid() {
		gid = FormatGID(h.LocalGID)
	}
	if len(h.QPNums) > MaxHandshakeQPs {
		return nil, fmt.Errorf("%w: %d QP numbers, more than %d", ErrHandshake, len(h.QPNums), MaxHandshakeQPs)
	}
	qps := h.QPNums
	if qps == nil {
		qps = []uint32{}
	}
	// encoding/json writes struct fields in declaration order: keep them
	// sorted, as jsoncpp writes them.
	type withAck struct {
		LocalGID     string   `json:"local_gid"`
		LocalLID     uint16   `json:"local_lid"`
		LocalNICPath string   `json:"local_nic_path"`
		Payload      string   `json:"payload"`
		PeerNICPath  string   `json:"peer_nic_path"`
		QPNum        []uint32 `json:"qp_num"`
		ReadyAck     *bool    `json:"ready_ack,omitempty"`
		ReplyMsg     string   `json:"reply_msg"`
	}
	w := withAck{LocalGID: gid, LocalLID: h.LocalLID, LocalNICPath: h.LocalNICPath, Payload: h.Payload,
		PeerNICPath: h.PeerNICPath, QPNum: qps, ReplyMsg: h.ReplyMsg}
	if h.ReadyAckSupported || h.ReadyAck {
		w.ReadyAck = &h.ReadyAck
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(w); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrHandshake, err)
	}
	if buf.Len() > maxHandshakeSize {
		return nil, fmt.Errorf("%w: encoded size %d exceeds %d", ErrHandshake, buf.Len(), maxHandshakeSize)
	}
	return buf.Bytes(), nil
}

// ConnectionHandler answers the Connection messages that arrive on a
// handshake socket (package p2p's Store.HandleConnections): a Mooncake
// RDMA transport's passive side. from is the sender's address. The reply
// is the handler's half of the endpoint, the NIC paths swapped, or a
// refusal in ReplyMsg; it is never nil.
type ConnectionHandler interface {
	HandleConnection(ctx context.Context, from netip.Addr, req *Handshake) *Handshake
}

// NICPath joins a server name and a device name as Mooncake does.
func NICPath(server, device string) string { return server + "@" + device }

// SplitNICPath splits "server@device" at the first '@', as Mooncake
// does; both parts must be non-empty.
func SplitNICPath(p string) (server, device string, err error) {
	server, device, ok := strings.Cut(p, "@")
	if !ok || server == "" || device == "" {
		return "", "", fmt.Errorf("NIC path %q: want server_name@device", p)
	}
	return server, device, nil
}
