//go:build !amd64 && !arm64

package mlx5

// mmioSupported is false: the doorbell primitives are written in x86-64
// and arm64 assembly only. Context creation fails with ErrNotSupported
// here; the builders and decoders still compile.
const mmioSupported = false

func ringDoorbell(rec *uint32, recVal uint32, reg *uint64, val uint64) {
	panic("mlx5: MMIO primitives not implemented on this GOARCH")
}
func ringBlueFlame(rec *uint32, recVal uint32, reg *uint64, a *uint64, na uintptr, b *uint64, nb uintptr) {
	panic("mlx5: MMIO primitives not implemented on this GOARCH")
}
func storeRecord(rec *uint32, v uint32) {
	panic("mlx5: MMIO primitives not implemented on this GOARCH")
}
func fromDeviceBarrier() {}
