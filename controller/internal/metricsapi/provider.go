package metricsapi

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/metrics/pkg/apis/custom_metrics"
	"k8s.io/metrics/pkg/apis/external_metrics"
	"k8s.io/utils/clock"
	"sigs.k8s.io/custom-metrics-apiserver/pkg/provider"

	"github.com/sockscale/sockscale/controller/internal/recentload"
)

// The metrics served. Per pod (custom.metrics.k8s.io, resource pods) and
// per Deployment (external.metrics.k8s.io): the names Knative's HPA class
// gives its metrics.
const (
	// MetricConcurrency is the average requests in flight over the
	// window.
	MetricConcurrency = "concurrency"
	// MetricRPS is the completed requests per second (a Deployment's also
	// counts the requests its activators took in).
	MetricRPS = "rps"
	// MetricActivatorConcurrency is a Deployment's requests held or
	// forwarded by activators: above zero while a request waits for a
	// Deployment at zero pods.
	MetricActivatorConcurrency = "activator_concurrency"
)

// DeploymentLabel is the one requirement an external metric's selector
// has: deployment=<name of a Deployment in the request's namespace>.
const DeploymentLabel = "deployment"

// PodRef is what the metrics trust a pod by: its node and address, as the
// API server has them.
type PodRef struct {
	Name, Node string
	IP         netip.Addr
}

// Pods are the pods of the cluster (the controller's informer cache).
type Pods interface {
	// List returns the pods of namespace that selector selects.
	List(ctx context.Context, namespace string, selector labels.Selector) ([]PodRef, error)
	// Get returns a pod, false if there is none.
	Get(ctx context.Context, namespace, name string) (PodRef, bool, error)
}

// Deployments says whether a Deployment exists (the controller's
// informer cache).
type Deployments interface {
	Exists(ctx context.Context, namespace, name string) (bool, error)
}

// Provider serves a recentload.Store's values as custom metrics of pods
// and external metrics of Deployments.
//
// An agent speaks only for the pods of its own node: a value is served
// only from a record whose node and address are the pod object's. A
// record from another node, or for an address the pod does not have, is
// left out as if there were none.
type Provider struct {
	store       *recentload.Store
	pods        Pods
	deployments Deployments
	clock       clock.PassiveClock
}

var (
	_ provider.CustomMetricsProvider   = (*Provider)(nil)
	_ provider.ExternalMetricsProvider = (*Provider)(nil)
)

// NewProvider returns a provider of store's values, trusted against pods,
// for the Deployments that exist; clk stamps the values of Deployments
// never heard.
func NewProvider(store *recentload.Store, pods Pods, deployments Deployments, clk clock.PassiveClock) *Provider {
	return &Provider{store: store, pods: pods, deployments: deployments, clock: clk}
}

var podsResource = schema.GroupResource{Resource: "pods"}

// ListAllMetrics lists the pod metrics: concurrency and rps.
func (p *Provider) ListAllMetrics() []provider.CustomMetricInfo {
	return []provider.CustomMetricInfo{
		{GroupResource: podsResource, Namespaced: true, Metric: MetricConcurrency},
		{GroupResource: podsResource, Namespaced: true, Metric: MetricRPS},
	}
}

// ListAllExternalMetrics lists the Deployment metrics: concurrency, rps
// and activator_concurrency.
func (p *Provider) ListAllExternalMetrics() []provider.ExternalMetricInfo {
	return []provider.ExternalMetricInfo{{Metric: MetricConcurrency}, {Metric: MetricRPS}, {Metric: MetricActivatorConcurrency}}
}

// GetMetricByName returns one pod's metric; NotFound when the pod does not
// exist or has no trusted record within the window.
func (p *Provider) GetMetricByName(ctx context.Context, name types.NamespacedName, info provider.CustomMetricInfo, metricSelector labels.Selector) (*custom_metrics.MetricValue, error) {
	if err := checkPodMetric(info, metricSelector); err != nil {
		return nil, err
	}
	ref, ok, err := p.pods.Get(ctx, name.Namespace, name.Name)
	if err != nil {
		return nil, apierrors.NewInternalError(fmt.Errorf("get pod %s: %w", name, err))
	}
	if !ok {
		return nil, provider.NewMetricNotFoundForError(info.GroupResource, info.Metric, name.Name)
	}
	v, ok := p.podValue(name.Namespace, ref, info.Metric)
	if !ok {
		return nil, provider.NewMetricNotFoundForError(info.GroupResource, info.Metric, name.Name)
	}
	return v, nil
}

// GetMetricBySelector returns the metric of the pods selector selects
// that have a trusted record within the window; the others are left out,
// and the HorizontalPodAutoscaler treats them as pods without metrics.
func (p *Provider) GetMetricBySelector(ctx context.Context, namespace string, selector labels.Selector, info provider.CustomMetricInfo, metricSelector labels.Selector) (*custom_metrics.MetricValueList, error) {
	if err := checkPodMetric(info, metricSelector); err != nil {
		return nil, err
	}
	refs, err := p.pods.List(ctx, namespace, selector)
	if err != nil {
		return nil, apierrors.NewInternalError(fmt.Errorf("list pods of %s with %q: %w", namespace, selector, err))
	}
	list := &custom_metrics.MetricValueList{Items: make([]custom_metrics.MetricValue, 0, len(refs))}
	for _, ref := range refs {
		if v, ok := p.podValue(namespace, ref, info.Metric); ok {
			list.Items = append(list.Items, *v)
		}
	}
	return list, nil
}

// checkPodMetric says what is wrong with a request for a pod metric.
func checkPodMetric(info provider.CustomMetricInfo, metricSelector labels.Selector) error {
	if info.GroupResource != podsResource || !info.Namespaced || (info.Metric != MetricConcurrency && info.Metric != MetricRPS) {
		return provider.NewMetricNotFoundError(info.GroupResource, info.Metric)
	}
	if metricSelector != nil && !metricSelector.Empty() {
		return apierrors.NewBadRequest(fmt.Sprintf("metric selector %q: sockscale's pod metrics have no labels to select; leave it out", metricSelector))
	}
	return nil
}

// podValue is a pod's metric from its store record, if there is one that
// its node's agent sent (same node, same address).
func (p *Provider) podValue(namespace string, ref PodRef, metric string) (*custom_metrics.MetricValue, bool) {
	l, ok := p.store.Pod(namespace, ref.Name)
	if !ok || !trusted(l, ref) {
		return nil, false
	}
	v := l.Concurrency
	if metric == MetricRPS {
		v = l.RPS
	}
	return &custom_metrics.MetricValue{
		DescribedObject: custom_metrics.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: namespace, Name: ref.Name},
		Metric:          custom_metrics.MetricIdentifier{Name: metric},
		Timestamp:       metav1.NewTime(l.Heard),
		WindowSeconds:   p.windowSeconds(),
		Value:           *quantity(v),
	}, true
}

// trusted: the record came from the pod's node, for its address: the
// one agents report it by (package podaddr: its IPv4 address if it has
// one, else its IPv6 one), so a dual-stack pod's record for its IPv6
// address is no record of it.
func trusted(l recentload.PodLoad, ref PodRef) bool {
	return ref.Node != "" && l.Node == ref.Node && ref.IP.IsValid() && l.IP == ref.IP
}

// GetExternalMetric returns a Deployment's metric: its pods' and
// activators' load, each request counted once, from the pods' trusted
// records. metricSelector must be deployment=<name>; the Deployment is
// looked for in namespace, the request's, so a tenant's
// HorizontalPodAutoscaler sees its own namespace only, and one that is not
// there is a 404 (a misspelled name must not read as an idle Deployment).
// A Deployment never heard (or not within the window) reads 0 now: an
// autoscaler with minReplicas 0 then stays at zero until an activator
// holds a request.
func (p *Provider) GetExternalMetric(ctx context.Context, namespace string, metricSelector labels.Selector, info provider.ExternalMetricInfo) (*external_metrics.ExternalMetricValueList, error) {
	switch info.Metric {
	case MetricConcurrency, MetricRPS, MetricActivatorConcurrency:
	default:
		return nil, provider.NewMetricNotFoundError(schema.GroupResource{Group: external_metrics.GroupName, Resource: info.Metric}, info.Metric)
	}
	deployment, err := selectedDeployment(metricSelector)
	if err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	switch ok, err := p.deployments.Exists(ctx, namespace, deployment); {
	case err != nil:
		return nil, apierrors.NewInternalError(fmt.Errorf("look up deployment %s/%s: %w", namespace, deployment, err))
	case !ok:
		return nil, apierrors.NewNotFound(schema.GroupResource{Group: "apps", Resource: "deployments"}, deployment)
	}
	load, heard, err := p.Target(ctx, namespace, deployment)
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	at := p.clock.Now()
	if heard {
		at = load.Heard
	}
	var v float64
	switch info.Metric {
	case MetricConcurrency:
		v = load.Concurrency
	case MetricRPS:
		v = load.RPS
	case MetricActivatorConcurrency:
		v = load.ActivatorConcurrency
	}
	return &external_metrics.ExternalMetricValueList{Items: []external_metrics.ExternalMetricValue{{
		MetricName:    info.Metric,
		MetricLabels:  map[string]string{DeploymentLabel: deployment},
		Timestamp:     metav1.NewTime(at),
		WindowSeconds: p.windowSeconds(),
		Value:         *quantity(v),
	}}}, nil
}

// Target is the Deployment namespace/deployment's load from its pods'
// trusted records (same node, same address as the pod object) and its
// activators'; heard is false when there is none within the window. What
// the external metrics and KEDA's scaler serve.
func (p *Provider) Target(ctx context.Context, namespace, deployment string) (load recentload.TargetLoad, heard bool, err error) {
	var lookupErr error
	keep := func(l recentload.PodLoad) bool {
		if lookupErr != nil {
			return false
		}
		ref, ok, err := p.pods.Get(ctx, namespace, l.Name)
		if err != nil {
			lookupErr = err
			return false
		}
		return ok && trusted(l, ref)
	}
	load, heard = p.store.Target(namespace, deployment, keep)
	if lookupErr != nil {
		// A partial sum could read low and scale the Deployment down.
		return recentload.TargetLoad{}, false, fmt.Errorf("check the pods of deployment %s/%s: %w", namespace, deployment, lookupErr)
	}
	return load, heard, nil
}

// selectedDeployment is the Deployment an external metric's selector
// names: it must be exactly deployment=<name> (=, == or in with one
// value).
func selectedDeployment(sel labels.Selector) (string, error) {
	bad := func(why string) error {
		given := "an empty selector"
		if sel != nil && !sel.Empty() {
			given = fmt.Sprintf("%q", sel.String())
		}
		return fmt.Errorf("metric selector: %s %s; want exactly %s=<name of a Deployment in the namespace>, e.g. %s=hello", given, why, DeploymentLabel, DeploymentLabel)
	}
	if sel == nil {
		return "", bad("names no Deployment")
	}
	reqs, selectable := sel.Requirements()
	if !selectable || len(reqs) == 0 {
		return "", bad("names no Deployment")
	}
	if len(reqs) > 1 {
		return "", bad(fmt.Sprintf("has %d requirements", len(reqs)))
	}
	r := reqs[0]
	if r.Key() != DeploymentLabel {
		return "", bad(fmt.Sprintf("selects on %q", r.Key()))
	}
	switch op := r.Operator(); op {
	case selection.Equals, selection.DoubleEquals, selection.In:
	default:
		return "", bad(fmt.Sprintf("uses operator %q (want =, == or in)", op))
	}
	values := r.Values().UnsortedList()
	if len(values) != 1 {
		return "", bad(fmt.Sprintf("names %d Deployments", len(values)))
	}
	if msgs := validation.IsDNS1123Subdomain(values[0]); len(msgs) > 0 {
		return "", bad(fmt.Sprintf("names %q, not a Deployment name (%s)", values[0], strings.Join(msgs, "; ")))
	}
	return values[0], nil
}

func (p *Provider) windowSeconds() *int64 {
	s := int64(p.store.Window() / time.Second)
	return &s
}

// quantity is v to the thousandth, as the HorizontalPodAutoscaler reads
// it (in milli-units).
func quantity(v float64) *resource.Quantity {
	return resource.NewMilliQuantity(int64(math.Round(v*1000)), resource.DecimalSI)
}
