package ebpf

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/rdmago/te/internal/sock"
	"github.com/rdmago/te/internal/testenv"
)

// lossyLink is a veth pair between this network namespace and a new one
// that drops some of the TCP segments sent into it.
type lossyLink struct {
	ns         string // name under /var/run/netns
	host, peer string // addresses of the two ends
	how        string // what drops the segments
}

func run(t *testing.T, stdin string, args ...string) error {
	t.Helper()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// newLossyLink makes the namespace and the veth pair; segments from this
// side to port of the other side are lost: netem (tc qdisc netem loss) on
// kernels that have it, else nftables dropping every 10th segment after the
// handshake. Both ends go when the test ends.
func newLossyLink(t *testing.T, port uint16) *lossyLink {
	t.Helper()
	for _, tool := range []string{"ip", "tc", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.Unavailable(t, "%s not found (apt-get install iproute2 nftables, or make deps)", tool)
		}
	}
	pid := os.Getpid()
	l := &lossyLink{ns: fmt.Sprintf("te-ebpf-%d", pid)}
	vh, vn := fmt.Sprintf("teh%d", pid), fmt.Sprintf("ten%d", pid)
	// 198.18.0.0/15 is reserved for benchmarking (RFC 2544): one /30 per pid.
	a, b := (pid>>6)&0xff, (pid&63)*4
	l.host, l.peer = fmt.Sprintf("198.18.%d.%d", a, b+1), fmt.Sprintf("198.18.%d.%d", a, b+2)
	if err := run(t, "", "ip", "netns", "add", l.ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		run(t, "", "ip", "link", "del", vh)
		run(t, "", "ip", "netns", "del", l.ns)
	})
	for _, c := range [][]string{
		{"ip", "link", "add", vh, "type", "veth", "peer", "name", vn},
		{"ip", "link", "set", vn, "netns", l.ns},
		{"ip", "addr", "add", l.host + "/30", "dev", vh},
		{"ip", "link", "set", vh, "up"},
		{"ip", "-n", l.ns, "addr", "add", l.peer + "/30", "dev", vn},
		{"ip", "-n", l.ns, "link", "set", vn, "up"},
		{"ip", "-n", l.ns, "link", "set", "lo", "up"},
	} {
		if err := run(t, "", c...); err != nil {
			t.Fatal(err)
		}
	}
	netem := run(t, "", "tc", "qdisc", "add", "dev", vh, "root", "netem", "loss", "5%")
	if netem == nil {
		l.how = "tc netem loss 5% on " + vh
		return l
	}
	rules := fmt.Sprintf(`table inet te_loss {
	chain in {
		type filter hook input priority 0; policy accept;
		tcp dport %d tcp flags & syn == 0 numgen inc mod 10 == 0 drop
	}
}
`, port)
	if err := run(t, rules, "ip", "netns", "exec", l.ns, "nft", "-f", "-"); err != nil {
		t.Fatalf("no way to lose packets: %v; and %v", netem, err)
	}
	l.how = fmt.Sprintf("nftables drops every 10th segment into %s (tc netem: %v)", l.ns, netem)
	return l
}

// TestRetransmit: segments lost on a veth link show up as the sender's
// retransmit count and as retransmit events, and the bytes still match.
func TestRetransmit(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Unavailable(t, "network namespaces and eBPF need root")
	}
	const port = 7471
	link := newLossyLink(t, port)
	t.Log(link.how)
	ln, err := sock.ListenIn("/var/run/netns/"+link.ns, fmt.Sprintf("%s:%d", link.peer, port))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	tr := open(t, Filter{Ports: []uint16{port}})
	const n = 8 << 20
	got := make(chan error, 1)
	go func() {
		s, err := ln.Accept()
		if err == nil {
			_, err = io.CopyN(io.Discard, s, n)
			s.Close()
		}
		got <- err
	}()
	c, err := net.DialTimeout("tcp", fmt.Sprintf("%s:%d", link.peer, port), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ck := cookie(t, c.(*net.TCPConn))
	if err := send(c, n); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	cc := waitConn(t, tr, ck, "all bytes acknowledged", func(x Conn) bool { return x.BytesAcked >= n+1 })
	if cc.Retransmits == 0 || cc.RetransmitEvents == 0 || cc.BytesRetrans == 0 {
		t.Errorf("no retransmits counted over a lossy link: %+v", cc)
	}
	if cc.BytesAcked > n+2 || cc.BytesSent < n+cc.BytesRetrans {
		t.Errorf("bytes: acked %d sent %d retransmitted %d, moved %d", cc.BytesAcked, cc.BytesSent, cc.BytesRetrans, n)
	}
	events := 0
	for drain := true; drain; {
		select {
		case e := <-tr.Events():
			if e.Kind == Retransmit && e.Cookie == ck {
				events++
				if e.Local != cc.Local || e.Remote != cc.Remote || e.Retransmits == 0 {
					t.Errorf("retransmit event %v of %+v", e, cc)
				}
			}
		default:
			drain = false
		}
	}
	if events == 0 || uint32(events) > cc.Retransmits {
		t.Errorf("%d retransmit events for %d retransmitted segments", events, cc.Retransmits)
	}
	t.Logf("%d segments retransmitted (%d bytes), %d events, srtt %v", cc.Retransmits, cc.BytesRetrans, events, cc.SRTT)
}
