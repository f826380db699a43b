package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/rdmago/te/ebpf"
	"github.com/rdmago/te/internal/cli"
)

func init() {
	register(command{
		name:    "trace",
		summary: "per-lane TCP table of te processes (peer, lane, throughput, RTT, retransmits, state), traced with eBPF",
		run:     func(ctx context.Context, args []string) error { return runTrace(ctx, args, os.Stdout, os.Stderr) },
	})
}

func runTrace(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("te trace", "te trace [--pid N | --cgroup DIR] [flags]",
		"Traces the TCP lanes of a running te serve or te bench from outside, with\n"+
			"eBPF (needs root): one row per connection, refreshed each --interval.\n"+
			"Peers and lane numbers come from the te processes themselves; a\n"+
			"connection te did not make shows its remote address. Without --pid or\n"+
			"--cgroup every TCP connection of this network namespace is shown.", stdout)
	pid := fs.Int("pid", 0, "trace the TCP connections of this `process`")
	cgroup := fs.String("cgroup", "", "trace the TCP connections made in this cgroup v2 `directory`")
	asJSON := fs.Bool("json", false, "print one snapshot as JSON (throughput over one --interval) and exit (docs/cli.md)")
	interval := &cli.Seconds{D: time.Second}
	fs.Var(interval, "interval", "`time` between refreshes")
	count := fs.Int("count", 0, "refresh this many times, then exit (0: until interrupted)")
	events := fs.Bool("events", false, "also print state changes and retransmissions as they happen")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fs.Usagef("unexpected arguments %q (te trace takes only flags)", strings.Join(fs.Args(), " "))
	}
	if *pid != 0 && *cgroup != "" {
		return fs.Usagef("--pid and --cgroup: give one")
	}
	if *pid < 0 || *count < 0 {
		return fs.Usagef("--pid and --count must not be negative")
	}
	tr, err := ebpf.Open(ebpf.Filter{PID: *pid, Cgroup: *cgroup})
	if err != nil {
		return err
	}
	defer tr.Close()
	if *events {
		go func() {
			for e := range tr.Events() {
				fmt.Fprintf(stderr, "%s %v\n", e.Time.Format("15:04:05.000000"), e)
			}
		}()
	}
	what := "every TCP connection"
	switch {
	case *pid != 0:
		what = "pid " + strconv.Itoa(*pid)
	case *cgroup != "":
		what = "cgroup " + *cgroup
	}
	prev, err := tr.Snapshot()
	if err != nil {
		return err
	}
	prevAt := time.Now()
	tick := time.NewTicker(interval.D)
	defer tick.Stop()
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		cur, err := tr.Snapshot()
		if err != nil {
			return err
		}
		now := time.Now()
		labels, _ := allLanes() // unlabelled rows show addresses
		rows := traceRows(cur, prev, now.Sub(prevAt), labels)
		if *asJSON {
			rep := cli.NewReport[traceRow](fs)
			rep.Time = prevAt.UTC()
			rep.Results = rows
			return rep.Write(stdout)
		}
		fmt.Fprintf(stdout, "te trace: %s, %d connections, %s\n", what, len(rows), now.Format("15:04:05"))
		printTraceTable(stdout, rows)
		fmt.Fprintln(stdout)
		if *count > 0 && n >= *count {
			return nil
		}
		prev, prevAt = cur, now
	}
}

// traceRow is one connection in te trace's and te bench --trace's tables.
type traceRow struct {
	Peer          string  `json:"peer"`
	Lane          string  `json:"lane"`
	State         string  `json:"state"`
	Local         string  `json:"local"`
	Remote        string  `json:"remote"`
	BytesAcked    uint64  `json:"bytes_acked"`
	BytesReceived uint64  `json:"bytes_received"`
	TxBps         float64 `json:"tx_bytes_per_s"`
	RxBps         float64 `json:"rx_bytes_per_s"`
	SRTTMicros    float64 `json:"srtt_us"`
	MinRTTMicros  float64 `json:"min_rtt_us"`
	Retransmits   uint32  `json:"retransmits"`
	StateChanges  uint32  `json:"state_changes"`
	IdleMillis    float64 `json:"idle_ms"`
	Closed        bool    `json:"closed"`
	Cookie        uint64  `json:"cookie"`
}

// traceRows labels cur with the lanes te processes listed and computes
// throughput against prev, dt earlier.
func traceRows(cur, prev []ebpf.Conn, dt time.Duration, labels []laneLabel) []traceRow {
	byCookie := map[uint64]laneLabel{}
	byPair := map[[2]string]laneLabel{}  // where the kernel gave no cookie
	byAddrs := map[[2]string]laneLabel{} // initiator lanes by local, remote
	for _, l := range labels {
		if l.Cookie != 0 {
			byCookie[l.Cookie] = l
		}
		byPair[[2]string{l.Local, l.Remote}] = l
		if !l.Accepted {
			byAddrs[[2]string{l.Local, l.Remote}] = l
		}
	}
	before := map[uint64]ebpf.Conn{}
	for _, c := range prev {
		before[c.Cookie] = c
	}
	rows := make([]traceRow, 0, len(cur))
	for _, c := range cur {
		r := traceRow{
			Peer: c.Remote.String(), Lane: "-", State: c.State.String(), Local: c.Local.String(), Remote: c.Remote.String(),
			BytesAcked: c.BytesAcked, BytesReceived: c.BytesReceived,
			SRTTMicros: micros(c.SRTT), MinRTTMicros: micros(c.MinRTT), Retransmits: c.Retransmits,
			StateChanges: c.StateChanges, IdleMillis: float64(c.Idle) / float64(time.Millisecond),
			Closed: c.Closed, Cookie: c.Cookie,
		}
		l, ok := byCookie[c.Cookie]
		if !ok && c.Cookie == 0 {
			l, ok = byPair[[2]string{r.Local, r.Remote}]
		}
		if ok {
			if !l.Accepted {
				r.Peer, r.Lane = l.Peer, fmt.Sprintf("%d g%d", l.Lane, l.Gen)
			} else if il, ok := byAddrs[[2]string{r.Remote, r.Local}]; ok {
				// Accepted from a te process that listed the lane.
				r.Peer, r.Lane = il.Segment, fmt.Sprintf("%d g%d in", il.Lane, il.Gen)
			} else {
				r.Lane = "in"
			}
		}
		// A connection new since prev moved all its bytes within dt.
		if p := before[c.Cookie]; dt > 0 {
			r.TxBps = float64(c.BytesAcked-min(p.BytesAcked, c.BytesAcked)) / dt.Seconds()
			r.RxBps = float64(c.BytesReceived-min(p.BytesReceived, c.BytesReceived)) / dt.Seconds()
		}
		rows = append(rows, r)
	}
	return rows
}

func printTraceTable(w io.Writer, rows []traceRow) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PEER\tLANE\tSTATE\tLOCAL\tREMOTE\tSENT\tRECEIVED\tTX MB/s\tRX MB/s\tSRTT\tMIN RTT\tRETRANS\tIDLE")
	for _, r := range rows {
		st := r.State
		if r.Closed {
			st += " (gone)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f\t%.1f\t%s\t%s\t%d\t%s\n",
			cli.Printable(r.Peer), cli.Printable(r.Lane), st, r.Local, r.Remote, bytesLabel(r.BytesAcked), bytesLabel(r.BytesReceived),
			r.TxBps/1e6, r.RxBps/1e6, usLabel(r.SRTTMicros), usLabel(r.MinRTTMicros), r.Retransmits,
			(time.Duration(r.IdleMillis * float64(time.Millisecond))).Round(time.Millisecond))
	}
	tw.Flush()
}

func bytesLabel(n uint64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2f GB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.1f MB", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1f KB", float64(n)/1e3)
	}
	return fmt.Sprintf("%d B", n)
}

func usLabel(us float64) string {
	if us >= 1000 {
		return fmt.Sprintf("%.1fms", us/1000)
	}
	return fmt.Sprintf("%.0fµs", us)
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
