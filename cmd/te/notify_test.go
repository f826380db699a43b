package main

import (
	"bufio"
	"bytes"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestNotifyCLI: te bench --notify against te serve --print-notifies
// sends a notification with every batch, and te serve prints one line
// for each (at least every measured batch, the warm-up's too) and echoes
// it back, so te bench reports the time from submit to the notification
// (over tcp and shm), as it does with the target in process.
func TestNotifyCLI(t *testing.T) {
	cmd := exec.Command(teBinary(t), "serve", "--buffer-size", "16MiB", "--protocol", "tcp,shm", "--print-notifies")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	lines := make(chan string, 1<<16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var name string
	select {
	case l := <-lines:
		var ok bool
		if name, ok = strings.CutPrefix(l, "segment "); !ok {
			t.Fatalf("te serve printed %q\n%s", l, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("te serve printed no segment\n%s", stderr.String())
	}
	out, errOut, code := runTE(t, "bench", "--segment", name, "--protocol", "tcp", "--notify", "--duration", "1", "--batch-size", "8", "--json")
	if code != 0 {
		t.Fatalf("te bench --notify: exit %d\n%s", code, errOut)
	}
	rs := decodeReport[benchResult](t, "bench", []byte(out))
	// te serve echoes each notification: te bench times them.
	if len(rs) != 1 || !rs[0].Notify || rs[0].Batches == 0 || rs[0].Notified == 0 || !rs[0].NotifyEchoed ||
		rs[0].NotifyP50Micros <= 0 || rs[0].NotifyP99Micros < rs[0].NotifyP50Micros {
		t.Fatalf("te bench --notify against te serve: %+v\n%s", rs, errOut)
	}
	// Wait covers the note: every one was printed or is on its way.
	got := 0
	deadline := time.After(30 * time.Second)
	for uint64(got) < rs[0].Batches {
		select {
		case l := <-lines:
			if !strings.HasPrefix(l, "notify from ") || !strings.Contains(l, ` name "te-bench" bytes 524288 msg "`) {
				t.Fatalf("te serve printed %q", l)
			}
			got++
		case <-deadline:
			t.Fatalf("te serve printed %d notifications for %d batches\n%s", got, rs[0].Batches, stderr.String())
		}
	}

	// Over shm, in text: the same line as with the target in process.
	out, errOut, code = runTE(t, "bench", "--segment", name, "--protocol", "shm", "--notify", "--duration", "1", "--batch-size", "8")
	if code != 0 || !strings.Contains(out, "notify: submit to the target's notification p50 ") || !strings.Contains(out, "echoed by the target") {
		t.Fatalf("te bench --notify over shm against te serve: exit %d\n%s\n%s", code, out, errOut)
	}

	out, errOut, code = runTE(t, "bench", "--notify", "--protocol", "tcp", "--duration", "1", "--batch-size", "8")
	if code != 0 || !strings.Contains(out, "notify: submit to the target's notification p50 ") {
		t.Fatalf("te bench --notify in process: exit %d\n%s\n%s", code, out, errOut)
	}
}
