// Package uapi holds the Linux RDMA user ABI as Go data: command numbers,
// ioctl object/method/attribute IDs and the fixed-layout structs exchanged
// with the kernel through /dev/infiniband/uverbsN, plus the Soft-RoCE (rxe)
// shared-queue structs of <rdma/rdma_user_rxe.h>.
//
// Names follow the kernel headers (linux-libc-dev 6.1, x86_64). Each struct
// field carries a `c:"..."` tag naming the C member it mirrors; the layout
// test compiles a C program with gcc against /usr/include/rdma/*.h and checks
// every offset and size, so the Go layouts cannot drift from the headers.
//
// This package does no syscalls and imports no unsafe; it is pure data.
package uapi
