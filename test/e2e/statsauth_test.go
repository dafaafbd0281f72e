package e2e

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/internal/stats"
	"github.com/sockscale/sockscale/test/stack"
)

// TestE2EForgedStatsRefused: an ordinary pod that forges an agent's batch
// (a target's pod at 1000 requests in flight) and POSTs it to every
// controller replica from its own network namespace, with its own
// ServiceAccount's token for the controller's audience (TokenRequest,
// bound to the pod, as a projected volume would give it), gets 403; with
// the API server's audience or no token, 401; and the target does not
// scale. Before this check, 1000 in flight at a target of 10 would take it
// to maxScale within seconds.
func TestE2EForgedStatsRefused(t *testing.T) {
	s := up(t)
	ctx := context.Background()
	const name = "forged"
	deploy(t, s, name, func(p *v1alpha1.PodAutoscalerSpec) {
		p.MinScale, p.MaxScale = ptr.To(int32(1)), ptr.To(int32(5))
	})
	removeAtEnd(t, s, name)
	var pods corev1.PodList
	if err := s.Client.List(ctx, &pods, client.InNamespace(appNS), client.MatchingLabels{"app": name}); err != nil || len(pods.Items) == 0 {
		t.Fatalf("the pods of %s: %v (%d)", name, err, len(pods.Items))
	}
	victim := pods.Items[0]
	forger := newClientSandbox(t, s, "forger", victim.Spec.NodeName)
	var fp corev1.Pod
	if err := s.Client.Get(ctx, client.ObjectKey{Namespace: appNS, Name: forger.pod}, &fp); err != nil {
		t.Fatal(err)
	}
	token := func(audience string) string {
		t.Helper()
		tr := &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{
			Audiences:      []string{audience},
			BoundObjectRef: &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: fp.Name, UID: fp.UID},
		}}
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: appNS, Name: "default"}}
		if err := s.Client.SubResource("token").Create(ctx, sa, tr); err != nil {
			t.Fatalf("TokenRequest for %s's default ServiceAccount: %v", fp.Name, err)
		}
		return tr.Status.Token
	}
	body, err := stats.Append(nil, &stats.Batch{Node: victim.Spec.NodeName, Start: time.Now(), Period: time.Second,
		Pods: []stats.PodStat{{IP: netip.MustParseAddr(victim.Status.PodIP), Namespace: appNS, Pod: victim.Name, Workload: name,
			Concurrency: 1000, Requests: 10000}}})
	if err != nil {
		t.Fatal(err)
	}
	var urls []string
	for _, c := range controllers(t, s) {
		// HTTPS (the chart's controller.statsTLS): a forger need not trust
		// the CA to try.
		urls = append(urls, "https://"+net.JoinHostPort(c.ip.String(), "8443")+stats.Path)
	}
	rightAudience, apiAudience := token("sockscale-controller"), token("https://kubernetes.default.svc.cluster.local")
	for _, tt := range []struct {
		token string
		code  int
		msg   string
	}{
		{rightAudience, http.StatusForbidden, "system:serviceaccount:" + appNS + ":default may not create nodestats.sockscale.dev"},
		{apiAudience, http.StatusUnauthorized, `do not include "sockscale-controller"`},
		{"", http.StatusUnauthorized, "no bearer token"},
	} {
		for _, r := range forger.post(t, urls, tt.token, body, 1) {
			if r.Code != tt.code || !strings.Contains(r.Message, tt.msg) {
				t.Errorf("forged batch to %s: %d %q, want %d with %q", r.URL, r.Code, r.Message, tt.code, tt.msg)
			}
		}
	}
	// Ten seconds of forgeries, one a second to every replica: the target
	// stays at one pod.
	for _, r := range forger.post(t, urls, rightAudience, body, 10) {
		if r.Code != http.StatusForbidden {
			t.Errorf("forged batch to %s: %d %q, want 403", r.URL, r.Code, r.Message)
		}
	}
	time.Sleep(3 * time.Second) // a decision tick (2 s) after the last one
	if got := replicas(t, s, name); got != 1 {
		t.Errorf("%d pods wanted after the forgeries, want 1: %s", got, paLine(t, s, name))
	}
	t.Logf("after 10 s of forged batches at 1000 in flight: %s", paLine(t, s, name))
}

// statsPostEnv carries a statsPost to TestHelperStatsPost.
const statsPostEnv = "SOCKSCALE_E2E_STATS_POST"

type statsPost struct {
	URLs   []string
	Token  string
	Body   string // base64
	Rounds int    // one a second
}

type statsAnswer struct {
	URL     string
	Code    int
	Message string
}

// post runs TestHelperStatsPost in the sandbox's network namespace: the
// forged batch comes from the pod's own address, as a compromised pod's
// would.
func (b *clientSandbox) post(t *testing.T, urls []string, token string, body []byte, rounds int) []statsAnswer {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	js, _ := json.Marshal(statsPost{URLs: urls, Token: token, Body: base64.StdEncoding.EncodeToString(body), Rounds: rounds})
	cmd := exec.Command("ip", "netns", "exec", b.netns, self, "-test.run=^TestHelperStatsPost$", "-test.timeout=2m")
	cmd.Env = append(os.Environ(), statsPostEnv+"="+string(js))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the stats poster in %s: %v\n%s", b.pod, err, stderr.String())
	}
	var answers []statsAnswer
	for _, line := range strings.Split(string(out), "\n") {
		if rest, ok := strings.CutPrefix(line, "stats-answer "); ok {
			var a statsAnswer
			if err := json.Unmarshal([]byte(rest), &a); err != nil {
				t.Fatal(err)
			}
			answers = append(answers, a)
		}
	}
	if len(answers) != len(urls)*rounds {
		t.Fatalf("the stats poster gave %d answers, want %d:\n%s\n%s", len(answers), len(urls)*rounds, out, stderr.String())
	}
	return answers
}

// TestHelperStatsPost is not a test: it is the forger's process (see
// clientSandbox.post) and returns at once unless it is that.
func TestHelperStatsPost(t *testing.T) {
	js := os.Getenv(statsPostEnv)
	if js == "" {
		return
	}
	var p statsPost
	if err := json.Unmarshal([]byte(js), &p); err != nil {
		t.Fatal(err)
	}
	body, err := base64.StdEncoding.DecodeString(p.Body)
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} // a forger checks nothing
	for i := range p.Rounds {
		if i > 0 {
			time.Sleep(time.Second)
		}
		for _, u := range p.URLs {
			a := statsAnswer{URL: u}
			req, _ := http.NewRequest(http.MethodPost, u, strings.NewReader(string(body)))
			req.Header.Set("Content-Type", stats.ContentType)
			if p.Token != "" {
				req.Header.Set("Authorization", "Bearer "+p.Token)
			}
			resp, err := c.Do(req)
			if err != nil {
				a.Message = err.Error()
			} else {
				msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
				resp.Body.Close()
				a.Code, a.Message = resp.StatusCode, strings.TrimSpace(string(msg))
			}
			line, _ := json.Marshal(a)
			fmt.Printf("stats-answer %s\n", line)
		}
	}
}

// TestE2EStatsTLSKeptAcrossUpgrade: a helm upgrade keeps the stats CA and
// certificate it made at install (lookup), so the upgrade rolls no pod:
// the controller's and agents' pod templates are unchanged.
func TestE2EStatsTLSKeptAcrossUpgrade(t *testing.T) {
	s := up(t)
	ctx := context.Background()
	key := client.ObjectKey{Namespace: stack.Namespace, Name: "sockscale-controller-stats-tls"}
	var before, after corev1.Secret
	if err := s.Client.Get(ctx, key, &before); err != nil {
		t.Fatal(err)
	}
	var ctlBefore, ctlAfter appsv1.Deployment
	ctlKey := client.ObjectKey{Namespace: stack.Namespace, Name: "sockscale-controller"}
	if err := s.Client.Get(ctx, ctlKey, &ctlBefore); err != nil {
		t.Fatal(err)
	}
	if err := s.Install(ctx, chartSets...); err != nil {
		t.Fatal(err)
	}
	if err := s.Client.Get(ctx, key, &after); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"ca.crt", "tls.crt", "tls.key"} {
		if len(before.Data[k]) == 0 || string(before.Data[k]) != string(after.Data[k]) {
			t.Errorf("%s of %s changed across the upgrade (%d bytes before)", k, key.Name, len(before.Data[k]))
		}
	}
	if err := s.Client.Get(ctx, ctlKey, &ctlAfter); err != nil {
		t.Fatal(err)
	}
	if ctlAfter.Generation != ctlBefore.Generation {
		t.Errorf("the controller Deployment went from generation %d to %d: the upgrade changed its pod template", ctlBefore.Generation, ctlAfter.Generation)
	}
}
