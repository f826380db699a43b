package transporttest

import (
	"encoding/binary"
	"fmt"
)

// The suite checks data against a seekable pseudo-random pattern instead
// of copies: both processes of a cross-process run can produce the bytes
// any range should hold from a seed, so the target checks what arrived
// without the initiator sending it a second time over another path.
//
// Byte p of pattern seed is byte p%8 (little-endian) of word(seed, p/8).

// word is splitmix64 of the word index: every byte of a range differs
// between seeds and between positions.
func word(seed, k uint64) uint64 {
	z := seed + (k+1)*0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// Pattern fills b with the bytes at positions pos .. pos+len(b) of the
// pattern of seed.
func Pattern(b []byte, seed, pos uint64) {
	i := 0
	for ; i < len(b) && (pos+uint64(i))%8 != 0; i++ {
		p := pos + uint64(i)
		b[i] = byte(word(seed, p/8) >> (8 * (p % 8)))
	}
	for ; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], word(seed, (pos+uint64(i))/8))
	}
	for ; i < len(b); i++ {
		p := pos + uint64(i)
		b[i] = byte(word(seed, p/8) >> (8 * (p % 8)))
	}
}

// CheckPattern reports the first byte of b that is not the pattern of seed
// at positions pos .. pos+len(b), nil when all match.
func CheckPattern(b []byte, seed, pos uint64) error {
	var buf [4096]byte
	for done := 0; done < len(b); {
		n := min(len(buf), len(b)-done)
		want := buf[:n]
		Pattern(want, seed, pos+uint64(done))
		got := b[done : done+n]
		if string(got) != string(want) { // compiles to a memequal, no allocation
			for i := range got {
				if got[i] != want[i] {
					return fmt.Errorf("byte %d of %d is %#02x, want %#02x (pattern %#x)", done+i, len(b), got[i], want[i], seed)
				}
			}
		}
		done += n
	}
	return nil
}
