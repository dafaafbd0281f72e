package drain

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/sockscale/sockscale/agent/internal/podwatch"
	"github.com/sockscale/sockscale/bpf"
)

// fakePods is the Pods of a node whose leaving pods the test sets; Has
// is true of those and of the pods in alive.
type fakePods struct {
	mu    sync.Mutex
	l     []podwatch.Leaving
	alive map[types.UID]bool
}

func (p *fakePods) Has(uid types.UID) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.l {
		if l.UID == uid {
			return true
		}
	}
	return p.alive[uid]
}

func (p *fakePods) Leaving() []podwatch.Leaving {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.l
}

func (p *fakePods) set(l ...podwatch.Leaving) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.l = l
}

// noConns: a pod whose connections are all gone.
type noConns struct{}

func (noConns) ServerConns(netip.Addr) ([]int, error) { return nil, nil }

type noKernel struct{}

func (noKernel) ConnActivity(int) (bpf.ConnActivity, error) { return bpf.ConnUnknown, nil }
func (noKernel) Drain(int) error                            { return nil }
func (noKernel) Snapshot() (bpf.Snapshot, error)            { return bpf.Snapshot{}, nil }

func TestWaitParams(t *testing.T) {
	d := New(noKernel{}, &fakePods{}, noConns{}, Options{})
	h := d.Handler()
	for _, tc := range []struct{ query, want string }{
		{"workload=shop", `namespace ""`},
		{"namespace=Shop&workload=shop", `namespace "Shop"`},
		{"namespace=shop", `workload ""`},
		{"namespace=shop&workload=shop_1", `workload "shop_1"`},
		{"namespace=shop&workload=shop&timeout=5", `timeout "5": a duration from 1s to 1h0m0s`},
		{"namespace=shop&workload=shop&timeout=2h", `timeout "2h"`},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/drain?"+tc.query, nil))
		if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), tc.want) {
			t.Errorf("%s: %d %q, want 400 naming %s", tc.query, rec.Code, rec.Body.String(), tc.want)
		}
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/drain?namespace=shop&workload=shop", nil))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d, want 405", rec.Code)
	}
}

// TestWaitReturnsWhenDrained: a preStop wait for a leaving pod returns
// once the pod has nothing in flight and MinWait passed since its
// deletion; one for a workload with no leaving pod after a short grace.
func TestWaitReturnsWhenDrained(t *testing.T) {
	t0 := time.Unix(1000, 0)
	clk := clocktesting.NewFakeClock(t0)
	pods := &fakePods{l: []podwatch.Leaving{{Pod: podwatch.Pod{Namespace: "shop", Workload: "cart", UID: "u1"}, IPs: []netip.Addr{netip.MustParseAddr("10.0.0.5")}, Since: t0}}}
	d := New(noKernel{}, pods, noConns{}, Options{Clock: clk, MinWait: 2 * time.Second})
	srv := httptest.NewServer(d.Handler())
	defer srv.Close()
	answer := func(query string) <-chan string {
		ch := make(chan string, 1)
		go func() {
			resp, err := http.Get(srv.URL + "/drain?" + query)
			if err != nil {
				ch <- err.Error()
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			ch <- string(b)
		}()
		return ch
	}
	cart, other := answer("namespace=shop&workload=cart"), answer("namespace=shop&workload=other")
	// Rounds every 500 ms of the fake clock until both answered; the
	// fake time each answer came at.
	var cartAt, otherAt time.Duration
	var cartBody, otherBody string
	for elapsed := time.Duration(0); elapsed <= 10*time.Second && (cartBody == "" || otherBody == ""); {
		time.Sleep(20 * time.Millisecond) // the waits are in
		clk.Step(500 * time.Millisecond)
		elapsed += 500 * time.Millisecond
		d.Round()
		deadline := time.After(200 * time.Millisecond)
	collect:
		for cartBody == "" || otherBody == "" {
			select {
			case cartBody = <-cart:
				cartAt = elapsed
			case otherBody = <-other:
				otherAt = elapsed
			case <-deadline:
				break collect
			}
		}
	}
	// At the 2 s round, seen then or (on a slow machine) a round later.
	if !strings.Contains(cartBody, "drained 1 pod(s) of shop/cart") || cartAt < 2*time.Second || cartAt > 3*time.Second {
		t.Errorf("cart: %q at %v, want drained at 2 s (MinWait after the deletion)", cartBody, cartAt)
	}
	if !strings.Contains(otherBody, "no pod of shop/other is leaving") || otherAt < 2*time.Second {
		t.Errorf("other: %q at %v, want none leaving after the 2 s grace", otherBody, otherAt)
	}
}
