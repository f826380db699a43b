package engine_test

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/segment"
)

// fake is a transport that moves nothing: it completes every slice at
// once and counts them. It stands in for transports this test binary
// cannot run (rdma without a device) where only the engine's choices are
// under test.
type fake struct {
	name string
	host driver.Host
	// reaches, when set, makes it a Reacher.
	reaches func(*segment.Descriptor) bool
	slices  atomic.Int64
	connect atomic.Int64
	// refuse, when set, makes Connect fail as a target that refuses
	// the connection would.
	refuse atomic.Bool
	// closeWait is how long Close takes (a transport waiting out its
	// peers).
	closeWait time.Duration
}

type fakePeer struct{}

func (fakePeer) Close() error { return nil }

func (f *fake) Driver() driver.Transport { return f }
func (f *fake) Name() string             { return f.name }
func (f *fake) Install(h driver.Host) error {
	f.host = h
	return nil
}
func (f *fake) Describe(d *segment.Descriptor) error {
	d.Protocols = append(d.Protocols, segment.Protocol{Name: f.name})
	return nil
}
func (f *fake) RegisterMemory(driver.Region) (any, error) { return nil, nil }
func (f *fake) UnregisterMemory(driver.Region, any) error { return nil }
func (f *fake) SliceSize() uint64                         { return 0 }
func (f *fake) Close() error {
	time.Sleep(f.closeWait)
	return nil
}
func (f *fake) Connect(context.Context, *segment.Descriptor) (driver.Peer, error) {
	f.connect.Add(1)
	if f.refuse.Load() {
		return nil, errors.New(f.name + ": target refused the connection: too many peers")
	}
	return fakePeer{}, nil
}
func (f *fake) Submit(ss []*driver.Slice) {
	for _, s := range ss {
		f.slices.Add(1)
		s.Done(uint64(len(s.Local)), nil)
	}
}

// reacher is a fake that serves only the segments reaches accepts.
type reacher struct{ *fake }

func (r reacher) Driver() driver.Transport { return r }

func (r reacher) Reaches(d *segment.Descriptor) bool { return r.reaches(d) }
