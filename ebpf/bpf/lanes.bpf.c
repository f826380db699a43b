// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

/* lanes: per-connection TCP statistics for the transfer engine's lanes.
 *
 * Counters are pulled, never pushed: the iter/tcp program dumps one row per
 * TCP connection (the kernel's own RFC 4898 counters from struct tcp_sock,
 * RTT, state, last activity, cookie, socket inode and cgroup) when user
 * space reads the iterator, so the data path runs no BPF at all. Events
 * come from two BTF tracepoints that fire only on state changes and
 * retransmissions, and only for watched sockets: those user space put in
 * the watch map (the filtered connections of its last pull) and those the
 * filter selects here as they appear (cgroup, port, or a connect() by the
 * traced process). Everything is keyed by socket cookie, the number
 * getsockopt(SO_COOKIE) returns for the same socket. */
#include "lanes.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Set by the loader (.rodata): the filter. */
const volatile __u8 trace_all = 0;       /* no filter: every TCP socket */
const volatile __u64 filter_cgroup = 0;  /* cgroup v2 id (its directory's inode) */
const volatile __u32 filter_tgid = 0;    /* a process: its connect() calls */
const volatile __u8 filter_ports = 0;    /* the ports map is in use */

/* struct row: one connection, as the iterator writes it. */
struct row {
	__u64 cookie;
	__u64 inode;          /* socket inode, 0 when orphaned */
	__u64 cgroup;         /* cgroup v2 id the socket was created in */
	__u64 bytes_sent;
	__u64 bytes_acked;
	__u64 bytes_received;
	__u64 bytes_retrans;
	__u64 mstamp_us;      /* tcp_mstamp: last send or receive, CLOCK_MONOTONIC us */
	__u64 now_ns;         /* CLOCK_MONOTONIC when the row was written */
	__u32 total_retrans;  /* segments */
	__u32 srtt_us;
	__u32 mdev_us;
	__u32 min_rtt_us;
	__u32 snd_cwnd;
	__u32 uid;
	__u32 state_changes;  /* seen by the tracepoint while watched */
	__u32 retrans_events;
	__u16 family;
	__u16 lport;
	__u16 rport;
	__u8 state;
	__u8 watched;
	__u8 laddr[16];       /* IPv4 in the first 4 bytes */
	__u8 raddr[16];
};

enum event_kind { EV_STATE = 1, EV_RETRANS = 2 };

struct event {
	__u64 ts_ns;          /* CLOCK_MONOTONIC */
	__u64 cookie;
	__u64 bytes_acked;
	__u64 bytes_received;
	__u32 kind;
	__u32 old_state;
	__u32 new_state;
	__u32 srtt_us;
	__u32 total_retrans;
	__u16 family;
	__u16 lport;
	__u16 rport;
	__u16 pad;
	__u8 laddr[16];
	__u8 raddr[16];
};

/* Per-socket event counts (state changes, retransmit events) and the
 * counters at the last event: a closed connection's final ones. */
struct conn {
	__u64 last_ns;
	__u64 bytes_acked;
	__u64 bytes_received;
	__u32 state_changes;
	__u32 retrans_events;
	__u32 state;
	__u32 total_retrans;
};

/* LRU: sockets selected here that close before user space sees them are
 * forgotten eventually instead of filling the map. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, __u8);
} watch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u16);
	__type(value, __u8);
} ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, struct conn);
} conns SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 << 10);
} events SEC(".maps");

/* Emit BTF for these so bpf2go generates Go types. */
const struct row *unused_row __attribute__((unused));
const struct event *unused_event __attribute__((unused));

static __always_inline __u64 sk_cgroup(const struct sock *sk)
{
	return BPF_CORE_READ(sk, sk_cgrp_data.cgroup, kn, id);
}

static __always_inline void sk_addrs(const struct sock *sk, __u16 *family, __u16 *lport,
				     __u16 *rport, __u8 *laddr, __u8 *raddr)
{
	*family = sk->__sk_common.skc_family;
	*lport = sk->__sk_common.skc_num;
	*rport = bpf_ntohs(sk->__sk_common.skc_dport);
	if (*family == AF_INET6) {
		BPF_CORE_READ_INTO(laddr, sk, __sk_common.skc_v6_rcv_saddr.in6_u.u6_addr8);
		BPF_CORE_READ_INTO(raddr, sk, __sk_common.skc_v6_daddr.in6_u.u6_addr8);
	} else {
		__u32 l = sk->__sk_common.skc_rcv_saddr, r = sk->__sk_common.skc_daddr;
		__builtin_memcpy(laddr, &l, 4);
		__builtin_memcpy(raddr, &r, 4);
	}
}

/* watched says whether events of sk are wanted, and remembers a socket the
 * filter selects. connect says the caller runs in the connect() of the
 * socket's owner (CLOSE -> SYN_SENT), where the current process is it. */
static __always_inline bool watched(const struct sock *sk, __u64 cookie, bool connect)
{
	if (trace_all)
		return true;
	if (bpf_map_lookup_elem(&watch, &cookie))
		return true;
	bool hit = false;
	if (filter_cgroup && sk_cgroup(sk) == filter_cgroup)
		hit = true;
	if (!hit && filter_ports) {
		__u16 lport = sk->__sk_common.skc_num;
		__u16 rport = bpf_ntohs(sk->__sk_common.skc_dport);
		hit = bpf_map_lookup_elem(&ports, &lport) || bpf_map_lookup_elem(&ports, &rport);
	}
	if (!hit && filter_tgid && connect)
		hit = (bpf_get_current_pid_tgid() >> 32) == filter_tgid;
	if (hit) {
		__u8 one = 1;
		bpf_map_update_elem(&watch, &cookie, &one, BPF_ANY);
	}
	return hit;
}

static __always_inline struct conn *conn_of(__u64 cookie)
{
	struct conn *c = bpf_map_lookup_elem(&conns, &cookie);
	if (c)
		return c;
	struct conn zero = {};
	bpf_map_update_elem(&conns, &cookie, &zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(&conns, &cookie);
}

static __always_inline void emit(const struct sock *sk, __u64 cookie, struct conn *c,
				 __u32 kind, __u32 old_state, __u32 new_state)
{
	struct event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e)
		return;
	__builtin_memset(e, 0, sizeof(*e));
	e->ts_ns = bpf_ktime_get_ns();
	e->cookie = cookie;
	e->kind = kind;
	e->old_state = old_state;
	e->new_state = new_state;
	sk_addrs(sk, &e->family, &e->lport, &e->rport, e->laddr, e->raddr);
	struct tcp_sock *tp = bpf_skc_to_tcp_sock((void *)sk);
	if (tp) {
		e->bytes_acked = tp->bytes_acked;
		e->bytes_received = tp->bytes_received;
		e->srtt_us = tp->srtt_us >> 3;
		e->total_retrans = tp->total_retrans;
	}
	if (c) {
		c->bytes_acked = e->bytes_acked;
		c->bytes_received = e->bytes_received;
		c->total_retrans = e->total_retrans;
	}
	bpf_ringbuf_submit(e, 0);
}

SEC("tp_btf/inet_sock_set_state")
int BPF_PROG(lane_state, const struct sock *sk, int oldstate, int newstate)
{
	if (sk->sk_protocol != IPPROTO_TCP)
		return 0;
	__u64 cookie = bpf_get_socket_cookie((void *)sk);
	if (!watched(sk, cookie, oldstate == TCP_CLOSE && newstate == TCP_SYN_SENT))
		return 0;
	struct conn *c = conn_of(cookie);
	if (c) {
		c->state_changes++;
		c->state = newstate;
		c->last_ns = bpf_ktime_get_ns();
	}
	emit(sk, cookie, c, EV_STATE, oldstate, newstate);
	return 0;
}

SEC("tp_btf/tcp_retransmit_skb")
int BPF_PROG(lane_retransmit, const struct sock *sk, const struct sk_buff *skb)
{
	__u64 cookie = bpf_get_socket_cookie((void *)sk);
	if (!watched(sk, cookie, false))
		return 0;
	struct conn *c = conn_of(cookie);
	if (c) {
		__sync_fetch_and_add(&c->retrans_events, 1);
		c->last_ns = bpf_ktime_get_ns();
	}
	__u32 st = sk->__sk_common.skc_state;
	emit(sk, cookie, c, EV_RETRANS, st, st);
	return 0;
}

SEC("iter/tcp")
int lane_rows(struct bpf_iter__tcp *ctx)
{
	struct sock_common *skc = ctx->sk_common;
	if (!skc)
		return 0;
	/* NULL for time-wait and request sockets: not connections yet or any more */
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(skc);
	if (!tp)
		return 0;
	const struct sock *sk = (const struct sock *)tp;
	if (sk->__sk_common.skc_state == TCP_LISTEN)
		return 0;

	struct row r = {};
	r.cookie = bpf_get_socket_cookie((void *)sk);
	struct socket *so = sk->sk_socket;
	if (so)
		r.inode = BPF_CORE_READ(container_of(so, struct socket_alloc, socket), vfs_inode.i_ino);
	r.cgroup = sk_cgroup(sk);
	r.bytes_sent = tp->bytes_sent;
	r.bytes_acked = tp->bytes_acked;
	r.bytes_received = tp->bytes_received;
	r.bytes_retrans = tp->bytes_retrans;
	r.mstamp_us = tp->tcp_mstamp;
	r.now_ns = bpf_ktime_get_ns();
	r.total_retrans = tp->total_retrans;
	r.srtt_us = tp->srtt_us >> 3;
	r.mdev_us = tp->mdev_us >> 2;
	r.min_rtt_us = tp->rtt_min.s[0].v;
	r.snd_cwnd = tp->snd_cwnd;
	r.uid = ctx->uid;
	r.state = sk->__sk_common.skc_state;
	sk_addrs(sk, &r.family, &r.lport, &r.rport, r.laddr, r.raddr);
	r.watched = bpf_map_lookup_elem(&watch, &r.cookie) != 0;
	struct conn *c = bpf_map_lookup_elem(&conns, &r.cookie);
	if (c) {
		r.state_changes = c->state_changes;
		r.retrans_events = c->retrans_events;
	}
	bpf_seq_write(ctx->meta->seq, &r, sizeof(r));
	return 0;
}
