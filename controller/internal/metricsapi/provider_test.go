package metricsapi

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/metrics/pkg/apis/custom_metrics"
	"k8s.io/metrics/pkg/apis/external_metrics"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/custom-metrics-apiserver/pkg/provider"

	"github.com/sockscale/sockscale/controller/internal/recentload"
	"github.com/sockscale/sockscale/internal/stats"
)

var t0 = time.Unix(1_700_000_000, 0)

// fakePods are the pods of one namespace (ns unless set), with their
// labels.
type fakePods struct {
	namespace string
	pods      map[string]fakePod
	getErr    error
}

func (f *fakePods) in(namespace string) bool {
	if f.namespace == "" {
		return namespace == "ns"
	}
	return namespace == f.namespace
}

type fakePod struct {
	ref    PodRef
	labels labels.Set
}

func (f *fakePods) add(name, node, ip string) *fakePods {
	if f.pods == nil {
		f.pods = map[string]fakePod{}
	}
	f.pods[name] = fakePod{ref: PodRef{Name: name, Node: node, IP: netip.MustParseAddr(ip)}, labels: labels.Set{"app": "hello"}}
	return f
}

func (f *fakePods) List(_ context.Context, namespace string, selector labels.Selector) ([]PodRef, error) {
	var refs []PodRef
	for _, p := range f.pods {
		if f.in(namespace) && selector.Matches(p.labels) {
			refs = append(refs, p.ref)
		}
	}
	return refs, nil
}

func (f *fakePods) Get(_ context.Context, namespace, name string) (PodRef, bool, error) {
	if f.getErr != nil {
		return PodRef{}, false, f.getErr
	}
	p, ok := f.pods[name]
	return p.ref, ok && f.in(namespace), nil
}

// fakeDeployments are the Deployments that exist ("namespace/name"); err,
// if set, is every lookup's error.
type fakeDeployments struct {
	names map[string]bool
	err   error
}

func (f *fakeDeployments) Exists(_ context.Context, namespace, name string) (bool, error) {
	return f.names[namespace+"/"+name], f.err
}

// fixture is a store on a fake clock with 60 s of reports of ns/hello and
// a provider over it.
type fixture struct {
	store       *recentload.Store
	clock       *clocktesting.FakeClock
	pods        *fakePods
	deployments *fakeDeployments
	p           *Provider
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	clk := clocktesting.NewFakeClock(t0)
	store, err := recentload.New(clk, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	pods := &fakePods{}
	deployments := &fakeDeployments{names: map[string]bool{"ns/hello": true, "ns/idle": true, "other/hello": true}}
	return &fixture{store: store, clock: clk, pods: pods, deployments: deployments, p: NewProvider(store, pods, deployments, clk)}
}

// record is node's agent reporting one pod of ns/hello every second for
// 60 s: concurrency in flight (proxied of it), requests a second.
type record struct {
	node, pod, ip        string
	concurrency, proxied float64
	requests             uint64
}

// minute records the records every second for 60 s, and an activator
// that holds 1 request and takes in 1 a second for the first 15 s.
func (f *fixture) minute(records ...record) {
	for s := range 60 {
		f.clock.Step(time.Second)
		for _, r := range records {
			f.store.RecordPods(r.node, &stats.Batch{Node: r.node, Period: time.Second, Pods: []stats.PodStat{{
				IP: netip.MustParseAddr(r.ip), Namespace: "ns", Pod: r.pod, Workload: "hello",
				Concurrency: r.concurrency, ProxiedConcurrency: r.proxied, Requests: r.requests}}})
		}
		if s < 15 {
			f.store.RecordTargets(&stats.Batch{Node: "activator-1", Period: time.Second,
				Targets: []stats.TargetStat{{Namespace: "ns", Workload: "hello", Concurrency: 1, Requests: 1}}})
		}
	}
}

// podValue is what a test compares of a custom metric's value.
type podValue struct {
	Pod, Metric, Value string
	Timestamp          time.Time
	Window             int64
}

func podValues(items ...custom_metrics.MetricValue) []podValue {
	var out []podValue
	for _, v := range items {
		out = append(out, podValue{Pod: v.DescribedObject.Kind + " " + v.DescribedObject.Namespace + "/" + v.DescribedObject.Name,
			Metric: v.Metric.Name, Value: v.Value.String(), Timestamp: v.Timestamp.Time, Window: *v.WindowSeconds})
	}
	return out
}

func podsInfo(metric string) provider.CustomMetricInfo {
	return provider.CustomMetricInfo{GroupResource: podsResource, Namespaced: true, Metric: metric}
}

func TestListAllMetrics(t *testing.T) {
	p := newFixture(t).p
	want := []provider.CustomMetricInfo{podsInfo("concurrency"), podsInfo("rps")}
	if diff := cmp.Diff(want, p.ListAllMetrics()); diff != "" {
		t.Errorf("ListAllMetrics (-want +got):\n%s", diff)
	}
	wantExternal := []provider.ExternalMetricInfo{{Metric: "concurrency"}, {Metric: "rps"}, {Metric: "activator_concurrency"}}
	if diff := cmp.Diff(wantExternal, p.ListAllExternalMetrics()); diff != "" {
		t.Errorf("ListAllExternalMetrics (-want +got):\n%s", diff)
	}
}

// The pods' values are what their agents recorded, for the pods whose
// records came from their own node for their own address.
func TestPodMetrics(t *testing.T) {
	f := newFixture(t)
	f.pods.add("hello-1", "node-a", "10.0.0.1").add("hello-2", "node-b", "10.0.0.2").
		add("hello-3", "node-c", "10.0.0.3").add("hello-4", "node-d", "10.0.0.4").add("hello-5", "node-e", "10.0.0.5").
		add("hello-8", "node-f", "fd00::8").add("hello-9", "node-g", "10.0.0.9") // an IPv6-only pod; a dual-stack one, known by its IPv4 address
	f.minute(
		record{node: "node-a", pod: "hello-1", ip: "10.0.0.1", concurrency: 4, proxied: 1, requests: 40},
		record{node: "node-b", pod: "hello-2", ip: "10.0.0.2", concurrency: 2.5, requests: 12},
		record{node: "node-x", pod: "hello-3", ip: "10.0.0.3", concurrency: 99, requests: 99},  // another node's agent
		record{node: "node-d", pod: "hello-4", ip: "10.0.0.99", concurrency: 99, requests: 99}, // not the pod's address
		// hello-5: no record
		record{node: "node-f", pod: "hello-8", ip: "fd00::8", concurrency: 3, requests: 30},
		record{node: "node-g", pod: "hello-9", ip: "fd00::9", concurrency: 99, requests: 99}, // its IPv6 address: agents report its IPv4 one
	)
	ctx := context.Background()
	window := int64(60)

	list, err := f.p.GetMetricBySelector(ctx, "ns", labels.SelectorFromSet(labels.Set{"app": "hello"}), podsInfo("concurrency"), labels.Everything())
	if err != nil {
		t.Fatal(err)
	}
	want := []podValue{
		{Pod: "Pod ns/hello-1", Metric: "concurrency", Value: "4", Timestamp: t0.Add(time.Minute), Window: window},
		{Pod: "Pod ns/hello-2", Metric: "concurrency", Value: "2500m", Timestamp: t0.Add(time.Minute), Window: window},
		{Pod: "Pod ns/hello-8", Metric: "concurrency", Value: "3", Timestamp: t0.Add(time.Minute), Window: window},
	}
	sortByPod := cmpopts.SortSlices(func(a, b podValue) bool { return a.Pod < b.Pod })
	if diff := cmp.Diff(want, podValues(list.Items...), sortByPod); diff != "" {
		t.Errorf("concurrency of app=hello (-want +got):\n%s", diff)
	}

	v, err := f.p.GetMetricByName(ctx, types.NamespacedName{Namespace: "ns", Name: "hello-1"}, podsInfo("rps"), labels.Everything())
	if err != nil {
		t.Fatal(err)
	}
	wantRPS := []podValue{{Pod: "Pod ns/hello-1", Metric: "rps", Value: "40", Timestamp: t0.Add(time.Minute), Window: window}}
	if diff := cmp.Diff(wantRPS, podValues(*v)); diff != "" {
		t.Errorf("rps of hello-1 (-want +got):\n%s", diff)
	}

	for _, tc := range []struct{ pod, why string }{
		{"hello-3", "its record came from another node"},
		{"hello-4", "its record is for another address"},
		{"hello-5", "it has no record"},
		{"hello-6", "there is no such pod"},
		{"hello-9", "its record is for its IPv6 address, not the IPv4 one it is known by"},
	} {
		_, err := f.p.GetMetricByName(ctx, types.NamespacedName{Namespace: "ns", Name: tc.pod}, podsInfo("concurrency"), labels.Everything())
		want := "the server could not find the metric concurrency for pods " + tc.pod
		if !apierrors.IsNotFound(err) || err.Error() != want {
			t.Errorf("%s, where %s: error %v, want NotFound %q", tc.pod, tc.why, err, want)
		}
	}
}

func TestPodMetricErrors(t *testing.T) {
	f := newFixture(t)
	f.pods.add("hello-1", "node-a", "10.0.0.1")
	f.minute(record{node: "node-a", pod: "hello-1", ip: "10.0.0.1", concurrency: 1, requests: 1})
	ctx, name := context.Background(), types.NamespacedName{Namespace: "ns", Name: "hello-1"}
	for _, tc := range []struct {
		what           string
		info           provider.CustomMetricInfo
		metricSelector labels.Selector
		want           string
		is             func(error) bool
	}{
		{what: "a metric it does not serve", info: podsInfo("latency"), metricSelector: labels.Everything(),
			want: "the server could not find the metric latency for pods", is: apierrors.IsNotFound},
		{what: "another resource", info: provider.CustomMetricInfo{GroupResource: schema.GroupResource{Resource: "services"}, Namespaced: true, Metric: "concurrency"},
			metricSelector: labels.Everything(), want: "the server could not find the metric concurrency for services", is: apierrors.IsNotFound},
		{what: "a metric selector", info: podsInfo("concurrency"), metricSelector: labels.SelectorFromSet(labels.Set{"path": "api"}),
			want: `metric selector "path=api": sockscale's pod metrics have no labels to select; leave it out`, is: apierrors.IsBadRequest},
	} {
		_, err := f.p.GetMetricByName(ctx, name, tc.info, tc.metricSelector)
		if err == nil || !tc.is(err) || err.Error() != tc.want {
			t.Errorf("%s: error %v, want %q", tc.what, err, tc.want)
		}
		_, err = f.p.GetMetricBySelector(ctx, "ns", labels.Everything(), tc.info, tc.metricSelector)
		if err == nil || !tc.is(err) || err.Error() != tc.want {
			t.Errorf("%s, by selector: error %v, want %q", tc.what, err, tc.want)
		}
	}
}

// externalValue is what a test compares of an external metric's value.
type externalValue struct {
	Metric, Value string
	Labels        map[string]string
	Timestamp     time.Time
	Window        int64
}

func externalValues(list *external_metrics.ExternalMetricValueList) []externalValue {
	var out []externalValue
	for _, v := range list.Items {
		out = append(out, externalValue{Metric: v.MetricName, Value: v.Value.String(), Labels: v.MetricLabels, Timestamp: v.Timestamp.Time, Window: *v.WindowSeconds})
	}
	return out
}

// A Deployment's values count its pods' trusted records, each request once
// (the proxied part is the activator's), and the activators'.
func TestDeploymentMetrics(t *testing.T) {
	f := newFixture(t)
	f.pods.add("hello-1", "node-a", "10.0.0.1").add("hello-2", "node-b", "10.0.0.2").add("hello-3", "node-c", "10.0.0.3")
	f.minute(
		record{node: "node-a", pod: "hello-1", ip: "10.0.0.1", concurrency: 4, proxied: 1, requests: 40},
		record{node: "node-b", pod: "hello-2", ip: "10.0.0.2", concurrency: 2.5, requests: 12},
		record{node: "node-x", pod: "hello-3", ip: "10.0.0.3", concurrency: 99, requests: 99}, // another node's agent
	)
	ctx := context.Background()
	deployment := labels.SelectorFromSet(labels.Set{"deployment": "hello"})
	labelsHello := map[string]string{"deployment": "hello"}
	for _, tc := range []struct {
		metric, want string
	}{
		// (4-1) + 2.5 + the activator's 1 for 15 s of 60.
		{"concurrency", "5750m"},
		// 40 + 12 + the activator's 15 arrivals in 60 s (hello-1's
		// requests are not proxied).
		{"rps", "52250m"},
		{"activator_concurrency", "250m"},
	} {
		list, err := f.p.GetExternalMetric(ctx, "ns", deployment, provider.ExternalMetricInfo{Metric: tc.metric})
		if err != nil {
			t.Fatalf("%s: %v", tc.metric, err)
		}
		want := []externalValue{{Metric: tc.metric, Value: tc.want, Labels: labelsHello, Timestamp: t0.Add(time.Minute), Window: 60}}
		if diff := cmp.Diff(want, externalValues(list)); diff != "" {
			t.Errorf("%s of deployment=hello (-want +got):\n%s", tc.metric, diff)
		}
	}

	// Never heard: 0, now.
	f.clock.Step(time.Second)
	list, err := f.p.GetExternalMetric(ctx, "ns", labels.SelectorFromSet(labels.Set{"deployment": "idle"}), provider.ExternalMetricInfo{Metric: "activator_concurrency"})
	if err != nil {
		t.Fatal(err)
	}
	want := []externalValue{{Metric: "activator_concurrency", Value: "0", Labels: map[string]string{"deployment": "idle"}, Timestamp: t0.Add(61 * time.Second), Window: 60}}
	if diff := cmp.Diff(want, externalValues(list)); diff != "" {
		t.Errorf("a Deployment never heard (-want +got):\n%s", diff)
	}
	// Another namespace's hello is another Deployment.
	list, err = f.p.GetExternalMetric(ctx, "other", deployment, provider.ExternalMetricInfo{Metric: "concurrency"})
	if err != nil {
		t.Fatal(err)
	}
	if got := list.Items[0].Value.String(); got != "0" {
		t.Errorf("hello of namespace other: %s, want 0", got)
	}

	if _, err := f.p.GetExternalMetric(ctx, "ns", deployment, provider.ExternalMetricInfo{Metric: "latency"}); !apierrors.IsNotFound(err) {
		t.Errorf("a metric it does not serve: error %v, want NotFound", err)
	}
	// A Deployment that is not there (a typo) is a 404, not an idle one.
	_, err = f.p.GetExternalMetric(ctx, "ns", labels.SelectorFromSet(labels.Set{"deployment": "helo"}), provider.ExternalMetricInfo{Metric: "concurrency"})
	if !apierrors.IsNotFound(err) || !strings.Contains(err.Error(), `deployments.apps "helo" not found`) {
		t.Errorf("a Deployment that does not exist: error %v, want NotFound naming it", err)
	}
	f.deployments.err = errors.New("informer not synced")
	_, err = f.p.GetExternalMetric(ctx, "ns", deployment, provider.ExternalMetricInfo{Metric: "concurrency"})
	if !apierrors.IsInternalError(err) || !strings.Contains(err.Error(), "look up deployment ns/hello: informer not synced") {
		t.Errorf("with the Deployments unreadable: error %v, want an internal error that says why", err)
	}
	f.deployments.err = nil

	f.pods.getErr = errors.New("cache not synced")
	_, err = f.p.GetExternalMetric(ctx, "ns", deployment, provider.ExternalMetricInfo{Metric: "concurrency"})
	if !apierrors.IsInternalError(err) || err.Error() != "Internal error occurred: check the pods of deployment ns/hello: cache not synced" {
		t.Errorf("with the pods unreadable: error %v, want an internal error that says why", err)
	}
}

func TestDeploymentSelector(t *testing.T) {
	f := newFixture(t)
	const allowed = "; want exactly deployment=<name of a Deployment in the namespace>, e.g. deployment=hello"
	for _, tc := range []struct {
		selector string
		wantErr  string
	}{
		{selector: "deployment=hello"},
		{selector: "deployment==hello"},
		{selector: "deployment in (hello)"},
		{selector: "", wantErr: "metric selector: an empty selector names no Deployment" + allowed},
		{selector: "app=hello", wantErr: `metric selector: "app=hello" selects on "app"` + allowed},
		{selector: "deployment in (a,b)", wantErr: `metric selector: "deployment in (a,b)" names 2 Deployments` + allowed},
		{selector: "deployment!=a", wantErr: `metric selector: "deployment!=a" uses operator "!=" (want =, == or in)` + allowed},
		{selector: "deployment", wantErr: `metric selector: "deployment" uses operator "exists" (want =, == or in)` + allowed},
		{selector: "deployment=a,app=b", wantErr: `metric selector: "app=b,deployment=a" has 2 requirements` + allowed},
		{selector: "deployment=Hello", wantErr: `metric selector: "deployment=Hello" names "Hello", not a Deployment name (a lowercase RFC 1123 subdomain must consist of`},
	} {
		sel, err := labels.Parse(tc.selector)
		if err != nil {
			t.Fatal(err)
		}
		_, err = f.p.GetExternalMetric(context.Background(), "ns", sel, provider.ExternalMetricInfo{Metric: "concurrency"})
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%q: %v", tc.selector, err)
		case tc.wantErr != "" && (!apierrors.IsBadRequest(err) || !strings.HasPrefix(err.Error(), tc.wantErr)):
			t.Errorf("%q: error %v, want BadRequest starting %q", tc.selector, err, tc.wantErr)
		}
	}
}
