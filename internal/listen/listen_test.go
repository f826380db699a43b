package listen

import (
	"context"
	"net"
	"strings"
	"testing"
)

// TestTCPRange: a port from the range, every port of a range of one, and
// a clear error for a full or invalid range.
func TestTCPRange(t *testing.T) {
	ctx := context.Background()
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	p := held.Addr().(*net.TCPAddr).Port
	if _, err := TCP(ctx, "127.0.0.1:0", p, p); err == nil || !strings.Contains(err.Error(), "no free port") {
		t.Fatalf("a full range: %v", err)
	}
	if _, err := TCP(ctx, "127.0.0.1:0", 10, 5); err == nil || !strings.Contains(err.Error(), "not within") {
		t.Fatalf("an inverted range: %v", err)
	}
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	q := free.Addr().(*net.TCPAddr).Port
	free.Close()
	ln, err := TCP(ctx, "127.0.0.1:0", q, q)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if got := ln.Addr().(*net.TCPAddr).Port; got != q {
		t.Fatalf("port %d, want %d", got, q)
	}
	if a, _ := Advertised(ln.Addr().(*net.TCPAddr), ""); a != ln.Addr().String() {
		t.Fatalf("advertised %s for %s", a, ln.Addr())
	}
	if a, _ := Advertised(&net.TCPAddr{IP: net.IPv4zero, Port: 7}, "h.example"); a != "h.example:7" {
		t.Fatalf("advertised %s with a host given", a)
	}
	if a, _ := Advertised(&net.TCPAddr{IP: net.IPv4zero, Port: 7}, ""); strings.HasPrefix(a, "0.0.0.0") || !strings.HasSuffix(a, ":7") {
		t.Fatalf("advertised %s for every interface", a)
	}
}
