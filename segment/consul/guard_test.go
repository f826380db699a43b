package consul_test

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/rdmago/te/internal/testenv"
	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/segment/consul"
	"github.com/rdmago/te/segment/storetest"
)

// A store watches the keys it publishes: when another writer overwrites
// one with garbage, overwrites it without a session after deleting it, or
// deletes it, the store logs it and writes its descriptor again, and
// readers see the segment again without anyone publishing.
func TestOwnKeyRepaired(t *testing.T) {
	a := agent(t)
	p := prefix(t)
	var log testenv.Buffer
	s := open(t, consul.Config{Address: a.Addr(), Prefix: p, Logf: func(f string, args ...any) {
		fmt.Fprintf(&log, f+"\n", args...)
		t.Logf(f, args...)
	}})
	ctx := ctxT(t, 60*time.Second)
	const name = "target"
	d := storetest.Descriptor(name, 0, 1)
	if err := s.Publish(ctx, d); err != nil {
		t.Fatal(err)
	}
	kv := rawKV(t, a.Addr())
	key := s.Key(name)
	restored := func(what string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			pair, _, err := kv.Get(key, nil)
			if err == nil && pair != nil && pair.Session == s.Session() {
				if got, err := segment.Unmarshal(pair.Value); err == nil && got.Name == name && got.Epoch == s.Epoch() && got.Version == 1 {
					return
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("after %s: key %s not restored in 10 s: %+v, %v\nlog:\n%s", what, key, pair, err, log.String())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	for i, change := range []struct {
		what string
		do   func() error
		log  string
	}{
		{"a plain put of garbage", func() error {
			_, err := kv.Put(&api.KVPair{Key: key, Value: []byte("garbage\x1b[2J")}, nil)
			return err
		}, "was changed by another writer"},
		{"a delete", func() error { _, err := kv.Delete(key, nil); return err }, "disappeared"},
		{"a delete and a put of a valid descriptor of another epoch", func() error {
			if _, err := kv.Delete(key, nil); err != nil {
				return err
			}
			other, _ := segment.Marshal(storetest.Descriptor(name, 77, 9))
			_, err := kv.Put(&api.KVPair{Key: key, Value: other}, nil)
			return err
		}, "publishing"},
	} {
		before := strings.Count(log.String(), "\n")
		if err := change.do(); err != nil {
			t.Fatal(err)
		}
		restored(change.what)
		if l := log.String(); strings.Count(l, "\n") == before || !strings.Contains(l, change.log) || !strings.Contains(l, key) {
			t.Fatalf("change %d (%s) not logged; log:\n%s", i, change.what, l)
		}
		// Readers see the owner's descriptor again.
		r := open(t, consul.Config{Address: a.Addr(), Prefix: p})
		if got, err := r.Get(ctx, name); err != nil || got.Epoch != s.Epoch() {
			t.Fatalf("after %s: Get = %+v, %v", change.what, got, err)
		}
	}
	// Its own updates are not taken for another writer's.
	if err := s.Publish(ctx, storetest.Descriptor(name, 0, 2)); err != nil {
		t.Fatal(err)
	}
	before := log.String()
	time.Sleep(300 * time.Millisecond)
	if log.String() != before {
		t.Fatalf("the store's own update was logged as a change:\n%s", log.String())
	}
	// Unpublished, it is not repaired: the key stays gone.
	if err := s.Unpublish(ctx, name); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if pair, _, err := kv.Get(key, nil); err != nil || pair != nil {
		t.Fatalf("after Unpublish: %+v, %v", pair, err)
	}
}

// A key taken by another store's session is not fought over: the owner
// gives it up and logs that it lost it.
func TestOwnKeyTakenByAnotherStore(t *testing.T) {
	a := agent(t)
	p := prefix(t)
	var log testenv.Buffer
	s := open(t, consul.Config{Address: a.Addr(), Prefix: p, Logf: func(f string, args ...any) { fmt.Fprintf(&log, f+"\n", args...) }})
	s2 := open(t, consul.Config{Address: a.Addr(), Prefix: p})
	ctx := ctxT(t, 60*time.Second)
	const name = "contested"
	if err := s.Publish(ctx, storetest.Descriptor(name, 0, 1)); err != nil {
		t.Fatal(err)
	}
	kv := rawKV(t, a.Addr())
	// Delete the key and let the other store claim the name at once.
	if _, err := kv.Delete(s.Key(name), nil); err != nil {
		t.Fatal(err)
	}
	err2 := s2.Publish(ctx, storetest.Descriptor(name, 0, 5))
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(log.String(), "lost") && !strings.Contains(log.String(), "publishing it again") {
		if time.Now().After(deadline) {
			t.Fatalf("the owner noticed nothing in 10 s; log:\n%s", log.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	// Whichever store won the race holds the key alone; the other stops.
	pair, _, err := kv.Get(s.Key(name), nil)
	if err != nil || pair == nil {
		t.Fatalf("key: %+v, %v", pair, err)
	}
	switch pair.Session {
	case s2.Session():
		if err2 != nil || !strings.Contains(log.String(), "lost") {
			t.Fatalf("the other store holds the key (its publish: %v); owner's log:\n%s", err2, log.String())
		}
	case s.Session():
		if err2 == nil {
			t.Fatal("both stores think they published")
		}
	default:
		t.Fatalf("key held by session %q", pair.Session)
	}
	t.Logf("the other store's publish: %v; owner's log:\n%s", err2, log.String())
}

// 2000 keys under the prefix that are not descriptors cost List one log
// line: their count, the first few names (quoted) and the first error.
func TestListSummarizesUnreadableKeys(t *testing.T) {
	a := agent(t)
	p := prefix(t)
	var log testenv.Buffer
	s := open(t, consul.Config{Address: a.Addr(), Prefix: p, Logf: func(f string, args ...any) { fmt.Fprintf(&log, f+"\n", args...) }})
	ctx := ctxT(t, 60*time.Second)
	if err := s.Publish(ctx, storetest.Descriptor("good", 0, 1)); err != nil {
		t.Fatal(err)
	}
	const junk = 2000
	putJunk(t, a.Addr(), p, junk)
	list, err := s.List(ctx)
	if err != nil || len(list) != 1 || list[0].Name != "good" {
		t.Fatalf("List = %v, %v", list, err)
	}
	l := log.String()
	if n := strings.Count(l, "\n"); n != 1 || !strings.Contains(l, fmt.Sprintf("skipped %d unreadable keys", junk)) || !strings.Contains(l, fmt.Sprintf("and %d more", junk-3)) {
		t.Fatalf("%d log lines, want one summary:\n%.2000s", n, l)
	}
	if bytes.ContainsFunc([]byte(strings.TrimSuffix(l, "\n")), func(r rune) bool { return r < 0x20 }) || len(l) > 2000 {
		t.Fatalf("summary of %d bytes, or with control characters: %q", len(l), l)
	}
	t.Logf("%s", l)
}

// putJunk writes n keys under prefix's segments that do not decode (a
// control sequence in their names and values, some huge), 64 to a
// transaction.
func putJunk(t *testing.T, addr, prefix string, n int) {
	t.Helper()
	kv := rawKV(t, addr)
	for i := 0; i < n; {
		var ops api.KVTxnOps
		for ; i < n && len(ops) < 64; i++ {
			v := []byte(fmt.Sprintf("junk \x1b]0;pwned\x07 %d", i))
			if i%500 == 0 {
				v = bytes.Repeat([]byte("\x1b[2J"), 20000)
			}
			ops = append(ops, &api.KVTxnOp{Verb: api.KVSet, Key: fmt.Sprintf("%s/segments/junk%%1b[2J-%05d", prefix, i), Value: v})
		}
		ok, resp, _, err := kv.Txn(ops, nil)
		if err != nil || !ok {
			t.Fatalf("junk txn: %v %v", err, resp)
		}
	}
}
