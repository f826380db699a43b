package tcp

import (
	"errors"
	"fmt"
	"io"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/internal/handshake"
)

// The handshake that opens every connection is internal/handshake.TCP: hello,
// challenge, answer, verdict in internal/wire frames, authenticated with
// the cluster secret when one is set.

// ErrDenied: the target refused this initiator's handshake, or failed
// this initiator's check (it does not hold the cluster secret). It wraps
// auth.ErrDenied and is not retried.
var ErrDenied = fmt.Errorf("tcp: handshake refused: %w", auth.ErrDenied)

// Short names for the tests.
var handshakeProto = handshake.TCP.Proto

const (
	hsHello     = 1
	hsChallenge = 2
	hsAnswer    = 3
)

// dialHandshake runs the initiator's side; the errors map onto the
// transport's.
func dialHandshake(rw io.ReadWriter, s *auth.Secret, me, target auth.Party) error {
	err := handshake.TCP.Dial(rw, s, me, target)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, handshake.ErrStale):
		return errRemoteStale
	case errors.Is(err, auth.ErrDenied):
		return fmt.Errorf("%w: %w", ErrDenied, err)
	}
	return err
}

// acceptHandshake runs the target's side.
func acceptHandshake(rw io.ReadWriter, s *auth.Secret, me auth.Party) (auth.Party, error) {
	p, err := handshake.TCP.Accept(rw, s, me)
	if errors.Is(err, handshake.ErrStale) {
		return p, errRemoteStale
	}
	return p, err
}
