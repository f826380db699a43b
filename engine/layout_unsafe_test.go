package engine

import (
	"testing"
	"unsafe"
)

// unsafe here only measures the task type (Sizeof, Offsetof): nothing is
// read or written through a pointer.

// TestTaskLayout: a task is a whole number of cache lines, so that every
// task of a batch starts one, and what completing it reads lies in its
// first line (see task).
func TestTaskLayout(t *testing.T) {
	if n := unsafe.Sizeof(task{}); n%64 != 0 {
		t.Errorf("task is %d bytes, not a multiple of 64: adjust its padding", n)
	}
	if off := unsafe.Offsetof(task{}.nslices); off >= 64 {
		t.Errorf("task.nslices at offset %d: outside the first cache line", off)
	}
}
