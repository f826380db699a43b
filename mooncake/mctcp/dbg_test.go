package mctcp

import (
	"io"
	"sync"
	"testing"
	"time"
)

func TestDbgBigWrite(t *testing.T) {
	n := newNode(t, nil, "target", 32<<20, Config{}, nil)
	var wg sync.WaitGroup
	for k := 0; k < 1; k++ {
		r := dialRaw(t, n.tr.Endpoint())
		r.c.SetDeadline(time.Now().Add(3 * time.Second))
		wg.Add(1)
		go func() {
			defer wg.Done()
			go func() {
				for i := 0; i < 2; i++ {
					r.c.Write(hdr(1<<20, n.base()+uint64(k*8+i)<<20, 0x81))
					r.c.Write(make([]byte, 1<<20))
				}
			}()
			for i := 0; i < 2; i++ {
				b := make([]byte, 8)
				if _, err := io.ReadFull(r.c, b); err != nil {
					t.Errorf("conn %d req %d: %v", k, i, err)
					return
				}
			}
			println("TEST sending READ")
			for i := 0; i < 1; i++ {
				r.c.Write(hdr(1<<20, n.base()+uint64(k*8+i)<<20, 0x80))
			}
			for i := 0; i < 1; i++ {
				b := make([]byte, 8+1<<20)
				if _, err := io.ReadFull(r.c, b); err != nil {
					t.Errorf("conn %d read %d: %v", k, i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
}
