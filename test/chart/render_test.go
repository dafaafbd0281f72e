package chart_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
)

// The release every render uses: the recommended namespace.
const (
	release   = "sockscale"
	namespace = "sockscale-system"
)

// chartDir is charts/sockscale, found from this file so that the tests run
// from any working directory.
func chartDir(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the test's source file")
	}
	return filepath.Join(filepath.Dir(file), "..", "..", "charts", "sockscale")
}

// helmBin is the pinned helm from $HELM (the Makefile exports it). Without
// it the tests skip, except under CI=true, where a skip would hide that the
// chart was never rendered.
func helmBin(t *testing.T) string {
	t.Helper()
	if h := os.Getenv("HELM"); h != "" {
		// The Makefile exports HELM whether or not helm is built yet.
		if _, err := os.Stat(h); err != nil {
			t.Fatalf("HELM=%s: %v; run `make helm` (or make the test target depend on $(HELM))", h, err)
		}
		return h
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("HELM is not set: run through `make chart-test` or `make test-unit`, which build the pinned helm; CI=true forbids skipping")
	}
	t.Skip("HELM is not set: run `make chart-test` (builds the pinned helm), or HELM=/path/to/helm go test ./test/chart/")
	return ""
}

// helm runs the pinned helm and returns its stdout, or an error carrying
// its stderr.
func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(helmBin(t), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// templateArgs are the arguments of `helm template` for the chart in the
// test namespace, with extra flags (--set, -f, ...) appended.
func templateArgs(t *testing.T, extra ...string) []string {
	return append([]string{"template", release, chartDir(t), "--namespace", namespace}, extra...)
}

// render runs `helm template` with extra flags and decodes what it prints.
func render(t *testing.T, extra ...string) objects {
	t.Helper()
	out, err := helm(t, templateArgs(t, extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decode(out)
	if err != nil {
		t.Fatalf("decode the rendered chart: %v", err)
	}
	return objs
}

// object is one rendered document: its kind, metadata and JSON.
type object struct {
	metav1.TypeMeta
	metav1.ObjectMeta
	raw []byte
}

type objects []object

// decode splits helm's multi-document YAML and keeps every non-empty
// document (apimachinery's yaml package converts with sigs.k8s.io/yaml).
func decode(s string) (objects, error) {
	r := yaml.NewYAMLReader(bufio.NewReader(strings.NewReader(s)))
	var objs objects
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, err
		}
		js, err := yaml.ToJSON(doc)
		if err != nil {
			return nil, fmt.Errorf("%w in\n%s", err, doc)
		}
		if bytes.Equal(bytes.TrimSpace(js), []byte("null")) {
			continue // only comments
		}
		var meta struct {
			metav1.TypeMeta   `json:",inline"`
			metav1.ObjectMeta `json:"metadata"`
		}
		if err := json.Unmarshal(js, &meta); err != nil {
			return nil, fmt.Errorf("%w in\n%s", err, doc)
		}
		if meta.Kind == "" {
			return nil, fmt.Errorf("a document without kind:\n%s", doc)
		}
		objs = append(objs, object{TypeMeta: meta.TypeMeta, ObjectMeta: meta.ObjectMeta, raw: js})
	}
}

// find returns the object of that kind and name, or nil.
func (o objects) find(kind, name string) *object {
	for i := range o {
		if o[i].Kind == kind && o[i].Name == name {
			return &o[i]
		}
	}
	return nil
}

// ofKind lists the objects of a kind.
func (o objects) ofKind(kind string) objects {
	var out objects
	for _, obj := range o {
		if obj.Kind == kind {
			out = append(out, obj)
		}
	}
	return out
}

// get decodes the object of that kind and name into a typed value, and
// fails the test if the chart did not render it.
func get[T any](t *testing.T, objs objects, kind, name string) *T {
	t.Helper()
	obj := objs.find(kind, name)
	if obj == nil {
		t.Fatalf("the chart renders no %s %q; it renders %s", kind, name, objs)
	}
	v := new(T)
	if err := json.Unmarshal(obj.raw, v); err != nil {
		t.Fatalf("decode %s %q: %v", kind, name, err)
	}
	return v
}

func (o objects) String() string {
	names := make([]string, len(o))
	for i, obj := range o {
		names[i] = obj.Kind + "/" + obj.Name
	}
	return strings.Join(names, ", ")
}
