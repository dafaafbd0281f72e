package podwatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sort"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// ActivatorSet is where activator addresses go (bpf Accounting).
type ActivatorSet interface {
	SetActivators(ips []netip.Addr) error
}

// The activator pods through an informer (list and watch, no get).
// +kubebuilder:rbac:groups="",resources=pods,verbs=list;watch

// activatorMetrics say whether the kernel's set of activators is what the
// cluster has: a set the kernel refused (more addresses than it holds)
// stays as it was, so requests from the activators missing from it would
// count as load and be counted twice; that must be seen, not silent.
type activatorMetrics struct {
	found    prometheus.Gauge
	inKernel prometheus.Gauge
	failures prometheus.Counter
}

func newActivatorMetrics(reg prometheus.Registerer) *activatorMetrics {
	m := &activatorMetrics{
		found: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sockscale_agent_activators",
			Help: "Running activator pods of --activator-namespace matching --activator-selector (each with every address it has)."}),
		inKernel: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sockscale_agent_activators_in_kernel",
			Help: "Activator addresses in the kernel's set (requests from them count as proxied); below sockscale_agent_activators when the kernel refused the set."}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{Name: "sockscale_agent_activator_set_failures_total",
			Help: "Times the kernel's set of activators could not be written (e.g. more addresses than it holds); the set stays as it was."}),
	}
	if reg != nil {
		reg.MustRegister(m.found, m.inKernel, m.failures)
	}
	return m
}

// WatchActivators keeps set equal to the IPv4 addresses of the running pods
// that match selector in namespace: requests from them count as proxied.
// namespace must be where the activators run (a tenant can copy their
// labels, not their namespace). A set the kernel refuses is an error in
// the log, in the metrics registered with reg (nil: none) and, once per
// distinct refusal, an Event through refusals (nil: none). It returns
// when ctx ends.
func WatchActivators(ctx context.Context, client kubernetes.Interface, namespace, selector string, set ActivatorSet, reg prometheus.Registerer, refusals *RefusalEvents, log *slog.Logger) error {
	if namespace == "" {
		return errors.New("watch activators: no namespace: activators are only the pods of the namespace they run in")
	}
	m := newActivatorMetrics(reg)
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
	inf := factory.Core().V1().Pods().Informer()
	var mu sync.Mutex // handlers and the first sync below may overlap
	syncSet := func() {
		mu.Lock()
		defer mu.Unlock()
		var ips []netip.Addr
		pods := 0 // the gauges count activator pods, a dual-stack one once
		for _, obj := range inf.GetStore().List() {
			pod := obj.(*corev1.Pod)
			if addrs, reason := accountable(pod); reason == "" && len(addrs) > 0 {
				ips = append(ips, addrs...) // both of a dual-stack activator's: clients of either family
				pods++
			}
		}
		sort.Slice(ips, func(i, j int) bool { return ips[i].Less(ips[j]) })
		m.found.Set(float64(pods))
		if err := set.SetActivators(ips); err != nil {
			m.failures.Inc()
			log.Error("set activator addresses: the kernel keeps its previous set, so requests from the activators missing from it count as load", "activators", len(ips), "err", err)
			refusals.refused(len(ips), err)
			return
		}
		refusals.accepted()
		m.inKernel.Set(float64(pods))
		log.Debug("activator addresses", "ips", ips)
	}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { syncSet() },
		UpdateFunc: func(any, any) { syncSet() },
		DeleteFunc: func(any) { syncSet() },
	}
	if _, err := inf.AddEventHandler(handler); err != nil {
		return fmt.Errorf("watch activators: %w", err)
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		if ctx.Err() != nil {
			return nil
		}
		return errors.New("watch activators: cache never synced")
	}
	syncSet()
	<-ctx.Done()
	factory.Shutdown()
	return nil
}
