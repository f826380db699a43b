// Package engine is the transfer engine's unified API: install transports,
// register local memory, open remote segments, and move bytes between them
// in batches of READ and WRITE tasks.
//
// The model follows Mooncake's Transfer Engine. A segment is one process's
// exposed memory, named cluster-wide and described by a segment.Descriptor
// published through a segment.Store. Addresses inside a segment are the
// owner's virtual addresses: a request names its target by SegmentID and
// an absolute target address, its local side by registered memory.
//
// Lifecycle:
//
//	e, err := engine.New(engine.Config{Name: name, Store: store})
//	defer e.Close()
//	e.Install(tcp.New(tcp.Config{}))
//	mem, _ := engine.Alloc(64 << 20) // mmap'd, never Go heap
//	defer mem.Close()
//	e.RegisterLocalMemory(mem.Bytes(), "cpu:0")
//	seg, _ := e.OpenSegment(ctx, "peer:15000", nil)
//	b, _ := e.AllocateBatch(128)
//	e.Submit(b, []engine.Request{{Op: engine.Write, Local: mem.Bytes()[:4096], Target: seg, TargetAddr: addr}})
//	e.Wait(ctx, b)
//	e.FreeBatch(b)
//
// (Transfer does the last four steps in one call.) Transports implement
// the contract in package engine/driver; tests of a new one start with
// engine/transporttest.Run.
//
// Requests are validated completely before anything moves: the local range
// must lie in registered memory, the target range inside one buffer of the
// target's descriptor, the batch must have room. The engine cuts each
// request into slices, hands them to the segment's transport with
// everything resolved, and aggregates slice completions into task and
// batch state. A task is COMPLETED when all its slices succeeded and FAILED
// as soon as its last slice finished with any slice failed; its transferred
// bytes are the sum over its slices.
//
// Choosing a transport: with several installed, the candidates for a
// segment are those it offers that reach it (shm reaches only segments on
// this host), and Config.Selector orders them: by default shm, else rdma,
// else tcp, else another protocol both have (DefaultSelector). When the
// first one fails to connect (a target that refuses it), the segment falls
// back to the next, logs it once, and keeps using that one until its
// descriptor changes; SegmentTransports shows the order and
// TaskStatus.Transport the transport that carried a task.
// Request.Transport and OpenOptions.Transport force one, without fallback.
//
// Memory rules: memory handed to a transport (the NIC or a peer writes it)
// must not be ordinary Go heap memory; use Alloc (AllocShared for memory a
// same-host peer may map, which the shm transport needs), or register
// memory mapped by other means (RegisterLocalAddr). Memory.Close
// unregisters what is still registered inside it, and refuses while a
// transfer uses it. Registered memory cannot be
// unregistered while a transfer uses it, and a batch cannot be freed while
// any of its tasks is in flight, so a late completion never writes freed
// state.
//
// Notifications: SubmitNotify sends a notification (a name and an opaque
// message) behind a submission's data, and Notify one alone. The target
// receives it on Notifications (or ReceiveNotifications,
// DrainNotifications) only once every byte of the submission has landed
// in its memory, with the sender's segment name and epoch and the byte
// count; a submission that failed or was cancelled (Cancel) delivers
// none. The transport carries it on the data path, in order after the
// data (driver.Notifier); one that cannot refuses with
// ErrNotifyUnsupported. The target bounds queued notifications per sender
// and in total: a sender that outruns the application stalls, then fails
// with ErrNotifyFull. docs/notify.md has the details.
//
// Explaining itself: every task knows the last layer it reached
// (TaskStatus.Layer: queued in its transport, posted to the NIC or written
// to a connection, completed, failed) and how often and why its slices were
// retried. Snapshot shows the transports (rails, endpoints or lanes with
// their queue depths), opened segments with the age of their descriptors,
// tasks in flight with their layers and ages, and the counters that the
// metrics package exports; a task in flight longer than Config.StuckAfter
// is logged once with its layer and its paths to the peer. Keeping this
// costs a few atomic operations per slice and no allocation.
//
// All methods of Engine are safe for concurrent use. Submit calls on one
// batch are serialised; use one batch per submitting goroutine for
// parallelism.
package engine
