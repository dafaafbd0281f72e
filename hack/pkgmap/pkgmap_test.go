package main

import (
	"strings"
	"testing"
)

func TestParseListAndRender(t *testing.T) {
	list := "example.com/m/test/e2e\tPackage e2e runs scenarios.\n" +
		"example.com/m/agent/internal/podwatch\tPackage podwatch keeps the pod map.\n" +
		"example.com/m/api/autoscaling/v1alpha1\tPackage v1alpha1 is the API.\n" +
		"example.com/m/tools/x\t\n" +
		"example.com/m/bpf\tPackage bpf | loads.\n"
	pkgs, err := parseList("example.com/m", list)
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) != 5 || pkgs[0].Path != "agent/internal/podwatch" {
		t.Fatalf("pkgs = %+v", pkgs)
	}
	got := string(render(pkgs))
	// Groups in their fixed order, the unknown folder last.
	order := []string{"## api\n", "## agent\n", "## bpf\n", "## test\n", "## other\n"}
	last := -1
	for _, h := range order {
		i := strings.Index(got, h)
		if i < 0 || i < last {
			t.Fatalf("heading %q missing or out of order in\n%s", h, got)
		}
		last = i
	}
	for _, want := range []string{
		"| [`agent/internal/podwatch`](../agent/internal/podwatch) | Package podwatch keeps the pod map. |",
		"| [`tools/x`](../tools/x) | (no package comment) |",
		`Package bpf \| loads.`,
		"Every Go package of the module (5)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "## activator") {
		t.Errorf("an empty group has a section:\n%s", got)
	}
}

func TestParseListRefusesOtherModules(t *testing.T) {
	if _, err := parseList("example.com/m", "example.com/mother/x\tdoc\n"); err == nil {
		t.Error("a package of another module was taken")
	}
}
