package integration

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/internal/stats"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// TestIntegrationSocketLayerCondition runs the controller binary against a
// real kube-apiserver and POSTs two agents' stats to it with their node
// states, as agents send them. The ServerlessService's SocketLayer
// condition, and the column `kubectl get sks` prints from it, follow: True
// while both nodes run the redirect, False naming the node that turns it
// off or sends a state the controller cannot read, Unknown naming a node
// that falls silent.
//
// The condition's type and reasons are the API users see, written out here
// as they read them (controller/internal/socketlayer defines them).
func TestIntegrationSocketLayerCondition(t *testing.T) {
	cl := testenv.ControlPlane(t)
	c, ctx := cl.Client, t.Context()
	cl.CreateDeployment(t, "default", "hello", 1, 1)
	public := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}}
	if err := c.Create(ctx, public); err != nil {
		t.Fatal(err)
	}
	pa := &v1alpha1.PodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
		Spec: v1alpha1.PodAutoscalerSpec{
			ScaleTargetRef: v1alpha1.ScaleTargetRef{APIVersion: "apps/v1", Kind: "Deployment", Name: "hello"},
			Service:        v1alpha1.ServiceRef{Name: "hello", Port: 80},
		},
	}
	if err := c.Create(ctx, pa); err != nil {
		t.Fatal(err)
	}
	statsAddr := startController(t, cl)

	// The agents: each sends an empty batch with its state header every
	// half second (a real agent: every second, with its pods' counts).
	var mu sync.Mutex
	headers := map[string]string{}
	setHeader := func(node, h string) {
		mu.Lock()
		defer mu.Unlock()
		if h == "" {
			delete(headers, node)
		} else {
			headers[node] = h
		}
	}
	active := stats.NodeState{SocketRedirect: stats.RedirectActive}.Encode()
	setHeader("node-a", active)
	setHeader("node-b", active)
	go func() {
		for ctx.Err() == nil {
			mu.Lock()
			for node, h := range headers {
				body, _ := stats.Append(nil, &stats.Batch{Node: node, Start: time.Now().Add(-time.Second), Period: time.Second})
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+statsAddr+stats.Path, bytes.NewReader(body))
				req.Header.Set("Content-Type", stats.ContentType)
				req.Header.Set(stats.HeaderNodeState, h)
				if resp, err := http.DefaultClient.Do(req); err == nil {
					resp.Body.Close()
				}
			}
			mu.Unlock()
			time.Sleep(500 * time.Millisecond)
		}
	}()

	expect := func(timeout time.Duration, status metav1.ConditionStatus, reason string, says ...string) {
		t.Helper()
		var last string
		deadline := time.Now().Add(timeout)
		for {
			var sks v1alpha1.ServerlessService
			err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "hello"}, &sks)
			cond := meta.FindStatusCondition(sks.Status.Conditions, "SocketLayer")
			switch {
			case err != nil:
				last = err.Error()
			case cond == nil:
				last = "no SocketLayer condition"
			default:
				last = fmt.Sprintf("%s %s %q", cond.Status, cond.Reason, cond.Message)
				ok := cond.Status == status && cond.Reason == reason
				for _, s := range says {
					ok = ok && strings.Contains(cond.Message, s)
				}
				if ok {
					if col := cl.TableRow(t, v1alpha1.GroupVersion, "serverlessservices", "default", "hello")["SocketLayer"]; col != string(status) {
						t.Errorf("kubectl get sks shows SocketLayer %q, want %q", col, status)
					}
					return
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("SocketLayer: %s; want %s %s saying %q within %v", last, status, reason, says, timeout)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	expect(30*time.Second, metav1.ConditionTrue, "InEffect")

	// The controller looks at the nodes' states every 2 s and rewrites the
	// conditions at most every 10 s, so a change shows within 12 s.
	const changeSeen = 20 * time.Second

	setHeader("node-b", stats.NodeState{SocketRedirect: stats.RedirectOff, Reason: "--socket-redirect=off"}.Encode())
	expect(changeSeen, metav1.ConditionFalse, "NotOnEveryNode", "1 node: node-b (off: --socket-redirect=off)")

	// A state from an agent newer than this controller: named, not guessed.
	setHeader("node-b", "socket-redirect=sideways")
	expect(changeSeen, metav1.ConditionFalse, "NotOnEveryNode", "node-b (unreadable: ", `"sideways"`)

	setHeader("node-b", active)
	expect(changeSeen, metav1.ConditionTrue, "InEffect")

	// node-b's agent stops: after 10 s (the controller's SilentAfter) its
	// map may be stale.
	setHeader("node-b", "")
	expect(10*time.Second+changeSeen, metav1.ConditionUnknown, "NodesNotInSync", "1 node: node-b (silent: no report from its agent since ")
}
