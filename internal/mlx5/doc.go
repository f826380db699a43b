// Package mlx5 holds the mlx5 (ConnectX) driver ABI of the Linux uverbs
// interface as Go data: the driver-private ("udata") structs that travel
// after the core GET_CONTEXT, ALLOC_PD, CREATE_CQ and CREATE_QP commands
// (<rdma/mlx5-abi.h>), the mmap offset encoding for UAR pages, and the
// driver ioctl IDs for dynamic UARs (<rdma/mlx5_user_ioctl_cmds.h>).
//
// Every struct starts with structs.HostLayout, carries `c:"..."` tags naming
// the C member it mirrors, and has compile-time size checks; the layout test
// compiles a C program with gcc against /usr/include/rdma/mlx5-abi.h and
// compares every offset and size with unsafe.Offsetof/Sizeof.
//
// The package also maps UAR pages of the uverbs fd for the provider, since
// only internal/ packages make system calls (queue memory comes from
// internal/dma).
package mlx5
