// Package ebpf traces the TCP transport's lanes from outside the data path
// with eBPF (github.com/cilium/ebpf, no cgo): per connection the bytes
// sent, acknowledged and received, retransmitted segments, smoothed and
// minimum RTT, state and state changes, and time since the last activity,
// keyed by socket cookie, plus a stream of state-change and retransmit
// events.
//
// Counters are pulled: Snapshot runs an iter/tcp program that reads the
// kernel's own per-connection counters (struct tcp_sock), so tracing adds
// no work per send or receive. Events come from the BTF tracepoints
// inet_sock_set_state and tcp_retransmit_skb, which fire only on state
// changes and retransmissions. fentry/fexit and kprobes are not used: some
// kernels (locked-down guests) refuse them.
//
// The iterator lists the connections of the network namespace the tracer
// runs in; run it in the traced process's namespace. The tracepoints see
// every namespace.
//
// Open needs root (CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN) and a kernel with
// BTF (5.11 or later); without them it returns an error wrapping
// ErrPermission or ErrUnsupported that names what is missing, and the
// engine keeps working untraced: tcp.Transport.Lanes reads the same
// counters per lane with TCP_INFO, without privileges.
//
// The BPF programs are bpf/lanes.bpf.c, compiled by bpf2go into the
// committed lanes_bpfel.go and lanes_bpfel.o (go generate, or make
// generate); building needs no clang.
package ebpf
