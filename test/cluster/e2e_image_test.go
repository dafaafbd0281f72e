package cluster

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sockscale/sockscale/internal/imagebuild"
)

// A pod whose image is not in the registry waits in ErrImagePull with the
// registry's error, then ImagePullBackOff; once the image is pushed it
// runs from it, its imageID the pushed digest, and the image's user
// applies (65532 here, the pod sets none).
func TestE2EImagePullBackOffThenPushed(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	image := RegistryAddr + "/e2e/late:dev"
	p := echoPod("late", nil)
	p.Spec.Containers[0].Image = image
	p.Spec.Containers[0].Command = nil // the image's Entrypoint
	if _, err := c.Client.CoreV1().Pods(e2eNS).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer deleteAndWaitGone(t, c, p.Name)
	waiting := func(reason string) func() error {
		return func() error {
			got, err := c.Client.CoreV1().Pods(e2eNS).Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if len(got.Status.ContainerStatuses) == 0 || got.Status.ContainerStatuses[0].State.Waiting == nil {
				return fmt.Errorf("no waiting container: %+v", got.Status.ContainerStatuses)
			}
			w := got.Status.ContainerStatuses[0].State.Waiting
			if w.Reason != reason {
				return fmt.Errorf("waiting %s: %s", w.Reason, w.Message)
			}
			// The registry's own words: no such repository (NAME_UNKNOWN)
			// or tag (MANIFEST_UNKNOWN).
			if !strings.Contains(w.Message, image) || !strings.Contains(w.Message, "_UNKNOWN") {
				return fmt.Errorf("waiting %s: message %q does not name the image and the registry's error", w.Reason, w.Message)
			}
			return nil
		}
	}
	eventually(t, 60*time.Second, "ErrImagePull", waiting("ErrImagePull"))
	eventually(t, 30*time.Second, "ImagePullBackOff", waiting("ImagePullBackOff"))

	epoch, err := imagebuild.SourceDateEpoch(ctx, ".")
	if err != nil {
		t.Fatal(err)
	}
	built, err := imagebuild.Build(ctx, imagebuild.Options{Dir: ".", Epoch: epoch},
		[]imagebuild.Spec{{Name: "late", Package: "./testdata/echo", User: imagebuild.NonRoot}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := imagebuild.Push(ctx, built, RegistryAddr+"/e2e", "dev"); err != nil {
		t.Fatal(err)
	}
	pushed := time.Now()
	var got *corev1.Pod
	// The backoff is at most 20 s.
	eventually(t, 60*time.Second, "pod ready from the pushed image", func() error {
		if got, err = c.Client.CoreV1().Pods(e2eNS).Get(ctx, p.Name, metav1.GetOptions{}); err != nil {
			return err
		}
		if !podReady(got) {
			return fmt.Errorf("not ready: %+v", got.Status.ContainerStatuses)
		}
		return nil
	})
	t.Logf("ready %s after the push", time.Since(pushed).Round(100*time.Millisecond))
	if want := RegistryAddr + "/e2e/late@" + built[0].Digest.String(); got.Status.ContainerStatuses[0].ImageID != want {
		t.Errorf("imageID %q, want %q", got.Status.ContainerStatuses[0].ImageID, want)
	}
	body, err := get("http://" + got.Status.PodIP + ":8080/file?path=/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(body, "Uid:\t65532\t") {
		t.Errorf("/proc/self/status says %q, want the image's user (Uid: 65532)", body)
	}
}
