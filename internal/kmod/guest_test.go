package kmod

import (
	"os"
	"testing"

	"github.com/rdmago/te/test/softroce/srenv"
)

// TestFinitModuleInGuest loads a module of the guest's kernel the way a
// host without modprobe does (modules.dep closure, finit_module), one the
// guest's init left unloaded: virtio_blk and its virtio core, unless the
// harness loaded them for SR_OUT.
func TestFinitModuleInGuest(t *testing.T) {
	srenv.Require(t)
	l := Default()
	l.Modprobe = ""
	if l.Loaded("virtio_blk") {
		if os.Getenv("SR_OUT") == "" {
			t.Fatal("virtio_blk is loaded although SR_OUT is unset: the guest's module list changed; pick another module")
		}
		t.Skip("SKIP: SR_OUT loaded virtio_blk; no unloaded module left to load")
	}
	files, err := l.Files("virtio_blk")
	if err != nil || len(files) == 0 {
		t.Fatalf("files: %q %v", files, err)
	}
	t.Logf("loading %q", files)
	if err := l.Load("virtio_blk"); err != nil {
		t.Fatal(err)
	}
	if !l.Loaded("virtio_blk") {
		t.Fatal("virtio_blk loaded without error but /sys/module/virtio_blk is not live")
	}
	if err := l.Load("virtio_blk"); err != nil { // loaded: nothing to do
		t.Fatal(err)
	}
	if ok, err := l.Available("rdma_rxe"); !ok || err != nil || !l.Loaded("rdma_rxe") {
		t.Errorf("rdma_rxe: available %v (%v), loaded %v", ok, err, l.Loaded("rdma_rxe"))
	}
}
