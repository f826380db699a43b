package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rdmago/te/internal/bench"
)

// printHeader says what the run measures, against what, and how long it
// takes.
func printHeader(w io.Writer, c *benchConfig, env *benchEnv, bufSize int64) {
	where := env.segment
	if env.target != nil {
		where += " (in-process target)"
	}
	fmt.Fprintf(w, "te bench: %s over %s to %s, metadata %s\n", opsLabel(c), strings.Join(env.protos, " and "), where, env.metadataLabel())
	bc := env.config(c.Operation, c.BlockSize)
	rounds, turn := bc.Rounds()
	each := turn * time.Duration(rounds)
	timing := fmt.Sprintf("%v measured per configuration", c.Duration)
	if n := bc.Contenders(); n > 1 {
		names := slices.Clone(env.protos)
		if bc.Memcpy {
			names = append(names, "memcpy")
		}
		if bc.Baseline {
			names = append(names, "baseline")
		}
		timing += fmt.Sprintf(": %s take turns, %v each", strings.Join(names, ", "), roundDuration(each))
	}
	if c.Sweep {
		n := len(sweepBlocks) * len(sweepOps)
		timing += fmt.Sprintf("; %d configurations, %v", n, c.Duration*time.Duration(n))
	}
	buf := c.size(bufSize)
	if c.buf != nil && bufSize == c.buf.N {
		buf = c.buf.String()
	}
	fmt.Fprintf(w, "te bench: block %s, batch %d, threads %d, buffer %s; %s\n",
		blocksLabel(c), c.BatchSize, c.Threads, buf, timing)
}

// roundDuration drops digits nobody reads (666.666666ms).
func roundDuration(d time.Duration) time.Duration {
	if d >= time.Second {
		return d.Round(10 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}

// printProgress writes a progress line: each second while one contender
// measures, after each round while several take turns.
func printProgress(w io.Writer, c *benchConfig, label string, p bench.Progress) {
	if p.Rounds > 1 {
		line := fmt.Sprintf("te bench: round %d/%d  %-12s", p.Round, p.Rounds, label)
		for _, r := range p.Rates {
			line += fmt.Sprintf("  %s %s", r.Name, rate(r.BytesPerSec, c))
		}
		fmt.Fprintln(w, line)
		return
	}
	if len(p.Rates) == 0 {
		return
	}
	if p.Batches == 0 {
		fmt.Fprintf(w, "te bench: %5.0fs  %-12s %s  no batch completed in the last second (each is %d requests of %s)\n",
			p.Elapsed.Seconds(), label, p.Rates[0].Name, c.BatchSize, c.size(c.BlockSize))
		return
	}
	fmt.Fprintf(w, "te bench: %5.0fs  %-12s %s  %s req/s\n", p.Elapsed.Seconds(), label,
		rate(p.Rates[0].BytesPerSec, c), si(p.ReqPerSec))
}

// rate formats bytes per second in the report unit.
func rate(bytesPerSec float64, c *benchConfig) string {
	return num(bytesPerSec, c) + " " + c.ReportUnit + "/s"
}

// num is bytes per second in the report unit, without the unit.
func num(bytesPerSec float64, c *benchConfig) string {
	return strconv.FormatFloat(bytesPerSec/reportUnits[c.ReportUnit], 'f', c.Precision, 64)
}

// si writes a count with a k or M suffix.
func si(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

func latency(us float64) string {
	if us >= 1e6 {
		return fmt.Sprintf("%.2f s", us/1e6)
	}
	if us >= 1000 {
		return fmt.Sprintf("%.2f ms", us/1000)
	}
	return fmt.Sprintf("%.0f µs", us)
}

// latencyFine writes a request's latency: tenths of a microsecond below
// 100 µs.
func latencyFine(us float64) string {
	if us < 100 {
		return fmt.Sprintf("%.1f µs", us)
	}
	return latency(us)
}

func printResult(w io.Writer, c *benchConfig, r *benchResult) {
	if l := r.Latency; l != nil {
		fmt.Fprintf(w, "result: %s %s over %s, one request at a time: latency p50 %s  p90 %s  p99 %s  p99.9 %s  max %s  mean %s  %s req/s\n",
			r.Operation, c.size(r.BlockSize), r.Protocol, latencyFine(l.P50), latencyFine(l.P90), latencyFine(l.P99),
			latencyFine(l.P999), latencyFine(l.Max), latencyFine(l.Mean), si(r.OpsPerSec))
		if r.VsTCP > 0 {
			fmt.Fprintf(w, "compare: %s/tcp %.2f in requests/s (taking turns in this run)\n", r.Protocol, r.VsTCP)
		}
		return
	}
	fmt.Fprintf(w, "result: %s %s over %s: %s  %s req/s  batch latency p50 %s  p99 %s  max %s  %s moved in %.2f s\n",
		r.Operation, c.size(r.BlockSize), r.Protocol, rate(r.GBps*1e9, c), si(r.OpsPerSec),
		latency(r.P50Micros), latency(r.P99Micros), latency(r.MaxMicros),
		strconv.FormatFloat(float64(r.Bytes)/1e9, 'f', 2, 64)+" GB", r.Seconds)
	if r.Verified != nil {
		fmt.Fprintf(w, "verify: %v (pattern written, read back and compared)\n", *r.Verified)
	}
	if r.Notify {
		if r.Notified > 0 {
			by := ""
			if r.NotifyEchoed {
				by = "; echoed by the target, timed by its clock"
			}
			fmt.Fprintf(w, "notify: submit to the target's notification p50 %s  p99 %s  (batch completion at the initiator p50 %s  p99 %s; %d received%s)\n",
				latency(r.NotifyP50Micros), latency(r.NotifyP99Micros), latency(r.P50Micros), latency(r.P99Micros), r.Notified, by)
		} else {
			fmt.Fprintln(w, "notify: every batch carried a notification (its batch latency includes the target taking it); the target runs elsewhere and echoed none back (te serve does: an older one?), so the time to it is not measured here (te serve --print-notifies shows arrivals)")
		}
	}
	if r.VsTCP > 0 {
		fmt.Fprintf(w, "compare: %s/tcp %.2f (taking turns in this run)\n", r.Protocol, r.VsTCP)
	}
	if len(r.Rails) > 0 {
		var total uint64
		for _, rs := range r.Rails {
			total += rs.Bytes
		}
		line := "rails:"
		for _, rs := range r.Rails {
			share := 0.0
			if total > 0 {
				share = 100 * float64(rs.Bytes) / float64(total)
			}
			down := ""
			if !rs.Up {
				down = ", down"
			}
			line += fmt.Sprintf("  %s %s GB (%.0f%%%s)", rs.Device, strconv.FormatFloat(float64(rs.Bytes)/1e9, 'f', 2, 64), share, down)
		}
		fmt.Fprintln(w, line)
	}
	if m := r.Memcpy; m != nil {
		fmt.Fprintf(w, "memcpy: one thread copying the same %s blocks: %s  %s/memcpy %.2f\n",
			c.size(r.BlockSize), rate(m.GBps*1e9, c), r.Protocol, r.VsMemcpy)
	}
	if b := r.Baseline; b != nil {
		fmt.Fprintf(w, "baseline: raw TCP, one loopback connection, %s writes: %s  engine/baseline %.2f\n",
			c.size(r.BlockSize), rate(b.GBps*1e9, c), r.VsBaseline)
	}
}

// sweepTable prints --sweep as a Markdown table, a row as soon as its
// configuration is measured: with one protocol its rate, requests and
// latencies; with several a rate per protocol, the memcpy beside shm and
// the ratios, all measured taking turns.
type sweepTable struct {
	w      io.Writer
	c      *benchConfig
	protos []string
	widths []int
}

func newSweepTable(w io.Writer, c *benchConfig, env *benchEnv) *sweepTable {
	t := &sweepTable{w: w, c: c, protos: env.protos}
	u := c.ReportUnit + "/s"
	hdr := []string{"op", "block"}
	withTCP := slices.Contains(t.protos, "tcp")
	if len(t.protos) == 1 {
		hdr = append(hdr, u, "req/s", "p50 batch", "p99 batch")
	} else {
		for _, p := range t.protos {
			hdr = append(hdr, p+" "+u)
		}
	}
	if t.memcpy() {
		hdr = append(hdr, "memcpy "+u)
	}
	if len(t.protos) > 1 {
		for _, p := range t.protos {
			if p != "tcp" && withTCP {
				hdr = append(hdr, p+"/tcp")
			}
		}
	}
	if t.memcpy() {
		hdr = append(hdr, "shm/memcpy")
	}
	if c.Baseline {
		hdr = append(hdr, "baseline "+u, t.protos[0]+"/baseline")
	}
	for _, h := range hdr {
		t.widths = append(t.widths, max(len(h), 7))
	}
	what := t.protos[0]
	if len(t.protos) > 1 {
		what = strings.Join(t.protos, " vs ") + ", taking turns"
	}
	fmt.Fprintf(w, "\n%s, batch %d, threads %d, %v per configuration, target %s\n\n", what, c.BatchSize, c.Threads, c.Duration, env.segment)
	t.line(hdr)
	sep := make([]string, len(hdr))
	for i := range sep {
		sep[i] = strings.Repeat("-", t.widths[i]+2)
	}
	fmt.Fprintf(w, "|%s|\n", strings.Join(sep, "|"))
	return t
}

func (t *sweepTable) memcpy() bool { return slices.Contains(t.protos, "shm") }

func (t *sweepTable) line(cells []string) {
	var b strings.Builder
	b.WriteString("|")
	for i, cell := range cells {
		fmt.Fprintf(&b, " %-*s |", t.widths[i], cell)
	}
	fmt.Fprintln(t.w, b.String())
}

// row prints one configuration: the results of every protocol.
func (t *sweepTable) row(rs []*benchResult) {
	c := t.c
	r0 := rs[0]
	cells := []string{r0.Operation, c.size(r0.BlockSize)}
	if len(rs) == 1 {
		cells = append(cells, num(r0.GBps*1e9, c), si(r0.OpsPerSec), latency(r0.P50Micros), latency(r0.P99Micros))
	} else {
		for _, r := range rs {
			cells = append(cells, num(r.GBps*1e9, c))
		}
	}
	var shm *benchResult
	for _, r := range rs {
		if r.Protocol == "shm" {
			shm = r
		}
	}
	if t.memcpy() && shm != nil && shm.Memcpy != nil {
		cells = append(cells, num(shm.Memcpy.GBps*1e9, c))
	}
	if len(rs) > 1 {
		for _, r := range rs {
			if r.Protocol != "tcp" && slices.Contains(t.protos, "tcp") {
				cells = append(cells, fmt.Sprintf("%.2f", r.VsTCP))
			}
		}
	}
	if t.memcpy() && shm != nil {
		cells = append(cells, fmt.Sprintf("%.2f", shm.VsMemcpy))
	}
	if b := r0.Baseline; c.Baseline && b != nil {
		cells = append(cells, num(b.GBps*1e9, c), fmt.Sprintf("%.2f", r0.VsBaseline))
	}
	t.line(cells)
}

// latencyTable prints --latency --sweep: per configuration, each
// protocol's p50 and p99 request latency, measured taking turns.
type latencyTable struct{ *sweepTable }

func newLatencyTable(w io.Writer, c *benchConfig, env *benchEnv) latencyTable {
	t := &sweepTable{w: w, c: c, protos: env.protos}
	hdr := []string{"op", "block"}
	for _, p := range t.protos {
		hdr = append(hdr, p+" p50", p+" p99", p+" req/s")
	}
	for _, h := range hdr {
		t.widths = append(t.widths, max(len(h), 9))
	}
	fmt.Fprintf(w, "\n%s, one request at a time (batch 1), threads %d, %v per configuration, target %s\n\n",
		strings.Join(t.protos, " vs "), c.Threads, c.Duration, env.segment)
	t.line(hdr)
	sep := make([]string, len(hdr))
	for i := range sep {
		sep[i] = strings.Repeat("-", t.widths[i]+2)
	}
	fmt.Fprintf(w, "|%s|\n", strings.Join(sep, "|"))
	return latencyTable{t}
}

func (t latencyTable) row(rs []*benchResult) {
	cells := []string{rs[0].Operation, t.c.size(rs[0].BlockSize)}
	for _, r := range rs {
		if l := r.Latency; l != nil {
			cells = append(cells, latencyFine(l.P50), latencyFine(l.P99), si(r.OpsPerSec))
		} else {
			cells = append(cells, "-", "-", si(r.OpsPerSec))
		}
	}
	t.line(cells)
}
