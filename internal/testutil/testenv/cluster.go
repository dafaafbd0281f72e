package testenv

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crconfig "sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
)

// Cluster is a real etcd and kube-apiserver with sockscale's CRDs.
type Cluster struct {
	Config *rest.Config
	// Client knows the core, sockscale.dev and serving.sockscale.dev types.
	Client client.Client
	// Kubeconfig is a file for binaries the test starts (cluster admin).
	Kubeconfig string
}

// Option changes the control plane ControlPlane starts.
type Option func(*envtest.Environment)

// DualStack gives the API server an IPv4 and an IPv6 Service range
// (IPv4 first, as in a cluster whose primary family is IPv4), so that
// Services can be dual-stack or IPv6-only. The ranges are only
// allocated from, never routed: nothing is sent to them.
func DualStack() Option {
	return func(env *envtest.Environment) {
		env.ControlPlane.GetAPIServer().Configure().Set("service-cluster-ip-range", "10.0.0.0/24,fd5c:a1e:96::/112")
	}
}

// DualStackIPv6First is DualStack with IPv6 the primary family: a
// Service that names no family is IPv6-only.
func DualStackIPv6First() Option {
	return func(env *envtest.Environment) {
		// The API server's own address must be of the primary family (the
		// kubernetes Service's endpoint): loopback, as envtest's 127.0.0.1.
		env.ControlPlane.GetAPIServer().Configure().Set("service-cluster-ip-range", "fd5c:a1e:96::/112,10.0.0.0/24").Set("advertise-address", "::1")
	}
}

// WithoutCRD leaves the named CRD (as "routes.serving.sockscale.dev")
// out of the control plane, for tests of what a component does before
// it is installed. Installing it later (InstallCRD) is faster and surer
// than deleting it: a CRD's deletion waits on the API server's finalizer,
// which has taken over 30 s on a loaded machine.
func WithoutCRD(name string) Option {
	return func(env *envtest.Environment) {
		crds, err := chartCRDs()
		if err != nil {
			panic(err) // ControlPlane's own CRD read fails the same way
		}
		kept := crds[:0]
		for _, crd := range crds {
			if crd.Name != name {
				kept = append(kept, crd)
			}
		}
		if len(kept) == len(crds) {
			panic(fmt.Sprintf("testenv.WithoutCRD: no CRD %q in %s", name, crdDir()))
		}
		env.CRDDirectoryPaths = nil
		env.CRDs = kept
	}
}

// InstallCRD creates the named CRD of the chart and waits until it is
// established (its resources are served).
func (c *Cluster) InstallCRD(t testing.TB, name string) {
	t.Helper()
	crds, err := chartCRDs()
	if err != nil {
		t.Fatal(err)
	}
	for _, crd := range crds {
		if crd.Name != name {
			continue
		}
		err := envtest.CreateCRDs(c.Config, []*apiextensionsv1.CustomResourceDefinition{crd.DeepCopy()})
		if err == nil {
			err = envtest.WaitForCRDs(c.Config, []*apiextensionsv1.CustomResourceDefinition{crd}, envtest.CRDInstallOptions{MaxTime: time.Minute, PollInterval: 100 * time.Millisecond})
		}
		if err != nil {
			t.Fatalf("install the CRD %s: %v", name, err)
		}
		return
	}
	t.Fatalf("no CRD %q in %s", name, crdDir())
}

// chartCRDs reads charts/sockscale/files/crds.
func chartCRDs() ([]*apiextensionsv1.CustomResourceDefinition, error) {
	opts := envtest.CRDInstallOptions{Paths: []string{crdDir()}, ErrorIfPathMissing: true}
	if err := envtest.ReadCRDFiles(&opts); err != nil {
		return nil, fmt.Errorf("read the chart's CRDs: %w", err)
	}
	return opts.CRDs, nil
}

// ControlPlane starts etcd and kube-apiserver (the pinned builds of
// KUBEBUILDER_ASSETS) with the CRDs of charts/sockscale/files/crds installed, and
// stops them when t ends.
func ControlPlane(t testing.TB, opts ...Option) *Cluster {
	t.Helper()
	RequireControlPlane(t)
	env := &envtest.Environment{CRDDirectoryPaths: []string{crdDir()}, ErrorIfCRDPathMissing: true}
	for _, o := range opts {
		o(env)
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start etcd and kube-apiserver: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	user, err := env.AddUser(envtest.User{Name: "sockscale-test", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	scheme := kruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := servingv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return &Cluster{Config: cfg, Client: c, Kubeconfig: path}
}

// crdDir is charts/sockscale/files/crds, found from this file's place in the module.
func crdDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "charts", "sockscale", "files", "crds")
}

// CreateDeployment makes a Deployment with replicas wanted and ready ones
// reported in its status (no controller-manager runs to do it).
func (c *Cluster) CreateDeployment(t testing.TB, namespace, name string, replicas, ready int32) *appsv1.Deployment {
	t.Helper()
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: name, Image: name}}},
			},
		},
	}
	ctx := context.Background()
	if err := c.Client.Create(ctx, d); err != nil {
		t.Fatal(err)
	}
	d.Status.Replicas, d.Status.ReadyReplicas = ready, ready
	if err := c.Client.Status().Update(ctx, d); err != nil {
		t.Fatal(err)
	}
	return d
}

// Replicas is a Deployment's wanted replicas now.
func (c *Cluster) Replicas(t testing.TB, namespace, name string) int32 {
	t.Helper()
	var d appsv1.Deployment
	if err := c.Client.Get(context.Background(), client.ObjectKey{Namespace: namespace, Name: name}, &d); err != nil {
		t.Fatal(err)
	}
	return *d.Spec.Replicas
}

// TableRow is one object's row as `kubectl get` prints it: the API
// server's Table rendering of the resource's printer columns, by column
// name (Age left out, it changes).
func (c *Cluster) TableRow(t testing.TB, gv schema.GroupVersion, resource, namespace, name string) map[string]string {
	t.Helper()
	rc := rest.CopyConfig(c.Config)
	rc.APIPath = "/apis"
	rc.GroupVersion = &gv
	rc.NegotiatedSerializer = clientgoscheme.Codecs.WithoutConversion()
	rcl, err := rest.RESTClientFor(rc)
	if err != nil {
		t.Fatal(err)
	}
	body, err := rcl.Get().Namespace(namespace).Resource(resource).Name(name).
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").DoRaw(t.Context())
	if err != nil {
		t.Fatalf("get the Table of %s %s: %v", resource, name, err)
	}
	var table metav1.Table
	if err := json.Unmarshal(body, &table); err != nil {
		t.Fatalf("the Table of %s %s: %v: %.300s", resource, name, err, body)
	}
	if len(table.Rows) != 1 {
		t.Fatalf("the Table of %s %s has %d rows", resource, name, len(table.Rows))
	}
	row := map[string]string{}
	for i, col := range table.ColumnDefinitions {
		if col.Name != "Age" && i < len(table.Rows[0].Cells) {
			row[col.Name] = fmt.Sprint(table.Rows[0].Cells[i])
		}
	}
	return row
}

// StartManager runs a controller-runtime manager against c, with what each
// setup adds (a reconciler's SetupWithManager), until t ends; the manager
// serves no metrics or probes.
func (c *Cluster) StartManager(t testing.TB, setup ...func(ctrl.Manager) error) {
	t.Helper()
	skip := true // several tests in one binary register controllers of the same name
	mgr, err := ctrl.NewManager(c.Config, ctrl.Options{
		Scheme:                 c.Client.Scheme(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             crconfig.Controller{SkipNameValidation: &skip},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range setup {
		if err := s(mgr); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
}

// Eventually polls cond every 100 ms until it holds, for up to timeout
// (the API server is slow on a loaded machine), and fails t with what and
// cond's last word on the state if it never does.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	var last string
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		ok, state := cond()
		if ok {
			return
		}
		last = state
	}
	t.Fatalf("%s: not within %v; last: %s", what, timeout, last)
}

// InstallHTTPRouteCRD installs a minimal HTTPRoute CRD (the Gateway API's
// group, kind and version, any spec, and as there a status subresource:
// status is written apart, and only a spec change bumps the generation),
// as a cluster with the Gateway API has, and waits until it is served.
func (c *Cluster) InstallHTTPRouteCRD(t testing.TB) {
	t.Helper()
	s := kruntime.NewScheme()
	if err := apiextensionsv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	cl, err := client.New(c.Config, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	preserve := true
	crd := &apiextensionsv1.CustomResourceDefinition{
		// *.k8s.io groups need an approval annotation; the Gateway API's
		// CRDs carry one.
		ObjectMeta: metav1.ObjectMeta{Name: "httproutes.gateway.networking.k8s.io",
			Annotations: map[string]string{"api-approved.kubernetes.io": "https://github.com/kubernetes-sigs/gateway-api/pull/2466"}},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "gateway.networking.k8s.io", Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "httproutes", Singular: "httproute", Kind: "HTTPRoute", ListKind: "HTTPRouteList"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object", XPreserveUnknownFields: &preserve}},
				Subresources: &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}}}},
		},
	}
	ctx := context.Background()
	if err := cl.Create(ctx, crd); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 30*time.Second, "the HTTPRoute CRD is served", func() (bool, string) {
		var got apiextensionsv1.CustomResourceDefinition
		if err := cl.Get(ctx, client.ObjectKey{Name: crd.Name}, &got); err != nil {
			return false, err.Error()
		}
		for _, cond := range got.Status.Conditions {
			if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
				return true, ""
			}
		}
		return false, "not established yet"
	})
}
