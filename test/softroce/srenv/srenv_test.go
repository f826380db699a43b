package srenv

import (
	"errors"
	"net"
	"testing"
)

func setGuest(t *testing.T) {
	t.Helper()
	env := map[string]string{
		"SR_GUEST": "1", "SR_MTU": "1500", "SR_OUT": "/out", "SR_TOOLS": "1",
		"SR_DEV0": "rxe0", "SR_DEV1": "rxe1", "SR_DEV2": "rxe2", "SR_DEV3": "rxe3", "SR_DEVLO": "rxelo",
		"SR_NETDEV0": "veth0", "SR_NETDEV1": "veth1", "SR_NETDEV2": "veth2", "SR_NETDEV3": "veth3",
		"SR_IP0": "10.0.1.1", "SR_IP1": "10.0.1.2", "SR_IP2": "10.0.2.1", "SR_IP3": "10.0.2.2", "SR_IPLO": "127.0.0.1",
		"SR_GID0": "1", "SR_GID1": "1", "SR_GID2": "3", "SR_GID3": "1", "SR_GIDLO": "2",
		"SR_HOST_A": "rxe0 rxe2", "SR_HOST_B": "rxe1 rxe3",
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
}

func TestLoad(t *testing.T) {
	setGuest(t)
	topo, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	a, b := topo.Pair(1)
	if a.Name != "rxe2" || b.Name != "rxe3" || a.Netdev != "veth2" || a.GIDIndex != 3 {
		t.Errorf("rail 2 = %+v, %+v", a, b)
	}
	if !b.IP.Equal(net.IPv4(10, 0, 2, 2)) {
		t.Errorf("rxe3 ip = %v", b.IP)
	}
	want := [16]byte{10: 0xff, 11: 0xff, 12: 10, 13: 0, 14: 2, 15: 1}
	if a.GID != want {
		t.Errorf("rxe2 gid = %x, want %x", a.GID, want)
	}
	if topo.Lo.Name != "rxelo" || topo.Lo.Netdev != "lo" || topo.Lo.GIDIndex != 2 {
		t.Errorf("lo = %+v", topo.Lo)
	}
	if topo.MTU != 1500 || !topo.Tools || topo.Out != "/out" {
		t.Errorf("topo = %+v", topo)
	}
}

func TestLoadErrors(t *testing.T) {
	t.Setenv("SR_GUEST", "")
	if _, err := Load(); !errors.Is(err, ErrNotGuest) {
		t.Errorf("outside guest: err = %v, want ErrNotGuest", err)
	}
	for _, c := range []struct{ k, v string }{
		{"SR_DEV2", ""}, {"SR_IP1", "not-an-ip"}, {"SR_IP1", "::1"}, {"SR_GID3", "-1"},
		{"SR_GID3", "x"}, {"SR_HOST_A", "rxe0 rxe9"}, {"SR_HOST_B", "rxe1"}, {"SR_MTU", ""},
	} {
		setGuest(t)
		t.Setenv(c.k, c.v)
		if _, err := Load(); err == nil || errors.Is(err, ErrNotGuest) {
			t.Errorf("%s=%q: err = %v, want a descriptive error", c.k, c.v, err)
		}
	}
}

func TestRequireSkipsOutsideGuest(t *testing.T) {
	t.Setenv("SR_GUEST", "")
	ran := false
	t.Run("inner", func(t *testing.T) {
		Require(t)
		ran = true
	})
	if ran {
		t.Error("Require did not skip outside the guest")
	}
}
