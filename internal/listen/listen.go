// Package listen opens the metadata stores' listeners: on a given port, or
// on a free one drawn from a range (as Mooncake draws its handshake port
// from 15000-17000), and says which host:port peers should dial.
package listen

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"strconv"
)

// TCP listens on addr (host:port). When addr's port is 0 and both
// portMin and portMax are set, it draws a free port from [portMin,
// portMax] instead: starting at a random one and walking the whole range
// once, so concurrent processes rarely collide and a nearly full range
// still succeeds.
func TCP(ctx context.Context, addr string, portMin, portMax int) (net.Listener, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("listen address %q: %w", addr, err)
	}
	var lc net.ListenConfig
	if port != "0" || portMin == 0 || portMax == 0 {
		return lc.Listen(ctx, "tcp", addr)
	}
	if portMin < 1 || portMax > 65535 || portMin > portMax {
		return nil, fmt.Errorf("port range %d-%d is not within 1-65535", portMin, portMax)
	}
	n := portMax - portMin + 1
	start := mrand.IntN(n)
	var last error
	for i := range n {
		p := portMin + (start+i)%n
		ln, err := lc.Listen(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(p)))
		if err == nil {
			return ln, nil
		}
		last = err
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("no free port in %d-%d on %q: %w", portMin, portMax, host, last)
}

// Advertised returns the host:port peers should dial to reach a: host when
// given, else a's own address, else (a listener on every interface) the
// first global IPv4 address of an interface that is up, else loopback.
func Advertised(a *net.TCPAddr, host string) (string, error) {
	port := strconv.Itoa(a.Port)
	if host != "" {
		return net.JoinHostPort(host, port), nil
	}
	if !a.IP.IsUnspecified() {
		return net.JoinHostPort(a.IP.String(), port), nil
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return "", fmt.Errorf("choose an address to advertise: %w", err)
	}
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, ad := range addrs {
			if ipn, ok := ad.(*net.IPNet); ok && ipn.IP.To4() != nil && ipn.IP.IsGlobalUnicast() {
				return net.JoinHostPort(ipn.IP.String(), port), nil
			}
		}
	}
	return net.JoinHostPort("127.0.0.1", port), nil
}
