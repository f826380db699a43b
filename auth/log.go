package auth

import (
	"log/slog"
	"net"
)

// WarnUnauthenticated logs one warning when a listener of proto at addr
// takes connections from other hosts without a secret: anyone who reaches
// it may use it. Loopback listeners, and any listener with a secret, log
// nothing. It reports whether it warned.
func WarnUnauthenticated(log *slog.Logger, proto string, addr net.Addr, s *Secret) bool {
	if s != nil || log == nil {
		return false
	}
	if ta, ok := addr.(*net.TCPAddr); ok && ta.IP.IsLoopback() {
		return false
	}
	log.Warn("te: listening on a non-loopback address without authentication: anyone who reaches it may connect; set --auth-file or $"+EnvFile,
		"proto", proto, "listen", addr.String())
	return true
}
