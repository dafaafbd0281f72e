package podwatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sort"
	"sync"

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

// WatchActivators keeps set equal to the IPv4 addresses of the running pods
// that match selector in namespace (all namespaces if empty): requests from
// them count as proxied. It returns when ctx ends.
func WatchActivators(ctx context.Context, client kubernetes.Interface, namespace, selector string, set ActivatorSet, log *slog.Logger) error {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
	inf := factory.Core().V1().Pods().Informer()
	var mu sync.Mutex // handlers and the first sync below may overlap
	syncSet := func() {
		mu.Lock()
		defer mu.Unlock()
		var ips []netip.Addr
		for _, obj := range inf.GetStore().List() {
			pod := obj.(*corev1.Pod)
			if ip, reason := accountable(pod); reason == "" && ip.IsValid() {
				ips = append(ips, ip)
			}
		}
		sort.Slice(ips, func(i, j int) bool { return ips[i].Less(ips[j]) })
		if err := set.SetActivators(ips); err != nil {
			log.Error("set activator addresses", "err", err)
			return
		}
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
