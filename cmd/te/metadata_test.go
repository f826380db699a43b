package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rdmago/te/internal/testenv"
	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/segment/stores"
	"github.com/rdmago/te/test/consul/consulagent"
)

// startMetadata runs serveMetadata until the test ends and returns its URL.
func startMetadata(t *testing.T, consul string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var out testenv.Buffer
	done := make(chan error, 1)
	go func() { done <- serveMetadata(ctx, &out, "127.0.0.1:0", "/metadata", consul) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), "\n") {
		select {
		case err := <-done:
			t.Fatalf("server ended: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("no URL printed")
		}
		time.Sleep(5 * time.Millisecond)
	}
	f := strings.Fields(out.String())
	if len(f) < 3 || !strings.HasPrefix(f[2], "http://127.0.0.1:") {
		t.Fatalf("output %q", out.String())
	}
	return f[2]
}

func metadataRoundTrip(t *testing.T, u string) {
	t.Helper()
	req, _ := http.NewRequest("PUT", u+"?key=mooncake%2Fram%2Fseg", strings.NewReader(`{"name":"seg"}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("PUT: %d", resp.StatusCode)
	}
	resp, err = http.Get(u + "?key=mooncake%2Fram%2Fseg")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != `{"name":"seg"}` {
		t.Fatalf("GET: %d %q", resp.StatusCode, b)
	}
	// te's own http:// store reads through it: the value is not a valid
	// descriptor, which it says.
	st, err := stores.Open(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Get(context.Background(), "seg"); err == nil || !strings.Contains(err.Error(), "no protocol") {
		t.Fatal(err)
	}
	if _, err := st.Get(context.Background(), "absent"); !errors.Is(err, segment.ErrNotFound) {
		t.Fatal(err)
	}
}

func TestMetadataServe(t *testing.T) {
	metadataRoundTrip(t, startMetadata(t, ""))
}

func TestMetadataServeConsul(t *testing.T) {
	a := consulagent.Start(t)
	u1 := startMetadata(t, a.Addr()+"/mc")
	metadataRoundTrip(t, u1)
	// A second server on the same Consul sees the keys.
	u2 := startMetadata(t, "consul://"+a.Addr()+"/mc")
	resp, err := http.Get(u2 + "?key=mooncake%2Fram%2Fseg")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("second server: %d", resp.StatusCode)
	}
}

func TestMetadataUsage(t *testing.T) {
	for _, args := range [][]string{{"metadata"}, {"metadata", "run"}, {"metadata", "serve", "extra"}, {"metadata", "serve", "--path", "x"}} {
		var out, errb strings.Builder
		if code := runIO(args, &out, &errb); code != 2 {
			t.Errorf("%q: exit %d, stderr %q", args, code, errb.String())
		}
	}
	var out, errb strings.Builder
	if code := runIO([]string{"metadata", "-h"}, &out, &errb); code != 0 {
		t.Errorf("help: exit %d, stderr %q", code, errb.String())
	}
}
