package cli

import (
	"fmt"
	"io"
	"sync"
	"time"
)

// Stages reports the setup of a long command: silent while setup is quick,
// it prints what the setup is doing once it has taken longer than a
// threshold (a second), then each later stage as it begins, and how long
// the setup took.
type Stages struct {
	w      io.Writer
	prefix string
	start  time.Time
	timer  *time.Timer

	mu   sync.Mutex
	cur  string
	late bool // past the threshold: stages print as they begin
	done bool
}

// NewStages starts timing a setup; lines go to w as "prefix: setup: ...".
func NewStages(w io.Writer, prefix string, after time.Duration) *Stages {
	s := &Stages{w: w, prefix: prefix, start: time.Now()}
	s.timer = time.AfterFunc(after, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.done {
			return
		}
		s.late = true
		if s.cur != "" {
			s.print(s.cur + " ...")
		}
	})
	return s
}

func (s *Stages) print(what string) {
	fmt.Fprintf(s.w, "%s: setup %4.1fs: %s\n", s.prefix, time.Since(s.start).Seconds(), what)
}

// Stage says what the setup does now ("allocating 8000MiB").
func (s *Stages) Stage(what string) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cur = what
	if s.late && !s.done {
		s.print(what + " ...")
	}
}

// Done ends the setup; after a slow one it prints how long it took.
func (s *Stages) Done() { s.End(nil) }

// End ends the setup with its outcome: after a slow one it prints how
// long it took, and "done" only when err is nil (the caller prints err).
func (s *Stages) End(err error) {
	if s == nil {
		return
	}
	s.timer.Stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.late && !s.done {
		if err == nil {
			s.print("done")
		} else {
			s.print("failed")
		}
	}
	s.done = true
}
