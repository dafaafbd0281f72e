package sampler

import (
	"context"
	"log/slog"
	"net/netip"
	"sort"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/sockscale/sockscale/agent/internal/podwatch"
	"github.com/sockscale/sockscale/bpf"
	"github.com/sockscale/sockscale/internal/stats"
)

// Accounting modes of a pod, the label values of the mode metric; the
// stats report them as stats.Accounting.
const (
	ModeHTTP       = "http"       // requests parsed from HTTP/1.x
	ModeHTTP2      = "http2"      // some connections were HTTP/2 (h2c, gRPC): their streams counted as requests
	ModeConnection = "connection" // some connections were neither, open at some point in the period: counted per connection
)

// Source is the kernel side, as the bpf package's Accounting has it.
type Source interface {
	Snapshot() (bpf.Snapshot, error)
	Events() (bpf.Events, error)
}

// Pods says who a pod address belongs to.
type Pods interface {
	Lookup(ip netip.Addr) (podwatch.Pod, bool)
}

// Recorder receives the sampler's own health.
type Recorder interface {
	ObserveSnapshot(d time.Duration)
	Error(stage string)
}

// PodSample is one pod at one sample.
type PodSample struct {
	IP       netip.Addr
	Pod      podwatch.Pod // zero if the address is not (yet) known to the watcher
	Counters bpf.PodCounters
	Mode     string
}

// Sample is every pod at one instant, with the averages of the period that
// ended there.
type Sample struct {
	Time   time.Time // wall clock
	Pods   []PodSample
	Events bpf.Events
	// Batch holds the averages over the period since the previous sample,
	// for the controller; nil for the first sample.
	Batch *stats.Batch
}

// Sampler takes a Sample every period.
type Sampler struct {
	src      Source
	pods     Pods
	rec      Recorder
	node     string
	period   time.Duration
	clock    clock.WithTicker
	log      *slog.Logger
	onSample func(*Sample)

	latest atomic.Pointer[Sample]
	prev   bpf.Snapshot
	prevAt time.Time
}

// Options configure a Sampler.
type Options struct {
	Node     string
	Period   time.Duration
	Clock    clock.WithTicker
	Log      *slog.Logger
	Recorder Recorder
	// OnSample, if set, is called with each sample (the reporter).
	OnSample func(*Sample)
}

// New returns a sampler of src.
func New(src Source, pods Pods, opts Options) *Sampler {
	return &Sampler{src: src, pods: pods, rec: opts.Recorder, node: opts.Node, period: opts.Period,
		clock: opts.Clock, log: opts.Log, onSample: opts.OnSample}
}

// Run samples every period until ctx ends.
func (s *Sampler) Run(ctx context.Context) {
	t := s.clock.NewTicker(s.period)
	defer t.Stop()
	for {
		if err := s.SampleOnce(); err != nil {
			s.log.Error("read kernel counters", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
	}
}

// Latest is the newest sample, or nil before the first.
func (s *Sampler) Latest() *Sample { return s.latest.Load() }

// SampleOnce takes one sample now.
func (s *Sampler) SampleOnce() error {
	start := s.clock.Now()
	snap, err := s.src.Snapshot()
	if err != nil {
		s.rec.Error("snapshot")
		return err
	}
	s.rec.ObserveSnapshot(s.clock.Since(start))
	ev, err := s.src.Events()
	if err != nil {
		s.rec.Error("events")
		return err
	}
	now := s.clock.Now()
	sample := &Sample{Time: now, Events: ev, Pods: make([]PodSample, 0, len(snap.Pods))}
	havePrev := s.prev.Pods != nil
	if havePrev {
		sample.Batch = &stats.Batch{Node: s.node, Start: s.prevAt, Period: now.Sub(s.prevAt)}
	}
	// A dual-stack pod's addresses are counted apart in the kernel (a
	// slot each): each address's period is taken on its own (one may be
	// new or reset), then a pod's addresses are summed into one sample and
	// one record, by the address the pod goes by.
	type podKey struct {
		uid             types.UID
		namespace, name string
	}
	merged := make(map[podKey]int)  // a known pod's index in sample.Pods
	records := make(map[podKey]int) // ... and in sample.Batch.Pods
	for ip, c := range snap.Pods {
		ps := PodSample{IP: ip, Counters: c, Mode: ModeHTTP}
		ps.Pod, _ = s.pods.Lookup(ip)
		prev, seen := s.prev.Pods[ip]
		if !seen || c.Requests.Started < prev.Requests.Started {
			prev = bpf.PodCounters{} // new pod, or its counters were reset
		}
		switch {
		case c.OpaqueConnsInFlight > 0 || prev.OpaqueConnsInFlight > 0 || c.OpaqueConnsTotal > prev.OpaqueConnsTotal:
			ps.Mode = ModeConnection
		case c.H2ConnsInFlight > 0 || c.H2ConnsTotal > prev.H2ConnsTotal:
			ps.Mode = ModeHTTP2
		}
		if ps.Pod.Name == "" {
			sample.Pods = append(sample.Pods, ps) // not (yet) known: by its address alone
			continue
		}
		if ps.Pod.IP.IsValid() {
			ps.IP = ps.Pod.IP
		}
		key := podKey{ps.Pod.UID, ps.Pod.Namespace, ps.Pod.Name}
		if i, ok := merged[key]; ok {
			sample.Pods[i] = mergeSamples(sample.Pods[i], ps)
		} else {
			merged[key] = len(sample.Pods)
			sample.Pods = append(sample.Pods, ps)
		}
		if havePrev {
			st := periodStat(ps, prev, snap.At-s.prev.At)
			if i, ok := records[key]; ok {
				sample.Batch.Pods[i] = mergeStats(sample.Batch.Pods[i], st)
			} else {
				records[key] = len(sample.Batch.Pods)
				sample.Batch.Pods = append(sample.Batch.Pods, st)
			}
		}
	}
	sort.Slice(sample.Pods, func(i, j int) bool { return sample.Pods[i].IP.Less(sample.Pods[j].IP) })
	s.prev, s.prevAt = snap, now
	s.latest.Store(sample)
	if s.onSample != nil {
		s.onSample(sample)
	}
	return nil
}

// modeRank orders the accounting modes: a pod with a connection counted
// per connection anywhere is counted per connection, else one with an
// HTTP/2 connection is HTTP/2.
var modeRank = map[string]int{ModeHTTP: 0, ModeHTTP2: 1, ModeConnection: 2}

// mergeSamples is one pod's two addresses' samples as one.
func mergeSamples(a, b PodSample) PodSample {
	a.Counters = a.Counters.Add(b.Counters)
	if modeRank[b.Mode] > modeRank[a.Mode] {
		a.Mode = b.Mode
	}
	return a
}

// mergeStats is one pod's two addresses' period records as one: requests
// and concurrencies add up; the accounting is the coarser of the two
// (stats.Accounting values grow coarser).
func mergeStats(a, b stats.PodStat) stats.PodStat {
	a.Concurrency += b.Concurrency
	a.ProxiedConcurrency += b.ProxiedConcurrency
	a.Requests += b.Requests
	a.ProxiedRequests += b.ProxiedRequests
	a.OpaqueConcurrency += b.OpaqueConcurrency
	a.Accounting = max(a.Accounting, b.Accounting)
	return a
}

// periodStat averages a pod's requests over the kernel time dt between two
// snapshots: the growth of the in-flight integral divided by dt.
func periodStat(ps PodSample, prev bpf.PodCounters, dt time.Duration) stats.PodStat {
	c := ps.Counters
	st := stats.PodStat{
		IP: ps.IP, Namespace: ps.Pod.Namespace, Pod: ps.Pod.Name, Workload: ps.Pod.Workload,
		Requests:        c.Requests.Completed - prev.Requests.Completed,
		ProxiedRequests: c.Proxied.Completed - prev.Proxied.Completed,
	}
	if dt > 0 {
		st.Concurrency = max(0, float64(c.Requests.Area-prev.Requests.Area)/float64(dt))
		st.ProxiedConcurrency = max(0, float64(c.Proxied.Area-prev.Proxied.Area)/float64(dt))
	}
	switch ps.Mode {
	case ModeHTTP2:
		st.Accounting = stats.AccountingHTTP2Streams
	case ModeConnection:
		st.Accounting = stats.AccountingConnections
		// An estimate: the kernel keeps a time integral for requests, not
		// for opaque connections apart, only how many are open. The mean
		// of that count at the period's two ends misses a connection
		// opened and closed within the period and counts one opened just
		// before the end as half; capped at Concurrency, of which the
		// opaque connections are a part (each is a request in flight).
		// That is enough for its only use: the controller shows a target
		// as counted per connection when, over its stable window, such
		// connections are at least 0.1 in flight and 10 % of its load,
		// which errors of a fraction of a connection in a period do not
		// move across; nothing is scaled on it.
		inFlight := max(0, prev.OpaqueConnsInFlight) + max(0, c.OpaqueConnsInFlight)
		st.OpaqueConcurrency = min(st.Concurrency, float64(inFlight)/2)
	}
	return st
}
