package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
)

// pattern fills b with bytes derived from seed, so that a receiver knowing
// seed can check every byte.
func pattern(b []byte, seed uint64) {
	x := seed | 1
	for i := 0; i < len(b); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], x)
		copy(b[i:], w[:])
	}
}

func patternOK(b []byte, seed uint64) bool {
	x := seed | 1
	for i := 0; i < len(b); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], x)
		if string(b[i:min(i+8, len(b))]) != string(w[:min(8, len(b)-i)]) {
			return false
		}
	}
	return true
}

// noteMsg is what the ordering tests' notes carry: which submitter, which
// round, the pattern's seed, and where its bytes went.
type noteMsg struct {
	who, round int
	seed       uint64
	off, n     uint64
}

func (m noteMsg) encode() []byte {
	b := make([]byte, 40)
	binary.LittleEndian.PutUint64(b[0:], uint64(m.who))
	binary.LittleEndian.PutUint64(b[8:], uint64(m.round))
	binary.LittleEndian.PutUint64(b[16:], m.seed)
	binary.LittleEndian.PutUint64(b[24:], m.off)
	binary.LittleEndian.PutUint64(b[32:], m.n)
	return b
}

func decodeNoteMsg(b []byte) (noteMsg, bool) {
	if len(b) != 40 {
		return noteMsg{}, false
	}
	return noteMsg{
		who: int(binary.LittleEndian.Uint64(b[0:])), round: int(binary.LittleEndian.Uint64(b[8:])),
		seed: binary.LittleEndian.Uint64(b[16:]), off: binary.LittleEndian.Uint64(b[24:]), n: binary.LittleEndian.Uint64(b[32:]),
	}, true
}

// TestNotifyAfterData: under concurrent submitters, with submissions of 1
// to 4096 tasks spread over one to four lanes (and slices cut small), the
// target checks every byte of a submission the moment its notification
// arrives: never before the data, never lost on success, never twice.
func TestNotifyAfterData(t *testing.T) {
	const (
		submitters = 4
		region     = 16 << 20
	)
	shapes := []struct{ tasks, size int }{{1, 64}, {7, 4096}, {300, 1024}, {4096, 64}, {4096, 4096}, {64, 256 << 10}}
	rounds := len(shapes) * 2
	p := newPair(t, submitters*region, submitters*region, Config{SliceSize: 64 << 10})
	acks := make([]chan error, submitters)
	for i := range acks {
		acks[i] = make(chan error, 1)
	}
	// The target's checker: the notification says which bytes must be
	// there now.
	seen := make(map[[2]int]int)
	var checkErr error
	checkDone := make(chan struct{})
	go func() {
		defer close(checkDone)
		for n := range p.tgt.e.Notifications() {
			m, ok := decodeNoteMsg(n.Msg)
			var err error
			switch {
			case !ok || n.From != "initiator" || n.FromEpoch != p.ini.e.Epoch():
				err = fmt.Errorf("notification %+v: bad sender or message", n)
			case n.Bytes != m.n:
				err = fmt.Errorf("notification for %d bytes, submission had %d", n.Bytes, m.n)
			case !patternOK(p.tgt.buf()[m.off:m.off+m.n], m.seed):
				err = fmt.Errorf("submitter %d round %d: notified before its %d bytes landed", m.who, m.round, m.n)
			}
			seen[[2]int{m.who, m.round}]++
			if c := seen[[2]int{m.who, m.round}]; c > 1 && err == nil {
				err = fmt.Errorf("submitter %d round %d notified %d times", m.who, m.round, c)
			}
			if err != nil && checkErr == nil {
				checkErr = err
			}
			if m.who >= 0 && m.who < submitters {
				acks[m.who] <- err
			}
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, submitters)
	for w := range submitters {
		wg.Go(func() {
			b, err := p.ini.e.AllocateBatch(4096)
			if err != nil {
				errs <- err
				return
			}
			defer p.ini.e.FreeBatch(b)
			reqs := make([]engine.Request, 4096)
			for r := range rounds {
				sh := shapes[(r+w)%len(shapes)]
				off := uint64(w * region)
				n := uint64(sh.tasks * sh.size)
				seed := uint64(w)<<32 | uint64(r)<<8 | 0x5a
				pattern(p.ini.buf()[off:off+n], seed)
				for i := range sh.tasks {
					o := off + uint64(i*sh.size)
					reqs[i] = engine.Request{Op: engine.Write, Local: p.ini.buf()[o : o+uint64(sh.size)], Target: p.seg, TargetAddr: p.tgt.base() + o}
				}
				msg := noteMsg{who: w, round: r, seed: seed, off: off, n: n}.encode()
				err := p.ini.e.SubmitNotify(b, reqs[:sh.tasks], engine.Notify{Name: "kv", Msg: msg})
				if err == nil {
					err = p.ini.e.Wait(ctxT(t, 30*time.Second), b)
				}
				if err == nil {
					select {
					case err = <-acks[w]:
					case <-time.After(30 * time.Second):
						err = errors.New("no notification within 30s of the batch's completion")
					}
				}
				if err == nil {
					err = p.ini.e.FreeBatch(b)
				}
				if err == nil {
					b, err = p.ini.e.AllocateBatch(4096)
				}
				if err != nil {
					errs <- fmt.Errorf("submitter %d round %d (%d×%d B): %w", w, r, sh.tasks, sh.size, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	p.tgt.e.Close()
	<-checkDone
	if checkErr != nil {
		t.Fatal(checkErr)
	}
	if len(seen) != submitters*rounds {
		t.Fatalf("%d notifications for %d submissions", len(seen), submitters*rounds)
	}
}
