package diagnose

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/rdmago/te/internal/cli"
)

// Print writes the report as text: one line per layer (status, layer,
// unit, what was found), a fix line under each failure, then a summary.
func Print(w io.Writer, r *Report) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, c := range r.Checks {
		unit := c.Unit
		if unit == "" {
			unit = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", c.Status, c.Layer, unit, line(c.Detail))
		if c.Status == Fail && c.Fix != "" {
			fmt.Fprintf(tw, "\t\t\tfix: %s\n", line(c.Fix))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if f := r.Failed(); len(f) > 0 {
		_, err := fmt.Fprintf(w, "%s: %d of %d layers failed; the first: %s\n", cli.Printable(r.Segment), len(f), len(r.Checks), strings.TrimSpace(string(f[0].Layer)+" "+f[0].Unit))
		return err
	}
	if !r.OK() {
		_, err := fmt.Fprintf(w, "%s: not every layer was checked\n", cli.Printable(r.Segment))
		return err
	}
	_, err := fmt.Fprintf(w, "%s: every layer passed (%s, %.2fs)\n", cli.Printable(r.Segment), r.Protocol, r.Seconds)
	return err
}

// line is a detail or fix as one printable line: peers' strings in it are
// escaped, a cause repeated down an error chain is said once, and a very
// long one is cut.
func line(s string) string { return cli.ErrorLine(errors.New(s)) }
