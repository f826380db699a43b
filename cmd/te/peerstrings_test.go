package main

import (
	"bytes"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/internal/control"
	"github.com/rdmago/te/internal/wire"
	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/segment/storetest"
)

// evilJSON is a JSON string body that decodes to the bytes a hostile peer
// would use on a terminal: clear the screen, set the title, ring the
// bell, return to the line's start.
const evilJSON = `\u001b[2J\u001b]0;pwned\u0007\r`

// maxPrintedLine bounds any line te prints: errors are cut at
// cli.MaxErrorLine before escaping (at most 4 bytes per escaped byte,
// plus the count of what was cut).
const maxPrintedLine = 4*1024 + 64

// hostilePeer serves, on a p2p metadata port of its own, whatever
// descriptor payload(name) returns for every request (after te's real
// handshake, so the bytes reach the decoders and printers behind it).
func hostilePeer(t *testing.T, payload func(name string) []byte) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	addr := ln.Addr().String()
	proto := control.P2P.Proto("p2p", func(wire.Type) (int, bool) { return 1 << 20, true }, nil)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(20 * time.Second))
				if _, err := control.P2P.Accept(control.Stream(c, c, &proto), nil, auth.Party{Name: addr, Epoch: 1}, nil); err != nil {
					return
				}
				hdr := make([]byte, wire.HeaderLen)
				for {
					if _, _, err := proto.Read(c, hdr, nil); err != nil {
						return
					}
					if err := proto.Write(c, 2 /* descriptor */, 0, payload(addr)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return addr
}

// descriptorJSON is a valid descriptor named name with edit applied to
// its encoding.
func descriptorJSON(t *testing.T, name string, edit func(string) string) []byte {
	b, err := segment.Marshal(storetest.Descriptor(name, 1, 1))
	if err != nil {
		t.Fatal(err)
	}
	return []byte(edit(string(b)))
}

// TestPeerStringsEscaped feeds hostile descriptors from a fake peer
// through every command that prints one (the segments table, its JSON,
// te bench's errors and log lines, te diagnose's layers and its JSON): no control byte but newline reaches the output,
// and no line passes the cap, whatever field carries them.
func TestPeerStringsEscaped(t *testing.T) {
	fields := []struct{ from, to string }{
		{`"endpoint":"127.0.0.1:15002"`, `"endpoint":"127.0.0.1:15002` + evilJSON + `"`},
		{`"lanes":"4"`, `"lanes` + evilJSON + `":"4` + evilJSON + `"`},
		{`"endpoint":"127.0.0.1:15003"`, `"endpoint":"` + evilJSON + `"`},
		{`"name":"rxe0"`, `"name":"rxe` + evilJSON + `"`},
		{`"gid":"fe80::1"`, `"gid":"` + evilJSON + `"`},
		{`"location":"cpu:0"`, `"location":"cpu:0` + evilJSON + `"`},
		{`"name":"tcp"`, `"name":"tcp` + evilJSON + `"`},
	}
	cases := map[string]func(string) []byte{}
	for i, f := range fields {
		cases["field"+string(rune('a'+i))] = func(name string) []byte {
			return descriptorJSON(t, name, func(s string) string { return strings.Replace(s, f.from, f.to, 1) })
		}
	}
	cases["every field"] = func(name string) []byte {
		return descriptorJSON(t, name, func(s string) string {
			for _, f := range fields {
				s = strings.Replace(s, f.from, f.to, 1)
			}
			return s
		})
	}
	// A name that is not the one asked for, 1 MiB long: the error that
	// says so must not carry it whole.
	cases["huge name"] = func(name string) []byte {
		huge := strings.Repeat(`A`+evilJSON, (1<<20)/8)
		return descriptorJSON(t, name, func(s string) string {
			return strings.Replace(s, `"name":"`+name+`"`, `"name":"`+huge+`"`, 1)
		})
	}
	// 60,000 protocol entries.
	cases["many protocols"] = func(name string) []byte {
		return descriptorJSON(t, name, func(s string) string {
			p := `{"name":"p` + evilJSON + `","endpoint":"127.0.0.1:1"},`
			return strings.Replace(s, `"protocols":[`, `"protocols":[`+strings.Repeat(p, 60000), 1)
		})
	}
	for name, payload := range cases {
		t.Run(name, func(t *testing.T) {
			peer := hostilePeer(t, payload)
			for _, args := range [][]string{
				{"segments", peer},
				{"segments", peer, "--json"},
				{"bench", "--segment", peer, "--protocol", "tcp", "--duration", "1"},
				{"bench", "--segment", peer, "--duration", "1", "--json"},
				{"diagnose", peer, "--timeout", "1s"},
				{"diagnose", peer, "--timeout", "1s", "--json"},
				{"diagnose", peer, "--timeout", "1s", "--protocol", "rdma"},
			} {
				stdout, stderr, _ := runTE(t, args...)
				for _, out := range []string{stdout, stderr} {
					if i := bytes.IndexFunc([]byte(out), func(r rune) bool { return r < 0x20 && r != '\n' || r == 0x7f }); i >= 0 {
						t.Errorf("te %s: a control byte %q reached the output at %d: %.300q", strings.Join(args, " "), out[i], i, out[max(0, i-100):])
					}
					for _, line := range strings.Split(out, "\n") {
						if len(line) > maxPrintedLine {
							t.Errorf("te %s: a line of %d bytes: %.200q…", strings.Join(args, " "), len(line), line)
						}
					}
				}
			}
		})
	}
}
