package tcp

import (
	"errors"
	"io"
	"os"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/internal/control"
)

// Every connection opens with internal/control's handshake (hello,
// challenge, answer, verdict: control.TCP, magic "TETH"),
// authenticated with the cluster secret when one is set; then it carries
// the data frames of frame.go.

// ErrDenied is auth.ErrDenied: the target refused this initiator's
// handshake, or failed this initiator's check (one side does not hold the
// cluster secret, or holds another). It is not retried.
var ErrDenied = auth.ErrDenied

var (
	handshake      = &control.TCP
	handshakeProto = handshake.Frames() // nothing but the handshake
)

// Short names for the tests.
const (
	hsHello     = 1
	hsChallenge = 2
	hsAnswer    = 3
)

// dialHandshake runs the initiator's side; the errors map onto the
// transport's: a target of another epoch is driver.ErrPeerReset, one that
// closed or stalled the handshake ErrConnection (retried).
func dialHandshake(rw io.ReadWriter, s *auth.Secret, me, target auth.Party) error {
	err := handshake.Dial(control.Stream(rw, rw, handshakeProto), s, me, target)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, control.ErrStale):
		return control.Mark(err, driver.ErrPeerReset)
	case errors.Is(err, control.ErrClosed), errors.Is(err, os.ErrDeadlineExceeded):
		return control.Mark(err, ErrConnection)
	}
	return err
}

// acceptHandshake runs the target's side.
func acceptHandshake(rw io.ReadWriter, s *auth.Secret, me auth.Party) (auth.Party, error) {
	return handshake.Accept(control.Stream(rw, rw, handshakeProto), s, me, nil)
}
