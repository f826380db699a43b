package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
)

func init() {
	register(command{
		name:    "serve",
		summary: "expose a registered buffer as a segment (a bench target) until interrupted",
		run:     func(ctx context.Context, args []string) error { return runServe(ctx, args, os.Stdout, os.Stderr) },
	})
}

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("serve")
	fs.SetOutput(stderr)
	metadata := fs.String("metadata", defaultMetadata(), "metadata store: p2p[://host:port?ports=lo-hi] (embedded, no server) or consul://host:port[/prefix] ($TE_METADATA sets the default; p2p listens on 127.0.0.1)")
	protocol := &protocolsFlag{v: []string{"tcp", "shm"}, ok: []string{"tcp", "shm", "rdma"}}
	fs.Var(protocol, "protocol", "the `transports` to serve: tcp, shm (same-host initiators), rdma, or a comma-separated list")
	bufSize := sizeFlag(256 << 20)
	fs.Var(&bufSize, "buffer-size", "`bytes` of memory to expose (mmap'd, touched lazily)")
	devices := &listFlag{}
	fs.Var(devices, "devices", "RDMA `devices` to serve on, one rail each (rxe0,rxe2); default: every device with an active port")
	listen := fs.String("listen", "", "the transport's data listener, host:port (default: the p2p store's host, else all interfaces, any port)")
	name := fs.String("name", "", "segment name for stores that do not assign one (default hostname/pid; p2p names the segment host:port)")
	authFile := authFlag(fs)
	alias(fs, "metadata", "metadata_server")
	alias(fs, "buffer-size", "buffer_size")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: te serve [flags]\n\n"+
			"Registers a buffer, publishes it as a segment and serves transfers to it\n"+
			"until SIGINT or SIGTERM. Prints the segment name for te bench --segment.\n"+
			"To be reached from other hosts: --metadata 'p2p://0.0.0.0?ports=15000-17000'.\n\nflags:\n")
		printFlags(fs)
	}
	if err := fs.Parse(args); err != nil {
		return usageErr(err)
	}
	if fs.NArg() > 0 {
		return badUsage(stderr, "serve", "unexpected arguments %q", strings.Join(fs.Args(), " "))
	}
	if bufSize <= 0 {
		return badUsage(stderr, "serve", "--buffer-size must be positive")
	}
	secret, err := loadAuth(*authFile)
	if err != nil {
		return err
	}
	n, err := openNode(ctx, nodeConfig{
		metadata: metadataURI(*metadata), auth: secret, name: *name, protocols: protocol.v, listen: *listen, devices: devices.v, bufSize: int64(bufSize),
	})
	if err != nil {
		return err
	}
	defer n.Close()
	defer serveLanes(n.laneLabels)() // for te trace
	d := n.eng.LocalDescriptor()
	fmt.Fprintf(stdout, "segment %s\n", d.Name)
	for _, p := range d.Protocols {
		fmt.Fprintf(stderr, "te serve: %s on %s\n", p.Name, p.Endpoint)
	}
	for _, b := range d.Buffers {
		fmt.Fprintf(stderr, "te serve: buffer %#x, %s (%s)\n", b.Addr, formatSize(int64(b.Length)), b.Location)
	}
	fmt.Fprintf(stderr, "te serve: metadata %s; run: te bench --segment %s --protocol %s\n", metadataURI(*metadata), d.Name, protocol)
	if f, ok := stdout.(*os.File); ok {
		f.Sync()
	}
	<-ctx.Done()
	fmt.Fprintf(stderr, "te serve: stopping\n")
	return n.Close()
}

// usageErr turns a flag parse error (already printed with the usage by the
// flag package) into exit status 2.
func usageErr(err error) error {
	return fmt.Errorf("%w: %w", errUsage, err)
}

// badUsage prints a clear message about a flag value and returns errUsage
// (exit status 2).
func badUsage(w io.Writer, cmd, format string, args ...any) error {
	fmt.Fprintf(w, "te %s: %s\nrun 'te %s -h' for the flags\n", cmd, fmt.Sprintf(format, args...), cmd)
	return errUsage
}
