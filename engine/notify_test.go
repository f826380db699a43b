package engine_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
)

// TestNotifyUnsupported: a notification over a transport that does not
// carry them fails before anything moves, with ErrNotifyUnsupported (also
// ErrNotSupported); an oversized one with ErrInvalidRequest.
func TestNotifyUnsupported(t *testing.T) {
	st := enginetest.NewMemStore()
	defer st.Close()
	tgt := enginetest.NewNode(t, engine.Config{Name: "target", Store: st}, 1<<16, &fake{name: "fake"})
	ft := &fake{name: "fake"}
	ini := enginetest.NewNode(t, engine.Config{Name: "ini", Store: st}, 1<<16, ft)
	seg, err := ini.Engine.OpenSegment(ctxT(t, 5*time.Second), "target", nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := ini.Engine.AllocateBatch(4)
	defer ini.Engine.FreeBatch(b)
	req := []engine.Request{{Op: engine.Write, Local: ini.Mem.Bytes()[:64], Target: seg, TargetAddr: engine.AddrOf(tgt.Mem.Bytes())}}
	err = ini.Engine.SubmitNotify(b, req, engine.Notify{Name: "x"})
	if !errors.Is(err, engine.ErrNotifyUnsupported) || !errors.Is(err, engine.ErrNotSupported) {
		t.Fatalf("SubmitNotify over a transport without notifications: %v", err)
	}
	if n := ft.slices.Load(); n != 0 {
		t.Fatalf("%d slices started by a refused submission", n)
	}
	if err := ini.Engine.Notify(ctxT(t, time.Second), seg, engine.Notify{Name: "x"}); !errors.Is(err, engine.ErrNotifyUnsupported) {
		t.Fatalf("Notify alone: %v", err)
	}
	err = ini.Engine.SubmitNotify(b, req, engine.Notify{Name: "x", Msg: make([]byte, engine.MaxNotifyMsg+1)})
	if !errors.Is(err, engine.ErrInvalidRequest) {
		t.Fatalf("oversized message: %v", err)
	}
	err = ini.Engine.SubmitNotify(b, req, engine.Notify{Name: strings.Repeat("n", engine.MaxNotifyName+1)})
	if !errors.Is(err, engine.ErrInvalidRequest) {
		t.Fatalf("oversized name: %v", err)
	}
	if err := ini.Engine.SubmitNotify(b, nil, engine.Notify{}); !errors.Is(err, engine.ErrInvalidRequest) {
		t.Fatalf("no requests: %v", err)
	}
	if st, _ := ini.Engine.BatchStatus(b); st.State != engine.StateCompleted || ft.slices.Load() != 0 {
		t.Fatalf("refused submissions left %v, %d slices", st, ft.slices.Load())
	}
}
