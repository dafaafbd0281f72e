package lifecycle

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
)

func ds(uid types.UID, deleting bool) *appsv1.DaemonSet {
	d := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: "sockscale", Name: "agent", UID: uid}}
	if deleting {
		now := metav1.Now()
		d.DeletionTimestamp = &now
	}
	return d
}

func TestDecide(t *testing.T) {
	owner := &Owner{Namespace: "sockscale", Name: "agent", UID: "u1"}
	notFound := apierrors.NewNotFound(schema.GroupResource{Group: "apps", Resource: "daemonsets"}, "agent")
	forbidden := apierrors.NewForbidden(schema.GroupResource{Group: "apps", Resource: "daemonsets"}, "agent", errors.New("no RBAC"))
	tests := []struct {
		name      string
		owner     *Owner
		seenGone  string
		ds        *appsv1.DaemonSet
		err       error
		uninstall bool
		reason    string // a part of the reason
	}{
		{"no owner known", nil, "", nil, nil, false, "no owning DaemonSet"},
		{"rolling update: the DaemonSet stays", owner, "", ds("u1", false), nil, false, "still there"},
		{"watch saw it deleted", owner, "DaemonSet sockscale/agent was deleted", nil, forbidden, true, "was deleted"},
		{"read: not found", owner, "", nil, notFound, true, "is gone"},
		{"read: being deleted (foreground)", owner, "", ds("u1", true), nil, true, "being deleted"},
		{"read: replaced by a new install", owner, "", ds("u2", false), nil, true, "was replaced"},
		// helm uninstall deletes the RBAC right after the DaemonSet.
		{"read refused: keep", owner, "", nil, forbidden, false, "cannot read"},
		{"read timed out: keep", owner, "", nil, context.DeadlineExceeded, false, "cannot read"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Decide(tt.owner, tt.seenGone, tt.ds, tt.err)
			if got.Uninstall != tt.uninstall || !strings.Contains(got.Reason, tt.reason) {
				t.Errorf("Decide = %+v; want uninstall=%v with a reason containing %q", got, tt.uninstall, tt.reason)
			}
		})
	}
}

func TestOwnerOf(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "agent-x", OwnerReferences: []metav1.OwnerReference{
		{APIVersion: "v1", Kind: "Node", Name: "n"},
		{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "agent", UID: "u1"},
	}}}
	if diff := cmp.Diff(&Owner{Namespace: "ns", Name: "agent", UID: "u1"}, OwnerOf(pod)); diff != "" {
		t.Errorf("OwnerOf (-want +got):\n%s", diff)
	}
	if got := OwnerOf(&corev1.Pod{}); got != nil {
		t.Errorf("OwnerOf(a pod without owner) = %+v; want nil", got)
	}
}

// TestWatcherSeesTheDeletionBeforeItsRightsGo: the watch records the
// deletion, so Decide says uninstall even when the read at exit fails
// (helm has deleted the agent's RBAC by then).
func TestWatcherSeesTheDeletionBeforeItsRightsGo(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "sockscale", Name: "agent-x", OwnerReferences: []metav1.OwnerReference{
		{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "agent", UID: "u1"},
	}}}
	client := fake.NewClientset(pod, ds("u1", false))
	w := NewWatcher(client, "sockscale", "agent-x", slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	waitOwner := time.Now().Add(10 * time.Second)
	for {
		w.mu.Lock()
		known := w.synced != nil && w.synced()
		w.mu.Unlock()
		if known {
			break
		}
		if time.Now().After(waitOwner) {
			t.Fatal("the watcher never found the pod's DaemonSet and listed it")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := w.Decide(context.Background()); got.Uninstall {
		t.Fatalf("with the DaemonSet there: %+v; want keep", got)
	}
	// The fake clientset drops events sent before a watch opens, which
	// follows the list closely.
	time.Sleep(200 * time.Millisecond)
	if err := client.AppsV1().DaemonSets("sockscale").Delete(context.Background(), "agent", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		w.mu.Lock()
		seen := w.seenGone
		w.mu.Unlock()
		if seen != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the watch never saw the deletion")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The read would now fail (not found here; forbidden in a real
	// uninstall): the watch's record decides.
	if got := w.Decide(context.Background()); !got.Uninstall || !strings.Contains(got.Reason, "was deleted") {
		t.Errorf("after the deletion: %+v; want uninstall because it was deleted", got)
	}
}

func TestWatcherWithoutPodKeeps(t *testing.T) {
	w := NewWatcher(fake.NewClientset(), "", "", slog.New(slog.NewTextHandler(io.Discard, nil)))
	w.Run(context.Background()) // returns at once
	if got := w.Decide(context.Background()); got.Uninstall {
		t.Errorf("Decide without POD_NAME = %+v; want keep", got)
	}
}
