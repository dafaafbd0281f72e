package connaudit

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockscale/sockscale/agent/internal/podwatch"
	"github.com/sockscale/sockscale/agent/internal/socktable"
	"github.com/sockscale/sockscale/bpf"
)

// Accounting is the kernel side, as the bpf package's Accounting has it.
type Accounting interface {
	ConnStore() (fd int, id uint32, err error)
	NewAuditPass() (*bpf.AuditPass, error)
}

// Pods are the node's accounted pods, as the pod watcher has them.
type Pods interface {
	Accounted() []netip.Addr
	Lookup(ip netip.Addr) (podwatch.Pod, bool)
}

// Options configure an Auditor.
type Options struct {
	// Period is how often every pod is checked. Default 5 minutes: a
	// check costs a walk of the kernel's whole TCP table per pod (see
	// docs/benchmarks.md).
	Period time.Duration
	// Settle is how long a check of poked pods waits for more pokes (a
	// restarted agent adds every pod at once). Default 200 ms.
	Settle time.Duration
	// Finder finds pods' network namespaces (its zero value looks in /proc
	// and /var/run/netns).
	Finder     socktable.Finder
	Log        *slog.Logger
	Registerer prometheus.Registerer
}

// Auditor checks pods' connections against the socket table: all of them
// every Period, and those it is poked about (pods just added) at once.
type Auditor struct {
	acct Accounting
	pods Pods
	o    Options
	m    *auditMetrics

	poke chan struct{}
	mu   sync.Mutex
	// poked are pods to check soon.
	poked map[netip.Addr]bool
	// last is each pod's latest check, for the per-pod gauge.
	last map[netip.Addr]bpf.Audit

	// namespaces caches each pod's network namespace; only Run's
	// goroutine touches it.
	namespaces map[netip.Addr]socktable.Namespace
}

// New returns an Auditor of acct's pods; Run starts it.
func New(acct Accounting, pods Pods, o Options) *Auditor {
	if o.Period <= 0 {
		o.Period = 5 * time.Minute
	}
	if o.Settle <= 0 {
		o.Settle = 200 * time.Millisecond
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	a := &Auditor{
		acct: acct, pods: pods, o: o,
		poke:       make(chan struct{}, 1),
		poked:      make(map[netip.Addr]bool),
		last:       make(map[netip.Addr]bpf.Audit),
		namespaces: make(map[netip.Addr]socktable.Namespace),
	}
	a.m = newMetrics(a)
	if o.Registerer != nil {
		o.Registerer.MustRegister(a.m)
	}
	return a
}

// Poke asks for a check of the pod at ip soon: it was just added, and its
// idle connections from before are not counted yet. Never blocks.
func (a *Auditor) Poke(ip netip.Addr) {
	a.mu.Lock()
	a.poked[ip] = true
	a.mu.Unlock()
	select {
	case a.poke <- struct{}{}:
	default:
	}
}

// Run checks until ctx ends.
func (a *Auditor) Run(ctx context.Context) {
	tick := time.NewTicker(a.o.Period)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			a.CheckAll()
		case <-a.poke:
			select {
			case <-ctx.Done():
				return
			case <-time.After(a.o.Settle):
			}
			a.mu.Lock()
			ips := make([]netip.Addr, 0, len(a.poked))
			for ip := range a.poked {
				ips = append(ips, ip)
			}
			clear(a.poked)
			a.mu.Unlock()
			a.check(ips)
		}
	}
}

// CheckAll checks every accounted pod once, and forgets pods that are gone.
// Run calls it; call it only where Run does not run (its namespace cache
// belongs to one goroutine).
func (a *Auditor) CheckAll() {
	ips := a.pods.Accounted()
	live := make(map[netip.Addr]bool, len(ips))
	for _, ip := range ips {
		live[ip] = true
	}
	for ip := range a.namespaces {
		if !live[ip] {
			delete(a.namespaces, ip)
		}
	}
	a.mu.Lock()
	for ip := range a.last {
		if !live[ip] {
			delete(a.last, ip)
		}
	}
	a.mu.Unlock()
	start := time.Now()
	a.check(ips)
	a.m.duration.Observe(time.Since(start).Seconds())
}

// check checks the pods at ips.
func (a *Auditor) check(ips []netip.Addr) {
	if len(ips) == 0 {
		return
	}
	fd, id, err := a.acct.ConnStore()
	if err != nil {
		a.fail(netip.Addr{}, err)
		return
	}
	pass, err := a.acct.NewAuditPass()
	if err != nil {
		a.fail(netip.Addr{}, err)
		return
	}
	a.findNamespaces(ips, false)
	for _, ip := range ips {
		r, err := a.checkOne(pass, ip, fd, id)
		if errors.Is(err, errNoNamespace) || errors.Is(err, errNamespaceChanged) {
			// The cached namespace went (a restarted pod sandbox keeps
			// its address): look again, once.
			a.findNamespaces([]netip.Addr{ip}, true)
			r, err = a.checkOne(pass, ip, fd, id)
		}
		if err != nil {
			a.fail(ip, err)
			continue
		}
		a.record(ip, r)
	}
}

var (
	errNoNamespace      = errors.New("no network namespace holds the pod's address")
	errNamespaceChanged = errors.New("the pod's network namespace changed")
)

// checkOne audits the pod at ip with the socket table of its namespace.
func (a *Auditor) checkOne(pass *bpf.AuditPass, ip netip.Addr, fd int, id uint32) (bpf.Audit, error) {
	ns, ok := a.namespaces[ip]
	if !ok {
		return bpf.Audit{}, errNoNamespace
	}
	return pass.Audit(ip, func() ([]bpf.OpenConn, error) {
		// Only what openConns's ServerConns looks at: the kernel sends
		// nothing of the pod's connections being opened or closed.
		socks, err := socktable.DumpServerSide(ns, []int{fd})
		if err != nil {
			if errors.Is(err, socktable.ErrNamespaceGone) {
				return nil, errors.Join(errNamespaceChanged, err)
			}
			return nil, err
		}
		return openConns(socks, ip, id), nil
	})
}

// openConns are the pod's open server connections among a namespace's
// sockets, each with its state in the map id.
func openConns(socks []socktable.Socket, ip netip.Addr, id uint32) []bpf.OpenConn {
	var out []bpf.OpenConn
	for _, s := range socktable.ServerConns(socks) {
		// Connections to loopback addresses never reach the programs'
		// pod map: they are not the pod's by its address.
		if s.Local.Addr() != ip {
			continue
		}
		out = append(out, bpf.OpenConn{Cookie: s.Cookie, State: s.Storage[id], Accepted: s.Inode != 0})
	}
	return out
}

// findNamespaces looks up the namespaces of the pods at ips that have none
// cached (all of them with again).
func (a *Auditor) findNamespaces(ips []netip.Addr, again bool) {
	var want []netip.Addr
	for _, ip := range ips {
		if _, ok := a.namespaces[ip]; again || !ok {
			delete(a.namespaces, ip)
			want = append(want, ip)
		}
	}
	if len(want) == 0 {
		return
	}
	found, err := a.o.Finder.Find(want)
	if err != nil {
		// Partial: addresses in two namespaces are left out and named.
		a.o.Log.Warn("finding pods' network namespaces", "err", err)
	}
	for ip, ns := range found {
		a.namespaces[ip] = ns
	}
}

func (a *Auditor) fail(ip netip.Addr, err error) {
	a.m.audits.WithLabelValues("error").Inc()
	pod, _ := a.pods.Lookup(ip)
	a.o.Log.Warn("connection audit failed; retrying at the next period", "ip", ip, "namespace", pod.Namespace, "pod", pod.Name, "err", err)
}

// record keeps and exports a pod's check.
func (a *Auditor) record(ip netip.Addr, r bpf.Audit) {
	a.m.audits.WithLabelValues("ok").Inc()
	a.m.corrections.WithLabelValues("unseen").Add(float64(r.Unseen))
	a.m.corrections.WithLabelValues("gone").Add(float64(r.Gone))
	a.m.corrections.WithLabelValues("drift").Add(float64(abs(r.Drift)))
	a.mu.Lock()
	a.last[ip] = r
	a.mu.Unlock()
	if r.Full {
		a.m.audits.WithLabelValues("full").Inc()
		a.o.Log.Warn("the kernel's map of learned connections is full: some idle connections stay uncounted until their next request", "ip", ip, "limit", bpf.MaxLearned)
	}
	if m := r.Miscounted(); m != 0 {
		pod, _ := a.pods.Lookup(ip)
		a.o.Log.Info("connection count corrected from the socket table", "namespace", pod.Namespace, "pod", pod.Name,
			"open", r.Open, "unseen", r.Unseen, "gone", r.Gone, "drift", r.Drift)
	}
}

func abs(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}
