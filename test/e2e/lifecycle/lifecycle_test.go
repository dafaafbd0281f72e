package lifecycle

import (
	"context"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/internal/testutil/loadgen"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
	"github.com/sockscale/sockscale/test/cluster"
	"github.com/sockscale/sockscale/test/e2e/e2etest"
	"github.com/sockscale/sockscale/test/stack"
)

const (
	appNS = "e2e-lifecycle"
	// addedField is the PodAutoscaler spec field the "older" chart's CRD
	// lacks: optional, and named by no CEL rule of the spec.
	addedField = "scaleDownDelay"
	paCRD      = "podautoscalers.sockscale.dev"
)

// chartSets: a 20 s stable window keeps the scenario short.
var chartSets = []string{"autoscaler.stable-window=20s"}

// TestE2EUpgradeAndUninstall: one release through its life, in order.
// (a) An older chart (the current one with a CRD field removed and a lower
// version) is installed, then upgraded to the current chart: the served
// CRD gains the field and keeps it on a new object. (b) An upgrade that
// changes only the agents' pod template rolls them node by node under a
// steady load: no request fails and the target's observed concurrency and
// desired scale hold. (c) helm uninstall: on every node no sockscale
// program stays attached at the node's cgroup root and no pin is left;
// the public Services are handed back to Kubernetes (a serving one still
// answers, one at zero points at no activator); the CRDs and the users'
// PodAutoscalers stay. (d) Installed again under the same name, the chart
// adopts the kept CRDs and the controller takes the Services back.
func TestE2EUpgradeAndUninstall(t *testing.T) {
	testenv.RequireRoot(t)
	e2etest.RequireHelm(t)
	// The API server warns of the unknown field the older CRD prunes.
	ctrllog.SetLogger(logr.Discard())
	ctx := context.Background()
	upCtx, cancel := context.WithTimeout(ctx, 8*time.Minute)
	defer cancel()
	cl, err := cluster.Up(upCtx, cluster.Options{Nodes: 2, RealNodes: 1, StateDir: filepath.Join(os.TempDir(), "sockscale-e2e-lifecycle")})
	if err != nil {
		t.Fatalf("cluster up: %v", err)
	}
	t.Cleanup(func() {
		if err := cl.Down(); err != nil {
			t.Errorf("cluster down: %v", err)
		}
	})
	s, err := stack.New(cl.Config, cl.Kubeconfig, stack.HelmFromEnv(), cluster.ServiceCIDR)
	if err != nil {
		t.Fatal(err)
	}
	// The images and the current chart in the cluster's registry, as the
	// e2e package does; the "older" chart is installed from a directory.
	if err := stack.PushImages(upCtx); err != nil {
		t.Fatal(err)
	}
	if err := s.PushChart(upCtx); err != nil {
		t.Fatal(err)
	}

	// The stack's client knows sockscale's kinds; this one CRDs too.
	scheme := kruntime.NewScheme()
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	crds, err := client.New(cl.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("a CRD field added between two chart versions", func(t *testing.T) { crdUpgrade(t, s, crds) })
	if t.Failed() {
		return
	}
	// Its three pods under load one per node: the real node's agent
	// rolls with a count to keep too.
	steady := deployApp(t, s, stack.App{Namespace: appNS, Name: "steady", Pod: onEveryNode("steady"), Spec: func(p *v1alpha1.PodAutoscalerSpec) {
		p.Target, p.MinScale, p.MaxScale = ptr.To(10.0), ptr.To(int32(1)), ptr.To(int32(10))
		p.TargetBurstCapacity = ptr.To(0.0)
	}})
	// Left alone from here: at zero, in Proxy mode, by the uninstall.
	deploy(t, s, "idle", func(p *v1alpha1.PodAutoscalerSpec) { p.MinScale = ptr.To(int32(0)) })
	t.Run("agents roll under load", func(t *testing.T) { agentsRoll(t, s, cl, steady) })
	if t.Failed() {
		return
	}
	t.Run("uninstall leaves nothing behind", func(t *testing.T) { uninstall(t, s, cl, steady) })
	if t.Failed() {
		return
	}
	t.Run("a new install adopts the kept CRDs and takes the Services back", func(t *testing.T) { reinstall(t, s, steady) })
}

// reinstall is (d): the same release name again, after the uninstall.
func reinstall(t *testing.T, s *stack.Stack, steadyURL string) {
	ctx := context.Background()
	start := time.Now()
	if err := s.Install(ctx, chartSets...); err != nil {
		t.Fatal(err)
	}
	t.Logf("installed again in %s", time.Since(start).Round(100*time.Millisecond))
	e2etest.Eventually(t, 2*time.Minute, "the steady Service taken back: no selector, sockscale's endpoints", func() error {
		var svc corev1.Service
		if err := s.Client.Get(ctx, client.ObjectKey{Namespace: appNS, Name: "steady"}, &svc); err != nil {
			return err
		}
		addrs, managers := publicSlices(t, s, "steady")
		if len(svc.Spec.Selector) > 0 || svc.Annotations["sockscale.dev/handed-back"] != "" {
			return fmt.Errorf("selector %v, annotations %v", svc.Spec.Selector, svc.Annotations)
		}
		for _, m := range managers {
			if m != "controller.sockscale.dev" {
				return fmt.Errorf("public endpoints %v by %v; want sockscale's only", addrs, managers)
			}
		}
		if len(addrs) == 0 {
			return fmt.Errorf("no public endpoints yet")
		}
		resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}).Get(steadyURL)
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", steadyURL, resp.Status)
		}
		return nil
	})
}

// crdUpgrade is (a).
func crdUpgrade(t *testing.T, s *stack.Stack, crds client.Client) {
	ctx := context.Background()
	old := olderChart(t)
	start := time.Now()
	real, err := s.RealNodeSets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	helm(t, s, append([]string{"install", "sockscale", old, "--namespace", stack.Namespace, "--create-namespace", "--wait", "--timeout", "4m"}, setArgs(slices.Concat(stack.ClusterSets(), real, chartSets))...)...)
	t.Logf("older chart (0.0.1, CRD without %s) installed in %s", addedField, time.Since(start).Round(100*time.Millisecond))
	if servesField(t, crds) {
		t.Fatalf("the older chart's CRD serves %s: the test's copy did not remove it", addedField)
	}
	// The old schema prunes the unknown field: what the upgrade must fix.
	if got := createPA(t, s, "before-upgrade"); got != "" {
		t.Fatalf("with the older CRD, %s was kept (%q): the field was not removed", addedField, got)
	}

	start = time.Now()
	if err := s.Install(ctx, chartSets...); err != nil {
		t.Fatal(err)
	}
	t.Logf("upgraded to the current chart in %s", time.Since(start).Round(100*time.Millisecond))
	var crd apiextensionsv1.CustomResourceDefinition
	if err := crds.Get(ctx, client.ObjectKey{Name: paCRD}, &crd); err != nil {
		t.Fatal(err)
	}
	if crd.Labels["helm.sh/chart"] != "sockscale-0.1.0" || crd.Annotations["helm.sh/resource-policy"] != "keep" {
		t.Errorf("CRD after the upgrade: labels %v annotations %v; want the current chart's, with resource-policy keep", crd.Labels, crd.Annotations)
	}
	e2etest.Eventually(t, 30*time.Second, "the upgraded CRD serves "+addedField, func() error {
		if !servesField(t, crds) {
			return fmt.Errorf("not in the schema")
		}
		return nil
	})
	e2etest.Eventually(t, 30*time.Second, "a new PodAutoscaler keeps "+addedField, func() error {
		name := fmt.Sprintf("after-upgrade-%d", time.Now().UnixNano()%100000)
		if got := createPA(t, s, name); got != "5s" {
			return fmt.Errorf("%s read back as %q, want 5s", addedField, got)
		}
		return nil
	})
}

// olderChart copies the chart into a temporary directory as version
// 0.0.1 whose PodAutoscaler CRD lacks addedField.
func olderChart(t *testing.T) string {
	t.Helper()
	src := stack.ChartDir()
	dst := filepath.Join(t.TempDir(), "sockscale")
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	chartYAML := filepath.Join(dst, "Chart.yaml")
	b, err := os.ReadFile(chartYAML)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "\nversion: 0.1.0\n") {
		t.Fatalf("Chart.yaml has no 'version: 0.1.0' line to lower:\n%s", b)
	}
	if err := os.WriteFile(chartYAML, []byte(strings.Replace(string(b), "\nversion: 0.1.0\n", "\nversion: 0.0.1\n", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	crdFile := filepath.Join(dst, "files", "crds", "sockscale.dev_podautoscalers.yaml")
	b, err = os.ReadFile(crdFile)
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(b, &crd); err != nil {
		t.Fatal(err)
	}
	for i := range crd.Spec.Versions {
		spec := crd.Spec.Versions[i].Schema.OpenAPIV3Schema.Properties["spec"]
		if _, ok := spec.Properties[addedField]; !ok {
			t.Fatalf("the current CRD has no spec.%s to remove", addedField)
		}
		delete(spec.Properties, addedField)
		crd.Spec.Versions[i].Schema.OpenAPIV3Schema.Properties["spec"] = spec
	}
	out, err := yaml.Marshal(&crd)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(crdFile, out, 0o644); err != nil {
		t.Fatal(err)
	}
	return dst
}

// servesField says whether the served PodAutoscaler CRD has addedField.
func servesField(t *testing.T, crds client.Client) bool {
	t.Helper()
	var crd apiextensionsv1.CustomResourceDefinition
	if err := crds.Get(context.Background(), client.ObjectKey{Name: paCRD}, &crd); err != nil {
		t.Fatal(err)
	}
	for _, v := range crd.Spec.Versions {
		if v.Served {
			_, ok := v.Schema.OpenAPIV3Schema.Properties["spec"].Properties[addedField]
			return ok
		}
	}
	return false
}

// createPA creates a PodAutoscaler setting addedField (5s) as unstructured
// (as kubectl would send it) and returns the field as read back ("" when
// pruned). The object is deleted again.
func createPA(t *testing.T, s *stack.Stack, name string) string {
	t.Helper()
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: appNS}}
	if err := s.Client.Create(ctx, ns); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "sockscale.dev/v1alpha1", "kind": "PodAutoscaler",
		"metadata": map[string]any{"namespace": appNS, "name": name},
		"spec": map[string]any{
			"scaleTargetRef": map[string]any{"apiVersion": "apps/v1", "kind": "Deployment", "name": "none"},
			"service":        map[string]any{"name": "none", "port": int64(80)},
			addedField:       "5s",
		},
	}}
	if err := s.Client.Create(ctx, u); err != nil {
		t.Fatalf("create PodAutoscaler %s with %s: %v", name, addedField, err)
	}
	defer func() { _ = s.Client.Delete(ctx, u) }()
	got := &unstructured.Unstructured{}
	got.SetGroupVersionKind(schema.GroupVersionKind{Group: "sockscale.dev", Version: "v1alpha1", Kind: "PodAutoscaler"})
	if err := s.Client.Get(ctx, client.ObjectKey{Namespace: appNS, Name: name}, got); err != nil {
		t.Fatal(err)
	}
	v, _, _ := unstructured.NestedString(got.Object, "spec", addedField)
	return v
}

// agentsRoll is (b): 18 clients of 200 ms requests on a target of 7 per
// pod (3 pods); an upgrade that changes the agents' pod annotations.
func agentsRoll(t *testing.T, s *stack.Stack, cl *cluster.Cluster, url string) {
	ctx := context.Background()
	load := loadgen.Start(ctx, loadgen.Options{URLs: []string{url + "?sleep=200"}, Concurrency: 18, KeepAlive: true})
	defer load.Stop()
	var since time.Time
	var before float64
	e2etest.Eventually(t, 3*time.Minute, "steady: settled at 3 pods under 18 in flight", func() error {
		pa, err := s.PA(ctx, appNS, "steady")
		if err != nil {
			return err
		}
		if deref(pa.Status.DesiredScale) != 3 || deref(pa.Status.ActualScale) != 3 || pa.Status.Panicking {
			since = time.Time{}
			return fmt.Errorf("%s", paLine(pa))
		}
		if since.IsZero() {
			since = time.Now()
		}
		if time.Since(since) < 5*time.Second {
			return fmt.Errorf("settled for %s", time.Since(since).Round(time.Second))
		}
		before, _ = strconv.ParseFloat(pa.Status.StableValue, 64)
		return nil
	})
	// One pod per node (onEveryNode), so every agent's roll is under load.
	var steadyPods corev1.PodList
	if err := s.Client.List(ctx, &steadyPods, client.InNamespace(appNS), client.MatchingLabels{"app": "steady"}); err != nil {
		t.Fatal(err)
	}
	var onNodes []string
	for _, p := range steadyPods.Items {
		if p.DeletionTimestamp == nil {
			onNodes = append(onNodes, p.Spec.NodeName)
		}
	}
	slices.Sort(onNodes)
	if want := slices.Sorted(slices.Values(cl.NodeNames())); !slices.Equal(onNodes, want) {
		t.Fatalf("steady's pods on nodes %v; want one on each of %v", onNodes, want)
	}
	oldAgents := agentPods(t, s)

	// Sample the target every 500 ms while the agents roll.
	type sample struct {
		at      time.Duration
		desired int32
		stable  float64
		line    string
	}
	var mu sync.Mutex
	var samples []sample
	sampleCtx, stopSampling := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	start := time.Now()
	go func() {
		defer wg.Done()
		for sampleCtx.Err() == nil {
			if pa, err := s.PA(sampleCtx, appNS, "steady"); err == nil {
				v, _ := strconv.ParseFloat(pa.Status.StableValue, 64)
				mu.Lock()
				samples = append(samples, sample{time.Since(start), deref(pa.Status.DesiredScale), v, paLine(pa)})
				mu.Unlock()
			}
			time.Sleep(500 * time.Millisecond)
		}
	}()
	if err := s.Install(ctx, append(slices.Clone(chartSets), "agent.podAnnotations.sockscale\\.dev/e2e-revision=rev2")...); err != nil {
		t.Fatal(err)
	}
	e2etest.Eventually(t, 3*time.Minute, "every agent replaced by one with the new annotation", func() error {
		for _, p := range agentPods(t, s) {
			if p.Annotations["sockscale.dev/e2e-revision"] != "rev2" || !podReady(p) {
				return fmt.Errorf("agent %s on %s: annotation %q, ready %v", p.Name, p.Spec.NodeName, p.Annotations["sockscale.dev/e2e-revision"], podReady(p))
			}
			if _, ok := oldAgents[p.Name]; ok {
				return fmt.Errorf("agent %s still the old one", p.Name)
			}
		}
		return nil
	})
	rolled := time.Since(start)
	// Two more stable-window thirds: a count lost in the roll shows up in
	// the windows' averages after the agents are back.
	time.Sleep(10 * time.Second)
	stopSampling()
	wg.Wait()
	r := load.Stop()

	t.Logf("agents rolled in %s; %d requests answered, %d failed; stable concurrency %.1f before; %d samples", rolled.Round(100*time.Millisecond), r.Completed, r.Failed, before, len(samples))
	if r.Failed != 0 || r.Completed == 0 {
		t.Errorf("%d of %d requests failed while the agents rolled; want none", r.Failed, r.Completed+r.Failed)
	}
	minStable, maxStable := before, before
	for _, sm := range samples {
		minStable, maxStable = min(minStable, sm.stable), max(maxStable, sm.stable)
		// A lost count (an agent that restarted with empty counters) reads
		// as less load; a double count as more. 18 in flight, 7 per pod:
		// 3 pods, and the stable average within 25 % of the load.
		if sm.desired != 3 || sm.stable < 0.75*18 || sm.stable > 1.25*18 {
			t.Errorf("at +%s: desired %d, stable %.1f; want 3 pods and 13.5..22.5 (18 in flight): %s", sm.at.Round(100*time.Millisecond), sm.desired, sm.stable, sm.line)
		}
	}
	t.Logf("during the roll: stable concurrency %.1f..%.1f (18 in flight)", minStable, maxStable)
	// The agents adopted their predecessors' pins.
	for _, node := range cl.NodeNames() {
		dir := filepath.Join(cl.NodeBPFFS(node), "sockscale")
		if n := attached(t, cl.NodeCgroup(node)); n != 7 {
			t.Errorf("%s: %d sockscale programs at its cgroup root after the roll; want 7 (3 accounting, 4 redirect)", node, n)
		}
		if _, err := os.Stat(dir); err != nil {
			t.Errorf("%s: pin directory after the roll: %v", node, err)
		}
	}
}

// uninstall is (c).
func uninstall(t *testing.T, s *stack.Stack, cl *cluster.Cluster, steadyURL string) {
	ctx := context.Background()
	// The idle target at zero, its public Service on the activators.
	var activatorIPs []string
	e2etest.Eventually(t, 3*time.Minute, "idle at zero pods with its public endpoints on activators", func() error {
		pa, err := s.PA(ctx, appNS, "idle")
		if err != nil {
			return err
		}
		var sks v1alpha1.ServerlessService
		if err := s.Client.Get(ctx, client.ObjectKey{Namespace: appNS, Name: "idle"}, &sks); err != nil {
			return err
		}
		if deref(pa.Status.ActualScale) != 0 || sks.Status.Mode != v1alpha1.ModeProxy {
			return fmt.Errorf("%s; ServerlessService mode %q", paLine(pa), sks.Status.Mode)
		}
		activatorIPs = nil
		var pods corev1.PodList
		if err := s.Client.List(ctx, &pods, client.InNamespace(stack.Namespace), client.MatchingLabels{"app.kubernetes.io/component": "activator"}); err != nil {
			return err
		}
		for _, p := range pods.Items {
			activatorIPs = append(activatorIPs, p.Status.PodIP)
		}
		addrs, managers := publicSlices(t, s, "idle")
		if len(addrs) == 0 || !slices.Contains(managers, "controller.sockscale.dev") {
			return fmt.Errorf("public endpoints %v by %v", addrs, managers)
		}
		for _, a := range addrs {
			if !slices.Contains(activatorIPs, a) {
				return fmt.Errorf("public endpoint %s is not an activator (%v)", a, activatorIPs)
			}
		}
		return nil
	})

	start := time.Now()
	helm(t, s, "uninstall", "sockscale", "--namespace", stack.Namespace, "--wait", "--timeout", "4m")
	t.Logf("helm uninstall took %s", time.Since(start).Round(100*time.Millisecond))
	e2etest.Eventually(t, 2*time.Minute, "no agent pod left", func() error {
		if pods := agentPods(t, s); len(pods) > 0 {
			return fmt.Errorf("%d agent pods", len(pods))
		}
		return nil
	})
	e2etest.Eventually(t, time.Minute, "no program attached and no pin on any node", func() error {
		for _, node := range cl.NodeNames() {
			if n := attached(t, cl.NodeCgroup(node)); n != 0 {
				return fmt.Errorf("%s: %d sockscale programs attached at %s", node, n, cl.NodeCgroup(node))
			}
			entries, err := os.ReadDir(cl.NodeBPFFS(node))
			if err != nil {
				return err
			}
			for _, e := range entries {
				switch e.Name() {
				case "maps.debug", "progs.debug":
				case "sockscale":
					// The agents' hostPath (DirectoryOrCreate), which the
					// kubelet made and which outlives them like any
					// hostPath; mounted into each, it was theirs to empty,
					// not to remove.
					inside, err := os.ReadDir(filepath.Join(cl.NodeBPFFS(node), e.Name()))
					if err != nil {
						return err
					}
					if len(inside) > 0 {
						return fmt.Errorf("%s: %s left in %s/sockscale", node, inside[0].Name(), cl.NodeBPFFS(node))
					}
				default:
					return fmt.Errorf("%s: %s left in %s", node, e.Name(), cl.NodeBPFFS(node))
				}
			}
		}
		return nil
	})

	e2etest.Eventually(t, time.Minute, "the steady Service answers from its pods through Kubernetes' endpoints", func() error {
		addrs, managers := publicSlices(t, s, "steady")
		if slices.Contains(managers, "controller.sockscale.dev") || len(addrs) != 3 {
			return fmt.Errorf("public endpoints %v by %v; want the 3 pods by Kubernetes", addrs, managers)
		}
		c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
		for range 5 {
			resp, err := c.Get(steadyURL)
			if err != nil {
				return err
			}
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("GET %s: %s", steadyURL, resp.Status)
			}
		}
		return nil
	})
	addrs, managers := publicSlices(t, s, "idle")
	for _, a := range addrs {
		if slices.Contains(activatorIPs, a) {
			t.Errorf("the idle Service still points at activator %s after the uninstall (endpoints %v by %v)", a, addrs, managers)
		}
	}
	if slices.Contains(managers, "controller.sockscale.dev") {
		t.Errorf("the idle Service keeps sockscale's EndpointSlices after the uninstall (by %v)", managers)
	}
	var idle corev1.Service
	if err := s.Client.Get(ctx, client.ObjectKey{Namespace: appNS, Name: "idle"}, &idle); err != nil {
		t.Fatal(err)
	}
	if idle.Spec.Selector["app"] != "idle" {
		t.Errorf("the idle Service's selector after the uninstall: %v; want its target's (app=idle)", idle.Spec.Selector)
	}

	// The CRDs stay, and so do the users' objects.
	var pas v1alpha1.PodAutoscalerList
	if err := s.Client.List(ctx, &pas, client.InNamespace(appNS)); err != nil {
		t.Fatalf("PodAutoscalers after the uninstall: %v; want the CRD kept", err)
	}
	if len(pas.Items) != 2 {
		t.Errorf("%d PodAutoscalers after the uninstall; want both of the test's kept", len(pas.Items))
	}
}

// publicSlices are the addresses in a public Service's EndpointSlices and
// the slices' managers.
func publicSlices(t *testing.T, s *stack.Stack, name string) (addrs, managers []string) {
	t.Helper()
	var list discoveryv1.EndpointSliceList
	if err := s.Client.List(context.Background(), &list, client.InNamespace(appNS), client.MatchingLabels{discoveryv1.LabelServiceName: name}); err != nil {
		t.Fatal(err)
	}
	for _, sl := range list.Items {
		managers = append(managers, sl.Labels[discoveryv1.LabelManagedBy])
		for _, e := range sl.Endpoints {
			addrs = append(addrs, e.Addresses...)
		}
	}
	slices.Sort(addrs)
	return addrs, managers
}

// attached counts sockscale's programs attached at a cgroup, as bpftool
// reports them.
func attached(t *testing.T, cgroup string) int {
	t.Helper()
	out, err := exec.Command("bpftool", "cgroup", "show", cgroup).CombinedOutput()
	if err != nil {
		t.Fatalf("bpftool cgroup show %s: %v: %s", cgroup, err, out)
	}
	return strings.Count(string(out), "sockscale_")
}

// agentPods are the agent pods not being deleted, by name.
func agentPods(t *testing.T, s *stack.Stack) map[string]corev1.Pod {
	t.Helper()
	var pods corev1.PodList
	if err := s.Client.List(context.Background(), &pods, client.InNamespace(stack.Namespace), stack.AgentPods); err != nil {
		t.Fatal(err)
	}
	out := map[string]corev1.Pod{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			out[p.Name] = p
		}
	}
	return out
}

func podReady(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// deploy makes an app and waits until its public Service answers.
func deploy(t *testing.T, s *stack.Stack, name string, spec func(*v1alpha1.PodAutoscalerSpec)) string {
	t.Helper()
	return deployApp(t, s, stack.App{Namespace: appNS, Name: name, Spec: spec})
}

// onEveryNode spreads an app's pods one per node, the real node's too
// (its taint tolerated), so that every node's agent counts some of them.
func onEveryNode(name string) func(*corev1.PodSpec) {
	return func(p *corev1.PodSpec) {
		p.Tolerations = append(p.Tolerations, corev1.Toleration{Key: cluster.RealNodeTaint, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule})
		p.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{
			MaxSkew: 1, TopologyKey: "kubernetes.io/hostname", WhenUnsatisfiable: corev1.DoNotSchedule,
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
		}}
	}
}

// deployApp makes an app and waits until its public Service answers.
func deployApp(t *testing.T, s *stack.Stack, app stack.App) string {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	return e2etest.DeployApp(t, s, app, func(url string) error {
		resp, err := c.Get(url)
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		return nil
	})
}

func helm(t *testing.T, s *stack.Stack, args ...string) {
	t.Helper()
	args = append(args, "--kubeconfig", s.Kubeconfig)
	out, err := exec.Command(s.Helm, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func setArgs(sets []string) []string {
	var out []string
	for _, s := range sets {
		out = append(out, "--set", s)
	}
	return out
}

func paLine(pa *v1alpha1.PodAutoscaler) string {
	return fmt.Sprintf("desired %d actual %d stable %s panicking %v", deref(pa.Status.DesiredScale), deref(pa.Status.ActualScale), pa.Status.StableValue, pa.Status.Panicking)
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
