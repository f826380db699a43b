package ebpf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	cebpf "github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"

	"github.com/rdmago/te/internal/sock"
)

// btfPath is where the kernel publishes its BTF (a variable for tests).
var btfPath = "/sys/kernel/btf/vmlinux"

// Tracer holds the loaded programs, their links and maps. Snapshot may be
// called from any goroutine; Events is read by one.
type Tracer struct {
	f        Filter
	cgroupID uint64
	cookies  map[uint64]bool
	ports    map[uint16]bool

	objs  lanesObjects
	links []link.Link
	iter  *link.Iter
	rd    *ringbuf.Reader

	events chan Event
	done   chan struct{}
	wg     sync.WaitGroup
	// wall - monotonic, to date events stamped with bpf_ktime_get_ns
	wallOffset time.Duration

	mu     sync.Mutex // Snapshot
	closed bool
	seen   map[uint64]Conn // connections of the last Snapshot

	closeOnce sync.Once
	closeErr  error
}

// Open loads and attaches the tracer for the connections f selects. The
// caller must Close it.
func Open(f Filter) (_ *Tracer, err error) {
	if _, err := os.Stat(btfPath); err != nil {
		return nil, fmt.Errorf("%w: no kernel BTF at %s (CONFIG_DEBUG_INFO_BTF=y, Linux 5.11+): %v", ErrUnsupported, btfPath, err)
	}
	t := &Tracer{f: f, cookies: map[uint64]bool{}, ports: map[uint16]bool{}, seen: map[uint64]Conn{},
		events: make(chan Event, 1024), done: make(chan struct{})}
	if f.PID != 0 {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d/fd", f.PID)); err != nil {
			return nil, fmt.Errorf("ebpf: process %d: %w", f.PID, err)
		}
	}
	if f.Cgroup != "" {
		if _, err := os.Stat(filepath.Join(f.Cgroup, "cgroup.controllers")); err != nil {
			return nil, fmt.Errorf("ebpf: %s is not a cgroup v2 directory: %w", f.Cgroup, err)
		}
		if t.cgroupID, err = sock.Inode(f.Cgroup); err != nil {
			return nil, fmt.Errorf("ebpf: cgroup: %w", err)
		}
	}
	for _, c := range f.Cookies {
		t.cookies[c] = true
	}
	for _, p := range f.Ports {
		t.ports[p] = true
	}

	spec, err := loadLanes()
	if err != nil {
		return nil, fmt.Errorf("ebpf: %w", err)
	}
	set := func(name string, v any) {
		if err == nil {
			if e := spec.Variables[name].Set(v); e != nil {
				err = fmt.Errorf("ebpf: set %s: %w", name, e)
			}
		}
	}
	set(lanesVarTraceAll, b2u(f.all()))
	set(lanesVarFilterCgroup, t.cgroupID)
	set(lanesVarFilterTgid, uint32(f.PID))
	set(lanesVarFilterPorts, b2u(len(f.Ports) > 0))
	if err != nil {
		return nil, err
	}
	if err := spec.LoadAndAssign(&t.objs, nil); err != nil {
		return nil, classify("load the BPF programs and maps", err)
	}
	defer func() {
		if err != nil {
			t.release()
		}
	}()
	for _, p := range []struct {
		name string
		prog *cebpf.Program
	}{{"tp_btf/inet_sock_set_state", t.objs.LaneState}, {"tp_btf/tcp_retransmit_skb", t.objs.LaneRetransmit}} {
		l, err := link.AttachTracing(link.TracingOptions{Program: p.prog, AttachType: cebpf.AttachTraceRawTp})
		if err != nil {
			return nil, classify("attach "+p.name, err)
		}
		t.links = append(t.links, l)
	}
	if t.iter, err = link.AttachIter(link.IterOptions{Program: t.objs.LaneRows}); err != nil {
		return nil, classify("attach iter/tcp", err)
	}
	one := uint8(1)
	for p := range t.ports {
		if err := t.objs.Ports.Put(p, one); err != nil {
			return nil, fmt.Errorf("ebpf: port filter: %w", err)
		}
	}
	for c := range t.cookies {
		if err := t.objs.Watch.Put(c, one); err != nil {
			return nil, fmt.Errorf("ebpf: cookie filter: %w", err)
		}
	}
	if t.rd, err = ringbuf.NewReader(t.objs.Events); err != nil {
		return nil, classify("read the event ring buffer", err)
	}
	t.wallOffset = time.Duration(time.Now().UnixNano()) - sock.Monotonic()
	// The first pull puts the connections already open into the watch
	// map, so their events are seen from now on.
	if _, err = t.Snapshot(); err != nil {
		return nil, err
	}
	t.wg.Add(1)
	go t.readEvents()
	return t, nil
}

func b2u(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// classify turns a load or attach error into ErrPermission or
// ErrUnsupported where it is one, naming what failed.
func classify(what string, err error) error {
	switch {
	case errors.Is(err, os.ErrPermission) && os.Geteuid() != 0:
		return fmt.Errorf("%w: %s as uid %d: %v", ErrPermission, what, os.Geteuid(), err)
	case errors.Is(err, os.ErrPermission):
		// root and still refused: a lockdown or LSM policy, not privileges
		return fmt.Errorf("%w: the kernel refused to %s even to root (lockdown or an LSM policy?): %v", ErrUnsupported, what, err)
	case errors.Is(err, cebpf.ErrNotSupported):
		return fmt.Errorf("%w: %s: %v", ErrUnsupported, what, err)
	}
	return fmt.Errorf("ebpf: %s: %w", what, err)
}

// Events returns the stream of state changes and retransmissions of the
// traced connections, in the order the kernel saw them. It is closed by
// Close. When it is not read, the kernel's ring buffer fills and further
// events are lost (the counters in Snapshot are not).
func (t *Tracer) Events() <-chan Event { return t.events }

func (t *Tracer) readEvents() {
	defer t.wg.Done()
	defer close(t.events)
	for {
		rec, err := t.rd.Read()
		if err != nil {
			if errors.Is(err, os.ErrClosed) {
				return
			}
			continue
		}
		ev, err := decodeEvent(rec.RawSample, t.wallOffset)
		if err != nil {
			continue
		}
		if ev.Local.Port() == 0 {
			// The kernel releases the port before the CLOSE transition.
			t.mu.Lock()
			if c, ok := t.seen[ev.Cookie]; ok {
				ev.Local, ev.Remote = c.Local, c.Remote
			}
			t.mu.Unlock()
		}
		select {
		case t.events <- ev:
		case <-t.done:
			return
		}
	}
}

func addrs(family uint16, la, ra [16]byte, lport, rport uint16) (netip.AddrPort, netip.AddrPort) {
	var l, r netip.Addr
	if family == 10 { // AF_INET6
		l, r = netip.AddrFrom16(la).Unmap(), netip.AddrFrom16(ra).Unmap()
	} else {
		l, r = netip.AddrFrom4([4]byte(la[:4])), netip.AddrFrom4([4]byte(ra[:4]))
	}
	return netip.AddrPortFrom(l, lport), netip.AddrPortFrom(r, rport)
}

// rowSize is sizeof(struct row) in lanes.bpf.c.
var rowSize = binary.Size(lanesRow{})

// Snapshot reads the counters of every traced connection now, sorted by
// local then remote address; connections closed since the previous
// Snapshot are included once more with Closed set.
func (t *Tracer) Snapshot() ([]Conn, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, ErrClosed
	}
	var inodes map[uint64]bool
	var err error
	if t.f.PID != 0 {
		if inodes, err = socketInodes(t.f.PID); err != nil {
			return nil, err
		}
	}
	rows, err := t.readRows(func(k rowKey) bool { return t.match(k, inodes) })
	if err != nil {
		return nil, err
	}
	one := uint8(1)
	present := map[uint64]bool{}
	var out []Conn
	for i := range rows {
		r := &rows[i]
		present[r.Cookie] = true
		if r.Watched == 0 {
			if err := t.objs.Watch.Put(r.Cookie, one); err != nil {
				return nil, fmt.Errorf("ebpf: watch: %w", err)
			}
		}
		c := conn(r)
		t.seen[r.Cookie] = c
		out = append(out, c)
	}
	for ck, c := range t.seen {
		if present[ck] {
			continue
		}
		c.Closed, c.State = true, Close
		var ev lanesConn
		if t.objs.Conns.Lookup(ck, &ev) == nil {
			c.State = State(ev.State)
			c.StateChanges, c.RetransmitEvents = ev.StateChanges, ev.RetransEvents
			if ev.LastNs != 0 { // the counters at its last event: newer
				c.BytesAcked, c.BytesReceived = max(c.BytesAcked, ev.BytesAcked), max(c.BytesReceived, ev.BytesReceived)
				c.Retransmits = max(c.Retransmits, ev.TotalRetrans)
			}
		}
		out = append(out, c)
		delete(t.seen, ck)
		t.objs.Conns.Delete(ck)
		t.objs.Watch.Delete(ck)
	}
	slices.SortFunc(out, func(a, b Conn) int {
		if c := a.Local.Compare(b.Local); c != 0 {
			return c
		}
		return a.Remote.Compare(b.Remote)
	})
	return out, nil
}

func (t *Tracer) match(k rowKey, inodes map[uint64]bool) bool {
	switch {
	case t.f.all(), k.watched, t.cookies[k.cookie]:
		return true
	case t.cgroupID != 0 && k.cgroup == t.cgroupID:
		return true
	case len(t.ports) > 0 && (t.ports[k.lport] || t.ports[k.rport]):
		return true
	}
	return k.inode != 0 && inodes[k.inode]
}

// rowKey is what the filter reads of a row, taken from its bytes without
// decoding the rest: a pull returns every TCP socket of the namespace.
type rowKey struct {
	cookie, inode, cgroup uint64
	lport, rport          uint16
	watched               bool
}

// Offsets of the rowKey fields in struct row (lanes.bpf.c); TestRowKey
// checks them against the generated type.
const (
	offCookie  = 0
	offInode   = 8
	offCgroup  = 16
	offLport   = 106
	offRport   = 108
	offWatched = 111
)

func keyOf(b []byte) rowKey {
	ne := binary.NativeEndian
	return rowKey{
		cookie: ne.Uint64(b[offCookie:]), inode: ne.Uint64(b[offInode:]), cgroup: ne.Uint64(b[offCgroup:]),
		lport: ne.Uint16(b[offLport:]), rport: ne.Uint16(b[offRport:]), watched: b[offWatched] != 0,
	}
}

func conn(r *lanesRow) Conn {
	us := func(v uint32) time.Duration { return time.Duration(v) * time.Microsecond }
	c := Conn{
		Cookie: r.Cookie, State: State(r.State),
		BytesSent: r.BytesSent, BytesAcked: r.BytesAcked, BytesReceived: r.BytesReceived, BytesRetrans: r.BytesRetrans,
		Retransmits: r.TotalRetrans, RetransmitEvents: r.RetransEvents, StateChanges: r.StateChanges,
		SRTT: us(r.SrttUs), RTTVar: us(r.MdevUs), MinRTT: us(r.MinRttUs), Cwnd: r.SndCwnd,
		Inode: r.Inode, Cgroup: r.Cgroup, UID: r.Uid,
	}
	if r.MinRttUs == ^uint32(0) { // no sample yet
		c.MinRTT = 0
	}
	if now := r.NowNs / 1000; r.MstampUs != 0 && now > r.MstampUs {
		c.Idle = time.Duration(now-r.MstampUs) * time.Microsecond
	}
	c.Local, c.Remote = addrs(r.Family, r.Laddr, r.Raddr, r.Lport, r.Rport)
	return c
}

// readRows runs the iterator once and decodes the rows keep selects.
func (t *Tracer) readRows(keep func(rowKey) bool) ([]lanesRow, error) {
	rc, err := t.iter.Open()
	if err != nil {
		return nil, fmt.Errorf("ebpf: open iter/tcp: %w", err)
	}
	defer rc.Close()
	buf, err := io.ReadAll(rc)
	if err != nil {
		return nil, fmt.Errorf("ebpf: read iter/tcp: %w", err)
	}
	if len(buf)%rowSize != 0 {
		return nil, fmt.Errorf("ebpf: iter/tcp wrote %d bytes, not a multiple of the %d-byte row", len(buf), rowSize)
	}
	n := 0
	for off := 0; off < len(buf); off += rowSize {
		if keep(keyOf(buf[off : off+rowSize])) {
			n += copy(buf[n:], buf[off:off+rowSize])
		}
	}
	return decodeRows(buf[:n])
}

// decodeRows splits the iterator's output into rows.
func decodeRows(buf []byte) ([]lanesRow, error) {
	if len(buf)%rowSize != 0 {
		return nil, fmt.Errorf("ebpf: iter/tcp wrote %d bytes, not a multiple of the %d-byte row", len(buf), rowSize)
	}
	rows := make([]lanesRow, len(buf)/rowSize)
	if err := binary.Read(bytes.NewReader(buf), binary.NativeEndian, rows); err != nil {
		return nil, fmt.Errorf("ebpf: decode iter/tcp rows: %w", err)
	}
	return rows, nil
}

// eventSize is sizeof(struct event) in lanes.bpf.c.
var eventSize = binary.Size(lanesEvent{})

// decodeEvent decodes one ring buffer record; wallOffset dates it.
func decodeEvent(rec []byte, wallOffset time.Duration) (Event, error) {
	var raw lanesEvent
	if len(rec) < eventSize {
		return Event{}, fmt.Errorf("ebpf: event of %d bytes, want %d", len(rec), eventSize)
	}
	if err := binary.Read(bytes.NewReader(rec[:eventSize]), binary.NativeEndian, &raw); err != nil {
		return Event{}, fmt.Errorf("ebpf: decode event: %w", err)
	}
	if raw.Kind != uint32(StateChange) && raw.Kind != uint32(Retransmit) {
		return Event{}, fmt.Errorf("ebpf: event of unknown kind %d", raw.Kind)
	}
	ev := Event{
		Time:          time.Unix(0, int64(wallOffset)+int64(raw.TsNs)),
		Kind:          EventKind(raw.Kind),
		Cookie:        raw.Cookie,
		Old:           State(raw.OldState),
		New:           State(raw.NewState),
		SRTT:          time.Duration(raw.SrttUs) * time.Microsecond,
		Retransmits:   raw.TotalRetrans,
		BytesAcked:    raw.BytesAcked,
		BytesReceived: raw.BytesReceived,
	}
	ev.Local, ev.Remote = addrs(raw.Family, raw.Laddr, raw.Raddr, raw.Lport, raw.Rport)
	return ev, nil
}

// socketInodes returns the inodes of the sockets pid holds open.
func socketInodes(pid int) (map[uint64]bool, error) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("ebpf: process %d: %w", pid, err)
	}
	inodes := map[uint64]bool{}
	for _, e := range ents {
		l, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		if s, ok := strings.CutPrefix(l, "socket:["); ok {
			if n, err := strconv.ParseUint(strings.TrimSuffix(s, "]"), 10, 64); err == nil {
				inodes[n] = true
			}
		}
	}
	return inodes, nil
}

// Close detaches every program and frees every map; Events is closed. It
// is idempotent.
func (t *Tracer) Close() error {
	if t == nil {
		return nil
	}
	t.closeOnce.Do(func() {
		t.mu.Lock()
		t.closed = true
		t.mu.Unlock()
		close(t.done)
		t.closeErr = t.release()
		t.wg.Wait()
	})
	return t.closeErr
}

// release closes what Open made, in reverse.
func (t *Tracer) release() error {
	var errs []error
	if t.rd != nil {
		errs = append(errs, t.rd.Close())
	}
	if t.iter != nil {
		errs = append(errs, t.iter.Close())
	}
	for _, l := range t.links {
		errs = append(errs, l.Close())
	}
	errs = append(errs, t.objs.Close())
	return errors.Join(errs...)
}

// Cost is the kernel time spent in the tracer's programs and how often
// they ran, while BPF statistics are enabled (sysctl
// kernel.bpf_stats_enabled=1, or cilium/ebpf's EnableStats); zero
// otherwise. It measures what tracing costs, independent of throughput
// noise.
func (t *Tracer) Cost() (time.Duration, uint64, error) {
	var d time.Duration
	var runs uint64
	for _, p := range []*cebpf.Program{t.objs.LaneState, t.objs.LaneRetransmit, t.objs.LaneRows} {
		st, err := p.Stats()
		if err != nil {
			return 0, 0, fmt.Errorf("ebpf: program stats: %w", err)
		}
		d += st.Runtime
		runs += st.RunCount
	}
	return d, runs, nil
}
