// Package metrics exports a transfer engine's counters to Prometheus.
//
// The engine and its transports count with their own atomic counters on
// the data path (no allocation, no Prometheus call per request); a
// Collector reads them through engine.Snapshot when Prometheus scrapes,
// and turns them into constant metrics. Only this package imports the
// Prometheus client.
//
// The metrics, all prefixed te_ (docs/metrics.md has the details):
//
//	bytes_total, slices_total                 {peer, protocol, op}      completed slices, initiator side
//	failed_slices_total, tasks_total          {peer, protocol}
//	retries_total, failures_total             {protocol, cause}         slices retried / failed, by engine.Cause
//	slice_latency_seconds                     {protocol}                histogram, Submit to slice completion (1 slice in 8)
//	batch_latency_seconds                     histogram, idle batch's Submit to its last completion
//	tasks_in_flight                           engine-wide; transport_tasks_in_flight {protocol}
//	oldest_task_age_seconds                   the oldest task in flight
//	rail_bytes_total, rail_slices_total       {protocol, peer, rail, op} per rail (rdma) or lane (tcp)
//	rail_failed_slices_total, rail_connects_total {protocol, peer, rail}
//	rail_queued_slices, rail_inflight_slices  {protocol, rail}          queue depth, posted and not completed
//	rail_up                                   {protocol, rail}          1 up, 0 down (rdma)
//	endpoints                                 {protocol, state}         rdma endpoints, tcp lanes
//	served_bytes_total, served_slices_total   {peer, protocol, op}      target side, per initiator (tcp)
//	descriptor_age_seconds                    {peer}                    age of the cached remote descriptor
//	segment_tasks_in_flight                   {peer}
package metrics

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/rdmago/te/engine"
)

// Source is what a Collector reads: *engine.Engine.
type Source interface {
	Snapshot() engine.Snapshot
}

// Collector is a prometheus.Collector for one engine. Each Collect takes
// one engine.Snapshot.
type Collector struct {
	src   Source
	descs descs
}

// NewCollector returns a Collector of src's metrics. constLabels are added
// to every metric (e.g. the engine's name when one process runs several).
func NewCollector(src Source, constLabels prometheus.Labels) *Collector {
	return &Collector{src: src, descs: newDescs(constLabels)}
}

type descs struct {
	bytes, slices, failedSlices, tasks             *prometheus.Desc
	retries, failures                              *prometheus.Desc
	sliceLatency, batchLatency                     *prometheus.Desc
	tasksInFlight, transportTasks, oldestTask      *prometheus.Desc
	railBytes, railSlices, railFailed, railConnect *prometheus.Desc
	railQueued, railInflight, railUp               *prometheus.Desc
	endpoints                                      *prometheus.Desc
	servedBytes, servedSlices, servedFailed        *prometheus.Desc
	descAge, segTasks                              *prometheus.Desc
}

func newDescs(cl prometheus.Labels) descs {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("te_"+name, help, labels, cl)
	}
	return descs{
		bytes:          d("bytes_total", "Bytes moved by completed slices, initiator side.", "peer", "protocol", "op"),
		slices:         d("slices_total", "Completed slices, initiator side.", "peer", "protocol", "op"),
		failedSlices:   d("failed_slices_total", "Slices failed after retries, initiator side.", "peer", "protocol"),
		tasks:          d("tasks_total", "Finished tasks (completed or failed).", "peer", "protocol"),
		retries:        d("retries_total", "Slices retried after a transient failure, by cause.", "protocol", "cause"),
		failures:       d("failures_total", "Slices failed for good, by cause.", "protocol", "cause"),
		sliceLatency:   d("slice_latency_seconds", "Time from Submit to a slice's completion (retries included), for one slice in 8 of each batch.", "protocol"),
		batchLatency:   d("batch_latency_seconds", "Time from the Submit that found a batch idle to its last task's completion."),
		tasksInFlight:  d("tasks_in_flight", "Tasks submitted and not finished."),
		transportTasks: d("transport_tasks_in_flight", "Tasks in flight per transport.", "protocol"),
		oldestTask:     d("oldest_task_age_seconds", "Age of the oldest task in flight (0 when none)."),
		railBytes:      d("rail_bytes_total", "Bytes moved by completed slices per rail (rdma) or lane (tcp).", "protocol", "peer", "rail", "op"),
		railSlices:     d("rail_slices_total", "Completed slices per rail (rdma) or lane (tcp).", "protocol", "peer", "rail", "op"),
		railFailed:     d("rail_failed_slices_total", "Slices failed per rail or lane (before the engine's retries).", "protocol", "peer", "rail"),
		railConnect:    d("rail_connects_total", "Endpoints (rdma) or connections (tcp lanes) made per rail or lane.", "protocol", "peer", "rail"),
		railQueued:     d("rail_queued_slices", "Slices routed to a rail or lane and not yet posted or written.", "protocol", "rail"),
		railInflight:   d("rail_inflight_slices", "Slices posted or written on a rail or lane and not yet completed.", "protocol", "rail"),
		railUp:         d("rail_up", "1 when the rail's port is up, 0 when down.", "protocol", "rail"),
		endpoints:      d("endpoints", "Paths to peers (rdma endpoints, tcp lanes) by state.", "protocol", "state"),
		servedBytes:    d("served_bytes_total", "Bytes remote initiators' requests read or wrote here (transports that see them: tcp).", "peer", "protocol", "op"),
		servedSlices:   d("served_slices_total", "Remote initiators' requests served here.", "peer", "protocol", "op"),
		servedFailed:   d("served_refused_total", "Remote initiators' requests refused here (range or memory busy).", "peer", "protocol"),
		descAge:        d("descriptor_age_seconds", "Time since the cached descriptor of an opened segment came from the store.", "peer"),
		segTasks:       d("segment_tasks_in_flight", "Tasks in flight per opened segment.", "peer"),
	}
}

// Describe sends every metric's description.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	d := &c.descs
	for _, x := range []*prometheus.Desc{d.bytes, d.slices, d.failedSlices, d.tasks, d.retries, d.failures,
		d.sliceLatency, d.batchLatency, d.tasksInFlight, d.transportTasks, d.oldestTask,
		d.railBytes, d.railSlices, d.railFailed, d.railConnect, d.railQueued, d.railInflight, d.railUp,
		d.endpoints, d.servedBytes, d.servedSlices, d.servedFailed, d.descAge, d.segTasks} {
		ch <- x
	}
}

// Collect takes a snapshot of the engine and sends its metrics.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.src.Snapshot()
	d := &c.descs
	counter := func(desc *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(desc *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, labels...)
	}
	read, write := engine.Read.String(), engine.Write.String()

	for _, t := range s.Traffic {
		counter(d.bytes, t.ReadBytes, t.Peer, t.Protocol, read)
		counter(d.bytes, t.WriteBytes, t.Peer, t.Protocol, write)
		counter(d.slices, t.ReadSlices, t.Peer, t.Protocol, read)
		counter(d.slices, t.WriteSlices, t.Peer, t.Protocol, write)
		counter(d.failedSlices, t.FailedSlices, t.Peer, t.Protocol)
		counter(d.tasks, t.Tasks, t.Peer, t.Protocol)
	}
	for _, p := range s.Protocols {
		for _, cause := range engine.Causes() {
			counter(d.retries, p.Retries[cause], p.Name, cause.String())
			counter(d.failures, p.Failures[cause], p.Name, cause.String())
		}
		histogram(ch, d.sliceLatency, p.SliceLatency, p.Name)
	}
	histogram(ch, d.batchLatency, s.BatchLatency)

	gauge(d.tasksInFlight, float64(s.TasksInFlight))
	oldest := 0.0
	if len(s.Tasks) > 0 {
		oldest = s.Tasks[0].Age.Seconds()
	}
	gauge(d.oldestTask, oldest)

	for _, t := range s.Transports {
		gauge(d.transportTasks, float64(t.TasksInFlight), t.Name)
		for _, tr := range t.Traffic {
			counter(d.railBytes, tr.ReadBytes, t.Name, tr.Peer, tr.Rail, read)
			counter(d.railBytes, tr.WriteBytes, t.Name, tr.Peer, tr.Rail, write)
			counter(d.railSlices, tr.ReadSlices, t.Name, tr.Peer, tr.Rail, read)
			counter(d.railSlices, tr.WriteSlices, t.Name, tr.Peer, tr.Rail, write)
			counter(d.railFailed, tr.Failures, t.Name, tr.Peer, tr.Rail)
			counter(d.railConnect, tr.Connects, t.Name, tr.Peer, tr.Rail)
		}
		for _, tr := range t.Served {
			counter(d.servedBytes, tr.ReadBytes, tr.Peer, t.Name, read)
			counter(d.servedBytes, tr.WriteBytes, tr.Peer, t.Name, write)
			counter(d.servedSlices, tr.ReadSlices, tr.Peer, t.Name, read)
			counter(d.servedSlices, tr.WriteSlices, tr.Peer, t.Name, write)
			counter(d.servedFailed, tr.Failures, tr.Peer, t.Name)
		}
		// Queue depths per rail: the rails' own sums where the
		// transport has rails, else the paths' (tcp lanes) by lane.
		type depth struct{ queued, posted int64 }
		depths := map[string]*depth{}
		var order []string
		add := func(rail string, q, p int64) {
			x := depths[rail]
			if x == nil {
				x = &depth{}
				depths[rail] = x
				order = append(order, rail)
			}
			x.queued += q
			x.posted += p
		}
		for _, r := range t.Rails {
			add(r.Name, r.Queued, r.Posted)
			up := 0.0
			if r.Up {
				up = 1
			}
			gauge(d.railUp, up, t.Name, r.Name)
		}
		states := map[string]int{}
		var stateOrder []string
		for _, p := range t.Paths {
			if len(t.Rails) == 0 {
				add(p.Rail, p.Queued, p.Posted)
			}
			if states[p.State] == 0 {
				stateOrder = append(stateOrder, p.State)
			}
			states[p.State]++
		}
		for _, rail := range order {
			gauge(d.railQueued, float64(depths[rail].queued), t.Name, rail)
			gauge(d.railInflight, float64(depths[rail].posted), t.Name, rail)
		}
		for _, st := range stateOrder {
			gauge(d.endpoints, float64(states[st]), t.Name, st)
		}
	}
	for _, seg := range s.Segments {
		gauge(d.descAge, seg.DescriptorAge.Seconds(), seg.Name)
		gauge(d.segTasks, float64(seg.TasksInFlight), seg.Name)
	}
}

// histogram sends h as a Prometheus histogram (cumulative buckets).
func histogram(ch chan<- prometheus.Metric, desc *prometheus.Desc, h engine.Histogram, labels ...string) {
	buckets := make(map[float64]uint64, len(h.Bounds))
	var cum uint64
	for i, b := range h.Bounds {
		cum += h.Counts[i]
		buckets[b] = cum
	}
	ch <- prometheus.MustNewConstHistogram(desc, h.Count, h.Sum, buckets, labels...)
}

// Handler serves the metrics of the engines in the Prometheus text format,
// with the Go runtime's and the process's own, from a registry of its
// own. Two engines of one process need distinct constLabels; pass them
// through NewCollector and Registry instead.
func Handler(src Source) (http.Handler, error) {
	reg, err := Registry(NewCollector(src, nil))
	if err != nil {
		return nil, err
	}
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}), nil
}

// Registry returns a registry holding cs and the Go runtime's and the
// process's collectors.
func Registry(cs ...prometheus.Collector) (*prometheus.Registry, error) {
	reg := prometheus.NewRegistry()
	cs = append(cs, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return reg, nil
}
