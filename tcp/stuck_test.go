package tcp

import (
	"bufio"
	"context"
	"log/slog"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/internal/testenv"
	"github.com/rdmago/te/segment"
)

// TestStuckTask stops a target process (SIGSTOP) and writes more to it
// than the sockets hold: the lane's writev blocks with the first frames
// written and the rest still in the lane's queue. The engine's snapshot
// and its stuck-task log name both layers (posted: written, awaiting the
// reply; queued: not yet written) and the lane's state; after SIGCONT
// everything completes.
func TestStuckTask(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	stdin, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGCONT)
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	d, err := segment.Unmarshal([]byte(strings.TrimSpace(line)))
	if err != nil {
		t.Fatal(err)
	}
	st := enginetest.NewMemStore()
	defer st.Close()
	if err := st.Publish(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	var log testenv.Buffer
	const stuck = 200 * time.Millisecond
	n := enginetest.NewNode(t, engine.Config{Name: "ini", Store: st, StuckAfter: stuck,
		Logger: slog.New(slog.NewTextHandler(&log, nil))}, 1<<20, New(Config{Lanes: 1, IOTimeout: time.Minute}))
	e := n.Engine
	seg, err := e.OpenSegment(ctxT(t, 5*time.Second), "child", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// More frames than one writev carries (maxFramesPerWrite), each of
	// 1 MiB: the sockets fill long before the first writev ends.
	const tasks = maxFramesPerWrite + 44
	reqs := make([]engine.Request, tasks)
	for i := range reqs {
		reqs[i] = engine.Request{Op: engine.Write, Local: n.Mem.Bytes(), Target: seg, TargetAddr: d.Buffers[0].Addr + uint64(i%64)<<20}
	}
	b, _ := e.AllocateBatch(tasks)
	if err := e.Submit(b, reqs); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for strings.Count(log.String(), "task in flight longer") < 16 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	logged := log.String()

	snap := e.Snapshot()
	if snap.TasksInFlight != tasks {
		t.Fatalf("snapshot: %d tasks in flight, want %d", snap.TasksInFlight, tasks)
	}
	layers := map[engine.Layer]int{}
	for _, tk := range snap.Tasks {
		layers[tk.Layer]++
		if tk.Segment != "child" || tk.Transport != "tcp" || tk.Age < stuck {
			t.Fatalf("snapshot task %+v", tk)
		}
	}
	// What the writer took is written in chunks; whatever the moment it
	// blocked, the first chunk is in the ring (posted) and the second
	// still in the lane's hands (queued).
	if layers[engine.LayerPosted] < maxFramesPerWrite || layers[engine.LayerQueued] == 0 {
		t.Fatalf("snapshot layers %v; want at least %d posted and some queued", layers, maxFramesPerWrite)
	}
	var lane string
	for _, tr := range snap.Transports {
		for _, p := range tr.Paths {
			if p.Peer == "child" {
				lane = p.Rail + " " + p.State
				if p.State != "writing" || p.Posted < maxFramesPerWrite || p.Queued == 0 {
					t.Fatalf("lane %+v: want writing with the ring full and slices queued", p)
				}
			}
		}
	}
	if lane == "" {
		t.Fatalf("snapshot has no lane to child: %+v", snap.Transports)
	}
	for _, want := range []string{"level=WARN", "segment=child", "transport=tcp", "layer=posted", `paths="lane0 writing`} {
		if !strings.Contains(logged, want) {
			t.Fatalf("stuck-task log lacks %q:\n%.3000s", want, logged)
		}
	}
	if !strings.Contains(logged, "layer=queued") && !regexp.MustCompile(`more tasks in flight longer.* queued=[1-9]`).MatchString(logged) {
		t.Fatalf("stuck-task log names no queued task:\n%.3000s", logged)
	}
	t.Logf("%s; layers %v; first log line: %s", lane, layers, strings.SplitN(logged, "\n", 2)[0])

	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if err := e.Wait(ctxT(t, 30*time.Second), b); err != nil {
		t.Fatal(err)
	}
	if snap := e.Snapshot(); snap.TasksInFlight != 0 {
		t.Fatalf("%d tasks still in flight after SIGCONT", snap.TasksInFlight)
	}
	e.FreeBatch(b)
}
