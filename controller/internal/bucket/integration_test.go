package bucket

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	coordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// TestIntegrationBucketsSpreadAndMove runs three replicas' Sets against a
// real kube-apiserver with six buckets and shortened timings. A replica
// alone holds every bucket; three hold two each; one that stops
// gracefully hands its two over at once; one whose API server goes
// silent (a crash, a partition) stops owning its buckets before anyone
// else can take them, and the last replica ends up with all six. At no
// moment, sampled every few milliseconds, do two replicas own a bucket.
func TestIntegrationBucketsSpreadAndMove(t *testing.T) {
	cl := testenv.ControlPlane(t)
	cs, err := kubernetes.NewForConfig(cl.Config)
	if err != nil {
		t.Fatal(err)
	}
	const count = 6
	type replica struct {
		name   string
		set    *Set
		cancel context.CancelFunc
		done   chan struct{}
		cut    *cuttable
	}
	start := func(name string) *replica {
		r := &replica{name: name, done: make(chan struct{}), cut: &cuttable{LeasesGetter: cs.CoordinationV1()}}
		set, err := New(Options{Count: count, Namespace: "default", Identity: name, Leases: r.cut,
			Log:           zap.New(zap.UseDevMode(true)).WithName(name),
			LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 250 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		r.set = set
		ctx, cancel := context.WithCancel(context.Background())
		r.cancel = cancel
		go func() { defer close(r.done); _ = set.Start(ctx) }()
		t.Cleanup(func() { cancel(); <-r.done })
		return r
	}
	var (
		mu       sync.Mutex
		replicas []*replica
		overlaps []string
	)
	watching := make(chan struct{})
	go func() { // the safety property, sampled all along
		defer close(watching)
		for {
			mu.Lock()
			rs := slices.Clone(replicas)
			mu.Unlock()
			if rs == nil {
				return
			}
			for b := range count {
				var owners []string
				for _, r := range rs {
					if r.set.Holds(b) {
						owners = append(owners, r.name)
					}
				}
				if len(owners) > 1 && len(overlaps) < 10 {
					overlaps = append(overlaps, fmt.Sprintf("bucket %d owned by %v", b, owners))
				}
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	defer func() {
		mu.Lock()
		replicas = nil
		mu.Unlock()
		<-watching
		if len(overlaps) > 0 {
			t.Errorf("two replicas owned a bucket at once: %v", overlaps)
		}
	}()
	shares := func(rs ...*replica) string {
		var parts []string
		for _, r := range rs {
			parts = append(parts, fmt.Sprintf("%s %v", r.name, r.set.Held()))
		}
		return strings.Join(parts, ", ")
	}
	held := func(what string, limit time.Duration, want map[*replica]int) time.Duration {
		t.Helper()
		began := time.Now()
		rs := make([]*replica, 0, len(want))
		for r := range want {
			rs = append(rs, r)
		}
		slices.SortFunc(rs, func(a, b *replica) int { return strings.Compare(a.name, b.name) })
		testenv.Eventually(t, limit, what, func() (bool, string) {
			for r, n := range want {
				if len(r.set.Held()) != n {
					return false, shares(rs...)
				}
			}
			return true, ""
		})
		took := time.Since(began)
		t.Logf("%s: %s after %v", what, shares(rs...), took.Round(time.Millisecond))
		return took
	}

	a := start("replica-a")
	gained := a.set.Gained()
	mu.Lock()
	replicas = []*replica{a}
	mu.Unlock()
	held("alone, replica-a holds every bucket", 30*time.Second, map[*replica]int{a: count})
	select {
	case <-gained:
	default:
		t.Error("winning buckets did not signal Gained")
	}

	b, c := start("replica-b"), start("replica-c")
	mu.Lock()
	replicas = []*replica{a, b, c}
	mu.Unlock()
	held("three replicas hold two buckets each", 30*time.Second, map[*replica]int{a: 2, b: 2, c: 2})
	if got, want := c.set.Held(), []int{2, 5}; !slices.Equal(got, want) {
		t.Errorf("replica-c (third of three by name) holds %v, want %v", got, want)
	}
	// The Leases say the same as the replicas.
	owned := map[string][]int{"replica-a": a.set.Held(), "replica-b": b.set.Held(), "replica-c": c.set.Held()}
	for i := range count {
		l, err := cs.CoordinationV1().Leases("default").Get(context.Background(), LeaseName(i, count), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if holder := *l.Spec.HolderIdentity; !slices.Contains(owned[holder], i) {
			t.Errorf("Lease %s is held by %q, which does not own bucket %d", l.Name, holder, i)
		}
	}

	// A graceful stop (a rollout) hands over at once: within a few
	// retry periods, far under the lease duration.
	c.cancel()
	<-c.done
	if got := c.set.Held(); len(got) != 0 {
		t.Errorf("stopped replica-c still owns %v", got)
	}
	if took := held("replica-c stopped: the other two hold three each", 30*time.Second, map[*replica]int{a: 3, b: 3}); took > 3*time.Second {
		t.Errorf("the buckets of a replica that stopped gracefully moved after %v, want within the 3 s lease duration (released, not expired)", took)
	}

	// replica-b loses the API server: it must stop owning its buckets
	// by its renew deadline, and replica-a takes them after they expire.
	b.cut.off.Store(true)
	held("replica-b cut off: replica-a holds every bucket", 60*time.Second, map[*replica]int{a: count, b: 0})
}

// cuttable is a Lease client that can be cut off from the API server.
type cuttable struct {
	coordinationv1.LeasesGetter
	off atomic.Bool
}

func (c *cuttable) Leases(ns string) coordinationv1.LeaseInterface {
	return cutLeases{LeaseInterface: c.LeasesGetter.Leases(ns), off: &c.off}
}

type cutLeases struct {
	coordinationv1.LeaseInterface
	off *atomic.Bool
}

var errCut = errors.New("cut off from the API server (test)")

func (c cutLeases) Get(ctx context.Context, name string, o metav1.GetOptions) (*coordv1.Lease, error) {
	if c.off.Load() {
		return nil, errCut
	}
	return c.LeaseInterface.Get(ctx, name, o)
}

func (c cutLeases) List(ctx context.Context, o metav1.ListOptions) (*coordv1.LeaseList, error) {
	if c.off.Load() {
		return nil, errCut
	}
	return c.LeaseInterface.List(ctx, o)
}

func (c cutLeases) Create(ctx context.Context, l *coordv1.Lease, o metav1.CreateOptions) (*coordv1.Lease, error) {
	if c.off.Load() {
		return nil, errCut
	}
	return c.LeaseInterface.Create(ctx, l, o)
}

func (c cutLeases) Update(ctx context.Context, l *coordv1.Lease, o metav1.UpdateOptions) (*coordv1.Lease, error) {
	if c.off.Load() {
		return nil, errCut
	}
	return c.LeaseInterface.Update(ctx, l, o)
}

func (c cutLeases) Delete(ctx context.Context, name string, o metav1.DeleteOptions) error {
	if c.off.Load() {
		return errCut
	}
	return c.LeaseInterface.Delete(ctx, name, o)
}
