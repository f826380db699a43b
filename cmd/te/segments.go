package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/internal/cli"
	"github.com/rdmago/te/segment"
)

func init() {
	register(command{
		name:    "segments",
		summary: "list segments in a metadata store: name, epoch/version, protocols, buffers, age",
		run:     runSegments,
	})
}

const segmentsUse = "te segments [flags] [name ...]"

func runSegments(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("te segments", segmentsUse,
		"Lists the segments of a metadata store, or the named ones. The p2p store\n"+
			"has no server to enumerate: name the peers (their host:port).", os.Stdout)
	metadata := fs.String("metadata", defaultMetadata(), "metadata store: consul://host:port[/prefix] or p2p (default $TE_METADATA, else p2p)")
	peers := fs.String("peers", "", "comma-separated segment names to fetch (for p2p: the peers' host:port); default: all the store lists")
	asJSON := fs.Bool("json", false, "print the descriptors as JSON (docs/cli.md) instead of a table")
	timeout := &cli.Seconds{D: 10 * time.Second}
	fs.Var(timeout, "timeout", "give up after this `time`")
	authFile := authFlag(fs.FlagSet)
	mc := fs.Bool("mooncake", false, "the peers are Mooncake processes: p2p (P2PHANDSHAKE) metadata is Mooncake's handshake socket")
	fs.Alias("metadata", "metadata_server")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if m := mooncakeMetadata(*metadata); m != "" {
		return fs.Usagef("--metadata %s: %s", cli.Printable(*metadata), m)
	}
	var names []string
	for _, n := range strings.Split(*peers, ",") {
		if n = strings.TrimSpace(n); n != "" {
			names = append(names, n)
		}
	}
	names = append(names, fs.Args()...)
	secret, err := loadAuth(*authFile)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout.D)
	defer cancel()
	var rep *cli.Report[*segment.Descriptor]
	if *asJSON {
		rep = cli.NewReport[*segment.Descriptor](fs)
	}
	return listSegments(ctx, os.Stdout, metadataURI(*metadata, *mc), secret, names, rep, time.Now())
}

// publishedAt is implemented by stores that know when a segment's current
// incarnation was first published (the Consul store does).
type publishedAt interface {
	PublishedAt(name string) (time.Time, bool)
}

// listSegments writes the segments named (or, with no names, all the store
// can list) to w, one row each, or, with rep, as rep's results.
func listSegments(ctx context.Context, w io.Writer, uri string, secret *auth.Secret, names []string, rep *cli.Report[*segment.Descriptor], now time.Time) error {
	u, err := url.Parse(uri)
	if err != nil {
		return fmt.Errorf("--metadata %q: %w", uri, err)
	}
	if u.Scheme == "p2p" && len(names) == 0 {
		return &cli.UsageError{Cmd: "te segments", Use: segmentsUse, Msg: "the p2p store has no server to list: name the peers (--peers host:port,... or as arguments)"}
	}
	st, err := openStore(ctx, uri, secret, stderrLogger())
	if err != nil {
		return err
	}
	defer st.Close()

	var descs []*segment.Descriptor
	var failed []error
	if len(names) == 0 {
		descs, err = st.List(ctx)
		if err != nil {
			return fmt.Errorf("list: %w", err)
		}
	}
	for _, n := range names {
		d, err := st.Get(ctx, n)
		if err != nil {
			failed = append(failed, err)
			fmt.Fprintf(os.Stderr, "te segments: %s: %s\n", cli.Printable(n), cli.ErrorLine(explain(err)))
			continue
		}
		descs = append(descs, d)
	}

	if rep != nil {
		rep.Results = descs
		if err := rep.Write(w); err != nil {
			return err
		}
	} else if len(descs) > 0 {
		pa, _ := st.(publishedAt)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tEPOCH\tVERSION\tPROTOCOLS\tRAILS\tBUFFERS\tAGE")
		for _, d := range descs {
			fmt.Fprintf(tw, "%s\t%#x\t%d\t%s\t%s\t%s\t%s\n", cli.Printable(d.Name), d.Epoch, d.Version,
				protocolsCell(d), railsCell(d), buffersCell(d), ageCell(pa, d.Name, now))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if err := printRails(w, descs); err != nil {
			return err
		}
	} else if len(failed) == 0 {
		fmt.Fprintln(os.Stderr, "te segments: no segments")
	}
	if len(failed) > 0 {
		// Each failure is printed above, with its name: the error says
		// how many, and still wraps them for errors.Is.
		return &summaryErr{fmt.Sprintf("%d of %d segments could not be fetched", len(failed), len(names)), errors.Join(failed...)}
	}
	return nil
}

func protocolsCell(d *segment.Descriptor) string {
	parts := make([]string, 0, len(d.Protocols))
	for _, p := range d.Protocols {
		if p.Endpoint != "" {
			parts = append(parts, cli.Printable(p.Name)+"="+cli.Printable(p.Endpoint))
		} else {
			parts = append(parts, cli.Printable(p.Name))
		}
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ",")
}

func railsCell(d *segment.Descriptor) string {
	rails := railsOf(d)
	parts := make([]string, 0, len(rails.Devices))
	for _, dev := range rails.Devices {
		parts = append(parts, fmt.Sprintf("%s:%d", cli.Printable(dev.Name), dev.Port))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ",")
}

// railsOf returns the RDMA part of d's first entry that has one (te's
// rdma, Mooncake's rdma), or an empty one.
func railsOf(d *segment.Descriptor) *segment.RDMA {
	for _, p := range d.Protocols {
		if p.RDMA != nil {
			return p.RDMA
		}
	}
	return &segment.RDMA{}
}

// printRails lists, for segments with RDMA rails, each rail's address and
// each buffer's rkey on every rail (what an initiator posts with).
func printRails(w io.Writer, descs []*segment.Descriptor) error {
	any := false
	for _, d := range descs {
		any = any || len(railsOf(d).Devices) > 0
	}
	if !any {
		return nil
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEGMENT\tRAIL\tDEVICE\tGID\tLID\tMTU")
	for _, d := range descs {
		for i, dev := range railsOf(d).Devices {
			fmt.Fprintf(tw, "%s\t%d\t%s:%d\t%s\t%d\t%d\n", cli.Printable(d.Name), i, cli.Printable(dev.Name), dev.Port, cli.Printable(dev.GID), dev.LID, dev.MTU)
		}
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "SEGMENT\tBUFFER\tLENGTH\tLOCATION\tRKEYS (by rail)\t")
	for _, d := range descs {
		rails := railsOf(d)
		if len(rails.Devices) == 0 {
			continue
		}
		for j, b := range d.Buffers {
			keys := make([]string, len(rails.Keys(j)))
			for i, k := range rails.Keys(j) {
				keys[i] = fmt.Sprintf("%#x", k)
			}
			loc := b.Location
			if loc == "" {
				loc = "-"
			}
			fmt.Fprintf(tw, "%s\t%#x\t%s\t%s\t%s\t\n", cli.Printable(d.Name), b.Addr, humanBytes(b.Length), cli.Printable(loc), strings.Join(keys, ","))
		}
	}
	return tw.Flush()
}

func buffersCell(d *segment.Descriptor) string {
	var total uint64
	for _, b := range d.Buffers {
		total += b.Length
	}
	return fmt.Sprintf("%d (%s)", len(d.Buffers), humanBytes(total))
}

func humanBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

func ageCell(pa publishedAt, name string, now time.Time) string {
	if pa == nil {
		return "-"
	}
	at, ok := pa.PublishedAt(name)
	if !ok {
		return "-"
	}
	age := now.Sub(at)
	if age < 0 {
		age = 0
	}
	if age >= time.Hour {
		return age.Round(time.Minute).String()
	}
	return age.Round(time.Second).String()
}

// summaryErr counts failures printed one by one, wrapping them.
type summaryErr struct {
	msg  string
	errs error
}

func (e *summaryErr) Error() string { return e.msg }
func (e *summaryErr) Unwrap() error { return e.errs }
