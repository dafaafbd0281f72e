package statsauth_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/controller/internal/collector"
	"github.com/sockscale/sockscale/controller/internal/config"
	"github.com/sockscale/sockscale/controller/internal/statsauth"
	"github.com/sockscale/sockscale/controller/internal/statsserver"
	"github.com/sockscale/sockscale/internal/stats"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// TestIntegrationStatsAuth drives the real stats handler with tokens the
// real kube-apiserver issues (TokenRequest, bound to pods on nodes) and
// reviews (TokenReview, SubjectAccessReview against RBAC rules like the
// chart's).
func TestIntegrationStatsAuth(t *testing.T) {
	cl := testenv.ControlPlane(t)
	ctx := t.Context()
	const ns = "sockscale-system"
	create := func(objs ...client.Object) {
		t.Helper()
		for _, o := range objs {
			if err := cl.Client.Create(ctx, o); err != nil {
				t.Fatalf("create %T %s: %v", o, o.GetName(), err)
			}
		}
	}
	create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}})
	// The ServiceAccounts and RBAC of the chart's agent and activator.
	for _, r := range []struct{ sa, resource string }{{"sockscale-agent", statsauth.ResourceNodeStats}, {"sockscale-activator", statsauth.ResourceTargetStats}} {
		create(&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: r.sa}},
			&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: r.sa},
				Rules: []rbacv1.PolicyRule{{APIGroups: []string{statsauth.Group}, Resources: []string{r.resource}, Verbs: []string{statsauth.Verb}}}},
			&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: r.sa},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: r.sa},
				Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: r.sa}}})
	}
	pod := func(name, sa, node string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.PodSpec{
			NodeName: node, ServiceAccountName: sa, AutomountServiceAccountToken: ptr.To(false),
			Containers: []corev1.Container{{Name: "c", Image: "example"}}}}
		create(p)
		return p
	}
	agentA := pod("sockscale-agent-a", "sockscale-agent", "node-a")
	activator := pod("sockscale-activator-0", "sockscale-activator", "node-b")
	plain := pod("client", "default", "node-a")

	cs, err := kubernetes.NewForConfig(cl.Config)
	if err != nil {
		t.Fatal(err)
	}
	token := func(p *corev1.Pod, audience string) string {
		t.Helper()
		sa := p.Spec.ServiceAccountName
		if sa == "default" {
			// The default ServiceAccount is made by the controller-manager,
			// which does not run here.
			if _, err := cs.CoreV1().ServiceAccounts(ns).Get(ctx, sa, metav1.GetOptions{}); err != nil {
				create(&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa}})
			}
		}
		tr := &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{
			ExpirationSeconds: ptr.To(int64(3600)),
			BoundObjectRef:    &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID},
		}}
		if audience != "" {
			tr.Spec.Audiences = []string{audience}
		}
		got, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, tr, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("token for %s: %v", p.Name, err)
		}
		return got.Status.Token
	}
	agentToken := token(agentA, statsauth.DefaultAudience)

	// The bound token's review carries the pod's node (Kubernetes >= 1.30).
	auth := statsauth.New(statsauth.Options{Reviewer: statsauth.APIReviewer{Client: cl.Client}})
	caller, err := auth.Authenticate(ctx, agentToken)
	if err != nil {
		t.Fatalf("the agent's token: %v", err)
	}
	want := &statsauth.Caller{User: "system:serviceaccount:sockscale-system:sockscale-agent", Node: "node-a", Pod: "sockscale-agent-a", Agent: true}
	if diff := cmp.Diff(want, caller); diff != "" {
		t.Fatalf("the agent's caller (-want +got):\n%s", diff)
	}

	// The real handler, with the collector's view of one target's pods.
	col := collector.New(clock.RealClock{})
	hello := collector.Key{Namespace: "default", Name: "hello"}
	s, err := config.Effective(config.Defaults(), 0, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := col.Watch(hello, hello, s); err != nil {
		t.Fatal(err)
	}
	col.Members(hello, map[netip.Addr]string{netip.MustParseAddr("10.1.0.1"): "node-a", netip.MustParseAddr("10.1.0.2"): "node-b"})
	var mu sync.Mutex
	var accepted []*stats.Batch
	srv := httptest.NewServer(statsserver.Handler(statsserver.Options{Auth: auth, Pods: col, Accept: func(b *stats.Batch) error {
		mu.Lock()
		defer mu.Unlock()
		accepted = append(accepted, b)
		return nil
	}}))
	defer srv.Close()
	rec := func(ip, name string) stats.PodStat {
		return stats.PodStat{IP: netip.MustParseAddr(ip), Namespace: "default", Pod: name, Workload: "hello", Concurrency: 100}
	}
	now := time.Now()
	nodeA := &stats.Batch{Node: "node-a", Start: now, Period: time.Second, Pods: []stats.PodStat{rec("10.1.0.1", "hello-1"), rec("10.1.0.2", "hello-2")}}
	nodeB := &stats.Batch{Node: "node-b", Start: now, Period: time.Second, Pods: []stats.PodStat{rec("10.1.0.2", "hello-2")}}
	targets := &stats.Batch{Node: "sockscale-activator-0", Start: now, Period: time.Second, Targets: []stats.TargetStat{{Namespace: "default", Workload: "hello", Concurrency: 3}}}
	tests := []struct {
		name  string
		token string
		batch *stats.Batch
		code  int
		msg   string
	}{
		{"agent, its node", agentToken, nodeA, 204, ""},
		{"agent of node-a for node-b", agentToken, nodeB, 403, `the batch is for node "node-b" but the token of system:serviceaccount:sockscale-system:sockscale-agent is bound to a pod on node "node-a"`},
		{"agent with target records", agentToken, targets, 403, "may not send target records"},
		{"activator", token(activator, statsauth.DefaultAudience), targets, 204, ""},
		{"activator with pod records", token(activator, statsauth.DefaultAudience), nodeB, 403, "may not send pod records"},
		{"default ServiceAccount, right audience", token(plain, statsauth.DefaultAudience), nodeA, 403,
			"system:serviceaccount:sockscale-system:default may not create nodestats.sockscale.dev (agents) nor targetstats.sockscale.dev (activators)"},
		{"agent, the API server's audience", token(agentA, ""), nodeA, 401, `do not include "sockscale-controller"`},
		{"no token", "", nodeA, 401, "no bearer token"},
		{"a forged token", forge(agentToken), nodeA, 401, "unauthenticated"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, msg := post(t, srv.URL, tt.token, tt.batch)
			if code != tt.code || !strings.Contains(msg, tt.msg) {
				t.Errorf("%d %q, want %d with %q", code, msg, tt.code, tt.msg)
			}
		})
	}
	mu.Lock()
	if len(accepted) != 2 || len(accepted[0].Pods) != 1 || accepted[0].Pods[0].Pod != "hello-1" {
		t.Errorf("accepted %d batches, the first with pods %+v; want 2, the agent's with hello-1 only (hello-2 runs on node-b)", len(accepted), accepted[0].Pods)
	}
	mu.Unlock()

	// A deleted pod's token stops working at the next review (within the
	// API server's own token cache, 10 s), not when it expires.
	if err := cl.Client.Delete(ctx, agentA, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the deleted pod's token is refused", func() (bool, string) {
		fresh := statsauth.New(statsauth.Options{Reviewer: statsauth.APIReviewer{Client: cl.Client}})
		_, err := fresh.Authenticate(context.Background(), agentToken)
		return err != nil && strings.Contains(err.Error(), "unauthenticated"), "err " + errString(err)
	})
}

func errString(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}

// forge keeps a token's header and claims and changes its signature.
func forge(token string) string {
	i := strings.LastIndex(token, ".")
	sig := []byte(token[i+1:])
	sig[0] ^= 1
	if sig[0] == '.' || sig[0] == '=' {
		sig[0] = 'A'
	}
	return token[:i+1] + string(sig)
}

func post(t *testing.T, url, token string, b *stats.Batch) (int, string) {
	t.Helper()
	body, err := stats.Append(nil, b)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, url+stats.Path, bytes.NewReader(body))
	req.Header.Set("Content-Type", stats.ContentType)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(msg)
}
