package handler

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/sockscale/sockscale/activator/internal/netpol"
	"github.com/sockscale/sockscale/activator/internal/target"
)

// admitter answers err, and records what it was asked.
type admitter struct {
	mu    sync.Mutex
	err   error
	asked []admission
}

type admission struct {
	Client netip.Addr
	Key    target.Key
	Dest   netip.AddrPort
}

func (a *admitter) Admit(_ context.Context, client netip.Addr, key target.Key, dest netip.AddrPort) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.asked = append(a.asked, admission{client, key, dest})
	return a.err
}

func (a *admitter) set(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.err, a.asked = err, nil
}

func (a *admitter) questions() []admission {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.asked
}

// TestNetworkPolicies: the Admitter is asked with the client's address
// and the pod the throttle chose; a refused request gets 403 and never
// reaches the pod, an undecided one 503, an admitted one is forwarded.
func TestNetworkPolicies(t *testing.T) {
	adm := &admitter{}
	e := newEnvWithAdmitter(t, 0, nil, adm)
	p := newPod(t, hi)
	e.serve(t, target.Target{Key: hello, Ports: []uint16{80}}, p.Server)
	podAddr := netip.MustParseAddrPort(p.Listener.Addr().String())
	denied := fmt.Errorf("client 127.0.0.1 (pod shop/curl) may not reach default/hello (pod hello-1, port %d): %w", podAddr.Port(), netpol.ErrDenied)

	tests := []struct {
		name     string
		err      error
		code     int
		reason   string
		body     string
		forwards bool
	}{
		{name: "admitted", code: 200, body: "hi from the pod", forwards: true},
		{name: "refused", err: denied, code: 403, reason: reasonNetworkPolicy,
			body: fmt.Sprintf("sockscale-activator: client 127.0.0.1 (pod shop/curl) may not reach default/hello (pod hello-1, port %d): the target's NetworkPolicies do not admit it; the request is not forwarded\n", podAddr.Port())},
		{name: "undecided", err: fmt.Errorf("%w: not synced", netpol.ErrUndecided), code: 503, reason: reasonNetworkPolicyUndecided,
			body: "sockscale-activator: default/hello: NetworkPolicies cannot be checked yet: not synced; retry later\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			adm.set(tt.err)
			hits := p.hits.Load()
			var before float64
			if tt.reason != "" {
				before = e.errorResponses(t, tt.code, tt.reason)
			}
			resp, body := raw(t, e.addr(), "GET / HTTP/1.1\nHost: hello.default:80\n\n")
			if resp.StatusCode != tt.code || !strings.Contains(body, tt.body) {
				t.Errorf("got %d %q; want %d with %q", resp.StatusCode, body, tt.code, tt.body)
			}
			if forwarded := p.hits.Load() > hits; forwarded != tt.forwards {
				t.Errorf("forwarded = %v, want %v", forwarded, tt.forwards)
			}
			want := []admission{{Client: netip.MustParseAddr("127.0.0.1"), Key: hello, Dest: podAddr}}
			if diff := cmp.Diff(want, adm.questions(), cmpopts.EquateComparable(netip.Addr{}, netip.AddrPort{})); diff != "" {
				t.Errorf("asked (-want +got):\n%s", diff)
			}
			if tt.reason != "" {
				if got := e.errorResponses(t, tt.code, tt.reason) - before; got != 1 {
					t.Errorf("error_responses_total{code=%d,reason=%s} rose by %v, want 1", tt.code, tt.reason, got)
				}
			}
		})
	}
}

// TestNetworkPoliciesHeldRequest: a request held while its target has no
// pod is refused once a pod is chosen for it, and never reaches it.
func TestNetworkPoliciesHeldRequest(t *testing.T) {
	adm := &admitter{err: fmt.Errorf("client 127.0.0.1 (no pod) may not reach default/hello: %w", netpol.ErrDenied)}
	e := newEnvWithAdmitter(t, 0, nil, adm)
	e.serve(t, target.Target{Key: hello, Ports: []uint16{80}})
	type result struct {
		code int
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, _, err := e.get(t, context.Background(), "hello.default:80")
		if err != nil {
			done <- result{err: err}
			return
		}
		done <- result{code: resp.StatusCode}
	}()
	e.waitHeld(t, 1)
	if len(adm.questions()) != 0 {
		t.Fatalf("asked before a pod was chosen: %v", adm.questions())
	}
	p := newPod(t, hi)
	e.setPods(hello, p.Server)
	if r := <-done; r.err != nil || r.code != 403 {
		t.Errorf("held request: %d, %v; want 403", r.code, r.err)
	}
	if n := p.hits.Load(); n != 0 {
		t.Errorf("the pod got %d requests, want none", n)
	}
}
