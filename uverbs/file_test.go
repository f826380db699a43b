package uverbs

import (
	"errors"
	"os"
	"slices"
	"syscall"
	"testing"

	"github.com/rdmago/te/internal/uapi"
	"github.com/rdmago/te/internal/ucmd"
)

// scriptedFile is a CommandFile answering the few commands of an Open, a
// PD and a Close, and recording every command it saw.
type scriptedFile struct {
	async    *os.File // write end of the async-event pipe
	cmds     []uint32
	driverID uint32
	closed   bool
}

func (f *scriptedFile) FD() int               { return -1 }
func (f *scriptedFile) SetDriverID(id uint32) { f.driverID = id }
func (f *scriptedFile) Close() error          { f.closed = true; return f.async.Close() }

func (f *scriptedFile) WriteEx(cmd uint32, req, drvIn, resp, drvOut []byte) error {
	return syscall.EOPNOTSUPP
}

func (f *scriptedFile) Ioctl(object, method uint16, build func(*ucmd.Builder), read func(*ucmd.Builder)) error {
	return ucmd.EPROTONOSUPPORT
}

func (f *scriptedFile) Write(cmd uint32, req, drvIn, resp, drvOut []byte) error {
	f.cmds = append(f.cmds, cmd)
	switch cmd {
	case uapi.CmdGetContext:
		r, w, err := os.Pipe()
		if err != nil {
			return err
		}
		fd, err := syscall.Dup(int(r.Fd()))
		r.Close()
		if err != nil {
			w.Close()
			return err
		}
		f.async = w
		le.PutUint32(resp, uint32(fd))
		le.PutUint32(resp[4:], 3)
	case uapi.CmdQueryDevice:
	case uapi.CmdAllocPD:
		le.PutUint32(resp, 42)
	case uapi.CmdDeallocPD:
		if le.Uint32(req) != 42 {
			return ucmd.EINVAL
		}
	default:
		return syscall.EOPNOTSUPP
	}
	return nil
}

type seamProvider struct{ UnimplementedProvider }

func (seamProvider) DriverID() DriverID { return 77 }
func (seamProvider) NewContext(Kernel, []byte) (DriverContext, error) {
	return seamContext{}, nil
}

type seamContext struct{}

func (seamContext) NewCQ(DriverCQConfig) (DriverCQ, error) { return nil, ErrNotSupported }
func (seamContext) NewQP(DriverQPConfig) (DriverQP, error) { return nil, ErrNotSupported }
func (seamContext) Close() error                           { return nil }

// TestOpenFile: Options.OpenFile replaces the character device: every
// command of the context goes through the file it returns (the driver id
// set first), the async-event fd of its GET_CONTEXT answer is read, and
// Close closes it. Options.Devices replaces sysfs for Open by name. An
// OpenFile failure fails Open.
func TestOpenFile(t *testing.T) {
	d := Device{Name: "sim0", DriverID: 77, Path: "/nonexistent"}
	var f *scriptedFile
	opts := &Options{Providers: []Provider{seamProvider{}}, OpenFile: func(got Device) (CommandFile, error) {
		if got.Name != d.Name {
			t.Errorf("OpenFile(%s), want %s", got.Name, d.Name)
		}
		f = &scriptedFile{}
		return f, nil
	}}
	c, err := d.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	if f.driverID != 77 || c.NumCompVectors() != 3 {
		t.Errorf("driver id %d, %d completion vectors; want 77 and 3", f.driverID, c.NumCompVectors())
	}
	pd, err := c.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	if pd.Handle() != 42 {
		t.Errorf("PD handle %d, want 42", pd.Handle())
	}
	if err := pd.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	want := []uint32{uapi.CmdGetContext, uapi.CmdQueryDevice, uapi.CmdAllocPD, uapi.CmdDeallocPD}
	if !slices.Equal(f.cmds, want) || !f.closed {
		t.Errorf("commands %v (closed %v), want %v then Close", f.cmds, f.closed, want)
	}
	if _, ok := <-c.Events(); ok {
		t.Error("Events still open after Close")
	}

	// Options.Devices: Open by name finds the device there.
	opts.Devices = func() ([]Device, error) { return []Device{{Name: "other"}, d}, nil }
	if c, err = Open(d.Name, opts); err != nil {
		t.Fatalf("Open(%q) among Options.Devices: %v", d.Name, err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := Open("sim9", opts); !errors.Is(err, ErrNoDevice) {
		t.Errorf("Open of a device Options.Devices lacks: %v, want ErrNoDevice", err)
	}
	if ds, err := opts.List(); err != nil || len(ds) != 2 {
		t.Errorf("List: %v, %v", ds, err)
	}

	boom := errors.New("no such simulator")
	opts.OpenFile = func(Device) (CommandFile, error) { return nil, boom }
	if _, err := d.Open(opts); !errors.Is(err, boom) {
		t.Errorf("Open with a failing OpenFile: %v, want it wrapped", err)
	}
}
