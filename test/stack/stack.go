package stack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/util/intstr"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/internal/imagebuild"
	"github.com/sockscale/sockscale/test/cluster"
)

// Namespace is where the chart is installed.
const Namespace = "sockscale-system"

// The harness pushes the images (make images) and the chart to the local
// cluster's registry and installs the chart from there, as users would:
// ImageRepo/<image>:<appVersion> and oci://ChartRepo/sockscale.
const (
	ImageRepo = cluster.RegistryAddr + "/sockscale"
	ChartRepo = cluster.RegistryAddr + "/charts"
)

// AppImage is the autoscale test app's image (PushImages pushes it).
var AppImage = ImageRepo + "/autoscale:" + mustChart().AppVersion

// chartMeta is what the harness reads of Chart.yaml.
type chartMeta struct {
	Version    string `json:"version"`
	AppVersion string `json:"appVersion"`
}

// mustChart reads the chart's Chart.yaml, which is in the module: a
// failure is a broken checkout.
func mustChart() chartMeta {
	b, err := os.ReadFile(filepath.Join(ChartDir(), "Chart.yaml"))
	if err != nil {
		panic(fmt.Sprintf("read the chart: %v", err))
	}
	var m chartMeta
	if err := yaml.Unmarshal(b, &m); err != nil || m.Version == "" || m.AppVersion == "" {
		panic(fmt.Sprintf("%s/Chart.yaml: version %q, appVersion %q: %v", ChartDir(), m.Version, m.AppVersion, err))
	}
	return m
}

// Stack is sockscale on a cluster.
type Stack struct {
	Kubeconfig string
	// Helm is the helm binary (the pinned build: $HELM).
	Helm   string
	Client client.Client
	// ServiceCIDR is the cluster's service range: a public Service's
	// ClusterIP must be in it before any traffic is sent there.
	// ServiceCIDR6 is its IPv6 range on a dual-stack cluster (invalid
	// otherwise).
	ServiceCIDR, ServiceCIDR6 netip.Prefix

	scraper scraper
}

// New connects to the cluster of kubeconfig.
func New(cfg *rest.Config, kubeconfig, helm string, serviceCIDR netip.Prefix) (*Stack, error) {
	scheme := kruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := servingv1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	if helm == "" {
		return nil, errors.New("no helm binary: set HELM (make helm builds the pinned one)")
	}
	return &Stack{Kubeconfig: kubeconfig, Helm: helm, Client: c, ServiceCIDR: serviceCIDR}, nil
}

// ChartDir is charts/sockscale, found from this file's place in the module.
func ChartDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "charts", "sockscale")
}

// moduleDir is the module's root (where `go build` of the images runs).
func moduleDir() string { return filepath.Join(ChartDir(), "..", "..") }

// PushImages builds the images (imagebuild.Images, every time in them the
// commit's) and pushes them to ImageRepo, tagged with the chart's
// appVersion.
func PushImages(ctx context.Context) error {
	epoch, err := imagebuild.SourceDateEpoch(ctx, moduleDir())
	if err != nil {
		return err
	}
	built, err := imagebuild.Build(ctx, imagebuild.Options{Dir: moduleDir(), Epoch: epoch}, imagebuild.Images)
	if err != nil {
		return err
	}
	_, err = imagebuild.Push(ctx, built, ImageRepo, mustChart().AppVersion)
	return err
}

// PushChart packages the chart (helm package) and pushes it to
// oci://ChartRepo (helm push, plain HTTP).
func (s *Stack) PushChart(ctx context.Context) error {
	dir, err := os.MkdirTemp("", "sockscale-chart-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	if err := s.helm(ctx, "package", ChartDir(), "--destination", dir); err != nil {
		return err
	}
	pkg := filepath.Join(dir, fmt.Sprintf("sockscale-%s.tgz", mustChart().Version))
	return s.helm(ctx, "push", pkg, "oci://"+ChartRepo, "--plain-http")
}

// ImageSets are the --set values that point the chart's images at
// ImageRepo (their tags stay the chart's appVersion).
func ImageSets() []string {
	var sets []string
	for _, c := range []string{"agent", "controller", "activator"} {
		sets = append(sets, fmt.Sprintf("%s.image.repository=%s/sockscale-%s", c, ImageRepo, c))
	}
	return sets
}

// ClusterSets are ImageSets and what the local cluster's nodes need of the
// current chart: the agents open the nodes' network namespace by the name
// the cluster gave it; and no drain: the simulated nodes share one network
// namespace, whose loopback port only one agent could hold, and the
// simulator runs no preStop hooks.
func ClusterSets() []string {
	return append(ImageSets(), "agent.nodeNetns=/var/run/netns/"+cluster.HostNetns, "agent.drain.enabled=false")
}

// RealNodeSets are the chart values for the cluster's real nodes: each
// is an agent pool of its own (agent.pools.<node>, the nodes labelled
// cluster.AgentPoolLabel), whose agent attaches at the node's cgroup
// (cluster.RealNodeAgentValues) and serves the drain: a real kubelet runs
// the preStop hooks, and the node's loopback port is its agent's alone.
func (s *Stack) RealNodeSets(ctx context.Context) ([]string, error) {
	var nodes corev1.NodeList
	if err := s.Client.List(ctx, &nodes, client.HasLabels{cluster.AgentPoolLabel}); err != nil {
		return nil, err
	}
	var sets []string
	for _, n := range nodes.Items {
		if !slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == cluster.RealNodeTaint }) {
			continue
		}
		pool := n.Labels[cluster.AgentPoolLabel]
		vals, err := cluster.RealNodeAgentValues(n.Name)
		if err != nil {
			return nil, err
		}
		vals["drain.enabled"] = "true"
		for _, k := range slices.Sorted(maps.Keys(vals)) {
			sets = append(sets, fmt.Sprintf("agent.pools.%s.%s=%s", pool, k, vals[k]))
		}
	}
	return sets, nil
}

// AgentPods selects the agent pods of every DaemonSet, the main one's
// (component agent) and the agent pools' (component agent-pool), as a
// List option.
var AgentPods = client.MatchingLabelsSelector{Selector: labels.SelectorFromSet(nil).Add(mustRequirement("app.kubernetes.io/component", selection.In, "agent", "agent-pool"))}

func mustRequirement(key string, op selection.Operator, vals ...string) labels.Requirement {
	r, err := labels.NewRequirement(key, op, vals)
	if err != nil {
		panic(err)
	}
	return *r
}

// Install installs (or upgrades) the chart pushed by PushChart from the
// registry, its images from ImageRepo, and waits until its workloads are
// ready. sets are extra --set key=value pairs, after ClusterSets and
// RealNodeSets.
func (s *Stack) Install(ctx context.Context, sets ...string) error {
	args := []string{"upgrade", "--install", "sockscale", "oci://" + ChartRepo + "/sockscale", "--version", mustChart().Version,
		"--plain-http", "--namespace", Namespace, "--create-namespace", "--wait", "--timeout", "4m"}
	real, err := s.RealNodeSets(ctx)
	if err != nil {
		return err
	}
	for _, set := range slices.Concat(ClusterSets(), real, sets) {
		args = append(args, "--set", set)
	}
	return s.helm(ctx, args...)
}

func (s *Stack) helm(ctx context.Context, args ...string) error {
	args = append(args, "--kubeconfig", s.Kubeconfig)
	out, err := exec.CommandContext(ctx, s.Helm, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// App is one autoscaled test app: a Deployment of the autoscale image, its
// public Service (no selector: sockscale writes its endpoints) and its
// PodAutoscaler, all named Name.
type App struct {
	Namespace, Name string
	// Spec adjusts the PodAutoscaler's spec.
	Spec func(*v1alpha1.PodAutoscalerSpec)
	// Image of the app's container; empty: AppImage. An image the
	// registry does not have leaves the pod waiting in ErrImagePull and
	// ImagePullBackOff: a target whose pods never become ready.
	Image string
	// Pod adjusts the pod template's spec (AppPodSpec), e.g. OnRealNode.
	Pod func(*corev1.PodSpec)
	// Service adjusts the public Service's spec (one port "http", 80 to
	// the pods' 8080, which the PodAutoscaler names), e.g. a gRPC app's
	// port with appProtocol kubernetes.io/h2c.
	Service func(*corev1.ServiceSpec)
	// Plain: no PodAutoscaler; the Service selects the pods itself, as
	// for any Deployment sockscale does not autoscale (one the HPA or
	// KEDA scales on sockscale's metrics). Spec is then unused.
	Plain bool
	// StatefulSet: the pods are a StatefulSet's (pods started and
	// stopped in parallel), which the PodAutoscaler scales, instead of a
	// Deployment's.
	StatefulSet bool
}

// OnRealNode puts a pod on the local cluster's real node name (a real
// kubelet, containerd and runc): it selects the node and tolerates its
// taint.
func OnRealNode(name string) func(*corev1.PodSpec) {
	return func(p *corev1.PodSpec) {
		p.NodeSelector = map[string]string{"kubernetes.io/hostname": name}
		p.Tolerations = append(p.Tolerations, corev1.Toleration{Key: cluster.RealNodeTaint, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule})
	}
}

// Deploy creates the app's namespace (if missing), Deployment, Service and
// PodAutoscaler (none for a Plain app).
func (s *Stack) Deploy(ctx context.Context, app App) error {
	// A tenant may not create namespaces: its own exists already, and the
	// creates below say so if not.
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: app.Namespace}}
	if err := s.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) && !apierrors.IsForbidden(err) {
		return err
	}
	labels := map[string]string{"app": app.Name}
	one := int32(1)
	image := app.Image
	if image == "" {
		image = AppImage
	}
	podSpec := AppPodSpec(image)
	if app.Pod != nil {
		app.Pod(&podSpec)
	}
	deploy := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: app.Namespace, Name: app.Name},
		Spec: appsv1.DeploymentSpec{
			Replicas: &one,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       podSpec,
			},
		},
	}
	public := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: app.Namespace, Name: app.Name},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}
	if app.Plain {
		public.Spec.Selector = labels
	}
	if app.Service != nil {
		app.Service(&public.Spec)
	}
	if app.Plain {
		for _, o := range []client.Object{deploy, public} {
			if err := s.Client.Create(ctx, o); err != nil {
				return fmt.Errorf("create %T %s: %w", o, o.GetName(), err)
			}
		}
		return nil
	}
	pa := &v1alpha1.PodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Namespace: app.Namespace, Name: app.Name},
		Spec: v1alpha1.PodAutoscalerSpec{
			ScaleTargetRef: v1alpha1.ScaleTargetRef{APIVersion: "apps/v1", Kind: "Deployment", Name: app.Name},
			Service:        v1alpha1.ServiceRef{Name: app.Name, Port: 80},
		},
	}
	if app.Spec != nil {
		app.Spec(&pa.Spec)
	}
	if is := pa.Spec.InitialScale; is != nil && *is == 0 {
		// Meant to start at zero: written so, as a user would, else its
		// first pod may start, be ready and take the first clients
		// before the autoscaler scales the Deployment to zero.
		deploy.Spec.Replicas = is
	}
	var workload client.Object = deploy
	if app.StatefulSet {
		workload = &appsv1.StatefulSet{
			ObjectMeta: deploy.ObjectMeta,
			Spec: appsv1.StatefulSetSpec{
				Replicas: deploy.Spec.Replicas, Selector: deploy.Spec.Selector, Template: deploy.Spec.Template,
				ServiceName: app.Name, PodManagementPolicy: appsv1.ParallelPodManagement,
			},
		}
		pa.Spec.ScaleTargetRef.Kind = "StatefulSet"
	}
	for _, o := range []client.Object{workload, public, pa} {
		if err := s.Client.Create(ctx, o); err != nil {
			return fmt.Errorf("create %T %s: %w", o, o.GetName(), err)
		}
	}
	return nil
}

// Remove deletes the app's PodAutoscaler, Service and Deployment or
// StatefulSet (the namespace stays). Objects already gone are not an
// error.
func (s *Stack) Remove(ctx context.Context, app App) error {
	meta := metav1.ObjectMeta{Namespace: app.Namespace, Name: app.Name}
	var errs []error
	for _, o := range []client.Object{&v1alpha1.PodAutoscaler{ObjectMeta: meta}, &corev1.Service{ObjectMeta: meta}, &appsv1.Deployment{ObjectMeta: meta}, &appsv1.StatefulSet{ObjectMeta: meta}} {
		if err := s.Client.Delete(ctx, o, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete %T %s: %w", o, app.Name, err))
		}
	}
	return errors.Join(errs...)
}

// PublicURL is http://<ClusterIP>:80/ of the app's public Service, once it
// has a ClusterIP inside the cluster's service range of its family (so
// traffic to it stays on this machine).
func (s *Stack) PublicURL(ctx context.Context, ns, name string) (string, error) {
	var svc corev1.Service
	if err := s.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &svc); err != nil {
		return "", err
	}
	ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
	inRange := s.ServiceCIDR.Contains(ip) || s.ServiceCIDR6.IsValid() && s.ServiceCIDR6.Contains(ip)
	if err != nil || !inRange {
		return "", fmt.Errorf("service %s/%s: ClusterIP %q is in none of the cluster's service ranges (%s, %s)", ns, name, svc.Spec.ClusterIP, s.ServiceCIDR, s.ServiceCIDR6)
	}
	return fmt.Sprintf("http://%s/", netip.AddrPortFrom(ip, uint16(svc.Spec.Ports[0].Port))), nil
}

// PA reads a PodAutoscaler.
func (s *Stack) PA(ctx context.Context, ns, name string) (*v1alpha1.PodAutoscaler, error) {
	var pa v1alpha1.PodAutoscaler
	return &pa, s.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &pa)
}

// Deployment reads the app's Deployment.
func (s *Stack) Deployment(ctx context.Context, ns, name string) (*appsv1.Deployment, error) {
	var d appsv1.Deployment
	return &d, s.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &d)
}

// PodSeries is one pod's series on its node's agent.
type PodSeries struct {
	Namespace, Pod, Workload string
	// Values by metric name (without labels other than the pod's).
	Values map[string]float64
}

// AgentMetrics scrapes every agent's /metrics and returns the per-pod
// series by "namespace/pod".
func (s *Stack) AgentMetrics(ctx context.Context) (map[string]*PodSeries, error) {
	var pods corev1.PodList
	if err := s.Client.List(ctx, &pods, client.InNamespace(Namespace), AgentPods); err != nil {
		return nil, err
	}
	if len(pods.Items) == 0 {
		return nil, errors.New("no agent pods")
	}
	out := make(map[string]*PodSeries)
	hc := MetricsClient(5 * time.Second)
	for _, p := range pods.Items {
		if p.Status.PodIP == "" {
			return nil, fmt.Errorf("agent %s has no IP yet", p.Name)
		}
		req, err := s.MetricsRequest(ctx, netip.AddrPortFrom(netip.MustParseAddr(p.Status.PodIP), AgentMetricsPort).String())
		if err != nil {
			return nil, err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return nil, fmt.Errorf("scrape agent %s: %w", p.Name, err)
		}
		if resp.StatusCode != http.StatusOK {
			resp.Body.Close()
			return nil, fmt.Errorf("scrape agent %s: %w", p.Name, &StatusError{Code: resp.StatusCode})
		}
		var buf bytes.Buffer
		_, err = buf.ReadFrom(resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, err
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		families, err := parser.TextToMetricFamilies(&buf)
		if err != nil {
			return nil, fmt.Errorf("parse agent %s metrics: %w", p.Name, err)
		}
		for name, f := range families {
			for _, m := range f.GetMetric() {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				if labels["pod"] == "" {
					continue
				}
				key := labels["namespace"] + "/" + labels["pod"]
				ps := out[key]
				if ps == nil {
					ps = &PodSeries{Namespace: labels["namespace"], Pod: labels["pod"], Workload: labels["workload"], Values: map[string]float64{}}
					out[key] = ps
				}
				switch {
				case m.Counter != nil:
					ps.Values[name] = m.GetCounter().GetValue()
				case m.Gauge != nil:
					ps.Values[name] += m.GetGauge().GetValue()
				}
			}
		}
	}
	return out, nil
}

// AgentIP is the address of one ready agent (for a user to curl).
func (s *Stack) AgentIP(ctx context.Context) (string, error) {
	var pods corev1.PodList
	if err := s.Client.List(ctx, &pods, client.InNamespace(Namespace), AgentPods); err != nil {
		return "", err
	}
	for _, p := range pods.Items {
		if p.Status.PodIP != "" {
			return p.Status.PodIP, nil
		}
	}
	return "", errors.New("no agent pod has an IP")
}

// AppPodSpec is the pod spec of the autoscale test app: a user's workload
// that meets the Pod Security Standards' restricted level (non-root, no
// privilege escalation, no capabilities, RuntimeDefault seccomp), so an
// app namespace may enforce it (test/integration checks with the real
// admission plugin).
func AppPodSpec(image string) corev1.PodSpec {
	return corev1.PodSpec{
		TerminationGracePeriodSeconds: ptr.To(int64(30)),
		SecurityContext: &corev1.PodSecurityContext{
			RunAsNonRoot:   ptr.To(true),
			RunAsUser:      ptr.To(int64(65532)),
			RunAsGroup:     ptr.To(int64(65532)),
			SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
		Containers: []corev1.Container{{
			Name: "app", Image: image,
			// After SIGTERM the app keeps serving (not ready) for 5 s
			// while the endpoint removal reaches kube-proxy, then drains.
			Args:  []string{"--port=8080", "--shutdown-delay=5s"},
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
			Env:   []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
			ReadinessProbe: &corev1.Probe{
				ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http")}},
				PeriodSeconds: 1,
			},
			SecurityContext: &corev1.SecurityContext{
				AllowPrivilegeEscalation: ptr.To(false),
				Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			},
		}},
	}
}

// HelmFromEnv is $HELM, the pinned helm the Makefile builds and exports.
func HelmFromEnv() string { return os.Getenv("HELM") }
