package integration

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"

	"github.com/sockscale/sockscale/test/stack"
)

// renderChart runs `helm template` on charts/sockscale (the pinned helm of
// $HELM, which the Makefile exports) in the release namespace with extra
// flags, and decodes every object it prints.
func renderChart(t *testing.T, namespace string, extra ...string) []*unstructured.Unstructured {
	t.Helper()
	h := stack.HelmFromEnv()
	if h == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("HELM is not set (make test-integration exports it); CI=true forbids skipping")
		}
		t.Skip("HELM is not set: HELM=/path/to/helm go test ...")
	}
	args := append([]string{"template", "sockscale", stack.ChartDir(), "--namespace", namespace}, extra...)
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(h, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	r := yaml.NewYAMLReader(bufio.NewReader(&stdout))
	var objs []*unstructured.Unstructured
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatal(err)
		}
		js, err := yaml.ToJSON(doc)
		if err != nil {
			t.Fatalf("%v in\n%s", err, doc)
		}
		if s := string(bytes.TrimSpace(js)); s == "null" || s == "" {
			continue
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(js); err != nil {
			t.Fatalf("%v in\n%s", err, doc)
		}
		objs = append(objs, u)
	}
}

// rendered returns the rendered object of that kind and name.
func rendered(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("the chart renders no %s %q", kind, name)
	return nil
}
