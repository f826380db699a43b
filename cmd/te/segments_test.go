package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rdmago/te/internal/cli"
	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/segment/consul"
	"github.com/rdmago/te/segment/p2p"
	"github.com/rdmago/te/segment/storetest"
	"github.com/rdmago/te/test/consul/consulagent"
)

func TestSegmentsConsul(t *testing.T) {
	a := consulagent.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	owner, err := consul.New(ctx, consul.Config{Address: a.Addr(), Prefix: "cli", Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	for _, d := range []*segment.Descriptor{storetest.Descriptor("host-a:15001", 0xa1, 3), storetest.Descriptor("host-b:15001", 0, 1)} {
		if err := owner.Publish(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	uri := a.URI("cli")

	var out bytes.Buffer
	if err := listSegments(ctx, &out, uri, nil, nil, nil, time.Now().Add(90*time.Second)); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", out.String())
	table, _, _ := strings.Cut(out.String(), "\n\n") // the rails section follows
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "NAME") {
		t.Fatalf("want a header and two rows:\n%s", out.String())
	}
	rowA := regexp.MustCompile(`^host-a:15001\s+0xa1\s+3\s+tcp=127\.0\.0\.1:15002,rdma=127\.0\.0\.1:15003\s+rxe0:1\s+2 \(1\.1 MiB\)\s+1m3\ds$`)
	if !rowA.MatchString(lines[1]) {
		t.Fatalf("row %q does not match %v", lines[1], rowA)
	}
	rowB := regexp.MustCompile(`^host-b:15001\s+` + regexp.QuoteMeta(fmt.Sprintf("%#x", owner.Epoch())) + `\s+1\s`)
	if !rowB.MatchString(lines[2]) {
		t.Fatalf("row %q does not match %v", lines[2], rowB)
	}

	// Named segments, JSON; an unknown name is reported and fails the run.
	out.Reset()
	rep := cli.NewReport[*segment.Descriptor](cli.NewFlagSet("te segments", segmentsUse, "", io.Discard))
	err = listSegments(ctx, &out, uri, nil, []string{"host-a:15001", "nobody:1"}, rep, time.Now())
	if !errors.Is(err, segment.ErrNotFound) {
		t.Fatalf("unknown name: err = %v, want ErrNotFound", err)
	}
	ds := decodeReport[segment.Descriptor](t, "segments", out.Bytes())
	if len(ds) != 1 || ds[0].Name != "host-a:15001" || ds[0].Version != 3 {
		t.Fatalf("JSON output %q: %+v", out.String(), ds)
	}
}

func TestSegmentsP2P(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	peer, err := p2p.New(ctx, p2p.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	if err := peer.Publish(ctx, storetest.Descriptor(peer.Name(), 7, 2)); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := listSegments(ctx, &out, metadataURI("p2p", false), nil, []string{peer.Name()}, nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", out.String())
	if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(peer.Name()) + `\s+0x7\s+2\s+tcp=\S+\s+rxe0:1\s+2 \(1\.1 MiB\)\s+-$`).MatchString(out.String()) {
		t.Fatalf("no row for the peer:\n%s", out.String())
	}
	var ue *cli.UsageError
	if err := listSegments(ctx, &out, metadataURI("p2p", false), nil, nil, nil, time.Now()); !errors.As(err, &ue) {
		t.Fatalf("p2p without peers: %v, want a usage error", err)
	}
}

// A descriptor is data from other processes: control characters in its
// strings never reach the terminal raw.
func TestSegmentsTableEscapes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	peer, err := p2p.New(ctx, p2p.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	d := storetest.Descriptor(peer.Name(), 7, 2)
	d.Protocols[0].Endpoint = "\x1b[2J\x1b[31mhost:1\r\n"
	d.Protocols[1].RDMA.Devices[0].Name = "rxe\x070"
	if err := peer.Publish(ctx, d); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := listSegments(ctx, &out, metadataURI("p2p", false), nil, []string{peer.Name()}, nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	table, rails, _ := strings.Cut(out.String(), "\n\n")
	if strings.ContainsAny(out.String()[:len(out.String())-1], "\x1b\x07\r") || strings.Count(table, "\n") != 1 {
		t.Fatalf("control characters reached the table: %q", out.String())
	}
	// The rails section lists each rail and every buffer's rkey per rail.
	if !strings.Contains(rails, "fe80::1") || !strings.Contains(rails, fmt.Sprintf("%#x", d.Protocols[1].RDMA.Keys(0)[0])) {
		t.Fatalf("rails section lacks the GID or an rkey: %q", rails)
	}
	if !strings.Contains(out.String(), `tcp=\x1b[2J\x1b[31mhost:1\r\n`) || !strings.Contains(out.String(), `rxe\a0:1`) {
		t.Fatalf("escaped strings missing: %q", out.String())
	}
}
