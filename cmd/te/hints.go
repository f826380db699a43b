package main

import (
	"errors"
	"net"
	"net/url"
	"strings"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/internal/cli"
	"github.com/rdmago/te/internal/control"
	"github.com/rdmago/te/segment"
)

// hinted is an error with what to do about it.
type hinted struct {
	err  error
	hint string
}

func (h *hinted) Error() string { return h.err.Error() + " (" + h.hint + ")" }
func (h *hinted) Unwrap() error { return h.err }

// metadataServer is the --metadata URI of a store served by another
// process (Consul, Mooncake's HTTP metadata) once a command opened one;
// "" for the embedded stores, whose server is the peer itself.
var metadataServer string

// explain adds to err what to do about it, where te can tell from the
// cause: a closed port, a timeout, a peer that went away. Messages of the
// auth and transport packages that already name the fix pass unchanged.
func explain(err error) error {
	var h *hinted
	var sum *summaryErr
	if err == nil || errors.As(err, &h) || errors.As(err, &sum) {
		return err
	}
	if errors.Is(err, auth.ErrDenied) {
		return err
	}
	if metadataServer != "" && errors.Is(err, segment.ErrUnavailable) {
		return &hinted{err, "the metadata server does not answer: is it running at the --metadata address " + cli.Printable(metadataServer) + "?"}
	}
	switch cli.NetCause(err) {
	case "refused":
		return &hinted{err, "nothing listens there: is `te serve` running on that host, and is that the port it printed?"}
	case "unreachable":
		return &hinted{err, "no route to that host: check the address and the network"}
	case "timeout":
		return &hinted{err, "no answer in time: is the host up, is the port a te one, or does a firewall drop it?"}
	}
	if errors.Is(err, driver.ErrPeerReset) {
		return &hinted{err, "the target stopped or restarted"}
	}
	return err
}

// midRun explains a transfer that failed once the segment was open: a
// port that now refuses connections, a handshake the target closed, or a
// peer reset means the target stopped or restarted (not that nothing ever
// listened there).
func midRun(err error) error {
	if cli.NetCause(err) == "refused" || errors.Is(err, control.ErrClosed) || errors.Is(err, driver.ErrPeerReset) {
		return &hinted{err, "the target stopped or restarted"}
	}
	return err
}

// mooncakeMetadata refuses Mooncake's metadata spellings te has no store
// for, saying which te spelling to use; "" when v is not one of them.
func mooncakeMetadata(v string) string {
	const use = "te's stores: p2p (Mooncake's P2PHANDSHAKE; the default), consul://HOST:PORT[/prefix], or http://HOST:PORT/PATH (Mooncake's HTTP metadata server)"
	if u, err := url.Parse(v); err == nil && u.Scheme != "" && strings.Contains(v, "://") {
		switch strings.ToLower(u.Scheme) {
		case "etcd":
			return "Mooncake's etcd metadata is not supported; use one of " + use
		case "redis":
			return "Mooncake's redis metadata is not supported; use one of " + use
		}
		return ""
	}
	if strings.EqualFold(v, "p2p") || strings.EqualFold(v, "p2phandshake") || v == "" {
		return ""
	}
	if _, _, err := net.SplitHostPort(strings.Split(v, ",")[0]); err == nil {
		return "a bare host:port is Mooncake's spelling of an etcd server, which te does not speak; use one of " + use
	}
	return "not a metadata URI; use one of " + use
}

// checkSegment refuses a p2p segment name that is not host:port: p2p
// names a segment by its store's address.
func checkSegment(fs *cli.FlagSet, metadata, seg string) error {
	if _, ok := embedded(metadata); seg == "" || !ok {
		return nil
	}
	hostport, _, _ := strings.Cut(seg, "/")
	if _, port, err := net.SplitHostPort(hostport); err != nil || port == "" || port == "0" {
		return fs.Usagef("--segment %s: with p2p metadata a segment is the host:port its te serve printed (e.g. 10.0.0.2:15000)", cli.Printable(seg))
	}
	return nil
}
