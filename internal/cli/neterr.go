package cli

import (
	"errors"
	"net"
	"syscall"
)

// NetCause classifies a failure to reach a peer, so a command can say what
// to do: "refused" (nothing listens on that port), "unreachable" (no
// route), "timeout" (no answer in time), or "" for anything else.
func NetCause(err error) string {
	var ne net.Error
	switch {
	case err == nil:
		return ""
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "unreachable"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	}
	return ""
}
