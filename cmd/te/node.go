package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/internal/cli"
	"github.com/rdmago/te/internal/dma"
	"github.com/rdmago/te/mooncake"
	"github.com/rdmago/te/mooncake/mctcp"
	mcp2p "github.com/rdmago/te/mooncake/p2p"
	"github.com/rdmago/te/rdma"
	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/segment/p2p"
	"github.com/rdmago/te/segment/stores"
	"github.com/rdmago/te/shm"
	"github.com/rdmago/te/tcp"
)

// node is one engine with its metadata store, a transport and one
// registered buffer: what te serve runs and what each side of te bench is.
type node struct {
	store segment.Store
	eng   *engine.Engine
	mem   *engine.Memory
	trs   []engine.Transport
	uri   string // the metadata store's URI as given
}

// nodeConfig says how to build a node.
type nodeConfig struct {
	metadata  string       // metadata URI (p2p://..., consul://...)
	auth      *auth.Secret // cluster secret (--auth-file); nil: none
	name      string       // segment name for stores that do not assign one
	protocols []string     // transports to install: tcp, shm, rdma
	listen    string       // the transport's data listener; "" derives one
	devices   []string     // rdma rails; empty: every device with an active port
	bufSize   int64
	// initiator: the node serves nothing. Its descriptor is not
	// published (its buffer is advertised to nobody), its tcp and shm
	// listen nowhere and its rdma control listener is on loopback,
	// whatever the store's address.
	initiator bool
	// stuckAfter is the engine's Config.StuckAfter; 0: the default.
	stuckAfter time.Duration
}

// openNode opens the store, starts the engine, installs the transport and
// registers a buffer of cfg.bufSize bytes (mmap'd, touched lazily).
func openNode(ctx context.Context, cfg nodeConfig) (_ *node, err error) {
	n := &node{uri: cfg.metadata}
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	log := stderrLogger()
	n.store, err = openStore(ctx, cfg.metadata, cfg.auth, log)
	if err != nil {
		return nil, err
	}
	name, listen := cfg.name, cfg.listen
	// The embedded stores (te's p2p and Mooncake's P2PHANDSHAKE) name the
	// segment after their listener, and the data listener goes on the
	// same interface.
	var named interface {
		Name() string
		ListenAddr() net.Addr
	}
	switch s := n.store.(type) {
	case *p2p.Store:
		named = s
	case *mcp2p.Store:
		named = s
	}
	if named != nil {
		name = named.Name()
		if listen == "" && !cfg.initiator {
			host, _, _ := net.SplitHostPort(named.ListenAddr().String())
			listen = net.JoinHostPort(host, "0")
		}
	}
	if name == "" {
		if name, err = os.Hostname(); err != nil {
			return nil, fmt.Errorf("segment name: %w", err)
		}
		name = fmt.Sprintf("%s/%d", name, os.Getpid())
	}
	switch {
	case listen != "":
	case cfg.initiator:
		listen = "127.0.0.1:0"
	default:
		listen = ":0"
	}
	n.eng, err = engine.New(engine.Config{Name: name, Store: n.store, Logger: log, Unlisted: cfg.initiator, StuckAfter: cfg.stuckAfter})
	if err != nil {
		return nil, err
	}
	for _, p := range cfg.protocols {
		l := listen
		if _, ok := n.store.(*mcp2p.Store); p == mooncake.TEProtoRDMA && (ok || cfg.initiator) {
			// Mooncake's endpoint handshakes arrive on the P2PHANDSHAKE
			// store's socket; an initiator needs none.
			l = ""
		}
		tr, err := newTransport(p, l, cfg.auth, cfg.devices, cfg.initiator)
		if err != nil {
			return nil, err
		}
		if err = n.eng.Install(tr); err != nil {
			tr.Driver().Close()
			return nil, fmt.Errorf("install %s: %w", p, err)
		}
		n.trs = append(n.trs, tr)
		// Mooncake's RDMA endpoint handshakes arrive on its handshake
		// socket, the P2PHANDSHAKE store.
		if rt, ok := tr.(*rdma.Transport); ok && p == mooncake.TEProtoRDMA {
			if st, ok := n.store.(*mcp2p.Store); ok {
				st.HandleConnections(rt)
			}
		}
	}
	// Memory the shm transport can hand to a peer on this host; the other
	// transports take it as well.
	if slices.Contains(cfg.protocols, segment.ProtoSHM) {
		n.mem, err = engine.AllocShared(int(cfg.bufSize))
	} else {
		n.mem, err = engine.Alloc(int(cfg.bufSize))
	}
	if err != nil {
		return nil, &allocError{cfg.bufSize, err}
	}
	if err = n.eng.RegisterLocalMemory(n.mem.Bytes(), "cpu:0"); err != nil {
		return nil, err
	}
	return n, nil
}

// allocError is a node's buffer that could not be mapped; the command
// says what to lower.
type allocError struct {
	size int64
	err  error
}

func (e *allocError) Error() string {
	return fmt.Sprintf("map a buffer of %s: %v", cli.FormatSize(e.size), e.err)
}

func (e *allocError) Unwrap() error { return e.err }

// withAdvice adds what to lower to a buffer that could not be mapped.
func withAdvice(err error, advice string) error {
	var ae *allocError
	if errors.As(err, &ae) {
		return fmt.Errorf("%w: %s", err, advice)
	}
	return err
}

// fitMemory refuses buffers of need bytes in all that this host cannot
// hold (they are mapped lazily: the process would be killed once they are
// touched); advice says what to lower.
func fitMemory(what string, need int64, advice string) error {
	have, err := dma.HostMemory()
	if err != nil || need <= 0 || uint64(need) <= have {
		return nil
	}
	return fmt.Errorf("%s: %s, more than this host's memory (%.1fGiB of RAM and swap): %s",
		what, cli.FormatSize(need), float64(have)/(1<<30), advice)
}

// openStore opens a metadata store; the embedded p2p store gets the
// cluster secret (Consul deployments rely on Consul's ACL token,
// $CONSUL_HTTP_TOKEN, for the metadata).
func openStore(ctx context.Context, uri string, secret *auth.Secret, log *slog.Logger) (segment.Store, error) {
	if _, ok := embedded(uri); !ok {
		metadataServer = uri
	}
	u, err := url.Parse(uri)
	if err != nil || u.Scheme != "p2p" {
		return stores.Open(ctx, uri)
	}
	opts, err := p2p.ParseURI(u)
	if err != nil {
		return nil, err
	}
	opts.Auth, opts.Logger = secret, log
	s, err := p2p.New(ctx, opts)
	if err != nil {
		return nil, err // not a typed nil inside the interface
	}
	return s, nil
}

// stderrLogger is the engine's and the stores' logger: warnings and
// errors on stderr (an unauthenticated listener, failed handshakes),
// what peers and stores chose escaped and cut (cli.NewLogger).
func stderrLogger() *slog.Logger { return cli.NewLogger(os.Stderr, slog.LevelWarn) }

// loadAuth loads the cluster secret named by --auth-file (default
// $TE_AUTH_FILE); nil when neither is set.
func loadAuth(path string) (*auth.Secret, error) {
	if path == "" {
		return nil, nil
	}
	return auth.Load(path)
}

// newTransport builds the transport for --protocol. An initiator's tcp
// and shm listen nowhere (dialOnly); its rdma control listener is on
// listen's host (loopback).
func newTransport(protocol, listen string, secret *auth.Secret, devices []string, dialOnly bool) (engine.Transport, error) {
	switch protocol {
	case "tcp":
		return tcp.New(tcp.Config{Listen: listen, Auth: secret, DialOnly: dialOnly}), nil
	case "shm":
		return shm.New(shm.Config{Secret: secret, DialOnly: dialOnly}), nil
	case "rdma":
		// The control listener goes on the data listener's host; with
		// none given (all interfaces) the transport picks its first
		// rail's address, which peers can reach.
		host, _, _ := net.SplitHostPort(listen)
		ctl := ""
		if a, err := netip.ParseAddr(host); err == nil && !a.IsUnspecified() {
			ctl = net.JoinHostPort(host, "0")
		}
		return rdma.New(rdma.Config{Devices: devices, Listen: ctl, Options: verbsOptions, Auth: secret}), nil
	case mooncake.TEProtoTCP:
		// Mooncake's TCP wire, for Mooncake peers; it has no
		// authentication, so it never runs beside a secret.
		if secret != nil {
			return nil, fmt.Errorf("--protocol mooncake: Mooncake's wire has no authentication; drop --auth-file (and $TE_AUTH_FILE) or use tcp")
		}
		return mctcp.New(mctcp.Config{Listen: listen}), nil
	case mooncake.TEProtoRDMA:
		// Mooncake's RDMA wire: endpoints are set up on the P2PHANDSHAKE
		// store's socket (openNode wires it; listen is then empty) or,
		// with other metadata (HTTP), on a handshake socket of the
		// transport's own on listen, published as rpc_meta.
		if secret != nil {
			return nil, fmt.Errorf("--protocol mooncake-rdma: Mooncake's wire has no authentication; drop --auth-file (and $TE_AUTH_FILE) or use rdma")
		}
		return rdma.New(rdma.Config{Mooncake: true, Devices: devices, Options: verbsOptions, Listen: listen}), nil
	}
	return nil, fmt.Errorf("--protocol %q: unknown (tcp, shm, rdma, mooncake or mooncake-rdma)", protocol)
}

// Close stops the engine (and with it the transport), then frees the
// buffer and closes the store. It is idempotent.
func (n *node) Close() error {
	if n == nil {
		return nil
	}
	var errs []error
	if n.eng != nil {
		errs = append(errs, n.eng.Close())
		n.eng = nil
	} else {
		for _, tr := range n.trs {
			errs = append(errs, tr.Driver().Close())
		}
	}
	n.trs = nil
	if n.mem != nil {
		errs = append(errs, n.mem.Close())
		n.mem = nil
	}
	if n.store != nil {
		errs = append(errs, n.store.Close())
		n.store = nil
	}
	return errors.Join(errs...)
}
