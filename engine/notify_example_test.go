package engine_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/rdmago/te/engine"
)

// A submission with a notification: the target's Notifications (or
// DrainNotifications) yields it only once every byte of the submission has
// landed in the target's memory. Here the target is the engine's own
// segment; to a remote one the request names the opened SegmentID and its
// transport carries the notification behind the data (tcp, shm).
func ExampleEngine_SubmitNotify() {
	e, err := engine.New(engine.Config{Name: "decode-0"})
	if err != nil {
		log.Fatal(err)
	}
	defer e.Close()
	mem, err := engine.Alloc(1 << 16)
	if err != nil {
		log.Fatal(err)
	}
	defer mem.Close()
	if err := e.RegisterLocalMemory(mem.Bytes(), "cpu:0"); err != nil {
		log.Fatal(err)
	}
	src, dst := mem.Bytes()[:4096], mem.Bytes()[8192:]
	copy(src, "kv cache, layer 0")

	b, _ := e.AllocateBatch(1)
	defer e.FreeBatch(b)
	err = e.SubmitNotify(b, []engine.Request{
		{Op: engine.Write, Local: src, Target: engine.LocalSegment, TargetAddr: engine.AddrOf(dst)},
	}, engine.Notify{Name: "req-42", Msg: []byte("layer 0 done")})
	if err == nil {
		err = e.Wait(context.Background(), b)
	}
	if err != nil {
		log.Fatal(err)
	}
	n := <-e.Notifications()
	fmt.Println(n.From, n.Name, string(n.Msg), n.Bytes, string(dst[:17]))
	// Output: decode-0 req-42 layer 0 done 4096 kv cache, layer 0
}

// A target that may fall behind its senders takes notifications in runs:
// ReceiveNotifications waits for one, then takes every one queued, in the
// order they were queued. Here three local submissions are notified
// before the receiver looks.
func ExampleEngine_ReceiveNotifications() {
	e, err := engine.New(engine.Config{Name: "decode-0"})
	if err != nil {
		log.Fatal(err)
	}
	defer e.Close()
	mem, err := engine.Alloc(1 << 16)
	if err != nil {
		log.Fatal(err)
	}
	defer mem.Close()
	if err := e.RegisterLocalMemory(mem.Bytes(), "cpu:0"); err != nil {
		log.Fatal(err)
	}
	b, _ := e.AllocateBatch(3)
	defer e.FreeBatch(b)
	for layer := range 3 {
		src, dst := mem.Bytes()[layer*4096:][:4096], mem.Bytes()[32768+layer*4096:]
		err := e.SubmitNotify(b, []engine.Request{
			{Op: engine.Write, Local: src, Target: engine.LocalSegment, TargetAddr: engine.AddrOf(dst)},
		}, engine.Notify{Name: fmt.Sprint("layer-", layer)})
		if err != nil {
			log.Fatal(err)
		}
	}
	if err := e.Wait(context.Background(), b); err != nil {
		log.Fatal(err)
	}
	var got []engine.Notification // reuse it: got[:0] for the next call
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for len(got) < 3 {
		if got, err = e.ReceiveNotifications(ctx, got); err != nil {
			log.Fatal(err)
		}
	}
	for _, n := range got {
		fmt.Println(n.Name, n.Bytes)
	}
	// Output:
	// layer-0 4096
	// layer-1 4096
	// layer-2 4096
}
