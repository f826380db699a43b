//go:build !amd64

package blockcopy

// useRep: there is no string move here; Copy is the built-in copy.
const useRep = false

func repMove(dst, src []byte) { copy(dst, src) }
