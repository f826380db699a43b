package shm

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
)

// TestAuth: with a cluster secret on the target, only initiators holding
// the same secret get its memory; an initiator with a secret refuses a
// target without one.
func TestAuth(t *testing.T) {
	secret := func(k string) *auth.Secret {
		s, err := auth.New([]byte(k))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	good, other := secret("the cluster secret, 32 bytes ok"), secret("another secret of some length!!")
	for _, c := range []struct {
		name     string
		tgt, ini *auth.Secret
		ok       bool
		want     error
	}{
		{"both", good, good, true, nil},
		{"neither", nil, nil, true, nil},
		{"initiator without", good, nil, false, auth.ErrDenied},
		{"wrong secret", good, other, false, auth.ErrDenied},
		{"target without", nil, good, false, auth.ErrUnauthenticated},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := enginetest.NewMemStore()
			defer st.Close()
			ttr := New(Config{Secret: c.tgt, IOTimeout: 2 * time.Second})
			tgt := enginetest.NewNode(t, engine.Config{Name: "target", Store: st}, 0, ttr)
			mem, err := engine.AllocShared(1 << 16)
			if err != nil {
				t.Fatal(err)
			}
			defer mem.Close()
			if err := tgt.Engine.RegisterLocalMemory(mem.Bytes(), ""); err != nil {
				t.Fatal(err)
			}
			itr := New(Config{Secret: c.ini, IOTimeout: 2 * time.Second})
			ini := enginetest.NewNode(t, engine.Config{Name: "initiator", Store: st}, 0, itr)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err = ini.Engine.OpenSegment(ctx, "target", nil)
			if c.ok {
				if err != nil {
					t.Fatal(err)
				}
				if st := itr.Stats(); st.Mapped != 1 {
					t.Fatalf("%+v", st)
				}
				return
			}
			if err == nil {
				t.Fatal("connected")
			}
			if !errors.Is(err, c.want) {
				t.Errorf("error %v, want %v", err, c.want)
			}
			if st := itr.Stats(); st.Mapped != 0 || st.Peers != 0 {
				t.Errorf("initiator holds %+v after a refused handshake", st)
			}
			eventually(t, 5*time.Second, "target drops the connection", func() bool { return ttr.Stats().Served == 0 })
		})
	}
}
