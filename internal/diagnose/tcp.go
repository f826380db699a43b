package diagnose

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/internal/control"
	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/tcp"
)

// tcp probes each lane: one connection per lane, as the transport dials
// them, each with its own slice of the probe range, all at once (so a
// peer that never answers costs one timeout, not one per lane).
func (w *walk) tcp(ctx context.Context) bool {
	p, _ := w.desc.Protocol(segment.ProtoTCP)
	lanes := w.cfg.Lanes
	if lanes <= 0 {
		lanes = tcp.DefaultLanes
	}
	addr, n := w.probeRange(lanes)
	e := w.cfg.Engine
	outs := make([]laneOut, lanes)
	var wg sync.WaitGroup
	for i := range outs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i].res, outs[i].err = tcp.Probe(ctx, tcp.ProbeConfig{
				Endpoint: p.Endpoint,
				Self:     auth.Party{Name: e.Name(), Epoch: e.Epoch()},
				Target:   auth.Party{Name: w.desc.Name, Epoch: w.desc.Epoch},
				Auth:     w.cfg.Auth,
				Addr:     addr + uint64(i*n),
				Len:      n,
				Pattern:  byte(i),
				Timeout:  w.cfg.Timeout,
			})
		}()
	}
	wg.Wait()
	steps := []struct {
		s tcp.ProbeStep
		l Layer
	}{{tcp.ProbeDial, LayerTCPDial}, {tcp.ProbeHandshake, LayerTCPHello}, {tcp.ProbeRange, LayerTCPRange}, {tcp.ProbeTransfer, LayerTCPProbe}}
	ok := true
	for _, s := range steps {
		var cs []Check
		for i, o := range outs {
			c := Check{Layer: s.l, Unit: fmt.Sprintf("lane %d", i), Status: Pass}
			step := tcp.ProbeStep(255)
			var pe *tcp.ProbeError
			if errors.As(o.err, &pe) {
				step = pe.Step
			}
			r := o.res
			switch {
			case o.err == nil || s.s < step:
				switch s.s {
				case tcp.ProbeDial:
					c.Detail = fmt.Sprintf("%s -> %s in %v", r.Local, r.Remote, r.Dial.Round(time.Microsecond))
				case tcp.ProbeHandshake:
					c.Detail = fmt.Sprintf("hello to %s epoch %#x answered in %v", w.desc.Name, w.desc.Epoch, r.Handshake.Round(time.Microsecond))
				case tcp.ProbeRange:
					c.Detail = fmt.Sprintf("the receiver serves [%#x, +%d) (READ in %v)", addr+uint64(i*n), n, r.RTT.Round(time.Microsecond))
				case tcp.ProbeTransfer:
					c.Detail = fmt.Sprintf("%d bytes written, read back, verified and restored", r.Verified)
				}
			case s.s == step:
				ok = false
				c.Status, c.Err, c.Fix = Fail, o.err, tcpFix(step, o.err)
				c.Detail = fmt.Sprintf("%s (%s): %v", p.Endpoint, w.desc.Name, pe.Err)
			default:
				c.Status, c.Detail = Skip, "not checked: "+step.String()+" failed"
			}
			cs = append(cs, c)
		}
		if allPass(cs) {
			cs = []Check{w.lanesPassed(s.l, outs2res(outs), p.Endpoint, addr, n)}
		}
		w.rep.Checks = append(w.rep.Checks, collapse(cs, "lanes")...)
	}
	return ok
}

func outs2res(outs []laneOut) []tcp.ProbeResult {
	rs := make([]tcp.ProbeResult, len(outs))
	for i, o := range outs {
		rs[i] = o.res
	}
	return rs
}

func allPass(cs []Check) bool {
	for _, c := range cs {
		if c.Status != Pass {
			return false
		}
	}
	return true
}

// lanesPassed is one line for a layer every lane passed: the range of
// what the lanes saw.
func (w *walk) lanesPassed(l Layer, rs []tcp.ProbeResult, ep string, addr uint64, n int) Check {
	span := func(f func(tcp.ProbeResult) time.Duration) string {
		lo, hi := f(rs[0]), f(rs[0])
		for _, r := range rs[1:] {
			lo, hi = min(lo, f(r)), max(hi, f(r))
		}
		return lo.Round(time.Microsecond).String() + "-" + hi.Round(time.Microsecond).String()
	}
	c := Check{Layer: l, Unit: fmt.Sprintf("lanes 0-%d", len(rs)-1), Status: Pass}
	switch l {
	case LayerTCPDial:
		c.Detail = fmt.Sprintf("%d connections from %s to %s in %s", len(rs), rs[0].Local.Addr(), ep, span(func(r tcp.ProbeResult) time.Duration { return r.Dial }))
	case LayerTCPHello:
		c.Detail = fmt.Sprintf("hello to %s epoch %#x answered on every lane in %s", w.desc.Name, w.desc.Epoch, span(func(r tcp.ProbeResult) time.Duration { return r.Handshake }))
	case LayerTCPRange:
		c.Detail = fmt.Sprintf("the receiver serves [%#x, +%d), %d bytes per lane (READ in %s)", addr, n*len(rs), n, span(func(r tcp.ProbeResult) time.Duration { return r.RTT }))
	case LayerTCPProbe:
		c.Detail = fmt.Sprintf("%d bytes per lane written, read back, verified and restored", rs[0].Verified)
	}
	return c
}

// collapse merges the checks of every unit into one line when none passed
// and all say the same (four lanes refused alike are one finding).
func collapse(cs []Check, units string) []Check {
	if len(cs) < 2 {
		return cs
	}
	for _, c := range cs[1:] {
		if c.Status == Pass || c.Status != cs[0].Status || c.Detail != cs[0].Detail {
			return cs
		}
	}
	c := cs[0]
	c.Unit = fmt.Sprintf("%s 0-%d", units, len(cs)-1)
	return []Check{c}
}

// tcpFix says what to do about a failed lane step.
func tcpFix(step tcp.ProbeStep, err error) string {
	switch {
	case errors.Is(err, auth.ErrDenied):
		return "give both sides the same cluster secret (--auth-file or $TE_AUTH_FILE)"
	case errors.Is(err, auth.ErrNotTE):
		return "the endpoint is not te's tcp port: the descriptor is stale or names another service; restart the peer so it republishes"
	case errors.Is(err, engine.ErrPeerReset), errors.Is(err, control.ErrStale):
		return "the peer restarted: reopen the segment (Engine.SyncSegment) so requests carry its new epoch"
	case errors.Is(err, engine.ErrOutOfRange):
		return "the receiver refuses a range its descriptor advertises: it unregistered that buffer; re-fetch the descriptor (Engine.SyncSegment)"
	case errors.Is(err, engine.ErrMemoryBusy):
		return "the peer is unregistering that buffer: re-fetch its descriptor and use its current buffers"
	case errors.Is(err, tcp.ErrTimeout) && step == tcp.ProbeHandshake:
		return "the peer's process accepts connections but does not answer: it is stopped (state T in ps: kill -CONT), hung or overloaded; check it"
	case errors.Is(err, tcp.ErrTimeout):
		return "the peer stopped answering: check its process and the network between (a firewall dropping packets looks the same)"
	}
	return fixFor(err)
}

// staleHello confirms a stale epoch on the wire: the peer's answer to a
// hello addressed to the cached epoch.
func (w *walk) staleHello(ctx context.Context) string {
	p, ok := w.desc.Protocol(segment.ProtoTCP)
	if !ok || p.Endpoint == "" || !slices.Contains(w.cfg.Engine.Transports(), segment.ProtoTCP) {
		return ""
	}
	e := w.cfg.Engine
	_, err := tcp.Probe(ctx, tcp.ProbeConfig{
		Endpoint: p.Endpoint,
		Self:     auth.Party{Name: e.Name(), Epoch: e.Epoch()},
		Target:   auth.Party{Name: w.desc.Name, Epoch: w.cfg.Cached.Epoch},
		Auth:     w.cfg.Auth,
		Timeout:  w.cfg.Timeout,
	})
	switch {
	case errors.Is(err, engine.ErrPeerReset):
		return fmt.Sprintf("; the peer's tcp port refuses a hello for the cached epoch (%v)", err)
	case err == nil:
		return "; yet the peer's tcp port accepted a hello for the cached epoch"
	}
	return ""
}

type laneOut struct {
	res tcp.ProbeResult
	err error
}
