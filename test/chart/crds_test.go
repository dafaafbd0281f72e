package chart_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// The CRDs are templates (so `helm upgrade` updates them): each file that
// `make generate` writes into files/crds renders once, its spec unchanged
// by helm's YAML round trip, with helm.sh/resource-policy: keep (uninstall
// leaves users' objects) and the chart's labels; crds.install=false
// renders none.
func TestCRDsRenderFromGeneratedFiles(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(chartDir(t), "files", "crds", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no generated CRDs in files/crds (%v)", err)
	}
	objs := render(t)
	if n := len(objs.ofKind("CustomResourceDefinition")); n != len(files) {
		t.Errorf("%d CRDs rendered; want one per file in files/crds (%d)", n, len(files))
	}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var want apiextensionsv1.CustomResourceDefinition
		if err := yaml.UnmarshalStrict(raw, &want); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		got := get[apiextensionsv1.CustomResourceDefinition](t, objs, "CustomResourceDefinition", want.Name)
		if diff := cmp.Diff(want.Spec, got.Spec); diff != "" {
			t.Errorf("CRD %s spec differs from %s (-file +rendered):\n%s", want.Name, filepath.Base(f), diff)
		}
		if v := got.Annotations["helm.sh/resource-policy"]; v != "keep" {
			t.Errorf("CRD %s: helm.sh/resource-policy=%q; want keep, so that uninstall leaves users' objects", want.Name, v)
		}
		if got.Labels["app.kubernetes.io/managed-by"] != "Helm" || got.Labels["app.kubernetes.io/instance"] != release {
			t.Errorf("CRD %s labels %v; want the chart's", want.Name, got.Labels)
		}
	}
	if n := len(render(t, "--set", "crds.install=false").ofKind("CustomResourceDefinition")); n != 0 {
		t.Errorf("crds.install=false renders %d CRDs; want none", n)
	}
	// Nothing left where helm installs CRDs once and never upgrades them.
	if _, err := os.Stat(filepath.Join(chartDir(t), "crds")); !os.IsNotExist(err) {
		t.Errorf("charts/sockscale/crds exists (%v): helm would install those CRDs before the templates' and never upgrade them", err)
	}
}
