package podwatch

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
)

// fakeAccounting is the kernel map as a Go map; the next fail calls of
// AddPod or RemovePod fail, as a full or busy kernel map would.
type fakeAccounting struct {
	mu   sync.Mutex
	pods map[netip.Addr]uint64
	fail int
}

func newFakeAccounting() *fakeAccounting { return &fakeAccounting{pods: map[netip.Addr]uint64{}} }

func (f *fakeAccounting) AddPod(ip netip.Addr, id uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail > 0 {
		f.fail--
		return errors.New("map full")
	}
	f.pods[ip] = id
	return nil
}

func (f *fakeAccounting) RemovePod(ip netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail > 0 {
		f.fail--
		return errors.New("map busy")
	}
	delete(f.pods, ip)
	return nil
}

func (f *fakeAccounting) Pods() (map[netip.Addr]uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[netip.Addr]uint64{}
	for k, v := range f.pods {
		out[k] = v
	}
	return out, nil
}

func (f *fakeAccounting) get(ip netip.Addr) (uint64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id, ok := f.pods[ip]
	return id, ok
}

// podBuilder builds test pods: pod("a").IP("10.0.0.5").Obj().
type podBuilder struct{ p *corev1.Pod }

func pod(name string) *podBuilder {
	return &podBuilder{&corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)},
		Spec:       corev1.PodSpec{NodeName: "node-a"},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}}
}

func (b *podBuilder) IP(ips ...string) *podBuilder {
	b.p.Status.PodIPs = nil
	for _, ip := range ips {
		b.p.Status.PodIPs = append(b.p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	if len(ips) > 0 {
		b.p.Status.PodIP = ips[0]
	}
	return b
}
func (b *podBuilder) UID(uid string) *podBuilder          { b.p.UID = types.UID(uid); return b }
func (b *podBuilder) HostNetwork() *podBuilder            { b.p.Spec.HostNetwork = true; return b }
func (b *podBuilder) Phase(p corev1.PodPhase) *podBuilder { b.p.Status.Phase = p; return b }
func (b *podBuilder) Created(sec int64) *podBuilder {
	b.p.CreationTimestamp = metav1.Unix(sec, 0)
	return b
}
func (b *podBuilder) Terminating() *podBuilder {
	now := metav1.Unix(1e9, 0)
	b.p.DeletionTimestamp = &now
	b.p.DeletionGracePeriodSeconds = ptr.To(int64(30))
	return b
}
func (b *podBuilder) Owner(kind, name, hash string) *podBuilder {
	yes := true
	b.p.OwnerReferences = []metav1.OwnerReference{{Kind: kind, Name: name, Controller: &yes}}
	if hash != "" {
		b.p.Labels = map[string]string{"pod-template-hash": hash}
	}
	return b
}
func (b *podBuilder) Obj() *corev1.Pod { return b.p.DeepCopy() }

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

func TestPodMapFollowsPods(t *testing.T) {
	acct := newFakeAccounting()
	w := New(acct, quiet())

	w.Update(pod("pending").Obj())                               // no address yet
	w.Update(pod("web").IP("10.0.0.5").Obj())                    // accounted
	w.Update(pod("host").IP("192.168.1.10").HostNetwork().Obj()) // shares the node's address
	w.Update(pod("v6").IP("fd00::5").Obj())                      // IPv6 only
	w.Update(pod("dual").IP("fd00::6", "10.0.0.6").Obj())        // dual stack: both, a slot each
	w.Update(pod("done").IP("10.0.0.7").Phase(corev1.PodSucceeded).Obj())

	want := map[netip.Addr]uint64{addr("10.0.0.5"): podID("uid-web"), addr("fd00::5"): podID("uid-v6"),
		addr("fd00::6"): podID("uid-dual"), addr("10.0.0.6"): podID("uid-dual")}
	if diff := cmp.Diff(want, acct.pods, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("kernel map (-want +got):\n%s", diff)
	}
	// Either address names the pod, and its stats go by its IPv4 one.
	for _, ip := range []string{"fd00::6", "10.0.0.6"} {
		if p, ok := w.Lookup(addr(ip)); !ok || p.Name != "dual" || p.IP != addr("10.0.0.6") {
			t.Errorf("Lookup(%s) = %+v, %t; want pod dual going by 10.0.0.6", ip, p, ok)
		}
	}
	if p, _ := w.Lookup(addr("fd00::5")); p.IP != addr("fd00::5") {
		t.Errorf("the IPv6-only pod goes by %s, want fd00::5", p.IP)
	}
	st := w.Status()
	if diff := cmp.Diff(Status{Tracked: 3, Skipped: map[string]int{SkipHostNetwork: 1}, Synced: false}, st); diff != "" { // dual's two addresses are one pod
		t.Errorf("status (-want +got):\n%s", diff)
	}

	// The pending pod gets its address; the finished one leaves.
	w.Update(pod("pending").IP("10.0.0.8").Obj())
	w.Update(pod("web").IP("10.0.0.5").Phase(corev1.PodFailed).Obj())
	if _, ok := acct.pods[addr("10.0.0.8")]; !ok {
		t.Error("pod that got its address is not accounted")
	}
	if _, ok := acct.pods[addr("10.0.0.5")]; ok {
		t.Error("failed pod is still accounted")
	}
	w.Delete(pod("dual").Obj())
	if _, ok := acct.pods[addr("10.0.0.6")]; ok {
		t.Error("deleted pod is still accounted")
	}
}

func TestAddressReuse(t *testing.T) {
	acct := newFakeAccounting()
	w := New(acct, quiet())
	w.Update(pod("old").IP("10.0.0.9").Obj())
	// The new pod's event can come before the old pod's deletion.
	w.Update(pod("new").IP("10.0.0.9").Obj())
	w.Delete(pod("old").Obj())
	if got := acct.pods[addr("10.0.0.9")]; got != podID("uid-new") {
		t.Errorf("kernel id for reused address = %x, want the new pod's %x", got, podID("uid-new"))
	}
	if p, ok := w.Lookup(addr("10.0.0.9")); !ok || p.Name != "new" {
		t.Errorf("Lookup = %+v, %v; want the new pod", p, ok)
	}
}

// TestLateTerminatingUpdateKeepsTheLivePod: the old pod's last updates
// (terminating, still reporting the address) arrive after the new pod took
// the address; the kernel keeps the new pod's id throughout, and the old
// pod's deletion does not remove the address.
func TestLateTerminatingUpdateKeepsTheLivePod(t *testing.T) {
	acct := newFakeAccounting()
	w := New(acct, quiet())
	w.Update(pod("old").IP("10.0.0.9").Created(100).Obj())
	w.Update(pod("new").IP("10.0.0.9").Created(200).Obj())
	w.Update(pod("old").IP("10.0.0.9").Created(100).Terminating().Obj()) // late
	if got, _ := acct.get(addr("10.0.0.9")); got != podID("uid-new") {
		t.Errorf("after the late update the kernel id is %x, want the new pod's %x", got, podID("uid-new"))
	}
	w.Delete(pod("old").Obj())
	if got, ok := acct.get(addr("10.0.0.9")); !ok || got != podID("uid-new") {
		t.Errorf("after the old pod's deletion: id %x, accounted %v; want the new pod's %x", got, ok, podID("uid-new"))
	}
	// Even a terminating pod created later does not take a live pod's address.
	w.Update(pod("newer").IP("10.0.0.9").Created(300).Terminating().Obj())
	if got, _ := acct.get(addr("10.0.0.9")); got != podID("uid-new") {
		t.Errorf("a terminating pod took the address: id %x", got)
	}
}

// TestFailedUpdatesAreRetried: a kernel update that fails is retried by
// Resync until it holds, and Status says what is pending meanwhile.
func TestFailedUpdatesAreRetried(t *testing.T) {
	acct := newFakeAccounting()
	w := New(acct, quiet())
	acct.fail = 1
	w.Update(pod("web").IP("10.0.0.5").Obj())
	if _, ok := acct.get(addr("10.0.0.5")); ok {
		t.Fatal("the failed add is in the map")
	}
	if st := w.Status(); st.Pending != 1 || st.Errors != 1 {
		t.Errorf("status %+v, want 1 pending and 1 error", st)
	}
	if err := w.Resync(); err != nil {
		t.Fatal(err)
	}
	if got, _ := acct.get(addr("10.0.0.5")); got != podID("uid-web") {
		t.Errorf("after resync: id %x, want %x", got, podID("uid-web"))
	}
	// A failed removal too.
	acct.fail = 1
	w.Delete(pod("web").Obj())
	if _, ok := acct.get(addr("10.0.0.5")); !ok {
		t.Fatal("the failed removal took effect")
	}
	if err := w.Resync(); err != nil {
		t.Fatal(err)
	}
	if _, ok := acct.get(addr("10.0.0.5")); ok {
		t.Error("the deleted pod's address is still accounted after resync")
	}
	if st := w.Status(); st.Pending != 0 {
		t.Errorf("status %+v, want nothing pending", st)
	}
}

func TestRestartKeepsLiveRemovesStale(t *testing.T) {
	acct := newFakeAccounting()
	acct.pods[addr("10.0.0.5")] = podID("uid-web") // live: keeps its counters
	acct.pods[addr("10.0.0.99")] = 42              // a pod that went while we were down
	w := New(acct, quiet())
	w.Update(pod("web").IP("10.0.0.5").Obj())
	if err := w.RemoveStale(); err != nil {
		t.Fatal(err)
	}
	want := map[netip.Addr]uint64{addr("10.0.0.5"): podID("uid-web")}
	if diff := cmp.Diff(want, acct.pods, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("kernel map after resync (-want +got):\n%s", diff)
	}
	if !w.Status().Synced {
		t.Error("not synced after RemoveStale")
	}
}

func TestWorkloadNames(t *testing.T) {
	rollout := func(name, replicaSet, hash string) *corev1.Pod {
		p := pod(name).Owner("ReplicaSet", replicaSet, "").Obj()
		p.Labels = map[string]string{"rollouts-pod-template-hash": hash}
		return p
	}
	tests := []struct {
		pod        *corev1.Pod
		name, kind string
	}{
		{pod("hello-7d9f8b6c5d-x2x4z").Owner("ReplicaSet", "hello-7d9f8b6c5d", "7d9f8b6c5d").Obj(), "hello", "Deployment"},
		{pod("rs-only-abcde").Owner("ReplicaSet", "rs-only", "").Obj(), "rs-only", "ReplicaSet"},
		{pod("db-0").Owner("StatefulSet", "db", "").Obj(), "db", "StatefulSet"},
		// An Argo Rollout's ReplicaSet: the PodAutoscaler names the Rollout.
		{rollout("web-6c8f9d7b5-x2x4z", "web-6c8f9d7b5", "6c8f9d7b5"), "web", "Rollout"},
		// A hash label that is not the ReplicaSet's suffix says nothing.
		{rollout("other-abc-x2x4z", "other-abc", "6c8f9d7b5"), "other-abc", "ReplicaSet"},
		// A custom workload owning its pods directly (a CloneSet, say).
		{pod("shop-x2x4z").Owner("CloneSet", "shop", "").Obj(), "shop", "CloneSet"},
		{pod("bare").Obj(), "bare", "Pod"},
	}
	for _, tt := range tests {
		got := describe(tt.pod)
		if got.Workload != tt.name || got.WorkloadKind != tt.kind {
			t.Errorf("%s: workload %s/%s, want %s/%s", tt.pod.Name, got.WorkloadKind, got.Workload, tt.kind, tt.name)
		}
	}
}

func TestRunWithInformer(t *testing.T) {
	client := fake.NewClientset(pod("web").IP("10.0.0.5").Obj())
	acct := newFakeAccounting()
	acct.pods[addr("10.0.0.99")] = 1 // stale
	w := New(acct, quiet())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	clk := clocktesting.NewFakeClock(time.Unix(1e9, 0))
	go func() { done <- w.Run(ctx, client, "node-a", clk) }()
	waitFor(t, func() bool { return w.Status().Synced })
	if _, ok := acct.get(addr("10.0.0.99")); ok {
		t.Error("stale entry survived the first sync")
	}
	// An entry that fails is retried on the resync tick.
	acct.mu.Lock()
	acct.fail = 1
	acct.mu.Unlock()
	if _, err := client.CoreV1().Pods("ns").Create(ctx, pod("late").IP("10.0.0.7").Obj(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return w.Status().Pending == 1 })
	waitFor(t, func() bool { clk.Step(ResyncPeriod); _, ok := acct.get(addr("10.0.0.7")); return ok })
	if _, err := client.CoreV1().Pods("ns").Create(ctx, pod("two").IP("10.0.0.6").Obj(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, ok := w.Lookup(addr("10.0.0.6")); return ok })
	if err := client.CoreV1().Pods("ns").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, ok := w.Lookup(addr("10.0.0.5")); return !ok })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatal("condition never held")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestLeaving: a pod that is terminating is listed with when its deletion
// was asked for, while it still owns its address; a pod whose address a
// newer pod took is not listed.
func TestLeaving(t *testing.T) {
	w := New(newFakeAccounting(), quiet())
	w.Update(pod("a").IP("10.0.0.5").Obj())
	w.Update(pod("b").IP("10.0.0.6").Created(100).Obj())
	if got := w.Leaving(); len(got) != 0 {
		t.Fatalf("before any deletion: leaving %v", got)
	}
	w.Update(pod("a").IP("10.0.0.5").Terminating().Obj())
	w.Update(pod("a").IP("10.0.0.5").Terminating().Obj()) // a later update of the same pod
	w.Update(pod("b").IP("10.0.0.6").Created(100).Terminating().Obj())
	w.Update(pod("c").IP("10.0.0.6").Created(200).Obj()) // takes b's address
	got := w.Leaving()
	if len(got) != 1 || got[0].Name != "a" || got[0].IP != addr("10.0.0.5") {
		t.Fatalf("leaving %+v, want a at 10.0.0.5 only", got)
	}
	term := pod("a").Terminating().Obj()
	if want := term.DeletionTimestamp.Add(-time.Duration(*term.DeletionGracePeriodSeconds) * time.Second); !got[0].Since.Equal(want) {
		t.Errorf("a leaving since %v, want %v (deletion timestamp less the grace period)", got[0].Since, want)
	}
}
