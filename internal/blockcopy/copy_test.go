package blockcopy

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
)

// region is page-aligned memory outside the Go heap, as the data paths'.
func region(t testing.TB, n int) []byte {
	t.Helper()
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Munmap(b) })
	return b
}

func fill(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 1))
	var w [8]byte
	for i := 0; i < len(b); i += 8 {
		binary.LittleEndian.PutUint64(w[:], r.Uint64())
		copy(b[i:], w[:])
	}
}

// TestCopy checks Copy against the built-in copy for sizes around the
// string move's bounds, aligned and not, with src and dst of different
// lengths, and that nothing outside the copied range is written.
func TestCopy(t *testing.T) {
	const pad = 256
	mem := region(t, 2*(maxRep+2*pad+4096))
	half := len(mem) / 2
	sizes := []int{0, 1, 63, 64, 4095, minRep - 1, minRep, minRep + 1, 4096 + 64, 64 << 10, maxRep - 1, maxRep, maxRep + 64}
	for _, n := range sizes {
		for _, doff := range []int{0, 1, 8, 64} {
			for _, extra := range []int{0, 3} {
				if n+doff+extra+2*pad > half {
					continue
				}
				src := mem[pad : pad+n+extra]
				dst := mem[half+pad+doff : half+pad+doff+n]
				fill(mem, uint64(n*131+doff))
				want := bytes.Clone(mem[half:])
				copy(want[pad+doff:], src[:n])
				if got := Copy(dst, src); got != n {
					t.Fatalf("n %d doff %d: Copy returned %d", n, doff, got)
				}
				if !bytes.Equal(mem[half:], want) {
					t.Fatalf("n %d doff %d extra %d: destination differs from the built-in copy's", n, doff, extra)
				}
			}
		}
	}
}

// TestCopyOverlap: overlapping ranges, either way, move as the built-in
// copy moves them.
func TestCopyOverlap(t *testing.T) {
	mem := region(t, 4*minRep)
	for _, shift := range []int{-2 * 64, -1, 1, 64, minRep / 2} {
		for _, n := range []int{minRep, 2 * minRep} {
			fill(mem, uint64(n+shift))
			want := bytes.Clone(mem)
			s, d := minRep/2, minRep/2+shift
			copy(want[d:d+n], want[s:s+n])
			if got := Copy(mem[d:d+n], mem[s:s+n]); got != n {
				t.Fatalf("shift %d n %d: Copy returned %d", shift, n, got)
			}
			if !bytes.Equal(mem, want) {
				t.Fatalf("shift %d n %d: overlapping copy differs from the built-in copy's", shift, n)
			}
		}
	}
}

// TestCopyRandom: random sizes, offsets and lengths against copy.
func TestCopyRandom(t *testing.T) {
	mem := region(t, 1<<20)
	r := rand.New(rand.NewPCG(7, 7))
	want := make([]byte, len(mem))
	for range 200 {
		fill(mem, r.Uint64())
		copy(want, mem)
		n := r.IntN(300 << 10)
		so, do := r.IntN(len(mem)-n), r.IntN(len(mem)-n)
		if r.IntN(2) == 0 {
			do &^= 63
		}
		copy(want[do:do+n], want[so:so+n])
		Copy(mem[do:do+n], mem[so:so+n])
		if !bytes.Equal(mem, want) {
			t.Fatalf("n %d src %d dst %d: differs from the built-in copy's", n, so, do)
		}
	}
}

func TestCopyAllocs(t *testing.T) {
	mem := region(t, 2*minRep)
	if a := testing.AllocsPerRun(100, func() { Copy(mem[:minRep], mem[minRep:]) }); a != 0 {
		t.Fatalf("Copy allocates %v times", a)
	}
}

// BenchmarkCopy compares Copy with the built-in copy on 512 KiB of
// blocks (the shm bench's batch of 128 × 4 KiB), page-aligned and with
// the destination 8 bytes off.
func BenchmarkCopy(b *testing.B) {
	for _, blk := range []int{2 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10} {
		for _, off := range []int{0, 8} {
			n := max(1, (512<<10)/blk)
			src := region(b, n*blk)
			dst := region(b, n*blk+4096)[off:]
			for _, f := range []struct {
				name string
				fn   func(d, s []byte) int
			}{{"builtin", func(d, s []byte) int { return copy(d, s) }}, {"blockcopy", Copy}} {
				b.Run(fmt.Sprintf("block=%d/off=%d/%s", blk, off, f.name), func(b *testing.B) {
					b.SetBytes(int64(n * blk))
					for b.Loop() {
						for i := 0; i < n; i++ {
							f.fn(dst[i*blk:(i+1)*blk], src[i*blk:(i+1)*blk])
						}
					}
				})
			}
		}
	}
}
