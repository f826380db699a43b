/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The few kernel types lanes.bpf.c reads, instead of a 2.8 MB vmlinux.h.
 * Each struct lists only the fields used and carries preserve_access_index:
 * the loader (CO-RE) relocates every access to the running kernel's layout
 * from its BTF, so these need not match any one kernel's offsets. */
#ifndef TE_LANES_H
#define TE_LANES_H

typedef unsigned char __u8;
typedef short int __s16;
typedef short unsigned int __u16;
typedef int __s32;
typedef unsigned int __u32;
typedef long long int __s64;
typedef long long unsigned int __u64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u32 __wsum;
typedef _Bool bool;
#define true 1
#define false 0

/* uapi/linux/bpf.h */
enum {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_LRU_HASH = 9,
	BPF_MAP_TYPE_RINGBUF = 27,
};
enum {
	BPF_ANY = 0,
	BPF_NOEXIST = 1,
};

#define AF_INET 2
#define AF_INET6 10
#define IPPROTO_TCP 6
/* include/net/tcp_states.h */
#define TCP_CLOSE 7
#define TCP_LISTEN 10
#define TCP_SYN_SENT 2

#pragma clang attribute push(__attribute__((preserve_access_index)), apply_to = record)

struct in6_addr {
	union {
		__u8 u6_addr8[16];
	} in6_u;
};

struct sock_common {
	__be32 skc_daddr;
	__be32 skc_rcv_saddr;
	__be16 skc_dport;
	__u16 skc_num;
	unsigned short skc_family;
	volatile unsigned char skc_state;
	struct in6_addr skc_v6_daddr;
	struct in6_addr skc_v6_rcv_saddr;
};

struct kernfs_node {
	__u64 id;
};

struct cgroup {
	struct kernfs_node *kn;
};

struct sock_cgroup_data {
	struct cgroup *cgroup;
};

struct inode {
	unsigned long i_ino;
};

struct socket {
	short type;
};

/* The socket's inode follows it (net/socket.c); its number is what
 * /proc/PID/fd/N shows as socket:[N]. */
struct socket_alloc {
	struct socket socket;
	struct inode vfs_inode;
};

struct sock {
	struct sock_common __sk_common;
	struct socket *sk_socket;
	__u16 sk_protocol;
	struct sock_cgroup_data sk_cgrp_data;
};

struct minmax_sample {
	__u32 t;
	__u32 v;
};

struct minmax {
	struct minmax_sample s[3];
};

struct tcp_sock {
	__u32 snd_cwnd;
	struct minmax rtt_min;
	__u64 bytes_sent;
	__u32 mdev_us;
	__u64 tcp_mstamp;
	__u32 srtt_us;
	__u64 bytes_received;
	__u64 bytes_acked;
	__u64 bytes_retrans;
	__u32 total_retrans;
};

struct sk_buff;
struct seq_file;

struct bpf_iter_meta {
	struct seq_file *seq;
	__u64 session_id;
	__u64 seq_num;
};

struct bpf_iter__tcp {
	struct bpf_iter_meta *meta;
	struct sock_common *sk_common;
	__u32 uid;
};

#pragma clang attribute pop

#endif
