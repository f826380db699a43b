package httpmeta

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		// A connection the server refused lingers up to 500 ms in
		// net/http's own close-write wait after the server is closed.
		goleak.IgnoreAnyFunction("net/http.(*conn).closeWriteAndWait"))
}
