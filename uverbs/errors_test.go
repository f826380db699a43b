package uverbs_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/rdmago/te/uverbs"
)

// TestCompletionClasses checks every completion status against its class:
// the connection failures are transient, the protection refusals are
// access errors, everything else is neither, and success has no error.
func TestCompletionClasses(t *testing.T) {
	transient := map[uverbs.WCStatus]bool{uverbs.WCRetryExcErr: true, uverbs.WCRNRRetryExcErr: true, uverbs.WCWRFlushErr: true}
	access := map[uverbs.WCStatus]bool{uverbs.WCRemAccessErr: true, uverbs.WCRemInvReqErr: true, uverbs.WCLocProtErr: true, uverbs.WCLocAccessErr: true}
	for s := uverbs.WCSuccess; s <= uverbs.WCGeneralErr+1; s++ {
		wc := uverbs.WC{ID: 9, Status: s, QPN: 0x21, VendorErr: 0x4}
		if s.Transient() != transient[s] || s.AccessDenied() != access[s] {
			t.Errorf("%s: Transient %v AccessDenied %v", s, s.Transient(), s.AccessDenied())
		}
		for _, err := range []error{wc.Err(), wc.ErrRemote(0x1234, 0x7f0000001000, 65536)} {
			if s == uverbs.WCSuccess {
				if err != nil {
					t.Errorf("success: %v", err)
				}
				continue
			}
			// The class survives wrapping, and no status is in both.
			wrapped := fmt.Errorf("slice 3: %w", err)
			if errors.Is(wrapped, uverbs.ErrCompletionTransient) != transient[s] || errors.Is(wrapped, uverbs.ErrCompletionAccess) != access[s] {
				t.Errorf("%s: errors.Is transient %v access %v", s, errors.Is(wrapped, uverbs.ErrCompletionTransient), errors.Is(wrapped, uverbs.ErrCompletionAccess))
			}
			var we *uverbs.WCError
			if !errors.As(wrapped, &we) || we.Status != s || we.ID != 9 || we.QPN != 0x21 || we.VendorErr != 4 {
				t.Errorf("%s: errors.As %+v", s, we)
			}
			if errors.Is(err, uverbs.ErrClosed) {
				t.Errorf("%s matches an unrelated sentinel", s)
			}
		}
	}
}

// TestCompletionErrorNamesRange: an access error the poller attributes to
// a remote range says which rkey and which bytes were refused; Err alone
// says nothing about a range.
func TestCompletionErrorNamesRange(t *testing.T) {
	wc := uverbs.WC{ID: 5, Status: uverbs.WCRemAccessErr, QPN: 0x11}
	err := wc.ErrRemote(0xab12, 0x10000, 0x800)
	msg := err.Error()
	for _, want := range []string{"work request 5", "QP 0x11", "remote access error", "rkey 0xab12", "[0x10000, 0x10800)", "2048 bytes"} {
		if !strings.Contains(msg, want) {
			t.Errorf("%q lacks %q", msg, want)
		}
	}
	var we *uverbs.WCError
	if !errors.As(err, &we) || !we.Remote || we.RKey != 0xab12 || we.RemoteAddr != 0x10000 || we.Length != 0x800 {
		t.Errorf("fields %+v", we)
	}
	if msg := wc.Err().Error(); strings.Contains(msg, "rkey") || strings.Contains(msg, "range") {
		t.Errorf("Err without a range: %q", msg)
	}
}

// Successful completions cost nothing to check.
func TestCompletionErrNoAlloc(t *testing.T) {
	wc := uverbs.WC{ID: 1, Status: uverbs.WCSuccess}
	if n := testing.AllocsPerRun(100, func() {
		if wc.Err() != nil || wc.ErrRemote(1, 2, 3) != nil {
			t.Fatal("error on success")
		}
	}); n != 0 {
		t.Errorf("%v allocations per successful check", n)
	}
}

// ExampleWCError_Is shows how a transport maps completion errors to its
// own policy: connection failures are retried elsewhere, protection
// refusals fail the transfer with the key and range that were refused.
func ExampleWCError_Is() {
	for _, wc := range []uverbs.WC{
		{ID: 1, Status: uverbs.WCRetryExcErr, QPN: 0x40},
		{ID: 2, Status: uverbs.WCRemAccessErr, QPN: 0x40},
	} {
		err := wc.ErrRemote(0x2a00, 0x1000, 4096)
		switch {
		case errors.Is(err, uverbs.ErrCompletionTransient):
			fmt.Println("retry on another QP:", err)
		case errors.Is(err, uverbs.ErrCompletionAccess):
			fmt.Println("fail:", err)
		}
	}
	// Output:
	// retry on another QP: uverbs: work request 1 on QP 0x40 completed with transport retry counter exceeded (vendor error 0x0), rkey 0x2a00 range [0x1000, 0x2000) (4096 bytes)
	// fail: uverbs: work request 2 on QP 0x40 completed with remote access error (vendor error 0x0), rkey 0x2a00 range [0x1000, 0x2000) (4096 bytes)
}
