package podwatch

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

type activatorIPs struct {
	mu  sync.Mutex
	ips []netip.Addr
}

func (a *activatorIPs) SetActivators(ips []netip.Addr) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.ips = ips
	return nil
}

func (a *activatorIPs) get() []netip.Addr {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.ips
}

// Under exactly the rules the package's markers generate (list and watch
// pods), the node's pod watch and the activators' watch sync against a
// real kube-apiserver and see their pods.
func TestIntegrationPodWatchUnderItsGeneratedRole(t *testing.T) {
	cl := testenv.ControlPlane(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := cl.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}}); err != nil {
		t.Fatal(err)
	}
	web := pod("web").IP("10.0.0.5").Obj()
	act := pod("act").IP("10.0.0.9").Obj()
	act.Labels = map[string]string{"app.kubernetes.io/component": "activator"}
	for _, p := range []*corev1.Pod{web, act} {
		status := p.Status
		p.UID = ""
		p.Spec.Containers = []corev1.Container{{Name: "c", Image: "x"}}
		if err := cl.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		p.Status = status
		if err := cl.Client.Status().Update(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	client, err := kubernetes.NewForConfig(cl.ConfigAs(t, "agent", testenv.GeneratedRules(t, "agent/role.yaml")))
	if err != nil {
		t.Fatal(err)
	}
	w := New(newFakeAccounting(), quiet())
	set := &activatorIPs{}
	done := make(chan error, 2)
	go func() { done <- w.Run(ctx, client, "node-a", clock.RealClock{}) }()
	go func() {
		done <- WatchActivators(ctx, client, "ns", "app.kubernetes.io/component=activator", set, nil, nil, quiet())
	}()
	testenv.Eventually(t, 20*time.Second, "both watches see their pods", func() (bool, string) {
		_, ok := w.Lookup(addr("10.0.0.5"))
		return w.Status().Synced && ok && slices.Equal(set.get(), []netip.Addr{addr("10.0.0.9")}), "not yet"
	})
	cancel()
	for range 2 {
		if err := <-done; err != nil {
			t.Errorf("watch: %v", err)
		}
	}
}

// DeletingPods, under the same generated role, reads from the API server
// the node's pods of one workload that are being deleted: not those of
// another workload or node, not those still running.
func TestIntegrationDeletingPods(t *testing.T) {
	cl := testenv.ControlPlane(t)
	ctx := context.Background()
	if err := cl.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}); err != nil {
		t.Fatal(err)
	}
	uids := map[string]types.UID{}
	for _, p := range []struct {
		name, node, replicaSet string
		deleting               bool
	}{
		{"cart-1", "node-a", "cart-5d9f", true},
		{"cart-2", "node-a", "cart-5d9f", false},
		{"cart-3", "node-b", "cart-5d9f", true},
		{"cart-4", "node-a", "cart-77aa", true}, // an older ReplicaSet of the same Deployment
		{"carton-1", "node-a", "carton-5d9f", true},
	} {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: p.name, Finalizers: []string{"test.sockscale.dev/hold"},
				Labels:          map[string]string{"pod-template-hash": p.replicaSet[strings.LastIndex(p.replicaSet, "-")+1:]},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: p.replicaSet, UID: "rs-" + types.UID(p.replicaSet), Controller: ptr.To(true)}}},
			Spec: corev1.PodSpec{NodeName: p.node, Containers: []corev1.Container{{Name: "c", Image: "x"}}},
		}
		if err := cl.Client.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
		uids[p.name] = pod.UID
		t.Cleanup(func() {
			pod.Finalizers = nil
			_ = cl.Client.Update(context.Background(), pod)
		})
		if p.deleting {
			if err := cl.Client.Delete(ctx, pod); err != nil {
				t.Fatal(err)
			}
		}
	}
	client, err := kubernetes.NewForConfig(cl.ConfigAs(t, "agent", testenv.GeneratedRules(t, "agent/role.yaml")))
	if err != nil {
		t.Fatal(err)
	}
	// The API server's authorizer learns a new role from its own watch:
	// a moment after the role is written, it may still say forbidden.
	var got []types.UID
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		got, err = DeletingPods(ctx, client, "node-a", "shop", "cart")
		if err == nil || !apierrors.IsForbidden(err) || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	want := []types.UID{uids["cart-1"], uids["cart-4"]}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("deleting pods of shop/cart on node-a: %v, want cart-1's and cart-4's %v", got, want)
	}
}
