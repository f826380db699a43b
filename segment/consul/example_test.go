package consul_test

import (
	"cmp"
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/segment/consul"
)

// A process publishes its segment under a session it keeps alive; other
// processes read and watch it. The store is $TE_METADATA (te's setting;
// the package's tests point it at their agent), else the agent at
// 127.0.0.1:8500.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	uri := cmp.Or(os.Getenv("TE_METADATA"), "consul://127.0.0.1:8500/te")
	st, err := consul.Open(ctx, uri+"?ttl=10s")
	if err != nil {
		log.Fatal(err) // wraps segment.ErrUnavailable when Consul is down
	}
	defer st.Close() // destroys the session: the segment disappears

	err = st.Publish(ctx, &segment.Descriptor{
		Name:      "10.0.0.5:15001",
		Version:   1, // Epoch 0: the store stamps its own
		Protocols: []segment.Protocol{{Name: segment.ProtoTCP, Endpoint: "10.0.0.5:15002"}},
		Buffers:   []segment.Buffer{{Addr: 0x7f0000000000, Length: 1 << 30}},
	})
	if err != nil {
		log.Fatal(err) // segment.ErrConflict: another process holds the name
	}
	d, err := st.Get(ctx, "10.0.0.5:15001")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(d.Name, d.Version, d.Epoch == st.Epoch())
	// Output: 10.0.0.5:15001 1 true
}
