package uverbs_test

import (
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/rdmago/te/internal/rdmanl"
	"github.com/rdmago/te/test/softroce/srenv"
	"github.com/rdmago/te/uverbs"
)

// TestPortEvents builds a private rxe device on a private veth pair, so the
// shared topology is untouched, and checks that taking its netdev down and
// up reaches the user as PORT_ERR and PORT_ACTIVE async events.
func TestPortEvents(t *testing.T) {
	srenv.Require(t)
	const ibdev, nd, peer = "rxeevt0", "tevt0", "tevt1"
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: nd}, PeerName: peer}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("veth add: %v", err)
	}
	defer netlink.LinkDel(veth)
	for _, n := range []string{nd, peer} {
		l, err := netlink.LinkByName(n)
		if err != nil {
			t.Fatal(err)
		}
		if err := netlink.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	if err := rdmanl.NewLink(ibdev, nd, "rxe"); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := rdmanl.DelLink(ibdev); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	}()
	var dev uverbs.Device
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; {
		dev, err = uverbs.LookupDevice(ibdev)
		if err == nil {
			if _, serr := os.Stat(dev.Path); serr == nil {
				if s, _ := dev.PortState(1); s == uverbs.PortActive {
					break
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not come up: %v", ibdev, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	c, err := dev.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	expect := func(want uverbs.AsyncEventType) {
		t.Helper()
		timeout := time.After(10 * time.Second)
		for {
			select {
			case ev := <-c.Events():
				t.Logf("event %s", ev)
				if ev.Type == want && ev.Port == 1 {
					return
				}
			case <-timeout:
				t.Fatalf("no %s event", want)
			}
		}
	}
	link, err := netlink.LinkByName(nd)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetDown(link); err != nil {
		t.Fatal(err)
	}
	expect(uverbs.EventPortErr)
	if pa, err := c.QueryPort(1); err != nil || pa.State == uverbs.PortActive {
		t.Errorf("port after link down: %+v %v", pa, err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		t.Fatal(err)
	}
	expect(uverbs.EventPortActive)
}
