package ebpf

// lanes_bpfel.go and lanes_bpfel.o are generated from bpf/lanes.bpf.c and
// committed, so building te needs no clang. Regenerate with `make generate`
// (Debian: clang, llvm, libbpf-dev).
//go:generate go tool bpf2go -tags linux -target bpfel -type row -type event -type conn lanes bpf/lanes.bpf.c -- -I./bpf -O2 -g -Wall -Werror
