package mctcp

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/mooncake/p2p"
)

// TestNotifyEndToEnd: te's notification API over Mooncake's wire, both
// ways. A te initiator's SubmitNotify writes 4 MiB to a te target that
// knows only Mooncake's wire; the target's engine yields the notification
// (sender: the initiator's address, as Mooncake's Notify names none) only
// with every byte in place. Engine.Notify sends one alone, and a Notify
// message as Mooncake's sendNotifyByName writes it reaches
// Notifications too. A target that is not there fails the notification
// without hanging.
func TestNotifyEndToEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tst, err := p2p.New(ctx, p2p.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tst.Close()
	ist, err := p2p.New(ctx, p2p.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ist.Close()
	tgt := newMCNode(t, tst.Name(), tst, 8<<20)
	ini := newMCNode(t, ist.Name(), ist, 8<<20)
	seg, err := ini.e.OpenSegment(ctx, tst.Name(), nil)
	if err != nil {
		t.Fatal(err)
	}
	const n, chunk = 4 << 20, 256 << 10
	src := ini.mem.Bytes()[:n]
	rand.Read(src)
	remote := engine.AddrOf(tgt.mem.Bytes())
	var reqs []engine.Request
	for off := 0; off < n; off += chunk {
		reqs = append(reqs, engine.Request{Op: engine.Write, Local: src[off : off+chunk], Target: seg, TargetAddr: remote + uint64(off)})
	}
	b, err := ini.e.AllocateBatch(len(reqs))
	if err != nil {
		t.Fatal(err)
	}
	if err := ini.e.SubmitNotify(b, reqs, engine.Notify{Name: "kv-ready", Msg: []byte("layer 7")}); err != nil {
		t.Fatal(err)
	}
	var got engine.Notification
	select {
	case got = <-tgt.e.Notifications():
	case <-ctx.Done():
		t.Fatal("no notification")
	}
	// Queued only after the data: every byte is there now.
	if !bytes.Equal(tgt.mem.Bytes()[:n], src) {
		t.Fatal("notified before the data was in place")
	}
	if got.Name != "kv-ready" || string(got.Msg) != "layer 7" || got.From != "mooncake@127.0.0.1" {
		t.Fatalf("notification %+v", got)
	}
	if err := ini.e.Wait(ctx, b); err != nil {
		t.Fatal(err)
	}
	ini.e.FreeBatch(b)

	if err := ini.e.Notify(ctx, seg, engine.Notify{Name: "alone", Msg: []byte{}}); err != nil {
		t.Fatal(err)
	}
	if got := <-tgt.e.Notifications(); got.Name != "alone" || len(got.Msg) != 0 {
		t.Fatalf("notification alone: %+v", got)
	}
	// What Mooncake's sendNotifyByName sends.
	if err := p2p.SendNotify(ctx, tst.Name(), p2p.NotifyRecord{Name: "agent1", NotifyMsg: "notification7"}, time.Second); err != nil {
		t.Fatal(err)
	}
	if got := <-tgt.e.Notifications(); got.Name != "agent1" || string(got.Msg) != "notification7" {
		t.Fatalf("Mooncake's Notify: %+v", got)
	}

	// The target's engine is gone: its socket answers no more.
	tgt.e.Close()
	tst.Close()
	start := time.Now()
	if err := ini.e.Notify(ctx, seg, engine.Notify{Name: "late"}); err == nil {
		t.Fatal("a notification to a closed target succeeded")
	} else if errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 20*time.Second {
		t.Fatalf("a notification to a closed target took %v: %v", time.Since(start), err)
	}
}

// TestNotifyRefusedWithoutEngine: a handshake socket no engine receives
// notifications for answers Notify with an empty notify_msg, which a
// sender reports as refused.
func TestNotifyRefusedWithoutEngine(t *testing.T) {
	st, err := p2p.New(context.Background(), p2p.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	err = p2p.SendNotify(context.Background(), st.Name(), p2p.NotifyRecord{Name: "x", NotifyMsg: "y"}, time.Second)
	if !errors.Is(err, p2p.ErrRefused) {
		t.Fatalf("Notify to a store without an engine: %v, want ErrRefused", err)
	}
}
