package chart_test

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
)

const activatorClusterRole = "sockscale-activator"

// generatedRules reads the rules controller-gen wrote from a component's
// +kubebuilder:rbac markers (make generate; make verify fails when they
// are stale, so these are the code's markers).
func generatedRules(t *testing.T, file string) []rbacv1.PolicyRule {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(chartDir(t), "files", "rbac", file))
	if err != nil {
		t.Fatalf("the generated RBAC (make generate): %v", err)
	}
	var role rbacv1.ClusterRole
	if err := yaml.Unmarshal(b, &role); err != nil {
		t.Fatalf("files/rbac/%s: %v", file, err)
	}
	if len(role.Rules) == 0 {
		t.Fatalf("files/rbac/%s has no rules", file)
	}
	return role.Rules
}

// Each component's ClusterRole is exactly what its markers generate, so a
// verb the code stops using leaves the chart with the marker.
func TestClusterRolesAreTheMarkers(t *testing.T) {
	agent := generatedRules(t, "agent/role.yaml")
	redirect := generatedRules(t, "agent-redirect/role.yaml")
	for _, tt := range []struct {
		name string
		set  []string
		role string
		want []rbacv1.PolicyRule
	}{
		{"controller", nil, controllerName, generatedRules(t, "role.yaml")},
		{"activator", nil, activatorClusterRole, generatedRules(t, "activator/role.yaml")},
		{"agent", nil, agentName, slices.Concat(agent, redirect)},
		{"agent without the redirect", []string{"--set", "agent.socketRedirect=off"}, agentName, agent},
	} {
		t.Run(tt.name, func(t *testing.T) {
			role := get[rbacv1.ClusterRole](t, render(t, tt.set...), "ClusterRole", tt.role)
			if diff := cmp.Diff(tt.want, role.Rules); diff != "" {
				t.Errorf("ClusterRole %s rules differ from the generated ones (-generated +rendered):\n%s", tt.role, diff)
			}
		})
	}
}

// No rule of any Role or ClusterRole the chart renders holds a wildcard.
func TestNoWildcardRules(t *testing.T) {
	objs := render(t)
	n := 0
	for _, kind := range []string{"ClusterRole", "Role"} {
		for _, o := range objs.ofKind(kind) {
			role := get[rbacv1.ClusterRole](t, objs, kind, o.Name) // a Role decodes the same
			for _, r := range role.Rules {
				n++
				for _, list := range [][]string{r.APIGroups, r.Resources, r.Verbs, r.ResourceNames, r.NonResourceURLs} {
					if slices.Contains(list, "*") {
						t.Errorf("%s %s: rule %+v holds a wildcard", kind, o.Name, r)
					}
				}
			}
		}
	}
	if n < 10 {
		t.Errorf("only %d rules rendered; the test would prove nothing", n)
	}
}

// Every +kubebuilder:rbac marker in the tree is in a package that a
// `make generate` rbac line reads: a marker added elsewhere (say, the
// agent's reporting package) would otherwise reach no role, and the
// component would be refused at run time while every test of the chart
// passed.
func TestEveryRBACMarkerIsGenerated(t *testing.T) {
	root := filepath.Join(chartDir(t), "..", "..")
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	var covered []string
	for _, m := range regexp.MustCompile(`rbac:roleName=\S+ '?paths=([^\s']+)`).FindAllStringSubmatch(string(mk), -1) {
		for _, p := range strings.Split(strings.Trim(m[1], `"{}`), ";") {
			covered = append(covered, strings.TrimSuffix(strings.TrimPrefix(p, "./"), "..."))
		}
	}
	if len(covered) < 4 {
		t.Fatalf("the Makefile's rbac lines read %q; want the controller's, the agent's (two) and the activator's", covered)
	}
	n := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || rel == "bin" || rel == "test" || rel == "hack") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if !bytes.Contains(b, []byte("+kubebuilder:rbac:")) {
			return nil
		}
		n++
		rel = filepath.ToSlash(rel)
		if !slices.ContainsFunc(covered, func(p string) bool { return strings.HasPrefix(rel, p) }) {
			t.Errorf("%s holds +kubebuilder:rbac markers that no `make generate` rbac line reads (they read %q): add its package to one", rel, covered)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 10 {
		t.Errorf("found markers in %d files; the walk missed the tree", n)
	}
}

// A namespace's users get sockscale's resources through Kubernetes'
// default roles (aggregated), may write only what they own, and no
// status: the controller writes statuses, and the activators and agents
// act on them.
func TestTenantRolesAggregate(t *testing.T) {
	edit := get[rbacv1.ClusterRole](t, render(t), "ClusterRole", "sockscale-tenant-edit")
	view := get[rbacv1.ClusterRole](t, render(t), "ClusterRole", "sockscale-tenant-view")
	for _, c := range []struct {
		role *rbacv1.ClusterRole
		into []string
	}{{edit, []string{"admin", "edit"}}, {view, []string{"view"}}} {
		for _, r := range c.into {
			if c.role.Labels["rbac.authorization.k8s.io/aggregate-to-"+r] != "true" {
				t.Errorf("%s: not aggregated into %q (labels %v)", c.role.Name, r, c.role.Labels)
			}
		}
		for _, rule := range c.role.Rules {
			for _, res := range rule.Resources {
				if strings.Contains(res, "/") {
					t.Errorf("%s grants the subresource %s", c.role.Name, res)
				}
			}
		}
	}
	writes := map[string]bool{}
	for _, rule := range edit.Rules {
		if slices.Contains(rule.Verbs, "create") || slices.Contains(rule.Verbs, "update") {
			for _, res := range rule.Resources {
				writes[rule.APIGroups[0]+"/"+res] = true
			}
		}
	}
	want := map[string]bool{"sockscale.dev/podautoscalers": true, "serving.sockscale.dev/services": true, "serving.sockscale.dev/routes": true}
	if diff := cmp.Diff(want, writes); diff != "" {
		t.Errorf("what tenant-edit may create or update (-want +got):\n%s", diff)
	}
	for _, name := range []string{"sockscale-tenant-edit", "sockscale-tenant-view"} {
		role := get[rbacv1.ClusterRole](t, render(t, "--set", "tenantRoles.aggregate=false"), "ClusterRole", name)
		for k := range role.Labels {
			if strings.HasPrefix(k, "rbac.authorization.k8s.io/aggregate-to-") {
				t.Errorf("tenantRoles.aggregate=false: %s still has %s", name, k)
			}
		}
	}
}

// controller.scaleTargets: the controller is told the kinds, and its
// ClusterRole for the kinds the markers do not cover grants their scale
// subresource and nothing else; with the defaults there is none.
func TestScaleTargetsRBAC(t *testing.T) {
	for _, o := range render(t).ofKind("ClusterRole") {
		if o.Name == controllerName+"-scale-targets" {
			t.Errorf("ClusterRole %s rendered with the default scaleTargets, whose scale the generated role grants", o.Name)
		}
	}
	objs := render(t, "--set-json", `controller.scaleTargets=[{"kind":"Deployment","group":"apps","resource":"deployments"},`+
		`{"kind":"StatefulSet","group":"apps","resource":"statefulsets"},{"kind":"Rollout","group":"argoproj.io","resource":"rollouts"}]`)
	role := get[rbacv1.ClusterRole](t, objs, "ClusterRole", controllerName+"-scale-targets")
	want := []rbacv1.PolicyRule{{APIGroups: []string{"argoproj.io"}, Resources: []string{"rollouts/scale"}, Verbs: []string{"get", "update"}}}
	if diff := cmp.Diff(want, role.Rules); diff != "" {
		t.Errorf("ClusterRole %s rules (-want +got):\n%s", role.Name, diff)
	}
	binding := get[rbacv1.ClusterRoleBinding](t, objs, "ClusterRoleBinding", controllerName+"-scale-targets")
	if binding.RoleRef.Name != role.Name || len(binding.Subjects) != 1 || binding.Subjects[0].Name != controllerName {
		t.Errorf("ClusterRoleBinding %s: %+v", binding.Name, binding)
	}
}
