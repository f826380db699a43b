// Package sock reads what the kernel knows about a TCP socket this process
// holds, without privileges: its cookie (SO_COOKIE, the key eBPF programs
// see for the same socket) and the kernel's per-connection counters
// (TCP_INFO). It also opens listeners inside another network namespace,
// for tests that need a lossy link of their own; reads a socket into
// several buffers with one readv (VecReader); and reads and writes one
// without entering the scheduler (RawIO), for servers that idle between
// short requests; and waits on many sockets in one goroutine with an epoll
// of its own (Poller, RawListener, Vec), for a server whose clients open a
// connection per request.
package sock
