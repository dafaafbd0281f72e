package config

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParsePodSpecFeatures(t *testing.T) {
	for _, tt := range []struct {
		name string
		data map[string]string
		want PodSpec
	}{
		{"defaults: emptyDir only", nil, PodSpec{VolumesEmptyDir: true}},
		{"each key enabled", map[string]string{
			KeyVolumesEmptyDir: "enabled", KeyVolumesHostPath: "enabled", KeyPersistentVolumeClaim: "enabled",
			KeyNodeSelector: "enabled", KeyTolerations: "enabled", KeySecurityContext: "enabled", KeyAddCapabilities: "enabled",
		}, PodSpec{VolumesEmptyDir: true, VolumesHostPath: true, PersistentVolumeClaim: true, NodeSelector: true, Tolerations: true, SecurityContext: true, AddCapabilities: true}},
		{"Knative's allowed is enabled, any case", map[string]string{KeyVolumesHostPath: "Allowed", KeyTolerations: " ENABLED "}, PodSpec{VolumesEmptyDir: true, VolumesHostPath: true, Tolerations: true}},
		{"emptyDir disabled", map[string]string{KeyVolumesEmptyDir: "disabled"}, PodSpec{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(tt.data)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got.PodSpec); diff != "" {
				t.Errorf("PodSpec (-want +got):\n%s", diff)
			}
		})
	}
}

// A bad value names the key, the value and the values allowed; the
// Knative spelling with its "kubernetes." prefix is no key here (ignored
// and warned about, like any unknown key), so it cannot be mistaken for
// one that took effect.
func TestParsePodSpecFeatureErrors(t *testing.T) {
	for _, key := range []string{KeyVolumesEmptyDir, KeyVolumesHostPath, KeyPersistentVolumeClaim, KeyNodeSelector, KeyTolerations, KeySecurityContext, KeyAddCapabilities} {
		_, err := Parse(map[string]string{key: "true"})
		want := `key "` + key + `": value "true": must be "enabled", "disabled" or "allowed" (the same as enabled)`
		if err == nil || err.Error() != want {
			t.Errorf("%s=true: err = %v, want %q", key, err, want)
		}
	}
	data := map[string]string{"kubernetes.podspec-volumes-hostpath": "enabled"}
	got, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	if got.PodSpec.VolumesHostPath {
		t.Error("kubernetes.podspec-volumes-hostpath enabled hostPath; the key is podspec-volumes-hostpath")
	}
	if diff := cmp.Diff([]string{"kubernetes.podspec-volumes-hostpath"}, UnknownKeys(data)); diff != "" {
		t.Errorf("unknown keys (-want +got):\n%s", diff)
	}
}
