package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/internal/cli"
	"github.com/rdmago/te/internal/diagnose"
	"github.com/rdmago/te/rdma"
	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/uverbs"
)

func init() {
	register(command{
		name:    "diagnose",
		summary: "walk the layers to a segment with a probe per lane or rail: PASS, or FAIL with the cause and the fix",
		run:     func(ctx context.Context, args []string) error { return runDiagnose(ctx, args, os.Stdout) },
	})
}

const diagnoseUse = "te diagnose [flags] SEGMENT"

// errLayersFailed: te diagnose found a failing layer (exit 1).
var errLayersFailed = errors.New("not every layer passed")

func runDiagnose(ctx context.Context, args []string, stdout io.Writer) error {
	fs := cli.NewFlagSet("te diagnose", diagnoseUse,
		"Walks the layers a transfer to SEGMENT passes, against the live peer: its\n"+
			"descriptor, the transport chosen, the local range, then each tcp lane (dial,\n"+
			"hello, the receiver's range answer, a probe) or rdma rail (port, GID, MTU,\n"+
			"route, QP, timeouts, rkeys, a probe WRITE/READ), and last a transfer through\n"+
			"the engine. One line per layer: PASS, or FAIL with the cause and the fix.\n"+
			"The probes overwrite --probe-size bytes per lane or rail at the start of the\n"+
			"peer's first buffer and restore them. Exit 0 only when every layer passes.", stdout)
	metadata := fs.String("metadata", defaultMetadata(), "metadata store: p2p (the segment is the host:port te serve printed) or consul://host:port[/prefix] ($TE_METADATA sets the default)")
	protocol := fs.String("protocol", "", "check this transport (tcp or rdma); default: the one the engine would choose")
	localSize := cli.NewSize(64 << 10)
	fs.Var(localSize, "local-size", "`bytes` of local memory to register for the probes")
	probeSize := cli.NewSize(4096)
	fs.Var(probeSize, "probe-size", "`bytes` each probe moves")
	timeout := &cli.Seconds{D: diagnose.DefaultTimeout}
	fs.Var(timeout, "timeout", "give up on a step that waits on the peer after this `time`")
	devices := &cli.List{}
	fs.Var(devices, "devices", "local RDMA `devices` to probe from (rxe0,mlx5_1); default: every device with an active port")
	epoch := fs.String("epoch", "", "the segment's epoch a stuck initiator holds (hex, from its log or te segments): checked against the store's")
	asJSON := fs.Bool("json", false, "print the report as JSON (te/v1, docs/cli.md)")
	authFile := authFlag(fs.FlagSet)
	fs.Alias("metadata", "metadata_server")
	fs.Alias("devices", "device_name")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fs.Usagef("name one segment (got %d arguments)", fs.NArg())
	}
	seg := fs.Arg(0)
	if m := mooncakeMetadata(*metadata); m != "" {
		return fs.Usagef("--metadata %s: %s", cli.Printable(*metadata), m)
	}
	uri := metadataURI(*metadata, false)
	if err := checkSegment(fs, uri, seg); err != nil {
		return err
	}
	switch *protocol {
	case "", segment.ProtoTCP, segment.ProtoRDMA:
	default:
		return fs.Usagef("--protocol %s: te diagnose checks tcp or rdma", cli.Printable(*protocol))
	}
	if localSize.N < probeSize.N || probeSize.N <= 0 {
		return fs.Usagef("--local-size %s must hold one --probe-size (%s)", localSize, probeSize)
	}
	var cached *segment.Descriptor
	if *epoch != "" {
		e, err := strconv.ParseUint(strings.TrimPrefix(strings.ToLower(*epoch), "0x"), 16, 64)
		if err != nil {
			return fs.Usagef("--epoch %s: want the hex epoch te segments prints (0x...)", cli.Printable(*epoch))
		}
		cached = &segment.Descriptor{Name: seg, Epoch: e}
	}
	secret, err := loadAuth(*authFile)
	if err != nil {
		return err
	}
	var rep *cli.Report[*diagnose.Report]
	if *asJSON {
		rep = cli.NewReport[*diagnose.Report](fs)
	}

	st, err := openStore(ctx, uri, secret, stderrLogger())
	if err != nil {
		return err
	}
	defer st.Close()
	eng, err := engine.New(engine.Config{Name: "te-diagnose", Store: st, Logger: stderrLogger(), Unlisted: true, MetadataTimeout: timeout.D})
	if err != nil {
		return err
	}
	defer eng.Close()
	protos := []string{*protocol}
	if *protocol == "" {
		protos = []string{segment.ProtoTCP}
		if devs, _ := uverbs.Devices(); len(devs) > 0 {
			protos = append(protos, segment.ProtoRDMA)
		}
	}
	missing := map[string]error{}
	for _, p := range protos {
		tr, err := newTransport(p, "127.0.0.1:0", secret, devices.V, true)
		if err == nil {
			if err = eng.Install(tr); err != nil {
				tr.Driver().Close()
			}
		}
		if err != nil {
			missing[p] = err
		}
	}
	mem, err := engine.Alloc(int(localSize.N))
	if err != nil {
		return fmt.Errorf("--local-size %s: %w", localSize, err)
	}
	defer mem.Close()
	r, err := diagnose.Run(ctx, diagnose.Config{
		Engine: eng, Store: st, Segment: seg, Protocol: *protocol, Local: mem.Bytes(), Register: true,
		Cached: cached, Auth: secret, ProbeSize: int(probeSize.N), Timeout: timeout.D, Missing: missing,
		RDMA: &rdma.Config{Devices: devices.V, Options: verbsOptions},
	})
	if err != nil {
		return err
	}
	if rep != nil {
		rep.Results = []*diagnose.Report{r}
		err = rep.Write(stdout)
	} else {
		err = diagnose.Print(stdout, r)
	}
	if err != nil {
		return err
	}
	if !r.OK() {
		f := r.Failed()
		if len(f) == 0 {
			return errLayersFailed
		}
		return fmt.Errorf("%w: %d failed, the first at %s", errLayersFailed, len(f), strings.TrimSpace(string(f[0].Layer)+" "+f[0].Unit))
	}
	return nil
}
