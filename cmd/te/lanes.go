package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rdmago/te/ebpf"
	"github.com/rdmago/te/tcp"
)

// A te process that moves data (te serve, te bench) lists its TCP lanes on
// an abstract unix socket, @te/lanes/<pid>, so that te trace, in another
// process, can name the peer segment and lane of each connection it
// traces. Abstract sockets need no file and vanish with the process; the
// kernel lists them in /proc/net/unix.
const laneSockPrefix = "@te/lanes/"

// laneLabel is what a process says about one of its TCP connections.
type laneLabel struct {
	Segment  string `json:"segment"` // the engine's own segment name
	Peer     string `json:"peer"`    // remote segment ("" when accepted)
	Lane     int    `json:"lane"`    // -1 when accepted
	Gen      uint64 `json:"gen"`
	Accepted bool   `json:"accepted"`
	Local    string `json:"local"`
	Remote   string `json:"remote"`
	Cookie   uint64 `json:"cookie"`
}

// laneLabels lists the TCP lanes of the node's transports.
func (n *node) laneLabels() []laneLabel {
	if n == nil || n.eng == nil {
		return nil
	}
	var out []laneLabel
	for _, tr := range n.trs {
		t, ok := tr.(*tcp.Transport)
		if !ok {
			continue
		}
		for _, l := range t.Lanes() {
			out = append(out, laneLabel{Segment: n.eng.Name(), Peer: l.Peer, Lane: l.Index, Gen: l.Gen,
				Accepted: l.Accepted, Local: l.Local.String(), Remote: l.Remote.String(), Cookie: l.Cookie})
		}
	}
	return out
}

// serveLanes answers every connection to @te/lanes/<pid> with list() as
// JSON, until the returned stop is called. A process that cannot listen
// (another with its pid in this network namespace) goes on without.
func serveLanes(list func() []laneLabel) (stop func()) {
	ln, err := net.Listen("unix", laneSockPrefix+strconv.Itoa(os.Getpid()))
	if err != nil {
		return func() {}
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.SetWriteDeadline(time.Now().Add(5 * time.Second))
			json.NewEncoder(c).Encode(list())
			c.Close()
		}
	})
	return func() {
		ln.Close()
		wg.Wait()
	}
}

// queryLanes asks process pid for its lanes.
func queryLanes(pid int) ([]laneLabel, error) {
	c, err := net.DialTimeout("unix", laneSockPrefix+strconv.Itoa(pid), time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var ls []laneLabel
	if err := json.NewDecoder(bufio.NewReader(c)).Decode(&ls); err != nil {
		return nil, fmt.Errorf("lanes of pid %d: %w", pid, err)
	}
	return ls, nil
}

// lanePIDs lists the processes that serve their lanes, from /proc/net/unix.
func lanePIDs() ([]int, error) {
	b, err := os.ReadFile("/proc/net/unix")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 8 {
			continue
		}
		if s, ok := strings.CutPrefix(f[len(f)-1], laneSockPrefix); ok {
			if pid, err := strconv.Atoi(s); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	return pids, nil
}

// allLanes gathers the lanes of every te process that serves them.
func allLanes() ([]laneLabel, error) {
	pids, err := lanePIDs()
	if err != nil {
		return nil, err
	}
	var all []laneLabel
	var errs []error
	for _, pid := range pids {
		ls, err := queryLanes(pid)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		all = append(all, ls...)
	}
	return all, errors.Join(errs...)
}

// laneInfos turns the bench's lanes' TCP_INFO into tracer rows: the
// unprivileged view of the same counters.
func (env *benchEnv) laneInfos() []ebpf.Conn {
	var out []ebpf.Conn
	for _, n := range []*node{env.init, env.target} {
		if n == nil {
			continue
		}
		for _, tr := range n.trs {
			t, ok := tr.(*tcp.Transport)
			if !ok {
				continue
			}
			for _, l := range t.Lanes() {
				i := l.Info
				out = append(out, ebpf.Conn{
					Cookie: l.Cookie, Local: l.Local, Remote: l.Remote, State: ebpf.State(i.State),
					BytesSent: i.BytesSent, BytesAcked: i.BytesAcked, BytesReceived: i.BytesReceived,
					BytesRetrans: i.BytesRetrans, Retransmits: i.TotalRetrans,
					SRTT: i.RTT, RTTVar: i.RTTVar, MinRTT: i.MinRTT, Idle: min(i.LastDataSent, i.LastDataRecv),
				})
			}
		}
	}
	return out
}
