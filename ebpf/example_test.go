package ebpf_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/rdmago/te/ebpf"
	"github.com/rdmago/te/tcp"
)

// Trace the lanes of a TCP transport: select them by cookie, read their
// counters, and watch their state changes and retransmissions. Without
// root the transport's own TCP_INFO still gives the counters.
func Example() {
	var tr *tcp.Transport // installed in an engine, moving data
	var cookies []uint64
	for _, l := range tr.Lanes() {
		cookies = append(cookies, l.Cookie)
	}
	t, err := ebpf.Open(ebpf.Filter{Cookies: cookies})
	if errors.Is(err, ebpf.ErrPermission) || errors.Is(err, ebpf.ErrUnsupported) {
		for _, l := range tr.Lanes() {
			fmt.Println(l.Peer, l.Index, l.Info.BytesAcked, l.Info.RTT) // untraced
		}
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	defer t.Close()
	conns, err := t.Snapshot()
	if err != nil {
		log.Fatal(err)
	}
	for _, c := range conns {
		fmt.Println(c.Local, c.Remote, c.State, c.BytesAcked, c.BytesReceived, c.SRTT, c.Retransmits)
	}
	go func() {
		for e := range t.Events() { // closed by Close
			fmt.Println(e)
		}
	}()
}
