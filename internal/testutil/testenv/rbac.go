package testenv

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"
)

// GeneratedRules are the rules controller-gen wrote from a component's
// +kubebuilder:rbac markers into charts/sockscale/files/rbac/<file>, which
// the chart's ClusterRoles include verbatim (test/chart checks it).
func GeneratedRules(t testing.TB, file string) []rbacv1.PolicyRule {
	t.Helper()
	_, self, _, _ := runtime.Caller(0)
	path := filepath.Join(filepath.Dir(self), "..", "..", "..", "charts", "sockscale", "files", "rbac", file)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the generated RBAC (make generate): %v", err)
	}
	var role rbacv1.ClusterRole
	if err := yaml.Unmarshal(b, &role); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return role.Rules
}

// ConfigAs gives the user a ClusterRole of rules (and nothing else) and
// returns a config that impersonates it: what a component can do under
// the role the chart gives it.
func (c *Cluster) ConfigAs(t testing.TB, user string, rules []rbacv1.PolicyRule) *rest.Config {
	t.Helper()
	ctx := context.Background()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: user}, Rules: rules}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: user},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}}
	if err := c.Client.Create(ctx, role); err != nil {
		t.Fatal(err)
	}
	if err := c.Client.Create(ctx, binding); err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(c.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	return cfg
}
