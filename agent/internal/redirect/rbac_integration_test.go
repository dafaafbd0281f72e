package redirect

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	bpfredirect "github.com/sockscale/sockscale/bpf/redirect"
	"github.com/sockscale/sockscale/internal/stats"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// Under exactly the agent's generated rules (its pod watch's and the
// redirect's: list and watch, no get), the Reconciler syncs its watches,
// the Routes' included, and writes the map: the markers grant all that
// the code uses.
func TestIntegrationRedirectUnderItsGeneratedRole(t *testing.T) {
	e := newITEnv(t)
	e.as = e.cl.ConfigAs(t, "agent", slices.Concat(
		testenv.GeneratedRules(t, "agent/role.yaml"), testenv.GeneratedRules(t, "agent-redirect/role.yaml")))
	e.activatorPod(t, "act-a", "10.244.0.5", true)
	rev1 := netip.AddrPortFrom(e.publicService(t, "hello-00001", httpPort), 80)
	rev2 := netip.AddrPortFrom(e.publicService(t, "hello-00002", httpPort), 80)
	e.serverlessService(t, "hello-00002", 80)
	e.setStatus(t, "hello-00002", v1alpha1.ModeProxy, "act-a")
	hello := e.routeService(t, "hello", "")
	e.route(t, "hello", split{target("hello-00001", 30, ""), target("hello-00002", 70, "")})

	r := e.run(t, prometheus.NewRegistry(), time.Second)
	e.waitSynced(t, r)
	e.waitEntries(t, "the Route's split and the ServerlessService's activator", map[netip.AddrPort][]bpfredirect.Backend{
		hello: sorted(bpfredirect.Backend{Addr: rev1, Weight: 30}, bpfredirect.Backend{Addr: rev2, Weight: 70}),
		rev2:  backends("10.244.0.5:8012"),
	})
	if s := r.State(); s != (stats.NodeState{SocketRedirect: stats.RedirectActive}) {
		t.Errorf("State() = %+v, want active without a reason", s)
	}
}
